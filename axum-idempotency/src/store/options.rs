//! The store settings shared by [`SqliteStore::connect`](super::SqliteStore::connect),
//! [`PgStore::connect`](super::PgStore::connect) and `Store::connect_with`: pool size,
//! the time bounds that make a store outage fail fast, and how SQLite flushes its
//! commits. Outside the stores' modules so each exists with its own cargo feature alone.

use std::time::Duration;

/// The default bound on waiting for the store: a connection from the pool,
/// SQLite's write lock (the writer gate and another process's lock). Short,
/// so an outage is answered `503` at once instead of hanging requests
/// (clause `idem.store.fail-closed`).
pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);

/// The default bound on one statement (PostgreSQL `statement_timeout`),
/// below the default lease so a stuck statement cannot outlive its key.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);

/// How [`SqliteStore::connect`](super::SqliteStore::connect),
/// [`PgStore::connect`](super::PgStore::connect) (and `Store::connect_with`)
/// build their pool: size and the time bounds that make a store outage fail
/// fast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreOptions {
    /// Pool size (at least 1).
    pub max_connections: u32,
    /// Longest wait for a connection or for SQLite's write lock; past it
    /// the request is answered `503 upstream_unavailable`.
    pub acquire_timeout: Duration,
    /// Longest one PostgreSQL statement may run (server-side
    /// `statement_timeout`); not applied to SQLite, whose statements are
    /// local and bounded by its busy timeout.
    pub statement_timeout: Duration,
    /// How SQLite flushes a commit (`PRAGMA synchronous`); PostgreSQL and
    /// MySQL take their server's own settings.
    pub sqlite_synchronous: SqliteSync,
}

/// SQLite's `synchronous` setting, as the stores offer it (WAL mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SqliteSync {
    /// `NORMAL`, the setting SQLite recommends with WAL: a committed
    /// transaction survives a crash of the process; on a power loss or an
    /// OS crash the last ones may be rolled back, whole (claim, business
    /// writes and stored response together), never half.
    #[default]
    Normal,
    /// `FULL`: every commit is flushed to disk before it returns (an fsync
    /// per commit), so it survives a power loss too.
    Full,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            max_connections: 10,
            acquire_timeout: DEFAULT_ACQUIRE_TIMEOUT,
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
            sqlite_synchronous: SqliteSync::Normal,
        }
    }
}

impl StoreOptions {
    /// Sets the pool size.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// Sets the bound on waiting for a connection (and SQLite's lock).
    pub fn acquire_timeout(mut self, d: Duration) -> Self {
        self.acquire_timeout = d;
        self
    }

    /// Sets the bound on one PostgreSQL statement.
    pub fn statement_timeout(mut self, d: Duration) -> Self {
        self.statement_timeout = d;
        self
    }

    /// Sets how SQLite flushes its commits.
    pub fn sqlite_synchronous(mut self, sync: SqliteSync) -> Self {
        self.sqlite_synchronous = sync;
        self
    }

    /// An error when a SQLite-only setting is asked of `store`: a durability
    /// setting that would otherwise be ignored without a word is worse than
    /// a refusal at start-up.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fn check_not_sqlite_only(&self, store: &str) -> crate::Result<()> {
        if self.sqlite_synchronous == SqliteSync::default() {
            return Ok(());
        }
        Err(crate::Error::Config(format!(
            "sqlite_synchronous is a SQLite setting; {store} takes its server's own \
             durability settings"
        )))
    }
}
