//! Key stores: where the state of every (caller, key) lives.
//!
//! [`KeyStore`] is the seam between the engine and a database. The library
//! ships three implementations on the application's own sqlx pool:
//! [`SqliteStore`] (on a `SqlitePool`), [`PgStore`] (on a `PgPool`) and
//! [`Store`], either of them chosen at run time (what the reference server
//! uses, with [`with_conn!`](crate::with_conn) for portable SQL). All three
//! run the *same SQL text* (`$1`-style placeholders and `INSERT ... ON
//! CONFLICT ... RETURNING` work on both drivers); only the genuinely
//! different parts are written twice: opening a write transaction (SQLite's
//! single writer) and the claim's advisory lock (PostgreSQL).
//!
//! ## One place for each thing issue-sized work touches
//!
//! - [`KeyStore::begin`], [`KeyStore::commit`] and [`KeyStore::rollback`]
//!   are the only places a write transaction is opened and settled, and
//!   [`KeyStore::lookup`] the only read outside one: bounded connection
//!   acquisition, retiring a connection whose commit failed, and "store
//!   unavailable" answers belong there.
//! - [`KeyStore::observe`], [`KeyStore::begin_single`] and
//!   [`KeyStore::record_final`] are the whole claim protocol of a
//!   single-phase request on the store's side, and [`KeyStore::claim`] that
//!   of a multi-step one (the engine's side of both is [`crate::decide`]).
//!
//! ## The table
//!
//! One row per (caller, key), primary key on the pair (clause
//! `idem.scope.caller`). Columns for multi-step requests exist from the
//! start: `recovery_point`, `locked_at`/`lease_expires_at` (the lease) and
//! `generation` (the fencing token), plus the request itself so a completer
//! can finish an abandoned request. Its migrations ship with the library
//! ([`crate::migrate`]).
//!
//! ## Writes under a claim are fenced
//!
//! Every statement that changes a claimed key carries
//! `generation = $current` in its `WHERE` (clause `idem.lease.fencing`) and
//! runs inside the transaction that carries the endpoint's writes, so a
//! refused guard ([`Error::Fenced`](crate::Error::Fenced)) rolls those writes back too: a worker
//! that lost its key can change nothing. On PostgreSQL the `UPDATE` takes
//! the key row's lock, so a takeover and a stale commit are ordered by the
//! database; READ COMMITTED re-evaluates the guard after the wait.
//!
//! ## The single-phase protocol: claim and record in one write, at the end
//!
//! A single-phase request (the [`IdempotencyLayer`](crate::IdempotencyLayer))
//! commits nothing before its endpoint has run, so its claim need not be a
//! row until then. It is:
//!
//! 1. **Observe** ([`KeyStore::observe`]): one plain read of the key's
//!    record, outside any transaction, on both stores. On PostgreSQL,
//!    unless that record is complete inside its window, the same
//!    connection then sends `BEGIN` and the key's transaction-scoped
//!    advisory try-lock in one message. Lock not free: another transaction
//!    is executing the key, so it is in flight (409
//!    `idempotency_key_in_use`, or `Prefer: wait`).
//! 2. **Decide** ([`crate::decide`], pure): a complete record inside its
//!    window is replayed (or refused, other fingerprint) after that one
//!    round trip; an absent or replaceable key is claimed.
//! 3. **Run** the endpoint in the transaction that holds the key's claim.
//!    PostgreSQL: the transaction from step 1 (or [`begin_single`], which
//!    opens it the same way), open for the request's whole life. SQLite:
//!    [`begin_single`] defers it; the endpoint's first
//!    [`IdemTx::lock`](crate::IdemTx::lock) opens it (`BEGIN IMMEDIATE`,
//!    the one writer), so time the endpoint spends before its first write
//!    holds nothing another key needs; duplicates in this process are
//!    answered by the engine's registry meanwhile.
//! 4. **Claim and record** ([`KeyStore::record_final`]): one `INSERT` of the
//!    complete record `ON CONFLICT (caller, idem_key) DO UPDATE ... WHERE`
//!    the existing row is replaceable (its window is over, or it is in
//!    flight at `started` with an expired lease), `RETURNING generation`,
//!    then `COMMIT` ([`KeyStore::record_final_and_commit`] does both). On
//!    SQLite a key without a row, the usual first execution, takes a
//!    shorter path: a plain `INSERT` of the complete record, `COMMIT` and an
//!    empty `BEGIN` sent to the connection's worker thread as one statement
//!    list, one hand-off instead of two while holding the writer. A row in
//!    the way fails that `INSERT` on the primary key, SQLite stops the list
//!    before its `COMMIT`, and the upsert above decides in the same
//!    transaction. A `5xx` instead rolls everything back, nothing stored.
//!
//! [`begin_single`]: KeyStore::begin_single
//!
//! **The race it must survive.** Step 1's read is not exact. It happens
//! before the lock (PostgreSQL) or the writer (SQLite), so replays and
//! mismatches never queue for either; another request can therefore commit
//! its record between the read and the lock, and two requests can both see
//! "absent" and both run the endpoint. Neither store relies on the
//! read: the final statement is arbitrated by the primary key on
//! (caller, key) against the latest *committed* row, whatever the snapshot,
//! exactly like the multi-step claim (clause `idem.claim.atomic`). The
//! second request finds the first one's complete row, the `WHERE` is false,
//! no row comes back, and the engine rolls its transaction back, its
//! endpoint's writes with it (clause `idem.claim.transactional`), then
//! observes again and answers from the committed record: the identical
//! replay, a mismatch, or a retryable 409. So "both saw absent" still leaves
//! exactly one effect (clause `idem.concurrency.single-effect`); what it
//! costs is one wasted, rolled-back execution in a window of microseconds.
//! The final statement never waits for an uncommitted key row: every writer
//! of a claimable key row (this protocol, the multi-step claim, an older
//! version of this library during a rolling deploy) holds the same advisory
//! lock (PostgreSQL) or the writer lock (SQLite). A request that lost and
//! then finds the key claimable again (the winner's record already reaped)
//! answers 409 rather than run a second time. Tested in `tests/store.rs`
//! (`a_single_phase_claim_that_loses_its_final_write_leaves_no_business_write`,
//! `the_final_write_never_replaces_a_record_in_flight`) and
//! `tests/engine.rs` (`concurrent_first_requests_on_two_engines_execute_once`,
//! `postgres_a_request_that_loses_its_final_write_replays_the_winner_and_writes_nothing`).
//!
//! Multi-step requests commit their claim with their first phase (a
//! recovery point must be durable before a foreign call), so they keep
//! [`KeyStore::claim`]: `INSERT` the in-flight row under the same lock,
//! then fenced updates.
//!
//! ## Costs (the design target of clause `idem.claim.transactional`)
//!
//! - A first execution of a single-phase request is one transaction and one
//!   key write. PostgreSQL: `BEGIN`, the observation, the endpoint's
//!   statements, the claim-and-record, `COMMIT` (two statements and one
//!   `BEGIN` more than the endpoint alone). SQLite: one read outside the
//!   writer, then, at the endpoint's first write, `BEGIN IMMEDIATE`, the
//!   endpoint's statements, then the claim-and-record with `COMMIT` in one
//!   hand-off to the worker thread: the writer is held for four hand-offs
//!   (`BEGIN IMMEDIATE` is two, as sqlx checks that a custom `BEGIN`
//!   opened a transaction through the connection's handle) where the
//!   endpoint's statement alone, autocommitted, takes one.
//! - What holds what while the endpoint runs: on SQLite, nothing before
//!   its first write and the one writer from then until the commit (every
//!   other first execution of the application waits for it, bounded by the
//!   store timeout, then `503`); on PostgreSQL, one pooled connection and
//!   the key's advisory lock for the request's whole life, so the pool's
//!   size bounds how many requests run at once. An endpoint whose write
//!   must come before slow work is a [`MultiStep`](crate::multistep::MultiStep).
//!   A crash anywhere before the commit leaves no trace at all.
//! - A replay: PostgreSQL `BEGIN`, the observation (no lock taken) and
//!   `ROLLBACK`, all reads; SQLite one primary-key read. No write.
//! - Where it does not hold: a duplicate arriving while the original runs
//!   costs the observation (PostgreSQL: the lock is not free; SQLite: the
//!   engine's registry answers in-process duplicates); a request that lost
//!   the race above runs its endpoint once and rolls it back; a `5xx` is a
//!   transaction rolled back; multi-step requests commit one transaction
//!   per phase by design (the first joins the claim's), plus one short
//!   transaction per takeover and per intent recorded before a foreign call.

