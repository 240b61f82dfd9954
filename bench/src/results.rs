//! What a run measured: the result types every other module fills in or
//! reads ([`BenchResult`] down to one [`Round`]), and the [`Target`]s.
//! Plain data, so the report depends on these and never on the code that
//! runs the benchmark.

use serde::Serialize;

use crate::config::{Config, Scenario, StoreKind};
use crate::load::LoadResult;
use crate::pg::{PgCounters, StatementTotals};

/// One round of one cell.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    /// The load generator's figures.
    pub load: LoadResult,
    /// CPU ticks of the process serving the cell.
    pub server_ticks: u64,
    /// CPU ticks of the PostgreSQL cluster's processes.
    pub db_ticks: Option<u64>,
    /// CPU ticks of the load generator (this process).
    pub client_ticks: u64,
    /// PostgreSQL counter deltas.
    pub pg: Option<PgCounters>,
    /// PostgreSQL: each statement's calls and execution time in the cell.
    pub statements: Vec<StatementTotals>,
}

/// Per-request figures of a cell (all rounds together).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PerRequest {
    /// Statements per request (PostgreSQL: pg_stat_statements; SQLite: the
    /// counting pass).
    pub statements: Option<f64>,
    /// Write transactions (commits) per request.
    pub commits: Option<f64>,
    /// PostgreSQL WAL bytes per request.
    pub wal_bytes: Option<f64>,
    /// CPU µs of the serving process per request.
    pub server_cpu_us: Option<f64>,
    /// CPU µs of the PostgreSQL cluster per request.
    pub db_cpu_us: Option<f64>,
    /// CPU µs of the load generator per request.
    pub client_cpu_us: Option<f64>,
}

/// One cell: a scenario at one concurrency.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// What was sent.
    pub scenario: Scenario,
    /// Requests in flight.
    pub concurrency: usize,
    /// Each round's figures.
    pub rounds: Vec<Round>,
    /// Median throughput over rounds, requests/s.
    pub throughput: f64,
    /// Median of the rounds' p50, ms.
    pub p50_ms: f64,
    /// Median of the rounds' p99, ms.
    pub p99_ms: f64,
    /// Unexpected answers, all rounds.
    pub errors: u64,
    /// Good answers, all rounds.
    pub requests: u64,
    /// Per-request costs.
    pub per_request: PerRequest,
    /// PostgreSQL: each statement's calls and execution µs per request,
    /// all rounds together, most calls first.
    pub statements: Vec<StatementTotals>,
}

/// The SQLite counting pass of one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Count {
    /// What was sent.
    pub scenario: Scenario,
    /// Good answers counted.
    pub requests: u64,
    /// sqlx's per-statement log lines per request (everything but
    /// BEGIN/COMMIT/ROLLBACK, which sqlx's SQLite driver does not log).
    pub logged_statements: f64,
    /// Commit frames in the WAL per request (`None`: the WAL restarted).
    pub commits: Option<f64>,
    /// `logged_statements + 2 x commits` (each write transaction's BEGIN
    /// IMMEDIATE and COMMIT).
    pub statements: Option<f64>,
}

/// Server memory.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Memory {
    /// idem-server's VmRSS after start, before any load, KiB.
    pub idle_kib: Option<u64>,
    /// Largest VmRSS sampled while `connections` connections sent first
    /// executions, KiB.
    pub loaded_kib: Option<u64>,
    /// VmHWM after that, KiB.
    pub peak_kib: Option<u64>,
    /// Connections of the memory cell.
    pub connections: usize,
    /// The memory cell's load figures.
    pub load: Option<LoadResult>,
}

/// Everything measured on one store.
#[derive(Debug, Clone, Serialize)]
pub struct StoreResult {
    /// Which.
    pub store: StoreKind,
    /// Why it was not run, if it was not.
    pub skipped: Option<String>,
    /// Every cell.
    pub cells: Vec<Cell>,
    /// Server memory.
    pub memory: Memory,
    /// The SQLite counting pass.
    pub counts: Vec<Count>,
    /// The timed concurrency scenario, with and without the layer.
    pub concurrent: Vec<Concurrent>,
    /// Where the minimal app's time goes, per stage.
    pub stages: Vec<StagePass>,
    /// The durability settings the cells ran with, read from the store
    /// (e.g. `fsync = on`), one line per app or database.
    pub durability: Vec<String>,
}

