//! `idem-server`: parse flags, set up logging, run the library.

use std::io::IsTerminal;

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = idem_server::config::Cli::parse();
    if let Some(path) = &cli.write_openapi {
        idem_server::api::openapi::write(&cli, path)?;
        return Ok(());
    }
    // Logs go to stderr so stdout stays the machine-readable announcement.
    // Colour only on a terminal: escape codes in a log file or a journal
    // are noise that breaks grep. NO_COLOR (no-color.org) switches it off
    // on a terminal too.
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .init();
    idem_server::app::serve(cli).await?;
    Ok(())
}
