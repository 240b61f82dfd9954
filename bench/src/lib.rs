//! # idem-bench: what the idempotency layer costs
//!
//! The benchmarks of issues 13, 19 and 33. `cargo run --release -p idem-bench` builds
//! `idem-server` and `idem-fake-processor` (release), and for SQLite (a
//! temp file) and PostgreSQL (a throwaway cluster) starts them as child
//! processes with a baseline server, drives them with a closed-loop load
//! generator at several concurrencies, and prints and writes (JSON and
//! Markdown) throughput, p50/p99, statements, commits and CPU per request,
//! server memory, and issue 13's ratios with PASS/MISS.
//!
//! Scenarios (all `POST`, JSON bodies, one caller per worker):
//! - `first`: `/v1/transfers` with a fresh key per request;
//! - `replay`: the same with pre-warmed keys (every answer a replay);
//! - `baseline`: `/v1/transfers` without a key on the baseline server,
//!   the same handler and writes without the layer ([`baseline`]);
//! - `payments`: `/v1/payments` (multi-step, through the fake processor);
//! - `processor`: the fake processor's `POST /charges` alone;
//! - `min-write`, `min-write-plain`, `min-none`, `min-none-plain`: the
//!   [`minimal`] app (the library wired as its README says), a handler that
//!   writes one row or nothing, with and without the layer;
//! - `min-write-full`, `min-write-plain-full`, `first-full`,
//!   `baseline-full`: the minimal write pair and the transfer pair on
//!   SQLite with `synchronous = FULL` (issue 33's durable settings;
//!   PostgreSQL's cells already run on its default `fsync = on`);
//!
//! plus the timed concurrency scenario (150 first executions whose handler
//! spends 200 ms before its write, all at once) and the minimal app's
//! per-stage times (`--scenarios` picks any of these).
//!
//! Modules, in groups that use only the groups above them (no import
//! cycle; the report never sees the code that runs the benchmark):
//! - tools: [`load`] the load generator, [`child`] child processes and
//!   binaries, [`procfs`] CPU and memory from `/proc`, [`pg`] the throwaway
//!   cluster and its counters, [`mysql`] the shared MySQL server,
//!   [`sqlite_wal`] commits counted in SQLite's WAL;
//! - data: [`config`] (stores, scenarios, `--scenarios`, the run's
//!   [`Config`]), [`results`] (what a run measured, the targets' type);
//! - what is printed: [`targets`] PASS/MISS from the results, [`report`]
//!   the Markdown (formatting only);
//! - the apps under test: [`baseline`] the layer-less server, [`minimal`]
//!   the minimal app; [`apps`] starts them (and idem-server) for a session;
//! - what runs: [`scenario`] (one module per scenario family and pass),
//!   [`measure`] one timed cell and its summary, [`counting`] the SQLite
//!   counting pass, [`session`] one store, [`mod@run`] the whole run.
//!
//! Linux only (`/proc`).
//!
//! Nothing here asserts a timing: the benchmark reports, the reader judges.

pub mod apps;
pub mod baseline;
pub mod child;
pub mod config;
pub mod counting;
pub mod load;
pub mod measure;
pub mod minimal;
pub mod mysql;
pub mod pg;
pub mod procfs;
pub mod report;
pub mod results;
pub mod run;
pub mod scenario;
pub mod session;
pub mod sqlite_wal;
pub mod targets;

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Something the run needs could not be set up (a binary, a process,
    /// a database cluster).
    #[error("setup: {0}")]
    Setup(String),
    /// The run went wrong (a server answered what it should not).
    #[error("run: {0}")]
    Run(String),
    /// A database the benchmark reads counters from.
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    /// Building the application (baseline server).
    #[error("server: {0}")]
    Server(#[from] idem_server::Error),
}

impl Error {
    /// Whether this is a setup failure (PostgreSQL is then skipped, loudly,
    /// instead of failing the whole run).
    pub fn is_setup(&self) -> bool {
        matches!(self, Self::Setup(_) | Self::Db(_))
    }
}

/// This crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub use config::{Config, Scenario, StoreKind};
pub use results::BenchResult;
pub use run::run;

/// Writes `result` as JSON to `json` and as Markdown beside it (`.md`).
pub fn write(result: &BenchResult, json: &std::path::Path) -> Result<std::path::PathBuf> {
    let io = |e: std::io::Error| Error::Setup(format!("writing {}: {e}", json.display()));
    if let Some(dir) = json.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let text = serde_json::to_string_pretty(result)
        .map_err(|e| Error::Run(format!("serializing the result: {e}")))?;
    std::fs::write(json, text).map_err(io)?;
    let md = json.with_extension("md");
    std::fs::write(&md, report::markdown(result)).map_err(io)?;
    Ok(md)
}
