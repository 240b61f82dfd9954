//! The shape every case shares, and the recorder a case reports through.
//!
//! A [`Case`] is data: an ID, the clauses it cites, what it needs from the
//! manifest, the outcomes it permits (computed from the declared profile, so
//! `list` can print them without sending anything), and an async `run`.
//! A case never decides its verdict by hand: it records [`Rec::check`]s, each
//! against one clause, and the verdict follows from the clause levels
//! (a failed MUST is `fail`, a failed SHOULD or MAY is `non-strict`), from
//! indeterminate sends (`inconclusive`) and harness problems (`error`).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_spec::clauses::{self, Level};
use idem_spec::headers::IDEMPOTENCY_KEY;
use idem_spec::manifest::{Caller, EffectProbe, Endpoint, Manifest};
use idem_spec::report::{CheckReport, Verdict};
use serde_json::Value;

use crate::http::{Client, Failure, Request, Response, Sent};
use crate::manifest::{ManifestExt, expand};
use crate::probe;

/// A boxed future borrowing the recorder.
pub type BoxFut<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Something a case needs from the manifest beyond the basics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Need {
    /// `hooks.clock`.
    Clock,
    /// `hooks.failpoint.server_error`.
    ServerError,
    /// `hooks.failpoint.crash_after_commit` and `hooks.restart`.
    CrashRestart,
    /// `hooks.failpoint.pause`.
    Pause,
    /// `hooks.failpoint.lease_pause` and `hooks.clock`.
    LeasePause,
    /// `hooks.failpoint.crash_after_foreign_call` and `hooks.restart`.
    ForeignCrash,
    /// `endpoints[0].rejected_body`.
    RejectedBody,
    /// `policy.in_flight = "conflict_or_wait"`.
    PreferWait,
    /// `endpoints[0].key_required = true`.
    KeyRequired,
    /// `target.openapi_url`.
    OpenApi,
}

impl Need {
    /// Whether the manifest declares it.
    pub fn declared(self, m: &Manifest) -> bool {
        let fp = m.hooks.failpoint.as_ref();
        match self {
            Self::Clock => m.hooks.clock.is_some(),
            Self::ServerError => fp.and_then(|f| f.server_error.as_ref()).is_some(),
            Self::CrashRestart => {
                fp.and_then(|f| f.crash_after_commit.as_ref()).is_some()
                    && m.hooks.restart.is_some()
            }
            Self::ForeignCrash => {
                fp.and_then(|f| f.crash_after_foreign_call.as_ref())
                    .is_some()
                    && m.hooks.restart.is_some()
            }
            Self::Pause => fp.and_then(|f| f.pause.as_ref()).is_some(),
            Self::LeasePause => {
                fp.and_then(|f| f.lease_pause.as_ref()).is_some() && m.hooks.clock.is_some()
            }
            Self::RejectedBody => m.endpoints[0].rejected_body.is_some(),
            Self::PreferWait => {
                m.policy.in_flight == idem_spec::manifest::InFlightMode::ConflictOrWait
            }
            Self::KeyRequired => m.endpoints[0].key_required,
            Self::OpenApi => m.target.openapi_url.is_some(),
        }
    }

    /// What to declare to enable it.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Clock => "hooks.clock",
            Self::ServerError => "hooks.failpoint.server_error",
            Self::CrashRestart => "hooks.failpoint.crash_after_commit and hooks.restart",
            Self::Pause => "hooks.failpoint.pause",
            Self::LeasePause => "hooks.failpoint.lease_pause and hooks.clock",
            Self::ForeignCrash => "hooks.failpoint.crash_after_foreign_call and hooks.restart",
            Self::RejectedBody => "endpoints[0].rejected_body",
            Self::PreferWait => "policy.in_flight = \"conflict_or_wait\"",
            Self::KeyRequired => "endpoints[0].key_required = true",
            Self::OpenApi => "target.openapi_url",
        }
    }
}

/// One conformance case.
pub struct Case {
    /// Stable ID, `family.name`.
    pub id: &'static str,
    /// One line: what the case does.
    pub title: &'static str,
    /// The clauses the case checks.
    pub clauses: &'static [&'static str],
    /// What the manifest must declare; otherwise the case is `unsupported`.
    pub needs: &'static [Need],
    /// The permitted outcomes under the manifest's profile.
    pub permitted: fn(&Manifest) -> Vec<String>,
    /// The case itself.
    pub run: for<'a> fn(&'a mut Rec) -> BoxFut<'a>,
}

