//! The SQLite counting pass. SQLite has no statement counter: fresh
//! servers on fresh files log every statement sqlx runs
//! (`sqlx::query=debug`, counted on their stderr), and the WAL's commit
//! frames count the commits; a fixed number of requests per scenario,
//! untimed. PostgreSQL's counters are read in the timed cells instead
//! ([`crate::pg`]).

use std::path::Path;

use crate::apps::{Bins, DURABLE_FLAGS, MINIMAL_DURABLE_FLAGS, MinimalStart, Stack, start_minimal};
use crate::child::ChildServer;
use crate::config::{Config, Scenario};
use crate::load::{self, Load};
use crate::results::Count;
use crate::scenario::transfers::prewarm;
use crate::sqlite_wal::{WalWatch, commits_between};
use crate::{Error, Result};

const LOG: &str = "warn,sqlx::query=debug";

/// The issue-13 scenarios that ran: a fresh stack on fresh files (and one
/// with `--sqlite-synchronous full` for the durable transfer pair).
pub async fn servers(
    cfg: &Config,
    bins: &Bins,
    (dir, tokens): (&Path, &Path),
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Vec<Count>> {
    let mut out = Vec::new();
    for (name, scenarios, extra) in [
        (
            "count",
            [
                Scenario::Baseline,
                Scenario::First,
                Scenario::Replay,
                Scenario::Payments,
            ]
            .as_slice(),
            &[][..],
        ),
        ("count_full", &Scenario::DURABLE_SERVER[..], DURABLE_FLAGS),
    ] {
        let ran = selected(cfg, scenarios);
        if ran.is_empty() {
            continue;
        }
        let idem = dir.join(format!("{name}_idem.db"));
        let base = dir.join(format!("{name}_base.db"));
        let urls = (
            format!("sqlite://{}", idem.display()),
            format!("sqlite://{}", base.display()),
        );
        let stack = Stack::start(bins, (dir, tokens), (&urls.0, &urls.1), extra, Some(LOG)).await?;
        if ran.contains(&Scenario::Replay) {
            prewarm(
                stack.server.addr,
                4.min(cfg.callers),
                cfg.replay_keys_per_caller,
            )
            .await?;
        }
        for scenario in ran {
            let (child, db) = if matches!(scenario, Scenario::Baseline | Scenario::BaselineFull) {
                (&stack.baseline, &base)
            } else {
                (&stack.server, &idem)
            };
            out.push(count_one(cfg, child, db, scenario, tag(scenario), progress).await?);
        }
        stack.stop().await;
    }
    Ok(out)
}

/// Those of `scenarios` the run selected, in their order.
fn selected(cfg: &Config, scenarios: &[Scenario]) -> Vec<Scenario> {
    scenarios
        .iter()
        .copied()
        .filter(|s| cfg.scenarios.contains(s))
        .collect()
}

/// Keys of the counting pass, unique per scenario and apart from the
/// timed cells' tags.
fn tag(scenario: Scenario) -> u64 {
    let i = Scenario::ALL
        .iter()
        .position(|s| *s == scenario)
        .unwrap_or(0);
    3_000_000 + i as u64
}

/// The minimal app's scenarios that ran: a fresh app on its own file
/// (and one with `synchronous = FULL` for the durable pair).
pub async fn minimal(
    cfg: &Config,
    bins: &Bins,
    dir: &Path,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Vec<Count>> {
    let mut out = Vec::new();
    for (name, scenarios, extra) in [
        ("count_min.db", &Scenario::MINIMAL[..], &[][..]),
        (
            "count_min_full.db",
            &Scenario::DURABLE_MINIMAL[..],
            MINIMAL_DURABLE_FLAGS,
        ),
    ] {
        let ran = selected(cfg, scenarios);
        if ran.is_empty() {
            continue;
        }
        let db = dir.join(name);
        let url = format!("sqlite://{}", db.display());
        let app = start_minimal(
            &bins.bench,
            MinimalStart {
                url: &url,
                pool: cfg.minimal_sqlite_pool,
                sleep_ms: 0,
                extra,
                log: Some(LOG),
            },
        )
        .await?;
        for scenario in ran {
            out.push(count_one(cfg, &app, &db, scenario, tag(scenario), progress).await?);
        }
        app.stop().await;
    }
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
    let (make, expect) = crate::scenario::requests(scenario, c, cfg.replay_keys_per_caller, tag);
    let watch = WalWatch::start(db).await?;
    let log0 = child.counted_settled().await;
    let wal0 = watch.count();
    let r = load::run(Load {
        addr: child.addr,
        concurrency: c,
        duration: load::COUNTED_PASS_BOUND,
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
        return Err(Error::Run(format!(
            "counting pass {}: no good answer ({})",
            scenario.name(),
            r.first_error.unwrap_or_default()
        )));
    }
    let n = r.ok as f64;
    let logged = log1.saturating_sub(log0) as f64 / n;
    let commits = commits_between(wal0, wal1).map(|k| k as f64 / n);
    progress(&format!(
        "SQLite counting {:>20}: {logged:.2} logged statements, {} commits per request",
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
