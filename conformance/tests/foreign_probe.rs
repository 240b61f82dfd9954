//! The foreign effect probe against the real demo stack (reference server
//! and fake payment processor): with it, a crash between the processor call
//! and its commit is checked for exactly one charge; without it, the
//! multi-step clauses stay unchecked (no verdict); a probe that sees two
//! charges fails them.

mod support;

use idem_spec::clauses::Level;
use idem_spec::report::{Report, Verdict};

const FOREIGN_KEY: &str = "idem.multistep.foreign-key";
const PHASES: &str = "idem.multistep.phases";

/// The clause's verdict; `None` when no check produced one.
fn clause(r: &Report, id: &str) -> Option<Verdict> {
    r.clauses
        .iter()
        .find(|c| c.id == id)
        .map(|c| c.verdict)
        .unwrap_or_else(|| panic!("no clause {id} in the report"))
}

/// The demo manifest with its `foreign_probe` line replaced by `with`
/// (or dropped when `with` is empty).
fn replace_foreign_probe(text: &str, with: &str) -> String {
    assert!(
        text.lines().any(|l| l.starts_with("foreign_probe = ")),
        "the demo manifest declares a foreign probe:\n{text}"
    );
    text.lines()
        .map(|l| {
            if l.starts_with("foreign_probe = ") {
                with
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// clause: idem.multistep.phases, idem.multistep.foreign-key, idem.multistep.resume
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_must_clause_passes_with_the_foreign_probe() {
    let Some(bin) = support::unflawed_server_bin() else {
        return;
    };
    let (stack, loaded) = support::start(&bin, &[]).await;
    let r = support::run(&stack, &loaded, 11).await;
    assert_eq!(
        clause(&r, FOREIGN_KEY),
        Some(Verdict::Pass),
        "{}",
        support::show(&r)
    );
    assert_eq!(
        clause(&r, PHASES),
        Some(Verdict::Pass),
        "{}",
        support::show(&r)
    );
    // The two clauses pass on a check the case made, not by citation.
    let case = r
        .cases
        .iter()
        .find(|c| c.id == "recovery.crash-restart")
        .expect("recovery.crash-restart");
    for id in [FOREIGN_KEY, PHASES] {
        assert!(
            case.checks
                .iter()
                .any(|k| k.clause == id && k.verdict == Verdict::Pass),
            "{id} checked\n{}",
            support::show(&r)
        );
    }
    // Every MUST clause some case checks passes (those no black box can
    // see have no case; the conformance chapter lists them).
    let not_passed: Vec<_> = r
        .clauses
        .iter()
        .filter(|c| c.level == Level::Must && !c.cases.is_empty())
        .filter(|c| c.verdict != Some(Verdict::Pass))
        .map(|c| format!("{} {:?}", c.id, c.verdict))
        .collect();
    assert!(
        not_passed.is_empty(),
        "{not_passed:?}\n{}",
        support::show(&r)
    );
}

// clause: idem.multistep.phases, idem.multistep.foreign-key
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_foreign_probe_the_multistep_clauses_stay_unchecked() {
    let Some(bin) = support::unflawed_server_bin() else {
        return;
    };
    let (stack, _) = support::start(&bin, &[]).await;
    let text = stack
        .manifest(idem_spec::Profile::Reference)
        .await
        .expect("demo manifest");
    let text = replace_foreign_probe(&text, "");
    let loaded =
        idem_conformance::server::manifest::parse(&text, "no foreign probe").expect("parses");
    let r = support::run_only(&stack, &loaded, 12, Some("recovery.crash-restart")).await;
    let case = r
        .cases
        .iter()
        .find(|c| c.id == "recovery.crash-restart")
        .expect("recovery.crash-restart");
    assert_eq!(case.verdict, Verdict::Pass, "{}", support::show(&r));
    // No check, no verdict: the clause says why instead of passing.
    for id in [FOREIGN_KEY, PHASES] {
        assert_eq!(clause(&r, id), None, "{}", support::show(&r));
        let row = r.clauses.iter().find(|c| c.id == id).expect(id);
        assert!(
            row.unchecked
                .as_deref()
                .is_some_and(|u| u.contains("recovery.crash-restart")),
            "{row:?}"
        );
    }
}

// clause: idem.multistep.phases, idem.multistep.foreign-key
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_foreign_probe_counting_two_charges_fails_the_multistep_clauses() {
    let Some(bin) = support::unflawed_server_bin() else {
        return;
    };
    let (stack, _) = support::start(&bin, &[]).await;
    let text = stack
        .manifest(idem_spec::Profile::Reference)
        .await
        .expect("demo manifest");
    // Counting every charge at the processor instead of the marker's: the
    // case's two crashed payments made two charges, so the kit sees two
    // foreign effects for the second operation and must fail it.
    let all = format!(
        "foreign_probe = {{ kind = \"count\", url = \"{}/charges\", count_pointer = \"/count\" }}",
        stack.processor.base_url
    );
    let text = replace_foreign_probe(&text, &all);
    let loaded = idem_conformance::server::manifest::parse(&text, "every charge").expect("parses");
    let r = support::run_only(&stack, &loaded, 13, Some("recovery.crash-restart")).await;
    assert_eq!(
        clause(&r, FOREIGN_KEY),
        Some(Verdict::Fail),
        "{}",
        support::show(&r)
    );
    assert_eq!(
        clause(&r, PHASES),
        Some(Verdict::Fail),
        "{}",
        support::show(&r)
    );
    assert_eq!(r.summary.result, idem_spec::report::Outcome::Unsafe);
    assert!(
        r.summary
            .must_clauses_failed
            .iter()
            .any(|c| c == FOREIGN_KEY),
        "{}",
        support::show(&r)
    );
}
