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

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_conformance_core::summary::{empty_summary, finish};
use idem_spec::report::{CaseReport, Report, Rerun, Verdict};

use crate::Error;
use crate::server::case::{Case, Ctx, Rec};
use crate::server::http::Client;
use crate::server::manifest::{Loaded, ManifestExt};

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
    /// Fail on non-strict findings (a missed SHOULD or MAY) too.
    pub strict: bool,
}

/// The cases a run with `opts` executes, in order.
pub fn plan(opts: &Options) -> Vec<Case> {
    crate::server::cases::all()
        .into_iter()
        .filter(|c| {
            opts.only
                .as_deref()
                .is_none_or(|p| idem_conformance_core::waivers::matches(p, c.id))
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
    let signers = crate::server::sign::signers(&m.callers).map_err(Error::ManifestInvalid)?;
    Client::new(
        Duration::from_millis(m.limits.request_timeout_ms),
        m.limits.requests_per_second,
        m.limits.concurrency.max(2) * 2,
        m.limits.max_side_effects,
        secrets,
    )
    .map(|c| c.with_signers(signers))
}

pub use idem_conformance_core::run_id;

/// Runs every planned case and returns the report.
pub async fn run(loaded: &Loaded, opts: &Options) -> Result<Report, Error> {
    run_with(loaded, opts, None).await
}

/// Like [`run`], with an in-process restarter for the crash-recovery case
/// (the demo owns its server, so it restarts it without a shell command).
pub async fn run_with(
    loaded: &Loaded,
    opts: &Options,
    restarter: Option<crate::server::case::Restarter>,
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
                .map_err(|e| Error::Run(e.to_string()))?
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
        let (i, result) = done.map_err(|e| Error::Run(format!("a case panicked: {e}")))?;
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
        kit_version: idem_conformance_core::KIT_VERSION.to_owned(),
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
        summary: idem_spec::report::Summary {
            strict: opts.strict,
            ..empty_summary()
        },
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
        kit_version: idem_conformance_core::KIT_VERSION.to_owned(),
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
    if let Some(field) = unfilled(m) {
        return Err(format!(
            "the manifest still holds a placeholder at {field} ({}... left by `init`): fill it in before a run",
            crate::server::openapi::FILL_ME
        ));
    }
    let mut done = vec![base_url_answers(ctx).await?];
    // Every caller on the first endpoint, then the first caller on every
    // other endpoint (with that endpoint's own probe).
    let mut plan: Vec<(usize, usize)> = (0..m.callers.len()).map(|c| (c, 0)).collect();
    plan.extend((1..m.endpoints.len()).map(|e| (0, e)));
    for (caller, e) in plan {
        let view = ctx.view(focused_on(m, e));
        done.push(fresh_request_counted_once(&view, caller).await?);
    }
    Ok(done)
}

/// The first preflight step: something answers a GET at the base URL.
async fn base_url_answers(ctx: &Ctx) -> Result<String, String> {
    let base = &ctx.manifest.target.base_url;
    let get = crate::server::http::Request {
        method: "GET".into(),
        url: base.clone(),
        headers: Vec::new(),
        body: None,
        state_changing: false,
        signed_by: None,
    };
    match ctx.client.send(&get).await {
        Ok(r) => Ok(format!("{base} answers ({})", r.status)),
        Err(f) => Err(format!(
            "the target does not answer at target.base_url {base} ({f}): start it, or correct target.base_url"
        )),
    }
}

/// The manifest with endpoint `e` first and its own probe (if it has one)
/// as the probe, since a view acts on its first endpoint.
fn focused_on(m: &idem_spec::manifest::Manifest, e: usize) -> idem_spec::manifest::Manifest {
    let mut focused = m.clone();
    let endpoint = focused.endpoints.remove(e);
    focused.endpoints.insert(0, endpoint);
    if let Some(p) = focused.endpoints[0].probe.clone() {
        focused.probe = p;
    }
    focused
}

/// One preflight step: a fresh keyed request by `caller` on the view's
/// endpoint succeeds, and the probes count it exactly once.
async fn fresh_request_counted_once(view: &Ctx, caller: usize) -> Result<String, String> {
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
    if (400..500).contains(&r.status)
        && let Some(hint) = key_format_hint(view, caller, &r).await
    {
        return Err(format!(
            "a fresh request {what} with the kit's key {key:?} was answered {} {}: {hint}",
            r.status,
            crate::server::cases::preview(&r.body),
        ));
    }
    // A server error to a request it should accept says nothing about
    // idempotency: the target may be broken (left so by an earlier run or
    // seed), or the template makes its handler fail.
    if r.status >= 500 {
        return Err(format!(
            "a fresh request {what} with a new key was answered {} {}, so the target may be broken (left so by an earlier run, say: restart it) or endpoint {:?}'s body template makes its handler fail; no case ran, and nothing is judged",
            r.status,
            crate::server::cases::preview(&r.body),
            ep.name
        ));
    }
    if !(200..300).contains(&r.status) {
        return Err(format!(
            "a fresh request {what} with a new key was answered {} {}; correct endpoint {:?}'s body template, path or the caller's vars so that it succeeds",
            r.status,
            crate::server::cases::preview(&r.body),
            ep.name
        ));
    }
    probes_count_once(view, caller, &marker, &r, &what).await?;
    Ok(format!(
        "{what}: {} and the probe{} counted it once",
        r.status,
        if view.manifest.hooks.execution_probe.is_some() {
            "s"
        } else {
            ""
        }
    ))
}

/// The effect probe (and the execution probe, when declared) count one
/// effect for the one successful request `r`.
async fn probes_count_once(
    view: &Ctx,
    caller: usize,
    marker: &str,
    r: &crate::server::http::Response,
    what: &str,
) -> Result<(), String> {
    match view.effects_settled(caller, marker, &[r], 1).await {
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
    match view.executions(marker).await {
        None | Some(Ok(1)) => Ok(()),
        Some(Ok(n)) => Err(format!(
            "hooks.execution_probe counted {n} handler runs for one request {what} (marker {marker:?}); correct it so it counts that request's one run"
        )),
        Some(Err(e)) => Err(format!(
            "hooks.execution_probe could not count a fresh request {what}: {e}; correct it"
        )),
    }
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
            crate::server::case::budget_spent(case.id, ctx.client.budget()),
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

/// The first manifest string still holding the `FILL_ME` placeholder, as a
/// TOML path (`callers[0].headers.Authorization`), among the values a run
/// uses.
fn unfilled(m: &idem_spec::manifest::Manifest) -> Option<String> {
    fn walk(v: &serde_json::Value, path: &str) -> Option<String> {
        match v {
            serde_json::Value::String(s) if s.contains(crate::server::openapi::FILL_ME) => {
                Some(path.to_owned())
            }
            serde_json::Value::Array(a) => a
                .iter()
                .enumerate()
                .find_map(|(i, v)| walk(v, &format!("{path}[{i}]"))),
            serde_json::Value::Object(o) => o.iter().find_map(|(k, v)| {
                walk(
                    v,
                    &if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    },
                )
            }),
            _ => None,
        }
    }
    let mut v = serde_json::to_value(m).ok()?;
    // A caller var no endpoint uses (its endpoint deleted) is harmless.
    let used = serde_json::to_string(&m.endpoints).unwrap_or_default();
    if let Some(callers) = v
        .get_mut("callers")
        .and_then(serde_json::Value::as_array_mut)
    {
        for c in callers {
            if let Some(vars) = c.get_mut("vars").and_then(serde_json::Value::as_object_mut) {
                vars.retain(|k, _| used.contains(&format!("{{{{{k}}}}}")));
            }
        }
    }
    walk(&v, "")
}

/// Whether a 4xx to the kit's fresh request is the key's format: when the
/// manifest declares no grammar and the same request with a UUID key
/// succeeds, the API wants its own key format, not another body. Costs one
/// more state-changing request, only on a failing preflight.
async fn key_format_hint(
    view: &Ctx,
    caller: usize,
    refused: &crate::server::http::Response,
) -> Option<String> {
    use idem_spec::manifest::{KeyDecl, KeyFormat};
    let declared = &view.manifest.key;
    let body_text = String::from_utf8_lossy(&refused.body).to_ascii_lowercase();
    let mentions_key = ["key", "uuid", "idempotency"]
        .iter()
        .any(|w| body_text.contains(w));
    if *declared != KeyDecl::default() {
        return mentions_key.then(|| {
            format!(
                "the answer names the key, and the manifest declares keys as {}; correct [key] to the grammar the API accepts",
                crate::server::keyform::describe(declared)
            )
        });
    }
    let uuid_decl = KeyDecl {
        format: KeyFormat::Uuid,
        ..KeyDecl::default()
    };
    let uuid_key = crate::server::keyform::mint(&uuid_decl, &view.run_id, view.unique());
    let marker = view.marker();
    let body = view.body(caller, &marker);
    let req = view.op(caller, Some(&uuid_key), &marker, &body);
    match view.client.send(&req).await {
        Ok(r) if (200..300).contains(&r.status) => Some(format!(
            "the same request with a UUID key ({uuid_key}) succeeded ({}), so the API accepts only keys in its own format: declare it in the manifest, [key] format = \"uuid\" (or max_len, prefix, charset), not the body",
            r.status
        )),
        _ if mentions_key => Some(
            "the answer names the key: if the API accepts only keys of its own format, declare it in [key] (format, max_len, prefix, charset); otherwise correct the body template".to_owned(),
        ),
        _ => None,
    }
}
