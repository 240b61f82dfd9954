//! One measured cell: warm-up, counters before, load, counters after
//! ([`measure_cell`]); and the rounds of a cell summarized into medians
//! and per-request costs ([`summarize`]).

use std::collections::BTreeMap;

use crate::child::ChildServer;
use crate::config::{Config, Scenario, StoreKind};
use crate::load::{self, Load, LoadResult};
use crate::pg::{Cluster, PgCounters, StatementTotals, statements_between};
use crate::results::{Cell, Count, PerRequest, Round};
use crate::{Result, procfs};

/// Where a cell runs and what it reads its counters from.
#[derive(Clone, Copy)]
pub struct CellAt<'a> {
    /// The store (for the progress line).
    pub kind: StoreKind,
    /// The process serving the cell.
    pub child: &'a ChildServer,
    /// PostgreSQL: the cluster and the cell's database.
    pub pg: Option<(&'a Cluster, &'a str)>,
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

fn delta(before: &Snapshot, after: Snapshot) -> (u64, u64, Option<u64>, Option<PgCounters>) {
    (
        after.server.saturating_sub(before.server),
        after.client.saturating_sub(before.client),
        before
            .db
            .as_ref()
            .zip(after.db.as_ref())
            .map(|(b, a)| procfs::tree_delta(b, a)),
        before.pg.zip(after.pg).map(|(b, a)| PgCounters {
            statements: a.statements.saturating_sub(b.statements),
            commit_statements: a.commit_statements.saturating_sub(b.commit_statements),
            next_xid: a.next_xid.saturating_sub(b.next_xid),
            wal_bytes: a.wal_bytes.saturating_sub(b.wal_bytes),
        }),
    )
}

/// One round of one cell: warm-up, counters before, load, counters after.
/// `tag` numbers the loads of the session (each gets its own keys, so the
/// measured first executions are first).
pub async fn measure_cell(
    cfg: &Config,
    at: CellAt<'_>,
    (scenario, c): (Scenario, usize),
    tag: &mut u64,
    round: usize,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Round> {
    let mut cell = |duration| {
        *tag += 1;
        let (make, expect) =
            crate::scenario::requests(scenario, cfg.callers, cfg.replay_keys_per_caller, *tag);
        Load {
            addr: at.child.addr,
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
    let stmts_before = match at.pg {
        Some((c, db)) => Some(c.statements(db).await?),
        None => None,
    };
    let before = snapshot(at.child.pid, at.pg, true).await?;
    let result = load::run(measured).await;
    let after = snapshot(at.child.pid, at.pg, false).await?;
    let statements = match (at.pg, stmts_before) {
        (Some((c, db)), Some(b)) => statements_between(&b, &c.statements(db).await?),
        _ => Vec::new(),
    };
    let (server_ticks, client_ticks, db_ticks, pg) = delta(&before, after);
    let r = Round {
        statements,
        server_ticks,
        client_ticks,
        db_ticks,
        pg,
        load: LoadResult {
            errors: result.errors + warm.errors,
            first_error: result.first_error.clone().or(warm.first_error),
            ..result
        },
    };
    progress(&format!(
        "{} round {}/{} {:>20} c={c:<3} {:>8.0} req/s  p50 {:>7.2} ms  p99 {:>7.2} ms{}",
        at.kind,
        round + 1,
        cfg.rounds,
        scenario.name(),
        r.load.throughput,
        r.load.p50_ms,
        r.load.p99_ms,
        match &r.load.first_error {
            Some(e) => format!("  ERRORS {}: {e}", r.load.errors),
            None => String::new(),
        }
    ));
    Ok(r)
}

/// A cell from its rounds: medians of throughput and latency, and the
/// per-request costs (statements and commits from PostgreSQL's counters,
/// else from the SQLite counting pass in `counts`).
pub fn summarize(
    scenario: Scenario,
    concurrency: usize,
    rounds: Vec<Round>,
    counts: &[Count],
) -> Cell {
    let requests: u64 = rounds.iter().map(|r| r.load.ok).sum();
    let errors = rounds.iter().map(|r| r.load.errors).sum();
    let per_request = per_request(scenario, &rounds, requests, counts);
    Cell {
        statements: statement_totals(&rounds),
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

fn per_request(
    scenario: Scenario,
    rounds: &[Round],
    requests: u64,
    counts: &[Count],
) -> PerRequest {
    let per = |total: u64| (requests > 0).then(|| total as f64 / requests as f64);
    let us = 1e6 / procfs::ticks_per_second() as f64;
    let pg: Option<Vec<PgCounters>> = rounds.iter().map(|r| r.pg).collect();
    let count = counts.iter().find(|c| c.scenario == scenario);
    PerRequest {
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
    }
}

/// PostgreSQL: each statement's calls and time over all rounds, most
/// calls first.
fn statement_totals(rounds: &[Round]) -> Vec<StatementTotals> {
    let mut by_query: BTreeMap<String, StatementTotals> = BTreeMap::new();
    for s in rounds.iter().flat_map(|r| &r.statements) {
        let e = by_query.entry(s.query.clone()).or_default();
        e.query.clone_from(&s.query);
        e.calls += s.calls;
        e.exec_ms += s.exec_ms;
    }
    let mut statements: Vec<StatementTotals> = by_query.into_values().collect();
    statements.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.query.cmp(&b.query)));
    statements
}
