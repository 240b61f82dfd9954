//! `idem-zoo`: runs one zoo target until interrupted, for trying the kit by
//! hand. The first stdout line is `listening on http://ADDR`.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use idem_zoo::{Defect, Dialect, Quirk, ZooConfig};

/// A hermetic idempotency target speaking one wire dialect, optionally with one defect.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Wire dialect: reference, plain-json-422, plain-json-417, plain-json-400.
    #[arg(long, default_value = "reference")]
    dialect: Dialect,
    /// One deliberate defect (see the crate README); none when omitted.
    #[arg(long)]
    defect: Option<Defect>,
    /// One correct but unusual behaviour (see the crate README); none when omitted.
    #[arg(long)]
    quirk: Option<Quirk>,
    /// How long each handler run works before answering, in milliseconds.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Address to listen on; port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber_init();
    let args = Args::parse();
    let config = ZooConfig {
        dialect: args.dialect,
        defect: args.defect,
        delay: Duration::from_millis(args.delay_ms),
        quirk: args.quirk,
    };
    let zoo = idem_zoo::spawn_at(config, args.listen)
        .await
        .context("starting the zoo")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening on {}", zoo.base_url)?;
    out.flush()?;
    drop(out);
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    zoo.shutdown().await;
    Ok(())
}

/// Logs go to stderr (filter with `RUST_LOG`) so stdout's first line stays
/// the address.
fn tracing_subscriber_init() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
}
