//! PostgreSQL: the store for many server processes sharing one database.
//!
//! Isolation level: the default READ COMMITTED is enough and deliberately
//! kept. Arbitration of a key never relies on a snapshot: it relies on the
//! unique (caller, key) primary key (`INSERT ... ON CONFLICT`), which
//! PostgreSQL checks against the latest committed (or in-progress) row
//! whatever the isolation level; and on a transaction-scoped advisory lock
//! that tells a duplicate "someone is executing this key right now" without
//! making it wait (see [`Store::claim`](super::Store)). SERIALIZABLE would
//! add retry-on-serialization-failure loops without closing any hole.

use std::str::FromStr;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::error::Result;

/// Connects to `url` (`postgres://...`; a `?options=-c search_path=NAME`
/// parameter selects a schema) and applies the migrations in
/// `migrations/postgres`.
///
/// Several processes may start at once: sqlx's migrator takes a PostgreSQL
/// advisory lock, so exactly one of them applies the migrations.
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool> {
    let options = PgConnectOptions::from_str(url)?;
    let pool = PgPoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await?;
    sqlx::migrate!("./migrations/postgres").run(&pool).await?;
    Ok(pool)
}
