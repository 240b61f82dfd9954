//! The benchmark commands the READMEs show select what they say: every
//! `cargo run ... -p idem-bench -- ...` line's `--scenarios` list is one
//! the benchmark accepts, so a reader who pastes it gets a run, not an
//! "unknown scenario" error.
#![allow(clippy::unwrap_used, missing_docs)]

use std::path::PathBuf;

/// The arguments after `--` of every idem-bench command in `text`, with
/// shell line continuations joined.
fn bench_commands(text: &str) -> Vec<Vec<String>> {
    let joined = text.replace("\\\n", " ");
    joined
        .lines()
        .filter_map(|l| l.trim().strip_prefix("cargo run --release -p idem-bench"))
        .map(|rest| {
            let rest = rest.trim().strip_prefix("--").unwrap_or("");
            rest.split_whitespace().map(str::to_owned).collect()
        })
        .collect()
}

#[test]
fn every_documented_scenario_list_is_accepted() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut seen = 0;
    for file in [root.join("README.md"), root.join("../README.md")] {
        let text = std::fs::read_to_string(&file).unwrap();
        for args in bench_commands(&text) {
            seen += 1;
            if let Some(i) = args.iter().position(|a| a == "--scenarios") {
                let names: Vec<String> = args[i + 1].split(',').map(str::to_owned).collect();
                let mut cfg = idem_bench::Config::full(PathBuf::new());
                idem_bench::config::select(&mut cfg, &names)
                    .unwrap_or_else(|e| panic!("{}: {args:?}: {e}", file.display()));
                assert!(
                    !cfg.scenarios.is_empty() || cfg.concurrent || cfg.stages,
                    "{}: {args:?} selects nothing",
                    file.display()
                );
            }
        }
    }
    // The READMEs show the default run, the minimal app's, the full run's
    // and the durable pair's commands at least.
    assert!(seen >= 4, "only {seen} idem-bench commands found");
}
