//! PostgreSQL: the store for many server processes sharing one database, on
//! the application's `PgPool`.
//!
//! Isolation level: the default READ COMMITTED is enough and deliberately
//! kept. Arbitration of a key never relies on a snapshot: it relies on the
//! unique (caller, key) primary key (`INSERT ... ON CONFLICT`), which
//! PostgreSQL checks against the latest committed (or in-progress) row
//! whatever the isolation level; and on a transaction-scoped advisory lock
//! that tells a duplicate "someone is executing this key right now" without
//! making it wait (see [`PgStore`]'s `claim`). SERIALIZABLE would add
//! retry-on-serialization-failure loops without closing any hole.
//!
//! Several processes may migrate at once: [`crate::migrate`] serialises them
//! with an advisory lock.

use std::str::FromStr;
use std::time::Duration;

use idem_spec::Fingerprint;
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgTransactionManager;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction, TransactionManager};

use super::StoreOptions;
use super::ops::{self, StagedJob};
use super::{
    AbandonedKey, ClaimOutcome, ClaimRequest, Claimed, FencedWrite, KeyRecord, KeyStore, Observed,
    ReapBatch, SingleTx, StagedJobs, StoredResponse, TakenOver,
};
use crate::clock::Millis;
use crate::error::Result;
use crate::key::{Fence, KeyId};
use crate::metrics::Stage;

/// A [`KeyStore`] on a `PgPool`. Its transactions are [`PgTx`]: run
/// queries on `&mut **tx`.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
}

/// A PostgreSQL write transaction (READ COMMITTED). Derefs to the
/// connection: run queries on `&mut *tx` (`&mut **tx` through an
/// [`IdemTx`](crate::IdemTx) guard).
///
/// Why a type of its own rather than `sqlx::Transaction` itself: a handler
/// that held an `IdemTx` guard over a bare `sqlx::Transaction<'static,
/// Postgres>` across a query failed axum's handler check ("higher-ranked
/// lifetime error": the guard derefs through the driver's generic
/// connection type); deref'ing straight to `PgConnection` compiles, as
/// [`SqliteTx`](super::SqliteTx) always did.
#[derive(Debug)]
pub struct PgTx(TxInner);

#[derive(Debug)]
enum TxInner {
    /// One the application opened itself ([`PgTx::from_transaction`]).
    Sqlx(Transaction<'static, Postgres>),
    /// One this store opened on a pooled connection it owns, through sqlx's
    /// own transaction manager (so sqlx counts it, and a handler's nested
    /// `begin` is a savepoint). Owning the connection is what lets the store
    /// clean it up when a `BEGIN` fused with the key's lock fails.
    Pooled(Pooled),
}

/// A transaction open on a pooled connection; rolled back when dropped
/// open (queued, like sqlx's own: it goes out with the pool's release ping).
#[derive(Debug)]
struct Pooled {
    conn: PoolConnection<Postgres>,
    open: bool,
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if self.open {
            PgTransactionManager::start_rollback(&mut self.conn);
        }
    }
}

impl PgTx {
    /// Wraps a transaction the application opened itself.
    pub fn from_transaction(tx: Transaction<'static, Postgres>) -> Self {
        Self(TxInner::Sqlx(tx))
    }

    /// Opens a transaction on `conn` with `begin` (a custom `BEGIN`
    /// statement, possibly followed by others in the same message). When it
    /// fails the connection is rolled back by hand, because sqlx leaves a
    /// connection whose custom `BEGIN` failed halfway inside an aborted
    /// transaction it does not know of; if even that fails, the connection
    /// is closed instead of going back to the pool.
    async fn begin_on(
        mut conn: PoolConnection<Postgres>,
        begin: String,
    ) -> std::result::Result<Self, sqlx::Error> {
        match PgTransactionManager::begin(&mut conn, Some(begin.into())).await {
            Ok(()) => Ok(Self(TxInner::Pooled(Pooled { conn, open: true }))),
            Err(e) => {
                if sqlx::query("ROLLBACK").execute(&mut *conn).await.is_err() {
                    conn.close_on_drop();
                }
                Err(e)
            }
        }
    }

    /// Commits.
    pub async fn commit(self) -> Result<()> {
        match self.0 {
            TxInner::Sqlx(tx) => Ok(tx.commit().await?),
            TxInner::Pooled(mut p) => {
                // Marked closed first: a COMMIT that fails leaves sqlx's count
                // of open transactions up, and the pool's release hook then
                // retires the connection.
                p.open = false;
                Ok(PgTransactionManager::commit(&mut p.conn).await?)
            }
        }
    }

