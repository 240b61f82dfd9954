//! `idem-sim`: the fleet simulator. Reproduces Brooker's 2015 backoff-and-jitter experiment and
//! an outage with and without a retry budget, prints the tables, and writes the tables and SVG
//! plots the book shows (`book/src/sim/`).
//!
//! ```text
//! cargo run --release -p idem-client --features sim --bin idem-sim            # full run, rewrites book/src/sim
//! cargo run --release -p idem-client --features sim --bin idem-sim -- --check # fail if the committed files are stale
//! ```

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Parser;
use idem_client::sim::{self, brooker, outage};

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "Fleet retry simulator: Brooker 2015 and an outage with and without a retry budget"
)]
struct Args {
    /// Folder for the Markdown tables and SVG plots (default: the book's `src/sim`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Compare with the files in the output folder instead of writing them; exit 1 when stale.
    #[arg(long)]
    check: bool,
    /// Print the tables only; write nothing.
    #[arg(long)]
    no_write: bool,
    /// Worker threads for the Brooker sweep (the result does not depend on it).
    #[arg(long, default_value_t = default_threads())]
    threads: usize,
    /// Override the runs per Brooker cell (default 100, as in the post).
    #[arg(long)]
    runs: Option<u32>,
    /// Run, print and write (or check) only the outage and restart scenarios: seconds in a
    /// debug build, where the full Brooker sweep takes many minutes.
    #[arg(long)]
    outages_only: bool,
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(2, usize::from)
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let out = args.out.clone().unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(sim::BOOK_SIM_DIR)
    });

    let mut full = brooker::BrookerConfig::default();
    if let Some(runs) = args.runs {
        full.runs = runs;
    }
    let started = Instant::now();
    let t = Instant::now();
    let mut artifacts = Vec::new();
    if !args.outages_only {
        let b = brooker::run(&full, args.threads);
        println!("# Brooker 2015 (exponential backoff and jitter)\n");
        println!("{}", brooker::markdown(&b));
        artifacts.extend(sim::brooker_artifacts(&b, "brooker")?);
    }
    let brooker_secs = t.elapsed().as_secs_f64();

    let t = Instant::now();
    if !args.outages_only {
        let quick = brooker::run(&brooker::BrookerConfig::quick(), args.threads);
        artifacts.extend(sim::brooker_artifacts(&quick, "quick/brooker")?);
    }
    let o = outage::run(&outage::OutageConfig::default());
    let restart = outage::run(&outage::OutageConfig::restart());
    let rest_secs = t.elapsed().as_secs_f64();
    println!("# Outage: retry amplification with and without a budget\n");
    println!("{}", outage::markdown(&o));
    println!("# Restart: connections refused, with and without a budget\n");
    println!("{}", outage::markdown(&restart));

    artifacts.extend(sim::outage_artifacts(&o)?);
    artifacts.extend(sim::outage_artifacts_named(&restart, "restart")?);
    let total = started.elapsed().as_secs_f64();
    eprintln!(
        "simulated in {total:.1} s (Brooker sweep {brooker_secs:.1} s on {} thread(s), quick sweep + outage {rest_secs:.1} s)",
        args.threads
    );

    if args.check {
        let stale = sim::stale(&out, &artifacts);
        if !stale.is_empty() {
            bail!(
                "stale in {}: {}; rerun `cargo run --release -p idem-client --features sim --bin idem-sim`",
                out.display(),
                stale.join(", ")
            );
        }
        eprintln!("{} files in {} are current", artifacts.len(), out.display());
    } else if !args.no_write {
        sim::write(&out, &artifacts).with_context(|| format!("writing {}", out.display()))?;
        eprintln!("wrote {} files to {}", artifacts.len(), out.display());
    }
    Ok(())
}
