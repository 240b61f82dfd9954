//! The one classification of store faults ([`StoreFault`]), on errors the
//! real databases raise: SQLite locked by another connection, read-only and
//! out of disk; PostgreSQL read-only, a backend terminated by the
//! administrator, a refused connection; MySQL/MariaDB (feature `mysql`) a
//! lock wait past its bound and a read-only transaction. Each is a
//! `503 upstream_unavailable` with `Retry-After` and counted
//! `store_unavailable`, whether the engine meets it or a handler's own
//! query does (wrapped in the application's error type and rendered with
//! `problem_response`); an error that is not the store's availability (a
//! constraint violation) stays a `500`.
#![allow(clippy::unwrap_used)]

use std::str::FromStr;
use std::time::Duration;

use axum::http::StatusCode;
use axum_idempotency::error::problem_response;
use axum_idempotency::metrics::Outcome;
use axum_idempotency::store::KeyStore;
use axum_idempotency::{Error, SqliteStore, StoreFault, StoreOptions};
use idem_spec::{ErrorCode, Profile};
use idem_test_support::{Backend, TempDir, TestDb, Tmpfs};
use sqlx::Connection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};

/// An application's own error type, the way the guide recommends one: its
/// queries' driver errors and the engine's errors, each with `#[from]`.
#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("{0}")]
    Idem(#[from] Error),
    #[error("not found")]
    NotFound,
}

impl AppError {
    /// What such an application answers: 503 for a store fault (the
    /// library's classification), 500 for any other database error.
    fn render(&self) -> axum::response::Response {
        let code = match StoreFault::find(self) {
            Some(_) => ErrorCode::UpstreamUnavailable,
            None if matches!(self, Self::NotFound) => ErrorCode::NotFound,
            None => ErrorCode::InternalError,
        };
        let problem = idem_spec::Problem::new(code, Profile::Reference, "x");
        problem_response(&problem, Some(1), self)
    }
}

/// Everything one classified driver error must be, everywhere it can
/// surface: in the engine's error, and in an application's error from a
/// handler's own query.
fn assert_fault(e: sqlx::Error, want: StoreFault) {
    assert_eq!(StoreFault::of(&e), Some(want), "{e:?}");
    let app = AppError::from(e);
    assert_eq!(StoreFault::find(&app), Some(want));
    let response = app.render();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(Outcome::of_response(&response), Outcome::StoreUnavailable);
    let AppError::Db(e) = app else { unreachable!() };
    let engine = Error::Store(e);
    assert_eq!(engine.store_fault(), Some(want));
    assert_eq!(engine.code(), ErrorCode::UpstreamUnavailable);
    assert_eq!(engine.retry_after_secs(), Some(1));
    assert_eq!(Outcome::of_error(&engine), Outcome::StoreUnavailable);
    // The engine's error, returned by a handler through the app's type
    // (what `IdemTx::lock` failing looks like): the same.
    let wrapped = AppError::from(engine);
    assert_eq!(StoreFault::find(&wrapped), Some(want));
    assert_eq!(
        Outcome::of_response(&wrapped.render()),
        Outcome::StoreUnavailable
    );
}

fn assert_not_fault(e: sqlx::Error) {
    assert_eq!(StoreFault::of(&e), None, "{e:?}");
    let app = AppError::from(e);
    let response = app.render();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        Outcome::of_response(&response),
        Outcome::ServerErrorReleased
    );
    let AppError::Db(e) = app else { unreachable!() };
    let engine = Error::Store(e);
    assert_eq!(engine.code(), ErrorCode::InternalError);
    assert_eq!(engine.retry_after_secs(), None);
    assert_eq!(Outcome::of_error(&engine), Outcome::ServerErrorReleased);
}

async fn sqlite(path: &std::path::Path, busy: Duration) -> SqliteConnection {
    let opts = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
        .unwrap()
        .create_if_missing(true)
        .busy_timeout(busy);
    SqliteConnection::connect_with(&opts).await.unwrap()
}

#[tokio::test]
async fn sqlite_locked_by_another_connection_is_a_locked_fault() {
    let dir = TempDir::new("idem-fault-lock");
    let path = dir.join("db.sqlite");
    let mut holder = sqlite(&path, Duration::ZERO).await;
    sqlx::query("CREATE TABLE t (x INTEGER PRIMARY KEY)")
        .execute(&mut holder)
        .await
        .unwrap();
    // The real store, connected (and checked) before the lock is taken.
    let store = SqliteStore::connect(
        &format!("sqlite://{}", path.display()),
        &StoreOptions {
            acquire_timeout: Duration::from_millis(200),
            ..StoreOptions::default()
        },
    )
    .await
    .unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut holder)
        .await
        .unwrap();
    let mut other = sqlite(&path, Duration::from_millis(50)).await;
    let e = sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("database is locked"), "{e}");
    assert_fault(e, StoreFault::Locked);

    // The real store's own transaction, behind the same lock: its bounded
    // wait ends in a fault too (the busy handler's "locked" or the writer
    // gate's timeout), answered 503 and counted store_unavailable.
    let e = match store.begin().await {
        Ok(_) => panic!("a transaction began behind another connection's lock"),
        Err(e) => e,
    };
    assert!(
        matches!(
            e.store_fault(),
            Some(StoreFault::Locked | StoreFault::Timeout)
        ),
        "{e:?}"
    );
    assert_eq!(Outcome::of_error(&e), Outcome::StoreUnavailable);
    let response = AppError::from(e).render();
    assert_eq!(Outcome::of_response(&response), Outcome::StoreUnavailable);
    sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();
    drop(store.begin().await.unwrap());
}

