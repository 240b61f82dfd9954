//! The one error type of the verdict core.

/// What can go wrong while rendering a report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A report could not be rendered.
    #[error("report: {0}")]
    Report(String),
}
