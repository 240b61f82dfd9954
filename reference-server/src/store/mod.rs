//! Key stores: where the state of every (caller, key) lives.
//!
//! [`KeyStore`] is the seam between the engine and a database. This crate
//! ships one implementation, [`Store`], which runs the *same SQL text* on two
//! drivers, SQLite ([`sqlite`]) and PostgreSQL ([`postgres`]). Both accept
//! `$1`-style placeholders and `INSERT ... ON CONFLICT ... RETURNING`, so only
//! the genuinely different parts (connecting, the write lock, the advisory
//! lock) are written twice. We chose two concrete sqlx drivers behind an enum
//! over `sqlx::Any` because `Any` erases the types the endpoints need
//! (transactions whose connection an endpoint can use directly) and hides the
//! one PostgreSQL feature the claim relies on.
//!
//! ## The table
//!
//! One row per (caller, key), primary key on the pair (clause
//! `idem.scope.caller`). Columns for multi-step requests exist from the
//! start: `recovery_point`, `locked_at`/`lease_expires_at` (the lease) and
//! `generation` (the fencing token), plus the request itself so a completer
//! can finish an abandoned request.
//!
//! ## Multi-step requests
//!
//! [`phases`] holds their statements. A phase commit is the same shape as
//! [`KeyStore::complete`]: an `UPDATE` of `recovery_point` and a fresh
//! `lease_expires_at`, guarded by `generation = $current`, committed with
//! the phase's writes; a refused guard is [`Error::Fenced`]. Taking over an
//! expired lease is a separate `UPDATE ... RETURNING` that works at any
//! recovery point, bumps the generation and keeps the point and the
//! original request, which is what lets a retry or the completer resume.
//!
//! ## Costs (the design target of clause `idem.claim.transactional`)
//!
//! - A replay is one primary-key read ([`KeyStore::lookup`]), no transaction.
//! - A first execution of a single-phase request is one read that misses plus
//!   one transaction: claim (`INSERT ... ON CONFLICT`), the endpoint's
//!   writes and the stored response commit together ([`KeyStore::claim`] then
//!   [`KeyStore::complete`]). The claim is *not* committed on its own, so a
//!   crash anywhere leaves no trace at all.
//! - Where it does not hold: a duplicate arriving while the original runs
//!   costs a read plus a short transaction that fails its advisory lock
//!   (PostgreSQL); a key reused after its window is a read plus the
//!   transaction; a `5xx` is a transaction rolled back; multi-step requests
//!   commit one transaction per phase by design (the first joins the
//!   claim's), plus one short transaction per takeover and per intent
//!   recorded before a foreign call.

pub mod phases;
pub mod postgres;
pub mod sqlite;

use std::future::Future;
#[cfg(feature = "flaws")]
use std::sync::Arc;

#[cfg(feature = "flaws")]
use tokio::sync::Semaphore;

use idem_spec::KeyState;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool, Row, SqliteConnection};

use crate::clock::Millis;
use crate::error::{Error, Result};

pub use sqlite::SqliteStore;

/// A transaction opened by the engine for one request, which the endpoint
/// joins through [`IdemTx`](crate::layer::IdemTx).
///
/// Use [`with_conn!`](crate::with_conn) to run SQL on it.
#[derive(Debug)]
pub enum DbTx {
    /// A SQLite write transaction (`BEGIN IMMEDIATE`) and this process's
    /// writer permit, released when the transaction ends.
    Sqlite(
        sqlx::Transaction<'static, sqlx::Sqlite>,
        tokio::sync::OwnedSemaphorePermit,
    ),
    /// A PostgreSQL transaction (READ COMMITTED).
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
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
            Self::Sqlite(tx, _) => DbConn::Sqlite(tx),
            Self::Postgres(tx) => DbConn::Postgres(tx),
        }
    }

    /// Commits the transaction (and releases SQLite's writer permit).
    pub async fn commit(self) -> Result<()> {
        match self {
            Self::Sqlite(tx, _permit) => tx.commit().await?,
            Self::Postgres(tx) => tx.commit().await?,
        }
        Ok(())
    }

    /// Rolls the transaction back (and releases SQLite's writer permit).
    pub async fn rollback(self) -> Result<()> {
        match self {
            Self::Sqlite(tx, _permit) => tx.rollback().await?,
            Self::Postgres(tx) => tx.rollback().await?,
        }
        Ok(())
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
/// # async fn demo(tx: &mut idem_server::store::DbTx) -> Result<u64, idem_server::Error> {
/// let moved = idem_server::with_conn!(tx, c => {
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
                let $p = &s.pool;
                $body
            }
            $crate::store::Store::Postgres($p) => $body,
        }
    };
}

