//! Issue 13's targets, computed from one run, and the Markdown report.

use std::fmt::Write;

use serde::Serialize;

use crate::run::{BenchResult, Config, Scenario, StoreResult};

/// One target of issue 13 and whether this run met it.
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

/// Commits per payment allowed by the target.
pub const MAX_PAYMENT_COMMITS: f64 = 4.0;
/// Server memory allowed at many connections, MiB.
pub const MAX_RSS_MIB: f64 = 64.0;

fn ratio(s: &StoreResult, a: Scenario, b: Scenario, c: usize) -> Option<f64> {
    let (x, y) = (s.cell(a, c)?.throughput, s.cell(b, c)?.throughput);
    (y > 0.0).then(|| x / y)
}

/// Minimal app: first execution writing one row over the same write
/// without the layer (issue 19).
pub const MIN_WRITE_RATIO: f64 = 0.5;

/// The targets, per store, for the scenarios that ran: first/baseline
/// (≥ 0.85) and replay/first (≥ 5) at each ratio concurrency,
/// payments/processor (≥ 0.8 with ≤ 4 commits) at the largest, RSS at many
/// connections (< 64 MiB); the minimal app's write pair (≥ 0.5; issue 19
/// sets it for SQLite, it is held to PostgreSQL too) and its writes-nothing
/// pair (reported, no target); the concurrency scenario (all 201, one
/// effect each, within the limit).
pub fn targets(cfg: &Config, stores: &[StoreResult]) -> Vec<Target> {
    let mut out = Vec::new();
    let ran = |x: Scenario| cfg.scenarios.contains(&x);
    for s in stores.iter().filter(|s| s.skipped.is_none()) {
        let store = s.store.to_string();
        if ran(Scenario::MinWrite) && ran(Scenario::MinWritePlain) {
            for &c in &cfg.ratio_concurrencies {
                let v = ratio(s, Scenario::MinWrite, Scenario::MinWritePlain, c);
                out.push(Target {
                    ratio: "minimal: write one row / same write without layer".into(),
                    store: store.clone(),
                    concurrency: c,
                    value: v,
                    target: format!(">= {MIN_WRITE_RATIO}"),
                    pass: v.map(|v| v >= MIN_WRITE_RATIO),
                    note: String::new(),
                });
            }
        }
        if ran(Scenario::MinNone) && ran(Scenario::MinNonePlain) {
            for &c in &cfg.ratio_concurrencies {
                let v = ratio(s, Scenario::MinNone, Scenario::MinNonePlain, c);
                out.push(Target {
                    ratio: "minimal: write nothing / same without layer".into(),
                    store: store.clone(),
                    concurrency: c,
                    value: v,
                    target: "(reported)".into(),
                    pass: None,
                    note: String::new(),
                });
            }
        }
        if let Some(r) = s.concurrent.iter().find(|r| r.layer) {
            let limit = cfg.concurrent_limit.as_secs_f64();
            let all = r.requests as u64;
            let plain = s
                .concurrent
                .iter()
                .find(|r| !r.layer)
                .map_or(String::new(), |p| {
                    format!(
                        "; without the layer {:.2} s, {}/{} 201",
                        p.elapsed_s, p.created, p.requests
                    )
                });
            out.push(Target {
                ratio: format!(
                    "{} concurrent first executions, {} ms before the write, s",
                    r.requests, r.sleep_ms
                ),
                store: store.clone(),
                concurrency: r.requests,
                value: Some(r.elapsed_s),
                target: format!("<= {limit} s, all 201, one effect each"),
                pass: Some(
                    r.elapsed_s <= limit
                        && r.created == all
                        && r.errors == 0
                        && r.effects == all
                        && r.distinct_effects == all,
                ),
                note: format!(
                    "{}/{} 201, {} effects ({} distinct), pool {}{plain}",
                    r.created, all, r.effects, r.distinct_effects, r.pool
                ),
            });
        }
        if !(ran(Scenario::First) && ran(Scenario::Baseline)) {
            continue;
        }
        for &c in &cfg.ratio_concurrencies {
            let v = ratio(s, Scenario::First, Scenario::Baseline, c);
            out.push(Target {
                ratio: "first / baseline".into(),
                store: store.clone(),
                concurrency: c,
                value: v,
                target: ">= 0.85".into(),
                pass: v.map(|v| v >= 0.85),
                note: String::new(),
            });
        }
        for &c in cfg
            .ratio_concurrencies
            .iter()
            .filter(|_| ran(Scenario::Replay))
        {
            let v = ratio(s, Scenario::Replay, Scenario::First, c);
            out.push(Target {
                ratio: "replay / first".into(),
                store: store.clone(),
                concurrency: c,
                value: v,
                target: ">= 5".into(),
                pass: v.map(|v| v >= 5.0),
                note: String::new(),
            });
        }
        if let Some(&c) = cfg
            .ratio_concurrencies
            .iter()
            .max()
            .filter(|_| ran(Scenario::Payments) && ran(Scenario::Processor))
        {
            let v = ratio(s, Scenario::Payments, Scenario::Processor, c);
            let commits = s
                .cell(Scenario::Payments, c)
                .and_then(|x| x.per_request.commits);
            out.push(Target {
                ratio: "payments / processor".into(),
                store: store.clone(),
                concurrency: c,
                value: v,
                target: ">= 0.8, <= 4 commits".into(),
                pass: v
                    .zip(commits)
                    .map(|(v, k)| v >= 0.8 && k <= MAX_PAYMENT_COMMITS),
                note: commits.map_or("commits n/a".into(), |k| {
                    format!("{k:.2} commits per payment")
                }),
            });
        }
        let mib = s.memory.peak_kib.map(|k| k as f64 / 1024.0);
        out.push(Target {
            ratio: "server RSS, MiB".into(),
            store,
            concurrency: s.memory.connections,
            value: mib,
            target: "< 64".into(),
            pass: mib.map(|m| m < MAX_RSS_MIB),
            note: format!(
                "idle {}",
                s.memory
                    .idle_kib
                    .map_or("n/a".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
            ),
        });
    }
    out
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.digits$}"))
}

