//! `idem-fake-processor`: runs the fake payment processor.
//!
//! Thin by design: parse flags, set up logging, bind, announce the address
//! on stdout, serve until Ctrl-C.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use idem_fake_processor::{Processor, READY_LINE_PREFIX};
use tracing_subscriber::EnvFilter;

/// A fake external payment processor with durable state and fault injection.
#[derive(Debug, Parser)]
#[command(name = "idem-fake-processor", version, about)]
struct Cli {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
    /// SQLite database file holding charges and call counts.
    #[arg(long, default_value = "./processor.db")]
    db: PathBuf,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let bound = Processor::open(&cli.db)
        .await
        .with_context(|| format!("opening database {}", cli.db.display()))?
        .bind(cli.listen)
        .await
        .with_context(|| format!("binding {}", cli.listen))?;
    // Parents read this line to learn the port; it must be flushed now,
    // because stdout is a pipe and would otherwise be block-buffered.
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{READY_LINE_PREFIX}{}", bound.base_url())?;
    stdout.flush()?;
    drop(stdout);
    tracing::info!(addr = %bound.local_addr(), db = %cli.db.display(), "fake processor ready");
    bound
        .serve(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
