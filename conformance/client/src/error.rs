//! The one error type of the client check.

/// What can stop the client check itself (as opposed to the client under
/// test, whose failures are verdicts).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The fault server could not be started.
    #[error("fault server: {0}")]
    FaultServer(String),
    /// The check could not run as asked (bad options, a run that panicked).
    #[error("client check: {0}")]
    Check(String),
}
