//! Writes the golden backoff schedules to `client/vectors/backoff.json` and the book's worked
//! schedule to `book/src/sim/backoff-schedule.md`.

use std::path::PathBuf;

use anyhow::Context;

fn main() -> anyhow::Result<()> {
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
    ] {
        let path = root.join(rel);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {rel}");
    }
    Ok(())
}