/// The run as Markdown: machine line, targets, then every cell.
pub fn markdown(r: &BenchResult) -> String {
    let mut m = String::new();
    let cfg = &r.config;
    let _ = writeln!(
        m,
        "Measured {} on {} × {} (`nproc` {}), {} build, {} round(s) of {} ms per cell (medians), \
         {} callers; load generator on the same machine. Only ratios are meaningful on a shared machine.\n",
        &r.started_at[..10],
        r.machine.nproc,
        r.machine.cpu_model,
        r.machine.nproc,
        if cfg.release { "release" } else { "debug" },
        cfg.rounds,
        cfg.duration.as_millis(),
        cfg.callers,
    );
    let _ = writeln!(m, "| Target | Store | c | Measured | Target | Result |");
    let _ = writeln!(m, "|---|---|---|---|---|---|");
    for t in &r.targets {
        let _ = writeln!(
            m,
            "| {} | {} | {} | {}{} | {} | {} |",
            t.ratio,
            t.store,
            t.concurrency,
            opt(t.value, 2),
            if t.note.is_empty() {
                String::new()
            } else {
                format!(" ({})", t.note)
            },
            t.target,
            match t.pass {
                Some(true) => "PASS",
                Some(false) => "MISS",
                None if t.value.is_some() => "—",
                None => "n/a",
            }
        );
    }
    for s in &r.stores {
        if let Some(why) = &s.skipped {
            let _ = writeln!(m, "\n{} skipped: {why}", s.store);
        }
    }
    let _ = writeln!(
        m,
        "\n| Store | Scenario | c | req/s | p50 ms | p99 ms | statements/req | commits/req | server CPU µs/req | DB CPU µs/req | client CPU µs/req | errors |"
    );
    let _ = writeln!(m, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for s in r.stores.iter().filter(|s| s.skipped.is_none()) {
        for c in &s.cells {
            let p = &c.per_request;
            let _ = writeln!(
                m,
                "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {} |",
                s.store,
                c.scenario.name(),
                c.concurrency,
                c.throughput,
                c.p50_ms,
                c.p99_ms,
                opt(p.statements, 1),
                opt(p.commits, 2),
                opt(p.server_cpu_us, 0),
                opt(p.db_cpu_us, 0),
                opt(p.client_cpu_us, 0),
                c.errors
            );
        }
    }
    // Where a request's statements go, at the first ratio concurrency
    // (scenarios that did not run are skipped).
    if let (Some(pg), Some(&c)) = (
        r.stores
            .iter()
            .find(|s| s.store == crate::run::StoreKind::Postgres && s.skipped.is_none()),
        cfg.ratio_concurrencies.first(),
    ) {
        for scenario in [
            Scenario::First,
            Scenario::Baseline,
            Scenario::Payments,
            Scenario::MinWrite,
            Scenario::MinWritePlain,
            Scenario::MinNone,
        ] {
            let Some(cell) = pg.cell(scenario, c) else {
                continue;
            };
            let n = cell.requests.max(1) as f64;
            let _ = writeln!(
                m,
                "\nPostgreSQL, `{}` at c={c}: statements per request (`pg_stat_statements`; execution time \
                 inside PostgreSQL, excluding parse and network)\n\n| calls/req | exec µs/req | statement |\n|---|---|---|",
                scenario.name()
            );
            for s in cell
                .statements
                .iter()
                .filter(|s| s.calls as f64 / n >= 0.05)
            {
                let q: String = s.query.split_whitespace().collect::<Vec<_>>().join(" ");
                let q = if q.len() > 110 {
                    format!("{}…", &q[..q.floor_char_boundary(110)])
                } else {
                    q
                };
                let _ = writeln!(
                    m,
                    "| {:.2} | {:.0} | `{}` |",
                    s.calls as f64 / n,
                    s.exec_ms * 1000.0 / n,
                    q.replace('|', "\\|")
                );
            }
        }
    }
    let conc: Vec<_> = r
        .stores
        .iter()
        .flat_map(|s| s.concurrent.iter().map(move |c| (s.store, c)))
        .collect();
    if !conc.is_empty() {
        let _ = writeln!(
            m,
            "\nConcurrency: N requests at once, distinct keys and callers, handler sleeps before its first write \
             (effects counted in the database afterwards)\n\n| Store | Layer | N | sleep ms | pool | wall s | 201 | errors | effects (distinct) | p50 ms | p99 ms |\n|---|---|---|---|---|---|---|---|---|---|---|"
        );
        for (store, c) in conc {
            let _ = writeln!(
                m,
                "| {store} | {} | {} | {} | {} | {:.2} | {} | {} | {} ({}) | {:.0} | {:.0} |",
                if c.layer { "yes" } else { "no" },
                c.requests,
                c.sleep_ms,
                c.pool,
                c.elapsed_s,
                c.created,
                c.errors,
                c.effects,
                c.distinct_effects,
                c.p50_ms,
                c.p99_ms
            );
        }
    }
    for s in r.stores.iter().filter(|s| !s.stages.is_empty()) {
        let _ = writeln!(
            m,
            "\n{}: where a minimal-app request's time goes (server tracing spans, separate untimed pass; \
             µs per request, wall = creation to close incl. waiting / busy = polled on a thread)\n\n| Scenario | c | stage | spans/req | wall µs | busy µs |\n|---|---|---|---|---|---|",
            s.store
        );
        for p in &s.stages {
            for st in &p.stages {
                let _ = writeln!(
                    m,
                    "| {} | {} | {} | {:.2} | {:.0} | {:.0} |",
                    p.scenario.name(),
                    p.concurrency,
                    st.name,
                    st.per_request,
                    st.wall_us,
                    st.busy_us
                );
            }
        }
    }
    let _ = writeln!(
        m,
        "\nStatements and commits: PostgreSQL from `pg_stat_statements` (calls, BEGIN/COMMIT included) and \
         write transactions (the advance of the next transaction id) in the timed cells; SQLite from a \
         separate untimed pass ({} requests per scenario): sqlx's per-statement log lines plus BEGIN and \
         COMMIT per commit, commits counted as commit frames in the WAL. The processor's own statements \
         (its own SQLite file) are not counted. SQLite runs in-process, so its CPU is in the server's.",
        cfg.count_requests
    );
    m
}
