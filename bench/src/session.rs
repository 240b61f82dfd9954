//! One store session: its databases and processes up, every cell
//! `rounds` times (interleaved: round 1 runs every cell, then round 2 ...,
//! so drift of a shared machine hits every cell alike), then the passes
//! that are not timed cells (concurrency, memory, stage times, the SQLite
//! counting pass), collected into a [`StoreResult`].

use std::collections::BTreeMap;
use std::time::Duration;

use crate::Result;
use crate::apps::{
    Bins, DURABLE_FLAGS, Dbs, MINIMAL_DURABLE_FLAGS, MinimalStart, Stack, start_minimal,
    tokens_toml,
};
use crate::child::{ChildServer, TempDir};
use crate::config::{Config, Scenario, StoreKind};
use crate::measure::{CellAt, measure_cell, summarize};
use crate::pg::Cluster;
use crate::results::{Memory, Round, StoreResult};
use crate::scenario::{concurrent, memory, stages, transfers};

/// The running processes of a session.
struct Apps {
    /// idem-server, baseline and processor, when a server scenario runs.
    stack: Option<Stack>,
    /// The same with durable settings (SQLite `synchronous = FULL`), when
    /// the durable transfer pair runs.
    durable_stack: Option<Stack>,
    /// The minimal app and its database, when a minimal scenario runs.
    minimal: Option<(ChildServer, String)>,
    /// The minimal app with durable settings (SQLite `synchronous = FULL`).
    durable: Option<ChildServer>,
    /// The minimal apps' pool size on this store.
    pool: u32,
}

impl Apps {
    /// The process serving `scenario` and the database its counters are
    /// read from.
    fn serving(&self, scenario: Scenario) -> Result<(&ChildServer, Option<&'static str>)> {
        let found = match (scenario, &self.stack) {
            (s, _) if s.is_durable() && s.is_minimal() => self.durable.as_ref().map(|d| (d, None)),
            (s, _) if s.is_minimal() => self.minimal.as_ref().map(|(m, _)| (m, Some("bench_min"))),
            (Scenario::BaselineFull, _) => self.durable_stack.as_ref().map(|d| (&d.baseline, None)),
            (Scenario::FirstFull, _) => self.durable_stack.as_ref().map(|d| (&d.server, None)),
            (Scenario::Baseline, Some(st)) => Some((&st.baseline, Some("bench_base"))),
            (Scenario::Processor, Some(st)) => Some((&st.processor, None)),
            (_, Some(st)) => Some((&st.server, Some("bench_idem"))),
            (_, None) => None,
        };
        found.ok_or_else(|| crate::Error::Setup(format!("no server for {}", scenario.name())))
    }
}

/// Runs every selected cell and pass on `kind`.
pub async fn session(
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
    let apps = start(cfg, bins, kind, &dbs, (dir.path(), &tokens)).await?;
    let mut memory = Memory {
        connections: cfg.rss_connections,
        ..Memory::default()
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    if let Some(stack) = &apps.stack {
        memory.idle_kib = crate::procfs::rss_kib(stack.server.pid);
        if cfg.scenarios.contains(&Scenario::Replay) {
            transfers::prewarm(stack.server.addr, cfg.callers, cfg.replay_keys_per_caller).await?;
        }
    }
    let durability = durability(kind, &dbs, &apps).await?;
    let mut tag = 0u64;
    let rounds = rounds(cfg, kind, &apps, dbs.cluster(), &mut tag, progress).await?;
    let mut concurrent = Vec::new();
    if let (true, Some((m, url))) = (cfg.concurrent, &apps.minimal) {
        for layer in [false, true] {
            tag += 1;
            let r = concurrent::run(cfg, m, (&dbs, url), layer, apps.pool, tag).await?;
            progress(&concurrent::line(kind, &r));
            concurrent.push(r);
        }
    }
    if let (true, Some(stack)) = (cfg.scenarios.contains(&Scenario::First), &apps.stack) {
        tag += 1;
        memory::measure(cfg, &stack.server, tag, &mut memory, kind, progress).await;
    }
    let Apps {
        stack,
        durable_stack,
        minimal,
        durable,
        pool,
    } = apps;
    for app in minimal.map(|(m, _)| m).into_iter().chain(durable) {
        app.stop().await;
    }
    for s in stack.into_iter().chain(durable_stack) {
        s.stop().await;
    }
    let stages = if cfg.stages {
        stages::passes(cfg, &bins.bench, &dbs, pool, kind, progress).await?
    } else {
        Vec::new()
    };
    let counts = match &dbs {
        Dbs::Sqlite { dir } => sqlite_counts(cfg, bins, (dir, &tokens), progress).await?,
        Dbs::Postgres { .. } | Dbs::MySql(_) => Vec::new(),
    };
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
        durability,
    })
}

