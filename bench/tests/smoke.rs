//! The benchmark end to end in a tiny configuration: every cell is there,
//! every answer was the expected one, and the counters are sane (a first
//! execution commits, a replay does not, the layer runs more statements
//! than the baseline). Nothing here looks at a timing.
#![allow(clippy::unwrap_used, missing_docs)]

use std::path::PathBuf;
use std::time::Duration;

use idem_bench::{Config, Scenario, StoreKind};

fn tiny() -> Config {
    let mut cfg = Config::full(PathBuf::from(env!("CARGO_BIN_EXE_idem-bench")));
    cfg.concurrencies = vec![1, 4];
    cfg.ratio_concurrencies = vec![1, 4];
    cfg.duration = Duration::from_millis(250);
    cfg.warmup = Duration::from_millis(50);
    cfg.rounds = 1;
    cfg.rss_connections = 32;
    cfg.count_requests = 40;
    cfg.callers = 4;
    cfg.replay_keys_per_caller = 4;
    cfg.concurrent_requests = 40;
    // PostgreSQL runs in a throwaway cluster of its own; like every
    // PostgreSQL test here it runs when IDEM_TEST_DATABASE_URL says the
    // machine has PostgreSQL.
    cfg.stores = if std::env::var_os("IDEM_TEST_DATABASE_URL").is_some() {
        vec![StoreKind::Sqlite, StoreKind::Postgres]
    } else {
        eprintln!("\n*** SKIPPED the PostgreSQL half: IDEM_TEST_DATABASE_URL is not set ***\n");
        vec![StoreKind::Sqlite]
    };
    // MySQL runs on the machine's server (a database of its own), which
    // IDEM_TEST_MYSQL_URL names, as for every MySQL test here.
    match std::env::var("IDEM_TEST_MYSQL_URL") {
        Ok(url) => {
            cfg.mysql_url = url;
            cfg.stores.push(StoreKind::MySql);
        }
        Err(_) => eprintln!("\n*** SKIPPED the MySQL third: IDEM_TEST_MYSQL_URL is not set ***\n"),
    }
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_run_has_every_cell_and_sane_counters() {
    let mut cfg = tiny();
    // The servers' scenarios (issue 13); the minimal app has its own test.
    idem_bench::config::select(&mut cfg, &["transfers".into(), "payments".into()]).unwrap();
    let result = idem_bench::run(&cfg, &|line: &str| eprintln!("{line}"))
        .await
        .unwrap();
    assert_eq!(result.stores.len(), cfg.stores.len());
    for s in &result.stores {
        assert_eq!(s.skipped, None, "{} was skipped", s.store);
        assert_eq!(
            s.cells.len(),
            Scenario::SERVER.len() * cfg.concurrencies.len()
        );
        for scenario in Scenario::SERVER {
            for &c in &cfg.concurrencies {
                let cell = s
                    .cell(scenario, c)
                    .unwrap_or_else(|| panic!("{} has no {scenario:?} c={c}", s.store));
                assert!(
                    cell.requests > 0,
                    "{} {scenario:?} c={c}: no request",
                    s.store
                );
                assert_eq!(
                    cell.errors, 0,
                    "{} {scenario:?} c={c}: {:?}",
                    s.store, cell.rounds[0].load.first_error
                );
                assert!(cell.throughput > 0.0 && cell.p99_ms >= cell.p50_ms);
            }
        }
        let per = |scenario, what: fn(&idem_bench::results::PerRequest) -> Option<f64>| {
            let v: Vec<f64> = cfg
                .concurrencies
                .iter()
                .map(|&c| what(&s.cell(scenario, c).unwrap().per_request).unwrap())
                .collect();
            v.iter().sum::<f64>() / v.len() as f64
        };
        if s.store == StoreKind::MySql {
            // A shared server: no per-session statements, commits or
            // database CPU (bench/src/mysql.rs); the load figures above are
            // all it reports.
            continue;
        }
        let commits = |scenario| per(scenario, |p| p.commits);
        let statements = |scenario| per(scenario, |p| p.statements);
        // A first execution and a baseline transfer each commit one write
        // transaction (a little more is background work: the completer's
        // scans, autovacuum); a replay writes nothing.
        for scenario in [Scenario::First, Scenario::Baseline] {
            let k = commits(scenario);
            assert!(
                (0.95..1.5).contains(&k),
                "{} {scenario:?}: {k} commits",
                s.store
            );
        }
        assert!(
            commits(Scenario::Replay) < 0.05,
            "{}: a replay committed",
            s.store
        );
        // Multi-step: several recovery points.
        assert!(commits(Scenario::Payments) >= 2.0, "{}", s.store);
        // The layer's statements come on top of the handler's. A replay is
        // one plain read on both stores, outside any transaction (SQLite:
        // outside the writer; PostgreSQL: no BEGIN, no lock), the
        // single-phase protocol in store/mod.rs of axum-idempotency.
        assert!(statements(Scenario::Baseline) >= 4.0, "{}", s.store);
        assert!(statements(Scenario::First) > statements(Scenario::Baseline));
        let replay = statements(Scenario::Replay);
        assert!((0.9..2.0).contains(&replay), "{}: replay {replay}", s.store);
        for cell in &s.cells {
            assert!(cell.per_request.server_cpu_us.is_some());
        }
        if s.store == StoreKind::Postgres {
            assert!(per(Scenario::First, |p| p.db_cpu_us) > 0.0);
            assert!(per(Scenario::First, |p| p.wal_bytes) > 0.0);
        }
        let m = &s.memory;
        assert!(m.idle_kib.is_some_and(|k| k > 0));
        assert!(m.peak_kib >= m.idle_kib);
        assert_eq!(m.load.as_ref().unwrap().errors, 0);
    }
    // Every target is computed (4 per ratio concurrency pair, payments, RSS).
    let expected = cfg.stores.len() * (2 * cfg.ratio_concurrencies.len() + 2);
    assert_eq!(result.targets.len(), expected);
    assert!(
        result
            .targets
            .iter()
            .all(|t| t.value.is_some() && (t.pass.is_some() || t.store == "MySQL"))
    );

    // The written JSON holds the same cells, and the Markdown the targets.
    let dir = std::env::temp_dir().join(format!("idem-bench-smoke-{}", std::process::id()));
    let md = idem_bench::write(&result, &dir.join("r.json")).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("r.json")).unwrap()).unwrap();
    for (i, s) in result.stores.iter().enumerate() {
        assert_eq!(
            json["stores"][i]["cells"].as_array().unwrap().len(),
            s.cells.len()
        );
    }
    let text = std::fs::read_to_string(md).unwrap();
    assert!(text.contains("first / baseline") && text.contains("| SQLite | replay |"));
    std::fs::remove_dir_all(dir).ok();
}

