//! The store settings shared by [`SqliteStore::connect`](super::SqliteStore::connect),
//! [`PgStore::connect`](super::PgStore::connect) and `Store::connect_with`: pool size
//! and the time bounds that make a store outage fail fast. Outside the stores'
//! modules so each exists with its own cargo feature alone.

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
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            max_connections: 10,
            acquire_timeout: DEFAULT_ACQUIRE_TIMEOUT,
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
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
}
