//! # idem-conformance-core: the verdict core of the idemkit conformance kit
//!
//! The kit has two checks: the server check (crate `idem-conformance`, which
//! also holds the CLI) judges an HTTP API black-box, and the client check
//! (crate `idem-conformance-client`) judges an SDK's retries against a
//! fault-injecting API. Both judge the same contract, so everything that
//! turns observations into a result lives here, once:
//!
//! - [`clause`](mod@clause): clause IDs checked against the contract at compile time
//!   ([`clause!`]);
//! - [`verdict`]: **the severity rule** and the verdict of one check;
//! - [`waivers`]: waiver matching and staleness;
//! - [`summary`]: the clause matrix, the headlines, the summary and the one
//!   result with its exit code;
//! - [`report`]: the console, JSON, JUnit and HTML writers.
//!
//! Why three crates and not three modules: the core knows nothing of HTTP,
//! manifests or child processes, and the compiler now keeps it that way;
//! neither check can reach into the other, so they cannot grow a second
//! verdict mapping or an import circle between them.
//!
//! ## The severity rule
//!
//! A failed check is **safety** when the behaviour it observed can make a
//! correct counterpart believe something false about effects: a second
//! effect of one operation (on the client side: a key-less state-changing
//! request resent after it may have been sent, a fresh key per attempt),
//! another request's stored answer replayed for a different request, or one
//! caller's data shown to another. Everything else that breaks a MUST is
//! **semantics** (a stored 5xx replayed, a final 4xx executed again or
//! retried with its key, an ignored hint, a missing deadline), and a
//! spelling the counterpart may misread is **interop**. The rule is
//! [`verdict::Consequence`]: a check names the consequence it observed, and
//! its class follows from that, never worse than its clause's own class.

pub mod clause;
mod error;
pub mod report;
pub mod summary;
pub mod verdict;
pub mod waivers;

pub use error::Error;

/// The kit's version, recorded in every report.
pub const KIT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Exit code when no MUST clause failed: CONFORMS.
pub const EXIT_CONFORMS: i32 = 0;
/// Exit code when a MUST clause failed with a safety consequence (unwaived):
/// UNSAFE. Also `replay`'s "still fails".
pub const EXIT_UNSAFE: i32 = 1;
/// Exit code for harness errors (bad manifest, failed preflight,
/// unreachable target, budget spent, a case that errored) when nothing
/// unsafe was found.
pub const EXIT_HARNESS: i32 = 2;
/// Exit code when only semantics or interop MUST failures were found:
/// DEVIATES.
pub const EXIT_DEVIATES: i32 = 3;

/// A fresh run ID (`idemconf-` and ten hex digits), recorded in the report
/// and woven into the keys and markers a run sends.
pub fn run_id() -> String {
    format!(
        "idemconf-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}