impl Case {
    /// The family: the part of the ID before the first dot.
    pub fn family(&self) -> &'static str {
        self.id.split('.').next().unwrap_or(self.id)
    }

    /// The strongest level among the cited clauses (MUST, else SHOULD, else MAY).
    pub fn tier(&self) -> Level {
        self.clauses
            .iter()
            .filter_map(|c| clauses::get(c))
            .map(|c| c.level)
            .min()
            .unwrap_or(Level::May)
    }

    /// The first need the manifest does not declare.
    pub fn missing_need(&self, m: &Manifest) -> Option<Need> {
        self.missing_need_with(m, false)
    }

    /// Like [`missing_need`](Self::missing_need), counting an in-process
    /// restarter (the demo's) as a declared restart hook.
    pub fn missing_need_with(&self, m: &Manifest, restarter: bool) -> Option<Need> {
        self.needs.iter().copied().find(|n| {
            let fp = m.hooks.failpoint.as_ref();
            let restart_ok = restarter
                && match n {
                    Need::CrashRestart => fp.is_some_and(|f| f.crash_after_commit.is_some()),
                    Need::ForeignCrash => fp.is_some_and(|f| f.crash_after_foreign_call.is_some()),
                    _ => false,
                };
            !restart_ok && !n.declared(m)
        })
    }

    /// Whether the case is a recovery case (and so goes to
    /// `hooks.failpoint.recovery_endpoint`).
    pub fn is_recovery(&self) -> bool {
        self.needs.iter().any(|n| {
            matches!(
                n,
                Need::CrashRestart | Need::ForeignCrash | Need::LeasePause
            )
        })
    }
}

/// The manifest as a case sees it: the endpoint the case is sent to moved
/// first, and that endpoint's own probe (if it declares one) in place of
/// the manifest's. Recovery cases go to `hooks.failpoint.recovery_endpoint`.
pub fn focus(m: &Manifest, recovery_case: bool) -> Manifest {
    let mut m = m.clone();
    if recovery_case
        && let Some(name) = m
            .hooks
            .failpoint
            .as_ref()
            .and_then(|f| f.recovery_endpoint.clone())
        && let Some(i) = m.endpoints.iter().position(|e| e.name == name)
    {
        let e = m.endpoints.remove(i);
        m.endpoints.insert(0, e);
    }
    if let Some(p) = m.endpoints[0].probe.clone() {
        m.probe = p;
    }
    m
}

/// A future the in-process restarter returns.
pub type RestartFut = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// Restarts the target from inside the kit, for a harness that owns the
/// target's process (the demo). It is given how many seconds the run has
/// moved the target's clock through the clock hook, so a restarted test
/// clock can resume where it was.
#[derive(Clone)]
pub struct Restarter(pub Arc<dyn Fn(u64) -> RestartFut + Send + Sync>);

impl std::fmt::Debug for Restarter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Restarter(..)")
    }
}

/// Everything a case may use: the manifest, the limited client, and fresh
/// run-unique names.
#[derive(Debug)]
pub struct Ctx {
    /// The target manifest.
    pub manifest: Manifest,
    /// The shared, limited client.
    pub client: Client,
    /// The run-unique prefix of every key and marker.
    pub run_id: String,
    /// Seed of the run (amounts and generated sequences derive from it).
    pub seed: u64,
    /// Where the run writes artifacts (counterexamples).
    pub artifacts: std::path::PathBuf,
    /// The in-process restarter, when the harness owns the target.
    pub restarter: Option<Restarter>,
    // Shared with the per-case views (`for_case`), so names never repeat.
    counter: Arc<AtomicU64>,
    clock_advanced: Arc<AtomicU64>,
}

