//! The kit against the hermetic zoo (`conformance/zoo`, in process): every
//! wire dialect times every deliberate defect, over three seeds. The table
//! it measures is printed in `conformance/README.md`, and this test fails
//! when the README's copy differs (`IDEM_BLESS=1` rewrites it).
//!
//! What must hold in every cell:
//! - without a defect, no `safety` or `semantics` failure, in any dialect;
//!   the reference dialect conforms outright;
//! - with a defect, a failure on the defect's own clause with the defect's
//!   class, and no `safety` failure on any other clause;
//! - no harness error; every case that ran carries a curl reproduction;
//!   narratives use the manifest's caller names.
//!
//! The same file checks the preflight (each way it can fail stops the run
//! before any case, with one sentence) and that the four reports agree on
//! every count.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use idem_conformance::server::manifest::{self, Loaded};
use idem_conformance::server::runner::{self, Options};
use idem_spec::clauses::Class;
use idem_spec::report::{Outcome, Report, Verdict};
use idem_zoo::{Defect, Dialect, Quirk, ZooConfig};

const SEEDS: [u64; 3] = [1, 2, 3];

/// The committed manifest for a dialect, pointed at a running zoo.
fn manifest_for(dialect: Dialect, base_url: &str) -> Loaded {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("zoo/manifests")
        .join(format!("{dialect}.toml"));
    let mut loaded = manifest::load(&path).expect("the zoo's manifest loads");
    loaded.manifest.target.base_url = base_url.to_owned();
    loaded
}

/// What a manifest says for each quirk: the declarations the issue asked
/// the manifest to be able to make.
fn declare(quirk: Quirk, m: &mut idem_spec::manifest::Manifest) {
    use idem_spec::manifest::{InFlightMode, WireError};
    match quirk {
        // Nothing to declare: the kit opens a fresh connection after a 5xx.
        Quirk::ResetAfterServerError => {}
        Quirk::NestedErrorCode => {
            m.profile.code_pointer = Some("/error/code".into());
            for (code, status) in [
                ("idempotency_key_missing", 400),
                ("idempotency_key_invalid", 400),
                ("idempotency_key_in_use", 409),
            ] {
                m.profile.errors.insert(
                    code.into(),
                    WireError {
                        status,
                        code: None,
                        pointer: Some("/error/code".into()),
                        value: Some(code.into()),
                        pattern: None,
                    },
                );
            }
            let mismatch = m
                .profile
                .errors
                .get("idempotency_key_mismatch")
                .map_or(409, |w| w.status);
            m.profile.errors.insert(
                "idempotency_key_mismatch".into(),
                WireError {
                    status: mismatch,
                    code: None,
                    pointer: Some("/error/code".into()),
                    value: Some("idempotency_key_mismatch".into()),
                    pattern: None,
                },
            );
        }
        Quirk::MarkerValueOne => m.profile.replay_marker_value = Some("1".into()),
        Quirk::AlwaysWait => m.policy.in_flight = InFlightMode::AlwaysWait.into(),
        Quirk::NoInFlightState => m.policy.in_flight = InFlightMode::None.into(),
        Quirk::UuidKeys => m.key.format = idem_spec::manifest::KeyFormat::Uuid,
        Quirk::MarkerIsKey => {
            m.profile.replay_marker_value =
                Some(idem_conformance::server::manifest::MARKER_IS_KEY.into());
        }
        Quirk::FingerprintsTraceparent => {
            m.policy.fingerprint.headers = vec!["traceparent".into()];
        }
        Quirk::NoRetryAfter => {
            m.profile.absent_headers = vec!["Retry-After".into()];
            // The zoo's pause hook, so an in-flight refusal is seen on every
            // run (`inflight.conflict`), not only when a burst happens to
            // overlap the first request's few microseconds in flight.
            m.hooks.failpoint = Some(idem_spec::manifest::FailpointHook {
                header: idem_zoo::FAILPOINT_HEADER.into(),
                server_error: None,
                crash_after_commit: None,
                crash_after_foreign_call: None,
                pause: Some(idem_zoo::PAUSE_VALUE.into()),
                release_url: Some(idem_zoo::RELEASE_PATH.into()),
                lease_pause: None,
                recovery_endpoint: None,
            });
        }
        Quirk::KeyInWebhookId => m.key.header = Some("webhook-id".into()),
        Quirk::KeyInBody => m.key.body_pointer = Some("/event_id".into()),
        _ => {}
    }
}

/// The quirk cells: each correct-but-unusual behaviour on one dialect.
const QUIRK_CELLS: [(Dialect, Quirk); 11] = [
    (Dialect::Reference, Quirk::ResetAfterServerError),
    (Dialect::PlainJson422, Quirk::NestedErrorCode),
    (Dialect::PlainJson400, Quirk::MarkerValueOne),
    (Dialect::Reference, Quirk::AlwaysWait),
    (Dialect::Reference, Quirk::NoInFlightState),
    (Dialect::PlainJson422, Quirk::UuidKeys),
    (Dialect::Reference, Quirk::MarkerIsKey),
    (Dialect::Reference, Quirk::FingerprintsTraceparent),
    (Dialect::Reference, Quirk::NoRetryAfter),
    (Dialect::Reference, Quirk::KeyInWebhookId),
    (Dialect::PlainJson422, Quirk::KeyInBody),
];

