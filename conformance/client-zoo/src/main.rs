//! `idem-client-zoo`: one state-changing call through one zoo client, for the conformance kit's
//! `client --run` (which sets `IDEM_BASE_URL`). Exits 0 iff the call finally got a 2xx (and the
//! client took it for a success: `exits-1-after-success` does not), 1 when it did not, 2 on a
//! usage error.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use idem_client_zoo::{ZooClient, call};

/// One POST of {"amount":1000} to $IDEM_BASE_URL/payments through one client of the zoo.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The client: conforming (idem-client), no-jitter, fresh-key-per-attempt, retries-400,
    /// ignores-retry-after, no-attempt-cap, deadline-reset-per-attempt,
    /// resends-keyless-after-reset, no-key, retries-409, long-hint-no-deadline,
    /// no-deadline-short-hang, zero-backoff-after-reset, narrow-jitter, exits-1-after-success,
    /// key-in-body (run the kit with --key-pointer /idempotency_key), tracing-id-only,
    /// slow-start, resets-uncounted.
    #[arg(long)]
    client: ZooClient,
    /// Seeds the jitter, to replay a run's delays. Omit it under the kit: its jitter test needs
    /// runs that differ, so each run then draws a fresh seed.
    #[arg(long)]
    seed: Option<u64>,
}

fn main() -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args = Args::parse();
    let base_url = match std::env::var("IDEM_BASE_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => {
            eprintln!(
                "idem-client-zoo: IDEM_BASE_URL is not set; the conformance kit sets it when it \
                 runs this command (by hand: IDEM_BASE_URL=http://127.0.0.1:8080)"
            );
            return Ok(ExitCode::from(2));
        }
    };
    let seed = args.seed.unwrap_or_else(rand::random);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let ok = runtime.block_on(call(args.client, &base_url, seed));
    tracing::info!(client = %args.client, seed, ok, "done");
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "idem-client-zoo: {} failed the call (no 2xx, or a 2xx it could not parse)",
            args.client
        );
        ExitCode::FAILURE
    })
}