// Each store behind its cargo feature, so an application compiles only the
// sqlx drivers it uses; `Store` (any of them, chosen at run time) is
// generated from the one list in `seam`.
mod dialect;
#[cfg(feature = "mysql")]
pub mod mysql;
mod ops;
mod options;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(test)]
pub(crate) mod scripted;
mod seam;
#[cfg(feature = "sqlite")]
pub mod sqlite;

#[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
compile_error!(
    "axum-idempotency needs a store: enable its `sqlite`, `postgres` or `mysql` feature"
);

use std::future::Future;

use axum::http::{HeaderMap, HeaderName, header};
use idem_spec::{Fingerprint, KeyState, RecoveryPoint};
use serde::{Deserialize, Serialize};

use crate::clock::Millis;
use crate::error::Result;
use crate::key::{Fence, KeyId};

pub use dialect::{Dialect, is_mysql, sql};
#[cfg(feature = "mysql")]
pub use mysql::{MySqlStore, MySqlTx};
pub use options::{DEFAULT_ACQUIRE_TIMEOUT, DEFAULT_STATEMENT_TIMEOUT, SqliteSync, StoreOptions};
#[cfg(feature = "postgres")]
pub use postgres::{PgStore, PgTx};
pub use seam::{DbConn, DbTx, Store, StoreBackend};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStore, SqliteTx};

