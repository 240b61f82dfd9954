//! The crate's one error type and the one place errors become HTTP.
//!
//! Every error the server's own code returns, from a missing bearer token
//! to a database outage, is an [`Error`] turned into an RFC 9457
//! `application/problem+json` document by the single
//! [`IntoResponse`](axum::response::IntoResponse) impl below (clause
//! `idem.errors.problem-json`), in the same shape as the idempotency
//! engine's own answers (`axum_idempotency::error::problem_response`).
//! Nothing else in the crate builds an error response by hand, so no error
//! can escape without a `code`.
//!
//! Status codes and wire codes depend on the profile the server was started
//! with (`--profile`). `IntoResponse` cannot take arguments, so the profile
//! travels in a task-local set once per request by the router's outermost
//! middleware ([`with_profile`]); outside that scope the reference profile
//! applies.

use std::future::Future;

use axum::response::{IntoResponse, Response};
use axum_idempotency::StoreFault;
use axum_idempotency::error::{STORE_RETRY_AFTER_SECS, problem_response};
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
    /// The idempotency engine failed or refused (a database error inside
    /// it, a settled transaction, ...), rendered exactly as the engine
    /// renders its own answers. Not `transparent`: the engine's error stays
    /// in the source chain, where [`StoreFault::find`] classifies it.
    #[error("{0}")]
    Idempotency(#[from] axum_idempotency::Error),
    /// The payment processor declined: a final outcome, stored and replayed
    /// (clause `idem.failure.final-outcomes`).
    #[error("{0}")]
    PaymentDeclined(String),
    /// A foreign system the request needs did not answer usefully. Never
    /// stored: the key stays at its last recovery point and a retry with the
    /// same key resumes there.
    #[error("{detail}")]
    UpstreamUnavailable {
        /// What was unavailable.
        detail: String,
        /// Seconds advertised in `Retry-After`.
        retry_after_secs: u64,
    },
    /// The endpoint exists but this server was started without what it
    /// needs (e.g. `/v1/payments` without `--processor-url`).
    #[error("{0}")]
    NotConfigured(String),
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
            Self::Idempotency(e) => e.code(),
            Self::MalformedBody(_) => ErrorCode::MalformedBody,
            Self::UnsupportedMediaType(_) => ErrorCode::UnsupportedMediaType,
            Self::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            Self::Validation(_) => ErrorCode::ValidationFailed,
            Self::NotFound(_) => ErrorCode::NotFound,
            Self::MethodNotAllowed => ErrorCode::MethodNotAllowed,
            Self::PaymentDeclined(_) => ErrorCode::PaymentDeclined,
            Self::UpstreamUnavailable { .. } | Self::NotConfigured(_) => {
                ErrorCode::UpstreamUnavailable
            }
            e if e.store_fault().is_some() => ErrorCode::UpstreamUnavailable,
            Self::Store(_)
            | Self::Migrate(_)
            | Self::Config(_)
            | Self::Io(_)
            | Self::Internal(_) => ErrorCode::InternalError,
        }
    }

    /// The problem document for this error under `profile`.
    pub fn to_problem(&self, profile: Profile) -> Problem {
        if let Self::Idempotency(e) = self {
            return e.to_problem(profile);
        }
        let code = self.code();
        let detail = if let Some(fault) = self.store_fault() {
            fault.client_detail()
        } else if code == ErrorCode::InternalError {
            // Driver messages can carry SQL and schema names; they go to the
            // log, never to the client.
            "The server failed. Nothing was stored and the key was released: retry with the same Idempotency-Key.".to_owned()
        } else {
            self.to_string()
        };
        Problem::new(code, profile, detail)
    }
}

impl Error {
    /// The store unavailability behind this error, if it is one (answered
    /// 503 `upstream_unavailable` with `Retry-After`, counted
    /// `store_unavailable`): the engine's one classification
    /// ([`StoreFault::find`]), for the server's own queries as for the
    /// engine's errors.
    pub fn store_fault(&self) -> Option<StoreFault> {
        StoreFault::find(self)
    }

    /// The `Retry-After` seconds this error advertises, if any.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Self::Idempotency(e) => e.retry_after_secs(),
            e if e.store_fault().is_some() => Some(STORE_RETRY_AFTER_SECS),
            Self::UpstreamUnavailable {
                retry_after_secs, ..
            } => Some(*retry_after_secs),
            _ => None,
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let problem = self.to_problem(current_profile());
        problem_response(&problem, self.retry_after_secs(), &self)
    }
}

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
