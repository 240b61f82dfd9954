//! Writes the golden backoff schedules to `client/vectors/backoff.json` (or the path given).

use std::path::PathBuf;

use anyhow::Context;

fn main() -> anyhow::Result<()> {
    let path = std::env::args_os().nth(1).map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("vectors/backoff.json"),
        PathBuf::from,
    );
    std::fs::write(&path, idem_client::vectors::render())
        .with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}
