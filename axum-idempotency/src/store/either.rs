//! [`Store`]: SQLite or PostgreSQL, chosen at run time (from a URL), for
//! applications that support both, as the reference server does.
//!
//! Its transaction is an enum, [`DbTx`]; [`with_conn!`](crate::with_conn)
//! runs the same sqlx code on whichever connection it holds, and
//! [`with_pool!`](crate::with_pool) on whichever pool. An application on one
//! database uses [`SqliteStore`] or [`PgStore`] directly and needs neither.

use idem_spec::Fingerprint;
use sqlx::{PgConnection, SqliteConnection};

use super::ops::StagedJob;
use super::{
    AbandonedKey, ClaimOutcome, ClaimRequest, Claimed, FencedWrite, KeyRecord, KeyStore, Observed,
    PgStore, ReapBatch, SingleTx, SqliteStore, SqliteTx, StagedJobs, StoredResponse, TakenOver,
};
use crate::clock::Millis;
use crate::error::{Error, Result};
use crate::key::{Fence, KeyId};

use super::StoreOptions;

/// A key store on SQLite or PostgreSQL.
#[derive(Debug, Clone)]
pub enum Store {
    /// The embedded default.
    Sqlite(SqliteStore),
    /// For several processes on one database.
    Postgres(PgStore),
}

/// A write transaction of a [`Store`].
#[derive(Debug)]
pub enum DbTx {
    /// SQLite (`BEGIN IMMEDIATE`, holding the writer permit).
    Sqlite(SqliteTx),
    /// PostgreSQL (READ COMMITTED).
    Postgres(super::postgres::PgTx),
}

/// A borrowed connection of either backend; see [`with_conn!`](crate::with_conn).
#[derive(Debug)]
pub enum DbConn<'a> {
    /// SQLite.
    Sqlite(&'a mut SqliteConnection),
    /// PostgreSQL.
    Postgres(&'a mut PgConnection),
}

impl DbTx {
    /// The connection the transaction runs on.
    pub fn conn(&mut self) -> DbConn<'_> {
        match self {
            Self::Sqlite(tx) => DbConn::Sqlite(tx),
            Self::Postgres(tx) => DbConn::Postgres(tx),
        }
    }
}

/// Runs the same sqlx code on whichever backend a [`DbTx`] holds.
///
/// `with_conn!(tx, c => body)` expands `body` twice, once with `c: &mut
/// SqliteConnection` and once with `c: &mut PgConnection`. Write portable
/// SQL (`$1` placeholders, `BIGINT`/`TEXT` columns) and make `body` return a
/// type both arms share (decode rows inside it).
///
/// ```
/// # async fn demo(tx: &mut axum_idempotency::store::DbTx) -> Result<u64, axum_idempotency::Error> {
/// let moved = axum_idempotency::with_conn!(tx, c => {
///     sqlx::query("UPDATE accounts SET balance = balance + $1 WHERE id = $2")
///         .bind(100_i64)
///         .bind("acc_alice_main")
///         .execute(&mut *c)
///         .await?
///         .rows_affected()
/// });
/// # Ok(moved) }
/// ```
#[macro_export]
macro_rules! with_conn {
    ($tx:expr, $c:ident => $body:expr) => {
        match $crate::store::DbTx::conn($tx) {
            $crate::store::DbConn::Sqlite($c) => $body,
            $crate::store::DbConn::Postgres($c) => $body,
        }
    };
}

/// Runs the same sqlx code on whichever pool a [`Store`] holds (for reads
/// outside any idempotent request, e.g. GET endpoints).
///
/// `with_pool!(store, p => body)` expands `body` with `p: &SqlitePool` and
/// with `p: &PgPool`.
#[macro_export]
macro_rules! with_pool {
    ($store:expr, $p:ident => $body:expr) => {
        match $store {
            $crate::store::Store::Sqlite(s) => {
                let $p = s.pool();
                $body
            }
            $crate::store::Store::Postgres(s) => {
                let $p = s.pool();
                $body
            }
        }
    };
}

impl Store {
    /// Opens a pool on `database_url` with [`StoreOptions::default`] but
    /// `max_connections`. See [`Store::connect_with`].
    pub async fn connect(database_url: &str, max_connections: u32) -> Result<Self> {
        Self::connect_with(
            database_url,
            &StoreOptions::default().max_connections(max_connections),
        )
        .await
    }