impl Ctx {
    /// A context for one run.
    pub fn new(manifest: Manifest, client: Client, run_id: String, seed: u64) -> Self {
        Self {
            manifest,
            client,
            run_id,
            seed,
            artifacts: std::path::PathBuf::from("."),
            restarter: None,
            counter: Arc::new(AtomicU64::new(0)),
            clock_advanced: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Sets the in-process restarter.
    pub fn with_restarter(mut self, r: Option<Restarter>) -> Self {
        self.restarter = r;
        self
    }

    /// The view of this context a case runs with: the manifest [`focus`]ed
    /// on the case's endpoint; the client, run id and counters shared.
    pub fn for_case(&self, case: &Case) -> Ctx {
        Ctx {
            manifest: focus(&self.manifest, case.is_recovery()),
            client: self.client.clone(),
            run_id: self.run_id.clone(),
            seed: self.seed,
            artifacts: self.artifacts.clone(),
            restarter: self.restarter.clone(),
            counter: self.counter.clone(),
            clock_advanced: self.clock_advanced.clone(),
        }
    }

    /// Seconds this run has moved the target's clock so far.
    pub fn clock_advanced_secs(&self) -> u64 {
        self.clock_advanced.load(Ordering::SeqCst)
    }

    /// Waits (bounded by [`HOLD`] × 4) for a held request to finish,
    /// POSTing the release URL every 200 ms meanwhile: a release sent
    /// before the request reached its pause would be lost. `None` when it
    /// did not finish in time.
    pub async fn finish_held(&self, mut held: tokio::task::JoinHandle<Sent>) -> Option<Sent> {
        let deadline = tokio::time::Instant::now() + HOLD * 4;
        loop {
            let _ = self.release_paused().await;
            match tokio::time::timeout(Duration::from_millis(200), &mut held).await {
                Ok(Ok(sent)) => return Some(sent),
                Ok(Err(_)) => return None,
                Err(_) if tokio::time::Instant::now() < deadline => {}
                Err(_) => return None,
            }
        }
    }

    /// POSTs the failpoint hook's `release_url`, when declared, so paused
    /// requests finish now. `Ok(false)` when no release URL is declared.
    pub async fn release_paused(&self) -> Result<bool, String> {
        let Some(url) = self
            .manifest
            .hooks
            .failpoint
            .as_ref()
            .and_then(|f| f.release_url.clone())
        else {
            return Ok(false);
        };
        let req = Request {
            method: "POST".into(),
            url: self.url(&url),
            headers: self.auth(0),
            body: None,
            state_changing: false,
        };
        match self.client.send(&req).await {
            Ok(r) if (200..300).contains(&r.status) => Ok(true),
            Ok(r) => Err(format!("failpoint release answered {}", r.status)),
            Err(f) => Err(format!("failpoint release: {f}")),
        }
    }

    /// Sets the artifacts directory.
    pub fn with_artifacts(mut self, dir: std::path::PathBuf) -> Self {
        self.artifacts = dir;
        self
    }

    /// A number never handed out before in this run (keys, markers and
    /// generated-sequence tags draw from it, so re-runs never collide).
    pub fn unique(&self) -> u64 {
        self.next()
    }

    fn next(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// A fresh key carrying the run prefix.
    pub fn key(&self) -> String {
        format!("{}-k{}", self.run_id, self.next())
    }

    /// A fresh marker carrying the run prefix.
    pub fn marker(&self) -> String {
        format!("{}-m{}", self.run_id, self.next())
    }

    /// A fresh small amount (1..=50), varied so two operations differ.
    pub fn amount(&self) -> u64 {
        (self.seed.wrapping_add(self.next()) % 50) + 1
    }

    /// The main endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.manifest.endpoints[0]
    }

    /// Caller `i` (0 = the first declared).
    pub fn caller(&self, i: usize) -> &Caller {
        &self.manifest.callers[i.min(self.manifest.callers.len() - 1)]
    }

    /// An absolute URL for a path.
    pub fn url(&self, path: &str) -> String {
        probe::join(&self.manifest.target.base_url, path)
    }

    /// The caller's authentication headers.
    pub fn auth(&self, caller: usize) -> Vec<(String, Vec<u8>)> {
        self.caller(caller)
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.as_bytes().to_vec()))
            .collect()
    }

    /// The body of one logical operation of `caller`.
    pub fn body(&self, caller: usize, marker: &str) -> Value {
        expand(
            &self.endpoint().body,
            self.caller(caller),
            marker,
            self.amount(),
        )
    }

    /// A request to the main endpoint: the caller's headers, JSON body and,
    /// when given, the key (bare form).
    pub fn op(&self, caller: usize, key: Option<&str>, body: &Value) -> Request {
        let e = self.endpoint();
        let mut req = Request {
            method: e.method.clone(),
            url: self.url(&e.path),
            headers: self.auth(caller),
            body: None,
            state_changing: true,
        }
        .header("Content-Type", "application/json")
        .json_body(body);
        if let Some(k) = key {
            req = req.header(IDEMPOTENCY_KEY, k);
        }
        req
    }

