//! The library's one error type, and how it becomes HTTP.
//!
//! The engine answers its own errors (a missing key, a mismatch, a key in
//! use, a store failure) as RFC 9457 `application/problem+json` documents
//! in the profile it was configured with (clause
//! `idem.errors.problem-json`); [`Error::to_problem`] is that mapping.
//! Errors the engine hands *to your code* (from [`IdemTx::lock`] or a
//! [`Phase`] method) are meant to be converted into your own error type
//! with `?`: implement `From<axum_idempotency::Error>` for it, and render
//! it however your API renders errors. Whatever your type does, a `5xx`
//! from the handler is never stored, so a client may retry it.
//!
//! Database and driver messages never reach a client: they are logged, and
//! the client gets a generic, retryable 500, or, when the store itself is
//! unavailable (unreachable, timed out, locked by another process, out of
//! disk, read-only: a [`StoreFault`]), a `503 upstream_unavailable` with
//! `Retry-After` (clause `idem.store.fail-closed`). Either way nothing was
//! stored and the key was not claimed, so a retry with the same key is safe.
//!
//! A store fault is classified in one place, [`StoreFault::of`] for a
//! driver error and [`Error::store_fault`] for this crate's, wherever in a
//! request the store fails: the engine's read and claim, a handler's own
//! query on the request's transaction, [`IdemTx::lock`], the commit. An
//! application's error type that wraps them (`#[from]`, so they stay in
//! its `source()` chain) and renders with [`problem_response`] is
//! classified the same way ([`StoreFault::find`]), and its 503s are counted
//! `store_unavailable` like the engine's own.
//!
//! [`IdemTx::lock`]: crate::IdemTx::lock
//! [`Phase`]: crate::multistep::Phase

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idem_spec::problem::PROBLEM_CONTENT_TYPE;
use idem_spec::{ErrorCode, Problem, Profile};

/// Everything the idempotency engine can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request reached an idempotent route without a [`Caller`]: keys
    /// are scoped to the authenticated caller, so authentication must run
    /// first (clause `idem.scope.caller`).
    ///
    /// [`Caller`]: crate::Caller
    #[error(
        "this endpoint needs an authenticated caller: idempotency keys are scoped to the caller"
    )]
    Unauthenticated,
    /// An idempotent endpoint got no `Idempotency-Key` header.
    #[error(
        "this endpoint requires an Idempotency-Key header; send one key per logical operation and reuse it on every retry"
    )]
    KeyMissing,
    /// An endpoint that reads its key from elsewhere (a
    /// [`KeySource`](crate::KeySource)) found none there.
    #[error("this endpoint takes its idempotency key from {0}, and the request had none there")]
    KeyMissingAt(String),
    /// The `Idempotency-Key` header broke the syntax rules (or was sent twice).
    #[error("{0}")]
    KeyInvalid(#[source] idem_spec::Error),
    /// The key was first used with a different request (method, path or body).
    #[error(
        "this Idempotency-Key was first used with a different request (method, path or body); use a new key for a new operation"
    )]
    KeyMismatch,
    /// Another request with this key is still being processed.
    #[error(
        "a request with this Idempotency-Key is still in progress; retry after {retry_after_secs} s with the same key, or send Prefer: wait=N"
    )]
    KeyInUse {
        /// Seconds advertised in `Retry-After`.
        retry_after_secs: u64,
    },
    /// The request body could not be read.
    #[error("{0}")]
    MalformedBody(String),
    /// The body is larger than the configured limit.
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// An `Idem-Failpoint` header the engine was told to honour is malformed.
    #[error("{0}")]
    Failpoint(String),
    /// A commit carried an older fencing generation than the key's current
    /// one: another worker took the key over, so this one's writes were
    /// refused and rolled back (clause `idem.lease.fencing`).
    #[error("the lease on this key was taken over by another worker; its outcome will be replayed")]
    Fenced,
    /// A database call failed. Rendered as 500 without the driver's text,
    /// or as 503 `upstream_unavailable` when it is a [`StoreFault`].
    #[error("database error{suffix}: {0}", suffix = fault_suffix(.0))]
    Store(#[source] sqlx::Error),
    /// The database rolled this request's transaction back because a
    /// concurrent transaction won: a deadlock victim, or (Galera) a
    /// certification conflict at commit (MySQL error 1213). Nothing of the
    /// transaction was written. The single-phase route then observes the key
    /// again and replays the winner; elsewhere it is answered like an
    /// unavailable store, `503` with `Retry-After`, safe to retry with the
    /// same key.
    #[error("the transaction lost to a concurrent one (deadlock or certification conflict)")]
    Conflict,
    /// The store's start-up check found that its claim does not exclude: a
    /// second connection was granted what a first one held (an advisory lock
    /// that always answers "granted", row locks that do not block). The
    /// store refuses to run rather than let duplicates execute twice.
    #[error("the store's claim does not exclude on this database, refusing to start: {0}")]
    ClaimUnsafe(String),
    /// Applying the key table's migrations failed.
    #[error("migration failed: {0}")]
    Migrate(String),
    /// Invalid configuration.
    #[error("configuration error: {0}")]
    Config(String),
    /// The endpoint's response body is larger than
    /// [`EngineConfig::max_response_bytes`](crate::EngineConfig::max_response_bytes),
    /// so it cannot be stored for replay. Answered `500 internal_error`
    /// with a detail naming the setting: like any 5xx nothing is stored,
    /// the endpoint's writes are rolled back and the key is free again.
    #[error(
        "the endpoint's response is larger than {limit} bytes (EngineConfig::max_response_bytes), \
         so it could not be stored for replay; nothing was stored and the key was released"
    )]
    ResponseTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// Any other failure inside the engine. Rendered as 500 without details.
    #[error("internal error: {0}")]
    Internal(String),
    /// The caller's `Request-Deadline-Ms` was spent before the request
    /// could start (clause `idem.deadline.spent`): answered `504
    /// deadline_exceeded`, nothing run and the key not claimed.
    #[error(
        "the caller's deadline (Request-Deadline-Ms) was spent before the request could start; nothing ran and the key was not claimed: send it again with the same Idempotency-Key once you have time left"
    )]
    DeadlineExceeded,
}

