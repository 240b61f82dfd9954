//! MySQL and MariaDB: the store for many server processes sharing one
//! InnoDB database, on the application's `MySqlPool` (MySQL 8.0+, MariaDB
//! 10.6+; behind the `mysql` cargo feature).
//!
//! ## The claim: the primary key, a row lock, and nothing else
//!
//! MySQL has no transaction-scoped advisory lock. `GET_LOCK` belongs to the
//! *connection*, not the transaction, so a lock taken by a request that
//! failed halfway leaks to whichever request gets that pooled connection
//! next; on Galera it is local to one node, so it excludes nothing across
//! nodes. So the claim is the unique (caller,
//! key) primary key, as the contract ranks first (clause
//! `idem.claim.atomic`):
//!
//! 1. **Observe**: one plain read of the record, outside any transaction (a
//!    replay is answered after it). Unless the record is replayable, a
//!    `SELECT ... FOR UPDATE NOWAIT` on the same row, in autocommit: it
//!    fails at once when another transaction holds the row (its claim is
//!    an uncommitted insert), which is how a duplicate learns the key is in
//!    flight without waiting, and it locks nothing once it returns.
//! 2. **Claim** ([`KeyStore::begin_single`], [`KeyStore::claim`]): `BEGIN`,
//!    then a plain `INSERT` of the in-flight row. The insert holds the new
//!    row's lock until the transaction ends, so the claim, the endpoint's
//!    writes and the final record commit together, and a crash, a rollback
//!    or a dropped connection leaves no trace (as on PostgreSQL). A
//!    duplicate-key error (1062) means a committed row exists: the
//!    transaction is rolled back at once (dropping the shared lock the
//!    failed insert took) and a fresh one replaces that row with one
//!    conditional `UPDATE` when it may be replaced (window over, or in
//!    flight at `started` with an expired lease), else the key is taken
//!    and the engine observes it again.
//! 3. **Record**: a fenced `UPDATE` of the request's own row to complete,
//!    in the same transaction, then `COMMIT`.
//!
//! ## The traps this avoids
//!
//! - `SELECT ... FOR UPDATE` on a *missing* row under REPEATABLE READ takes
//!   a gap lock; two sessions both pass it and then deadlock on their
//!   inserts (error 1213). This store never runs a locking read inside a
//!   transaction before its insert, and its connections run READ COMMITTED
//!   (set on every connection of the pool, see [`MySqlStore::connect`]),
//!   where searches take no gap locks at all.
//! - `INSERT ... ON DUPLICATE KEY UPDATE` cannot tell the winner from the
//!   loser: sqlx turns on `CLIENT_FOUND_ROWS`, so its row count is 1 for an
//!   insert and for a matched-but-unchanged row alike. Plain `INSERT` and
//!   plain `UPDATE ... WHERE` are used instead, where "rows matched" is
//!   exactly what the claim needs.
//! - Lock waits end in 1205 after `innodb_lock_wait_timeout`, set to 1 s on
//!   every connection (the server default is 50 s). A claim that times out,
//!   or is chosen as a deadlock victim (1213, also how Galera reports a
//!   certification conflict), was waiting for another request's claim on
//!   the same key: it is answered in flight (409, or `Prefer: wait`), never
//!   a 500. The transaction holding the key waits on no other key row, so
//!   it is never the victim of a cycle through the key table.
//! - A commit that fails with a deadlock or certification conflict
//!   ([`Error::Conflict`]) lost to a concurrent
//!   request on another node: everything it wrote is rolled back, and the
//!   engine observes again and replays the winner.
//!
//! ## Galera (MariaDB Cluster)
//!
//! Row locks are local to a node; across nodes a transaction's writes are
//! certified at commit. Two nodes can therefore both claim one key and run
//! the endpoint, and exactly one commit certifies: the other fails with 1213,
//! its business writes rolled back with its claim. On a Galera node the
//! store also sets `wsrep_sync_wait = 1`, so the loser's next read sees the
//! winner's committed record and replays it. What that costs, and what a
//! multi-step request does there, is in the book ("When you outgrow one
//! database").

use std::str::FromStr;
use std::time::Duration;

use idem_spec::Fingerprint;
use sqlx::mysql::{MySqlConnectOptions, MySqlDatabaseError, MySqlPoolOptions};
use sqlx::{Connection, MySql, MySqlConnection, MySqlPool, Row, Transaction};

use super::StoreOptions;
use super::ops::{StagedJob, decode_record, fingerprint, headers_json, point};
use super::{
    AbandonedKey, ClaimOutcome, ClaimRequest, Claimed, FencedWrite, KeyRecord, KeyStore, Observed,
    ReapBatch, SingleTx, StagedJobs, StoredRequest, StoredResponse, TakenOver, Unfinished,
};
use crate::clock::Millis;
use crate::error::{Error, Result};
use crate::key::{Fence, KeyId};
use crate::metrics::Stage;