/// A key no request can send (a caller with a control character), for the
/// stores' start-up claim checks.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn probe_id() -> Result<KeyId> {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let key = idem_spec::IdempotencyKey::parse(&format!("claim-check-{n}-{}", std::process::id()))
        .map_err(|e| crate::Error::Internal(format!("claim check key: {e}")))?;
    Ok(KeyId::new(
        crate::Caller::new("\u{1f}axum-idempotency claim check"),
        key,
    ))
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
    /// The headers that are replayed: see [`stored_response`].
    pub headers: Vec<StoredHeader>,
    /// The body, byte for byte.
    pub body: Vec<u8>,
}

/// Whether a header belongs to one connection (RFC 9110 section 7.6.1 and
/// RFC 9112's `Transfer-Encoding`): never stored, never replayable.
fn hop_by_hop(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::TE
        || name == header::TRAILER
        || name == header::TRANSFER_ENCODING
        || name == header::UPGRADE
        || name == header::CONTENT_LENGTH
        || name.as_str() == "keep-alive"
        || name.as_str().starts_with("proxy-")
}

/// Whether a header describes one response rather than the outcome:
/// `Date` (the replay gets the time it is sent) and `Set-Cookie` (a cookie
/// can be a credential: it is not kept at rest in the key table, and a
/// session rotated or ended since the first response is not brought back).
/// Stored only when the endpoint declares it
/// ([`IdempotencyLayer::replay_header`](crate::IdempotencyLayer::replay_header)).
fn per_response(name: &HeaderName) -> bool {
    name == header::DATE || name == header::SET_COOKIE
}

/// Picks the headers a replay reproduces (clause idem.replay.verbatim):
/// every header the endpoint set, each value byte for byte and in order,
/// except
/// - hop-by-hop headers (`Connection`, `Keep-Alive`, `Proxy-*`, `TE`,
///   `Trailer`, `Transfer-Encoding`, `Upgrade`) and `Content-Length`,
///   which belong to one connection (the length is recomputed from the
///   stored body);
/// - `Date` and `Set-Cookie`, which describe one response, unless listed in
///   `declared`.
///
/// Headers added outside the idempotency layer (by middleware around it,
/// or by the HTTP server) are not seen here: they are added again to the
/// replay as to any response.
pub fn stored_response(
    status: u16,
    headers: &HeaderMap,
    declared: &[HeaderName],
    body: &[u8],
) -> StoredResponse {
    let kept = headers
        .iter()
        .filter(|(name, _)| !hop_by_hop(name) && (!per_response(name) || declared.contains(name)))
        .map(|(name, value)| StoredHeader::new(name.as_str(), value.as_bytes()))
        .collect();
    StoredResponse {
        status,
        headers: kept,
        body: body.to_vec(),
    }
}

