//! The one error type of the crate: storage and the HTTP client.

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
    /// A `Processor-Behavior` header value or control request is invalid.
    #[error("invalid behaviour: {0}")]
    InvalidBehavior(String),
}
