//! Writes the golden backoff schedules to `client/vectors/backoff.json`, the book's worked
//! schedule to `book/src/sim/backoff-schedule.md` and the client's decision table to
//! `book/src/tables/client-decisions.md`.
//!
//! No `anyhow` here: this binary ships without the `sim` feature, and an I/O error with its path
//! is all it can report.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    for (rel, text) in [
        (
            idem_client::vectors::VECTORS_PATH,
            idem_client::vectors::render(),
        ),
        (
            idem_client::vectors::SCHEDULE_TABLE_PATH,
            idem_client::vectors::schedule_markdown(),
        ),
        (
            idem_client::decisions::DECISIONS_TABLE_PATH,
            idem_client::decisions::markdown(),
        ),
    ] {
        let path = root.join(rel);
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("idem-client-vectors: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {rel}");
    }
    ExitCode::SUCCESS
}