    /// Opens a pool on `database_url`: `sqlite://PATH` or `sqlite::memory:`
    /// as [`SqliteStore::connect`] does, `postgres://...` as
    /// [`PgStore::connect`] does. It does not migrate: call
    /// [`Store::migrate`].
    pub async fn connect_with(database_url: &str, options: &StoreOptions) -> Result<Self> {
        if database_url.starts_with("postgres://") || database_url.starts_with("postgresql://") {
            Ok(Self::Postgres(
                PgStore::connect(database_url, options).await?,
            ))
        } else if database_url.starts_with("sqlite:") {
            Ok(Self::Sqlite(
                SqliteStore::connect(database_url, options).await?,
            ))
        } else {
            Err(Error::Config(format!(
                "unsupported database URL {database_url:?}: use sqlite://PATH or postgres://..."
            )))
        }
    }

    /// Creates or updates the key table (see [`crate::migrate`]).
    pub async fn migrate(&self) -> Result<()> {
        match self {
            Self::Sqlite(s) => s.migrate().await,
            Self::Postgres(s) => s.migrate().await,
        }
    }

    /// "sqlite" or "postgres".
    pub fn backend(&self) -> &'static str {
        match self {
            Self::Sqlite(_) => "sqlite",
            Self::Postgres(_) => "postgres",
        }
    }

    /// Whether the store answers now: one connection (bounded by the
    /// acquire timeout) and `SELECT 1`. What a readiness probe asks.
    pub async fn ping(&self) -> Result<()> {
        match self {
            Self::Sqlite(s) => s.ping().await,
            Self::Postgres(s) => s.ping().await,
        }
    }

    /// Closes the pool (waits for connections to be returned).
    pub async fn close(&self) {
        match self {
            Self::Sqlite(s) => s.pool().close().await,
            Self::Postgres(s) => s.pool().close().await,
        }
    }
}

fn wrong_backend() -> Error {
    Error::Internal("a transaction of one backend was given to the other".into())
}

fn claimed<T>(o: ClaimOutcome<T>, wrap: fn(T) -> DbTx) -> ClaimOutcome<DbTx> {
    match o {
        ClaimOutcome::Claimed(Claimed { tx, fence }) => ClaimOutcome::Claimed(Claimed {
            tx: wrap(tx),
            fence,
        }),
        ClaimOutcome::Busy => ClaimOutcome::Busy,
        ClaimOutcome::Taken => ClaimOutcome::Taken,
    }
}

fn wrap_observed<T>(o: Observed<T>, wrap: fn(T) -> DbTx) -> Observed<DbTx> {
    Observed {
        record: o.record,
        busy: o.busy,
        tx: o.tx.map(wrap),
    }
}

impl KeyStore for Store {
    type Tx = DbTx;

    async fn begin(&self) -> Result<DbTx> {
        match self {
            Self::Sqlite(s) => Ok(DbTx::Sqlite(s.begin().await?)),
            Self::Postgres(s) => Ok(DbTx::Postgres(s.begin().await?)),
        }
    }

    async fn commit(&self, tx: DbTx) -> Result<()> {
        match (self, tx) {
            (Self::Sqlite(s), DbTx::Sqlite(tx)) => s.commit(tx).await,
            (Self::Postgres(s), DbTx::Postgres(tx)) => s.commit(tx).await,
            _ => Err(wrong_backend()),
        }
    }

    async fn rollback(&self, tx: DbTx) -> Result<()> {
        match (self, tx) {
            (Self::Sqlite(s), DbTx::Sqlite(tx)) => s.rollback(tx).await,
            (Self::Postgres(s), DbTx::Postgres(tx)) => s.rollback(tx).await,
            _ => Err(wrong_backend()),
        }
    }

