//! The layout's promises, checked on `cargo metadata`: who may depend on
//! whom (ARCHITECTURE.md, "Dependency direction"). A new dependency edge
//! that breaks one fails here, not in review.

use std::collections::{BTreeMap, BTreeSet};

/// (package, dependency, kind) for every workspace member's declared
/// dependency on another workspace member. `kind` is "normal", "build" or
/// "dev".
fn edges() -> (BTreeSet<String>, Vec<(String, String, String)>) {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
            "--manifest-path",
        ])
        .arg(manifest)
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let members: BTreeSet<String> = packages
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect();
    let mut edges = Vec::new();
    for p in packages {
        let name = p["name"].as_str().unwrap_or_default().to_owned();
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let dep = d["name"].as_str().unwrap_or_default().to_owned();
            if members.contains(&dep) {
                let kind = d["kind"].as_str().unwrap_or("normal").to_owned();
                edges.push((name.clone(), dep, kind));
            }
        }
    }
    (members, edges)
}

/// Every member reachable from `root` through normal and build
/// dependencies: what a production build of `root` links.
fn production_closure(root: &str, edges: &[(String, String, String)]) -> BTreeSet<String> {
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to, kind) in edges {
        if kind != "dev" {
            graph.entry(from).or_default().push(to);
        }
    }
    let mut seen = BTreeSet::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for next in graph.get(p).into_iter().flatten() {
            if seen.insert((*next).to_owned()) {
                todo.push(next);
            }
        }
    }
    seen
}

#[test]
fn the_dependency_edges_are_the_ones_the_layout_promises() {
    let (members, edges) = edges();
    for expected in [
        "idem-spec",
        "axum-idempotency",
        "idem-server",
        "idem-conformance",
        "idem-client",
        "idem-fake-processor",
        "idem-test-support",
        "example-idempotent-notes",
    ] {
        assert!(
            members.contains(expected),
            "{expected} is a workspace member: {members:?}"
        );
    }
    let any = |from: &str, to: &str| edges.iter().any(|(f, t, _)| f == from && t == to);

    // The kit and the client speak HTTP: they never link the engine or the
    // server, not even in their tests (which start binaries as processes).
    for judge in ["idem-conformance", "idem-client"] {
        for engine in ["axum-idempotency", "idem-server"] {
            assert!(!any(judge, engine), "{judge} must not depend on {engine}");
        }
    }
    // The library stands alone: no kit, no server, no test double.
    for other in [
        "idem-conformance",
        "idem-server",
        "idem-fake-processor",
        "idem-client",
    ] {
        assert!(
            !any("axum-idempotency", other),
            "axum-idempotency must not depend on {other}"
        );
    }
    // The contract crate depends on no other member.
    assert!(
        !edges.iter().any(|(f, _, _)| f == "idem-spec"),
        "idem-spec depends on another member: {edges:?}"
    );
    // The server is a user of the library.
    assert!(any("idem-server", "axum-idempotency"));
    // Nothing a production build links reaches the fake processor or the
    // test support: they are dev-dependencies only.
    for member in &members {
        if member == "idem-fake-processor" || member == "idem-test-support" {
            continue;
        }
        let linked = production_closure(member, &edges);
        for test_only in ["idem-fake-processor", "idem-test-support"] {
            assert!(
                !linked.contains(test_only),
                "a production build of {member} links {test_only}: {linked:?}"
            );
        }
    }
}
