//! Throwaway databases on every backend.
//!
//! A SQLite test gets its own file under the temp dir; a PostgreSQL test
//! gets its own schema in the database named by `IDEM_TEST_DATABASE_URL`
//! (selected with `search_path` in the URL it hands out); a MySQL test its
//! own database on the server named by `IDEM_TEST_MYSQL_URL`. So tests run
//! in parallel without seeing each other's rows. All are removed on drop.

use sqlx::Connection;

/// The environment variable naming the PostgreSQL database tests use.
pub const DATABASE_URL_ENV: &str = "IDEM_TEST_DATABASE_URL";

/// The environment variable naming the MySQL / MariaDB server tests use
/// (`mysql://root@127.0.0.1:3306/test`; each test gets a database of its own
/// on that server).
pub const MYSQL_URL_ENV: &str = "IDEM_TEST_MYSQL_URL";

/// Which store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A fresh SQLite file.
    Sqlite,
    /// A fresh schema in `IDEM_TEST_DATABASE_URL`.
    Postgres,
    /// A fresh database on the server of `IDEM_TEST_MYSQL_URL`.
    MySql,
}

/// A database that exists for one test and is removed afterwards.
#[derive(Debug)]
pub struct TestDb {
    /// The URL to connect to (`sqlite://...` or `postgres://...?options=...`).
    pub url: String,
    cleanup: Cleanup,
}

#[derive(Debug)]
enum Cleanup {
    Files(Vec<std::path::PathBuf>),
    Schema { admin_url: String, schema: String },
    Database { admin_url: String, database: String },
}

impl TestDb {
    /// A fresh database, or `None` (after a loud SKIPPED line) when the
    /// backend is PostgreSQL and `IDEM_TEST_DATABASE_URL` is unset. CI sets
    /// it; a CI run without it fails ([`crate::skip_without`]).
    ///
    /// # Panics
    /// When PostgreSQL is configured but unreachable: a test must fail, not
    /// pass silently, when its database is broken.
    pub async fn new(backend: Backend, test: &str) -> Option<Self> {
        match backend {
            Backend::Sqlite => {
                let path = std::env::temp_dir().join(format!(
                    "idem-test-{}-{}.db",
                    test.replace(['/', ' '], "-"),
                    uuid::Uuid::new_v4().simple()
                ));
                let files = ["", "-wal", "-shm"]
                    .iter()
                    .map(|s| std::path::PathBuf::from(format!("{}{s}", path.display())))
                    .collect();
                Some(Self {
                    url: format!("sqlite://{}", path.display()),
                    cleanup: Cleanup::Files(files),
                })
            }
            Backend::Postgres => {
                let Ok(admin_url) = std::env::var(DATABASE_URL_ENV) else {
                    crate::skip_without(
                        &format!("{test} on PostgreSQL"),
                        &format!("{DATABASE_URL_ENV} is not set"),
                    );
                    return None;
                };
                let schema = format!("idem_t_{}", uuid::Uuid::new_v4().simple());
                #[allow(clippy::unwrap_used)]
                let mut conn = sqlx::PgConnection::connect(&admin_url).await.unwrap();
                #[allow(clippy::unwrap_used)]
                sqlx::query(&format!("CREATE SCHEMA {schema}"))
                    .execute(&mut conn)
                    .await
                    .unwrap();
                conn.close().await.ok();
                let sep = if admin_url.contains('?') { '&' } else { '?' };
                Some(Self {
                    url: format!("{admin_url}{sep}options=-c%20search_path%3D{schema}"),
                    cleanup: Cleanup::Schema { admin_url, schema },
                })
            }
            Backend::MySql => {
                let Ok(admin_url) = std::env::var(MYSQL_URL_ENV) else {
                    crate::skip_without(
                        &format!("{test} on MySQL"),
                        &format!("{MYSQL_URL_ENV} is not set"),
                    );
                    return None;
                };
                let database = format!("idem_t_{}", uuid::Uuid::new_v4().simple());
                #[allow(clippy::unwrap_used)]
                let mut conn = sqlx::MySqlConnection::connect(&admin_url).await.unwrap();
                #[allow(clippy::unwrap_used)]
                sqlx::query(&format!("CREATE DATABASE {database}"))
                    .execute(&mut conn)
                    .await
                    .unwrap();
                conn.close().await.ok();
                Some(Self {
                    url: mysql_url_with_database(&admin_url, &database),
                    cleanup: Cleanup::Database {
                        admin_url,
                        database,
                    },
                })
            }
        }
    }

    /// The SQLite file, for SQLite databases.
    pub fn sqlite_path(&self) -> Option<&std::path::Path> {
        match &self.cleanup {
            Cleanup::Files(files) => files.first().map(std::path::PathBuf::as_path),
            Cleanup::Schema { .. } | Cleanup::Database { .. } => None,
        }
    }
}

/// `admin_url` (`mysql://user@host:port/db?params`) with its database
/// replaced by `database`.
pub fn mysql_url_with_database(admin_url: &str, database: &str) -> String {
    let (base, query) = match admin_url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (admin_url, None),
    };
    let authority = base.find("://").map_or(0, |i| i + 3);
    let root = match base[authority..].find('/') {
        Some(i) => &base[..authority + i],
        None => base,
    };
    match query {
        Some(q) => format!("{root}/{database}?{q}"),
        None => format!("{root}/{database}"),
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        match &self.cleanup {
            Cleanup::Files(files) => {
                for f in files {
                    let _ = std::fs::remove_file(f);
                }
            }
            Cleanup::Schema { admin_url, schema } => {
                let (url, schema) = (admin_url.clone(), schema.clone());
                // Drop runs inside a runtime; do the async cleanup on a thread
                // with its own runtime, and wait for it.
                let _ = std::thread::spawn(move || {
                    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    else {
                        return;
                    };
                    rt.block_on(async {
                        if let Ok(mut c) = sqlx::PgConnection::connect(&url).await {
                            let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                                .execute(&mut c)
                                .await;
                            let _ = c.close().await;
                        }
                    });
                })
                .join();
            }
            Cleanup::Database {
                admin_url,
                database,
            } => {
                let (url, database) = (admin_url.clone(), database.clone());
                let _ = std::thread::spawn(move || {
                    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    else {
                        return;
                    };
                    rt.block_on(async {
                        if let Ok(mut c) = sqlx::MySqlConnection::connect(&url).await {
                            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {database}"))
                                .execute(&mut c)
                                .await;
                            let _ = c.close().await;
                        }
                    });
                })
                .join();
            }
        }
    }
}

/// `db!(backend, "name")`: a fresh [`TestDb`], or `return` from the test
/// (after the loud SKIPPED line) when PostgreSQL is not configured.
#[macro_export]
macro_rules! db {
    ($b:expr, $name:expr) => {
        match $crate::TestDb::new($b, $name).await {
            Some(db) => db,
            None => return,
        }
    };
}

/// `both!(name)`: declares the async test body `name(Backend)` once per
/// store, as `name::sqlite`, `name::postgres` and, when the crate under
/// test has a `mysql` feature and it is on, `name::mysql` (multi-threaded
/// runtimes, so concurrency tests really run in parallel).
#[macro_export]
macro_rules! both {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name($crate::Backend::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name($crate::Backend::Postgres).await
            }
            #[cfg(feature = "mysql")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                super::$name($crate::Backend::MySql).await
            }
        }
    };
}
