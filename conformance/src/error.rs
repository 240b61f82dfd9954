//! The one error type of the kit's library.

use std::path::PathBuf;

/// Everything the harness itself can get wrong (as opposed to the target,
/// whose failures are verdicts, not errors).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The manifest is not valid TOML for the manifest schema.
    #[error("manifest {path}: {message}")]
    ManifestParse {
        /// The manifest file.
        path: String,
        /// The parser's message, with line and column.
        message: String,
    },
    /// The manifest parsed but breaks a rule the schema cannot express.
    #[error("manifest: {0}")]
    ManifestInvalid(String),
    /// A replay file could not be read.
    #[error("replay file {path}: {message}")]
    ReplayFile {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// An HTTP client could not be built or a request could not be formed.
    #[error("http: {0}")]
    Http(String),
    /// The run would exceed the manifest's side-effect budget.
    #[error("side-effect budget of {budget} state-changing requests exhausted")]
    BudgetExhausted {
        /// The declared budget.
        budget: u64,
    },
    /// The reference server (demo) could not be built or started.
    #[error("reference server: {0}")]
    Server(String),
    /// The preflight found the manifest and the target disagree; no case
    /// ran. The message is one sentence saying what to fix.
    #[error("preflight: {0}")]
    Preflight(String),
    /// The client check could not run the client under test as asked.
    #[error("client: {0}")]
    Client(String),
    /// The client check itself failed.
    #[error(transparent)]
    ClientCheck(#[from] idem_conformance_client::Error),
    /// A seeded manifest could not be rendered.
    #[error("seeding: {0}")]
    Seed(String),
    /// The run itself broke (a case's task panicked).
    #[error("run: {0}")]
    Run(String),
    /// A report could not be rendered.
    #[error(transparent)]
    Report(#[from] idem_conformance_core::Error),
}
