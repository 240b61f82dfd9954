//! The simulator: its committed outputs are current, and it reproduces the ordering of
//! Brooker's 2015 results.

use std::path::PathBuf;

use idem_client::Jitter;
use idem_client::sim::{self, brooker, outage};

fn book_sim_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(sim::BOOK_SIM_DIR)
}

const REGENERATE: &str = "cargo run --release -p idem-client --features sim --bin idem-sim";

#[test]
fn committed_quick_sweep_and_outage_outputs_are_current() {
    let quick = brooker::run(&brooker::BrookerConfig::quick(), 2);
    let mut artifacts = sim::brooker_artifacts(&quick, "quick/brooker").expect("plots render");
    artifacts.extend(
        sim::outage_artifacts(&outage::run(&outage::OutageConfig::default()))
            .expect("plots render"),
    );
    artifacts.extend(
        sim::outage_artifacts_named(&outage::run(&outage::OutageConfig::restart()), "restart")
            .expect("plots render"),
    );
    let stale = sim::stale(&book_sim_dir(), &artifacts);
    assert!(
        stale.is_empty(),
        "stale: {stale:?}; regenerate with `{REGENERATE}`"
    );
}

#[test]
fn committed_full_sweep_was_made_with_the_current_parameters() {
    // The full sweep is too slow for a debug test (see the ignored test below); this catches a
    // change of parameters without regenerating.
    let table = std::fs::read_to_string(book_sim_dir().join("brooker.md")).expect("brooker.md");
    let want = format!(
        "Parameters: {}.",
        brooker::BrookerConfig::default().describe()
    );
    assert!(
        table.lines().any(|l| l == want),
        "brooker.md was made with other parameters; regenerate with `{REGENERATE}`"
    );
}

/// Regenerates everything and compares byte for byte. Slow in debug; run it in release:
/// `cargo test --release -p idem-client --features sim --test sim -- --ignored`.
#[test]
#[ignore = "full 100-run sweep; run in release"]
fn committed_full_sweep_is_current() {
    let full = brooker::run(&brooker::BrookerConfig::default(), 2);
    let artifacts = sim::brooker_artifacts(&full, "brooker").expect("plots render");
    let stale = sim::stale(&book_sim_dir(), &artifacts);
    assert!(
        stale.is_empty(),
        "stale: {stale:?}; regenerate with `{REGENERATE}`"
    );
}

/// Parses one table (`writes` or `time`) of a committed Brooker Markdown file into
/// (N, [value per strategy in Jitter::ALL order]).
fn parse_table(md: &str, anchor: &str) -> Vec<(u32, Vec<f64>)> {
    let start = md
        .find(&format!("<!-- ANCHOR: {anchor} -->"))
        .expect("anchor present");
    let end = md
        .find(&format!("<!-- ANCHOR_END: {anchor} -->"))
        .expect("anchor end present");
    md[start..end]
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| N"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            let n = cells[0].parse().expect("N");
            let vals = cells[1..]
                .iter()
                .map(|c| c.parse().expect("number"))
                .collect();
            (n, vals)
        })
        .collect()
}

fn idx(j: Jitter) -> usize {
    Jitter::ALL.iter().position(|x| *x == j).expect("listed")
}

// clause: idem.client.backoff-jitter
#[test]
fn the_committed_full_sweep_reproduces_brookers_ordering() {
    use Jitter::*;
    let md = std::fs::read_to_string(book_sim_dir().join("brooker.md")).expect("brooker.md");
    let writes = parse_table(&md, "writes");
    let time = parse_table(&md, "time");
    assert_eq!(
        writes.len(),
        brooker::BrookerConfig::default().clients.len()
    );
    let sum = |t: &[(u32, Vec<f64>)], j: Jitter| t.iter().map(|(_, v)| v[idx(j)]).sum::<f64>();
    for ((n, w), (_, t)) in writes.iter().zip(&time).filter(|((n, _), _)| *n >= 50) {
        // Un-jittered exponential backoff is the clear loser among the backoff strategies: more
        // work and more time than any jittered variant.
        for j in [Full, Equal, Decorrelated] {
            assert!(
                w[idx(Exponential)] > w[idx(j)],
                "N={n}: writes exponential vs {j}"
            );
            assert!(
                t[idx(Exponential)] > t[idx(j)],
                "N={n}: time exponential vs {j}"
            );
        }
        // Backing off at all does less work than retrying at once.
        assert!(w[idx(Jitter::None)] > w[idx(Exponential)], "N={n}");
        // Full jitter does less work than decorrelated; equal jitter takes longer than full.
        assert!(w[idx(Full)] < w[idx(Decorrelated)], "N={n}");
        assert!(t[idx(Equal)] > t[idx(Full)], "N={n}");
    }
    // Over the sweep, full jitter does the least work of all strategies.
    for j in [Jitter::None, Exponential, Equal, Decorrelated] {
        assert!(sum(&writes, Full) < sum(&writes, j), "full vs {j}");
    }
}

// clause: idem.client.backoff-jitter
#[test]
fn a_fresh_sweep_shows_the_same_ordering() {
    use Jitter::*;
    // Independent of the committed file: a smaller sweep with another seed.
    let cfg = brooker::BrookerConfig {
        clients: vec![50, 100],
        runs: 20,
        seed: 77,
        ..brooker::BrookerConfig::default()
    };
    let r = brooker::run(&cfg, 2);
    for &n in &cfg.clients {
        let c = |j| *r.cell(n, j).expect("cell");
        for j in [Full, Equal, Decorrelated] {
            assert!(c(Exponential).mean_writes > c(j).mean_writes, "N={n} {j}");
            assert!(c(Exponential).mean_time_ms > c(j).mean_time_ms, "N={n} {j}");
        }
        assert!(c(Jitter::None).mean_writes > c(Exponential).mean_writes);
        assert!(c(Full).mean_writes < c(Decorrelated).mean_writes);
        assert!(c(Equal).mean_time_ms > c(Full).mean_time_ms);
    }
}