/// A [`KeyStore`] on a `MySqlPool`. Its transactions are [`MySqlTx`]: run
/// queries on `&mut **tx` through an [`IdemTx`](crate::IdemTx) guard.
#[derive(Debug, Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
}

/// A MySQL write transaction (READ COMMITTED). Derefs to the connection.
/// When it holds a single-phase claim it knows its generation, so the final
/// record is a fenced update of the row the claim inserted.
#[derive(Debug)]
pub struct MySqlTx {
    tx: Transaction<'static, MySql>,
    claim: Option<i64>,
}

impl MySqlTx {
    /// Wraps a transaction the application opened itself.
    pub fn from_transaction(tx: Transaction<'static, MySql>) -> Self {
        Self { tx, claim: None }
    }

    /// Commits. A deadlock or certification conflict at commit (Galera) is
    /// [`Error::Conflict`]: another transaction won and this one's writes
    /// are gone.
    pub async fn commit(self) -> Result<()> {
        self.tx.commit().await.map_err(conflict_or_store)
    }

    /// Rolls back.
    pub async fn rollback(self) -> Result<()> {
        Ok(self.tx.rollback().await?)
    }
}

impl std::ops::Deref for MySqlTx {
    type Target = MySqlConnection;
    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl std::ops::DerefMut for MySqlTx {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

/// MySQL error numbers this store acts on.
mod code {
    /// ER_DUP_ENTRY: the primary key already holds the row.
    pub(super) const DUPLICATE: u16 = 1062;
    /// ER_LOCK_WAIT_TIMEOUT (also MariaDB's answer to `NOWAIT`).
    pub(super) const LOCK_WAIT_TIMEOUT: u16 = 1205;
    /// ER_LOCK_DEADLOCK (also a Galera certification conflict).
    pub(super) const DEADLOCK: u16 = 1213;
    /// ER_LOCK_NOWAIT (MySQL 8's answer to `NOWAIT`).
    pub(super) const LOCK_NOWAIT: u16 = 3572;
}

/// The MySQL error number of `e`, if it is a MySQL server error.
pub(crate) fn number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number),
        _ => None,
    }
}

/// Whether `e` says another transaction holds the row (a lock wait that
/// timed out, a `NOWAIT` refused, a deadlock victim).
fn lock_conflict(e: &sqlx::Error) -> bool {
    matches!(
        number(e),
        Some(code::LOCK_WAIT_TIMEOUT | code::LOCK_NOWAIT | code::DEADLOCK)
    )
}

fn conflict_or_store(e: sqlx::Error) -> Error {
    if number(&e) == Some(code::DEADLOCK) {
        crate::metrics::store_error(&e);
        Error::Conflict
    } else {
        e.into()
    }
}

// Text columns are read through CONVERT: their binary collations (keys
// compare byte for byte) make the driver report them as VARBINARY, which
// does not decode as a Rust String. Comparisons still use the columns'
// own collation.
const LOOKUP_SQL: &str = "SELECT CONVERT(fingerprint USING utf8mb4) AS fingerprint, \
     CONVERT(state USING utf8mb4) AS state, CONVERT(recovery_point USING utf8mb4) AS recovery_point, \
     generation, lease_expires_at, created_at, replay_until, expires_at, response_status, \
     CONVERT(response_headers USING utf8mb4) AS response_headers, \
     response_body FROM idempotency_keys WHERE caller = ? AND idem_key = ?";

/// The in-flight probe: in autocommit, so it holds nothing once it returns.
/// Under READ COMMITTED a search takes no gap lock, so a missing row locks
/// nothing even for that instant.
const PROBE_SQL: &str =
    "SELECT 1 FROM idempotency_keys WHERE caller = ? AND idem_key = ? FOR UPDATE NOWAIT";

// ANCHOR: mysql_claim
/// The claim of a fresh key: a plain insert, arbitrated by the primary key.
/// Its row stays locked (uncommitted) until the claim's transaction ends.
const INSERT_CLAIM_SQL: &str = "INSERT INTO idempotency_keys (caller, idem_key, fingerprint, \
     state, recovery_point, generation, locked_at, lease_expires_at, created_at, replay_until, \
     expires_at, request_method, request_path, request_content_type, request_body) \
     VALUES (?, ?, ?, 'in_flight', 'started', 1, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

