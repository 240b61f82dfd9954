//! The summary every report carries: waivers applied, the clause matrix,
//! the headlines and the one result (UNSAFE, HARNESS ERROR, DEVIATES,
//! CONFORMS) with its exit code. Both checks finish their reports here, so
//! the two can never count differently.

use std::collections::BTreeMap;

use idem_spec::clauses::{self, Class, Level, Party};
use idem_spec::report::{
    CaseReport, ClauseCounts, ClauseReport, Headline, Outcome, Report, Summary, Verdict,
};

/// A summary with every count zero, before [`finish`] fills it.
pub fn empty_summary() -> Summary {
    Summary {
        pass: 0,
        non_strict: 0,
        unsupported: 0,
        inconclusive: 0,
        error: 0,
        fail: 0,
        must_clauses_failed: Vec::new(),
        unsafe_clauses: Vec::new(),
        semantics_clauses: Vec::new(),
        interop_clauses: Vec::new(),
        non_strict_clauses: Vec::new(),
        strict: false,
        clause_verdicts: ClauseCounts::default(),
        stale_waivers: 0,
        result: Outcome::Conforms,
        exit_code: Outcome::Conforms.exit_code(),
    }
}

/// Applies waivers and computes the clause matrix, the headlines and the
/// summary: the numbers every renderer prints.
pub fn finish(report: &mut Report, waivers: &[idem_spec::manifest::Waiver]) {
    finish_where(report, waivers, &|c| c.party == Party::Server);
}

/// [`finish`] with the clause matrix over the clauses `keep` selects: the
/// client check (crate `idem-conformance-client`) judges the clauses that bind clients.
pub fn finish_where(
    report: &mut Report,
    waivers: &[idem_spec::manifest::Waiver],
    keep: &dyn Fn(&clauses::Clause) -> bool,
) {
    report.waivers = crate::waivers::apply(waivers, &mut report.cases);
    report.clauses = clause_matrix_where(&report.cases, keep);
    let mut s = empty_summary();
    for c in &report.cases {
        match c.verdict {
            Verdict::Pass => s.pass += 1,
            Verdict::NonStrict => s.non_strict += 1,
            Verdict::Unsupported => s.unsupported += 1,
            Verdict::Inconclusive => s.inconclusive += 1,
            Verdict::Error => s.error += 1,
            Verdict::Fail => s.fail += 1,
        }
    }
    for c in &report.clauses {
        match c.verdict {
            Some(Verdict::Pass) => s.clause_verdicts.pass += 1,
            Some(Verdict::Fail) => s.clause_verdicts.fail += 1,
            Some(Verdict::NonStrict) => s.clause_verdicts.non_strict += 1,
            // Checks are pass, fail or non-strict; anything else would be a
            // kit defect, shown as unchecked rather than invented.
            Some(_) | None => s.clause_verdicts.unchecked += 1,
        }
        match c.failed_class {
            Some(Class::Safety) => s.unsafe_clauses.push(c.id.clone()),
            Some(Class::Semantics) => s.semantics_clauses.push(c.id.clone()),
            Some(Class::Interop) => s.interop_clauses.push(c.id.clone()),
            None => {}
        }
    }
    let mut failed: Vec<String> = report
        .cases
        .iter()
        .filter(|c| c.waived.is_none())
        .flat_map(|c| c.checks.iter())
        .filter(|k| k.verdict == Verdict::Fail && k.level == Level::Must)
        .map(|k| k.clause.clone())
        .collect();
    failed.sort();
    failed.dedup();
    s.must_clauses_failed = failed;
    let mut missed: Vec<String> = report
        .cases
        .iter()
        .filter(|c| c.waived.is_none())
        .flat_map(|c| c.checks.iter())
        .filter(|k| k.verdict == Verdict::NonStrict)
        .map(|k| k.clause.clone())
        .collect();
    missed.sort();
    missed.dedup();
    s.non_strict_clauses = missed;
    s.strict = report.summary.strict;
    report.headlines = headlines(&report.cases);
    s.stale_waivers = report.waivers.iter().filter(|w| w.stale.is_some()).count() as u32;
    let harness = report.harness_error.is_some()
        || report.cases.iter().any(|c| {
            c.waived.is_none()
                && (c.verdict == Verdict::Error
                    || c.rerun
                        .as_ref()
                        .is_some_and(|r| r.verdict == Verdict::Error))
        });
    s.result = if !s.unsafe_clauses.is_empty() {
        Outcome::Unsafe
    } else if harness {
        Outcome::HarnessError
    } else if !s.must_clauses_failed.is_empty() || (s.strict && !s.non_strict_clauses.is_empty()) {
        Outcome::Deviates
    } else {
        Outcome::Conforms
    };
    s.exit_code = s.result.exit_code();
    report.summary = s;
}

