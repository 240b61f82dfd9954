//! SQLite: the embedded default, on the application's `SqlitePool`.
//!
//! Why these choices:
//! - SQLite has exactly one writer at a time. Write transactions start with
//!   `BEGIN IMMEDIATE`, which takes the write lock up front: a deferred
//!   transaction that read first could fail to upgrade with
//!   `SQLITE_BUSY_SNAPSHOT` halfway through. Writers of this process queue on
//!   an async semaphore (the store's *writer gate*) instead of in SQLite's
//!   sleeping busy handler; writers of other processes on the same file
//!   still wait in the busy handler (`busy_timeout`).
//! - A single-phase request takes the writer as late as it can: at its
//!   endpoint's first [`IdemTx::lock`](crate::IdemTx::lock), not before the
//!   endpoint runs (see [`SingleTx::Deferred`]). Unrelated first executions
//!   therefore run their slow parts at the same time and queue only for
//!   their writes. A duplicate in another *process* on the same file is not
//!   told "in flight" (SQLite has no lock a reader could try): it runs too,
//!   loses the final write and answers from the winner's record, with its
//!   writes rolled back. Several processes belong on PostgreSQL.
//! - The pool should be in WAL mode, so readers (replays, GET endpoints) run
//!   while one writer commits and a replay never waits for a transfer;
//!   [`SqliteStore::recommended_options`] gives the settings we test with.
//!   `synchronous = NORMAL` is the WAL setting SQLite recommends. What it
//!   guarantees: a committed transaction survives a crash of the process
//!   (the commit is in the WAL file, in the OS's page cache); on a power
//!   loss or OS crash the last transactions committed before it may be
//!   lost (rolled back), but the database is never corrupted, and because
//!   claim, business writes and stored response commit in one transaction
//!   they are lost *together*, never half of them. A client that got a
//!   `201` for a lost transaction retries into a fresh execution: effectively
//!   once still holds for the data that survived, but a response the client
//!   saw may be forgotten. Applications that cannot accept that choose
//!   `synchronous = FULL` (an fsync per commit) with
//!   [`StoreOptions::sqlite_synchronous`]; the repository's benchmark
//!   reports what it costs.
//! - Waiting is bounded (clause `idem.store.fail-closed`): a writer waits at
//!   most the pool's acquire timeout for the writer gate, SQLite's busy
//!   timeout for another process's lock (both 2 s by default), and is
//!   answered `503 upstream_unavailable` past them, never held.
//! - A connection whose commit or rollback failed (a full disk) is retired,
//!   not reused: see [`SqliteStore::pool_options`].
//!
//! Because the writer gate is per store value, clone one [`SqliteStore`]
//! everywhere instead of building two on the same pool.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use idem_spec::Fingerprint;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::StoreOptions;
use super::ops::{self, StagedJob};
use super::{
    AbandonedKey, ClaimOutcome, ClaimRequest, Claimed, FencedWrite, KeyRecord, KeyStore, Observed,
    ReapBatch, SingleTx, StagedJobs, StoredResponse, TakenOver,
};
use crate::clock::Millis;
use crate::error::{Error, Result};
use crate::key::{Fence, KeyId};
use crate::metrics::Stage;

/// A [`KeyStore`] on a `SqlitePool`.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    writer: Arc<Semaphore>,
    gate_timeout: Duration,
}

/// A SQLite write transaction (`BEGIN IMMEDIATE`) holding this process's
/// writer permit until it ends. Derefs to the connection: run queries on
/// `&mut *tx`.
#[derive(Debug)]
pub struct SqliteTx {
    tx: sqlx::Transaction<'static, sqlx::Sqlite>,
    _writer: Option<OwnedSemaphorePermit>,
}

impl SqliteTx {
    /// Wraps a transaction the application opened itself, outside the
    /// store's writer gate (its first write then waits in SQLite's busy
    /// handler instead).
    pub fn from_transaction(tx: sqlx::Transaction<'static, sqlx::Sqlite>) -> Self {
        Self { tx, _writer: None }
    }

    /// Commits.
    pub async fn commit(self) -> Result<()> {
        Ok(self.tx.commit().await?)
    }

    /// Rolls back.
    pub async fn rollback(self) -> Result<()> {
        Ok(self.tx.rollback().await?)
    }
}