async fn run_zoo_with(
    dialect: Dialect,
    defect: Option<Defect>,
    quirk: Option<Quirk>,
    delay_ms: u64,
    seed: u64,
) -> Report {
    let zoo = idem_zoo::spawn(ZooConfig {
        dialect,
        defect,
        delay: Duration::from_millis(delay_ms),
        quirk,
    })
    .await
    .expect("zoo starts");
    let mut loaded = manifest_for(dialect, &zoo.base_url);
    if let Some(q) = quirk {
        declare(q, &mut loaded.manifest);
    }
    let r = runner::run(
        &loaded,
        &Options {
            seed: Some(seed),
            only: None,
            progress: false,
            artifacts_dir: Some(std::env::temp_dir()),
            strict: false,
        },
    )
    .await
    .expect("the preflight passes against the zoo");
    zoo.shutdown().await;
    r
}

/// Unwaived failing checks, as (clause, class).
fn failures(r: &Report) -> BTreeSet<(String, Class)> {
    r.cases
        .iter()
        .filter(|c| c.waived.is_none())
        .flat_map(|c| c.checks.iter())
        .filter(|k| k.verdict == Verdict::Fail)
        .map(|k| (k.clause.clone(), k.class))
        .collect()
}

/// What one cell showed over its seeds.
#[derive(Default)]
struct Cell {
    results: BTreeSet<&'static str>,
    failures: BTreeSet<(String, Class)>,
    problems: Vec<String>,
    /// The most state-changing requests each case sent in one run (first
    /// run or re-run), and the most a whole run sent.
    spend: BTreeMap<String, u64>,
    run_spend: u64,
}

fn judge(
    dialect: Dialect,
    defect: Option<Defect>,
    quirk: Option<Quirk>,
    seed: u64,
    r: &Report,
    cell: &mut Cell,
) {
    let console = idem_conformance::verdict::report::console::render(r);
    let mut problem = |what: String| {
        cell.problems.push(format!(
            "{dialect} × {} (seed {seed}): {what}",
            label(defect, quirk)
        ))
    };
    let fails = failures(r);
    match defect {
        None if quirk.is_some() => {
            // A correct API with a declared quirk: no safety or semantics
            // failure, whatever its spelling.
            let bad: Vec<_> = fails.iter().filter(|(_, c)| *c > Class::Interop).collect();
            if !bad.is_empty() {
                problem(format!(
                    "a correct API with a declared quirk got {bad:?}\n{console}"
                ));
            }
            // The case each quirk would have broken before the manifest
            // could declare it (or the kit could bear it) must now pass.
            let must_pass = match quirk {
                Some(Quirk::ResetAfterServerError) => "failure.5xx-not-stored",
                Some(Quirk::NestedErrorCode) => "keys.errors-distinct",
                Some(
                    Quirk::MarkerValueOne
                    | Quirk::MarkerIsKey
                    | Quirk::UuidKeys
                    | Quirk::KeyInWebhookId
                    | Quirk::KeyInBody,
                ) => "replay.verbatim",
                Some(Quirk::FingerprintsTraceparent) => "replay.incidental-header",
                _ => "concurrency.gate",
            };
            // A header declared never sent: the contract's clause is still
            // reported (interop), as declared rather than as dropped, by
            // the case that holds a request in flight (the gate sees an
            // in-flight refusal only when its burst overlaps the first
            // request, so it cannot be relied on for the finding).
            if quirk == Some(Quirk::NoRetryAfter) {
                let declared = r
                    .cases
                    .iter()
                    .filter(|c| c.id == "inflight.conflict")
                    .flat_map(|c| c.checks.iter())
                    .filter(|k| k.clause == "idem.inflight.retry-after")
                    .any(|k| {
                        k.verdict != Verdict::Pass
                            && k.class == Class::Interop
                            && k.observed.contains("declares Retry-After never sent")
                    });
                if !declared {
                    problem(format!(
                        "no interop finding naming the declared absent Retry-After\n{console}"
                    ));
                }
            }
            // Passed, or failed on spelling alone (interop).
            let judged = r.cases.iter().find(|c| c.id == must_pass).is_some_and(|c| {
                c.verdict == Verdict::Pass
                    // The declared absent header is the clause's SHOULD
                    // (non-strict), interop like a spelling.
                    || ((c.verdict == Verdict::Fail
                        || (c.verdict == Verdict::NonStrict
                            && quirk == Some(Quirk::NoRetryAfter)))
                        && c.checks
                            .iter()
                            .all(|k| k.verdict != Verdict::Fail || k.class == Class::Interop))
            });
            if !judged {
                problem(format!(
                    "{must_pass} was not judged on behaviour alone\n{console}"
                ));
            }
        }
        None => {
            let bad: Vec<_> = fails.iter().filter(|(_, c)| *c > Class::Interop).collect();
            if !bad.is_empty() {
                problem(format!("a correct API got {bad:?}\n{console}"));
            }
            if dialect == Dialect::Reference && r.summary.result != Outcome::Conforms {
                problem(format!("the reference dialect does not conform\n{console}"));
            }
        }
        Some(d) => {
            if !fails.contains(&(d.clause().to_owned(), d.class())) {
                problem(format!(
                    "no {} failure on {}\n{console}",
                    d.class(),
                    d.clause()
                ));
            }
            let elsewhere: Vec<_> = fails
                .iter()
                .filter(|(clause, class)| *class == Class::Safety && clause != d.clause())
                .collect();
            if !elsewhere.is_empty() {
                problem(format!("safety blamed elsewhere: {elsewhere:?}\n{console}"));
            }
            let want = if d.class() == Class::Safety {
                Outcome::Unsafe
            } else {
                Outcome::Deviates
            };
            if r.summary.result != want {
                problem(format!(
                    "result {} where {} was due\n{console}",
                    r.summary.result.as_str(),
                    want.as_str()
                ));
            }
        }
    }
    for c in &r.cases {
        if c.verdict == Verdict::Error {
            problem(format!("{} errored: {:?}", c.id, c.reason));
        }
        if c.verdict != Verdict::Unsupported && c.reproduction.is_empty() {
            problem(format!("{} has no curl reproduction", c.id));
        }
        let named_wrong = c
            .narrative
            .iter()
            .chain(c.rerun.iter().flat_map(|x| x.narrative.iter()))
            .find(|l| l.contains("alice") || l.contains("bob"));
        if let Some(l) = named_wrong {
            problem(format!(
                "{}: a narrative names a caller the manifest does not: {l}",
                c.id
            ));
        }
    }
    cell.results.insert(r.summary.result.as_str());
    cell.failures.extend(fails);
    for c in &r.cases {
        let most = c
            .side_effect_requests
            .max(c.rerun.as_ref().map_or(0, |x| x.side_effect_requests));
        let e = cell.spend.entry(c.id.clone()).or_default();
        *e = (*e).max(most);
    }
    cell.run_spend = cell.run_spend.max(r.side_effect_requests);
}

