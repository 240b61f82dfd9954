//! One benchmark run: for each store, start the processor, `idem-server`
//! and the baseline server as child processes, run every cell (scenario x
//! concurrency) `rounds` times, interleaved, then measure memory at many
//! connections and (SQLite) count statements and commits in a separate
//! pass; collect everything into a [`BenchResult`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};

use crate::child::{ChildServer, Spawn, TempDir, cargo_bin};
use crate::load::{self, Expect, Load, LoadResult, MakeReq, Req};
use crate::pg::{Cluster, PgCounters, StatementTotals, statements_between};
use crate::sqlite_wal::{WalWatch, commits_between};
use crate::{Result, procfs};

/// A store the servers run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// A SQLite file in a temp dir.
    Sqlite,
    /// Databases in a throwaway PostgreSQL cluster.
    Postgres,
    /// Databases on the MySQL / MariaDB server at `IDEM_BENCH_MYSQL_URL`
    /// (default `mysql://root@127.0.0.1:3306/test`).
    #[serde(rename = "mysql")]
    MySql,
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Sqlite => "SQLite",
            Self::Postgres => "PostgreSQL",
            Self::MySql => "MySQL",
        })
    }
}

/// What a cell sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// `POST /v1/transfers` on the baseline server, no key.
    Baseline,
    /// `POST /v1/transfers` on idem-server, a fresh key per request.
    First,
    /// `POST /v1/transfers` on idem-server, replaying pre-warmed keys.
    Replay,
    /// `POST /v1/payments` on idem-server (multi-step), fresh keys.
    Payments,
    /// `POST /charges` on the fake processor itself, fresh keys.
    Processor,
    /// The minimal app: `POST /idem/write` (layer, one row), fresh keys.
    MinWrite,
    /// The minimal app: `POST /plain/write`, the same row without the layer.
    MinWritePlain,
    /// The minimal app: `POST /idem/none` (layer, writes nothing), fresh keys.
    MinNone,
    /// The minimal app: `POST /plain/none`, nothing, without the layer.
    MinNonePlain,
}

impl Scenario {
    /// Every scenario, in the order a round runs them.
    pub const ALL: [Scenario; 9] = [
        Self::Baseline,
        Self::First,
        Self::Replay,
        Self::Payments,
        Self::Processor,
        Self::MinWritePlain,
        Self::MinWrite,
        Self::MinNonePlain,
        Self::MinNone,
    ];

    /// The scenarios of idem-server, the baseline and the processor (issue 13).
    pub const SERVER: [Scenario; 5] = [
        Self::Baseline,
        Self::First,
        Self::Replay,
        Self::Payments,
        Self::Processor,
    ];

    /// The minimal app's scenarios (issue 19).
    pub const MINIMAL: [Scenario; 4] = [
        Self::MinWritePlain,
        Self::MinWrite,
        Self::MinNonePlain,
        Self::MinNone,
    ];

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Baseline => "baseline",
            Self::First => "first",
            Self::Replay => "replay",
            Self::Payments => "payments",
            Self::Processor => "processor",
            Self::MinWrite => "min-write",
            Self::MinWritePlain => "min-write-plain",
            Self::MinNone => "min-none",
            Self::MinNonePlain => "min-none-plain",
        }
    }

    /// Whether it runs on the minimal app.
    pub fn is_minimal(self) -> bool {
        Self::MINIMAL.contains(&self)
    }

    /// Whether its writes run in explicit transactions (BEGIN ... COMMIT,
    /// which sqlx's SQLite driver does not log; see [`Count`]) rather than
    /// as an autocommitted statement.
    pub fn explicit_tx(self) -> bool {
        !matches!(
            self,
            Self::MinWritePlain | Self::MinNonePlain | Self::Processor
        )
    }
}