/// The SQLite counting pass of every scenario that ran, on fresh apps
/// (the timed ones are stopped first: one writer per file); each half
/// starts nothing when none of its scenarios ran.
async fn sqlite_counts(
    cfg: &Config,
    bins: &Bins,
    (dir, tokens): (&std::path::Path, &std::path::Path),
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Vec<crate::results::Count>> {
    let mut counts = crate::counting::servers(cfg, bins, (dir, tokens), progress).await?;
    counts.extend(crate::counting::minimal(cfg, bins, dir, progress).await?);
    Ok(counts)
}

/// Starts what the selected scenarios need: the stack (processor,
/// idem-server, baseline), the same with durable settings, the minimal
/// app, and the durable minimal app.
async fn start(
    cfg: &Config,
    bins: &Bins,
    kind: StoreKind,
    dbs: &Dbs,
    (dir, tokens): (&std::path::Path, &std::path::Path),
) -> Result<Apps> {
    let pool = match kind {
        StoreKind::Sqlite => cfg.minimal_sqlite_pool,
        StoreKind::Postgres | StoreKind::MySql => cfg.minimal_pg_pool,
    };
    let stack = if cfg.needs_stack() {
        let urls = (dbs.url("bench_idem").await?, dbs.url("bench_base").await?);
        Some(Stack::start(bins, (dir, tokens), (&urls.0, &urls.1), &[], None).await?)
    } else {
        None
    };
    let durable_stack = if cfg.needs_durable_stack(kind) {
        let urls = (
            dbs.url("bench_idem_full").await?,
            dbs.url("bench_base_full").await?,
        );
        Some(Stack::start(bins, (dir, tokens), (&urls.0, &urls.1), DURABLE_FLAGS, None).await?)
    } else {
        None
    };
    let minimal_app = |url: String, extra: &'static [&'static str]| async move {
        let m = MinimalStart {
            url: &url,
            pool,
            sleep_ms: cfg.concurrent_sleep_ms,
            extra,
            log: None,
        };
        let app = start_minimal(&bins.bench, m).await?;
        Ok::<_, crate::Error>((app, url))
    };
    let minimal = if cfg.needs_minimal() {
        Some(minimal_app(dbs.url("bench_min").await?, &[]).await?)
    } else {
        None
    };
    let durable = if cfg.needs_durable_minimal(kind) {
        let url = dbs.url("bench_min_full").await?;
        Some(minimal_app(url, MINIMAL_DURABLE_FLAGS).await?.0)
    } else {
        None
    };
    Ok(Apps {
        stack,
        durable_stack,
        minimal,
        durable,
        pool,
    })
}

/// Every timed cell, `cfg.rounds` times, interleaved.
async fn rounds(
    cfg: &Config,
    kind: StoreKind,
    apps: &Apps,
    cluster: Option<&Cluster>,
    tag: &mut u64,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<BTreeMap<(Scenario, usize), Vec<Round>>> {
    let mut rounds: BTreeMap<(Scenario, usize), Vec<Round>> = BTreeMap::new();
    for round in 0..cfg.rounds {
        for &c in &cfg.concurrencies {
            for &scenario in cfg.scenarios.iter().filter(|s| s.runs_on(kind)) {
                let (child, db) = apps.serving(scenario)?;
                let at = CellAt {
                    kind,
                    child,
                    pg: cluster.zip(db),
                };
                let r = measure_cell(cfg, at, (scenario, c), tag, round, progress).await?;
                rounds.entry((scenario, c)).or_default().push(r);
            }
        }
    }
    Ok(rounds)
}

/// The durability settings the cells run with, read from the store: on
/// SQLite from each minimal app's pool (idem-server and the baseline take
/// the library's options from their flags, which the report names; the
/// flag's effect on the pool is the library's and idem-server's tests);
/// on PostgreSQL and MySQL from the server.
async fn durability(kind: StoreKind, dbs: &Dbs, apps: &Apps) -> Result<Vec<String>> {
    let mut out = Vec::new();
    match dbs {
        Dbs::Postgres { cluster } => out.push(cluster.durability().await?),
        Dbs::MySql(server) => out.push(server.durability().await?),
        Dbs::Sqlite { .. } => {
            if apps.stack.is_some() {
                out.push(
                    "idem-server and baseline: the library's recommended options \
                     (journal_mode = wal, synchronous = NORMAL)"
                        .into(),
                );
            }
            if apps.durable_stack.is_some() {
                out.push(format!(
                    "idem-server and baseline, *-full cells: {} (synchronous = FULL)",
                    DURABLE_FLAGS.join(" ")
                ));
            }
            if let Some((m, _)) = &apps.minimal {
                out.push(format!("minimal app: {}", app_settings(m).await?));
            }
        }
    }
    if let Some(d) = &apps.durable {
        let s = app_settings(d).await?;
        // The durable cells must really have run durable.
        if !s.contains("synchronous = FULL") {
            return Err(crate::Error::Run(format!(
                "{kind}: the durable minimal app runs with {s}"
            )));
        }
        out.push(format!("minimal app, *-full cells: {s}"));
    }
    Ok(out)
}

async fn app_settings(app: &ChildServer) -> Result<String> {
    let body = crate::load::get(app.addr, "/_bench/settings")
        .await
        .map_err(|e| crate::Error::Run(format!("GET /_bench/settings: {e}")))?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}
