//! `idem-bench`: flags, then the library. `idem-bench serve-baseline -- ARGS`
//! is the baseline server the benchmark starts as a child process.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use idem_bench::{Config, StoreKind};

/// The idemkit benchmark (issue 13): the idempotency layer's cost.
#[derive(Debug, Parser)]
#[command(name = "idem-bench", version, about)]
struct Cli {
    /// One short round at c=16 and c=64 (a smoke run).
    #[arg(long)]
    quick: bool,
    /// Where to write the JSON result (the Markdown goes beside it);
    /// default bench-results/<timestamp>.json in the workspace.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Stores, comma-separated: sqlite, postgres, mysql.
    #[arg(long, value_delimiter = ',', value_parser = parse_store)]
    stores: Option<Vec<StoreKind>>,
    /// Concurrency levels, comma-separated.
    #[arg(long, value_delimiter = ',')]
    concurrency: Option<Vec<usize>>,
    /// Measured milliseconds per cell and round.
    #[arg(long)]
    duration_ms: Option<u64>,
    /// Rounds (medians are reported).
    #[arg(long)]
    rounds: Option<usize>,
    /// Callers (worker w acts as caller w % callers; 1 makes every
    /// transfer contend for the same two account rows).
    #[arg(long)]
    callers: Option<usize>,
    /// What to run, comma-separated: all (default), transfers, payments,
    /// minimal, durable, concurrent, stages, or single scenarios (first,
    /// replay, baseline, payments, processor, min-write, min-write-plain,
    /// min-none, min-none-plain, min-write-full, min-write-plain-full,
    /// baseline-full, first-full).
    #[arg(long, value_delimiter = ',')]
    scenarios: Option<Vec<String>>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Serve the baseline (POST /v1/transfers without the idempotency
    /// layer); ARGS are idem-server's flags.
    #[command(hide = true)]
    ServeBaseline {
        /// idem-server flags.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Serve the minimal app (issue 19: the library wired as its README
    /// says, routes with and without the layer); ARGS: see `minimal::MinimalArgs`.
    #[command(hide = true)]
    ServeMinimal {
        /// serve-minimal flags.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn parse_store(s: &str) -> Result<StoreKind, String> {
    match s {
        "sqlite" => Ok(StoreKind::Sqlite),
        "postgres" | "postgresql" | "pg" => Ok(StoreKind::Postgres),
        "mysql" | "mariadb" => Ok(StoreKind::MySql),
        other => Err(format!(
            "unknown store {other:?}: sqlite, postgres or mysql"
        )),
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Runtime::new()?;
    if let Some(Command::ServeMinimal { args }) = cli.command {
        use tracing_subscriber::Layer as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;
        let args = idem_bench::minimal::MinimalArgs::try_parse_from(
            std::iter::once("serve-minimal".to_owned()).chain(args),
        )?;
        let log = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .with_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn")),
            );
        let stages = args
            .stage_times
            .then(idem_bench::minimal::StageTimes::default);
        tracing_subscriber::registry()
            .with(log)
            .with(
                stages
                    .clone()
                    .map(|s| s.with_filter(idem_bench::minimal::StageTimes::filter())),
            )
            .init();
        rt.block_on(idem_bench::minimal::serve(args, stages))?;
        return Ok(());
    }
    if let Some(Command::ServeBaseline { args }) = cli.command {
        // The same logging as idem-server's main.
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn")),
            )
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
        rt.block_on(idem_bench::baseline::serve(args))?;
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    let mut cfg = if cli.quick {
        Config::quick(exe)
    } else {
        Config::full(exe)
    };
    if let Some(names) = &cli.scenarios {
        idem_bench::config::select(&mut cfg, names).map_err(anyhow::Error::msg)?;
    }
    if let Some(s) = cli.stores {
        cfg.stores = s;
    }
    if let Some(c) = cli.concurrency {
        cfg.ratio_concurrencies.retain(|r| c.contains(r));
        cfg.concurrencies = c;
    }
    if let Some(d) = cli.duration_ms {
        cfg.duration = Duration::from_millis(d);
    }
    if let Some(r) = cli.rounds {
        cfg.rounds = r.max(1);
    }
    if let Some(c) = cli.callers {
        cfg.callers = c.max(1);
    }
    if !cfg.release {
        eprintln!("WARNING: a debug build of idem-bench benchmarks debug servers; use --release");
    }
    let result = rt.block_on(idem_bench::run(&cfg, &|line: &str| eprintln!("{line}")))?;
    let out = cli.out.unwrap_or_else(|| {
        idem_bench::child::workspace_root()
            .join("bench-results")
            .join(format!(
                "{}.json",
                result.started_at.replace([':', '-'], "")
            ))
    });
    let md = idem_bench::write(&result, &out)?;
    println!("{}", idem_bench::report::markdown(&result));
    eprintln!(
        "wrote {} and {} ({:.0} s)",
        out.display(),
        md.display(),
        result.wall_s
    );
    Ok(())
}