/// The minimal app (issue 19) end to end in a tiny configuration: its four
/// cells answer as expected, the layer adds statements and a write-nothing
/// request without it commits nothing, the concurrency scenario's requests
/// all get 201 with exactly one row each, and the stage pass sees one
/// request span and one handler span per request. No timing is asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_minimal_app_answers_every_route_with_one_effect_each() {
    let mut cfg = tiny();
    idem_bench::config::select(&mut cfg, &["minimal".into(), "concurrent".into()]).unwrap();
    assert!(!cfg.needs_servers() && cfg.concurrent && cfg.stages);
    let result = idem_bench::run(&cfg, &|line: &str| eprintln!("{line}"))
        .await
        .unwrap();
    for s in &result.stores {
        assert_eq!(s.skipped, None, "{} was skipped", s.store);
        assert_eq!(
            s.cells.len(),
            Scenario::MINIMAL.len() * cfg.concurrencies.len()
        );
        for cell in &s.cells {
            assert!(cell.scenario.is_minimal());
            assert!(cell.requests > 0, "{} {:?}", s.store, cell.scenario);
            assert_eq!(
                cell.errors, 0,
                "{} {:?}: {:?}",
                s.store, cell.scenario, cell.rounds[0].load.first_error
            );
        }
        let per = |scenario, what: fn(&idem_bench::results::PerRequest) -> Option<f64>| {
            let v: Vec<f64> = cfg
                .concurrencies
                .iter()
                .map(|&c| what(&s.cell(scenario, c).unwrap().per_request).unwrap())
                .collect();
            v.iter().sum::<f64>() / v.len() as f64
        };
        if s.store == StoreKind::MySql {
            // A shared server: no per-session statements, commits or
            // database CPU (bench/src/mysql.rs); the load figures above are
            // all it reports.
            continue;
        }
        let commits = |scenario| per(scenario, |p| p.commits);
        let statements = |scenario| per(scenario, |p| p.statements);
        // One row with or without the layer is one write transaction; with
        // the layer the stored answer commits with it. Nothing written and
        // no layer: no transaction at all.
        for scenario in [
            Scenario::MinWrite,
            Scenario::MinWritePlain,
            Scenario::MinNone,
        ] {
            let k = commits(scenario);
            assert!((0.95..1.5).contains(&k), "{} {scenario:?}: {k}", s.store);
        }
        assert!(commits(Scenario::MinNonePlain) < 0.05, "{}", s.store);
        assert!(statements(Scenario::MinNonePlain) < 0.05, "{}", s.store);
        assert!(statements(Scenario::MinWritePlain) >= 0.95, "{}", s.store);
        assert!(
            statements(Scenario::MinWrite) > statements(Scenario::MinWritePlain),
            "{}",
            s.store
        );
        // Both concurrency runs: every request created its one row.
        assert_eq!(s.concurrent.len(), 2);
        for r in &s.concurrent {
            let n = cfg.concurrent_requests as u64;
            assert_eq!(
                (r.created, r.errors, r.effects, r.distinct_effects),
                (n, 0, n, n),
                "{} layer {}: {:?}",
                s.store,
                r.layer,
                r.first_error
            );
        }
        // Stage pass: each scenario at c = 1 and at the first ratio
        // concurrency, one request span and one handler span per request.
        assert_eq!(s.stages.len(), 2 * Scenario::MINIMAL.len());
        for p in &s.stages {
            for name in ["minimal.request", "minimal.handler"] {
                let st = p
                    .stages
                    .iter()
                    .find(|x| x.name == name)
                    .unwrap_or_else(|| panic!("{} {:?}: no {name}", s.store, p.scenario));
                assert!(
                    (st.per_request - 1.0).abs() < 1e-9,
                    "{} {:?} {name}: {}",
                    s.store,
                    p.scenario,
                    st.per_request
                );
                assert!(st.wall_us >= st.busy_us && st.busy_us > 0.0);
            }
        }
    }
    // Targets: the write pair at each ratio concurrency (PASS or MISS), the
    // writes-nothing pair (reported), the concurrency scenario.
    let expected = cfg.stores.len() * (2 * cfg.ratio_concurrencies.len() + 1);
    assert_eq!(result.targets.len(), expected);
    let md = idem_bench::report::markdown(&result);
    assert!(md.contains("| SQLite | min-write | 1 |") && md.contains("minimal.handler"));
}