    /// Counts the side effects of the operation `caller` marked `marker`.
    /// The probe asks as the manifest's probe caller when one is declared,
    /// else as the caller that sent the operation (listings are per caller).
    pub async fn effects(
        &self,
        caller: usize,
        marker: &str,
        seen: &[&Response],
    ) -> Result<u64, String> {
        let caller = self
            .manifest
            .probe_caller()
            .and_then(|n| self.manifest.callers.iter().position(|c| c.name == n))
            .unwrap_or(caller);
        probe::effects(
            &self.manifest.probe,
            &self.client,
            &self.manifest.target.base_url,
            &self.auth(caller),
            marker,
            seen,
        )
        .await
    }

    /// Counts the recovery endpoint's effects in the foreign system for
    /// `marker` through `hooks.foreign_probe`; `None` when none is declared.
    /// Caller headers go out only when the probe names a caller: the
    /// target's credentials are not the foreign system's.
    pub async fn foreign_effects(&self, marker: &str) -> Option<Result<u64, String>> {
        let fp = self.manifest.hooks.foreign_probe.as_ref()?;
        let caller = match fp {
            EffectProbe::Count { caller, .. } | EffectProbe::List { caller, .. } => caller
                .as_ref()
                .and_then(|n| self.manifest.callers.iter().position(|c| &c.name == n)),
            EffectProbe::ResourceId { .. } => None,
        };
        let headers = caller.map(|c| self.auth(c)).unwrap_or_default();
        Some(
            probe::effects(
                fp,
                &self.client,
                &self.manifest.target.base_url,
                &headers,
                marker,
                &[],
            )
            .await,
        )
    }

    /// Advances the target's clock through the clock hook.
    pub async fn advance_clock(&self, secs: u64) -> Result<(), String> {
        let hook = self
            .manifest
            .hooks
            .clock
            .as_ref()
            .ok_or("no clock hook declared")?;
        let req = Request {
            method: "POST".into(),
            url: self.url(&hook.url),
            headers: self.auth(0),
            body: None,
            state_changing: false,
        }
        .header("Content-Type", "application/json")
        .json_body(&serde_json::json!({ "advance_secs": secs }));
        match self.client.send(&req).await {
            Ok(r) if (200..300).contains(&r.status) => {
                self.clock_advanced.fetch_add(secs, Ordering::SeqCst);
                Ok(())
            }
            Ok(r) => Err(format!("clock hook answered {}", r.status)),
            Err(f) => Err(format!("clock hook: {f}")),
        }
    }

    /// The failpoint header and the value for `pick`, when declared.
    pub fn failpoint(
        &self,
        pick: fn(&idem_spec::manifest::FailpointHook) -> Option<&String>,
    ) -> Option<(String, String)> {
        let f = self.manifest.hooks.failpoint.as_ref()?;
        Some((f.header.clone(), pick(f)?.clone()))
    }
}

/// What a case records as it runs; the runner turns it into a report entry.
pub struct Rec {
    /// The run context.
    pub ctx: Arc<Ctx>,
    /// Checks made so far.
    pub checks: Vec<CheckReport>,
    /// Numbered narrative.
    pub narrative: Vec<String>,
    /// curl reproductions.
    pub reproduction: Vec<String>,
    /// Set when the case could not decide (timeout) or hit a harness problem.
    pub stopped: Option<(Verdict, String)>,
    sent: u32,
    aliases: BTreeMap<String, String>,
}

impl Rec {
    /// A recorder for one case.
    pub fn new(ctx: Arc<Ctx>) -> Self {
        Self {
            ctx,
            checks: Vec::new(),
            narrative: Vec::new(),
            reproduction: Vec::new(),
            stopped: None,
            sent: 0,
            aliases: BTreeMap::new(),
        }
    }

    /// A short alias (`K1`, `K2`, ...) for a long run-unique key, introduced
    /// in the narrative the first time it appears.
    pub fn alias(&mut self, key: &str) -> String {
        if let Some(a) = self.aliases.get(key) {
            return a.clone();
        }
        let a = format!("K{}", self.aliases.len() + 1);
        self.aliases.insert(key.to_owned(), a.clone());
        self.narrative.push(format!("{a} = {key:?}"));
        a
    }

    /// Adds a narrative line.
    pub fn note(&mut self, line: impl Into<String>) {
        self.narrative.push(line.into());
    }

    fn label(&mut self) -> String {
        self.sent += 1;
        format!("R{}", self.sent)
    }