    /// Rolls back.
    pub async fn rollback(self) -> Result<()> {
        match self.0 {
            TxInner::Sqlx(tx) => Ok(tx.rollback().await?),
            TxInner::Pooled(mut p) => {
                p.open = false;
                Ok(PgTransactionManager::rollback(&mut p.conn).await?)
            }
        }
    }
}

impl std::ops::Deref for PgTx {
    type Target = sqlx::PgConnection;
    fn deref(&self) -> &Self::Target {
        match &self.0 {
            TxInner::Sqlx(tx) => tx,
            TxInner::Pooled(p) => &p.conn,
        }
    }
}

impl std::ops::DerefMut for PgTx {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match &mut self.0 {
            TxInner::Sqlx(tx) => tx,
            TxInner::Pooled(p) => &mut p.conn,
        }
    }
}

/// The SQLSTATE [`begin_locked_sql`] raises when another transaction holds
/// the key's lock (a class of our own, so no PostgreSQL error is mistaken
/// for it).
const KEY_BUSY_SQLSTATE: &str = "IK409";

/// `BEGIN`, then a transaction-scoped advisory try-lock on (schema, caller,
/// key), raising [`KEY_BUSY_SQLSTATE`] when another transaction holds it:
/// one simple-protocol message, so one round trip.
///
/// Why the lock: without it, a duplicate's INSERT would *block* on the
/// original's uncommitted row until that transaction ends; with it, the
/// duplicate learns at once that the key is in flight and can answer 409 (or
/// wait on its own terms). It is released by commit or rollback, so it can
/// never outlive the claim. A hash collision between two keys only costs a
/// spurious, retryable 409; the unique constraint still arbitrates.
///
/// The lock is taken by `axum_idempotency_try_key_lock`, a PL/pgSQL
/// function the migrations create (migration 3): PostgreSQL compiles it
/// once per connection, where the `DO` block earlier versions sent here was
/// compiled on every request. Its lock id is `hashtextextended(current_schema()
/// || chr(31) || caller || chr(31) || key, 0)`, the expression every version
/// computes, so processes of old and new versions exclude each other during
/// a rolling deploy (`tests/store.rs` checks it). A simple query cannot bind
/// parameters, so caller and key travel hex-encoded and are decoded by
/// PostgreSQL: nothing a caller sends can end the string.
fn begin_locked_sql(id: &KeyId) -> String {
    format!(
        "BEGIN; SELECT axum_idempotency_try_key_lock('{caller}', '{key}')",
        caller = hex::encode(id.caller().as_str()),
        key = hex::encode(id.key().as_str()),
    )
}

impl PgStore {
    /// A store on `pool`, whose database must have the key table
    /// ([`PgStore::migrate`]). A `?options=-c search_path=NAME` parameter
    /// in the pool's URL selects a schema.
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// The pool (for the application's own reads and writes).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Opens a pool on `url` (`postgres://...`) with the settings this
    /// library is tested with: [`PgStore::pool_options`] sized
    /// `options.max_connections`, and a server-side `statement_timeout` of
    /// `options.statement_timeout` on every connection. The recommended way
    /// to get a store. It does not migrate: call [`PgStore::migrate`].
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Self> {
        options.check_not_sqlite_only("PostgreSQL")?;
        let statement_ms = options.statement_timeout.as_millis().max(1);
        let connect =
            PgConnectOptions::from_str(url)?.options([("statement_timeout", statement_ms)]);
        let pool = Self::pool_options(options.acquire_timeout)
            .max_connections(options.max_connections.max(1))
            .connect_with(connect)
            .await?;
        Ok(Self::new(pool))
    }

    /// The pool settings this library is tested with: a connection within
    /// `acquire_timeout` or `503` (clause `idem.store.fail-closed`); a
    /// connection idle for [`PING_IDLE_AFTER`](super::PING_IDLE_AFTER) or
    /// more tested before use, so connections that died with the server are
    /// dropped when it is back instead of failing a request each, while one
    /// in steady use costs no extra round trip; a connection handed back
    /// inside a transaction retired. [`PgStore::connect`] applies them and a
    /// `statement_timeout`; add one to your connect options if you build the
    /// pool yourself.
    pub fn pool_options(acquire_timeout: Duration) -> PgPoolOptions {
        PgPoolOptions::new()
            .acquire_timeout(acquire_timeout)
            .test_before_acquire(false)
            .after_release(super::retire_if_in_transaction)
            .before_acquire(super::usable)
    }

