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
//! - The pool should be in WAL mode, so readers (replays, GET endpoints) run
//!   while one writer commits and a replay never waits for a transfer;
//!   [`SqliteStore::recommended_options`] gives the settings we test with.
//!   `synchronous = NORMAL` is the WAL setting SQLite recommends: a commit
//!   is durable against a crash of the process; a power cut can lose the
//!   last transactions, and then claim, business writes and response are
//!   lost *together* (never half of them), which keeps the contract.
//!
//! Because the writer gate is per store value, clone one [`SqliteStore`]
//! everywhere instead of building two on the same pool.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use idem_spec::Fingerprint;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::ops::{self, StagedJob};
use super::{
    AbandonedKey, ClaimOutcome, ClaimRequest, Claimed, FencedWrite, KeyRecord, KeyStore, Observed,
    ReapReport, StagedJobs, StoredResponse, TakenOver,
};
use crate::clock::Millis;
use crate::error::{Error, Result};
use crate::key::{Fence, KeyId};

/// A [`KeyStore`] on a `SqlitePool`.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    writer: Arc<Semaphore>,
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
    /// ([`SqliteStore::migrate`]).
    pub fn new(pool: SqlitePool) -> Self {
        Self {
            pool,
            writer: Arc::new(Semaphore::new(1)),
        }
    }

    /// The pool (for the application's own reads and writes).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Creates or updates the key table (and the staged-jobs table); safe to
    /// run at every start. See [`crate::migrate`].
    pub async fn migrate(&self) -> Result<()> {
        crate::migrate::sqlite(&self.pool).await
    }

    /// The connection settings this library is tested with: create the file
    /// if missing, WAL, `synchronous = NORMAL`, a 10 s busy timeout, foreign
    /// keys on. `url` is `sqlite://PATH` or `sqlite::memory:`.
    pub fn recommended_options(url: &str) -> Result<SqliteConnectOptions> {
        Ok(SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true))
    }

    async fn read(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Sqlite>> {
        Ok(self.pool.acquire().await?)
    }
}

impl KeyStore for SqliteStore {
    type Tx = SqliteTx;

    async fn begin(&self) -> Result<SqliteTx> {
        let permit = self
            .writer
            .clone()
            .acquire_owned()
            .await
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
        ops::sqlite::lookup(&mut *self.read().await?, id).await
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome<SqliteTx>> {
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
    }

    async fn observe(&self, id: &KeyId, _now: Millis) -> Result<Observed<SqliteTx>> {
        // A plain read outside the writer: replays and mismatches never
        // queue for it, and a first execution does not hold the writer one
        // statement longer. A record committed after this read (by another
        // process on the same file) is caught by the final
        // claim-and-record, which then loses.
        Ok(Observed {
            record: self.lookup(id).await?,
            busy: false,
            tx: None,
        })
    }

    async fn begin_single(&self, _id: &KeyId) -> Result<Option<SqliteTx>> {
        // The writer lock is the claim: no other transaction can write this
        // key (or anything) until this one ends.
        Ok(Some(self.begin().await?))
    }

    async fn record_final(
        &self,
        tx: &mut SqliteTx,
        req: &ClaimRequest<'_>,
        response: &StoredResponse,
        now: Millis,
    ) -> Result<Option<i64>> {
        ops::sqlite::claim_final(tx, req, response, now).await
    }

    async fn write_fenced(
        &self,
        tx: &mut SqliteTx,
        fence: &Fence,
        write: FencedWrite<'_>,
        now: Millis,
    ) -> Result<()> {
        ops::sqlite::write_fenced(tx, fence, write, now).await
    }

    async fn take_over(
        &self,
        id: &KeyId,
        fingerprint: &Fingerprint,
        now: Millis,
        lease_expires_at: Millis,
    ) -> Result<Option<TakenOver>> {
        let mut tx = self.begin().await?;
        let taken = ops::sqlite::take_over(&mut tx, id, fingerprint, now, lease_expires_at).await?;
        tx.commit().await?;
        Ok(taken)
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

    async fn reap(&self, now: Millis) -> Result<ReapReport> {
        let mut tx = self.begin().await?;
        let report = ops::sqlite::reap(&mut tx, now).await?;
        tx.commit().await?;
        Ok(report)
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