/// The request a key was claimed with, kept so a completer can finish it
/// without the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRequest {
    /// Method.
    pub method: String,
    /// Path with query.
    pub path: String,
    /// `Content-Type`, if any.
    pub content_type: Option<String>,
    /// Body.
    pub body: axum::body::Bytes,
}

/// What the store knows about one (caller, key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    /// Fingerprint of the request that claimed the key.
    pub fingerprint: Fingerprint,
    /// In flight or complete (an absent key has no record).
    pub state: KeyState,
    /// Last committed recovery point.
    pub recovery_point: RecoveryPoint,
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

impl KeyRecord {
    /// Complete and inside its replay window at `now`: a request with this
    /// key is answered from the record ([`crate::decide`]), and the
    /// PostgreSQL store's observation takes no lock for it.
    pub fn replayable(&self, now: Millis) -> bool {
        self.state == KeyState::Complete && now < self.replay_until
    }
}

/// Everything the claim statement writes.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// The record to claim.
    pub id: &'a KeyId,
    /// Request fingerprint.
    pub fingerprint: &'a Fingerprint,
    /// The request, kept for the completer.
    pub request: &'a StoredRequest,
    /// The clock's now.
    pub now: Millis,
    /// End of the lease taken by this claim.
    pub lease_expires_at: Millis,
    /// End of the replay window (measured from this first request).
    pub replay_until: Millis,
    /// End of retention.
    pub expires_at: Millis,
}

/// A successful claim: the open transaction and the fence every write under
/// the claim must carry.
#[derive(Debug)]
pub struct Claimed<Tx> {
    /// The transaction holding the (uncommitted) claim.
    pub tx: Tx,
    /// The claim's fence.
    pub fence: Fence,
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

/// What a single-phase request learns about its key before it runs
/// ([`KeyStore::observe`]).
#[derive(Debug)]
pub struct Observed<Tx> {
    /// The committed record as read (possibly a moment old: the final write,
    /// [`KeyStore::record_final`], is what arbitrates).
    pub record: Option<KeyRecord>,
    /// Another transaction holds this key's claim right now (PostgreSQL:
    /// its advisory lock was not free): the key is in flight, though no
    /// committed record shows it yet.
    pub busy: bool,
    /// A transaction that already holds this key's claim, for the request
    /// to run in if it executes; the caller rolls it back if it does not
    /// (PostgreSQL: opened after the read, on the same connection, unless
    /// the record is replayable). `None` when the store took no lock: a
    /// replayable record, or always on SQLite, whose claim is the writer
    /// lock, taken at the endpoint's first write ([`SingleTx::Deferred`]).
    pub tx: Option<Tx>,
}

/// How a single-phase request that claims its key gets the transaction its
/// endpoint's writes and its final record commit in
/// ([`KeyStore::begin_single`]).
#[derive(Debug)]
pub enum SingleTx<Tx> {
    /// Open now and holding the key's claim (PostgreSQL: the key's
    /// transaction-scoped advisory lock, which tells other processes the
    /// key is in flight).
    Open(Tx),
    /// Opened by [`KeyStore::begin`] when the endpoint first calls
    /// [`IdemTx::lock`](crate::IdemTx::lock), or at the end for the final
    /// record if it never does (SQLite: `BEGIN IMMEDIATE` takes the one
    /// writer, so it is taken as late as possible; duplicates in this
    /// process are answered by the engine's registry meanwhile).
    Deferred,
    /// Another transaction holds the key's claim: it is in flight.
    Busy,
    /// A committed record that may not be replaced exists (a concurrent
    /// request won since the observation): observe again (MySQL, whose
    /// claim is an insert made before the endpoint runs).
    Taken,
}

impl<Tx> SingleTx<Tx> {
    /// The same answer with the transaction wrapped (for [`Store`]).
    pub fn map<T>(self, wrap: impl FnOnce(Tx) -> T) -> SingleTx<T> {
        match self {
            Self::Open(tx) => SingleTx::Open(wrap(tx)),
            Self::Deferred => SingleTx::Deferred,
            Self::Busy => SingleTx::Busy,
            Self::Taken => SingleTx::Taken,
        }
    }
}

/// What a takeover won.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenOver {
    /// The new fence (the old generation plus one).
    pub fence: Fence,
    /// The last committed recovery point: where to resume.
    pub recovery_point: RecoveryPoint,
    /// When the request was first claimed (stable across takeovers; derived
    /// ids and outbound keys are computed from it).
    pub created_at: Millis,
}