    /// One connection and `SELECT 1` (a readiness probe).
    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&mut *self.read().await?)
            .await?;
        Ok(())
    }

    /// Creates or updates the key table (and the staged-jobs table), then
    /// checks that the claim's advisory lock excludes
    /// ([`PgStore::verify_claim`]); safe to run at every start, from several
    /// processes at once. See [`crate::migrate`].
    pub async fn migrate(&self) -> Result<()> {
        crate::migrate::postgres(&self.pool).await?;
        self.verify_claim().await
    }

    /// The start-up check that the key's advisory lock excludes: one
    /// transaction takes a probe key's lock with exactly the statement a
    /// claim uses, and a second connection's try-lock on it must be
    /// refused. PostgreSQL-compatible engines have shipped
    /// `pg_try_advisory_xact_lock` as a stub that always answers "granted";
    /// on one the in-flight answer would never come and duplicates would
    /// run side by side, so the store refuses to start
    /// ([`Error::ClaimUnsafe`](crate::Error::ClaimUnsafe)) rather than trust it.
    pub async fn verify_claim(&self) -> Result<()> {
        let probe = super::probe_id()?;
        let Some(holder) = self.begin_locked(&probe).await? else {
            return Err(crate::Error::ClaimUnsafe(
                "PostgreSQL: a fresh probe key's advisory lock was refused to its first taker"
                    .into(),
            ));
        };
        // A connection of its own, not the pool's: a pool of one must pass too.
        let mut other =
            <sqlx::PgConnection as sqlx::Connection>::connect_with(&self.pool.connect_options())
                .await?;
        let second = sqlx::raw_sql(&begin_locked_sql(&probe))
            .execute(&mut other)
            .await;
        let refused = match second {
            Ok(_) => false,
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(KEY_BUSY_SQLSTATE) => true,
            Err(e) => return Err(e.into()),
        };
        let _ = sqlx::Connection::close(other).await;
        holder.rollback().await?;
        if refused {
            Ok(())
        } else {
            Err(crate::Error::ClaimUnsafe(
                "PostgreSQL: pg_try_advisory_xact_lock granted a key's lock to a second \
                 connection while a first transaction held it (an engine whose advisory locks \
                 are stubs); the in-flight answer and the claim's exclusion depend on it"
                    .into(),
            ))
        }
    }

    async fn read(&self) -> Result<sqlx::pool::PoolConnection<Postgres>> {
        Ok(self.pool.acquire().await?)
    }

    /// A transaction holding `id`'s advisory lock, or `None` when another
    /// transaction holds it: `BEGIN` and the try-lock in one message, one
    /// round trip where a `BEGIN` and a locking `SELECT` took two.
    async fn begin_locked(&self, id: &KeyId) -> Result<Option<PgTx>> {
        Self::lock_on(self.read().await?, id).await
    }

    /// [`PgStore::begin_locked`] on a connection the caller holds.
    async fn lock_on(conn: PoolConnection<Postgres>, id: &KeyId) -> Result<Option<PgTx>> {
        match PgTx::begin_on(conn, begin_locked_sql(id)).await {
            Ok(tx) => Ok(Some(tx)),
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(KEY_BUSY_SQLSTATE) => {
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl KeyStore for PgStore {
    type Tx = PgTx;

    async fn begin(&self) -> Result<Self::Tx> {
        Ok(PgTx(TxInner::Sqlx(self.pool.begin().await?)))
    }

    async fn commit(&self, tx: Self::Tx) -> Result<()> {
        tx.commit().await
    }

    async fn rollback(&self, tx: Self::Tx) -> Result<()> {
        tx.rollback().await
    }

    async fn lookup(&self, id: &KeyId) -> Result<Option<KeyRecord>> {
        crate::metrics::timed(Stage::Lookup, async {
            ops::pg::lookup(&mut *self.read().await?, id).await
        })
        .await
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome<Self::Tx>> {
        crate::metrics::timed(Stage::Claim, async {
            let mut tx = match self.begin_locked(req.id).await? {
                Some(tx) => tx,
                None => return Ok(ClaimOutcome::Busy),
            };
            match ops::pg::claim(&mut tx, req).await? {
                Some(generation) => Ok(ClaimOutcome::Claimed(Claimed {
                    tx,
                    fence: req.id.fence(generation),
                })),
                None => {
                    tx.rollback().await?;
                    Ok(ClaimOutcome::Taken)
                }
            }
        })
        .await
    }

    async fn observe(&self, id: &KeyId, now: Millis) -> Result<Observed<Self::Tx>> {
        crate::metrics::timed(Stage::Observe, async {
            // One plain read, outside any transaction: a replay (or a
            // mismatch) is answered after this one round trip and holds
            // nothing. Otherwise the request will most likely claim the key,
            // so the same connection goes on at once to the transaction's
            // `BEGIN` with the key's lock (one more round trip, no second
            // connection). A request that commits between the read and the
            // lock is caught by the final claim-and-record, which then loses
            // (the protocol's race, argued in the store docs).
            let mut conn = self.read().await?;
            let record = ops::pg::lookup(&mut conn, id).await?;
            if record.as_ref().is_some_and(|r| r.replayable(now)) {
                return Ok(Observed {
                    record,
                    busy: false,
                    tx: None,
                });
            }
            let tx = Self::lock_on(conn, id).await?;
            Ok(Observed {
                record,
                busy: tx.is_none(),
                tx,
            })
        })
        .await
    }

    async fn begin_single(&self, req: &ClaimRequest<'_>) -> Result<SingleTx<Self::Tx>> {
        crate::metrics::timed(Stage::Claim, async {
            Ok(match self.begin_locked(req.id).await? {
                Some(tx) => SingleTx::Open(tx),
                None => SingleTx::Busy,
            })
        })
        .await
    }

    async fn record_final(
        &self,
        tx: &mut Self::Tx,
        req: &ClaimRequest<'_>,
        response: &StoredResponse,
        now: Millis,
    ) -> Result<Option<i64>> {
        crate::metrics::timed(Stage::RecordFinal, async {
            ops::pg::claim_final(tx, req, response, now).await
        })
        .await
    }

    async fn write_fenced(
        &self,
        tx: &mut Self::Tx,
        fence: &Fence,
        write: FencedWrite<'_>,
        now: Millis,
    ) -> Result<()> {
        crate::metrics::timed(Stage::WriteFenced, async {
            ops::pg::write_fenced(tx, fence, write, now).await
        })
        .await
    }

    async fn take_over(
        &self,
        id: &KeyId,
        fingerprint: &Fingerprint,
        now: Millis,
        lease_expires_at: Millis,
    ) -> Result<Option<TakenOver>> {
        crate::metrics::timed(Stage::TakeOver, async {
            let mut tx = self.begin().await?;
            let taken = ops::pg::take_over(&mut tx, id, fingerprint, now, lease_expires_at).await?;
            tx.commit().await?;
            Ok(taken)
        })
        .await
    }

    async fn renew_lease(
        &self,
        fence: &Fence,
        now: Millis,
        lease_expires_at: Millis,
    ) -> Result<bool> {
        let mut tx = self.begin().await?;
        let renewed = ops::pg::renew(&mut tx, fence, now, lease_expires_at).await?;
        tx.commit().await?;
        Ok(renewed)
    }

    async fn release_lease(&self, fence: &Fence, now: Millis) -> Result<bool> {
        let mut tx = self.begin().await?;
        let released = ops::pg::release(&mut tx, fence, now).await?;
        tx.commit().await?;
        Ok(released)
    }

    async fn abandoned(&self, now: Millis, limit: i64) -> Result<Vec<AbandonedKey>> {
        ops::pg::abandoned(&mut *self.read().await?, now, limit).await
    }

    async fn reap(&self, now: Millis, limit: i64) -> Result<ReapBatch> {
        let mut tx = self.begin().await?;
        let report = ops::pg::reap(&mut tx, now, limit).await?;
        tx.commit().await?;
        Ok(report)
    }

    async fn orphans(&self, now: Millis) -> Result<super::Orphans> {
        ops::pg::orphans(&mut *self.read().await?, now).await
    }

    async fn oldest_expired(&self, now: Millis) -> Result<Option<Millis>> {
        ops::pg::oldest_expired(&mut *self.read().await?, now).await
    }
}

impl super::StoreBackend for PgStore {
    const NAME: &'static str = "postgres";

    fn accepts(url: &str) -> bool {
        url.starts_with("postgres://") || url.starts_with("postgresql://")
    }

    async fn connect_url(url: &str, options: &StoreOptions) -> Result<Self> {
        Self::connect(url, options).await
    }

    async fn migrate_store(&self) -> Result<()> {
        self.migrate().await
    }

    async fn ping_store(&self) -> Result<()> {
        self.ping().await
    }

    async fn close_store(&self) {
        self.pool.close().await;
    }
}

impl StagedJobs for PgStore {
    async fn stage(&self, tx: &mut Self::Tx, kind: &str, payload: &str, now: Millis) -> Result<()> {
        ops::pg::stage(tx, kind, payload, now).await
    }

    async fn staged(&self, limit: i64) -> Result<Vec<StagedJob>> {
        ops::pg::staged(&mut *self.read().await?, limit).await
    }

    async fn delete_job(&self, tx: &mut Self::Tx, id: i64) -> Result<()> {
        ops::pg::delete_job(tx, id).await
    }
}
