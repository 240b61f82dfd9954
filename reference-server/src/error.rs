//! The crate's one error type and the one place errors become HTTP.
//!
//! Every error the server returns, from a missing bearer token to a
//! database outage, is an [`Error`] turned into an RFC 9457
//! `application/problem+json` document by the single
//! [`IntoResponse`](axum::response::IntoResponse) impl below (clause
//! `idem.errors.problem-json`). Nothing else in the crate builds an error
//! response by hand, so no error can escape without a `code`.
//!
//! Status codes and wire codes depend on the profile the server was started
//! with (`--profile`). `IntoResponse` cannot take arguments, so the profile
//! travels in a task-local set once per request by the router's outermost
//! middleware ([`with_profile`]); outside that scope the reference profile
//! applies.

use std::future::Future;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idem_spec::problem::PROBLEM_CONTENT_TYPE;
use idem_spec::{ErrorCode, Problem, Profile};

tokio::task_local! {
    static PROFILE: Profile;
}

/// Runs `fut` with `profile` as the profile every [`Error`] is rendered in.
pub async fn with_profile<F: Future>(profile: Profile, fut: F) -> F::Output {
    PROFILE.scope(profile, fut).await
}

/// The profile of the request being served (reference outside a request).
pub fn current_profile() -> Profile {
    PROFILE.try_with(|p| *p).unwrap_or_default()
}

/// Everything that can go wrong in `idem-server`, at start-up or while
/// serving a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No `Authorization: Bearer` header, or a token that maps to no caller.
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// An idempotent endpoint got no `Idempotency-Key` header.
    #[error(
        "this endpoint requires an Idempotency-Key header; send one key per logical operation and reuse it on every retry"
    )]
    KeyMissing,
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
    /// The body is not valid for its media type (e.g. broken JSON).
    #[error("{0}")]
    MalformedBody(String),
    /// The body's media type is not accepted by the endpoint.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The body is larger than the configured limit.
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The body parsed but breaks the endpoint's rules.
    #[error("{0}")]
    Validation(String),
    /// The resource does not exist for this caller.
    #[error("{0}")]
    NotFound(String),
    /// The path exists but not with this method.
    #[error("this method is not allowed on this path")]
    MethodNotAllowed,
    /// A database call failed. Rendered as 500 without the driver's text.
    #[error("database error: {0}")]
    Store(#[from] sqlx::Error),
    /// Applying the schema migrations failed at start-up.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A commit carried an older fencing generation than the key's current
    /// one: another worker took the key over, so this one's writes were
    /// refused and rolled back (clause `idem.lease.fencing`).
    #[error("the lease on this key was taken over by another worker; its outcome will be replayed")]
    Fenced,
    /// Invalid configuration (flags or tokens file).
    #[error("configuration error: {0}")]
    Config(String),
    /// I/O at start-up (binding the port, reading a file).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// Any other server-side failure. Rendered as 500 without details.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// The contract error code this error is answered with.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Unauthenticated(_) => ErrorCode::Unauthenticated,
            Self::KeyMissing => ErrorCode::IdempotencyKeyMissing,
            Self::KeyInvalid(_) => ErrorCode::IdempotencyKeyInvalid,
            Self::KeyMismatch => ErrorCode::IdempotencyKeyMismatch,
            Self::KeyInUse { .. } | Self::Fenced => ErrorCode::IdempotencyKeyInUse,
            Self::MalformedBody(_) => ErrorCode::MalformedBody,
            Self::UnsupportedMediaType(_) => ErrorCode::UnsupportedMediaType,
            Self::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            Self::Validation(_) => ErrorCode::ValidationFailed,
            Self::NotFound(_) => ErrorCode::NotFound,
            Self::MethodNotAllowed => ErrorCode::MethodNotAllowed,
            Self::Store(_)
            | Self::Migrate(_)
            | Self::Config(_)
            | Self::Io(_)
            | Self::Internal(_) => ErrorCode::InternalError,
        }
    }

    /// The problem document for this error under `profile`.
    pub fn to_problem(&self, profile: Profile) -> Problem {
        let code = self.code();
        let detail = if code == ErrorCode::InternalError {
            // Driver messages can carry SQL and schema names; they go to the
            // log, never to the client.
            "The server failed. Nothing was stored and the key was released: retry with the same Idempotency-Key.".to_owned()
        } else {
            self.to_string()
        };
        Problem::new(code, profile, detail)
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let profile = current_profile();
        let problem = self.to_problem(profile);
        if problem.status >= 500 {
            tracing::error!(error = %self, "request failed");
        } else {
            tracing::debug!(error = %self, code = %problem.code, "request rejected");
        }
        let status =
            StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&problem).unwrap_or_else(|_| {
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
        if let Self::KeyInUse { retry_after_secs } = self {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
        } else if let Self::Fenced = self {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(1u64));
        }
        response
    }
}

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