fn name(defect: Option<Defect>) -> &'static str {
    defect.map_or("none", Defect::as_str)
}

fn label(defect: Option<Defect>, quirk: Option<Quirk>) -> String {
    match quirk {
        Some(q) => format!("none (quirk: {q})"),
        None => name(defect).to_owned(),
    }
}

/// One README row per cell.
fn row(dialect: Dialect, defect: Option<Defect>, quirk: Option<Quirk>, cell: &Cell) -> String {
    let list = |pick: &dyn Fn(Class) -> bool| {
        let v: Vec<String> = cell
            .failures
            .iter()
            .filter(|(_, c)| pick(*c))
            .map(|(id, _)| format!("`{}`", id.trim_start_matches("idem.")))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if v.is_empty() {
            "—".to_owned()
        } else {
            v.join(", ")
        }
    };
    let own = defect.map_or("—".to_owned(), |d| {
        format!(
            "`{}` ({})",
            d.clause().trim_start_matches("idem."),
            d.class()
        )
    });
    format!(
        "| {dialect} | {} | {} | {own} | {} | {} | {} |",
        label(defect, quirk),
        cell.results.iter().copied().collect::<Vec<_>>().join(" / "),
        list(&|c| c == Class::Safety),
        list(&|c| c == Class::Semantics),
        list(&|c| c == Class::Interop),
    )
}

const BEGIN: &str = "<!-- zoo-table:begin (written by tests/zoo.rs; IDEM_BLESS=1 cargo test -p idem-conformance --test zoo) -->";
const END: &str = "<!-- zoo-table:end -->";