    async fn lookup(&self, id: &KeyId) -> Result<Option<KeyRecord>> {
        match self {
            Self::Sqlite(s) => s.lookup(id).await,
            Self::Postgres(s) => s.lookup(id).await,
        }
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome<DbTx>> {
        match self {
            Self::Sqlite(s) => Ok(claimed(s.claim(req).await?, DbTx::Sqlite)),
            Self::Postgres(s) => Ok(claimed(s.claim(req).await?, DbTx::Postgres)),
        }
    }

    async fn observe(&self, id: &KeyId, now: Millis) -> Result<Observed<DbTx>> {
        match self {
            Self::Sqlite(s) => Ok(wrap_observed(s.observe(id, now).await?, DbTx::Sqlite)),
            Self::Postgres(s) => Ok(wrap_observed(s.observe(id, now).await?, DbTx::Postgres)),
        }
    }

    async fn begin_single(&self, id: &KeyId) -> Result<SingleTx<DbTx>> {
        match self {
            Self::Sqlite(s) => Ok(s.begin_single(id).await?.map(DbTx::Sqlite)),
            Self::Postgres(s) => Ok(s.begin_single(id).await?.map(DbTx::Postgres)),
        }
    }

    async fn record_final(
        &self,
        tx: &mut DbTx,
        req: &ClaimRequest<'_>,
        response: &StoredResponse,
        now: Millis,
    ) -> Result<Option<i64>> {
        match (self, tx) {
            (Self::Sqlite(s), DbTx::Sqlite(tx)) => s.record_final(tx, req, response, now).await,
            (Self::Postgres(s), DbTx::Postgres(tx)) => s.record_final(tx, req, response, now).await,
            _ => Err(wrong_backend()),
        }
    }

    async fn write_fenced(
        &self,
        tx: &mut DbTx,
        fence: &Fence,
        write: FencedWrite<'_>,
        now: Millis,
    ) -> Result<()> {
        match (self, tx) {
            (Self::Sqlite(s), DbTx::Sqlite(tx)) => s.write_fenced(tx, fence, write, now).await,
            (Self::Postgres(s), DbTx::Postgres(tx)) => s.write_fenced(tx, fence, write, now).await,
            _ => Err(wrong_backend()),
        }
    }

    async fn take_over(
        &self,
        id: &KeyId,
        fingerprint: &Fingerprint,
        now: Millis,
        lease_expires_at: Millis,
    ) -> Result<Option<TakenOver>> {
        match self {
            Self::Sqlite(s) => s.take_over(id, fingerprint, now, lease_expires_at).await,
            Self::Postgres(s) => s.take_over(id, fingerprint, now, lease_expires_at).await,
        }
    }

    async fn renew_lease(
        &self,
        fence: &Fence,
        now: Millis,
        lease_expires_at: Millis,
    ) -> Result<bool> {
        match self {
            Self::Sqlite(s) => s.renew_lease(fence, now, lease_expires_at).await,
            Self::Postgres(s) => s.renew_lease(fence, now, lease_expires_at).await,
        }
    }

    async fn release_lease(&self, fence: &Fence, now: Millis) -> Result<bool> {
        match self {
            Self::Sqlite(s) => s.release_lease(fence, now).await,
            Self::Postgres(s) => s.release_lease(fence, now).await,
        }
    }

    async fn abandoned(&self, now: Millis, limit: i64) -> Result<Vec<AbandonedKey>> {
        match self {
            Self::Sqlite(s) => s.abandoned(now, limit).await,
            Self::Postgres(s) => s.abandoned(now, limit).await,
        }
    }

    async fn reap(&self, now: Millis, limit: i64) -> Result<ReapBatch> {
        match self {
            Self::Sqlite(s) => s.reap(now, limit).await,
            Self::Postgres(s) => s.reap(now, limit).await,
        }
    }

    async fn orphans(&self, now: Millis) -> Result<super::Orphans> {
        match self {
            Self::Sqlite(s) => s.orphans(now).await,
            Self::Postgres(s) => s.orphans(now).await,
        }
    }

    async fn oldest_expired(&self, now: Millis) -> Result<Option<Millis>> {
        match self {
            Self::Sqlite(s) => s.oldest_expired(now).await,
            Self::Postgres(s) => s.oldest_expired(now).await,
        }
    }
}

impl StagedJobs for Store {
    async fn stage(&self, tx: &mut DbTx, kind: &str, payload: &str, now: Millis) -> Result<()> {
        match (self, tx) {
            (Self::Sqlite(s), DbTx::Sqlite(tx)) => s.stage(tx, kind, payload, now).await,
            (Self::Postgres(s), DbTx::Postgres(tx)) => s.stage(tx, kind, payload, now).await,
            _ => Err(wrong_backend()),
        }
    }

    async fn staged(&self, limit: i64) -> Result<Vec<StagedJob>> {
        match self {
            Self::Sqlite(s) => s.staged(limit).await,
            Self::Postgres(s) => s.staged(limit).await,
        }
    }

    async fn delete_job(&self, tx: &mut DbTx, id: i64) -> Result<()> {
        match (self, tx) {
            (Self::Sqlite(s), DbTx::Sqlite(tx)) => s.delete_job(tx, id).await,
            (Self::Postgres(s), DbTx::Postgres(tx)) => s.delete_job(tx, id).await,
            _ => Err(wrong_backend()),
        }
    }
}
