//! The key table's migrations, run by the application at start.
//!
//! ```no_run
//! # async fn start(pool: sqlx::SqlitePool) -> Result<(), Box<dyn std::error::Error>> {
//! let store = axum_idempotency::SqliteStore::new(pool.clone());
//! store.migrate().await?;              // the library's tables
//! sqlx::migrate!().run(&pool).await?;  // yours, untouched
//! # Ok(()) }
//! ```
//!
//! Why not sqlx's migrator: it keeps one history table per database
//! (`_sqlx_migrations`) and refuses to run when that table holds versions it
//! does not know (`VersionMissing`), so a library's migrations and the
//! application's in one database break each other unless both sides set
//! `ignore_missing`. This runner keeps its own history,
//! `axum_idempotency_migrations` (version, description, SHA-256 of the SQL,
//! when), so `sqlx::migrate!()` and any other tool keep working unchanged.
//! Like sqlx's, it refuses a database where an applied migration's SQL has
//! changed since, and it is safe to run from several processes at once
//! (one transaction, under an advisory lock on PostgreSQL and the write
//! lock on SQLite; DDL is transactional on both; on MySQL, whose DDL is
//! not, every statement is idempotent instead, see [`MYSQL`]).
//!
//! The SQL is public ([`SQLITE`], [`POSTGRES`], [`MYSQL`]) for applications whose
//! migrations are run by another tool: copy the files into your own
//! history instead of calling this module.

use sha2::{Digest, Sha256};
#[cfg(feature = "mysql")]
use sqlx::MySqlPool;
#[cfg(feature = "postgres")]
use sqlx::PgPool;
#[cfg(feature = "sqlite")]
use sqlx::SqlitePool;

use crate::error::{Error, Result};

/// One migration of the library's tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// Applied in increasing order.
    pub version: i64,
    /// What it does.
    pub description: &'static str,
    /// The statements.
    pub sql: &'static str,
}

impl Migration {
    /// SHA-256 of the SQL, hex: what the history table records.
    pub fn checksum(&self) -> String {
        hex::encode(Sha256::digest(self.sql.as_bytes()))
    }
}

/// The SQLite migrations.
pub const SQLITE: [Migration; 3] = [
    Migration {
        version: 1,
        description: "idempotency keys",
        sql: include_str!("../migrations/sqlite/0001_idempotency_keys.sql"),
    },
    Migration {
        version: 2,
        description: "staged jobs",
        sql: include_str!("../migrations/sqlite/0002_staged_jobs.sql"),
    },
    Migration {
        version: 3,
        description: "key lock function",
        sql: include_str!("../migrations/sqlite/0003_key_lock_function.sql"),
    },
];

/// The PostgreSQL migrations.
pub const POSTGRES: [Migration; 3] = [
    Migration {
        version: 1,
        description: "idempotency keys",
        sql: include_str!("../migrations/postgres/0001_idempotency_keys.sql"),
    },
    Migration {
        version: 2,
        description: "staged jobs",
        sql: include_str!("../migrations/postgres/0002_staged_jobs.sql"),
    },
    Migration {
        version: 3,
        description: "key lock function",
        sql: include_str!("../migrations/postgres/0003_key_lock_function.sql"),
    },
];

/// The MySQL / MariaDB migrations. MySQL commits every DDL statement on its
/// own, so a migration cannot be one transaction there: each is written to
/// be safe to run twice (`IF NOT EXISTS`), and two processes starting at
/// once may both run it; the history row is then written once.
pub const MYSQL: [Migration; 3] = [
    Migration {
        version: 1,
        description: "idempotency keys",
        sql: include_str!("../migrations/mysql/0001_idempotency_keys.sql"),
    },
    Migration {
        version: 2,
        description: "staged jobs",
        sql: include_str!("../migrations/mysql/0002_staged_jobs.sql"),
    },
    Migration {
        version: 3,
        description: "key lock function",
        sql: include_str!("../migrations/mysql/0003_key_lock_function.sql"),
    },
];

#[cfg(any(feature = "sqlite", feature = "postgres"))]
const HISTORY_SQL: &str = "CREATE TABLE IF NOT EXISTS axum_idempotency_migrations (\
     version BIGINT PRIMARY KEY, description TEXT NOT NULL, checksum TEXT NOT NULL, \
     applied_at BIGINT NOT NULL)";
const APPLIED_SQL: &str = "SELECT version, checksum FROM axum_idempotency_migrations";
#[cfg(any(feature = "sqlite", feature = "postgres"))]
const RECORD_SQL: &str = "INSERT INTO axum_idempotency_migrations \
     (version, description, checksum, applied_at) VALUES ($1, $2, $3, $4)";