impl std::ops::Deref for SqliteTx {
    type Target = sqlx::SqliteConnection;
    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl std::ops::DerefMut for SqliteTx {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

impl SqliteStore {
    /// A store on `pool`, whose database must have the key table
    /// ([`SqliteStore::migrate`]). A writer waits for this process's writer
    /// gate at most the pool's acquire timeout.
    pub fn new(pool: SqlitePool) -> Self {
        let gate_timeout = pool.options().get_acquire_timeout();
        Self {
            pool,
            writer: Arc::new(Semaphore::new(1)),
            gate_timeout,
        }
    }

    /// Opens (creating it if missing) the SQLite file at `path` with the
    /// settings this library is tested with and [`StoreOptions::default`]:
    /// the recommended way to get a store. The same as
    /// [`SqliteStore::connect`] with `sqlite://PATH`. It does not migrate:
    /// call [`SqliteStore::migrate`].
    pub async fn open(path: impl AsRef<std::path::Path>) -> Result<Self> {
        let connect = Self::tuned(SqliteConnectOptions::new().filename(path));
        Self::connect_pool(connect, &StoreOptions::default()).await
    }

    /// Opens a pool on `url` (`sqlite://PATH`, created if missing, or
    /// `sqlite::memory:`) with both halves of the tested setup:
    /// [`SqliteStore::recommended_options`] for each connection (with
    /// `options.acquire_timeout` as the busy timeout) and
    /// [`SqliteStore::pool_options`] for the pool, sized
    /// `options.max_connections`, with `options.sqlite_synchronous`. Build
    /// the pool yourself from those two only when you need a setting they
    /// do not cover.
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Self> {
        Self::connect_pool(Self::recommended_options(url)?, options).await
    }

    async fn connect_pool(connect: SqliteConnectOptions, options: &StoreOptions) -> Result<Self> {
        let synchronous = match options.sqlite_synchronous {
            super::SqliteSync::Normal => SqliteSynchronous::Normal,
            super::SqliteSync::Full => SqliteSynchronous::Full,
        };
        let pool = Self::pool_options(options.acquire_timeout)
            .max_connections(options.max_connections.max(1))
            .connect_with(
                connect
                    .busy_timeout(options.acquire_timeout)
                    .synchronous(synchronous),
            )
            .await?;
        Ok(Self::new(pool))
    }

    /// The pool settings this library is tested with: connections are
    /// acquired within `acquire_timeout`; one handed back inside a
    /// transaction (its commit or rollback failed, e.g. on a full disk) is
    /// closed instead of reused; and a connection is pinged before use only
    /// when it sat idle for [`PING_IDLE_AFTER`](super::PING_IDLE_AFTER), not
    /// at every acquire (sqlx's default, a worker-thread round trip each).
    /// [`SqliteStore::connect`] and [`SqliteStore::open`] apply them; to
    /// build your own pool, start from these (then set `max_connections`)
    /// or add the same hooks to yours.
    pub fn pool_options(acquire_timeout: Duration) -> SqlitePoolOptions {
        SqlitePoolOptions::new()
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

    /// The pool (for the application's own reads and writes).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Creates or updates the key table (and the staged-jobs table), then
    /// checks that the claim excludes ([`SqliteStore::verify_claim`]); safe
    /// to run at every start. See [`crate::migrate`].
    pub async fn migrate(&self) -> Result<()> {
        crate::migrate::sqlite(&self.pool).await?;
        self.verify_claim().await
    }

    /// The start-up check that the claim excludes: while this store holds
    /// the writer (`BEGIN IMMEDIATE`), a second connection to the same file
    /// must be refused the write lock at once. A file on a filesystem whose
    /// locks do not work (some network filesystems) would let two processes
    /// write at once, so the store refuses to start
    /// ([`Error::ClaimUnsafe`]). An in-memory database is private to this
    /// pool, where the writer gate alone excludes: nothing to check.
    pub async fn verify_claim(&self) -> Result<()> {
        let options = self.pool.connect_options();
        let file = options.get_filename().to_owned();
        // In-memory and shared-cache databases lock tables inside this
        // process (a second connection waits on SQLite's unlock
        // notification rather than failing busy): only this pool reaches
        // them, and the writer gate excludes there.
        // (sqlx names an in-memory database `file:sqlx-in-memory-N`.)
        let name = file.to_string_lossy();
        if name.is_empty() || name == ":memory:" || name.starts_with("file:") {
            return Ok(());
        }
        let holder = self.begin().await?;
        // Bounded: a second writer that waits instead of failing busy is
        // excluded too.
        let second = tokio::time::timeout(
            self.gate_timeout,
            second_writer_refused((*options).clone().busy_timeout(Duration::ZERO)),
        )
        .await
        .unwrap_or(Ok(true));
        holder.rollback().await?;
        if second? {
            Ok(())
        } else {
            Err(Error::ClaimUnsafe(format!(
                "SQLite: a second connection to {} took the write lock while this store held \
                 it; the file's locks do not exclude (a network filesystem?)",
                file.display()
            )))
        }
    }

    /// The connection settings this library is tested with: create the file
    /// if missing, WAL, `synchronous = NORMAL` (see the module docs for what
    /// it guarantees on power loss), a busy timeout of
    /// [`DEFAULT_ACQUIRE_TIMEOUT`](super::DEFAULT_ACQUIRE_TIMEOUT) (another
    /// process holding the write lock longer is answered 503), foreign keys
    /// on. `url` is `sqlite://PATH` or `sqlite::memory:`.
    /// [`SqliteStore::connect`] applies them.
    pub fn recommended_options(url: &str) -> Result<SqliteConnectOptions> {
        Ok(Self::tuned(SqliteConnectOptions::from_str(url)?))
    }

    fn tuned(options: SqliteConnectOptions) -> SqliteConnectOptions {
        options
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(super::DEFAULT_ACQUIRE_TIMEOUT)
            .foreign_keys(true)
    }

    async fn read(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Sqlite>> {
        Ok(self.pool.acquire().await?)
    }
}

impl KeyStore for SqliteStore {
    type Tx = SqliteTx;

    async fn begin(&self) -> Result<SqliteTx> {
        // Bounded like the pool's acquire: a writer queued behind a long
        // transaction (or a lock held by another process) is answered 503,
        // not held.
        let permit = tokio::time::timeout(self.gate_timeout, self.writer.clone().acquire_owned())
            .await
            .map_err(|_| Error::from(sqlx::Error::PoolTimedOut))?
            .map_err(|_| Error::Internal("SQLite writer gate closed".into()))?;
        let tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        Ok(SqliteTx {
            tx,
            _writer: Some(permit),
        })
    }

    async fn commit(&self, tx: SqliteTx) -> Result<()> {
        tx.commit().await
    }

    async fn rollback(&self, tx: SqliteTx) -> Result<()> {
        tx.rollback().await
    }

    async fn lookup(&self, id: &KeyId) -> Result<Option<KeyRecord>> {
        crate::metrics::timed(Stage::Lookup, async {
            ops::sqlite::lookup(&mut *self.read().await?, id).await
        })
        .await
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome<SqliteTx>> {
        crate::metrics::timed(Stage::Claim, async {
            // One writer at a time: holding the gate is what PostgreSQL's
            // advisory lock gives (no second transaction can be inside this
            // key's claim), so there is no Busy here; an in-process duplicate is
            // answered by the engine's registry before it queues for the gate.
            let mut tx = self.begin().await?;
            match ops::sqlite::claim(&mut tx, req).await? {
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

    async fn observe(&self, id: &KeyId, _now: Millis) -> Result<Observed<SqliteTx>> {
        crate::metrics::timed(Stage::Observe, async {
            // A plain read outside the writer: replays and mismatches never
            // queue for it, and a first execution does not hold the writer one
            // statement longer. A record committed after this read (by another
            // process on the same file) is caught by the final
            // claim-and-record, which then loses.
            Ok(Observed {
                record: ops::sqlite::lookup(&mut *self.read().await?, id).await?,
                busy: false,
                tx: None,
            })
        })
        .await
    }

    async fn begin_single(&self, _req: &ClaimRequest<'_>) -> Result<SingleTx<SqliteTx>> {
        // The writer lock is the claim: no other transaction can write this
        // key (or anything) while one holds it. So it is taken at the
        // endpoint's first write, not before the endpoint runs: a handler
        // that calls another service first holds nothing meanwhile.
        Ok(SingleTx::Deferred)
    }

    async fn record_final(
        &self,
        tx: &mut SqliteTx,
        req: &ClaimRequest<'_>,
        response: &StoredResponse,
        now: Millis,
    ) -> Result<Option<i64>> {
        crate::metrics::timed(Stage::RecordFinal, async {
            ops::sqlite::claim_final(tx, req, response, now).await
        })
        .await
    }

    async fn record_final_and_commit(
        &self,
        mut tx: SqliteTx,
        req: &ClaimRequest<'_>,
        response: &StoredResponse,
        now: Millis,
    ) -> Result<Option<i64>> {
        use ops::sqlite::FinalInsert;
        crate::metrics::timed(Stage::RecordFinal, async {
            // A key without a row (every first execution but a reclaim) is
            // inserted and committed in one hand-off to the worker; SQLite's
            // write lock goes with that COMMIT, so this process's writer
            // gate is handed on before the empty transaction sqlx counts is
            // closed.
            match ops::sqlite::insert_final_commit(&mut tx, req, response, now).await? {
                FinalInsert::Committed => {
                    drop(tx._writer.take());
                    if let Err(e) = tx.commit().await {
                        // The record is committed; the connection retires
                        // itself if this left it inside a transaction.
                        tracing::warn!(error = %e, "closing the empty transaction after the final commit failed");
                    }
                    Ok(Some(1))
                }
                FinalInsert::CommittedConnectionSpoilt(e) => {
                    // Dropped: the pool's release hook retires a connection
                    // that sqlx counts inside a transaction.
                    tracing::warn!(error = %e, "the final write committed, but its connection cannot be reused");
                    drop(tx);
                    Ok(Some(1))
                }
                FinalInsert::RowExists => {
                    // The key's row is there: the upsert decides, in the same
                    // transaction, whether it may be replaced.
                    match ops::sqlite::claim_final(&mut tx, req, response, now).await {
                        Ok(Some(generation)) => tx.commit().await.map(|()| Some(generation)),
                        Ok(None) => tx.rollback().await.map(|()| None),
                        Err(e) => {
                            tx.rollback().await?;
                            Err(e)
                        }
                    }
                }
                FinalInsert::Failed(e) => {
                    // The worker stopped at the failed statement; what is
                    // left open is rolled back (a connection it cannot roll
                    // back is retired by the pool).
                    let _ = tx.rollback().await;
                    Err(Error::from(e))
                }
            }
        })
        .await
    }

    async fn write_fenced(
        &self,
        tx: &mut SqliteTx,
        fence: &Fence,
        write: FencedWrite<'_>,
        now: Millis,
    ) -> Result<()> {
        crate::metrics::timed(Stage::WriteFenced, async {
            ops::sqlite::write_fenced(tx, fence, write, now).await
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
            let taken =
                ops::sqlite::take_over(&mut tx, id, fingerprint, now, lease_expires_at).await?;
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
        let renewed = ops::sqlite::renew(&mut tx, fence, now, lease_expires_at).await?;
        tx.commit().await?;
        Ok(renewed)
    }

    async fn release_lease(&self, fence: &Fence, now: Millis) -> Result<bool> {
        let mut tx = self.begin().await?;
        let released = ops::sqlite::release(&mut tx, fence, now).await?;
        tx.commit().await?;
        Ok(released)
    }

    async fn abandoned(&self, now: Millis, limit: i64) -> Result<Vec<AbandonedKey>> {
        ops::sqlite::abandoned(&mut *self.read().await?, now, limit).await
    }

    async fn reap(&self, now: Millis, limit: i64) -> Result<ReapBatch> {
        let mut tx = self.begin().await?;
        let report = ops::sqlite::reap(&mut tx, now, limit).await?;
        tx.commit().await?;
        Ok(report)
    }

    async fn orphans(&self, now: Millis) -> Result<super::Orphans> {
        ops::sqlite::orphans(&mut *self.read().await?, now).await
    }

    async fn oldest_expired(&self, now: Millis) -> Result<Option<Millis>> {
        ops::sqlite::oldest_expired(&mut *self.read().await?, now).await
    }
}

/// Whether a connection of its own (busy timeout zero) is refused SQLite's
/// write lock: the second half of [`SqliteStore::verify_claim`].
async fn second_writer_refused(options: SqliteConnectOptions) -> Result<bool> {
    use sqlx::{Connection, Executor};
    let mut other = sqlx::SqliteConnection::connect_with(&options).await?;
    let refused = match other.execute("BEGIN IMMEDIATE").await {
        Ok(_) => {
            let _ = other.execute("ROLLBACK").await;
            false
        }
        Err(e) if crate::StoreFault::of(&e) == Some(crate::StoreFault::Locked) => true,
        Err(e) => return Err(Error::from(e)),
    };
    let _ = other.close().await;
    Ok(refused)
}

impl super::StoreBackend for SqliteStore {
    const NAME: &'static str = "sqlite";

    fn accepts(url: &str) -> bool {
        url.starts_with("sqlite:")
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

impl StagedJobs for SqliteStore {
    async fn stage(&self, tx: &mut SqliteTx, kind: &str, payload: &str, now: Millis) -> Result<()> {
        ops::sqlite::stage(tx, kind, payload, now).await
    }

    async fn staged(&self, limit: i64) -> Result<Vec<StagedJob>> {
        ops::sqlite::staged(&mut *self.read().await?, limit).await
    }

    async fn delete_job(&self, tx: &mut SqliteTx, id: i64) -> Result<()> {
        ops::sqlite::delete_job(tx, id).await
    }
}
