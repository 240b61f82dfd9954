//! The kit against the real reference server (a child process): every MUST
//! clause passes, across several seeds, and every report renders.

mod support;

use idem_spec::report::{Report, Verdict};

// clause: idem.replay.verbatim, idem.concurrency.single-effect, idem.scope.caller, idem.fingerprint.mismatch, idem.window.expiry
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reference_server_conforms_across_seeds() {
    let Some(bin) = support::unflawed_server_bin() else {
        return;
    };
    for seed in [1, 2, 3] {
        let (stack, loaded) = support::start(&bin, &[]).await;
        let r = support::run(&stack, &loaded, seed).await;
        let bad = r.unsettled_cases();
        assert!(
            bad.is_empty(),
            "seed {seed}: {bad:?}\n{}",
            support::show(&r)
        );
        assert_eq!(r.summary.exit_code, 0, "{}", support::show(&r));
        // The run is not vacuous: the gate, the model and the lost-response
        // case all ran and passed.
        for id in [
            "concurrency.gate",
            "model.sequences",
            "lost.response-dropped",
            "windows.expiry",
            "failure.5xx-not-stored",
            "inflight.conflict",
            "recovery.crash-restart",
            "recovery.lease-takeover",
        ] {
            let c = r.cases.iter().find(|c| c.id == id).expect(id);
            assert_eq!(c.verdict, Verdict::Pass, "{id}\n{}", support::show(&r));
        }
        assert!(r.summary.pass >= 26, "{}", support::show(&r));
        for c in &r.cases {
            assert!(
                !c.reproduction.is_empty(),
                "{}: every case carries a curl reproduction",
                c.id
            );
        }
        assert_eq!(r.summary.unsupported, 0, "{}", support::show(&r));
        drop(stack);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reports_render_from_one_model() {
    let Some(bin) = support::unflawed_server_bin() else {
        return;
    };
    let (stack, loaded) = support::start(&bin, &[]).await;
    let r = support::run(&stack, &loaded, 7).await;
    let json = idem_conformance::verdict::report::json(&r).expect("json");
    let back: Report = serde_json::from_str(&json).expect("JSON report parses back");
    assert_eq!(back, r);
    assert_eq!(back.contract_version, idem_spec::CONTRACT_VERSION);
    assert_eq!(back.manifest_sha256, loaded.sha256);
    let xml = idem_conformance::verdict::report::junit::render(&r).expect("junit");
    assert!(xml.contains("<testsuites") && xml.contains("concurrency.gate"));
    assert!(xml.contains("manifest_sha256"));
    let html = idem_conformance::verdict::report::html::render(&r);
    assert!(html.contains("idem.concurrency.single-effect") && html.contains("</html>"));
    let console = support::show(&r);
    let summary = console.find("── summary ──").expect("summary");
    assert!(
        console[summary..].contains("result: CONFORMS"),
        "summary comes last:\n{console}"
    );
    // The book's tour shows these lines of a demo run: they must be what a
    // run prints.
    let book = std::fs::read_to_string(
        idem_conformance::server::demo::workspace_root().join("book/src/conformance.md"),
    )
    .expect("book chapter");
    for prefix in ["cases:", "clauses:", "result:"] {
        let ran = console
            .lines()
            .find(|l| l.starts_with(prefix))
            .expect("summary line");
        assert!(
            book.lines().any(|l| l == ran),
            "book/src/conformance.md's demo output lacks the line a run prints: {ran}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_counterexample_replays_against_a_conforming_server_as_fixed() {
    let Some(bin) = support::unflawed_server_bin() else {
        return;
    };
    let (_stack, loaded) = support::start(&bin, &[]).await;
    use idem_conformance::server::model::{Counterexample, Op, Violation};
    let cx = Counterexample {
        kit_version: "test".into(),
        seed: 1,
        ops: vec![
            Op::Send {
                caller: 0,
                key: 0,
                variant: 0,
            },
            Op::Burst {
                caller: 1,
                key: 0,
                variant: 0,
                n: 4,
            },
            Op::Send {
                caller: 0,
                key: 0,
                variant: 1,
            },
            Op::Send {
                caller: 0,
                key: 0,
                variant: 0,
            },
            Op::Advance { secs: 86_460 },
            Op::Send {
                caller: 0,
                key: 0,
                variant: 1,
            },
        ],
        violation: Violation {
            clause: "idem.scope.caller".into(),
            class: idem_spec::clauses::Class::Safety,
            permitted: String::new(),
            observed: String::new(),
            narrative: vec![],
            reproduction: vec![],
        },
    };
    let code = idem_conformance::cli::replay_loaded(&cx, &loaded)
        .await
        .expect("replay");
    assert_eq!(code, idem_conformance::EXIT_CONFORMS);
}

// clause: idem.errors.profiles, idem.fingerprint.mismatch
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_profile_passes_when_declared_and_fails_when_misdeclared() {
    use idem_spec::Profile;
    let Some(bin) = support::unflawed_server_bin() else {
        return;
    };
    for p in Profile::ALL {
        let (stack, loaded) = support::start_declaring(&bin, &["--profile", p.as_str()], p).await;
        let r = support::run(&stack, &loaded, 5).await;
        assert_eq!(r.summary.exit_code, 0, "{p}\n{}", support::show(&r));
        assert!(r.summary.pass >= 20, "{p}\n{}", support::show(&r));
    }
    // The server answers mismatches with 422 (ietf-draft); the manifest
    // claims the reference profile's 409: the kit must say so.
    let (stack, loaded) =
        support::start_declaring(&bin, &["--profile", "ietf-draft"], Profile::Reference).await;
    let r = support::run_only(&stack, &loaded, 5, Some("mismatch.*")).await;
    assert!(
        r.summary
            .must_clauses_failed
            .iter()
            .any(|c| c == "idem.errors.profiles"),
        "{}",
        support::show(&r)
    );
}

// clause: idem.concurrency.single-effect
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_init_template_runs_against_the_reference_server() {
    let Some(bin) = support::unflawed_server_bin() else {
        return;
    };
    let (stack, _) = support::start(&bin, &[]).await;
    let tokens = stack.server.lock().await.tokens.clone();
    let tok = |name: &str| {
        tokens
            .iter()
            .find(|(c, _)| c == name)
            .map(|(_, t)| t.clone())
            .expect("token")
    };
    // Only the base URL and the tokens change: the demo server was started
    // with its own tokens instead of the demo-alice/demo-bob defaults.
    let text = idem_conformance::server::manifest::TEMPLATE
        .replace("http://127.0.0.1:8080", &stack.base_url)
        .replace("Bearer demo-alice", &format!("Bearer {}", tok("alice")))
        .replace("Bearer demo-bob", &format!("Bearer {}", tok("bob")));
    let loaded = idem_conformance::server::manifest::parse(&text, "init").expect("template parses");
    for only in ["concurrency.gate", "replay.verbatim"] {
        let r = support::run_only(&stack, &loaded, 9, Some(only)).await;
        let c = r.cases.iter().find(|c| c.id == only).expect(only);
        assert_eq!(c.verdict, Verdict::Pass, "{}", support::show(&r));
    }
}
