//! The Markdown report of one run: one function per table, in the order
//! they are printed. It only formats: it reads the result types
//! ([`crate::results`]) and computes nothing the JSON does not hold.

use std::fmt::Write;

use crate::config::{Scenario, StoreKind};
use crate::results::{BenchResult, StoreResult};

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.digits$}"))
}

/// The run as Markdown: machine line, targets, durability settings, every
/// cell, PostgreSQL's statements, the concurrency scenario, the stage
/// times, and how statements and commits were counted.
pub fn markdown(r: &BenchResult) -> String {
    let mut m = String::new();
    machine(&mut m, r);
    targets(&mut m, r);
    for s in &r.stores {
        if let Some(why) = &s.skipped {
            let _ = writeln!(m, "\n{} skipped: {why}", s.store);
        }
    }
    durability(&mut m, r);
    cells(&mut m, r);
    pg_statements(&mut m, r);
    concurrency(&mut m, r);
    for s in r.stores.iter().filter(|s| !s.stages.is_empty()) {
        stages(&mut m, s);
    }
    let _ = writeln!(
        m,
        "\nStatements and commits: PostgreSQL from `pg_stat_statements` (calls, BEGIN/COMMIT included) and \
         write transactions (the advance of the next transaction id) in the timed cells; SQLite from a \
         separate untimed pass ({} requests per scenario): sqlx's per-statement log lines plus BEGIN and \
         COMMIT per commit, commits counted as commit frames in the WAL. The processor's own statements \
         (its own SQLite file) are not counted. SQLite runs in-process, so its CPU is in the server's.",
        r.config.count_requests
    );
    m
}

fn machine(m: &mut String, r: &BenchResult) {
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
}

fn targets(m: &mut String, r: &BenchResult) {
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
}

fn durability(m: &mut String, r: &BenchResult) {
    let lines: Vec<_> = r
        .stores
        .iter()
        .flat_map(|s| s.durability.iter().map(move |d| (s.store, d)))
        .collect();
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(
        m,
        "\nDurability settings, read from the store during the run:\n"
    );
    for (store, d) in lines {
        let _ = writeln!(m, "- {store}: {d}");
    }
}

fn cells(m: &mut String, r: &BenchResult) {
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
}

/// Where a request's statements go on PostgreSQL, at the first ratio
/// concurrency (scenarios that did not run are skipped).
fn pg_statements(m: &mut String, r: &BenchResult) {
    let (Some(pg), Some(&c)) = (
        r.stores
            .iter()
            .find(|s| s.store == StoreKind::Postgres && s.skipped.is_none()),
        r.config.ratio_concurrencies.first(),
    ) else {
        return;
    };
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

fn concurrency(m: &mut String, r: &BenchResult) {
    let conc: Vec<_> = r
        .stores
        .iter()
        .flat_map(|s| s.concurrent.iter().map(move |c| (s.store, c)))
        .collect();
    if conc.is_empty() {
        return;
    }
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

fn stages(m: &mut String, s: &StoreResult) {
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
