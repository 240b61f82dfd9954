//! Runs a plan of cases against a target under the manifest's safety
//! limits, and builds the one report every renderer uses.
//!
//! A run starts with a preflight ([`preflight`]): the base URL answers,
//! every caller authenticates, every endpoint's fresh request succeeds and
//! the probes count its one effect. If any of that fails, no case runs and
//! the run is a harness error with one sentence saying what to fix. Then
//! the cases that may share the target run `limits.parallel_cases` at a
//! time, and those that hold requests, restart the target or move its clock
//! run alone, after them. The report lists cases in plan order either way.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_spec::clauses::{self, Class, Level, Party};
use idem_spec::report::{
    CaseReport, ClauseCounts, ClauseReport, Headline, Outcome, Report, Rerun, Summary, Verdict,
};

use crate::Error;
use crate::case::{Case, Ctx, Rec};
use crate::http::Client;
use crate::manifest::{Loaded, ManifestExt};

/// Options of one run.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Seed of the run; random when absent (printed in the report).
    pub seed: Option<u64>,
    /// Only cases whose ID matches this glob.
    pub only: Option<String>,
    /// Show a progress bar on stderr.
    pub progress: bool,
    /// Where counterexamples are written (default: the current directory).
    pub artifacts_dir: Option<std::path::PathBuf>,
}

/// The cases a run with `opts` executes, in order.
pub fn plan(opts: &Options) -> Vec<Case> {
    crate::cases::all()
        .into_iter()
        .filter(|c| {
            opts.only
                .as_deref()
                .is_none_or(|p| crate::waivers::matches(p, c.id))
        })
        .collect()
}

/// Builds the limited client for a manifest.
pub fn client(loaded: &Loaded) -> Result<Client, Error> {
    let m = &loaded.manifest;
    let secrets = m
        .callers
        .iter()
        .flat_map(|c| c.headers.keys().cloned())
        .chain(["authorization".to_owned(), "cookie".to_owned()]);
    Client::new(
        Duration::from_millis(m.limits.request_timeout_ms),
        m.limits.requests_per_second,
        m.limits.concurrency.max(2) * 2,
        m.limits.max_side_effects,
        secrets,
    )
}