impl Error {
    /// The contract error code this error is answered with.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Unauthenticated => ErrorCode::Unauthenticated,
            Self::KeyMissing | Self::KeyMissingAt(_) => ErrorCode::IdempotencyKeyMissing,
            Self::KeyInvalid(_) => ErrorCode::IdempotencyKeyInvalid,
            Self::KeyMismatch => ErrorCode::IdempotencyKeyMismatch,
            Self::KeyInUse { .. } | Self::Fenced => ErrorCode::IdempotencyKeyInUse,
            Self::MalformedBody(_) => ErrorCode::MalformedBody,
            Self::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            Self::Failpoint(_) => ErrorCode::ValidationFailed,
            Self::DeadlineExceeded => ErrorCode::DeadlineExceeded,
            // The one classification: every store fault is the same 503.
            e if e.store_fault().is_some() => ErrorCode::UpstreamUnavailable,
            Self::Store(_)
            | Self::Conflict
            | Self::ClaimUnsafe(_)
            | Self::Migrate(_)
            | Self::Config(_)
            | Self::Internal(_)
            | Self::ResponseTooLarge { .. } => ErrorCode::InternalError,
        }
    }

    /// What kind of store unavailability this is, if it is one: the one
    /// place an engine error is classified. Its `503 upstream_unavailable`
    /// with `Retry-After` ([`Error::code`], [`Error::retry_after_secs`])
    /// and its `store_unavailable` outcome
    /// ([`Outcome::of_error`](crate::metrics::Outcome::of_error)) all ask
    /// this.
    pub fn store_fault(&self) -> Option<StoreFault> {
        match self {
            Self::Store(e) => StoreFault::of(e),
            Self::Conflict => Some(StoreFault::Locked),
            _ => None,
        }
    }

    /// The problem document for this error under `profile`.
    pub fn to_problem(&self, profile: Profile) -> Problem {
        let code = self.code();
        let detail = if let Some(fault) = self.store_fault() {
            fault.client_detail()
        } else if let Self::ResponseTooLarge { .. } = self {
            // Names the setting: the operator's fix, and the reason a retry
            // will fail the same way until it changes.
            self.to_string()
        } else if code == ErrorCode::InternalError {
            // Driver messages can carry SQL and schema names; they go to the
            // log, never to the client.
            "The server failed. Nothing was stored and the key was released: retry with the same Idempotency-Key.".to_owned()
        } else {
            self.to_string()
        };
        Problem::new(code, profile, detail)
    }

    /// The `Retry-After` seconds this error advertises, if any.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Self::KeyInUse { retry_after_secs } => Some(*retry_after_secs),
            Self::Fenced => Some(1),
            e if e.store_fault().is_some() => Some(STORE_RETRY_AFTER_SECS),
            _ => None,
        }
    }

    /// The response for this error under `profile`: a problem document,
    /// plus `Retry-After` where the error has one.
    pub fn into_response_in(self, profile: Profile) -> Response {
        let mut response =
            problem_response(&self.to_problem(profile), self.retry_after_secs(), &self);
        // What the metrics count this answer as (crate::metrics::Outcome::of_response).
        response
            .extensions_mut()
            .insert(crate::metrics::Outcome::of_error(&self));
        response
    }
}