// clause: idem.concurrency.single-effect, idem.scope.caller, idem.fingerprint.mismatch, idem.failure.5xx-not-stored, idem.failure.final-outcomes, idem.replay.verbatim, idem.key.syntax
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_dialect_and_defect_is_judged_by_behaviour_not_spelling() {
    let started = Instant::now();
    let mut cells = Vec::new();
    for dialect in Dialect::ALL {
        for defect in std::iter::once(None).chain(Defect::ALL.map(Some)) {
            cells.push((dialect, defect, None));
        }
    }
    cells.extend(QUIRK_CELLS.map(|(d, q)| (d, None, Some(q))));
    // IDEM_ZOO_ONLY=NAME runs only the cells whose defect or quirk is NAME
    // (or "none"), to work on one; the README is then left alone.
    let only = std::env::var("IDEM_ZOO_ONLY").ok();
    if let Some(o) = &only {
        cells.retain(|(_, d, q)| q.map_or_else(|| name(*d).to_owned(), |q| q.to_string()) == *o);
    }
    // Four cells at a time, each on its own zoo.
    type Done = BTreeMap<usize, (Dialect, Option<Defect>, Option<Quirk>, Cell)>;
    let mut set = tokio::task::JoinSet::new();
    let mut done: Done = BTreeMap::new();
    let mut next = cells.into_iter().enumerate();
    loop {
        while set.len() < 4 {
            let Some((i, (dialect, defect, quirk))) = next.next() else {
                break;
            };
            set.spawn(async move {
                let mut cell = Cell::default();
                for seed in SEEDS {
                    let r = run_zoo_with(dialect, defect, quirk, 0, seed).await;
                    if std::env::var_os("IDEM_ZOO_ONLY").is_some() {
                        for c in r.cases.iter().filter(|c| c.duration_ms > 500) {
                            eprintln!("slow: {dialect} {} {} ms", c.id, c.duration_ms);
                        }
                    }
                    judge(dialect, defect, quirk, seed, &r, &mut cell);
                }
                (i, dialect, defect, quirk, cell)
            });
        }
        let Some(joined) = set.join_next().await else {
            break;
        };
        let (i, dialect, defect, quirk, cell) = joined.expect("cell task");
        done.insert(i, (dialect, defect, quirk, cell));
    }
    let elapsed = started.elapsed();
    let problems: Vec<&String> = done
        .values()
        .flat_map(|(_, _, _, c)| c.problems.iter())
        .collect();
    // The side-effect budget an API on which every case fails would need:
    // each case's most expensive run in any cell, twice (the automatic
    // re-run). The default budget must cover it.
    let mut per_case: BTreeMap<&str, u64> = BTreeMap::new();
    for (_, _, _, c) in done.values() {
        for (id, n) in &c.spend {
            let e = per_case.entry(id.as_str()).or_default();
            *e = (*e).max(*n);
        }
    }
    let every_case_fails: u64 = per_case.values().map(|n| 2 * n).sum();
    let most_in_a_run = done
        .values()
        .map(|(_, _, _, c)| c.run_spend)
        .max()
        .unwrap_or(0);
    let default_budget = idem_spec::manifest::Limits::default().max_side_effects;
    eprintln!(
        "side effects: at most {most_in_a_run} in one run; {every_case_fails} if every case failed and re-ran; default budget {default_budget}"
    );
    if only.is_none() {
        assert!(
            every_case_fails <= default_budget,
            "the default side-effect budget ({default_budget}) does not cover a run in which every case fails and re-runs ({every_case_fails}): {per_case:?}"
        );
    }
    let mut table = vec![
        "| Dialect | Defect | Result | Own clause (class) | Safety failures | Semantics failures | Interop findings |".to_owned(),
        "|---|---|---|---|---|---|---|".to_owned(),
    ];
    table.extend(done.values().map(|(d, f, q, c)| row(*d, *f, *q, c)));
    let table = table.join("\n");
    if only.is_some() {
        eprintln!("{table}");
    }
    eprintln!(
        "{} cells × {} seeds in {:.1} s",
        done.len(),
        SEEDS.len(),
        elapsed.as_secs_f64()
    );
    // The problems come first and the table last: a CI log cut to its
    // first lines still names what went wrong.
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}\n\nthe measured table:\n{table}",
        problems.len(),
        problems
            .iter()
            .map(|p| p.as_str())
            .collect::<Vec<_>>()
            .join("\n\n")
    );
    if only.is_some() {
        return;
    }
    let readme_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = std::fs::read_to_string(&readme_path).expect("README");
    let (Some(b), Some(e)) = (readme.find(BEGIN), readme.find(END)) else {
        panic!("conformance/README.md has no {BEGIN} ... {END} block");
    };
    let fresh = format!("{BEGIN}\n{table}\n{END}");
    if readme[b..e + END.len()] != fresh {
        if std::env::var_os("IDEM_BLESS").is_some() {
            let updated = format!("{}{fresh}{}", &readme[..b], &readme[e + END.len()..]);
            std::fs::write(&readme_path, updated).expect("write README");
        } else {
            let committed: BTreeSet<&str> = readme[b + BEGIN.len()..e]
                .lines()
                .filter(|l| !l.is_empty())
                .collect();
            let measured: BTreeSet<&str> = table.lines().collect();
            let missing_from = |a: &BTreeSet<&str>, b: &BTreeSet<&str>| {
                a.difference(b).copied().collect::<Vec<_>>().join("\n")
            };
            panic!(
                "the README's zoo table differs from the measured one; rerun with IDEM_BLESS=1 to update it.\nmeasured, not in the README:\n{}\nin the README, not measured:\n{}\n\nthe measured table:\n{table}",
                missing_from(&measured, &committed),
                missing_from(&committed, &measured),
            );
        }
    }
}