/// The claim of a key whose committed row may be replaced (its window is
/// over, or it is in flight at `started` with an expired lease): one
/// conditional update; "rows matched" says whether it claimed.
const REPLACE_CLAIM_SQL: &str = "UPDATE idempotency_keys SET fingerprint = ?, \
     state = 'in_flight', recovery_point = 'started', generation = generation + 1, \
     locked_at = ?, lease_expires_at = ?, created_at = ?, replay_until = ?, expires_at = ?, \
     completed_at = NULL, request_method = ?, request_path = ?, request_content_type = ?, \
     request_body = ?, response_status = NULL, response_headers = NULL, response_body = NULL \
     WHERE caller = ? AND idem_key = ? \
       AND ((state = 'complete' AND replay_until <= ?) \
         OR (state = 'in_flight' AND recovery_point = 'started' AND lease_expires_at <= ?))";
// ANCHOR_END: mysql_claim

/// A complete record written in one statement, for a transaction that holds
/// no claim (one the application opened itself).
const INSERT_FINAL_SQL: &str = "INSERT INTO idempotency_keys (caller, idem_key, fingerprint, \
     state, recovery_point, generation, locked_at, lease_expires_at, created_at, replay_until, \
     expires_at, completed_at, request_method, request_path, request_content_type, request_body, \
     response_status, response_headers, response_body) \
     VALUES (?, ?, ?, 'complete', 'finished', 1, NULL, NULL, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

const GENERATION_SQL: &str =
    "SELECT generation FROM idempotency_keys WHERE caller = ? AND idem_key = ?";

/// The final write, fenced (clause `idem.lease.fencing`). MySQL evaluates
/// `SET` left to right, so `replay_until` is computed before anything it
/// reads changes. A request finished after its replay window is replayed
/// until its retention ends, as on the other stores.
const COMPLETE_SQL: &str = "UPDATE idempotency_keys SET \
     replay_until = CASE WHEN replay_until <= ? THEN expires_at ELSE replay_until END, \
     state = 'complete', recovery_point = 'finished', completed_at = ?, locked_at = NULL, \
     lease_expires_at = NULL, response_status = ?, response_headers = ?, response_body = ? \
     WHERE caller = ? AND idem_key = ? AND generation = ? AND state = 'in_flight'";

const TAKE_OVER_SQL: &str = "UPDATE idempotency_keys SET generation = generation + 1, \
     locked_at = ?, lease_expires_at = ? \
     WHERE caller = ? AND idem_key = ? AND fingerprint = ? AND state = 'in_flight' \
       AND lease_expires_at <= ? AND expires_at > ?";

const TAKEN_SQL: &str = "SELECT generation, CONVERT(recovery_point USING utf8mb4) AS recovery_point, \
     created_at FROM idempotency_keys \
     WHERE caller = ? AND idem_key = ?";

const COMMIT_POINT_SQL: &str = "UPDATE idempotency_keys SET recovery_point = ?, \
     locked_at = ?, lease_expires_at = ? \
     WHERE caller = ? AND idem_key = ? AND generation = ? AND state = 'in_flight'";

const RENEW_SQL: &str = "UPDATE idempotency_keys SET locked_at = ?, lease_expires_at = ? \
     WHERE caller = ? AND idem_key = ? AND generation = ? AND state = 'in_flight' \
     AND locked_at IS NOT NULL";

const RELEASE_SQL: &str = "UPDATE idempotency_keys SET locked_at = NULL, lease_expires_at = ? \
     WHERE caller = ? AND idem_key = ? AND generation = ? AND state = 'in_flight'";

const ABANDONED_SQL: &str = "SELECT CONVERT(caller USING utf8mb4) AS caller, \
     CONVERT(idem_key USING utf8mb4) AS idem_key, CONVERT(fingerprint USING utf8mb4) AS fingerprint, \
     CONVERT(recovery_point USING utf8mb4) AS recovery_point, \
     CONVERT(request_method USING utf8mb4) AS request_method, \
     CONVERT(request_path USING utf8mb4) AS request_path, \
     CONVERT(request_content_type USING utf8mb4) AS request_content_type, \
     request_body FROM idempotency_keys \
     WHERE state = 'in_flight' AND recovery_point <> 'started' AND lease_expires_at <= ? \
       AND expires_at > ? \
     ORDER BY lease_expires_at LIMIT ?";

const ORPHANS_SQL: &str = "SELECT COUNT(*), MIN(lease_expires_at) FROM idempotency_keys \
     WHERE state = 'in_flight' AND recovery_point <> 'started' AND lease_expires_at <= ? \
       AND expires_at > ?";

const OLDEST_EXPIRED_SQL: &str =
    "SELECT MIN(expires_at) FROM idempotency_keys WHERE expires_at <= ?";