/// An in-flight key whose lease has expired, with the original request, so
/// the completer can finish it without the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbandonedKey {
    /// The record.
    pub id: KeyId,
    /// The request fingerprint.
    pub fingerprint: Fingerprint,
    /// Last committed recovery point.
    pub recovery_point: RecoveryPoint,
    /// The original request.
    pub request: StoredRequest,
}

/// A record the reaper deleted while it was still in flight: a request
/// nobody finished, logged for a human.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfinished {
    /// The record.
    pub id: KeyId,
    /// Where it stopped.
    pub recovery_point: RecoveryPoint,
}

/// What one reaper batch (one short transaction) deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReapBatch {
    /// Records deleted.
    pub deleted: u64,
    /// Records deleted while still in flight.
    pub unfinished: Vec<Unfinished>,
}

/// What one reaper pass did, over all its batches: what its one summary
/// log line says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Records deleted.
    pub deleted: u64,
    /// Of which still in flight (requests nobody finished).
    pub unfinished: u64,
    /// The first unfinished records (at most
    /// [`UNFINISHED_SAMPLE`](crate::reaper::UNFINISHED_SAMPLE)), named in
    /// the summary; every one is logged at DEBUG.
    pub unfinished_sample: Vec<Unfinished>,
    /// Transactions the pass took (one per batch).
    pub batches: u32,
}