/// The durable cells (issue 33) end to end on SQLite: the minimal write
/// pair and the transfer pair on apps whose pools flush every commit, each
/// answering as expected and committing once per write, the report naming
/// the settings, and both durable ratios computed. No timing is asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_durable_cells_run_on_sqlite_with_full_synchronous() {
    let mut cfg = tiny();
    cfg.stores = vec![StoreKind::Sqlite];
    idem_bench::config::select(&mut cfg, &["durable".into()]).unwrap();
    assert!(cfg.needs_servers() && !cfg.needs_stack());
    let result = idem_bench::run(&cfg, &|line: &str| eprintln!("{line}"))
        .await
        .unwrap();
    let s = &result.stores[0];
    assert_eq!(s.skipped, None);
    assert_eq!(
        s.cells.len(),
        Scenario::DURABLE.len() * cfg.concurrencies.len()
    );
    for cell in &s.cells {
        assert!(cell.scenario.is_durable(), "{:?}", cell.scenario);
        assert!(cell.requests > 0, "{:?}", cell.scenario);
        assert_eq!(
            cell.errors, 0,
            "{:?}: {:?}",
            cell.scenario, cell.rounds[0].load.first_error
        );
        let k = cell.per_request.commits.unwrap();
        assert!((0.95..1.5).contains(&k), "{:?}: {k} commits", cell.scenario);
    }
    let statements = |scenario| {
        s.cell(scenario, 1)
            .and_then(|c| c.per_request.statements)
            .unwrap()
    };
    assert!(statements(Scenario::FirstFull) > statements(Scenario::BaselineFull));
    assert!(statements(Scenario::MinWriteFull) > statements(Scenario::MinWritePlainFull));
    let full = |who: &str| {
        s.durability
            .iter()
            .any(|l| l.contains(who) && l.contains("synchronous = FULL"))
    };
    assert!(full("minimal app, *-full cells"), "{:?}", s.durability);
    assert!(
        full("idem-server and baseline, *-full cells"),
        "{:?}",
        s.durability
    );
    // Both durable pairs at each ratio concurrency, nothing else.
    assert_eq!(result.targets.len(), 2 * cfg.ratio_concurrencies.len());
    assert!(
        result
            .targets
            .iter()
            .all(|t| t.ratio.contains("synchronous = FULL") && t.pass.is_some())
    );
}
