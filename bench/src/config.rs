//! What a run measures: the stores, the scenarios (every load cell the
//! benchmark knows, in one list), `--scenarios` selection, and the
//! [`Config`] of one run. Plain data: no module here starts anything.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

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
    /// The minimal app on SQLite with `synchronous = FULL` (a flush per
    /// commit): `POST /idem/write`, fresh keys.
    MinWriteFull,
    /// The same app: `POST /plain/write`, the same row without the layer.
    MinWritePlainFull,
    /// `POST /v1/transfers` on a baseline server whose SQLite pool has
    /// `synchronous = FULL` (`--sqlite-synchronous full`), no key.
    BaselineFull,
    /// `POST /v1/transfers` on idem-server with `--sqlite-synchronous
    /// full`, a fresh key per request.
    FirstFull,
}

impl Scenario {
    /// Every scenario, in the order a round runs them.
    pub const ALL: [Scenario; 13] = [
        Self::Baseline,
        Self::First,
        Self::Replay,
        Self::Payments,
        Self::Processor,
        Self::MinWritePlain,
        Self::MinWrite,
        Self::MinNonePlain,
        Self::MinNone,
        Self::MinWritePlainFull,
        Self::MinWriteFull,
        Self::BaselineFull,
        Self::FirstFull,
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

    /// The minimal app's write pair and the transfer pair with durable
    /// settings (issue 33): on SQLite `synchronous = FULL`. PostgreSQL's
    /// cells already run on its default `fsync = on`, `synchronous_commit =
    /// on`, so these run on SQLite only ([`Scenario::runs_on`]).
    pub const DURABLE: [Scenario; 4] = [
        Self::MinWritePlainFull,
        Self::MinWriteFull,
        Self::BaselineFull,
        Self::FirstFull,
    ];

    /// The durable cells of the minimal app.
    pub const DURABLE_MINIMAL: [Scenario; 2] = [Self::MinWritePlainFull, Self::MinWriteFull];

    /// The durable cells of idem-server and the baseline.
    pub const DURABLE_SERVER: [Scenario; 2] = [Self::BaselineFull, Self::FirstFull];

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
            Self::MinWriteFull => "min-write-full",
            Self::MinWritePlainFull => "min-write-plain-full",
            Self::BaselineFull => "baseline-full",
            Self::FirstFull => "first-full",
        }
    }

    /// Whether it runs on the minimal app (its durable pair included).
    pub fn is_minimal(self) -> bool {
        Self::MINIMAL.contains(&self) || Self::DURABLE_MINIMAL.contains(&self)
    }

    /// Whether it runs on the minimal app started with durable settings.
    pub fn is_durable(self) -> bool {
        Self::DURABLE.contains(&self)
    }

    /// Whether it is run on `store`: the durable cells only where durability
    /// is a setting of the app's connections (SQLite's `synchronous`).
    pub fn runs_on(self, store: StoreKind) -> bool {
        !self.is_durable() || store == StoreKind::Sqlite
    }

    /// Whether its writes run in explicit transactions (BEGIN ... COMMIT,
    /// which sqlx's SQLite driver does not log; see [`crate::results::Count`]) rather than
    /// as an autocommitted statement.
    pub fn explicit_tx(self) -> bool {
        !matches!(
            self,
            Self::MinWritePlain | Self::MinWritePlainFull | Self::MinNonePlain | Self::Processor
        )
    }
}

/// What `--scenarios` selects: `transfers` (baseline, first, replay),
/// `payments` (payments, processor), `minimal` (the four minimal-app cells
/// and the stage-times pass), `durable` (the minimal write pair and the
/// transfer pair on SQLite with `synchronous = FULL`), `concurrent` (the timed concurrency
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
            "durable" => &Scenario::DURABLE,
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
                        "unknown scenario {other:?}: all, transfers, payments, minimal, durable, concurrent, stages, or one of {}",
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
    /// Run the timed concurrency scenario ([`crate::results::Concurrent`]).
    pub concurrent: bool,
    /// Run the stage-times pass of the minimal app ([`crate::results::StagePass`]).
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

impl Config {
    /// Whether idem-server, the baseline and the processor are needed
    /// (with default or durable settings).
    pub fn needs_servers(&self) -> bool {
        self.scenarios.iter().any(|s| !s.is_minimal())
    }

    /// Whether the stack with the library's default settings is needed.
    pub fn needs_stack(&self) -> bool {
        self.scenarios.iter().any(|s| Scenario::SERVER.contains(s))
    }

    /// Whether the stack with durable settings is needed on `store`.
    pub fn needs_durable_stack(&self, store: StoreKind) -> bool {
        self.runs_any(&Scenario::DURABLE_SERVER, store)
    }

    /// Whether the minimal app with durable settings is needed on `store`.
    pub fn needs_durable_minimal(&self, store: StoreKind) -> bool {
        self.runs_any(&Scenario::DURABLE_MINIMAL, store)
    }

    fn runs_any(&self, of: &[Scenario], store: StoreKind) -> bool {
        self.scenarios
            .iter()
            .any(|s| of.contains(s) && s.runs_on(store))
    }

    /// Whether the minimal app is needed.
    pub fn needs_minimal(&self) -> bool {
        self.concurrent || self.stages || self.scenarios.iter().any(|s| s.is_minimal())
    }
}
