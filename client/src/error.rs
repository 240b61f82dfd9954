//! The one error type of `idem-client`.

#[cfg(feature = "sim")]
use std::path::PathBuf;
use std::time::Duration;

use idem_spec::IdempotencyKey;
use thiserror::Error;

use crate::policy::StopReason;

/// Everything the client and the simulator report as an error.
///
/// Through the reqwest middleware these arrive wrapped in
/// `reqwest_middleware::Error::Middleware`; `err.downcast_ref::<idem_client::Error>()` recovers
/// them.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// The server's `Retry-After` lands past the deadline, so the client failed at once instead
    /// of sleeping into a certain timeout (clause `idem.client.retry-after`).
    #[error(
        "the server asked to retry after {hint:?}, but only {remaining:?} of the deadline remain (attempt {attempts})"
    )]
    RetryAfterPastDeadline {
        /// The server's hint, as a delay.
        hint: Duration,
        /// What was left of the deadline when the hint arrived.
        remaining: Duration,
        /// Attempts made.
        attempts: u32,
        /// The operation's key, so the caller can retry later with the same one.
        key: Option<IdempotencyKey>,
        /// The status that carried the hint.
        status: u16,
    },
    /// The last attempt failed at the transport level and the client stopped retrying.
    #[error("gave up after {attempts} attempt(s): {reason}")]
    GaveUp {
        /// Why no further attempt was made.
        reason: StopReason,
        /// Attempts made.
        attempts: u32,
        /// The operation's key, so the caller can retry later with the same one.
        key: Option<IdempotencyKey>,
        /// The last transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The deadline had already passed before an attempt could start.
    #[error("the operation's deadline passed before attempt {attempt} could start")]
    DeadlineExceeded {
        /// The attempt that could not start (1-based).
        attempt: u32,
        /// The operation's key.
        key: Option<IdempotencyKey>,
    },
    /// A caller-supplied or derived key is not a valid `Idempotency-Key`.
    #[error("{key:?} is not a valid idempotency key: {source}")]
    InvalidKey {
        /// The rejected text.
        key: String,
        /// Why the spec crate rejected it.
        #[source]
        source: idem_spec::Error,
    },
    /// Reading or writing a simulator artifact failed.
    #[cfg(feature = "sim")]
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Drawing a plot failed.
    #[cfg(feature = "sim")]
    #[error("plotting {what}: {message}")]
    Plot {
        /// Which plot.
        what: String,
        /// The backend's message.
        message: String,
    },
    /// A simulator configuration is unusable.
    #[cfg(feature = "sim")]
    #[error("invalid simulator configuration: {0}")]
    Config(String),
}

impl Error {
    /// The idempotency key of the operation that failed, when it had one. Store it with the
    /// operation: retrying later with the same key is safe for as long as the server's replay
    /// window lasts, even when this error leaves the outcome unknown.
    pub fn key(&self) -> Option<&IdempotencyKey> {
        match self {
            Error::RetryAfterPastDeadline { key, .. }
            | Error::GaveUp { key, .. }
            | Error::DeadlineExceeded { key, .. } => key.as_ref(),
            _ => None,
        }
    }
}
