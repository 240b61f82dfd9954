//! Teeth: the kit must FAIL each deliberately flawed reference server on
//! the clause the flaw breaks, and must not fail the unflawed one.
//!
//! Needs the server's `flaws` cargo feature (`--flaw NAME`); the test builds
//! `idem-server --features flaws` through Cargo.

mod support;

use idem_spec::clauses::Class;
use idem_spec::report::{Outcome, Verdict};

/// Flaw → (the case that must FAIL, the MUST clause it must report failed,
/// the class of that failure, the run's result). Other cases may fail too
/// (a flaw rarely breaks one thing only); these are the ones that name what
/// the flaw breaks.
const FLAWS: &[(&str, &str, &str, Class, Outcome)] = &[
    (
        "check-then-insert",
        "concurrency.gate",
        "idem.concurrency.single-effect",
        Class::Safety,
        Outcome::Unsafe,
    ),
    (
        "no-fingerprint-check",
        "mismatch.body",
        "idem.fingerprint.mismatch",
        Class::Safety,
        Outcome::Unsafe,
    ),
    (
        "global-keys",
        "scope.other-caller",
        "idem.scope.caller",
        Class::Safety,
        Outcome::Unsafe,
    ),
    (
        "no-in-flight-state",
        "inflight.conflict",
        "idem.inflight.conflict",
        Class::Safety,
        Outcome::Unsafe,
    ),
    (
        "store-5xx",
        "failure.5xx-not-stored",
        "idem.failure.5xx-not-stored",
        // The severity rule: a stored 5xx replayed tells the retry the truth
        // (it failed); semantics, not safety.
        Class::Semantics,
        Outcome::Deviates,
    ),
    (
        "replay-drops-headers",
        "replay.verbatim",
        "idem.replay.marker",
        Class::Interop,
        Outcome::Deviates,
    ),
    (
        "keys-expire-early",
        "windows.replay-within",
        "idem.window.replay",
        Class::Semantics,
        Outcome::Deviates,
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
    for (flaw, case, clause, class, outcome) in FLAWS {
        let (stack, loaded) = support::start(&bin, &["--flaw", flaw]).await;
        let r = support::run(&stack, &loaded, 11).await;
        let c = r.cases.iter().find(|c| c.id == *case).expect("case exists");
        let clause_failed = c
            .checks
            .iter()
            .any(|k| k.clause == *clause && k.verdict == Verdict::Fail && k.class == *class);
        let outcome = *outcome;
        table.push(format!(
            "{flaw}: {case} {} ; {} ; unsafe: {} ; semantics: {} ; interop: {}",
            c.verdict,
            r.summary.result.as_str(),
            r.summary.unsafe_clauses.join(", "),
            r.summary.semantics_clauses.join(", "),
            r.summary.interop_clauses.join(", ")
        ));
        if c.verdict != Verdict::Fail
            || !clause_failed
            || !r.summary.must_clauses_failed.iter().any(|f| f == clause)
            || r.summary.result != outcome
            || r.summary.exit_code != outcome.exit_code()
        {
            missed.push(format!(
                "{flaw}: expected {case} to FAIL on {clause} ({class}), the run {}\n{}",
                outcome.as_str(),
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