/// A fresh run-unique prefix.
pub fn run_id() -> String {
    format!(
        "idemconf-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

/// Runs every planned case and returns the report.
pub async fn run(loaded: &Loaded, opts: &Options) -> Result<Report, Error> {
    run_with(loaded, opts, None).await
}

/// Like [`run`], with an in-process restarter for the crash-recovery case
/// (the demo owns its server, so it restarts it without a shell command).
pub async fn run_with(
    loaded: &Loaded,
    opts: &Options,
    restarter: Option<crate::case::Restarter>,
) -> Result<Report, Error> {
    let started = Instant::now();
    let started_unix_secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let seed = opts
        .seed
        .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0);
    let client = client(loaded)?;
    let ctx = Arc::new(
        Ctx::new(loaded.manifest.clone(), client.clone(), run_id(), seed)
            .with_artifacts(
                opts.artifacts_dir
                    .clone()
                    .unwrap_or_else(|| std::path::PathBuf::from(".")),
            )
            .with_restarter(restarter),
    );
    let preflight = preflight(&ctx).await.map_err(Error::Preflight)?;
    let plan = plan(opts);
    let bar = if opts.progress {
        let b = indicatif::ProgressBar::new(plan.len() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {msg}")
                .map_err(|e| Error::Report(e.to_string()))?
                .progress_chars("=> "),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let m = &loaded.manifest;
    type Indexed<'a> = Vec<(usize, &'a Case)>;
    let (alone, shared): (Indexed, Indexed) =
        plan.iter().enumerate().partition(|(_, c)| (c.alone)(m));
    let mut results: Vec<Option<CaseReport>> = vec![None; plan.len()];
    // Shared cases, a bounded number at a time. Each uses fresh keys and
    // markers, so they cannot see each other's requests.
    let width = (m.limits.parallel_cases.max(1) as usize).min(shared.len().max(1));
    let mut queue = shared.into_iter();
    let mut running = tokio::task::JoinSet::new();
    loop {
        while running.len() < width {
            let Some((i, case)) = queue.next() else { break };
            let (case, ctx) = (case.clone(), ctx.clone());
            running.spawn(async move { (i, run_with_rerun(&case, ctx).await) });
        }
        let Some(done) = running.join_next().await else {
            break;
        };
        let (i, result) = done.map_err(|e| Error::Report(format!("a case panicked: {e}")))?;
        bar.set_message(plan[i].id);
        bar.inc(1);
        results[i] = Some(result);
    }
    for (i, case) in alone {
        bar.set_message(case.id);
        results[i] = Some(run_with_rerun(case, ctx.clone()).await);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let cases: Vec<CaseReport> = results.into_iter().flatten().collect();
    let mut report = Report {
        kit_version: crate::KIT_VERSION.to_owned(),
        contract_version: idem_spec::CONTRACT_VERSION.to_owned(),
        profile: loaded.manifest.profile_name(),
        manifest_sha256: loaded.sha256.clone(),
        target: loaded.manifest.target.name.clone(),
        base_url: loaded.manifest.target.base_url.clone(),
        run_id: ctx.run_id.clone(),
        seed,
        started_unix_secs,
        duration_ms: started.elapsed().as_millis() as u64,
        side_effect_requests: client.effects_used(),
        requests: client.requests_sent(),
        preflight,
        harness_error: None,
        headlines: Vec::new(),
        cases,
        clauses: Vec::new(),
        waivers: Vec::new(),
        summary: empty_summary(),
    };
    finish(&mut report, &loaded.manifest.waivers);
    Ok(report)
}

/// The report of a run that stopped before any case (a failed preflight):
/// no cases, the reason in `harness_error`, result `harness-error`.
pub fn harness_report(loaded: &Loaded, why: String) -> Report {
    let started_unix_secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut report = Report {
        kit_version: crate::KIT_VERSION.to_owned(),
        contract_version: idem_spec::CONTRACT_VERSION.to_owned(),
        profile: loaded.manifest.profile_name(),
        manifest_sha256: loaded.sha256.clone(),
        target: loaded.manifest.target.name.clone(),
        base_url: loaded.manifest.target.base_url.clone(),
        run_id: String::new(),
        seed: 0,
        started_unix_secs,
        duration_ms: 0,
        side_effect_requests: 0,
        requests: 0,
        preflight: Vec::new(),
        harness_error: Some(why),
        headlines: Vec::new(),
        cases: Vec::new(),
        clauses: Vec::new(),
        waivers: Vec::new(),
        summary: empty_summary(),
    };
    finish(&mut report, &loaded.manifest.waivers);
    report
}

/// Runs a case; a failing one once more with fresh keys. A MUST broken once
/// stays broken: the re-run only tells the reader whether the failure is
/// stable or intermittent, and its evidence is kept beside the first run's.
async fn run_with_rerun(case: &Case, ctx: Arc<Ctx>) -> CaseReport {
    let mut result = run_case(case, ctx.clone()).await;
    if result.verdict == Verdict::Fail {
        let again = run_case(case, ctx).await;
        let note = if again.verdict == Verdict::Fail {
            "stable: failed again on an automatic re-run".to_owned()
        } else if again.verdict == Verdict::Error {
            format!(
                "the automatic re-run could not finish ({}), so stable or intermittent is unknown",
                again.reason.as_deref().unwrap_or("a harness error")
            )
        } else {
            format!(
                "intermittent: an automatic re-run ended {} (a race the target loses sometimes)",
                again.verdict
            )
        };
        result.reason = Some(match result.reason.take() {
            Some(r) => format!("{r}; {note}"),
            None => note,
        });
        result.rerun = Some(Rerun {
            verdict: again.verdict,
            reason: again.reason,
            checks: again.checks,
            narrative: again.narrative,
            reproduction: again.reproduction,
            side_effect_requests: again.side_effect_requests,
        });
    }
    result
}

/// Checks the manifest against the target before any case: the base URL
/// answers, each caller authenticates, each endpoint's fresh request
/// succeeds, and the probes count its one effect (and one handler run).
/// Returns what it verified, or one sentence saying what failed and what to
/// fix.
pub async fn preflight(ctx: &Ctx) -> Result<Vec<String>, String> {
    let m = &ctx.manifest;
    let base = &m.target.base_url;
    let mut done = Vec::new();
    let get = crate::http::Request {
        method: "GET".into(),
        url: base.clone(),
        headers: Vec::new(),
        body: None,
        state_changing: false,
    };
    match ctx.client.send(&get).await {
        Ok(r) => done.push(format!("{base} answers ({})", r.status)),
        Err(f) => {
            return Err(format!(
                "the target does not answer at target.base_url {base} ({f}): start it, or correct target.base_url"
            ));
        }
    }
    // Every caller on the first endpoint, then the first caller on every
    // other endpoint (with that endpoint's own probe).
    let mut plan: Vec<(usize, usize)> = (0..m.callers.len()).map(|c| (c, 0)).collect();
    plan.extend((1..m.endpoints.len()).map(|e| (0, e)));
    for (caller, e) in plan {
        let mut focused = m.clone();
        let endpoint = focused.endpoints.remove(e);
        focused.endpoints.insert(0, endpoint);
        if let Some(p) = focused.endpoints[0].probe.clone() {
            focused.probe = p;
        }
        let view = ctx.view(focused);
        let name = view.name(caller).to_owned();
        let ep = view.endpoint().clone();
        let key = view.key();
        let marker = view.marker();
        let body = view.body(caller, &marker);
        let req = view.op(caller, Some(&key), &marker, &body);
        let what = format!("{} {} as caller {name:?}", ep.method, ep.path);
        let r = match view.client.send(&req).await {
            Ok(r) => r,
            Err(f) => {
                return Err(format!(
                    "a fresh request {what} got no answer ({f}): check that the endpoint exists and limits.request_timeout_ms"
                ));
            }
        };
        if r.status == 401 || r.status == 403 {
            return Err(format!(
                "caller {name:?} is not authenticated: a fresh request {what} was answered {}; correct callers[{caller}].headers",
                r.status
            ));
        }
        if !(200..300).contains(&r.status) {
            return Err(format!(
                "a fresh request {what} with a new key was answered {} {}; correct endpoint {:?}'s body template, path or the caller's vars so that it succeeds",
                r.status,
                crate::cases::preview(&r.body),
                ep.name
            ));
        }
        match view.effects_settled(caller, &marker, &[&r], 1).await {
            Ok(1) => {}
            Ok(n) => {
                return Err(format!(
                    "the effect probe counted {n} effects for one successful request {what} (marker {marker:?}); correct the probe (url, pointers, match_on) so it counts exactly that request's effect"
                ));
            }
            Err(e) => {
                return Err(format!(
                    "the effect probe could not count the effect of a fresh request {what}: {e}; correct the probe"
                ));
            }
        }
        if let Some(n) = view.executions(&marker).await {
            match n {
                Ok(1) => {}
                Ok(n) => {
                    return Err(format!(
                        "hooks.execution_probe counted {n} handler runs for one request {what} (marker {marker:?}); correct it so it counts that request's one run"
                    ));
                }
                Err(e) => {
                    return Err(format!(
                        "hooks.execution_probe could not count a fresh request {what}: {e}; correct it"
                    ));
                }
            }
        }
        done.push(format!(
            "{what}: {} and the probe{} counted it once",
            r.status,
            if view.manifest.hooks.execution_probe.is_some() {
                "s"
            } else {
                ""
            }
        ));
    }
    Ok(done)
}

/// Runs one case (or reports why it cannot run).
pub async fn run_case(case: &Case, ctx: Arc<Ctx>) -> CaseReport {
    let started = Instant::now();
    let ctx = Arc::new(ctx.for_case(case));
    let mut rec = Rec::new(ctx.clone());
    rec.case_id = case.id;
    if let Some(need) = case.missing_need_with(&ctx.manifest, ctx.restarter.is_some()) {
        rec.stop(
            Verdict::Unsupported,
            format!("needs {} (not declared in the manifest)", need.describe()),
        );
    } else if ctx.client.effects_used() >= ctx.client.budget() {
        rec.stop(
            Verdict::Error,
            crate::case::budget_spent(case.id, ctx.client.budget()),
        );
    } else {
        (case.run)(&mut rec).await;
    }
    let verdict = rec.verdict();
    let side_effect_requests = ctx.client.case_effects_used();
    CaseReport {
        side_effect_requests,
        id: case.id.to_owned(),
        family: case.family().to_owned(),
        title: case.title.to_owned(),
        tier: case.tier(),
        clauses: case.clauses.iter().map(|c| c.to_string()).collect(),
        verdict,
        reason: rec.stopped.as_ref().map(|(_, r)| r.clone()),
        checks: rec.checks,
        narrative: rec.narrative,
        reproduction: rec.reproduction,
        waived: None,
        duration_ms: started.elapsed().as_millis() as u64,
        rerun: None,
    }
}

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
/// client check ([`crate::client`]) judges the clauses that bind clients.
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
    } else if !s.must_clauses_failed.is_empty() {
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