#[tokio::test]
async fn sqlite_read_only_is_a_read_only_fault_and_a_constraint_is_not_a_fault() {
    let dir = TempDir::new("idem-fault-ro");
    let path = dir.join("db.sqlite");
    let mut rw = sqlite(&path, Duration::ZERO).await;
    sqlx::query("CREATE TABLE t (x INTEGER PRIMARY KEY)")
        .execute(&mut rw)
        .await
        .unwrap();
    sqlx::query("INSERT INTO t VALUES (1)")
        .execute(&mut rw)
        .await
        .unwrap();
    let e = sqlx::query("INSERT INTO t VALUES (1)")
        .execute(&mut rw)
        .await
        .unwrap_err();
    assert_not_fault(e);
    let opts = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
        .unwrap()
        .read_only(true);
    let mut ro = SqliteConnection::connect_with(&opts).await.unwrap();
    let e = sqlx::query("INSERT INTO t VALUES (2)")
        .execute(&mut ro)
        .await
        .unwrap_err();
    assert_fault(e, StoreFault::ReadOnly);
}

#[tokio::test]
async fn sqlite_on_a_full_disk_is_a_disk_full_fault() {
    let Some(fs) = Tmpfs::mount("1m", "sqlite_on_a_full_disk_is_a_disk_full_fault") else {
        return;
    };
    let mut c = sqlite(&fs.join("db.sqlite"), Duration::ZERO).await;
    sqlx::query("CREATE TABLE t (b BLOB)")
        .execute(&mut c)
        .await
        .unwrap();
    // 64 KiB rows until the kernel says no: at most 1 MiB fits.
    let mut failed = None;
    for _ in 0..64 {
        if let Err(e) = sqlx::query("INSERT INTO t VALUES (zeroblob(65536))")
            .execute(&mut c)
            .await
        {
            failed = Some(e);
            break;
        }
    }
    let e = failed.expect("a 1 MiB filesystem never filled up");
    assert_fault(e, StoreFault::DiskFull);
}

#[tokio::test]
async fn postgres_read_only_terminated_and_refused_are_faults() {
    let Some(db) = TestDb::new(Backend::Postgres, "postgres_faults").await else {
        return;
    };
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("CREATE TABLE t (x INT PRIMARY KEY)")
        .execute(&mut c)
        .await
        .unwrap();
    sqlx::query("INSERT INTO t VALUES (1)")
        .execute(&mut c)
        .await
        .unwrap();
    let e = sqlx::query("INSERT INTO t VALUES (1)")
        .execute(&mut c)
        .await
        .unwrap_err();
    assert_not_fault(e);
    // Read-only, as a standby or `default_transaction_read_only` makes it
    // (SQLSTATE 25006).
    sqlx::query("SET default_transaction_read_only = on")
        .execute(&mut c)
        .await
        .unwrap();
    let e = sqlx::query("INSERT INTO t VALUES (2)")
        .execute(&mut c)
        .await
        .unwrap_err();
    assert_fault(e, StoreFault::ReadOnly);
    // Terminated by the administrator (57P01, or the closed socket after
    // it): the server is going away under this connection.
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut c)
        .await
        .unwrap();
    let mut admin = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(killed);
    let e = sqlx::query("SELECT 1").execute(&mut c).await.unwrap_err();
    assert_fault(e, StoreFault::Unreachable);
    // Nothing listens: refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = sqlx::PgConnection::connect(&format!("postgres://postgres@127.0.0.1:{port}/x"))
        .await
        .unwrap_err();
    assert_fault(e, StoreFault::Unreachable);
}

#[test]
fn an_application_error_without_a_store_cause_is_not_a_fault() {
    let r = AppError::NotFound.render();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(Outcome::of_response(&r), Outcome::Executed);
    // The engine's conflict (a deadlock victim) reaches the handler's
    // error type and stays a fault there.
    let wrapped = AppError::from(Error::Conflict);
    assert_eq!(StoreFault::find(&wrapped), Some(StoreFault::Locked));
    assert_eq!(
        Outcome::of_response(&wrapped.render()),
        Outcome::StoreUnavailable
    );
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mysql_lock_wait_and_read_only_are_faults() {
    let Some(db) = TestDb::new(Backend::MySql, "mysql_faults").await else {
        return;
    };
    let mut a = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
    sqlx::query("CREATE TABLE t (x INT PRIMARY KEY) ENGINE=InnoDB")
        .execute(&mut a)
        .await
        .unwrap();
    sqlx::query("INSERT INTO t VALUES (1)")
        .execute(&mut a)
        .await
        .unwrap();
    let e = sqlx::query("INSERT INTO t VALUES (1)")
        .execute(&mut a)
        .await
        .unwrap_err();
    assert_not_fault(e);
    // Another transaction holds the row past the lock wait bound (1205).
    sqlx::query("BEGIN").execute(&mut a).await.unwrap();
    sqlx::query("SELECT x FROM t WHERE x = 1 FOR UPDATE")
        .execute(&mut a)
        .await
        .unwrap();
    let mut b = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
    sqlx::query("SET SESSION innodb_lock_wait_timeout = 1")
        .execute(&mut b)
        .await
        .unwrap();
    let e = sqlx::query("UPDATE t SET x = 2 WHERE x = 1")
        .execute(&mut b)
        .await
        .unwrap_err();
    assert_fault(e, StoreFault::Locked);
    sqlx::query("ROLLBACK").execute(&mut a).await.unwrap();
    // A read-only transaction (what a replica or a fenced primary refuses
    // writes with: 1792).
    sqlx::query("START TRANSACTION READ ONLY")
        .execute(&mut b)
        .await
        .unwrap();
    let e = sqlx::query("INSERT INTO t VALUES (3)")
        .execute(&mut b)
        .await
        .unwrap_err();
    assert_fault(e, StoreFault::ReadOnly);
}