/// What `--scenarios` selects: `transfers` (baseline, first, replay),
/// `payments` (payments, processor), `minimal` (the four minimal-app cells
/// and the stage-times pass), `concurrent` (the timed concurrency
/// scenario), `stages` (the stage-times pass alone), `all`, or any single
/// scenario name.
pub fn select(cfg: &mut Config, names: &[String]) -> std::result::Result<(), String> {
    cfg.scenarios.clear();
    cfg.concurrent = false;
    cfg.stages = false;
    for name in names {
        let add: &[Scenario] = match name.as_str() {
            "all" => {
                cfg.concurrent = true;
                cfg.stages = true;
                &Scenario::ALL
            }
            "transfers" => &[Scenario::Baseline, Scenario::First, Scenario::Replay],
            "payments" => &[Scenario::Payments, Scenario::Processor],
            "minimal" => {
                cfg.stages = true;
                &Scenario::MINIMAL
            }
            "concurrent" => {
                cfg.concurrent = true;
                &[]
            }
            "stages" => {
                cfg.stages = true;
                &[]
            }
            other => match Scenario::ALL.iter().find(|s| s.name() == other) {
                Some(s) => std::slice::from_ref(s),
                None => {
                    return Err(format!(
                        "unknown scenario {other:?}: all, transfers, payments, minimal, concurrent, stages, or one of {}",
                        Scenario::ALL.map(Scenario::name).join(", ")
                    ));
                }
            },
        };
        for s in add {
            if !cfg.scenarios.contains(s) {
                cfg.scenarios.push(*s);
            }
        }
    }
    cfg.scenarios
        .sort_by_key(|s| Scenario::ALL.iter().position(|x| x == s));
    Ok(())
}

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Stores to run on.
    pub stores: Vec<StoreKind>,
    /// The MySQL / MariaDB server of the MySQL store (a database of its own
    /// per session): `IDEM_BENCH_MYSQL_URL`, else the machine's.
    pub mysql_url: String,
    /// Concurrency levels of every scenario.
    pub concurrencies: Vec<usize>,
    /// Concurrencies the transfer ratios are computed at (each must be in
    /// `concurrencies`); payments/processor at the largest.
    pub ratio_concurrencies: Vec<usize>,
    /// Measured time per cell and round.
    pub duration: Duration,
    /// Unmeasured load before each cell.
    pub warmup: Duration,
    /// Rounds (every cell once per round; medians are reported).
    pub rounds: usize,
    /// Connections of the memory cell.
    pub rss_connections: usize,
    /// Requests per scenario in the SQLite counting pass.
    pub count_requests: u64,
    /// Callers (each with its own two accounts); worker `w` acts as caller
    /// `w % callers`.
    pub callers: usize,
    /// Replay keys pre-warmed per caller.
    pub replay_keys_per_caller: usize,
    /// Release builds of the servers (always, except in tests).
    pub release: bool,
    /// The `idem-bench` binary (for `serve-baseline`, `serve-minimal`).
    pub bench_bin: PathBuf,
    /// The load cells to run (in [`Scenario::ALL`]'s order).
    pub scenarios: Vec<Scenario>,
    /// Run the timed concurrency scenario ([`Concurrent`]).
    pub concurrent: bool,
    /// Run the stage-times pass of the minimal app ([`StagePass`]).
    pub stages: bool,
    /// Requests of the concurrency scenario (all at once, distinct keys
    /// and callers).
    pub concurrent_requests: usize,
    /// What its handler spends before its first `tx.lock()`, ms.
    pub concurrent_sleep_ms: u64,
    /// Its target: every request answered within this.
    pub concurrent_limit: Duration,
    /// The minimal app's pool on PostgreSQL (a request holds a connection
    /// for its life there).
    pub minimal_pg_pool: u32,
    /// The minimal app's pool on SQLite (`StoreOptions`' default).
    pub minimal_sqlite_pool: u32,
}

impl Config {
    /// The default run: a few minutes on two cores.
    pub fn full(bench_bin: PathBuf) -> Self {
        Self {
            stores: vec![StoreKind::Sqlite, StoreKind::Postgres, StoreKind::MySql],
            mysql_url: std::env::var(crate::mysql::URL_ENV)
                .unwrap_or_else(|_| crate::mysql::DEFAULT_URL.to_owned()),
            concurrencies: vec![1, 16, 64],
            ratio_concurrencies: vec![16, 64],
            duration: Duration::from_millis(2000),
            warmup: Duration::from_millis(400),
            rounds: 3,
            rss_connections: 256,
            count_requests: 400,
            callers: 64,
            replay_keys_per_caller: 8,
            release: !cfg!(debug_assertions),
            bench_bin,
            scenarios: Scenario::ALL.to_vec(),
            concurrent: true,
            stages: true,
            concurrent_requests: 150,
            concurrent_sleep_ms: 200,
            concurrent_limit: Duration::from_millis(1500),
            minimal_pg_pool: 32,
            minimal_sqlite_pool: 10,
        }
    }

    /// `--quick`: one short round, for a smoke run by hand.
    pub fn quick(bench_bin: PathBuf) -> Self {
        Self {
            concurrencies: vec![16, 64],
            duration: Duration::from_millis(500),
            warmup: Duration::from_millis(100),
            rounds: 1,
            count_requests: 100,
            ..Self::full(bench_bin)
        }
    }
}

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
    pub targets: Vec<crate::report::Target>,
}

/// The binaries a run needs.
#[derive(Debug, Clone)]
pub struct Bins {
    /// idem-server (only built when a server scenario is selected).
    pub server: PathBuf,
    /// idem-fake-processor (likewise).
    pub processor: PathBuf,
    /// idem-bench (serve-baseline, serve-minimal).
    pub bench: PathBuf,
}

impl Config {
    /// Whether idem-server, the baseline and the processor are needed.
    pub fn needs_servers(&self) -> bool {
        self.scenarios.iter().any(|s| !s.is_minimal())
    }

    /// Whether the minimal app is needed.
    pub fn needs_minimal(&self) -> bool {
        self.concurrent || self.stages || self.scenarios.iter().any(|s| s.is_minimal())
    }
}

/// Builds (or finds fresh) the server and processor binaries, when the
/// selected scenarios use them (the minimal app is this binary).
pub fn bins(cfg: &Config) -> Result<Bins> {
    if !cfg.needs_servers() {
        return Ok(Bins {
            server: PathBuf::new(),
            processor: PathBuf::new(),
            bench: cfg.bench_bin.clone(),
        });
    }
    Ok(Bins {
        server: cargo_bin("idem-server", "idem-server", cfg.release, "IDEM_SERVER_BIN")?,
        processor: cargo_bin(
            "idem-fake-processor",
            "idem-fake-processor",
            cfg.release,
            "IDEM_PROCESSOR_BIN",
        )?,
        bench: cfg.bench_bin.clone(),
    })
}

