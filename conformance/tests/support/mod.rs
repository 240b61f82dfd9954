//! Shared helpers of the kit's integration tests: the real reference server
//! as a child process.
//!
//! The tests never link the server: they ask Cargo to build the
//! `idem-server` binary (`idem_conformance::server::demo::build_server`, the same
//! path the `demo` command takes; a no-op when it is fresh) or use
//! `IDEM_SERVER_BIN`, then start it on a temporary SQLite file.

#![allow(dead_code)]

use std::path::PathBuf;

use idem_conformance::server::demo::{self, Stack};
use idem_conformance::server::manifest::{self, Loaded};
use idem_conformance::server::runner::{self, Options};
use idem_spec::report::Report;

/// The server binary, or None (with a loud SKIPPED line) when this checkout
/// has no server binary or lacks the requested features.
pub fn server_bin(features: &[&str]) -> Option<PathBuf> {
    // Prebuilt binaries: IDEM_SERVER_BIN (plain) and IDEM_SERVER_FLAWS_BIN
    // (built with `--features flaws`).
    let env = if features.is_empty() {
        demo::SERVER_BIN_ENV
    } else {
        "IDEM_SERVER_FLAWS_BIN"
    };
    if let Some(p) = std::env::var_os(env) {
        return Some(PathBuf::from(p));
    }
    let root = demo::workspace_root().join("reference-server");
    if !root.join("src/main.rs").exists() {
        eprintln!("SKIPPED: reference-server has no binary in this checkout yet");
        return None;
    }
    let cargo_toml = std::fs::read_to_string(root.join("Cargo.toml")).unwrap_or_default();
    for f in features {
        if !cargo_toml.contains(&format!("{f} =")) && !cargo_toml.contains(&format!("{f}=")) {
            eprintln!("SKIPPED: idem-server has no `{f}` feature in this checkout yet");
            return None;
        }
    }
    Some(demo::build_server(false, features).expect("cargo build -p idem-server"))
}

/// The payment processor binary (built through Cargo like the server, or
/// `IDEM_PROCESSOR_BIN`).
pub fn processor_bin() -> PathBuf {
    demo::build_processor(false).expect("cargo build -p idem-fake-processor")
}

/// Starts the processor and a server, and loads the demo manifest for them.
pub async fn start(bin: &std::path::Path, extra: &[&str]) -> (Stack, Loaded) {
    start_declaring(bin, extra, idem_spec::Profile::Reference).await
}

/// Starts the processor and a server, and loads a demo manifest declaring
/// `profile`.
pub async fn start_declaring(
    bin: &std::path::Path,
    extra: &[&str],
    profile: idem_spec::Profile,
) -> (Stack, Loaded) {
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    let stack = Stack::start(bin, &processor_bin(), &extra)
        .await
        .expect("server and processor start");
    let text = stack.manifest(profile).await.expect("demo manifest");
    let loaded = manifest::parse(&text, "demo").expect("demo manifest parses");
    (stack, loaded)
}

/// Runs every case with a seed (the stack restarts in process).
pub async fn run(stack: &Stack, loaded: &Loaded, seed: u64) -> Report {
    run_only(stack, loaded, seed, None).await
}

/// Runs the cases matching `only` with a seed.
pub async fn run_only(stack: &Stack, loaded: &Loaded, seed: u64, only: Option<&str>) -> Report {
    runner::run_with(
        loaded,
        &Options {
            seed: Some(seed),
            only: only.map(str::to_owned),
            progress: false,
            artifacts_dir: Some(std::env::temp_dir()),
            strict: false,
        },
        Some(stack.restarter()),
    )
    .await
    .expect("run")
}

/// The console report, for assertion messages.
pub fn show(r: &Report) -> String {
    idem_conformance::verdict::report::console::render(r)
}

/// A conforming server binary for the unflawed runs. Prefers the `flaws`
/// build (no `--flaw` given means no flaw is on), so one test run builds
/// idem-server once instead of toggling its features back and forth.
pub fn unflawed_server_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(demo::SERVER_BIN_ENV) {
        return Some(PathBuf::from(p));
    }
    let root = demo::workspace_root().join("reference-server");
    let has_flaws = std::fs::read_to_string(root.join("Cargo.toml"))
        .is_ok_and(|t| t.contains("flaws =") || t.contains("flaws="));
    if has_flaws {
        server_bin(&["flaws"])
    } else {
        server_bin(&[])
    }
}