    /// Sends one request, narrating it as `what`. On a timeout or broken
    /// connection the case becomes inconclusive; on a harness problem, an
    /// error. Returns the response when there is one.
    pub async fn send(&mut self, what: &str, req: &Request) -> Option<Response> {
        let label = self.label();
        self.reproduction
            .push(format!("# {label}\n{}", self.ctx.client.curl(req)));
        let sent = self.ctx.client.send(req).await;
        self.record(&label, what, sent)
    }

    /// Records a send that happened elsewhere (bursts, proxies).
    pub fn record(&mut self, label: &str, what: &str, sent: Sent) -> Option<Response> {
        match sent {
            Ok(r) => {
                self.note(format!("{label}: {what} → {}", r.summary()));
                Some(r)
            }
            Err(f) => {
                self.note(format!("{label}: {what} → no response ({f})"));
                self.fail_send(&f);
                None
            }
        }
    }

    /// Marks the case inconclusive or errored for a failed send.
    pub fn fail_send(&mut self, f: &Failure) {
        let v = match f {
            Failure::Timeout(_) | Failure::Transport(_) => Verdict::Inconclusive,
            Failure::Budget(_) | Failure::Harness(_) | Failure::Connect(_) => Verdict::Error,
        };
        self.stop(v, f.to_string());
    }

    /// Stops the case with a verdict other than pass/fail (first reason wins).
    pub fn stop(&mut self, verdict: Verdict, reason: impl Into<String>) {
        if self.stopped.is_none() {
            self.stopped = Some((verdict, reason.into()));
        }
    }

    /// Numbers the next request, for sends the case performs itself.
    pub fn next_label(&mut self) -> String {
        self.label()
    }

    /// Records one check of `clause`. Returns `ok` so cases can branch.
    pub fn check(
        &mut self,
        clause: &'static str,
        ok: bool,
        permitted: impl Into<String>,
        observed: impl Into<String>,
    ) -> bool {
        let level = clauses::get(clause).map_or(Level::Must, |c| c.level);
        let verdict = match (ok, level) {
            (true, _) => Verdict::Pass,
            (false, Level::Must) => Verdict::Fail,
            (false, _) => Verdict::NonStrict,
        };
        self.checks.push(CheckReport {
            clause: clause.to_owned(),
            level,
            verdict,
            permitted: permitted.into(),
            observed: observed.into(),
        });
        ok
    }

    /// Counts effects for `marker` and checks the count equals `want`
    /// against `clause`; an unusable probe stops the case as an error.
    pub async fn check_effects(
        &mut self,
        clause: &'static str,
        caller: usize,
        marker: &str,
        seen: &[&Response],
        want: u64,
        why: &str,
    ) -> Option<u64> {
        match self.ctx.effects(caller, marker, seen).await {
            Ok(n) => {
                self.note(format!(
                    "the probe counted {n} effect(s) for marker {marker:?}"
                ));
                if n != want {
                    // The one-sentence witness, in the style of Elle's
                    // anomaly explanations.
                    self.note(format!(
                        "so: {why}; the probe counted {n} effect(s); {clause} allows {want}"
                    ));
                }
                self.check(
                    clause,
                    n == want,
                    format!("exactly {want} side effect(s): {why}"),
                    format!("{n} side effect(s)"),
                );
                Some(n)
            }
            Err(e) => {
                self.stop(Verdict::Error, e);
                None
            }
        }
    }

    /// The verdict the recorded checks and stop reason add up to.
    pub fn verdict(&self) -> Verdict {
        let checks = self
            .checks
            .iter()
            .map(|c| c.verdict)
            .max()
            .unwrap_or(Verdict::Pass);
        match &self.stopped {
            // A broken MUST stays a failure even if a later step could not
            // be decided: the evidence is already there.
            Some(_) if checks == Verdict::Fail => Verdict::Fail,
            Some((v, _)) => *v,
            None if self.checks.is_empty() => Verdict::Inconclusive,
            None => checks,
        }
    }
}

/// How long to give a server that holds a request (pause failpoints,
/// `Prefer: wait`).
pub const HOLD: Duration = Duration::from_secs(5);

/// Describes an error under the manifest's profile: `409 idempotency_key_mismatch`.
pub fn wire_desc(m: &Manifest, code: idem_spec::ErrorCode) -> String {
    let w = m.wire(code);
    format!("{} {}", w.status, w.code)
}

/// Whether `r` is the contract error `code` under the manifest's profile.
pub fn is_error(m: &Manifest, r: &Response, code: idem_spec::ErrorCode) -> bool {
    let w = m.wire(code);
    r.status == w.status && r.code().as_deref() == Some(w.code.as_str())
}