/// The timed concurrency scenario (issue 19 item 1): `requests` first
/// executions sent at once on their own connections, distinct keys and
/// callers, whose handler sleeps before its first `tx.lock()` and one
/// `INSERT`.
#[derive(Debug, Clone, Serialize)]
pub struct Concurrent {
    /// `/idem/slow` (with the layer) or `/plain/slow` (without).
    pub layer: bool,
    /// Requests sent at once.
    pub requests: usize,
    /// What the handler spends before its write, ms.
    pub sleep_ms: u64,
    /// The app's pool size.
    pub pool: u32,
    /// Answered 201 (and not as a replay).
    pub created: u64,
    /// Every other answer or error.
    pub errors: u64,
    /// The first of those.
    pub first_error: Option<String>,
    /// From the first connection to the last answer, seconds.
    pub elapsed_s: f64,
    /// Latency percentiles of the 201s, ms.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Rows of this run in the app's table afterwards (read from the
    /// database by the benchmark, not asked of the app).
    pub effects: u64,
    /// Distinct request texts among them (one per request: one effect each).
    pub distinct_effects: u64,
}

/// Time per stage of one minimal-app scenario, from the server's own
/// tracing spans (a separate untimed pass; see [`crate::minimal::StageTimes`]).
#[derive(Debug, Clone, Serialize)]
pub struct StagePass {
    /// What was sent.
    pub scenario: Scenario,
    /// Requests in flight.
    pub concurrency: usize,
    /// Good answers.
    pub requests: u64,
    /// Per span name: spans per request, wall µs and busy µs per request.
    pub stages: Vec<Stage>,
}

/// One span name's time in a [`StagePass`].
#[derive(Debug, Clone, Serialize)]
pub struct Stage {
    /// The span name (`idem.observe`, `minimal.request`, ...).
    pub name: String,
    /// Spans of this name per request.
    pub per_request: f64,
    /// From creation to close per request (includes waiting), µs.
    pub wall_us: f64,
    /// Polled on a thread per request (roughly CPU), µs.
    pub busy_us: f64,
}

impl StoreResult {
    /// A store that could not be set up (a loud skip, not a failure).
    pub fn skipped(store: StoreKind, why: String) -> Self {
        Self {
            store,
            skipped: Some(why),
            cells: Vec::new(),
            memory: Memory::default(),
            counts: Vec::new(),
            concurrent: Vec::new(),
            stages: Vec::new(),
            durability: Vec::new(),
        }
    }

    /// The cell of `scenario` at `c`.
    pub fn cell(&self, scenario: Scenario, c: usize) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|x| x.scenario == scenario && x.concurrency == c)
    }
}

/// The machine a run ran on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// `nproc`.
    pub nproc: usize,
    /// `model name` from /proc/cpuinfo.
    pub cpu_model: String,
    /// Clock ticks per second of the CPU figures.
    pub clock_ticks: u64,
}

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    /// When it started, RFC 3339 UTC.
    pub started_at: String,
    /// Seconds it took.
    pub wall_s: f64,
    /// Where.
    pub machine: Machine,
    /// With what.
    pub config: Config,
    /// Per store.
    pub stores: Vec<StoreResult>,
    /// Issue 13's ratios against their targets.
    pub targets: Vec<Target>,
}

/// One target (issues 13, 19 and 33) and whether this run met it.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// What is compared, e.g. `first / baseline`.
    pub ratio: String,
    /// SQLite or PostgreSQL.
    pub store: String,
    /// The concurrency it was measured at (0: not a load figure).
    pub concurrency: usize,
    /// The measured value (`None`: a cell is missing).
    pub value: Option<f64>,
    /// The target, as text (`>= 0.85`).
    pub target: String,
    /// Met, missed, or `None` when it could not be computed.
    pub pass: Option<bool>,
    /// A detail, e.g. the commits beside the payments ratio.
    pub note: String,
}