/// Every driver error enters the library here (`?`), so each is counted
/// once in `idem_store_errors_total` by kind.
impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        crate::metrics::store_error(&e);
        Self::Store(e)
    }
}

/// `Retry-After` (seconds) on a 503 for an unavailable store: short,
/// because the store is usually back within seconds (a failover, a restart,
/// a lock released) and the answer itself was fast.
pub const STORE_RETRY_AFTER_SECS: u64 = 1;

/// Why the key store could not serve a request: the failures that are the
/// store's state rather than a bug, answered `503 upstream_unavailable` with
/// `Retry-After` instead of `500` (clause `idem.store.fail-closed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreFault {
    /// No connection within the bounded acquire time (the store is down,
    /// unreachable, or every connection is busy), or a statement ran past
    /// its time bound.
    Timeout,
    /// The connection failed or was refused, or the server is shutting
    /// down or starting.
    Unreachable,
    /// Another process holds the database's write lock past the busy bound
    /// (SQLite `SQLITE_BUSY`/`SQLITE_LOCKED`).
    Locked,
    /// The disk (or the database's quota) is full.
    DiskFull,
    /// The database is read-only (file permissions, a read-only mount, a
    /// standby server).
    ReadOnly,
}

impl StoreFault {
    /// Classifies a driver error; `None` for errors that are not the
    /// store's availability (a constraint violation, a bug in SQL).
    pub fn of(e: &sqlx::Error) -> Option<Self> {
        match e {
            sqlx::Error::PoolTimedOut => Some(Self::Timeout),
            sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => Some(Self::Unreachable),
            sqlx::Error::Database(db) => {
                #[cfg(feature = "mysql")]
                if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                    return Self::of_mysql(my.number());
                }
                let code = db.code()?;
                // Asked of the driver, not guessed from the code: many
                // SQLSTATEs are all digits too ("25006" read-only, "53100"
                // disk full) and would read as SQLite codes.
                #[cfg(feature = "postgres")]
                let postgres = db
                    .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                    .is_some();
                #[cfg(not(feature = "postgres"))]
                let postgres = false;
                if !postgres && let Ok(n) = code.parse::<i64>() {
                    // SQLite: (extended) result codes; the primary code is
                    // the low byte.
                    match n & 0xff {
                        5 | 6 => Some(Self::Locked),
                        8 => Some(Self::ReadOnly),
                        13 => Some(Self::DiskFull),
                        10 | 14 => Some(Self::Unreachable),
                        _ => None,
                    }
                } else {
                    // PostgreSQL: SQLSTATE.
                    match code.as_ref() {
                        "25006" => Some(Self::ReadOnly),
                        "53100" => Some(Self::DiskFull),
                        "57014" => Some(Self::Timeout),
                        "55P03" => Some(Self::Locked),
                        c if c.starts_with("08") || c.starts_with("53") => Some(Self::Unreachable),
                        "57P01" | "57P02" | "57P03" => Some(Self::Unreachable),
                        _ => None,
                    }
                }
            }
            _ => None,
        }
    }

    /// MySQL and MariaDB: by error number (their SQLSTATEs are mostly the
    /// catch-all `HY000`).
    #[cfg(feature = "mysql")]
    fn of_mysql(number: u16) -> Option<Self> {
        match number {
            // Lock wait timeout, deadlock victim (or Galera certification
            // conflict), NOWAIT refused: another transaction holds the rows.
            1205 | 1213 | 3572 => Some(Self::Locked),
            // --read-only / super_read_only, read-only transaction.
            1290 | 1792 | 1836 => Some(Self::ReadOnly),
            // Disk full, table full, cannot write a file, "Got error 28
            // (No space left on device) from storage engine".
            1021 | 1114 | 3 | 1030 => Some(Self::DiskFull),
            // MariaDB max_statement_time, MySQL max_execution_time,
            // statement interrupted.
            1969 | 3024 | 1317 => Some(Self::Timeout),
            // Server shutting down, too many connections, connection
            // killed, Galera node not ready ("WSREP has not yet prepared
            // node for application use"), server gone.
            1053 | 1040 | 1927 | 1047 | 2006 | 2013 => Some(Self::Unreachable),
            _ => None,
        }
    }

    /// Finds the store fault behind any error: `e` itself or one of its
    /// [`source`](std::error::Error::source)s that is a driver error
    /// ([`StoreFault::of`]) or this crate's [`Error`]
    /// ([`Error::store_fault`]). This is how an application's own error
    /// type (one wrapping `sqlx::Error` from its queries on the
    /// [`IdemTx`](crate::IdemTx), or this crate's `Error` from
    /// [`IdemTx::lock`](crate::IdemTx::lock)) is classified exactly like the
    /// engine's own errors, by [`problem_response`].
    pub fn find(e: &(dyn std::error::Error + 'static)) -> Option<Self> {
        // Bounded: a source chain is finite, but a buggy `source()` cycle
        // must not hang a request.
        let mut level: Option<&(dyn std::error::Error + 'static)> = Some(e);
        for _ in 0..32 {
            let current = level?;
            if let Some(ours) = current.downcast_ref::<Error>() {
                return ours.store_fault();
            }
            if let Some(driver) = current.downcast_ref::<sqlx::Error>() {
                return Self::of(driver);
            }
            level = current.source();
        }
        None
    }

    /// Marks `response` as answered for this fault, so the engine counts it
    /// as `store_unavailable` ([`Outcome::of_response`]) whoever built it.
    /// [`problem_response`] does this itself; an application rendering its
    /// errors some other way calls it for errors [`StoreFault::find`] finds
    /// a fault in.
    ///
    /// [`Outcome::of_response`]: crate::metrics::Outcome::of_response
    pub fn mark(self, response: &mut Response) {
        response.extensions_mut().insert(self);
    }

    /// A few words for logs and the client's `detail`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Timeout => "timed out",
            Self::Unreachable => "unreachable",
            Self::Locked => "locked by another process",
            Self::DiskFull => "out of disk space",
            Self::ReadOnly => "read-only",
        }
    }

    /// The problem `detail` a client gets: what happened and that a retry
    /// with the same key is safe, without the driver's text.
    pub fn client_detail(self) -> String {
        format!(
            "The key store is unavailable ({}). Nothing was stored and the key was not claimed: \
             retry with the same Idempotency-Key after Retry-After.",
            self.as_str()
        )
    }
}

