//! How long a full kit run takes against an API whose handler takes 200 ms
//! (the zoo started with a 200 ms delay), for each dialect, and how much
//! running cases side by side (`limits.parallel_cases`) buys; and the same
//! against a target with the defect that fails (and so re-runs) the most
//! cases, so the figure includes re-runs.
//!
//! ```text
//! cargo bench -p idem-conformance --bench zoo_delay
//! ```
//!
//! The target is a full run in under 30 s; the bench prints each run's wall
//! time, its result, and the ratio of the one-at-a-time run to the
//! parallel one, and exits non-zero if a run misses the target. It is a
//! measurement, not a test: CI runs the table test (`tests/zoo.rs`) with no
//! delay instead.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use idem_conformance::server::{manifest, runner};
use idem_zoo::{Defect, Dialect, ZooConfig};

const DELAY: Duration = Duration::from_millis(200);
const TARGET: Duration = Duration::from_secs(30);

/// A defect that fails several cases at once (scope, the model, both
/// concurrency cases), each re-run.
const MANY_FAILURES: Defect = Defect::LeakReorderedJson;

async fn measure(
    dialect: Dialect,
    defect: Option<Defect>,
    parallel: Option<u32>,
) -> (Duration, String, u64, usize) {
    let zoo = idem_zoo::spawn(ZooConfig {
        dialect,
        defect,
        delay: DELAY,
        quirk: None,
    })
    .await
    .expect("zoo starts");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("zoo/manifests")
        .join(format!("{dialect}.toml"));
    let mut loaded = manifest::load(&path).expect("manifest");
    loaded.manifest.target.base_url = zoo.base_url.clone();
    if let Some(p) = parallel {
        loaded.manifest.limits.parallel_cases = p;
    }
    let started = Instant::now();
    let report = runner::run(
        &loaded,
        &runner::Options {
            seed: Some(1),
            only: None,
            progress: false,
            artifacts_dir: Some(std::env::temp_dir()),
            strict: false,
        },
    )
    .await
    .expect("the preflight passes");
    let took = started.elapsed();
    zoo.shutdown().await;
    (
        took,
        report.summary.result.as_str().to_owned(),
        report.requests,
        report.cases.iter().filter(|c| c.rerun.is_some()).count(),
    )
}

fn main() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut missed = false;
    println!(
        "a full run against the zoo with a {} ms handler:",
        DELAY.as_millis()
    );
    for dialect in Dialect::ALL {
        let (fast, result, requests, _) = rt.block_on(measure(dialect, None, None));
        let (slow, _, _, _) = rt.block_on(measure(dialect, None, Some(1)));
        let (bad, bad_result, bad_requests, reruns) =
            rt.block_on(measure(dialect, Some(MANY_FAILURES), None));
        missed |= fast > TARGET || bad > TARGET;
        println!(
            "  {:<15} {:>5.1} s ({result}, {requests} requests); one case at a time {:>5.1} s: {:.1}x; with {MANY_FAILURES}: {:>5.1} s ({bad_result}, {reruns} cases re-run, {bad_requests} requests)",
            dialect.as_str(),
            fast.as_secs_f64(),
            slow.as_secs_f64(),
            slow.as_secs_f64() / fast.as_secs_f64(),
            bad.as_secs_f64(),
        );
    }
    println!("target: under {} s per run", TARGET.as_secs());
    if missed {
        eprintln!("a run missed the target");
        std::process::exit(1);
    }
}