/// One header of a stored response. Values that are not visible ASCII are
/// kept as hex so a replay is byte-for-byte even then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredHeader {
    /// Lower-case header name.
    pub name: String,
    /// The value (text, or hex digits when `hex` is true).
    pub value: String,
    /// Whether `value` is hex-encoded bytes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hex: bool,
}

impl StoredHeader {
    /// Builds a stored header from raw bytes.
    pub fn new(name: &str, value: &[u8]) -> Self {
        match std::str::from_utf8(value) {
            Ok(s)
                if s.bytes()
                    .all(|b| b == b' ' || b == b'\t' || (0x21..=0x7E).contains(&b)) =>
            {
                Self {
                    name: name.to_owned(),
                    value: s.to_owned(),
                    hex: false,
                }
            }
            _ => Self {
                name: name.to_owned(),
                value: hex::encode(value),
                hex: true,
            },
        }
    }

    /// The value's bytes.
    pub fn value_bytes(&self) -> Vec<u8> {
        if self.hex {
            hex::decode(&self.value).unwrap_or_default()
        } else {
            self.value.clone().into_bytes()
        }
    }
}

/// A final response as stored for replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// HTTP status.
    pub status: u16,
    /// The headers that are replayed (Content-Type, Location, ETag and the
    /// endpoint's declared ones).
    pub headers: Vec<StoredHeader>,
    /// The body, byte for byte.
    pub body: Vec<u8>,
}

/// What the store knows about one (caller, key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    /// Fingerprint of the request that claimed the key (hex).
    pub fingerprint: String,
    /// In flight or complete (an absent key has no record).
    pub state: KeyState,
    /// Last committed recovery point.
    pub recovery_point: String,
    /// Fencing generation.
    pub generation: i64,
    /// When the current lease ends (in-flight keys).
    pub lease_expires_at: Option<Millis>,
    /// When the key was (last) claimed.
    pub created_at: Millis,
    /// End of the replay window.
    pub replay_until: Millis,
    /// End of retention: the reaper deletes the record after this.
    pub expires_at: Millis,
    /// The stored response (complete keys).
    pub response: Option<StoredResponse>,
}

/// Everything the claim statement writes.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// The authenticated caller (scope, part one).
    pub caller: &'a str,
    /// The unquoted key (scope, part two).
    pub key: &'a str,
    /// Request fingerprint, hex.
    pub fingerprint: &'a str,
    /// Request method.
    pub method: &'a str,
    /// Request path with query.
    pub path: &'a str,
    /// Request `Content-Type`, if any.
    pub content_type: Option<&'a str>,
    /// Request body.
    pub body: &'a [u8],
    /// The clock's now.
    pub now: Millis,
    /// End of the lease taken by this claim.
    pub lease_expires_at: Millis,
    /// End of the replay window (measured from this first request).
    pub replay_until: Millis,
    /// End of retention.
    pub expires_at: Millis,
}

/// A successful claim: the open transaction and the fencing generation the
/// final commit must still match.
#[derive(Debug)]
pub struct Claimed<Tx> {
    /// The transaction holding the (uncommitted) claim.
    pub tx: Tx,
    /// The generation this claim holds.
    pub generation: i64,
}

/// Result of trying to claim a key.
#[derive(Debug)]
pub enum ClaimOutcome<Tx> {
    /// This request owns the key; execute it inside the transaction.
    Claimed(Claimed<Tx>),
    /// Another transaction is executing this key right now (in flight).
    Busy,
    /// A committed record exists that may not be claimed (complete and
    /// inside its window, or in flight with a live lease): read it again.
    Taken,
}