/// A fenced write made inside a claim's transaction.
#[derive(Debug, Clone, Copy)]
pub enum FencedWrite<'a> {
    /// A phase commit: move to `point`, lease renewed until
    /// `lease_expires_at`.
    Point {
        /// The recovery point reached.
        point: &'a RecoveryPoint,
        /// End of the renewed lease.
        lease_expires_at: Millis,
    },
    /// The final response (recovery point `finished`, key complete).
    Final(&'a StoredResponse),
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

    /// Opens a write transaction (an endpoint's phase, a takeover, the
    /// enqueuer's delivery).
    fn begin(&self) -> impl Future<Output = Result<Self::Tx>> + Send;

    /// Commits `tx`.
    fn commit(&self, tx: Self::Tx) -> impl Future<Output = Result<()>> + Send;

    /// Rolls `tx` back: every write in it disappears.
    fn rollback(&self, tx: Self::Tx) -> impl Future<Output = Result<()>> + Send;

    /// Reads the record of `id`, outside any transaction: the whole cost of
    /// a replay.
    fn lookup(&self, id: &KeyId) -> impl Future<Output = Result<Option<KeyRecord>>> + Send;

    /// Whether another server of the same database can commit a record of
    /// a key while this one holds its uncommitted claim (a multi-primary
    /// cluster such as Galera, whose row locks are local to a node). There
    /// a single-phase endpoint that fails may have failed *because* such a
    /// winner's write set aborted its transaction, so the engine looks at
    /// the key once more and answers from the winner. Default: `false` (the
    /// claim excludes every other writer until it ends).
    fn peers_can_commit_during_claim(&self) -> bool {
        false
    }

    /// Opens a transaction and claims the key in it, atomically. The claim
    /// succeeds when the key is absent, past its replay window, or in flight
    /// at `started` with an expired lease; it bumps the fencing generation.
    fn claim(
        &self,
        req: &ClaimRequest<'_>,
    ) -> impl Future<Output = Result<ClaimOutcome<Self::Tx>>> + Send;

    /// The observation of a single-phase request: its key's record and
    /// whether another transaction is executing it, in as few round trips as
    /// the store allows. Both stores start with one plain read outside any
    /// transaction, so a replay costs one round trip and never queues for a
    /// writer or a lock; PostgreSQL then, unless the record is replayable,
    /// opens the transaction with a `BEGIN` that takes the key's advisory
    /// try-lock in the same message. See the module docs, "The single-phase
    /// protocol".
    fn observe(
        &self,
        id: &KeyId,
        now: Millis,
    ) -> impl Future<Output = Result<Observed<Self::Tx>>> + Send;

    /// The transaction a single-phase request runs in when
    /// [`observe`](KeyStore::observe) gave none. PostgreSQL opens it now,
    /// its `BEGIN` taking the key's advisory lock in the same message, and
    /// holds the lock for its whole life
    /// ([`SingleTx::Open`], or [`SingleTx::Busy`] when another transaction
    /// holds the key). SQLite defers it ([`SingleTx::Deferred`]): its claim
    /// is the database's one writer, taken when the endpoint first asks for
    /// its transaction, so time spent before the first write holds nothing
    /// another key needs.
    ///
    /// `req` is what the claim would write: MySQL claims here, inserting
    /// the in-flight row inside the transaction it opens
    /// ([`SingleTx::Taken`] when a committed record forbids it).
    fn begin_single(
        &self,
        req: &ClaimRequest<'_>,
    ) -> impl Future<Output = Result<SingleTx<Self::Tx>>> + Send;

    /// Inside `tx`, at the end of a single-phase request: claims the key and
    /// records its final `response` in one statement (`INSERT ... ON
    /// CONFLICT DO UPDATE ... WHERE` the existing row is replaceable),
    /// arbitrated by the primary key like [`claim`](KeyStore::claim).
    /// `Some(generation)`: recorded (commit next); `None`: a committed
    /// record that may not be replaced exists (a concurrent request won):
    /// the caller rolls `tx` back, the endpoint's writes with it. Does not
    /// commit.
    fn record_final(
        &self,
        tx: &mut Self::Tx,
        req: &ClaimRequest<'_>,
        response: &StoredResponse,
        now: Millis,
    ) -> impl Future<Output = Result<Option<i64>>> + Send;

    /// [`record_final`](KeyStore::record_final), then the commit of `tx`
    /// (its rollback when the record lost), as one step: a store that can
    /// hand both to the database at once overrides it (SQLite: one hand-off
    /// to the connection's worker thread instead of two, while this process
    /// holds the one writer). `Some(generation)`: recorded and committed
    /// with the endpoint's writes; `None`: lost to a committed record,
    /// everything rolled back; [`Error::Conflict`](crate::Error::Conflict):
    /// lost to a concurrent transaction (a deadlock victim, a certification
    /// conflict), nothing of `tx` committed. Any other error: as a failed
    /// commit, nothing is known committed.
    fn record_final_and_commit(
        &self,
        mut tx: Self::Tx,
        req: &ClaimRequest<'_>,
        response: &StoredResponse,
        now: Millis,
    ) -> impl Future<Output = Result<Option<i64>>> + Send {
        async move {
            match self.record_final(&mut tx, req, response, now).await {
                Ok(Some(generation)) => self.commit(tx).await.map(|()| Some(generation)),
                Ok(None) => self.rollback(tx).await.map(|()| None),
                Err(crate::Error::Conflict) => {
                    // Already rolled back by the database; the rollback
                    // here only returns the connection.
                    let _ = self.rollback(tx).await;
                    Err(crate::Error::Conflict)
                }
                Err(e) => {
                    self.rollback(tx).await?;
                    Err(e)
                }
            }
        }
    }

    /// Inside `tx`: makes `write` if `fence` is still current, else
    /// [`Error::Fenced`](crate::Error::Fenced) (the caller then rolls `tx`
    /// back). Does not commit.
    fn write_fenced(
        &self,
        tx: &mut Self::Tx,
        fence: &Fence,
        write: FencedWrite<'_>,
        now: Millis,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Takes over `id` if it is in flight with an expired lease and the same
    /// fingerprint, in its own short transaction, at whatever recovery point
    /// it stopped (clause `idem.lease.takeover`): bumps the generation,
    /// starts a fresh lease, keeps the point and the original request.
    /// Allowed until the key's retention ends, past its replay window too
    /// (clause `idem.window.progress`). `None` when it is not takeable.
    fn take_over(
        &self,
        id: &KeyId,
        fingerprint: &Fingerprint,
        now: Millis,
        lease_expires_at: Millis,
    ) -> impl Future<Output = Result<Option<TakenOver>>> + Send;

    /// The heartbeat: renews the lease of a key this worker still holds
    /// (clause `idem.lease.heartbeat`), in its own short transaction, to end
    /// at `lease_expires_at`. `false` when `fence` is no longer current or
    /// the key was settled or released meanwhile (nothing changed).
    fn renew_lease(
        &self,
        fence: &Fence,
        now: Millis,
        lease_expires_at: Millis,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Ends the lease now, leaving the key in flight at its last recovery
    /// point, so a retry (or the completer) can resume at once. `false` when
    /// `fence` is no longer current (nothing changed).
    fn release_lease(
        &self,
        fence: &Fence,
        now: Millis,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Up to `limit` in-flight keys with committed progress whose lease
    /// ended by `now` and whose retention has not, oldest lease first.
    fn abandoned(
        &self,
        now: Millis,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<AbandonedKey>>> + Send;

    /// Deletes up to `limit` records past retention at `now`, oldest first,
    /// in one short transaction (one reaper batch; [`crate::reaper`] loops).
    fn reap(&self, now: Millis, limit: i64) -> impl Future<Output = Result<ReapBatch>> + Send;

    /// The orphaned keys at `now`: what [`abandoned`](KeyStore::abandoned)
    /// would return, counted, with the oldest lease end. One aggregate read
    /// on the in-flight index (the completer measures it after each pass).
    fn orphans(&self, now: Millis) -> impl Future<Output = Result<Orphans>> + Send;

    /// The oldest retention end before `now` still in the table (`None`
    /// when the reaper has deleted everything due): one `MIN` on the
    /// retention index (the reaper measures it after each pass).
    fn oldest_expired(&self, now: Millis) -> impl Future<Output = Result<Option<Millis>>> + Send;
}

/// The completer's queue at one moment ([`KeyStore::orphans`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Orphans {
    /// Keys in flight with committed progress whose lease has ended.
    pub count: u64,
    /// The earliest lease end among them.
    pub oldest_lease_end: Option<Millis>,
}

pub use ops::StagedJob;

type HookFuture<'c> =
    std::pin::Pin<Box<dyn Future<Output = std::result::Result<bool, sqlx::Error>> + Send + 'c>>;

/// The pool's `after_release` hook: a connection handed back still inside
/// a transaction is closed, never reused.
///
/// Why: when a `COMMIT` or `ROLLBACK` fails (SQLite out of disk, an I/O
/// error), sqlx's count of open transactions on that connection stays
/// above zero, and every later `BEGIN` on it fails with "attempted to call
/// begin_with at non-zero transaction depth" until the process restarts.
/// A connection that reports a transaction is pinged first, which lets the
/// rollback a dropped transaction queued run (on SQLite it runs on the
/// connection's worker, in order), so a connection that was only waiting
/// for its rollback is kept; one that reports none is kept at once.
pub(crate) fn retire_if_in_transaction<C: sqlx::Connection>(
    conn: &mut C,
    _meta: sqlx::pool::PoolConnectionMetadata,
) -> HookFuture<'_> {
    Box::pin(async move {
        // The common case costs nothing: a connection handed back outside
        // any transaction is kept without a round trip.
        if !conn.is_in_transaction() {
            return Ok(true);
        }
        conn.ping().await?;
        if conn.is_in_transaction() {
            tracing::warn!(
                "retiring a database connection left inside a transaction by a failed \
                 commit or rollback"
            );
            return Ok(false);
        }
        Ok(true)
    })
}

/// How long a pooled connection may sit idle before the stores' pool options ping
/// it on its next acquire (instead of sqlx's ping at every acquire).
pub const PING_IDLE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// The pool's `before_acquire` hook, in place of sqlx's
/// `test_before_acquire` (which the stores' pool options turn off): a
/// connection inside a transaction is refused (it reached the idle queue
/// some other way than [`retire_if_in_transaction`]), and one idle for
/// [`PING_IDLE_AFTER`] or more is pinged first.
///
/// Why not ping every time, as sqlx does by default: that is one more round
/// trip per acquire (on SQLite a hop to the connection's worker thread, and
/// the writer takes its connection while holding SQLite's one write lock),
/// and sqlx already pings every connection handed back. A connection in
/// steady use was proven alive milliseconds ago; one that sat idle through a
/// database restart is pinged and replaced before any request sees it. What
/// is left is a database that dies within a second of a connection's last
/// use: that request fails fast with the store's retryable 503, and the
/// connection is dropped when the failed request hands it back.
pub(crate) fn usable<C: sqlx::Connection>(
    conn: &mut C,
    meta: sqlx::pool::PoolConnectionMetadata,
) -> HookFuture<'_> {
    Box::pin(async move {
        if conn.is_in_transaction() {
            return Ok(false);
        }
        if meta.idle_for >= PING_IDLE_AFTER {
            conn.ping().await?;
        }
        Ok(true)
    })
}

/// Transactionally staged jobs (the enqueuer's table, `staged_jobs`): a job
/// staged inside a request's transaction exists only if that transaction
/// commits. See [`crate::jobs`].
pub trait StagedJobs: KeyStore {
    /// Stages a job inside `tx`.
    fn stage(
        &self,
        tx: &mut Self::Tx,
        kind: &str,
        payload: &str,
        now: Millis,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Up to `limit` committed staged jobs, oldest first (a plain read: a
    /// job of a transaction still open, or rolled back, is invisible).
    fn staged(&self, limit: i64) -> impl Future<Output = Result<Vec<StagedJob>>> + Send;

    /// Deletes a delivered job inside `tx`.
    fn delete_job(&self, tx: &mut Self::Tx, id: i64) -> impl Future<Output = Result<()>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    // clause: idem.replay.verbatim
    #[test]
    fn a_stored_response_keeps_every_header_but_the_connections_and_per_response_ones() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::LOCATION, HeaderValue::from_static("/things/1"));
        headers.append("x-multi", HeaderValue::from_static("a"));
        headers.append("x-multi", HeaderValue::from_static("b"));
        headers.insert("x-other", HeaderValue::from_static("kept"));
        headers.insert(
            header::ETAG,
            HeaderValue::from_bytes(b"\"caf\xe9\"").expect("bytes"),
        );
        // Never stored: hop-by-hop, the length, and per-response headers
        // nobody declared.
        for (name, value) in [
            ("connection", "close"),
            ("keep-alive", "timeout=5"),
            ("proxy-authenticate", "Basic"),
            ("te", "trailers"),
            ("trailer", "x-sum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("content-length", "2"),
            ("date", "Wed, 02 Dec 2026 06:00:00 GMT"),
            ("set-cookie", "session=abc"),
        ] {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let stored = stored_response(201, &headers, &[], b"{}");
        let pairs: Vec<(&str, Vec<u8>)> = stored
            .headers
            .iter()
            .map(|h| (h.name.as_str(), h.value_bytes()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("content-type", b"application/json".to_vec()),
                ("location", b"/things/1".to_vec()),
                ("x-multi", b"a".to_vec()),
                ("x-multi", b"b".to_vec()),
                ("x-other", b"kept".to_vec()),
                ("etag", b"\"caf\xe9\"".to_vec()),
            ]
        );
        assert_eq!(
            (stored.status, stored.body.as_slice()),
            (201, b"{}".as_slice())
        );

        // Declaring a per-response header stores it; declaring a hop-by-hop
        // one does not.
        let declared = [header::SET_COOKIE, header::CONNECTION];
        let stored = stored_response(201, &headers, &declared, b"{}");
        let names: Vec<&str> = stored.headers.iter().map(|h| h.name.as_str()).collect();
        assert!(names.contains(&"set-cookie"), "{names:?}");
        assert!(!names.contains(&"connection"), "{names:?}");
        assert!(!names.contains(&"date"), "{names:?}");
    }

    #[test]
    fn header_values_that_are_not_visible_ascii_round_trip_as_hex() {
        let text = StoredHeader::new("location", b"/v1/things/1");
        assert!(!text.hex);
        assert_eq!(text.value, "/v1/things/1");
        let raw = StoredHeader::new("x-raw", b"caf\xe9\x00");
        assert!(raw.hex);
        assert_eq!(raw.value_bytes(), b"caf\xe9\x00");
        let json = serde_json::to_string(&[text.clone(), raw.clone()]).expect("json");
        let back: Vec<StoredHeader> = serde_json::from_str(&json).expect("parse");
        assert_eq!(back, vec![text, raw]);
        assert!(
            !json.contains("\"hex\":false"),
            "the flag is omitted when false"
        );
    }
}