/// Which migrations of `all` still need applying, after checking the ones
/// already applied (`applied`: version and checksum) against their SQL.
fn pending<'a>(all: &'a [Migration], applied: &[(i64, String)]) -> Result<Vec<&'a Migration>> {
    for (version, checksum) in applied {
        match all.iter().find(|m| m.version == *version) {
            Some(m) if m.checksum() == *checksum => {}
            Some(_) => {
                return Err(Error::Migrate(format!(
                    "axum-idempotency migration {version} was applied with different SQL; \
                     the database was migrated by another version of the library"
                )));
            }
            // A newer library applied it: this older one can still run on
            // the tables it knows.
            None => {}
        }
    }
    Ok(all
        .iter()
        .filter(|m| !applied.iter().any(|(v, _)| *v == m.version))
        .collect())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! run {
    ($tx:expr, $all:expr) => {{
        let tx = $tx;
        sqlx::query(HISTORY_SQL).execute(&mut *tx).await?;
        let applied: Vec<(i64, String)> = sqlx::query_as(APPLIED_SQL).fetch_all(&mut *tx).await?;
        for m in pending(&$all, &applied)? {
            sqlx::raw_sql(m.sql).execute(&mut *tx).await.map_err(|e| {
                Error::Migrate(format!(
                    "migration {} ({}): {e}{}",
                    m.version,
                    m.description,
                    crate::error::fault_suffix(&e)
                ))
            })?;
            sqlx::query(RECORD_SQL)
                .bind(m.version)
                .bind(m.description)
                .bind(m.checksum())
                .bind(now_ms())
                .execute(&mut *tx)
                .await?;
            tracing::info!(
                version = m.version,
                description = m.description,
                "axum-idempotency migration applied"
            );
        }
    }};
}

/// Applies the pending [`SQLITE`] migrations to `pool`.
#[cfg(feature = "sqlite")]
pub async fn sqlite(pool: &SqlitePool) -> Result<()> {
    // BEGIN IMMEDIATE takes the write lock first, so two processes starting
    // on one file apply the migrations one after the other.
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    run!(&mut *tx, SQLITE);
    tx.commit().await?;
    Ok(())
}

/// Applies the pending [`POSTGRES`] migrations to `pool` (in its current
/// schema).
#[cfg(feature = "postgres")]
pub async fn postgres(pool: &PgPool) -> Result<()> {
    let mut tx = pool.begin().await?;
    // Serialises concurrent starts, and must come before CREATE TABLE IF
    // NOT EXISTS, which is not safe against a concurrent creator.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended(current_schema() || '.axum_idempotency_migrations', 0))")
        .execute(&mut *tx)
        .await?;
    run!(&mut *tx, POSTGRES);
    tx.commit().await?;
    Ok(())
}

/// Applies the pending [`MYSQL`] migrations to `pool` (in its database).
/// No lock: every statement is idempotent (see [`MYSQL`]), and a history
/// row another process wrote first is checked like any other.
#[cfg(feature = "mysql")]
pub async fn mysql(pool: &MySqlPool) -> Result<()> {
    const MYSQL_HISTORY_SQL: &str = "CREATE TABLE IF NOT EXISTS axum_idempotency_migrations (\
         version BIGINT PRIMARY KEY, description TEXT NOT NULL, checksum TEXT NOT NULL, \
         applied_at BIGINT NOT NULL) ENGINE = InnoDB";
    const MYSQL_RECORD_SQL: &str = "INSERT INTO axum_idempotency_migrations \
         (version, description, checksum, applied_at) VALUES (?, ?, ?, ?)";
    sqlx::query(MYSQL_HISTORY_SQL).execute(pool).await?;
    let applied: Vec<(i64, String)> = sqlx::query_as(APPLIED_SQL).fetch_all(pool).await?;
    for m in pending(&MYSQL, &applied)? {
        sqlx::raw_sql(m.sql).execute(pool).await.map_err(|e| {
            Error::Migrate(format!(
                "migration {} ({}): {e}{}",
                m.version,
                m.description,
                crate::error::fault_suffix(&e)
            ))
        })?;
        let recorded = sqlx::query(MYSQL_RECORD_SQL)
            .bind(m.version)
            .bind(m.description)
            .bind(m.checksum())
            .bind(now_ms())
            .execute(pool)
            .await;
        match recorded {
            Ok(_) => tracing::info!(
                version = m.version,
                description = m.description,
                "axum-idempotency migration applied"
            ),
            // Another process recorded it first: check it recorded this SQL.
            Err(e) if crate::store::mysql::number(&e) == Some(1062) => {
                let again: Vec<(i64, String)> = sqlx::query_as(APPLIED_SQL).fetch_all(pool).await?;
                pending(&MYSQL, &again)?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_increase_and_both_backends_have_the_same_history() {
        for all in [&SQLITE, &POSTGRES, &MYSQL] {
            assert!(all.windows(2).all(|w| w[0].version < w[1].version));
        }
        let describe = |all: &[Migration]| {
            all.iter()
                .map(|m| (m.version, m.description))
                .collect::<Vec<_>>()
        };
        assert_eq!(describe(&SQLITE), describe(&POSTGRES));
        assert_eq!(describe(&SQLITE), describe(&MYSQL));
    }

    #[test]
    fn an_edited_migration_is_refused_and_unknown_newer_ones_are_tolerated() {
        let applied = vec![(1, SQLITE[0].checksum())];
        let todo = pending(&SQLITE, &applied).expect("pending");
        assert_eq!(
            todo.iter().map(|m| m.version).collect::<Vec<_>>(),
            vec![2, 3]
        );
        assert!(pending(&SQLITE, &[(1, "edited".into())]).is_err());
        let newer = vec![
            (1, SQLITE[0].checksum()),
            (2, SQLITE[1].checksum()),
            (3, SQLITE[2].checksum()),
            (99, "x".into()),
        ];
        assert!(pending(&SQLITE, &newer).expect("tolerated").is_empty());
    }
}
