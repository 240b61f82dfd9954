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
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Sqlite => "SQLite",
            Self::Postgres => "PostgreSQL",
        })
    }
}

/// What a cell sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
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
}

impl Scenario {
    /// Every scenario, in the order a round runs them.
    pub const ALL: [Scenario; 5] = [
        Self::Baseline,
        Self::First,
        Self::Replay,
        Self::Payments,
        Self::Processor,
    ];

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Baseline => "baseline",
            Self::First => "first",
            Self::Replay => "replay",
            Self::Payments => "payments",
            Self::Processor => "processor",
        }
    }
}

/// What to run.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Stores to run on.
    pub stores: Vec<StoreKind>,
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
    /// The `idem-bench` binary (for `serve-baseline`).
    pub bench_bin: PathBuf,
}

impl Config {
    /// The default run: a few minutes on two cores.
    pub fn full(bench_bin: PathBuf) -> Self {
        Self {
            stores: vec![StoreKind::Sqlite, StoreKind::Postgres],
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
    /// idem-server.
    pub server: PathBuf,
    /// idem-fake-processor.
    pub processor: PathBuf,
    /// idem-bench (serve-baseline).
    pub bench: PathBuf,
}

/// Builds (or finds fresh) the server and processor binaries.
pub fn bins(cfg: &Config) -> Result<Bins> {
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
            Err(e) if kind == StoreKind::Postgres && e.is_setup() => {
                progress(&format!("{kind} skipped: {e}"));
                stores.push(StoreResult {
                    store: kind,
                    skipped: Some(e.to_string()),
                    cells: Vec::new(),
                    memory: Memory::default(),
                    counts: Vec::new(),
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
}

impl Dbs {
    async fn url(&self, name: &str) -> Result<String> {
        match self {
            Self::Sqlite { dir } => Ok(format!(
                "sqlite://{}",
                dir.join(format!("{name}.db")).display()
            )),
            Self::Postgres { cluster } => cluster.create_db(name).await,
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
    };
    let stack = start_stack(
        bins,
        dir.path(),
        &tokens,
        &dbs.url("bench_idem").await?,
        &dbs.url("bench_base").await?,
        None,
    )
    .await?;
    let mut memory = Memory {
        connections: cfg.rss_connections,
        ..Memory::default()
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    memory.idle_kib = procfs::rss_kib(stack.server.pid);
    prewarm(stack.server.addr, cfg.callers, cfg.replay_keys_per_caller).await?;
    let cluster = match &dbs {
        Dbs::Postgres { cluster } => Some(cluster),
        Dbs::Sqlite { .. } => None,
    };
    let mut rounds: BTreeMap<(Scenario, usize), Vec<Round>> = BTreeMap::new();
    let mut tag = 0u64;
    for round in 0..cfg.rounds {
        for &c in &cfg.concurrencies {
            for scenario in Scenario::ALL {
                let (child, db) = match scenario {
                    Scenario::Baseline => (&stack.baseline, Some("bench_base")),
                    Scenario::Processor => (&stack.processor, None),
                    _ => (&stack.server, Some("bench_idem")),
                };
                let pg = cluster.zip(db);
                // Warm-up and measurement each get their own keys (a tag
                // per load), so the measured first executions are first.
                let mut cell = |duration| {
                    tag += 1;
                    let (make, expect) =
                        requests(scenario, cfg.callers, cfg.replay_keys_per_caller, tag);
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
                    "{kind} round {}/{} {:>9} c={c:<3} {:>8.0} req/s  p50 {:>7.2} ms  p99 {:>7.2} ms{}",
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
                rounds.entry((scenario, c)).or_default().push(round_result);
            }
        }
    }
    // Memory at many connections: first executions, the path that holds a
    // request longest (the SQLite writer gate queues them).
    {
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
    let Stack {
        processor,
        server,
        baseline,
    } = stack;
    server.stop().await;
    baseline.stop().await;
    let counts = match &dbs {
        Dbs::Sqlite { dir } => sqlite_counts(cfg, bins, dir, &tokens, progress).await?,
        Dbs::Postgres { .. } => Vec::new(),
    };
    processor.stop().await;
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
    prewarm(stack.server.addr, c, cfg.replay_keys_per_caller).await?;
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
        let (child, db) = if scenario == Scenario::Baseline {
            (&stack.baseline, &base)
        } else {
            (&stack.server, &idem)
        };
        let (make, expect) = requests(
            scenario,
            c,
            cfg.replay_keys_per_caller,
            1_000_000 + i as u64,
        );
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
            "SQLite counting {:>9}: {logged:.2} logged statements, {} commits per request",
            scenario.name(),
            commits.map_or("n/a".into(), |c| format!("{c:.2}"))
        ));
        out.push(Count {
            scenario,
            requests: r.ok,
            logged_statements: logged,
            commits,
            statements: commits.map(|k| logged + 2.0 * k),
        });
    }
    stack.server.stop().await;
    stack.baseline.stop().await;
    stack.processor.stop().await;
    Ok(out)
}