/// What one reaper pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Records deleted.
    pub deleted: u64,
    /// (caller, key, recovery point) of records deleted while still in
    /// flight: requests nobody finished, logged for a human.
    pub unfinished: Vec<(String, String, String)>,
}

/// The operations the engine needs from a database.
///
/// An implementation must make [`claim`](KeyStore::claim) a single atomic
/// operation the database arbitrates (clause `idem.claim.atomic`): a unique
/// constraint on (caller, key) and an insert that either creates the row or
/// does nothing. Reading first and inserting when nothing was found is the
/// classic race that lets two duplicates both execute.
pub trait KeyStore: Clone + Send + Sync + 'static {
    /// The transaction type endpoints join.
    type Tx: Send + 'static;

    /// Reads the record of (caller, key), outside any transaction: the whole
    /// cost of a replay.
    fn lookup(
        &self,
        caller: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<KeyRecord>>> + Send;

    /// Opens a transaction and claims the key in it, atomically. The claim
    /// succeeds when the key is absent, past its replay window, or in flight
    /// at `started` with an expired lease; it bumps the fencing generation.
    fn claim(
        &self,
        req: &ClaimRequest<'_>,
    ) -> impl Future<Output = Result<ClaimOutcome<Self::Tx>>> + Send;

    /// Stores the final response on the claimed record, if `generation` is
    /// still current, and commits everything the transaction holds.
    /// Returns [`Error::Fenced`] (after rolling back) when it is not.
    fn complete(
        &self,
        tx: Self::Tx,
        caller: &str,
        key: &str,
        generation: i64,
        response: &StoredResponse,
        now: Millis,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Rolls back: the claim and every write of the request disappear, and
    /// the key is absent again.
    fn abandon(&self, tx: Self::Tx) -> impl Future<Output = Result<()>> + Send;

    /// Deletes records past retention.
    fn reap(&self, now: Millis) -> impl Future<Output = Result<ReapReport>> + Send;

    /// Opens a write transaction that claims nothing. Only the `flaws`
    /// build uses it, to imitate servers that execute without a claim.
    #[cfg(feature = "flaws")]
    fn begin_unclaimed(&self) -> impl Future<Output = Result<Self::Tx>> + Send;

    /// Commits a transaction opened by
    /// [`begin_unclaimed`](KeyStore::begin_unclaimed). Only the `flaws`
    /// build uses it.
    #[cfg(feature = "flaws")]
    fn commit_unclaimed(&self, tx: Self::Tx) -> impl Future<Output = Result<()>> + Send;

    /// Inserts or overwrites a complete record and commits: the naive
    /// "store the response at the end" of a check-then-insert server. Only
    /// the `flaws` build uses it.
    #[cfg(feature = "flaws")]
    fn overwrite_complete(
        &self,
        tx: Self::Tx,
        req: &ClaimRequest<'_>,
        response: &StoredResponse,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// The shipped store: SQLite or PostgreSQL.
#[derive(Debug, Clone)]
pub enum Store {
    /// The embedded default.
    Sqlite(SqliteStore),
    /// For several processes on one database.
    Postgres(PgPool),
}

pub(crate) const LOOKUP_SQL: &str = "SELECT fingerprint, state, recovery_point, generation, lease_expires_at, \
     created_at, replay_until, expires_at, response_status, response_headers, response_body \
     FROM idempotency_keys WHERE caller = $1 AND idem_key = $2";

// ANCHOR: claim
/// The claim: one statement, arbitrated by the primary key on
/// (caller, idem_key). A fresh key is inserted; an existing row is taken over
/// only when it is complete and its replay window is over (a brand-new
/// request, clause `idem.window.expiry`) or when it is in flight at `started`
/// with an expired lease (its owner died before doing anything durable). A
/// row in flight past `started` holds committed progress and is never
/// replaced, whatever its window (clause `idem.window.progress`): it is taken
/// over and resumed instead. In every other case the `WHERE` is false,
/// nothing changes and `RETURNING` yields no row.
const CLAIM_SQL: &str = "INSERT INTO idempotency_keys (caller, idem_key, fingerprint, state, \
     recovery_point, generation, locked_at, lease_expires_at, created_at, replay_until, expires_at, \
     request_method, request_path, request_content_type, request_body) \
     VALUES ($1, $2, $3, 'in_flight', 'started', 1, $4, $5, $4, $6, $7, $8, $9, $10, $11) \
     ON CONFLICT (caller, idem_key) DO UPDATE SET \
       fingerprint = excluded.fingerprint, state = 'in_flight', recovery_point = 'started', \
       generation = idempotency_keys.generation + 1, locked_at = excluded.locked_at, \
       lease_expires_at = excluded.lease_expires_at, created_at = excluded.created_at, \
       replay_until = excluded.replay_until, expires_at = excluded.expires_at, completed_at = NULL, \
       request_method = excluded.request_method, request_path = excluded.request_path, \
       request_content_type = excluded.request_content_type, request_body = excluded.request_body, \
       response_status = NULL, response_headers = NULL, response_body = NULL \
     WHERE (idempotency_keys.state = 'complete' AND idempotency_keys.replay_until <= excluded.created_at) \
        OR (idempotency_keys.state = 'in_flight' AND idempotency_keys.recovery_point = 'started' \
            AND idempotency_keys.lease_expires_at <= excluded.created_at) \
     RETURNING generation";
// ANCHOR_END: claim

/// Completion is fenced: it only touches the row if this request's
/// generation is still the current one (clause `idem.lease.fencing`). A key
/// finished after its replay window (resumed under `idem.window.progress`)
/// is replayed until its retention ends, so that the finished request is
/// never re-executed by the next retry.
pub(crate) const COMPLETE_SQL: &str = "UPDATE idempotency_keys SET state = 'complete', \
     recovery_point = 'finished', completed_at = $1, locked_at = NULL, lease_expires_at = NULL, \
     replay_until = CASE WHEN replay_until <= $1 THEN expires_at ELSE replay_until END, \
     response_status = $2, response_headers = $3, response_body = $4 \
     WHERE caller = $5 AND idem_key = $6 AND generation = $7 AND state = 'in_flight'";

const UNFINISHED_SQL: &str = "SELECT caller, idem_key, recovery_point FROM idempotency_keys \
     WHERE expires_at <= $1 AND state = 'in_flight'";
const REAP_SQL: &str = "DELETE FROM idempotency_keys WHERE expires_at <= $1";

#[cfg(feature = "flaws")]
const OVERWRITE_SQL: &str = "INSERT INTO idempotency_keys (caller, idem_key, fingerprint, state, \
     recovery_point, generation, created_at, replay_until, expires_at, completed_at, \
     request_method, request_path, request_content_type, request_body, \
     response_status, response_headers, response_body) \
     VALUES ($1, $2, $3, 'complete', 'finished', 1, $4, $5, $6, $4, $7, $8, $9, $10, $11, $12, $13) \
     ON CONFLICT (caller, idem_key) DO UPDATE SET fingerprint = excluded.fingerprint, \
       state = 'complete', created_at = excluded.created_at, replay_until = excluded.replay_until, \
       expires_at = excluded.expires_at, completed_at = excluded.completed_at, \
       response_status = excluded.response_status, response_headers = excluded.response_headers, \
       response_body = excluded.response_body";

impl Store {
    /// Connects to `database_url` and migrates: `sqlite://PATH` (created if
    /// missing), `sqlite::memory:`, or `postgres://...`.
    pub async fn connect(database_url: &str, max_connections: u32) -> Result<Self> {
        if database_url.starts_with("postgres://") || database_url.starts_with("postgresql://") {
            Ok(Self::Postgres(
                postgres::connect(database_url, max_connections).await?,
            ))
        } else if database_url.starts_with("sqlite:") {
            Ok(Self::Sqlite(
                SqliteStore::connect(database_url, max_connections).await?,
            ))
        } else {
            Err(Error::Config(format!(
                "unsupported database URL {database_url:?}: use sqlite://PATH or postgres://..."
            )))
        }
    }

    /// "sqlite" or "postgres".
    pub fn backend(&self) -> &'static str {
        match self {
            Self::Sqlite(_) => "sqlite",
            Self::Postgres(_) => "postgres",
        }
    }

    /// Opens a write transaction (see the module docs of [`sqlite`] for why
    /// SQLite uses `BEGIN IMMEDIATE` behind an in-process gate).
    pub async fn begin(&self) -> Result<DbTx> {
        match self {
            Self::Sqlite(s) => {
                let permit = s
                    .writer
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| Error::Internal("SQLite writer gate closed".into()))?;
                let tx = s.pool.begin_with("BEGIN IMMEDIATE").await?;
                Ok(DbTx::Sqlite(tx, permit))
            }
            Self::Postgres(pool) => Ok(DbTx::Postgres(pool.begin().await?)),
        }
    }

    /// Closes the pool (waits for connections to be returned).
    pub async fn close(&self) {
        match self {
            Self::Sqlite(s) => s.pool.close().await,
            Self::Postgres(p) => p.close().await,
        }
    }
}

pub(crate) fn decode_record<R>(row: &R) -> Result<KeyRecord>
where
    R: Row,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> i64: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> Vec<u8>: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    let state: String = row.try_get("state")?;
    let state = match state.as_str() {
        "complete" => KeyState::Complete,
        "in_flight" => KeyState::InFlight,
        other => {
            return Err(Error::Internal(format!(
                "unknown key state {other:?} in store"
            )));
        }
    };
    let status: Option<i64> = row.try_get("response_status")?;
    let headers: Option<String> = row.try_get("response_headers")?;
    let body: Option<Vec<u8>> = row.try_get("response_body")?;
    let response = match (state, status) {
        (KeyState::Complete, Some(status)) => Some(StoredResponse {
            status: u16::try_from(status)
                .map_err(|_| Error::Internal(format!("stored status {status} out of range")))?,
            headers: match headers {
                Some(h) => serde_json::from_str(&h)
                    .map_err(|e| Error::Internal(format!("stored headers unreadable: {e}")))?,
                None => Vec::new(),
            },
            body: body.unwrap_or_default(),
        }),
        _ => None,
    };
    Ok(KeyRecord {
        fingerprint: row.try_get("fingerprint")?,
        state,
        recovery_point: row.try_get("recovery_point")?,
        generation: row.try_get("generation")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        created_at: row.try_get("created_at")?,
        replay_until: row.try_get("replay_until")?,
        expires_at: row.try_get("expires_at")?,
        response,
    })
}

