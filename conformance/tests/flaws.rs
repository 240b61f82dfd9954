//! Teeth: the kit must FAIL each deliberately flawed reference server on
//! the clause the flaw breaks, and must not fail the unflawed one.
//!
//! Needs the server's `flaws` cargo feature (`--flaw NAME`); the test builds
//! `idem-server --features flaws` through Cargo.

mod support;

use idem_spec::report::Verdict;

/// Flaw → (the case that must FAIL, the MUST clause it must report failed).
/// Other cases may fail too (a flaw rarely breaks one thing only); these
/// are the ones that name what the flaw breaks.
const FLAWS: &[(&str, &str, &str)] = &[
    (
        "check-then-insert",
        "concurrency.gate",
        "idem.concurrency.single-effect",
    ),
    (
        "no-fingerprint-check",
        "mismatch.body",
        "idem.fingerprint.mismatch",
    ),
    ("global-keys", "scope.other-caller", "idem.scope.caller"),
    (
        "no-in-flight-state",
        "inflight.conflict",
        "idem.inflight.conflict",
    ),
    (
        "store-5xx",
        "failure.5xx-not-stored",
        "idem.failure.5xx-not-stored",
    ),
    (
        "replay-drops-headers",
        "replay.verbatim",
        "idem.replay.marker",
    ),
    (
        "keys-expire-early",
        "windows.replay-within",
        "idem.window.replay",
    ),
];

// clause: idem.concurrency.single-effect, idem.fingerprint.mismatch, idem.scope.caller, idem.inflight.conflict, idem.failure.5xx-not-stored, idem.replay.marker, idem.window.replay
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_flaw_fails_on_the_clause_it_breaks() {
    let Some(bin) = support::server_bin(&["flaws"]) else {
        return;
    };
    let mut missed = Vec::new();
    let mut table = Vec::new();
    for (flaw, case, clause) in FLAWS {
        let (stack, loaded) = support::start(&bin, &["--flaw", flaw]).await;
        let r = support::run(&stack, &loaded, 11).await;
        let c = r.cases.iter().find(|c| c.id == *case).expect("case exists");
        let clause_failed = c
            .checks
            .iter()
            .any(|k| k.clause == *clause && k.verdict == Verdict::Fail);
        table.push(format!(
            "{flaw}: {case} {} ; MUST clauses failed: {}",
            c.verdict,
            r.summary.must_clauses_failed.join(", ")
        ));
        if c.verdict != Verdict::Fail
            || !clause_failed
            || !r.summary.must_clauses_failed.iter().any(|f| f == clause)
            || r.summary.exit_code != 1
        {
            missed.push(format!(
                "{flaw}: expected {case} to FAIL on {clause}\n{}",
                support::show(&r)
            ));
        }
        drop(stack);
    }
    eprintln!("{}", table.join("\n"));
    assert!(missed.is_empty(), "{}", missed.join("\n\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_unflawed_flaws_build_produces_no_fail() {
    let Some(bin) = support::server_bin(&["flaws"]) else {
        return;
    };
    for seed in [21, 22] {
        let (stack, loaded) = support::start(&bin, &[]).await;
        let r = support::run(&stack, &loaded, seed).await;
        assert_eq!(r.summary.fail, 0, "{}", support::show(&r));
        assert_eq!(r.summary.unsupported, 0, "{}", support::show(&r));
        assert_eq!(r.summary.exit_code, 0, "{}", support::show(&r));
    }
}