/// One reaper batch, selected and locked first (MySQL has no `DELETE ...
/// RETURNING`). `SKIP LOCKED`: a row some request holds right now is left
/// for the next pass instead of making the reaper wait.
const REAP_SELECT_SQL: &str = "SELECT CONVERT(caller USING utf8mb4) AS caller, \
     CONVERT(idem_key USING utf8mb4) AS idem_key, CONVERT(state USING utf8mb4) AS state, \
     CONVERT(recovery_point USING utf8mb4) AS recovery_point \
     FROM idempotency_keys WHERE expires_at <= ? ORDER BY expires_at LIMIT ? \
     FOR UPDATE SKIP LOCKED";

const STAGE_SQL: &str = "INSERT INTO staged_jobs (kind, payload, created_at) VALUES (?, ?, ?)";
const STAGED_SQL: &str = "SELECT id, CONVERT(kind USING utf8mb4) AS kind, \
     CONVERT(payload USING utf8mb4) AS payload FROM staged_jobs ORDER BY id LIMIT ?";
const DELETE_JOB_SQL: &str = "DELETE FROM staged_jobs WHERE id = ?";

/// What one claim attempt came to.
enum Attempt {
    Won(MySqlTx),
    /// A committed row exists (maybe replaceable).
    Exists,
    Busy,
    Taken,
}

impl MySqlStore {
    /// A store on `pool`, whose database must have the key table
    /// ([`MySqlStore::migrate`]). Build the pool with
    /// [`MySqlStore::pool_options`] (or [`MySqlStore::connect`]): its
    /// connections must run READ COMMITTED with a short lock wait.
    pub fn new(pool: MySqlPool) -> Self {
        Self { pool }
    }