/// Reads `data-count="N"` of the element with `id="count-NAME"`.
fn html_count(html: &str, name: &str) -> usize {
    let at = html
        .find(&format!("id=\"count-{name}\""))
        .unwrap_or_else(|| panic!("no count-{name} in the HTML report"));
    html[at..]
        .split("data-count=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .and_then(|n| n.parse().ok())
        .expect("a number")
}

/// The numbers of a console line like `cases:   3 pass, 1 fail, ...`.
fn console_numbers(console: &str, prefix: &str) -> Vec<usize> {
    let line = console
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line:\n{console}"));
    line.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn console_json_junit_and_html_agree_on_every_count() {
    // A target with failures of every class, a waiver and unsupported cases.
    let zoo = idem_zoo::spawn(ZooConfig {
        dialect: Dialect::PlainJson422,
        defect: Some(Defect::GlobalKeySpace),
        delay: Duration::ZERO,
        quirk: None,
    })
    .await
    .expect("zoo");
    let mut loaded = manifest_for(Dialect::PlainJson422, &zoo.base_url);
    loaded.manifest.waivers.push(idem_spec::manifest::Waiver {
        case: "keys.errors-distinct".into(),
        reason: "codes arrive with the v2 error format".into(),
        link: None,
    });
    let r = runner::run(
        &loaded,
        &Options {
            seed: Some(4),
            only: None,
            progress: false,
            artifacts_dir: Some(std::env::temp_dir()),
            strict: false,
        },
    )
    .await
    .expect("run");
    zoo.shutdown().await;
    let s = &r.summary;
    assert_eq!(s.result, Outcome::Unsafe);
    assert!(!s.interop_clauses.is_empty() && !s.unsafe_clauses.is_empty());
    assert!(r.cases.iter().any(|c| c.waived.is_some()));

    // JSON: the model itself, round-tripped.
    let json = idem_conformance::verdict::report::json(&r).expect("json");
    let back: Report = serde_json::from_str(&json).expect("parses");
    assert_eq!(back, r);

    // Console.
    let console = idem_conformance::verdict::report::console::render(&r);
    assert_eq!(
        console_numbers(&console, "cases:"),
        [
            s.pass,
            s.fail,
            s.non_strict,
            s.inconclusive,
            s.unsupported,
            s.error
        ]
        .map(|n| n as usize)
    );
    let cv = &s.clause_verdicts;
    assert_eq!(
        console_numbers(&console, "clauses:"),
        [
            cv.pass,
            cv.fail,
            cv.non_strict,
            cv.unchecked,
            r.clauses.len() as u32
        ]
        .map(|n| n as usize)
    );
    assert_eq!(
        console.lines().filter(|l| l.starts_with("UNSAFE ")).count(),
        r.headlines.len()
    );
    for (class, list) in [
        ("safety", &s.unsafe_clauses),
        ("semantics", &s.semantics_clauses),
        ("interop", &s.interop_clauses),
    ] {
        let line = console
            .lines()
            .find(|l| l.starts_with(&format!("failed ({class}):")));
        assert_eq!(
            line.map_or(0, |l| l.matches("idem.").count()),
            list.len(),
            "{class}"
        );
    }
    assert!(console.contains(&format!("result: {} ", s.result.as_str())));
    assert!(console.contains(&format!("(exit {})", s.exit_code)));
    assert_eq!(
        console
            .find("── summary ──")
            .map(|i| console[i..].contains("result:")),
        Some(true),
        "the summary comes last"
    );

    // JUnit: one test case per case; failures and errors only unwaived.
    let xml = idem_conformance::verdict::report::junit::render(&r).expect("junit");
    let unwaived = |v: Verdict| {
        r.cases
            .iter()
            .filter(|c| c.verdict == v && c.waived.is_none())
            .count()
    };
    assert_eq!(xml.matches("<testcase ").count(), r.cases.len());
    assert_eq!(xml.matches("<failure").count(), unwaived(Verdict::Fail));
    assert_eq!(xml.matches("<error").count(), unwaived(Verdict::Error));
    let skipped = r
        .cases
        .iter()
        .filter(|c| {
            matches!(c.verdict, Verdict::Unsupported | Verdict::Inconclusive)
                || (c.waived.is_some() && matches!(c.verdict, Verdict::Fail | Verdict::Error))
        })
        .count();
    assert_eq!(xml.matches("<skipped").count(), skipped);
    assert!(xml.contains(&format!("value=\"{}\"", s.result.as_str())));

    // HTML: every count, every row.
    let html = idem_conformance::verdict::report::html::render(&r);
    for (name, n) in [
        ("cases-pass", s.pass),
        ("cases-fail", s.fail),
        ("cases-non-strict", s.non_strict),
        ("cases-inconclusive", s.inconclusive),
        ("cases-unsupported", s.unsupported),
        ("cases-error", s.error),
        ("clauses-pass", cv.pass),
        ("clauses-fail", cv.fail),
        ("clauses-non-strict", cv.non_strict),
        ("clauses-unchecked", cv.unchecked),
        ("safety", s.unsafe_clauses.len() as u32),
        ("semantics", s.semantics_clauses.len() as u32),
        ("interop", s.interop_clauses.len() as u32),
    ] {
        assert_eq!(html_count(&html, name), n as usize, "{name}");
    }
    for v in Verdict::ALL {
        assert_eq!(
            html.matches(&format!(
                "class=\"case-row\" data-verdict=\"{}\"",
                v.as_str()
            ))
            .count(),
            r.cases.iter().filter(|c| c.verdict == v).count(),
            "{v}"
        );
    }
    assert_eq!(
        html.matches("class=\"clause-row\"").count(),
        r.clauses.len()
    );
    assert!(html.contains(&format!("data-result=\"{}\"", s.result.as_str())));
    assert_eq!(
        html.matches("<li class=\"unsafe\">").count(),
        r.headlines.len()
    );
    // The clause rows agree with the summary's clause counts.
    assert_eq!(
        html.matches("class=\"clause-row\" data-verdict=\"unchecked\"")
            .count(),
        cv.unchecked as usize
    );
}

/// Runs the preflight against a zoo with a broken manifest; returns the
/// error text and how many handler runs the zoo saw in total.
async fn preflight_with(
    break_it: impl FnOnce(&mut idem_spec::manifest::Manifest),
) -> (String, u64) {
    let zoo = idem_zoo::spawn(ZooConfig::default()).await.expect("zoo");
    let mut loaded = manifest_for(Dialect::Reference, &zoo.base_url);
    break_it(&mut loaded.manifest);
    let e = runner::run(
        &loaded,
        &Options {
            seed: Some(1),
            only: None,
            progress: false,
            artifacts_dir: Some(std::env::temp_dir()),
            strict: false,
        },
    )
    .await
    .expect_err("the preflight stops the run");
    assert!(matches!(e, idem_conformance::Error::Preflight(_)), "{e}");
    let runs = reqwest::get(format!("{}{}", zoo.base_url, idem_zoo::EXECUTIONS_PATH))
        .await
        .expect("probe")
        .json::<serde_json::Value>()
        .await
        .expect("json")["count"]
        .as_u64()
        .expect("count");
    zoo.shutdown().await;
    let msg = e.to_string();
    assert_eq!(msg.matches(". ").count(), 0, "one sentence: {msg}");
    (msg, runs)
}

#[tokio::test]
async fn a_failed_preflight_says_what_to_fix_and_runs_no_case() {
    let (msg, runs) = preflight_with(|m| {
        m.callers[1]
            .headers
            .insert("Authorization".into(), "Bearer wrong".into());
    })
    .await;
    assert!(
        msg.contains("\"tenant-b\" is not authenticated") && msg.contains("callers[1].headers"),
        "{msg}"
    );
    assert_eq!(runs, 1, "only the first caller's fresh request ran");

    let (msg, runs) = preflight_with(|m| {
        m.endpoints[0].body = serde_json::json!({ "amount": "seven", "marker": "{{marker}}" });
    })
    .await;
    assert!(
        msg.contains("body template") && msg.contains("400"),
        "{msg}"
    );
    assert_eq!(runs, 0, "refused before the handler");

    // A target that fails every fresh request (left broken by an earlier
    // run, say) is a harness error naming that, never a finding about it.
    let (msg, runs) = preflight_with(|m| {
        m.endpoints[0].body =
            serde_json::json!({ "amount": idem_zoo::SERVER_ERROR_AMOUNT, "marker": "{{marker}}" });
    })
    .await;
    assert!(
        msg.contains("500")
            && msg.contains("the target may be broken")
            && msg.contains("restart it"),
        "{msg}"
    );
    assert_eq!(
        runs, 1,
        "one fresh request ran and failed; no case followed"
    );

    // A probe that counts every order, not the request's: right once, then
    // wrong for the second caller's request.
    let (msg, _) = preflight_with(|m| {
        m.probe = idem_spec::manifest::EffectProbe::Count {
            url: "/v1/orders".into(),
            count_pointer: "/count".into(),
            caller: None,
        };
    })
    .await;
    assert!(
        msg.contains("the effect probe counted 2 effects") && msg.contains("correct the probe"),
        "{msg}"
    );

    let (msg, _) = preflight_with(|m| {
        m.hooks.execution_probe = Some(idem_spec::manifest::EffectProbe::Count {
            url: "/_zoo/executions?marker=nothing".into(),
            count_pointer: "/count".into(),
            caller: None,
        });
    })
    .await;
    assert!(
        msg.contains("hooks.execution_probe counted 0 handler runs"),
        "{msg}"
    );
}

#[tokio::test]
async fn key_matched_probes_count_by_the_key_the_request_carried() {
    // The zoo lists orders with their key: a probe matched by key finds
    // the same effects a marker probe does, and the kit still catches a
    // double effect with it.
    for defect in [None, Some(Defect::RaceDoubleExecution)] {
        let zoo = idem_zoo::spawn(ZooConfig {
            defect,
            ..ZooConfig::default()
        })
        .await
        .expect("zoo");
        let mut loaded = manifest_for(Dialect::Reference, &zoo.base_url);
        loaded.manifest.probe = idem_spec::manifest::EffectProbe::List {
            url: "/v1/orders?idempotency_key={{key}}".into(),
            items_pointer: "/items".into(),
            match_pointer: "/idempotency_key".into(),
            match_on: idem_spec::manifest::MatchOn::Key,
            caller: None,
        };
        loaded.manifest.hooks.execution_probe = Some(idem_spec::manifest::EffectProbe::Count {
            url: "/_zoo/executions?idempotency_key={{key}}".into(),
            count_pointer: "/count".into(),
            caller: None,
        });
        let r = runner::run(
            &loaded,
            &Options {
                seed: Some(2),
                only: Some("concurrency.gate".into()),
                progress: false,
                artifacts_dir: Some(std::env::temp_dir()),
                strict: false,
            },
        )
        .await
        .expect("run");
        zoo.shutdown().await;
        let gate = &r.cases[0];
        match defect {
            None => assert_eq!(
                gate.verdict,
                Verdict::Pass,
                "{}",
                idem_conformance::verdict::report::console::render(&r)
            ),
            Some(_) => assert_eq!(r.summary.unsafe_clauses, ["idem.concurrency.single-effect"]),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cli_writes_every_artefact_into_one_directory_and_exits_with_the_result() {
    use clap::Parser;
    let zoo = idem_zoo::spawn(ZooConfig {
        dialect: Dialect::PlainJson417,
        defect: Some(Defect::ReplayHeadersDropped),
        delay: Duration::ZERO,
        quirk: None,
    })
    .await
    .expect("zoo");
    let out = std::env::temp_dir().join(format!("idem-kit-out-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let manifest =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("zoo/manifests/plain-json-417.toml");
    let cli = idem_conformance::cli::Cli::parse_from([
        "idem-conformance".to_owned(),
        "run".into(),
        "--target".into(),
        manifest.display().to_string(),
        "--base-url".into(),
        zoo.base_url.clone(),
        "--seed".into(),
        "5".into(),
        "--out-dir".into(),
        out.display().to_string(),
    ]);
    let code = idem_conformance::cli::execute(cli).await;
    zoo.shutdown().await;
    assert_eq!(
        code,
        idem_conformance::EXIT_DEVIATES,
        "a semantics defect in a foreign dialect"
    );
    let mut files: Vec<String> = std::fs::read_dir(&out)
        .expect("the output directory")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, ["junit.xml", "report.html", "report.json"]);
    let report: Report =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).expect("json"))
            .expect("parses");
    assert_eq!(report.summary.exit_code, code);
    // A failing case was re-run, and the report keeps both runs' evidence.
    let failed = report
        .cases
        .iter()
        .find(|c| c.verdict == Verdict::Fail)
        .expect("a failing case");
    let again = failed.rerun.as_ref().expect("re-run evidence");
    assert!(!again.narrative.is_empty() && !again.reproduction.is_empty());
    let explained = idem_conformance::verdict::report::explain(failed).join("\n");
    assert!(explained.contains("automatic re-run"), "{explained}");
    let _ = std::fs::remove_dir_all(&out);
}

// The rule: nothing is judged from a request that was not sent. A budget
// that runs out mid-run makes the run a harness error naming the case and
// the setting, never a safety failure from the bursts it could not send.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spent_budget_is_a_harness_error_naming_the_case_and_the_setting() {
    let zoo = idem_zoo::spawn(ZooConfig::default()).await.expect("zoo");
    let mut loaded = manifest_for(Dialect::Reference, &zoo.base_url);
    // The preflight's three requests, and a little more: the gate's second
    // or third round cannot be sent.
    loaded.manifest.limits.max_side_effects = 70;
    let r = runner::run(
        &loaded,
        &Options {
            seed: Some(6),
            only: Some("concurrency.*".into()),
            progress: false,
            artifacts_dir: Some(std::env::temp_dir()),
            strict: false,
        },
    )
    .await
    .expect("run");
    zoo.shutdown().await;
    let console = idem_conformance::verdict::report::console::render(&r);
    assert_eq!(r.summary.result, Outcome::HarnessError, "{console}");
    assert!(r.summary.unsafe_clauses.is_empty(), "{console}");
    let spent: Vec<&str> = r
        .cases
        .iter()
        .filter(|c| c.verdict == Verdict::Error)
        .filter_map(|c| c.reason.as_deref())
        .collect();
    assert!(!spent.is_empty(), "{console}");
    for reason in spent {
        assert!(
            reason.contains("limits.max_side_effects") && reason.contains("in case concurrency."),
            "{reason}"
        );
    }
    assert!(r.side_effect_requests <= 70);
}

// A run the preflight stops still leaves its reports, so a CI job that
// publishes them shows why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stopped_by_its_preflight_still_writes_its_reports() {
    use clap::Parser;
    let zoo = idem_zoo::spawn(ZooConfig::default()).await.expect("zoo");
    let dir = std::env::temp_dir().join(format!("idem-kit-preflight-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("zoo/manifests/reference.toml"),
    )
    .expect("manifest")
    .replace("Bearer zoo-bob", "Bearer wrong");
    let manifest = dir.join("target.toml");
    std::fs::write(&manifest, text).expect("write");
    let out = dir.join("out");
    let cli = idem_conformance::cli::Cli::parse_from([
        "idem-conformance".to_owned(),
        "run".into(),
        "--target".into(),
        manifest.display().to_string(),
        "--base-url".into(),
        zoo.base_url.clone(),
        "--out-dir".into(),
        out.display().to_string(),
    ]);
    let code = idem_conformance::cli::execute(cli).await;
    zoo.shutdown().await;
    assert_eq!(code, idem_conformance::EXIT_HARNESS);
    let report: Report =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).expect("json"))
            .expect("parses");
    assert_eq!(report.summary.result, Outcome::HarnessError);
    assert!(
        report
            .harness_error
            .as_deref()
            .is_some_and(|e| e.contains("callers[1].headers")),
        "{:?}",
        report.harness_error
    );
    let junit = std::fs::read_to_string(out.join("junit.xml")).expect("junit");
    assert!(
        junit.contains("preflight") && junit.contains("<error"),
        "{junit}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// clause: idem.key.syntax
/// An API that accepts only UUID keys, checked with a manifest that does
/// not say so: the preflight stops the run and names the key format (the
/// kit's own keys were refused, a UUID key was accepted), not the body.
#[tokio::test]
async fn a_key_format_the_manifest_does_not_declare_is_named_by_the_preflight() {
    let zoo = idem_zoo::spawn(ZooConfig {
        dialect: Dialect::PlainJson422,
        defect: None,
        delay: Duration::ZERO,
        quirk: Some(Quirk::UuidKeys),
    })
    .await
    .expect("zoo starts");
    let loaded = manifest_for(Dialect::PlainJson422, &zoo.base_url);
    let opts = Options {
        seed: Some(1),
        only: None,
        progress: false,
        artifacts_dir: Some(std::env::temp_dir()),
        strict: false,
    };
    let e = runner::run(&loaded, &opts)
        .await
        .expect_err("the preflight must stop the run");
    let msg = e.to_string();
    assert!(
        msg.contains("UUID") && msg.contains("[key] format = \"uuid\""),
        "{msg}"
    );
    assert!(!msg.contains("body template"), "{msg}");
    // Declared, the same API passes the preflight and replays.
    let mut declared = loaded.clone();
    declared.manifest.key.format = idem_spec::manifest::KeyFormat::Uuid;
    let only = Options {
        only: Some("replay.verbatim".into()),
        ..opts
    };
    let r = runner::run(&declared, &only)
        .await
        .expect("preflight passes");
    let c = r
        .cases
        .iter()
        .find(|c| c.id == "replay.verbatim")
        .expect("ran");
    // Replayed: nothing worse than the dialect's spelling of the marker.
    assert!(
        c.checks
            .iter()
            .all(|k| k.verdict != Verdict::Fail || k.class == Class::Interop),
        "{}",
        idem_conformance::verdict::report::console::render(&r)
    );
    zoo.shutdown().await;
}

/// Whether `c` has a failing check of `clause` in `class`.
fn fails_on(c: &idem_spec::report::CaseReport, clause: &str, class: Class) -> bool {
    c.checks
        .iter()
        .any(|k| k.verdict == Verdict::Fail && k.clause == clause && k.class == class)
}

/// Whether a line of `c`'s narrative contains `text`.
fn narrates(c: &idem_spec::report::CaseReport, text: &str) -> bool {
    c.narrative.iter().any(|l| l.contains(text))
}

/// Runs the cases matching `only` (all with `None`) against a zoo made
/// with `config`, its dialect's manifest changed by `declare`.
async fn run_declared(
    config: ZooConfig,
    only: Option<&str>,
    declare: impl FnOnce(&mut idem_spec::manifest::Manifest),
) -> Report {
    let zoo = idem_zoo::spawn(config).await.expect("zoo starts");
    let mut loaded = manifest_for(config.dialect, &zoo.base_url);
    declare(&mut loaded.manifest);
    let r = runner::run(
        &loaded,
        &Options {
            seed: Some(1),
            only: only.map(str::to_owned),
            progress: false,
            artifacts_dir: Some(std::env::temp_dir()),
            strict: false,
        },
    )
    .await
    .expect("the preflight passes against the zoo");
    zoo.shutdown().await;
    r
}

/// Runs only `case` against a reference-dialect zoo with `defect`.
async fn one_case_declared(
    defect: Option<Defect>,
    case: &str,
    declare: impl FnOnce(&mut idem_spec::manifest::Manifest),
) -> idem_spec::report::CaseReport {
    let config = ZooConfig {
        defect,
        ..ZooConfig::default()
    };
    run_declared(config, Some(case), declare)
        .await
        .cases
        .into_iter()
        .find(|c| c.id == case)
        .expect("the case ran")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failure_policy_table_is_named_while_the_contract_is_judged() {
    // A library that stores no 4xx, and says so: the contract's finding
    // stands (semantics), and the report names what was declared.
    let table = r#"{"4xx": "not_stored"}"#;
    let c = one_case_declared(
        Some(Defect::ClientErrorReexecuted),
        "failure.4xx-final",
        |m| m.policy.failure_policy = serde_json::from_str(table).expect("table"),
    )
    .await;
    assert_eq!(c.verdict, Verdict::Fail, "{c:?}");
    assert!(
        fails_on(&c, "idem.failure.final-outcomes", Class::Semantics),
        "{c:?}"
    );
    assert!(
        narrates(
            &c,
            r#"declares failure_policy = { "4xx" = "not_stored" }: a 422 is not stored"#
        ),
        "{:?}",
        c.narrative
    );
    // A table that says what the contract says is the contract: it passes,
    // and nothing is noted.
    let c = one_case_declared(None, "failure.4xx-final", |m| {
        m.policy.failure_policy =
            serde_json::from_str(r#"{"2xx": "stored", "5xx": "not_stored"}"#).expect("table")
    })
    .await;
    assert_eq!(c.verdict, Verdict::Pass, "{c:?}");
    assert!(
        !narrates(&c, "declares failure_policy"),
        "{:?}",
        c.narrative
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_declared_global_scope_is_named_and_a_leak_is_still_unsafe() {
    let c = one_case_declared(Some(Defect::GlobalKeySpace), "scope.other-caller", |m| {
        m.policy.scope = idem_spec::manifest::ScopeDecl::Global;
    })
    .await;
    assert_eq!(c.verdict, Verdict::Fail, "{c:?}");
    assert!(
        fails_on(&c, "idem.scope.caller", Class::Safety),
        "declared or not, one caller's answer reaching another is unsafe: {c:?}"
    );
    assert!(
        narrates(&c, r#"declares scope = "global""#),
        "{:?}",
        c.narrative
    );
    let c = one_case_declared(None, "scope.other-caller", |_| {}).await;
    assert_eq!(c.verdict, Verdict::Pass, "{c:?}");
    assert!(!narrates(&c, "declares scope"), "{:?}", c.narrative);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_in_flight_table_is_judged_like_the_mode_it_spells() {
    use idem_spec::manifest::{InFlightAnswer, InFlightDecl, InFlightMode, InFlightTable};
    // The always-wait library, declared situation by situation.
    let table = InFlightDecl::Table(InFlightTable {
        running: InFlightAnswer::Wait,
        prefer_wait: InFlightAnswer::Wait,
        claim_race: InFlightAnswer::Wait,
    });
    assert_eq!(
        table.table(),
        InFlightDecl::from(InFlightMode::AlwaysWait).table()
    );
    let config = ZooConfig {
        quirk: Some(Quirk::AlwaysWait),
        delay: Duration::from_millis(50),
        ..ZooConfig::default()
    };
    let r = run_declared(config, None, |m| m.policy.in_flight = table).await;
    let bad: Vec<_> = failures(&r)
        .into_iter()
        .filter(|(_, c)| *c > Class::Interop)
        .collect();
    assert!(
        bad.is_empty(),
        "a correct library declared by table: {bad:?}\n{}",
        idem_conformance::verdict::report::console::render(&r)
    );
    let gate = |r: &Report| {
        r.cases
            .iter()
            .find(|c| c.id == "concurrency.gate")
            .expect("the burst case")
            .verdict
    };
    assert_eq!(gate(&r), Verdict::Pass);
    // The table is what decides what is asked: its prefer_wait = "wait"
    // runs the Prefer-wait case (and the library passes it), where the
    // zoo's own manifest, `in_flight = "conflict"`, promises no wait and
    // leaves it unsupported.
    let verdict = |r: &Report| {
        r.cases
            .iter()
            .find(|c| c.id == "inflight.prefer-wait")
            .expect("the prefer-wait case")
            .verdict
    };
    assert_eq!(
        verdict(&r),
        Verdict::Pass,
        "{}",
        idem_conformance::verdict::report::console::render(&r)
    );
    let r = run_declared(config, Some("inflight.prefer-wait"), |_| {}).await;
    assert_eq!(verdict(&r), Verdict::Unsupported);
}
