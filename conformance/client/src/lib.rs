//! # idem-conformance-client: the client check of the idemkit conformance kit
//!
//! The client check: `idem-conformance client --run 'COMMAND'` judges any
//! SDK's retry behaviour against the contract's client clauses
//! (`idem.client.*`, book chapter "Client guidance and SDK defaults").
//!
//! The kit serves a fault-injecting HTTP/1 API on 127.0.0.1 ([`server`]),
//! one server per run, scripted by a [`scenario`]; runs the client under
//! test ([`runner::ClientUnderTest`]: a shell command told only
//! `IDEM_BASE_URL`, or an in-process async closure) once per scenario run,
//! in parallel (a few starting at a time), bounded in time and requests;
//! records every attempt ([`record`]); judges the records with pure
//! functions ([`judge`]) through the verdict core's severity rule; and
//! redacts every secret of the command, its environment and the recorded
//! headers from the report ([`redact`]). Where the key travels is an option
//! ([`record::KeySource`]: a header, or a JSON pointer into the body); a
//! tracing id is never taken for one.
//! The result is the kit's one [`idem_spec::report::Report`], rendered by
//! the same console, JSON, JUnit and HTML renderers as the server check,
//! with the same UNSAFE / DEVIATES / CONFORMS result and exit codes.

mod error;
pub mod judge;
pub mod record;
pub mod redact;
pub mod runner;
pub mod scenario;
pub mod server;

pub use error::Error;
pub use record::KeySource;
pub use runner::{ClientOptions, ClientRun, ClientUnderTest, ShellCommand, run};