/// Runs everything `cfg` asks for. `progress` gets one line per cell.
pub async fn run(cfg: &Config, progress: &(dyn Fn(&str) + Sync)) -> Result<BenchResult> {
    let started = Instant::now();
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let bins = bins(cfg)?;
    let mut stores = Vec::new();
    for &kind in &cfg.stores {
        progress(&format!("== {kind} =="));
        match session(cfg, &bins, kind, progress).await {
            Ok(r) => stores.push(r),
            Err(e) if kind != StoreKind::Sqlite && e.is_setup() => {
                progress(&format!("{kind} skipped: {e}"));
                stores.push(StoreResult {
                    store: kind,
                    skipped: Some(e.to_string()),
                    cells: Vec::new(),
                    memory: Memory::default(),
                    counts: Vec::new(),
                    concurrent: Vec::new(),
                    stages: Vec::new(),
                });
            }
            Err(e) => return Err(e),
        }
    }
    let (nproc, cpu_model) = procfs::machine();
    let targets = crate::report::targets(cfg, &stores);
    Ok(BenchResult {
        started_at,
        wall_s: started.elapsed().as_secs_f64(),
        machine: Machine {
            nproc,
            cpu_model,
            clock_ticks: procfs::ticks_per_second(),
        },
        config: cfg.clone(),
        stores,
        targets,
    })
}

/// The callers' bearer tokens, as `[tokens]` TOML for `--tokens-file`.
fn tokens_toml(callers: usize) -> String {
    let mut s = String::from("[tokens]\n");
    for i in 0..callers {
        s.push_str(&format!("\"bench-token-{i}\" = \"c{i}\"\n"));
    }
    s
}

/// Where a store session keeps its databases.
enum Dbs {
    Sqlite { dir: PathBuf },
    Postgres { cluster: Cluster },
    MySql(crate::mysql::Server),
}

impl Dbs {
    async fn url(&self, name: &str) -> Result<String> {
        match self {
            Self::Sqlite { dir } => Ok(format!(
                "sqlite://{}",
                dir.join(format!("{name}.db")).display()
            )),
            Self::Postgres { cluster } => cluster.create_db(name).await,
            Self::MySql(server) => server.create_db(name).await,
        }
    }
}

/// The three processes of a session.
struct Stack {
    processor: ChildServer,
    server: ChildServer,
    baseline: ChildServer,
}

async fn start_stack(
    bins: &Bins,
    dir: &Path,
    tokens: &Path,
    idem_url: &str,
    base_url: &str,
    log: Option<&str>,
) -> Result<Stack> {
    let processor = Spawn::new(&bins.processor)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--db",
            &dir.join(format!(
                "processor-{}.db",
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            ))
            .display()
            .to_string(),
        ])
        .start()
        .await?;
    let common = |url: &str| {
        vec![
            "--listen".to_owned(),
            "127.0.0.1:0".to_owned(),
            "--tokens-file".to_owned(),
            tokens.display().to_string(),
            "--database-url".to_owned(),
            url.to_owned(),
            // Receipt delivery (one more write transaction per payment, in
            // the background, 100 per second at most) would spill from the
            // payments cells into the next ones: off in the benchmark.
            "--enqueuer-interval-ms".to_owned(),
            "3600000".to_owned(),
        ]
    };
    let with_log = |s: Spawn| match log {
        Some(filter) => s.env("RUST_LOG", filter).count_stderr("sqlx::query"),
        None => s,
    };
    let server = with_log(
        Spawn::new(&bins.server)
            .args(common(idem_url))
            .args(["--processor-url", &processor.base_url()]),
    )
    .start()
    .await?;
    let baseline = with_log(
        Spawn::new(&bins.bench)
            .args(["serve-baseline", "--"])
            .args(common(base_url)),
    )
    .start()
    .await?;
    Ok(Stack {
        processor,
        server,
        baseline,
    })
}

fn auth(caller: usize) -> (HeaderName, HeaderValue) {
    (
        hyper::header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer bench-token-{caller}"))
            .unwrap_or(HeaderValue::from_static("Bearer none")),
    )
}

fn key(k: &str) -> (HeaderName, HeaderValue) {
    (
        HeaderName::from_static("idempotency-key"),
        HeaderValue::from_str(k).unwrap_or(HeaderValue::from_static("bad")),
    )
}

fn transfer_body(caller: usize, forward: bool) -> Bytes {
    let (from, to) = if forward {
        ("main", "savings")
    } else {
        ("savings", "main")
    };
    Bytes::from(format!(
        r#"{{"from":"acc_c{caller}_{from}","to":"acc_c{caller}_{to}","amount":1}}"#
    ))
}

fn user(name: &str) -> (HeaderName, HeaderValue) {
    (
        HeaderName::from_static("x-user"),
        HeaderValue::from_str(name).unwrap_or(HeaderValue::from_static("bad")),
    )
}