    /// The pool (for the application's own reads and writes).
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// Opens a pool on `url` (`mysql://user:password@host:port/database`)
    /// with [`MySqlStore::pool_options`], sized `options.max_connections`,
    /// and `options.statement_timeout` as each connection's statement
    /// bound (MariaDB `max_statement_time`; MySQL `max_execution_time`,
    /// which bounds reads only). It does not migrate: call
    /// [`MySqlStore::migrate`].
    pub async fn connect(url: &str, options: &StoreOptions) -> Result<Self> {
        options.check_not_sqlite_only("MySQL")?;
        let connect = MySqlConnectOptions::from_str(url)?;
        let statement_ms = u64::try_from(options.statement_timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let pool = Self::pool_options(options.acquire_timeout)
            .max_connections(options.max_connections.max(1))
            .after_connect(move |conn, _meta| Box::pin(session(conn, statement_ms)))
            .connect_with(connect)
            .await?;
        Ok(Self::new(pool))
    }

    /// The pool settings this library is tested with (the same hooks as the
    /// other stores: bounded acquire, idle connections pinged, a connection
    /// left inside a transaction retired). [`MySqlStore::connect`] adds the
    /// per-connection session settings; if you build the pool yourself, run
    /// [`MySqlStore::SESSION_SQL`] in your `after_connect`.
    pub fn pool_options(acquire_timeout: Duration) -> MySqlPoolOptions {
        MySqlPoolOptions::new()
            .acquire_timeout(acquire_timeout)
            .test_before_acquire(false)
            .after_release(super::retire_if_in_transaction)
            .before_acquire(super::usable)
    }

    /// The session settings every connection of the store needs: READ
    /// COMMITTED (no gap locks on searches), a 1 s lock wait (a claim
    /// waiting for another request's claim is answered in flight after it,
    /// not after the server's default 50 s), strict SQL mode (a value that
    /// does not fit is an error, never silently truncated into another
    /// key).
    pub const SESSION_SQL: [&'static str; 3] = [
        "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        "SET SESSION innodb_lock_wait_timeout = 1",
        "SET SESSION sql_mode = CONCAT(@@sql_mode, ',STRICT_ALL_TABLES')",
    ];

    /// One connection and `SELECT 1` (a readiness probe).
    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&mut *self.pool.acquire().await?)
            .await?;
        Ok(())
    }

    /// Creates or updates the key table (and the staged-jobs table), then
    /// checks that the claim excludes ([`MySqlStore::verify_claim`]). Safe to
    /// run at every start, from several processes at once. See
    /// [`crate::migrate`].
    pub async fn migrate(&self) -> Result<()> {
        crate::migrate::mysql(&self.pool).await?;
        self.verify_claim().await
    }

    /// The start-up check that this server's row locks exclude (clause
    /// `idem.claim.atomic`): one connection inserts a probe row and holds it
    /// uncommitted; a second connection's `NOWAIT` probe of that row must
    /// be refused. An engine where it is not (a MySQL-compatible engine
    /// without InnoDB's row locks) would let a duplicate through unseen, so
    /// the store refuses to start: [`Error::ClaimUnsafe`]. The probe row is
    /// rolled back; nothing stays behind.
    pub async fn verify_claim(&self) -> Result<()> {
        let probe = super::probe_id()?;
        let mut holder = self.pool.begin().await?;
        sqlx::query(INSERT_CLAIM_SQL)
            .bind(probe.caller().as_str())
            .bind(probe.key().as_str())
            .bind("0".repeat(64))
            .bind(0_i64)
            .bind(0_i64)
            .bind(0_i64)
            .bind(0_i64)
            .bind(0_i64)
            .bind("POST")
            .bind("/")
            .bind(None::<String>)
            .bind(None::<Vec<u8>>)
            .execute(&mut *holder)
            .await?;
        // A connection of its own, not the pool's: a pool of one must pass too.
        let mut other = MySqlConnection::connect_with(&self.pool.connect_options()).await?;
        for sql in Self::SESSION_SQL {
            sqlx::query(sql).execute(&mut other).await?;
        }
        let refused = match sqlx::query(PROBE_SQL)
            .bind(probe.caller().as_str())
            .bind(probe.key().as_str())
            .fetch_optional(&mut other)
            .await
        {
            Ok(_) => false,
            Err(e) if lock_conflict(&e) => true,
            Err(e) => return Err(e.into()),
        };
        let _ = other.close().await;
        holder.rollback().await?;
        if refused {
            Ok(())
        } else {
            Err(Error::ClaimUnsafe(
                "MySQL: a second connection read a row another transaction holds uncommitted \
                 with FOR UPDATE NOWAIT; this engine's row locks do not exclude, so duplicates \
                 could execute twice"
                    .into(),
            ))
        }
    }

    async fn begin_tx(&self) -> Result<Transaction<'static, MySql>> {
        Ok(self.pool.begin().await?)
    }

    /// One claim attempt in a fresh transaction: the insert of a fresh key,
    /// or (`replace`) the conditional update of a replaceable row.
    async fn attempt(&self, req: &ClaimRequest<'_>, replace: bool) -> Result<Attempt> {
        let mut tx = self.begin_tx().await?;
        let outcome = if replace {
            replace_claim(&mut tx, req).await
        } else {
            insert_claim(&mut tx, req).await.map(|()| Some(1))
        };
        match outcome {
            Ok(Some(generation)) => Ok(Attempt::Won(MySqlTx {
                tx,
                claim: Some(generation),
            })),
            Ok(None) => {
                tx.rollback().await?;
                Ok(Attempt::Taken)
            }
            Err(e) => {
                // After a deadlock the server has rolled back already; the
                // rollback here also drops the shared lock a duplicate-key
                // error takes, so it is never held across another statement.
                let _ = tx.rollback().await;
                if lock_conflict(&e) {
                    Ok(Attempt::Busy)
                } else if number(&e) == Some(code::DUPLICATE) && !replace {
                    Ok(Attempt::Exists)
                } else {
                    Err(e.into())
                }
            }
        }
    }

    /// The whole claim: insert, or replace an existing row if it may be.
    async fn claim_key(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome<MySqlTx>> {
        let attempt = match self.attempt(req, false).await? {
            Attempt::Exists => self.attempt(req, true).await?,
            other => other,
        };
        Ok(match attempt {
            Attempt::Won(tx) => {
                let generation = tx.claim.unwrap_or(1);
                ClaimOutcome::Claimed(Claimed {
                    tx,
                    fence: req.id.fence(generation),
                })
            }
            Attempt::Busy => ClaimOutcome::Busy,
            Attempt::Exists | Attempt::Taken => ClaimOutcome::Taken,
        })
    }
}