/// One line per (case, clause) with an unwaived failing safety check: the
/// check's headline (the number that proves it), else what was observed.
pub fn headlines(cases: &[CaseReport]) -> Vec<Headline> {
    let mut out: Vec<Headline> = Vec::new();
    for c in cases.iter().filter(|c| c.waived.is_none()) {
        for k in c
            .checks
            .iter()
            .filter(|k| k.verdict == Verdict::Fail && k.class == Class::Safety)
        {
            if out.iter().any(|h| h.case == c.id && h.clause == k.clause) {
                continue;
            }
            out.push(Headline {
                clause: k.clause.clone(),
                case: c.id.clone(),
                text: k.headline.clone().unwrap_or_else(|| k.observed.clone()),
            });
        }
    }
    out
}

/// One row per server clause: the worst verdict of the checks made of it.
/// A clause no check judged has no verdict, only the reason why.
pub fn clause_matrix(cases: &[CaseReport]) -> Vec<ClauseReport> {
    clause_matrix_where(cases, &|c| c.party == Party::Server)
}

/// [`clause_matrix`] over the clauses `keep` selects.
pub fn clause_matrix_where(
    cases: &[CaseReport],
    keep: &dyn Fn(&clauses::Clause) -> bool,
) -> Vec<ClauseReport> {
    #[derive(Default)]
    struct Row {
        cases: Vec<String>,
        verdict: Option<Verdict>,
        failed: Option<Class>,
        checks: u32,
        // (case, its verdict and reason) of citing cases that made no check
        quiet: Vec<String>,
    }
    let mut rows: BTreeMap<&str, Row> = BTreeMap::new();
    for c in cases {
        for k in &c.checks {
            let row = rows.entry(k.clause.as_str()).or_default();
            if !row.cases.contains(&c.id) {
                row.cases.push(c.id.clone());
            }
            row.checks += 1;
            row.verdict = Some(row.verdict.map_or(k.verdict, |v| v.max(k.verdict)));
            if k.verdict == Verdict::Fail && c.waived.is_none() {
                row.failed = Some(row.failed.map_or(k.class, |f| f.max(k.class)));
            }
        }
        for id in &c.clauses {
            let row = rows.entry(id.as_str()).or_default();
            if !row.cases.contains(&c.id) {
                row.cases.push(c.id.clone());
            }
            if !c.checks.iter().any(|k| &k.clause == id) {
                row.quiet.push(match &c.reason {
                    Some(r) => format!("{} {}: {r}", c.id, c.verdict),
                    None => format!("{} {} without checking it", c.id, c.verdict),
                });
            }
        }
    }
    clauses::all()
        .iter()
        .filter(|c| keep(c))
        .map(|cl| {
            let row = rows.remove(cl.id.as_str()).unwrap_or_default();
            let unchecked = row.verdict.is_none().then(|| {
                if row.quiet.is_empty() {
                    "no case in this run cites it".to_owned()
                } else {
                    row.quiet.join("; ")
                }
            });
            ClauseReport {
                id: cl.id.clone(),
                level: cl.level,
                class: cl.class,
                title: cl.title.clone(),
                verdict: row.verdict,
                failed_class: row.failed,
                checks: row.checks,
                cases: row.cases,
                unchecked,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_spec::manifest::Waiver;
    use idem_spec::report::CheckReport;

    fn check(clause: &str, class: Class, verdict: Verdict) -> CheckReport {
        CheckReport {
            clause: clause.into(),
            level: clauses::get(clause).map_or(Level::Must, |c| c.level),
            class,
            verdict,
            permitted: String::new(),
            observed: format!("observed {clause}"),
            headline: None,
        }
    }

    fn case(id: &str, clauses: &[&str], verdict: Verdict, checks: Vec<CheckReport>) -> CaseReport {
        CaseReport {
            id: id.into(),
            family: "f".into(),
            title: String::new(),
            tier: Level::Must,
            clauses: clauses.iter().map(|c| c.to_string()).collect(),
            verdict,
            reason: None,
            checks,
            narrative: vec![],
            reproduction: vec![],
            waived: None,
            duration_ms: 0,
            side_effect_requests: 0,
            rerun: None,
        }
    }

    fn report(cases: Vec<CaseReport>) -> Report {
        Report {
            kit_version: String::new(),
            contract_version: String::new(),
            profile: String::new(),
            manifest_sha256: String::new(),
            target: String::new(),
            base_url: String::new(),
            run_id: String::new(),
            seed: 0,
            started_unix_secs: 0,
            duration_ms: 0,
            side_effect_requests: 0,
            requests: 0,
            preflight: vec![],
            harness_error: None,
            headlines: vec![],
            cases,
            clauses: vec![],
            waivers: vec![],
            summary: empty_summary(),
        }
    }

    const SCOPE: &str = "idem.scope.caller";
    const PROFILES: &str = "idem.errors.profiles";

    #[test]
    fn a_strict_run_fails_on_non_strict_findings() {
        let should = "idem.inflight.prefer-wait";
        let missed = || {
            case(
                "e.five",
                &[should],
                Verdict::NonStrict,
                vec![check(should, Class::Semantics, Verdict::NonStrict)],
            )
        };
        let mut r = report(vec![missed()]);
        finish(&mut r, &[]);
        assert_eq!(r.summary.result, Outcome::Conforms);
        assert_eq!(
            r.summary.non_strict_clauses,
            [should],
            "listed, not only counted"
        );
        let mut r = report(vec![missed()]);
        r.summary.strict = true;
        finish(&mut r, &[]);
        assert_eq!(
            (r.summary.result, r.summary.exit_code),
            (Outcome::Deviates, 3)
        );
        assert!(r.summary.strict, "the summary says the run was strict");
    }

    #[test]
    fn the_result_follows_the_worst_unwaived_class() {
        let pass = || {
            case(
                "a.one",
                &[SCOPE],
                Verdict::Pass,
                vec![check(SCOPE, Class::Safety, Verdict::Pass)],
            )
        };
        let interop = || {
            case(
                "b.two",
                &[PROFILES],
                Verdict::Fail,
                vec![check(PROFILES, Class::Interop, Verdict::Fail)],
            )
        };
        let mut r = report(vec![pass(), interop()]);
        finish(&mut r, &[]);
        assert_eq!(r.summary.result, Outcome::Deviates);
        assert_eq!(r.summary.exit_code, 3);
        assert_eq!(r.summary.interop_clauses, [PROFILES]);
        assert!(r.headlines.is_empty(), "interop is not a headline");

        // A safety failure beats everything, a harness error included.
        let unsafe_case = case(
            "c.three",
            &[SCOPE],
            Verdict::Fail,
            vec![CheckReport {
                headline: Some("bob got alice's response".into()),
                ..check(SCOPE, Class::Safety, Verdict::Fail)
            }],
        );
        let errored = case("d.four", &[SCOPE], Verdict::Error, vec![]);
        let mut r = report(vec![
            pass(),
            interop(),
            unsafe_case.clone(),
            errored.clone(),
        ]);
        finish(&mut r, &[]);
        assert_eq!(r.summary.result, Outcome::Unsafe);
        assert_eq!(r.summary.exit_code, 1);
        assert_eq!(r.summary.unsafe_clauses, [SCOPE]);
        assert_eq!(r.headlines.len(), 1);
        assert_eq!(r.headlines[0].text, "bob got alice's response");

        // A milder check of a safety clause does not make the run unsafe.
        let milder = case(
            "e.five",
            &[SCOPE],
            Verdict::Fail,
            vec![check(SCOPE, Class::Semantics, Verdict::Fail)],
        );
        let mut r = report(vec![milder]);
        finish(&mut r, &[]);
        assert_eq!(r.summary.result, Outcome::Deviates);
        assert_eq!(r.summary.semantics_clauses, [SCOPE]);

        // Waived, the safety failure is shown but does not decide.
        let mut r = report(vec![unsafe_case, errored]);
        let w = Waiver {
            case: "c.*".into(),
            reason: "known, fix scheduled".into(),
            link: None,
        };
        finish(&mut r, &[w]);
        assert_eq!(r.summary.result, Outcome::HarnessError);
        assert_eq!(r.summary.exit_code, 2);
        assert_eq!(r.summary.fail, 1, "still counted and shown");
    }

    #[test]
    fn a_clause_verdict_exists_only_if_a_check_produced_it() {
        let matrix = clause_matrix(&[
            // Cited and failed, but by a check of another clause.
            case(
                "a.one",
                &["idem.window.replay", SCOPE],
                Verdict::Fail,
                vec![check(SCOPE, Class::Safety, Verdict::Fail)],
            ),
            case(
                "b.two",
                &["idem.window.expiry"],
                Verdict::Unsupported,
                vec![],
            ),
            case(
                "c.three",
                &["idem.replay.marker"],
                Verdict::Pass,
                vec![check("idem.replay.marker", Class::Interop, Verdict::Pass)],
            ),
        ]);
        let get = |id: &str| matrix.iter().find(|c| c.id == id).expect(id);
        assert_eq!(get(SCOPE).verdict, Some(Verdict::Fail));
        assert_eq!(get(SCOPE).failed_class, Some(Class::Safety));
        assert_eq!(
            get("idem.window.replay").verdict,
            None,
            "no FAIL without a check behind it"
        );
        assert!(
            get("idem.window.replay")
                .unchecked
                .as_deref()
                .is_some_and(|u| u.contains("a.one fail"))
        );
        assert_eq!(get("idem.window.expiry").verdict, None);
        assert_eq!(get("idem.replay.marker").verdict, Some(Verdict::Pass));
        assert_eq!(get("idem.replay.marker").checks, 1);
        assert_eq!(get("idem.lease.fencing").verdict, None, "no case ran it");
        assert!(
            matrix
                .iter()
                .all(|c| clauses::get(&c.id).is_some_and(|k| k.party == Party::Server)),
            "server clauses only"
        );
    }
}