/// The minimal app's body: `{"text": id}` (ids are plain ASCII).
fn note(id: &str) -> Bytes {
    Bytes::from(format!(r#"{{"text":"{id}"}}"#))
}

const CHARGE: &str = r#"{"amount":1250,"currency":"usd","source":"tok_visa"}"#;

/// The request maker and expectation of `scenario`; `tag` makes this
/// cell's keys unique in the session.
fn requests(scenario: Scenario, callers: usize, replay_keys: usize, tag: u64) -> (MakeReq, Expect) {
    let fresh = Expect {
        status: 201,
        replayed: Some(false),
    };
    let make: MakeReq = match scenario {
        Scenario::Baseline => Arc::new(move |w, n| {
            let c = w % callers;
            Req {
                path: "/v1/transfers",
                headers: vec![auth(c)],
                body: transfer_body(c, n % 2 == 0),
            }
        }),
        Scenario::First => Arc::new(move |w, n| {
            let c = w % callers;
            Req {
                path: "/v1/transfers",
                headers: vec![auth(c), key(&format!("f{tag}-{w}-{n}"))],
                body: transfer_body(c, n % 2 == 0),
            }
        }),
        Scenario::Replay => {
            return (
                Arc::new(move |w, n| {
                    let c = w % callers;
                    let j = (n as usize + w) % replay_keys.max(1);
                    Req {
                        path: "/v1/transfers",
                        headers: vec![auth(c), key(&format!("warm-{c}-{j}"))],
                        body: transfer_body(c, true),
                    }
                }),
                Expect {
                    status: 201,
                    replayed: Some(true),
                },
            );
        }
        Scenario::Payments => Arc::new(move |w, n| Req {
            path: "/v1/payments",
            headers: vec![auth(w % callers), key(&format!("p{tag}-{w}-{n}"))],
            body: Bytes::from_static(CHARGE.as_bytes()),
        }),
        Scenario::Processor => Arc::new(move |w, n| Req {
            path: "/charges",
            headers: vec![key(&format!("x{tag}-{w}-{n}"))],
            body: Bytes::from_static(CHARGE.as_bytes()),
        }),
        Scenario::MinWrite
        | Scenario::MinNone
        | Scenario::MinWritePlain
        | Scenario::MinNonePlain => {
            let (path, layer) = match scenario {
                Scenario::MinWrite => ("/idem/write", true),
                Scenario::MinNone => ("/idem/none", true),
                Scenario::MinWritePlain => ("/plain/write", false),
                _ => ("/plain/none", false),
            };
            Arc::new(move |w, n| {
                let id = format!("m{tag}-{w}-{n}");
                let mut headers = vec![user(&format!("u{}", w % callers))];
                if layer {
                    headers.push(key(&id));
                }
                Req {
                    path,
                    headers,
                    body: note(&id),
                }
            })
        }
    };
    (make, fresh)
}

/// Creates the replay keys (`warm-{caller}-{j}`) with first executions.
async fn prewarm(addr: SocketAddr, callers: usize, per_caller: usize) -> Result<()> {
    let make: MakeReq = Arc::new(move |w, n| {
        // Worker w owns caller w and sends its keys 0..per_caller in turn.
        Req {
            path: "/v1/transfers",
            headers: vec![auth(w), key(&format!("warm-{w}-{n}"))],
            body: transfer_body(w, true),
        }
    });
    let r = load::run(Load {
        addr,
        concurrency: callers,
        duration: Duration::from_secs(60),
        max_requests: None,
        make,
        expect: Expect {
            status: 201,
            replayed: None,
        },
        per_worker: Some(per_caller as u64),
    })
    .await;
    if r.errors > 0 {
        return Err(crate::Error::Run(format!(
            "pre-warming replay keys: {}",
            r.first_error.unwrap_or_default()
        )));
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

struct Snapshot {
    server: u64,
    client: u64,
    db: Option<BTreeMap<u32, u64>>,
    pg: Option<PgCounters>,
}

async fn snapshot(
    pid: u32,
    cluster: Option<(&Cluster, &str)>,
    sql_first: bool,
) -> Result<Snapshot> {
    let cpu = |pg| Snapshot {
        server: procfs::cpu_ticks(pid).unwrap_or(0),
        client: procfs::cpu_ticks(std::process::id()).unwrap_or(0),
        db: cluster.map(|(c, _)| procfs::tree_ticks(c.postmaster)),
        pg,
    };
    // The SQL reads cost database CPU themselves: read them outside the
    // CPU window (before it opens, after it closes).
    match cluster {
        Some((c, db)) if sql_first => {
            let pg = c.counters(db).await?;
            Ok(cpu(Some(pg)))
        }
        Some((c, db)) => {
            let mut s = cpu(None);
            s.pg = Some(c.counters(db).await?);
            Ok(s)
        }
        None => Ok(cpu(None)),
    }
}

/// Starts the minimal app on `url`; `extra` adds flags (`--stage-times`),
/// `log` a log filter whose sqlx statement lines are counted.
async fn start_minimal(
    bin: &Path,
    url: &str,
    pool: u32,
    sleep_ms: u64,
    extra: &[&str],
    log: Option<&str>,
) -> Result<ChildServer> {
    let s = Spawn::new(bin)
        .args(["serve-minimal", "--", "--database-url", url])
        .args(["--max-connections", &pool.to_string()])
        .args(["--sleep-ms", &sleep_ms.to_string()])
        .args(extra);
    let s = match log {
        Some(filter) => s.env("RUST_LOG", filter).count_stderr("sqlx::query"),
        None => s,
    };
    s.start().await
}

/// One measured cell: warm-up, counters before, load, counters after.
#[allow(clippy::too_many_arguments)]
async fn measure_cell(
    cfg: &Config,
    kind: StoreKind,
    child: &ChildServer,
    pg: Option<(&Cluster, &str)>,
    scenario: Scenario,
    c: usize,
    tag: &mut u64,
    round: usize,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Round> {
    // Warm-up and measurement each get their own keys (a tag per load),
    // so the measured first executions are first.
    let mut cell = |duration| {
        *tag += 1;
        let (make, expect) = requests(scenario, cfg.callers, cfg.replay_keys_per_caller, *tag);
        Load {
            addr: child.addr,
            concurrency: c,
            duration,
            max_requests: None,
            per_worker: None,
            make,
            expect,
        }
    };
    let warm = load::run(cell(cfg.warmup)).await;
    let measured = cell(cfg.duration);
    let stmts_before = match pg {
        Some((c, db)) => Some(c.statements(db).await?),
        None => None,
    };
    let before = snapshot(child.pid, pg, true).await?;
    let result = load::run(measured).await;
    let after = snapshot(child.pid, pg, false).await?;
    let statements = match (pg, stmts_before) {
        (Some((c, db)), Some(b)) => statements_between(&b, &c.statements(db).await?),
        _ => Vec::new(),
    };
    let round_result = Round {
        statements,
        server_ticks: after.server.saturating_sub(before.server),
        client_ticks: after.client.saturating_sub(before.client),
        db_ticks: before
            .db
            .as_ref()
            .zip(after.db.as_ref())
            .map(|(b, a)| procfs::tree_delta(b, a)),
        pg: before.pg.zip(after.pg).map(|(b, a)| PgCounters {
            statements: a.statements.saturating_sub(b.statements),
            commit_statements: a.commit_statements.saturating_sub(b.commit_statements),
            next_xid: a.next_xid.saturating_sub(b.next_xid),
            wal_bytes: a.wal_bytes.saturating_sub(b.wal_bytes),
        }),
        load: LoadResult {
            errors: result.errors + warm.errors,
            first_error: result.first_error.clone().or(warm.first_error),
            ..result
        },
    };
    progress(&format!(
        "{kind} round {}/{} {:>15} c={c:<3} {:>8.0} req/s  p50 {:>7.2} ms  p99 {:>7.2} ms{}",
        round + 1,
        cfg.rounds,
        scenario.name(),
        round_result.load.throughput,
        round_result.load.p50_ms,
        round_result.load.p99_ms,
        match &round_result.load.first_error {
            Some(e) => format!("  ERRORS {}: {e}", round_result.load.errors),
            None => String::new(),
        }
    ));
    Ok(round_result)
}

async fn session(
    cfg: &Config,
    bins: &Bins,
    kind: StoreKind,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<StoreResult> {
    let dir = TempDir::new("idem-bench")?;
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, tokens_toml(cfg.callers))
        .map_err(|e| crate::Error::Setup(format!("writing {}: {e}", tokens.display())))?;
    let dbs = match kind {
        StoreKind::Sqlite => Dbs::Sqlite {
            dir: dir.path().to_owned(),
        },
        StoreKind::Postgres => Dbs::Postgres {
            cluster: Cluster::start().await?,
        },
        StoreKind::MySql => Dbs::MySql(crate::mysql::Server::connect(&cfg.mysql_url).await?),
    };
    let minimal_pool = match kind {
        StoreKind::Sqlite => cfg.minimal_sqlite_pool,
        StoreKind::Postgres | StoreKind::MySql => cfg.minimal_pg_pool,
    };
    let stack = if cfg.needs_servers() {
        Some(
            start_stack(
                bins,
                dir.path(),
                &tokens,
                &dbs.url("bench_idem").await?,
                &dbs.url("bench_base").await?,
                None,
            )
            .await?,
        )
    } else {
        None
    };
    let min_url = dbs.url("bench_min").await?;
    let minimal = if cfg.needs_minimal() {
        Some(
            start_minimal(
                &bins.bench,
                &min_url,
                minimal_pool,
                cfg.concurrent_sleep_ms,
                &[],
                None,
            )
            .await?,
        )
    } else {
        None
    };
    let mut memory = Memory {
        connections: cfg.rss_connections,
        ..Memory::default()
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    if let Some(stack) = &stack {
        memory.idle_kib = procfs::rss_kib(stack.server.pid);
        if cfg.scenarios.contains(&Scenario::Replay) {
            prewarm(stack.server.addr, cfg.callers, cfg.replay_keys_per_caller).await?;
        }
    }
    let cluster = match &dbs {
        Dbs::Postgres { cluster } => Some(cluster),
        Dbs::Sqlite { .. } | Dbs::MySql(_) => None,
    };
    let mut rounds: BTreeMap<(Scenario, usize), Vec<Round>> = BTreeMap::new();
    let mut tag = 0u64;
    for round in 0..cfg.rounds {
        for &c in &cfg.concurrencies {
            for &scenario in &cfg.scenarios {
                let (child, db) = match (scenario, &stack, &minimal) {
                    (s, _, Some(m)) if s.is_minimal() => (m, Some("bench_min")),
                    (Scenario::Baseline, Some(st), _) => (&st.baseline, Some("bench_base")),
                    (Scenario::Processor, Some(st), _) => (&st.processor, None),
                    (_, Some(st), _) => (&st.server, Some("bench_idem")),
                    _ => {
                        return Err(crate::Error::Setup(format!(
                            "no server for {}",
                            scenario.name()
                        )));
                    }
                };
                let r = measure_cell(
                    cfg,
                    kind,
                    child,
                    cluster.zip(db),
                    scenario,
                    c,
                    &mut tag,
                    round,
                    progress,
                )
                .await?;
                rounds.entry((scenario, c)).or_default().push(r);
            }
        }
    }
    let mut concurrent = Vec::new();
    if let (true, Some(m)) = (cfg.concurrent, &minimal) {
        for layer in [false, true] {
            tag += 1;
            let r = concurrent_run(cfg, m, &dbs, &min_url, layer, minimal_pool, tag).await?;
            progress(&format!(
                "{kind} concurrent {} x {} ms {} the layer (pool {}): {:.2} s, {} created, {} errors, {} effects ({} distinct){}",
                r.requests,
                r.sleep_ms,
                if layer { "with" } else { "without" },
                r.pool,
                r.elapsed_s,
                r.created,
                r.errors,
                r.effects,
                r.distinct_effects,
                r.first_error
                    .as_deref()
                    .map_or(String::new(), |e| format!(": {e}"))
            ));
            concurrent.push(r);
        }
    }
    // Memory at many connections: first executions, the path that holds a
    // request longest (the SQLite writer gate queues them).
    if let (true, Some(stack)) = (cfg.scenarios.contains(&Scenario::First), &stack) {
        tag += 1;
        let (make, expect) = requests(
            Scenario::First,
            cfg.callers,
            cfg.replay_keys_per_caller,
            tag,
        );
        let pid = stack.server.pid;
        let sampler = tokio::spawn(async move {
            let mut max = 0;
            let end = Instant::now() + Duration::from_secs(150);
            while Instant::now() < end {
                max = max.max(procfs::rss_kib(pid).unwrap_or(0));
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            max
        });
        let r = load::run(Load {
            addr: stack.server.addr,
            concurrency: cfg.rss_connections,
            duration: cfg.duration,
            max_requests: None,
            per_worker: None,
            make,
            expect,
        })
        .await;
        sampler.abort();
        // The sampler was aborted: read once more now, at the end of load.
        memory.loaded_kib = procfs::rss_kib(pid);
        memory.peak_kib = procfs::peak_rss_kib(pid);
        progress(&format!(
            "{kind} memory: idle {:.1} MiB, {} connections: peak {:.1} MiB ({:.0} req/s, {} errors)",
            memory.idle_kib.unwrap_or(0) as f64 / 1024.0,
            cfg.rss_connections,
            memory.peak_kib.unwrap_or(0) as f64 / 1024.0,
            r.throughput,
            r.errors
        ));
        memory.load = Some(r);
    }
    if let Some(m) = minimal {
        m.stop().await;
    }
    let stages = if cfg.stages {
        stage_passes(cfg, bins, &dbs, minimal_pool, kind, progress).await?
    } else {
        Vec::new()
    };
    let mut counts = Vec::new();
    if let Some(Stack {
        processor,
        server,
        baseline,
    }) = stack
    {
        server.stop().await;
        baseline.stop().await;
        if let Dbs::Sqlite { dir } = &dbs {
            counts = sqlite_counts(cfg, bins, dir, &tokens, progress).await?;
        }
        processor.stop().await;
    }
    if let Dbs::Sqlite { dir } = &dbs
        && cfg.scenarios.iter().any(|s| s.is_minimal())
    {
        counts.extend(minimal_counts(cfg, bins, dir, progress).await?);
    }
    let cells = rounds
        .into_iter()
        .map(|((scenario, concurrency), rounds)| summarize(scenario, concurrency, rounds, &counts))
        .collect();
    drop(dbs);
    Ok(StoreResult {
        store: kind,
        skipped: None,
        cells,
        memory,
        counts,
        concurrent,
        stages,
    })
}

/// The timed concurrency scenario once: `cfg.concurrent_requests` workers
/// each send one request to `/idem/slow` (or `/plain/slow`) at once, with
/// their own key and caller; then the effects are counted in the database.
async fn concurrent_run(
    cfg: &Config,
    app: &ChildServer,
    dbs: &Dbs,
    url: &str,
    layer: bool,
    pool: u32,
    tag: u64,
) -> Result<Concurrent> {
    let prefix = format!("c{tag}-");
    let p = prefix.clone();
    let make: MakeReq = Arc::new(move |w, _| {
        let id = format!("{p}{w}");
        let mut headers = vec![user(&format!("cc{tag}-{w}"))];
        if layer {
            headers.push(key(&id));
        }
        Req {
            path: if layer { "/idem/slow" } else { "/plain/slow" },
            headers,
            body: note(&id),
        }
    });
    let r = load::run(Load {
        addr: app.addr,
        concurrency: cfg.concurrent_requests,
        duration: Duration::from_secs(60),
        max_requests: None,
        per_worker: Some(1),
        make,
        expect: Expect {
            status: 201,
            replayed: Some(false),
        },
    })
    .await;
    let (effects, distinct_effects) = effects(dbs, url, &prefix).await?;
    Ok(Concurrent {
        layer,
        requests: cfg.concurrent_requests,
        sleep_ms: cfg.concurrent_sleep_ms,
        pool,
        created: r.ok,
        errors: r.errors,
        first_error: r.first_error,
        elapsed_s: r.elapsed_s,
        p50_ms: r.p50_ms,
        p99_ms: r.p99_ms,
        effects,
        distinct_effects,
    })
}

/// Rows of the minimal app's `notes` whose text starts with `prefix`, and
/// how many distinct texts they hold.
async fn effects(dbs: &Dbs, url: &str, prefix: &str) -> Result<(u64, u64)> {
    use sqlx::Connection;
    use std::str::FromStr;
    let q = "SELECT count(*), count(DISTINCT text) FROM notes WHERE text LIKE $1";
    let pattern = format!("{prefix}%");
    let (a, b): (i64, i64) = match dbs {
        Dbs::Sqlite { .. } => {
            let opts = sqlx::sqlite::SqliteConnectOptions::from_str(url)?.read_only(true);
            let mut c = sqlx::SqliteConnection::connect_with(&opts).await?;
            let r = sqlx::query_as(q).bind(&pattern).fetch_one(&mut c).await?;
            c.close().await.ok();
            r
        }
        Dbs::Postgres { .. } => {
            let mut c = sqlx::PgConnection::connect(url).await?;
            let r = sqlx::query_as(q).bind(&pattern).fetch_one(&mut c).await?;
            c.close().await.ok();
            r
        }
        Dbs::MySql(_) => {
            let mut c = sqlx::MySqlConnection::connect(url).await?;
            let r = sqlx::query_as(&q.replace("$1", "?"))
                .bind(&pattern)
                .fetch_one(&mut c)
                .await?;
            c.close().await.ok();
            r
        }
    };
    Ok((u64::try_from(a).unwrap_or(0), u64::try_from(b).unwrap_or(0)))
}

/// Where the minimal app's time goes: a fresh app with `--stage-times` on
/// its own database, a fixed number of requests per minimal scenario (the
/// layer-less ones show the handler's own time) at c = 1 and at the first
/// ratio concurrency above 1, untimed otherwise; the span totals are read
/// from `GET /_bench/stages` before and after.
async fn stage_passes(
    cfg: &Config,
    bins: &Bins,
    dbs: &Dbs,
    pool: u32,
    kind: StoreKind,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Vec<StagePass>> {
    let url = dbs.url("bench_stages").await?;
    let app = start_minimal(
        &bins.bench,
        &url,
        pool,
        cfg.concurrent_sleep_ms,
        &["--stage-times"],
        None,
    )
    .await?;
    let mut out = Vec::new();
    let mut levels = vec![1];
    if let Some(&c) = cfg.ratio_concurrencies.iter().find(|&&c| c > 1) {
        levels.push(c);
    }
    for (i, &c) in levels.iter().enumerate() {
        for (j, scenario) in Scenario::MINIMAL.into_iter().enumerate() {
            let tag = 2_000_000 + (i * 10 + j) as u64;
            let (make, expect) = requests(scenario, cfg.callers, 1, tag);
            let before = stage_totals(app.addr).await?;
            let r = load::run(Load {
                addr: app.addr,
                concurrency: c,
                duration: Duration::from_secs(60),
                max_requests: Some(cfg.count_requests),
                per_worker: None,
                make,
                expect,
            })
            .await;
            // A span closes when its request's future is dropped, which
            // may be a moment after the answer was written: wait until the
            // request spans are all in (bounded).
            let mut after = stage_totals(app.addr).await?;
            let end = Instant::now() + Duration::from_secs(3);
            while after
                .get("minimal.request")
                .map_or(0, |t| t.count)
                .saturating_sub(before.get("minimal.request").map_or(0, |t| t.count))
                < r.ok
                && Instant::now() < end
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
                after = stage_totals(app.addr).await?;
            }
            if r.ok == 0 || r.errors > 0 {
                return Err(crate::Error::Run(format!(
                    "stage pass {}: {} good, {} errors ({})",
                    scenario.name(),
                    r.ok,
                    r.errors,
                    r.first_error.unwrap_or_default()
                )));
            }
            let n = r.ok as f64;
            let stages: Vec<Stage> = after
                .iter()
                .filter_map(|(name, a)| {
                    let b = before.get(name).copied().unwrap_or_default();
                    let count = a.count.saturating_sub(b.count);
                    (count > 0).then(|| Stage {
                        name: name.clone(),
                        per_request: count as f64 / n,
                        wall_us: a.wall_ns.saturating_sub(b.wall_ns) as f64 / 1e3 / n,
                        busy_us: a.busy_ns.saturating_sub(b.busy_ns) as f64 / 1e3 / n,
                    })
                })
                .collect();
            progress(&format!(
                "{kind} stages {:>15} c={c:<3} {}",
                scenario.name(),
                stages
                    .iter()
                    .map(|s| format!("{} {:.0}/{:.0} µs", s.name, s.wall_us, s.busy_us))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            out.push(StagePass {
                scenario,
                concurrency: c,
                requests: r.ok,
                stages,
            });
        }
    }
    app.stop().await;
    Ok(out)
}

async fn stage_totals(addr: SocketAddr) -> Result<BTreeMap<String, crate::minimal::StageTotal>> {
    let body = load::get(addr, "/_bench/stages")
        .await
        .map_err(|e| crate::Error::Run(format!("GET /_bench/stages: {e}")))?;
    serde_json::from_slice(&body).map_err(|e| crate::Error::Run(format!("GET /_bench/stages: {e}")))
}

/// The SQLite counting pass of the minimal app: a fresh app on its own
/// file logging every statement, a fixed number of requests per scenario.
async fn minimal_counts(
    cfg: &Config,
    bins: &Bins,
    dir: &Path,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Vec<Count>> {
    let db = dir.join("count_min.db");
    let app = start_minimal(
        &bins.bench,
        &format!("sqlite://{}", db.display()),
        cfg.minimal_sqlite_pool,
        0,
        &[],
        Some("warn,sqlx::query=debug"),
    )
    .await?;
    let mut out = Vec::new();
    for (i, scenario) in Scenario::MINIMAL.into_iter().enumerate() {
        if !cfg.scenarios.contains(&scenario) {
            continue;
        }
        out.push(count_one(cfg, &app, &db, scenario, 3_000_000 + i as u64, progress).await?);
    }
    app.stop().await;
    Ok(out)
}

/// Counts one scenario's statements (sqlx's log lines) and commits (WAL
/// commit frames) on `child`, writing to the SQLite file `db`.
async fn count_one(
    cfg: &Config,
    child: &ChildServer,
    db: &Path,
    scenario: Scenario,
    tag: u64,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Count> {
    let c = 4.min(cfg.callers);
    let (make, expect) = requests(scenario, c, cfg.replay_keys_per_caller, tag);
    let watch = WalWatch::start(db).await?;
    let log0 = child.counted_settled().await;
    let wal0 = watch.count();
    let r = load::run(Load {
        addr: child.addr,
        concurrency: c,
        duration: Duration::from_secs(60),
        max_requests: Some(cfg.count_requests),
        per_worker: None,
        make,
        expect,
    })
    .await;
    let log1 = child.counted_settled().await;
    let wal1 = watch.count();
    watch.finish().await;
    if r.ok == 0 {
        return Err(crate::Error::Run(format!(
            "counting pass {}: no good answer ({})",
            scenario.name(),
            r.first_error.unwrap_or_default()
        )));
    }
    let n = r.ok as f64;
    let logged = log1.saturating_sub(log0) as f64 / n;
    let commits = commits_between(wal0, wal1).map(|k| k as f64 / n);
    progress(&format!(
        "SQLite counting {:>15}: {logged:.2} logged statements, {} commits per request",
        scenario.name(),
        commits.map_or("n/a".into(), |c| format!("{c:.2}"))
    ));
    // A layered request's write transactions are BEGIN IMMEDIATE ...
    // COMMIT, which sqlx does not log; a layer-less INSERT autocommits.
    let explicit = if scenario.explicit_tx() { 2.0 } else { 0.0 };
    Ok(Count {
        scenario,
        requests: r.ok,
        logged_statements: logged,
        commits,
        statements: commits.map(|k| logged + explicit * k),
    })
}

fn summarize(scenario: Scenario, concurrency: usize, rounds: Vec<Round>, counts: &[Count]) -> Cell {
    let requests: u64 = rounds.iter().map(|r| r.load.ok).sum();
    let errors = rounds.iter().map(|r| r.load.errors).sum();
    let per = |total: u64| (requests > 0).then(|| total as f64 / requests as f64);
    let us = 1e6 / procfs::ticks_per_second() as f64;
    let pg: Option<Vec<PgCounters>> = rounds.iter().map(|r| r.pg).collect();
    let count = counts.iter().find(|c| c.scenario == scenario);
    let per_request = PerRequest {
        statements: match &pg {
            Some(p) => per(p.iter().map(|x| x.statements).sum()),
            None => count.and_then(|c| c.statements),
        },
        commits: match &pg {
            Some(p) => per(p.iter().map(|x| x.next_xid).sum()),
            None => count.and_then(|c| c.commits),
        },
        wal_bytes: pg
            .as_ref()
            .and_then(|p| per(p.iter().map(|x| x.wal_bytes).sum())),
        server_cpu_us: per(rounds.iter().map(|r| r.server_ticks).sum()).map(|t| t * us),
        db_cpu_us: rounds
            .iter()
            .map(|r| r.db_ticks)
            .sum::<Option<u64>>()
            .and_then(per)
            .map(|t| t * us),
        client_cpu_us: per(rounds.iter().map(|r| r.client_ticks).sum()).map(|t| t * us),
    };
    let mut by_query: BTreeMap<String, StatementTotals> = BTreeMap::new();
    for s in rounds.iter().flat_map(|r| &r.statements) {
        let e = by_query.entry(s.query.clone()).or_default();
        e.query.clone_from(&s.query);
        e.calls += s.calls;
        e.exec_ms += s.exec_ms;
    }
    let mut statements: Vec<StatementTotals> = by_query.into_values().collect();
    statements.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.query.cmp(&b.query)));
    Cell {
        statements,
        scenario,
        concurrency,
        throughput: median(rounds.iter().map(|r| r.load.throughput).collect()),
        p50_ms: median(rounds.iter().map(|r| r.load.p50_ms).collect()),
        p99_ms: median(rounds.iter().map(|r| r.load.p99_ms).collect()),
        errors,
        requests,
        per_request,
        rounds,
    }
}

/// SQLite has no statement counter: a second pair of servers on fresh
/// files logs every statement sqlx runs (`sqlx::query=debug`, counted on
/// their stderr), and the WAL's commit frames count the commits; a fixed
/// number of requests per scenario, untimed.
async fn sqlite_counts(
    cfg: &Config,
    bins: &Bins,
    dir: &Path,
    tokens: &Path,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Vec<Count>> {
    let idem = dir.join("count_idem.db");
    let base = dir.join("count_base.db");
    let stack = start_stack(
        bins,
        dir,
        tokens,
        &format!("sqlite://{}", idem.display()),
        &format!("sqlite://{}", base.display()),
        Some("warn,sqlx::query=debug"),
    )
    .await?;
    let c = 4.min(cfg.callers);
    if cfg.scenarios.contains(&Scenario::Replay) {
        prewarm(stack.server.addr, c, cfg.replay_keys_per_caller).await?;
    }
    let mut out = Vec::new();
    for (i, scenario) in [
        Scenario::Baseline,
        Scenario::First,
        Scenario::Replay,
        Scenario::Payments,
    ]
    .into_iter()
    .enumerate()
    {
        if !cfg.scenarios.contains(&scenario) {
            continue;
        }
        let (child, db) = if scenario == Scenario::Baseline {
            (&stack.baseline, &base)
        } else {
            (&stack.server, &idem)
        };
        out.push(count_one(cfg, child, db, scenario, 1_000_000 + i as u64, progress).await?);
    }
    stack.server.stop().await;
    stack.baseline.stop().await;
    stack.processor.stop().await;
    Ok(out)
}