pub(crate) fn headers_json(response: &StoredResponse) -> Result<String> {
    serde_json::to_string(&response.headers)
        .map_err(|e| Error::Internal(format!("cannot serialise headers: {e}")))
}

impl KeyStore for Store {
    type Tx = DbTx;

    async fn lookup(&self, caller: &str, key: &str) -> Result<Option<KeyRecord>> {
        with_pool!(self, p => {
            let row = sqlx::query(LOOKUP_SQL)
                .bind(caller)
                .bind(key)
                .fetch_optional(p)
                .await?;
            row.as_ref().map(decode_record).transpose()
        })
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome<DbTx>> {
        let mut tx = self.begin().await?;
        let locked = match tx.conn() {
            DbConn::Sqlite(_) => true,
            DbConn::Postgres(c) => {
                // A transaction-scoped advisory lock on (schema, caller, key).
                // Without it, a duplicate's INSERT would *block* on the original's
                // uncommitted row until that transaction ends; with it, the
                // duplicate learns at once that the key is in flight and can
                // answer 409 (or wait on its own terms). The lock is released by
                // commit or rollback, so it can never outlive the claim. A hash
                // collision between two keys only costs a spurious, retryable
                // 409; the unique constraint still arbitrates the claim.
                let locked: bool = sqlx::query_scalar(
                    "SELECT pg_try_advisory_xact_lock(hashtextextended(\
                 current_schema() || chr(31) || $1 || chr(31) || $2, 0))",
                )
                .bind(req.caller)
                .bind(req.key)
                .fetch_one(&mut *c)
                .await?;
                locked
            }
        };
        if !locked {
            tx.rollback().await?;
            return Ok(ClaimOutcome::Busy);
        }
        let generation: Option<i64> = with_conn!(&mut tx, c => {
            sqlx::query_scalar(CLAIM_SQL)
                .bind(req.caller)
                .bind(req.key)
                .bind(req.fingerprint)
                .bind(req.now)
                .bind(req.lease_expires_at)
                .bind(req.replay_until)
                .bind(req.expires_at)
                .bind(req.method)
                .bind(req.path)
                .bind(req.content_type)
                .bind(req.body)
                .fetch_optional(&mut *c)
                .await?
        });
        match generation {
            Some(generation) => Ok(ClaimOutcome::Claimed(Claimed { tx, generation })),
            None => {
                tx.rollback().await?;
                Ok(ClaimOutcome::Taken)
            }
        }
    }

    async fn complete(
        &self,
        mut tx: DbTx,
        caller: &str,
        key: &str,
        generation: i64,
        response: &StoredResponse,
        now: Millis,
    ) -> Result<()> {
        // The same fenced write a multi-step request's last phase makes; the
        // single-phase path only adds the commit.
        match self
            .store_final(&mut tx, caller, key, generation, response, now)
            .await
        {
            Ok(()) => tx.commit().await,
            Err(Error::Fenced) => {
                tx.rollback().await?;
                Err(Error::Fenced)
            }
            Err(e) => Err(e),
        }
    }

    async fn abandon(&self, tx: DbTx) -> Result<()> {
        tx.rollback().await
    }

    async fn reap(&self, now: Millis) -> Result<ReapReport> {
        let mut tx = self.begin().await?;
        let (unfinished, deleted) = with_conn!(&mut tx, c => {
            let rows = sqlx::query(UNFINISHED_SQL).bind(now).fetch_all(&mut *c).await?;
            let mut unfinished = Vec::with_capacity(rows.len());
            for r in &rows {
                unfinished.push((
                    r.try_get::<String, _>("caller")?,
                    r.try_get::<String, _>("idem_key")?,
                    r.try_get::<String, _>("recovery_point")?,
                ));
            }
            let deleted = sqlx::query(REAP_SQL).bind(now).execute(&mut *c).await?.rows_affected();
            (unfinished, deleted)
        });
        tx.commit().await?;
        Ok(ReapReport {
            deleted,
            unfinished,
        })
    }

    #[cfg(feature = "flaws")]
    async fn begin_unclaimed(&self) -> Result<DbTx> {
        // FLAW support: a naive server opens a plain transaction with no
        // claim and no writer gate; SQLite gets a deferred BEGIN whose first
        // write waits in the busy handler.
        match self {
            Self::Sqlite(s) => {
                let permit = Arc::new(Semaphore::new(1))
                    .acquire_owned()
                    .await
                    .map_err(|_| Error::Internal("semaphore closed".into()))?;
                Ok(DbTx::Sqlite(s.pool.begin().await?, permit))
            }
            Self::Postgres(pool) => Ok(DbTx::Postgres(pool.begin().await?)),
        }
    }

    #[cfg(feature = "flaws")]
    async fn commit_unclaimed(&self, tx: DbTx) -> Result<()> {
        tx.commit().await
    }

    #[cfg(feature = "flaws")]
    async fn overwrite_complete(
        &self,
        mut tx: DbTx,
        req: &ClaimRequest<'_>,
        response: &StoredResponse,
    ) -> Result<()> {
        let headers = headers_json(response)?;
        with_conn!(&mut tx, c => {
            sqlx::query(OVERWRITE_SQL)
                .bind(req.caller)
                .bind(req.key)
                .bind(req.fingerprint)
                .bind(req.now)
                .bind(req.replay_until)
                .bind(req.expires_at)
                .bind(req.method)
                .bind(req.path)
                .bind(req.content_type)
                .bind(req.body)
                .bind(i64::from(response.status))
                .bind(&headers)
                .bind(&response.body)
                .execute(&mut *c)
                .await?;
        });
        tx.commit().await
    }
}
