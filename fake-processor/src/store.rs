//! Durable state in one SQLite file: charges and per-key call counts.
//!
//! Every write is a single autocommit statement, so there is no transaction
//! to upgrade and concurrent writers only ever wait on the busy timeout.
//! `synchronous = FULL` in WAL mode makes every committed charge survive a
//! `kill -9` of the processor and a power cut alike.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{FromRow, SqlitePool};

use crate::Error;
use crate::model::{Charge, ChargeList, ChargeStatus};

const CHARGE_COLUMNS: &str = "id, idempotency_key, fingerprint, amount, currency, source, \
                              description, status, failure_code, created_at";

/// A charge row; `fingerprint` stays inside the store.
#[derive(Debug, FromRow)]
struct ChargeRow {
    id: String,
    idempotency_key: String,
    fingerprint: String,
    amount: i64,
    currency: String,
    source: Option<String>,
    description: Option<String>,
    status: String,
    failure_code: Option<String>,
    created_at: DateTime<Utc>,
}

impl ChargeRow {
    fn into_charge(self) -> Result<(Charge, String), Error> {
        let status = match self.status.as_str() {
            "succeeded" => ChargeStatus::Succeeded,
            "declined" => ChargeStatus::Declined,
            other => {
                return Err(Error::Database(sqlx::Error::Decode(
                    format!("unknown charge status {other:?}").into(),
                )));
            }
        };
        Ok((
            Charge {
                id: self.id,
                idempotency_key: self.idempotency_key,
                amount: self.amount,
                currency: self.currency,
                source: self.source,
                description: self.description,
                status,
                failure_code: self.failure_code,
                created_at: self.created_at,
            },
            self.fingerprint,
        ))
    }
}

/// What a claim found.
#[derive(Debug)]
pub(crate) enum Claim {
    /// This call inserted the charge.
    Created(Charge),
    /// The key already had a charge; its request fingerprint is attached.
    Existing {
        /// The stored charge.
        charge: Charge,
        /// Fingerprint of the request that created it.
        fingerprint: String,
    },
}

/// Handle on the processor's database.
#[derive(Debug, Clone)]
pub(crate) struct Store {
    pool: SqlitePool,
}

impl Store {
    /// Opens (creating if needed) the database at `path` and migrates it.
    pub(crate) async fn open(path: &Path) -> Result<Self, Error> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations").run(&pool).await?;
        Ok(Self { pool })
    }

    /// Counts one call with `key` and returns the new total.
    pub(crate) async fn count_call(&self, key: &str) -> Result<u64, Error> {
        let calls: i64 = sqlx::query_scalar(
            "INSERT INTO key_calls (idempotency_key, calls) VALUES (?1, 1) \
             ON CONFLICT (idempotency_key) DO UPDATE SET calls = calls + 1 \
             RETURNING calls",
        )
        .bind(key)
        .fetch_one(&self.pool)
        .await?;
        Ok(u64::try_from(calls).unwrap_or(0))
    }

    /// Inserts `charge` unless its key already has one, in one statement;
    /// returns whichever charge the key now holds.
    pub(crate) async fn claim(&self, charge: &Charge, fingerprint: &str) -> Result<Claim, Error> {
        let inserted: Option<ChargeRow> = sqlx::query_as(&format!(
            "INSERT INTO charges ({CHARGE_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
             ON CONFLICT (idempotency_key) DO NOTHING RETURNING {CHARGE_COLUMNS}"
        ))
        .bind(&charge.id)
        .bind(&charge.idempotency_key)
        .bind(fingerprint)
        .bind(charge.amount)
        .bind(&charge.currency)
        .bind(&charge.source)
        .bind(&charge.description)
        .bind(charge.status.as_str())
        .bind(&charge.failure_code)
        .bind(charge.created_at)
        .fetch_optional(&self.pool)
        .await?;
        if let Some(row) = inserted {
            return Ok(Claim::Created(row.into_charge()?.0));
        }
        // Rows are never deleted, so the conflicting row is still there.
        let row: ChargeRow = sqlx::query_as(&format!(
            "SELECT {CHARGE_COLUMNS} FROM charges WHERE idempotency_key = ?1"
        ))
        .bind(&charge.idempotency_key)
        .fetch_one(&self.pool)
        .await?;
        let (charge, fingerprint) = row.into_charge()?;
        Ok(Claim::Existing {
            charge,
            fingerprint,
        })
    }

    /// One charge by id.
    pub(crate) async fn get(&self, id: &str) -> Result<Option<Charge>, Error> {
        let row: Option<ChargeRow> = sqlx::query_as(&format!(
            "SELECT {CHARGE_COLUMNS} FROM charges WHERE id = ?1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| r.into_charge().map(|(c, _)| c)).transpose()
    }

    /// Every charge, oldest first, with the per-key call counts.
    pub(crate) async fn list(&self) -> Result<ChargeList, Error> {
        let rows: Vec<ChargeRow> = sqlx::query_as(&format!(
            "SELECT {CHARGE_COLUMNS} FROM charges ORDER BY rowid"
        ))
        .fetch_all(&self.pool)
        .await?;
        let charges = rows
            .into_iter()
            .map(|r| r.into_charge().map(|(c, _)| c))
            .collect::<Result<Vec<_>, _>>()?;
        let calls: Vec<(String, i64)> =
            sqlx::query_as("SELECT idempotency_key, calls FROM key_calls")
                .fetch_all(&self.pool)
                .await?;
        let calls_per_key: BTreeMap<String, u64> = calls
            .into_iter()
            .map(|(k, n)| (k, u64::try_from(n).unwrap_or(0)))
            .collect();
        Ok(ChargeList {
            count: charges.len() as u64,
            charges,
            calls_per_key,
        })
    }

    /// Checks the database answers, for `GET /health`.
    pub(crate) async fn ping(&self) -> Result<(), Error> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Closes the pool, checkpointing the WAL.
    pub(crate) async fn close(&self) {
        self.pool.close().await;
    }
}