impl std::fmt::Display for StoreFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

pub(crate) fn fault_suffix(e: &sqlx::Error) -> String {
    StoreFault::of(e).map_or_else(String::new, |f| format!(" (store {f})"))
}

/// Renders `problem` (and `Retry-After`), logging `cause` at ERROR for a
/// 5xx and at DEBUG otherwise. Public so an application's own error type can
/// answer in exactly the same shape.
///
/// When `cause` (or an error in its source chain) is a store fault
/// ([`StoreFault::find`]), the response is marked with it
/// ([`StoreFault::mark`]): a handler's own query on the request's
/// transaction that hit a locked, full, read-only or unreachable store is
/// counted `store_unavailable`, like the engine's own claim and commit.
pub fn problem_response(
    problem: &Problem,
    retry_after_secs: Option<u64>,
    cause: &(dyn std::error::Error + 'static),
) -> Response {
    if problem.status >= 500 {
        tracing::error!(error = %cause, "request failed");
    } else {
        tracing::debug!(error = %cause, code = %problem.code, "request rejected");
    }
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::to_vec(problem).unwrap_or_else(|_| {
        // Serialising a struct of strings and numbers cannot fail; keep a
        // valid document anyway rather than an empty body.
        br#"{"type":"about:blank","title":"Internal server error","status":500,"code":"internal_error","retryable":true}"#.to_vec()
    });
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(PROBLEM_CONTENT_TYPE),
    );
    if let Some(secs) = retry_after_secs {
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if let Some(fault) = StoreFault::find(cause) {
        fault.mark(&mut response);
    }
    response
}

/// Renders in the reference profile. The engine itself renders in the
/// profile it was configured with ([`Error::into_response_in`]).
impl IntoResponse for Error {
    fn into_response(self) -> Response {
        self.into_response_in(Profile::Reference)
    }
}

/// Result alias of the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;
