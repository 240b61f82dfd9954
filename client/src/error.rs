//! The error type of `idem-client`, and the cause it carries when an attempt got no response.

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
    /// The last attempt got no response (a transport error or its timeout) and the client
    /// stopped retrying. When a response did arrive, the middleware hands it back instead, with
    /// the same reason in its [`RetryReport`](crate::RetryReport), whatever its status.
    #[error("gave up after {attempts} attempt(s): {reason}")]
    GaveUp {
        /// Why no further attempt was made.
        reason: StopReason,
        /// Attempts made.
        attempts: u32,
        /// The operation's key, so the caller can retry later with the same one.
        key: Option<IdempotencyKey>,
        /// Why the last attempt got no response.
        #[source]
        source: AttemptError,
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

/// Why an attempt got no response.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum AttemptError {
    /// reqwest failed: connection refused or lost, the client's own timeout, a protocol error.
    #[error(transparent)]
    Transport(reqwest::Error),
    /// The attempt's timeout (the least of `attempt_timeout` and what was left of the deadline)
    /// fired before a response arrived.
    #[error("no response within the attempt timeout of {0:?}")]
    TimedOut(Duration),
}

impl AttemptError {
    /// Whether the attempt ran out of time (the middleware's timeout or the client's own).
    pub fn is_timeout(&self) -> bool {
        match self {
            AttemptError::Transport(e) => e.is_timeout(),
            AttemptError::TimedOut(_) => true,
        }
    }

    /// The reqwest error, when reqwest reported one.
    pub fn reqwest(&self) -> Option<&reqwest::Error> {
        match self {
            AttemptError::Transport(e) => Some(e),
            AttemptError::TimedOut(_) => None,
        }
    }
}

impl Error {
    /// The idem-client error inside an error of a `reqwest_middleware` client, if it is one
    /// (the middleware's errors arrive as `reqwest_middleware::Error::Middleware`).
    pub fn from_middleware(err: &reqwest_middleware::Error) -> Option<&Error> {
        match err {
            reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<Error>(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }

    /// The idempotency key of the operation that failed, when it had one. Store it with the
    /// operation: retrying later with the same key is safe for as long as the server's replay
    /// window lasts, even when this error leaves the outcome unknown.
    pub fn key(&self) -> Option<&IdempotencyKey> {
        match self {
            Error::GaveUp { key, .. } | Error::DeadlineExceeded { key, .. } => key.as_ref(),
            _ => None,
        }
    }

    /// Attempts made before the error, when any were.
    pub fn attempts(&self) -> Option<u32> {
        match self {
            Error::GaveUp { attempts, .. } => Some(*attempts),
            Error::DeadlineExceeded { attempt, .. } => Some(attempt.saturating_sub(1)),
            _ => None,
        }
    }
}
