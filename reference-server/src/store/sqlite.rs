//! The embedded default: one SQLite file in WAL mode.
//!
//! Why these settings:
//! - WAL lets readers (replays, GET endpoints) run while one writer commits,
//!   so a replay never waits for a transfer.
//! - `synchronous = NORMAL` is the WAL setting SQLite recommends: a commit is
//!   durable against a crash of the process; only a power cut can lose the
//!   last transactions, and then claim, business writes and response are lost
//!   *together* (never half of them), which keeps the contract.
//! - SQLite has exactly one writer at a time. Write transactions start with
//!   `BEGIN IMMEDIATE`, which takes the write lock up front: a deferred
//!   transaction that read first could fail to upgrade with
//!   `SQLITE_BUSY_SNAPSHOT` halfway through. Writers of this process queue on
//!   an async semaphore instead of in SQLite's sleeping busy handler; writers
//!   of other processes on the same file still wait in the busy handler
//!   (`busy_timeout`).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tokio::sync::Semaphore;

use crate::error::Result;

/// The SQLite half of [`Store`](super::Store): a pool and the in-process
/// writer gate.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// The connection pool (readers run in parallel under WAL).
    pub pool: SqlitePool,
    /// One permit: the single writer of this process.
    pub(crate) writer: Arc<Semaphore>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `url` (`sqlite://path` or
    /// `sqlite::memory:`) and applies the migrations in `migrations/sqlite`.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
        Ok(Self {
            pool,
            writer: Arc::new(Semaphore::new(1)),
        })
    }
}
