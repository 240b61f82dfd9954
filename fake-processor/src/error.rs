//! The one error type of the crate: storage, the HTTP client and the child
//! process helper.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

/// Everything the library can fail with. Request handling never returns it
/// to a caller as-is: the server turns it into a problem document.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// The SQLite database failed (open, query, constraint).
    #[error("processor database error: {0}")]
    Database(#[from] sqlx::Error),
    /// Applying the embedded migrations failed.
    #[error("processor migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A socket or process I/O operation failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// An HTTP request from [`crate::ProcessorClient`] failed in transport or decoding.
    #[error("HTTP client error: {0}")]
    Http(#[from] reqwest::Error),
    /// The processor answered with a status the client did not expect.
    #[error("processor answered {status} to {what}: {body}")]
    UnexpectedStatus {
        /// What the client was doing.
        what: &'static str,
        /// The HTTP status received.
        status: u16,
        /// The response body, for the test log.
        body: String,
    },
    /// A child processor could not be started.
    #[error("could not start {binary:?}: {source}")]
    Spawn {
        /// The binary that was run.
        binary: PathBuf,
        /// Why the OS refused.
        source: std::io::Error,
    },
    /// The child did not print its `listening on` line in time.
    #[error("processor child did not report its address within {0:?}")]
    StartTimeout(Duration),
    /// The child exited (or closed stdout) before reporting its address.
    #[error("processor child exited before it was ready ({status})")]
    ChildExited {
        /// The exit status, or a note when it could not be read.
        status: String,
    },
    /// The child printed a `listening on` line that does not hold a URL.
    #[error("processor child printed an unreadable ready line: {0:?}")]
    BadReadyLine(String),
    /// Building the processor binary with cargo failed (see [`crate::binary`]).
    #[error("could not build the idem-fake-processor binary: {0}")]
    Build(String),
    /// A `Processor-Behavior` header value or control request is invalid.
    #[error("invalid behaviour: {0}")]
    InvalidBehavior(String),
}