/// The per-connection settings ([`MySqlStore::SESSION_SQL`]), plus the
/// statement bound and, on a Galera node, causal reads.
async fn session(conn: &mut MySqlConnection, statement_ms: u64) -> Result<(), sqlx::Error> {
    for sql in MySqlStore::SESSION_SQL {
        sqlx::query(sql).execute(&mut *conn).await?;
    }
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(&mut *conn)
        .await?;
    if version.contains("MariaDB") {
        // Seconds, fractional; bounds every statement, writes too.
        sqlx::query(&format!(
            "SET SESSION max_statement_time = {:.3}",
            statement_ms as f64 / 1000.0
        ))
        .execute(&mut *conn)
        .await?;
        let wsrep: Option<String> = sqlx::query_scalar("SELECT @@GLOBAL.wsrep_on")
            .fetch_optional(&mut *conn)
            .await
            .ok()
            .flatten()
            .map(|v: i64| v.to_string());
        if wsrep.as_deref() == Some("1") {
            // A read waits until this node has applied every write set
            // certified before it: the loser of a certification conflict
            // then reads the winner's record.
            sqlx::query("SET SESSION wsrep_sync_wait = 1")
                .execute(&mut *conn)
                .await?;
        }
    } else {
        sqlx::query(&format!("SET SESSION max_execution_time = {statement_ms}"))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

async fn insert_claim(c: &mut MySqlConnection, req: &ClaimRequest<'_>) -> sqlx::Result<()> {
    sqlx::query(INSERT_CLAIM_SQL)
        .bind(req.id.caller().as_str())
        .bind(req.id.key().as_str())
        .bind(req.fingerprint.to_hex())
        .bind(req.now)
        .bind(req.lease_expires_at)
        .bind(req.now)
        .bind(req.replay_until)
        .bind(req.expires_at)
        .bind(&req.request.method)
        .bind(&req.request.path)
        .bind(req.request.content_type.as_deref())
        .bind(req.request.body.as_ref())
        .execute(&mut *c)
        .await?;
    Ok(())
}

/// `Some(generation)` when the row was replaceable and is now this claim's.
async fn replace_claim(
    c: &mut MySqlConnection,
    req: &ClaimRequest<'_>,
) -> sqlx::Result<Option<i64>> {
    let matched = sqlx::query(REPLACE_CLAIM_SQL)
        .bind(req.fingerprint.to_hex())
        .bind(req.now)
        .bind(req.lease_expires_at)
        .bind(req.now)
        .bind(req.replay_until)
        .bind(req.expires_at)
        .bind(&req.request.method)
        .bind(&req.request.path)
        .bind(req.request.content_type.as_deref())
        .bind(req.request.body.as_ref())
        .bind(req.id.caller().as_str())
        .bind(req.id.key().as_str())
        .bind(req.now)
        .bind(req.now)
        .execute(&mut *c)
        .await?
        .rows_affected();
    if matched != 1 {
        return Ok(None);
    }
    generation(c, req.id).await.map(Some)
}

async fn generation(c: &mut MySqlConnection, id: &KeyId) -> sqlx::Result<i64> {
    sqlx::query_scalar(GENERATION_SQL)
        .bind(id.caller().as_str())
        .bind(id.key().as_str())
        .fetch_one(&mut *c)
        .await
}

async fn lookup(c: &mut MySqlConnection, id: &KeyId) -> Result<Option<KeyRecord>> {
    let row = sqlx::query(LOOKUP_SQL)
        .bind(id.caller().as_str())
        .bind(id.key().as_str())
        .fetch_optional(&mut *c)
        .await?;
    row.as_ref().map(decode_record).transpose()
}

/// The fenced final write; rows matched.
async fn complete(
    c: &mut MySqlConnection,
    fence: &Fence,
    response: &StoredResponse,
    now: Millis,
) -> Result<u64> {
    let id = fence.id();
    Ok(sqlx::query(COMPLETE_SQL)
        .bind(now)
        .bind(now)
        .bind(i64::from(response.status))
        .bind(headers_json(response)?)
        .bind(&response.body)
        .bind(id.caller().as_str())
        .bind(id.key().as_str())
        .bind(fence.generation())
        .execute(&mut *c)
        .await
        .map_err(conflict_or_store)?
        .rows_affected())
}

impl KeyStore for MySqlStore {
    type Tx = MySqlTx;

    async fn begin(&self) -> Result<MySqlTx> {
        Ok(MySqlTx {
            tx: self.begin_tx().await?,
            claim: None,
        })
    }

    async fn commit(&self, tx: MySqlTx) -> Result<()> {
        tx.commit().await
    }

    async fn rollback(&self, tx: MySqlTx) -> Result<()> {
        tx.rollback().await
    }

    /// Always: on a Galera node another node's claim of the key is not
    /// seen until it certifies. (On a single server the extra look after a
    /// failed endpoint finds no winner and changes nothing.)
    fn peers_can_commit_during_claim(&self) -> bool {
        true
    }

    async fn lookup(&self, id: &KeyId) -> Result<Option<KeyRecord>> {
        crate::metrics::timed(Stage::Lookup, async {
            lookup(&mut *self.pool.acquire().await?, id).await
        })
        .await
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome<MySqlTx>> {
        crate::metrics::timed(Stage::Claim, self.claim_key(req)).await
    }

    async fn observe(&self, id: &KeyId, now: Millis) -> Result<Observed<MySqlTx>> {
        crate::metrics::timed(Stage::Observe, async {
            // The plain read first: a replay (or a mismatch) is answered
            // after it and locks nothing. Otherwise the probe on the same
            // connection: refused at once when another transaction holds
            // the row (an uncommitted claim), which is the in-flight answer.
            let mut conn = self.pool.acquire().await?;
            let record = lookup(&mut conn, id).await?;
            if record.as_ref().is_some_and(|r| r.replayable(now)) {
                return Ok(Observed {
                    record,
                    busy: false,
                    tx: None,
                });
            }
            let busy = match sqlx::query(PROBE_SQL)
                .bind(id.caller().as_str())
                .bind(id.key().as_str())
                .fetch_optional(&mut *conn)
                .await
            {
                Ok(_) => false,
                Err(e) if lock_conflict(&e) => true,
                Err(e) => return Err(e.into()),
            };
            Ok(Observed {
                record,
                busy,
                tx: None,
            })
        })
        .await
    }

    async fn begin_single(&self, req: &ClaimRequest<'_>) -> Result<SingleTx<MySqlTx>> {
        crate::metrics::timed(Stage::Claim, async {
            Ok(match self.claim_key(req).await? {
                ClaimOutcome::Claimed(c) => SingleTx::Open(c.tx),
                ClaimOutcome::Busy => SingleTx::Busy,
                ClaimOutcome::Taken => SingleTx::Taken,
            })
        })
        .await
    }

    async fn record_final(
        &self,
        tx: &mut MySqlTx,
        req: &ClaimRequest<'_>,
        response: &StoredResponse,
        now: Millis,
    ) -> Result<Option<i64>> {
        crate::metrics::timed(Stage::RecordFinal, async {
            if let Some(generation) = tx.claim {
                // This transaction inserted (or replaced) the row and holds
                // its lock: the fenced update cannot miss unless the row was
                // replaced under us, which the lock rules out.
                let fence = req.id.fence(generation);
                let matched = complete(&mut tx.tx, &fence, response, now).await?;
                return Ok((matched == 1).then_some(generation));
            }
            // A transaction the store did not claim in: insert the complete
            // record; a committed row already there is not replaced from
            // inside this transaction (its duplicate-key lock would be held
            // across the rest of it), so the request observes again.
            let replay_until = if req.replay_until <= now {
                req.expires_at
            } else {
                req.replay_until
            };
            let inserted = sqlx::query(INSERT_FINAL_SQL)
                .bind(req.id.caller().as_str())
                .bind(req.id.key().as_str())
                .bind(req.fingerprint.to_hex())
                .bind(req.now)
                .bind(replay_until)
                .bind(req.expires_at)
                .bind(now)
                .bind(&req.request.method)
                .bind(&req.request.path)
                .bind(req.request.content_type.as_deref())
                .bind(req.request.body.as_ref())
                .bind(i64::from(response.status))
                .bind(headers_json(response)?)
                .bind(&response.body)
                .execute(&mut *tx.tx)
                .await;
            match inserted {
                Ok(_) => {
                    tx.claim = Some(1);
                    Ok(Some(1))
                }
                Err(e) if number(&e) == Some(code::DUPLICATE) || lock_conflict(&e) => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
        .await
    }

    async fn write_fenced(
        &self,
        tx: &mut MySqlTx,
        fence: &Fence,
        write: FencedWrite<'_>,
        now: Millis,
    ) -> Result<()> {
        crate::metrics::timed(Stage::WriteFenced, async {
            let id = fence.id();
            let matched = match write {
                FencedWrite::Point {
                    point,
                    lease_expires_at,
                } => sqlx::query(COMMIT_POINT_SQL)
                    .bind(point.as_str())
                    .bind(now)
                    .bind(lease_expires_at)
                    .bind(id.caller().as_str())
                    .bind(id.key().as_str())
                    .bind(fence.generation())
                    .execute(&mut *tx.tx)
                    .await
                    .map_err(conflict_or_store)?
                    .rows_affected(),
                FencedWrite::Final(response) => complete(&mut tx.tx, fence, response, now).await?,
            };
            if matched == 1 {
                Ok(())
            } else {
                crate::metrics::fence_lost();
                Err(Error::Fenced)
            }
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
            let mut tx = self.begin_tx().await?;
            let matched = sqlx::query(TAKE_OVER_SQL)
                .bind(now)
                .bind(lease_expires_at)
                .bind(id.caller().as_str())
                .bind(id.key().as_str())
                .bind(fingerprint.to_hex())
                .bind(now)
                .bind(now)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if matched != 1 {
                tx.rollback().await?;
                return Ok(None);
            }
            let row = sqlx::query(TAKEN_SQL)
                .bind(id.caller().as_str())
                .bind(id.key().as_str())
                .fetch_one(&mut *tx)
                .await?;
            let taken = TakenOver {
                fence: id.fence(row.try_get("generation")?),
                recovery_point: point(row.try_get("recovery_point")?)?,
                created_at: row.try_get("created_at")?,
            };
            tx.commit().await.map_err(conflict_or_store)?;
            Ok(Some(taken))
        })
        .await
    }

    async fn renew_lease(
        &self,
        fence: &Fence,
        now: Millis,
        lease_expires_at: Millis,
    ) -> Result<bool> {
        let id = fence.id();
        let matched = sqlx::query(RENEW_SQL)
            .bind(now)
            .bind(lease_expires_at)
            .bind(id.caller().as_str())
            .bind(id.key().as_str())
            .bind(fence.generation())
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(matched == 1)
    }

    async fn release_lease(&self, fence: &Fence, now: Millis) -> Result<bool> {
        let id = fence.id();
        let matched = sqlx::query(RELEASE_SQL)
            .bind(now)
            .bind(id.caller().as_str())
            .bind(id.key().as_str())
            .bind(fence.generation())
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(matched == 1)
    }

    async fn abandoned(&self, now: Millis, limit: i64) -> Result<Vec<AbandonedKey>> {
        let rows = sqlx::query(ABANDONED_SQL)
            .bind(now)
            .bind(now)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            out.push(AbandonedKey {
                id: KeyId::from_stored(r.try_get("caller")?, &r.try_get::<String, _>("idem_key")?)?,
                fingerprint: fingerprint(&r.try_get::<String, _>("fingerprint")?)?,
                recovery_point: point(r.try_get("recovery_point")?)?,
                request: StoredRequest {
                    method: r.try_get("request_method")?,
                    path: r.try_get("request_path")?,
                    content_type: r.try_get("request_content_type")?,
                    body: r
                        .try_get::<Option<Vec<u8>>, _>("request_body")?
                        .unwrap_or_default()
                        .into(),
                },
            });
        }
        Ok(out)
    }

    async fn reap(&self, now: Millis, limit: i64) -> Result<ReapBatch> {
        let mut tx = self.begin_tx().await?;
        let rows = sqlx::query(REAP_SELECT_SQL)
            .bind(now)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        let mut unfinished = Vec::new();
        let mut delete = sqlx::QueryBuilder::<MySql>::new(
            "DELETE FROM idempotency_keys WHERE (caller, idem_key) IN (",
        );
        let mut ids = Vec::with_capacity(rows.len());
        for r in &rows {
            let (caller, key): (String, String) = (r.try_get("caller")?, r.try_get("idem_key")?);
            if r.try_get::<String, _>("state")? == "in_flight" {
                unfinished.push(Unfinished {
                    id: KeyId::from_stored(caller.clone(), &key)?,
                    recovery_point: point(r.try_get("recovery_point")?)?,
                });
            }
            ids.push((caller, key));
        }
        if !ids.is_empty() {
            let mut sep = delete.separated(", ");
            for (caller, key) in &ids {
                sep.push("(");
                sep.push_bind_unseparated(caller);
                sep.push_unseparated(", ");
                sep.push_bind_unseparated(key);
                sep.push_unseparated(")");
            }
            delete.push(")");
            delete.build().execute(&mut *tx).await?;
        }
        tx.commit().await.map_err(conflict_or_store)?;
        Ok(ReapBatch {
            deleted: ids.len() as u64,
            unfinished,
        })
    }

    async fn orphans(&self, now: Millis) -> Result<super::Orphans> {
        let (count, oldest): (i64, Option<i64>) = sqlx::query_as(ORPHANS_SQL)
            .bind(now)
            .bind(now)
            .fetch_one(&self.pool)
            .await?;
        Ok(super::Orphans {
            count: count.unsigned_abs(),
            oldest_lease_end: oldest,
        })
    }

    async fn oldest_expired(&self, now: Millis) -> Result<Option<Millis>> {
        Ok(sqlx::query_scalar(OLDEST_EXPIRED_SQL)
            .bind(now)
            .fetch_one(&self.pool)
            .await?)
    }
}

impl super::StoreBackend for MySqlStore {
    const NAME: &'static str = "mysql";

    fn accepts(url: &str) -> bool {
        url.starts_with("mysql://") || url.starts_with("mariadb://")
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

impl StagedJobs for MySqlStore {
    async fn stage(&self, tx: &mut MySqlTx, kind: &str, payload: &str, now: Millis) -> Result<()> {
        sqlx::query(STAGE_SQL)
            .bind(kind)
            .bind(payload)
            .bind(now)
            .execute(&mut *tx.tx)
            .await?;
        Ok(())
    }

    async fn staged(&self, limit: i64) -> Result<Vec<StagedJob>> {
        let rows = sqlx::query(STAGED_SQL)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            out.push(StagedJob {
                id: r.try_get("id")?,
                kind: r.try_get("kind")?,
                payload: r.try_get("payload")?,
            });
        }
        Ok(out)
    }

    async fn delete_job(&self, tx: &mut MySqlTx, id: i64) -> Result<()> {
        sqlx::query(DELETE_JOB_SQL)
            .bind(id)
            .execute(&mut *tx.tx)
            .await?;
        Ok(())
    }
}
