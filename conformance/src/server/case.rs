//! The shape every case shares, and the recorder a case reports through.
//!
//! A [`Case`] is data: an ID, the clauses it cites, what it needs from the
//! manifest, the outcomes it permits (computed from the declared profile, so
//! `list` can print them without sending anything), and an async `run`.
//! A case never decides its verdict by hand: it records [`Rec::check`]s, each
//! against one clause, and the verdict follows from the clause levels
//! (a failed MUST is `fail`, a failed SHOULD or MAY is `non-strict`), from
//! indeterminate sends (`inconclusive`) and harness problems (`error`).
//!
//! Every check also carries a class ([`Class`]): the clause's, or a milder
//! one when the case names the milder consequence it observed
//! ([`Rec::check_as`] with a [`Consequence`]: the verdict core's severity
//! rule, the same for the client check). Cases judge behaviour (executed? refused? replayed?
//! leaked?) under the behavioural clause and the spelling of each answer
//! under the interop clauses (`idem.errors.profiles`,
//! `idem.errors.problem-json`, `idem.replay.marker`), so a target that
//! speaks another dialect is never called unsafe for it.
//!
//! Adding a case touches its family's module only: a hook it needs is a
//! [`Need`] value (defined there or reused from here), and whether it must
//! run alone is a field of the case.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use std::sync::Mutex;

use idem_spec::clauses::{self, Class, Level};
use idem_spec::headers::IDEMPOTENCY_KEY;
use idem_spec::manifest::{Caller, EffectProbe, Endpoint, Manifest};
use idem_spec::report::{CheckReport, Verdict};
use serde_json::Value;

use crate::server::dialect::Dialect;
use crate::server::http::{Client, Failure, Request, Response, Sent};
use crate::server::manifest::{ManifestExt, amount_exclusions, draw_amount, expand, expand_text};
use crate::server::probe::{self, ProbeError, Subject};
use idem_conformance_core::clause::ClauseId;
use idem_conformance_core::verdict::{self, Consequence};

/// A boxed future borrowing the recorder.
pub type BoxFut<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Something a case needs from the manifest beyond the basics: a name for
/// reports (what to declare) and a test of the manifest. A case module may
/// define its own; the common ones are associated constants.
#[derive(Clone, Copy)]
pub struct Need {
    /// What to declare to enable it, e.g. `hooks.clock`.
    pub what: &'static str,
    /// Whether the manifest declares it; `restarter` is true when the
    /// harness owns the target and can restart it in process (the demo).
    pub declared: fn(&Manifest, bool) -> bool,
}

impl std::fmt::Debug for Need {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.what)
    }
}

fn failpoint(m: &Manifest, pick: fn(&idem_spec::manifest::FailpointHook) -> bool) -> bool {
    m.hooks.failpoint.as_ref().is_some_and(pick)
}

impl Need {
    /// `hooks.clock`.
    pub const CLOCK: Need = Need {
        what: "hooks.clock",
        declared: |m, _| m.hooks.clock.is_some(),
    };
    /// `hooks.failpoint.crash_after_commit` and `hooks.restart` (or an
    /// in-process restarter).
    pub const CRASH_RESTART: Need = Need {
        what: "hooks.failpoint.crash_after_commit and hooks.restart",
        declared: |m, restarter| {
            failpoint(m, |f| f.crash_after_commit.is_some())
                && (restarter || m.hooks.restart.is_some())
        },
    };
    /// `hooks.failpoint.crash_after_foreign_call` and `hooks.restart` (or
    /// an in-process restarter).
    pub const FOREIGN_CRASH: Need = Need {
        what: "hooks.failpoint.crash_after_foreign_call and hooks.restart",
        declared: |m, restarter| {
            failpoint(m, |f| f.crash_after_foreign_call.is_some())
                && (restarter || m.hooks.restart.is_some())
        },
    };
    /// `hooks.failpoint.pause`.
    pub const PAUSE: Need = Need {
        what: "hooks.failpoint.pause",
        declared: |m, _| failpoint(m, |f| f.pause.is_some()),
    };
    /// `hooks.failpoint.lease_pause` and `hooks.clock`.
    pub const LEASE_PAUSE: Need = Need {
        what: "hooks.failpoint.lease_pause and hooks.clock",
        declared: |m, _| failpoint(m, |f| f.lease_pause.is_some()) && m.hooks.clock.is_some(),
    };
    /// `endpoints[0].rejected_body`.
    pub const REJECTED_BODY: Need = Need {
        what: "endpoints[0].rejected_body",
        declared: |m, _| m.endpoints[0].rejected_body.is_some(),
    };
    /// `policy.in_flight = "conflict_or_wait"` (or `"always_wait"`).
    pub const PREFER_WAIT: Need = Need {
        what: "policy.in_flight = \"conflict_or_wait\" or \"always_wait\" (or a table with prefer_wait = \"wait\")",
        declared: |m, _| m.policy.in_flight.waits_when_asked(),
    };
    /// `endpoints[0].key_required = true`.
    pub const KEY_REQUIRED: Need = Need {
        what: "endpoints[0].key_required = true",
        declared: |m, _| m.endpoints[0].key_required,
    };
    /// The key in a header: the cases that test the header's own grammar.
    pub const KEY_IN_HEADER: Need = Need {
        what: "the key in a header (key.body_pointer not declared)",
        declared: |m, _| m.key.body_pointer.is_none(),
    };
    /// `profile.deadline_header`.
    pub const DEADLINE_HEADER: Need = Need {
        what: "profile.deadline_header",
        declared: |m, _| m.profile.deadline_header.is_some(),
    };
    /// `profile.expiry_header`.
    pub const EXPIRY_HEADER: Need = Need {
        what: "profile.expiry_header",
        declared: |m, _| m.profile.expiry_header.is_some(),
    };
    /// `target.openapi_url`.
    pub const OPENAPI: Need = Need {
        what: "target.openapi_url",
        declared: |m, _| m.target.openapi_url.is_some(),
    };

    /// What to declare to enable it.
    pub fn describe(&self) -> &'static str {
        self.what
    }
}

/// Which endpoint a case is sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aim {
    /// The first endpoint.
    Main,
    /// `hooks.failpoint.recovery_endpoint` (default: the first).
    Recovery,
}

/// One conformance case.
#[derive(Clone)]
pub struct Case {
    /// Stable ID, `family.name`.
    pub id: &'static str,
    /// One line: what the case does.
    pub title: &'static str,
    /// The clauses the case checks.
    pub clauses: &'static [ClauseId],
    /// What the manifest must declare; otherwise the case is `unsupported`.
    pub needs: &'static [Need],
    /// Which endpoint it is sent to.
    pub aim: Aim,
    /// Whether the case must run alone, after the others: it holds requests
    /// in flight, restarts the target or moves its clock, any of which
    /// would disturb cases running beside it.
    pub alone: fn(&Manifest) -> bool,
    /// The permitted outcomes under the manifest's profile.
    pub permitted: fn(&Manifest) -> Vec<String>,
    /// The case itself.
    pub run: for<'a> fn(&'a mut Rec) -> BoxFut<'a>,
}

/// For [`Case::alone`]: runs beside other cases.
pub fn shared(_: &Manifest) -> bool {
    false
}

/// For [`Case::alone`]: always runs alone.
pub fn alone(_: &Manifest) -> bool {
    true
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
            .filter_map(|c| clauses::get(c.as_str()))
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
        self.needs
            .iter()
            .copied()
            .find(|n| !(n.declared)(m, restarter))
    }

    /// Whether the case goes to `hooks.failpoint.recovery_endpoint`.
    pub fn is_recovery(&self) -> bool {
        self.aim == Aim::Recovery
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
    // marker -> the keys its operation was sent with, for key-matched probes.
    keys: Arc<Mutex<BTreeMap<String, Vec<String>>>>,
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
            keys: Arc::default(),
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
            client: self.client.for_case(),
            run_id: self.run_id.clone(),
            seed: self.seed,
            artifacts: self.artifacts.clone(),
            restarter: self.restarter.clone(),
            counter: self.counter.clone(),
            clock_advanced: self.clock_advanced.clone(),
            keys: self.keys.clone(),
        }
    }

    /// This context with another manifest (the preflight focuses it on each
    /// endpoint in turn); the client, run id and counters shared.
    pub fn view(&self, manifest: Manifest) -> Ctx {
        Ctx {
            manifest,
            client: self.client.clone(),
            run_id: self.run_id.clone(),
            seed: self.seed,
            artifacts: self.artifacts.clone(),
            restarter: self.restarter.clone(),
            counter: self.counter.clone(),
            clock_advanced: self.clock_advanced.clone(),
            keys: self.keys.clone(),
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
            signed_by: self.signer(0),
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

    /// A fresh key, unique in the run, in the target's declared grammar
    /// ([`crate::server::keyform`]).
    pub fn key(&self) -> String {
        crate::server::keyform::mint(&self.manifest.key, &self.run_id, self.next())
    }

    /// A fresh marker carrying the run prefix.
    pub fn marker(&self) -> String {
        format!("{}-m{}", self.run_id, self.next())
    }

    /// A fresh amount from the endpoint's declared range, never one of its
    /// excluded values (nor one its rejected or server-error body uses),
    /// varied so two operations differ.
    pub fn amount(&self) -> i64 {
        self.amount_at(self.seed.wrapping_add(self.next()))
    }

    /// The `n`-th amount of the endpoint's range (deterministic: the
    /// generated phase derives its bodies from it).
    pub fn amount_at(&self, n: u64) -> i64 {
        let e = self.endpoint();
        draw_amount(&e.amounts, &amount_exclusions(e), n)
    }

    /// Caller `i`'s name, for narratives.
    pub fn name(&self, i: usize) -> &str {
        &self.caller(i).name
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

    /// The caller whose signature `caller`'s requests carry, when it signs
    /// (`callers[].signing`): the client adds it as each request leaves.
    pub fn signer(&self, caller: usize) -> Option<String> {
        let c = self.caller(caller);
        c.signing.as_ref().map(|_| c.name.clone())
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

    /// The header the target reads keys from: `key.header`, or the
    /// contract's `Idempotency-Key`.
    pub fn key_header(&self) -> &str {
        self.manifest
            .key
            .header
            .as_deref()
            .unwrap_or(IDEMPOTENCY_KEY)
    }

    /// A request to the main endpoint for the operation marked `marker`:
    /// the caller's headers, the endpoint's declared headers and path (with
    /// the marker), the JSON body and, when given, the key (bare form).
    /// The key is remembered for the marker, for key-matched probes.
    pub fn op(&self, caller: usize, key: Option<&str>, marker: &str, body: &Value) -> Request {
        let e = self.endpoint();
        let who = self.caller(caller);
        let mut req = Request {
            method: e.method.clone(),
            url: self.url(&expand_text(&e.path, who, marker)),
            headers: self.auth(caller),
            body: None,
            state_changing: true,
            signed_by: self.signer(caller),
        }
        .header("Content-Type", "application/json")
        .json_body(body);
        for (name, value) in &e.headers {
            req = req.header(name, &expand_text(value, who, marker));
        }
        if let Some(k) = key {
            self.remember_key(marker, k);
            match &self.manifest.key.body_pointer {
                Some(pointer) => {
                    let mut with_key = body.clone();
                    put_at(&mut with_key, pointer, Value::String(k.to_owned()));
                    req = req.json_body(&with_key);
                }
                None => req = req.header(self.key_header(), k),
            }
        }
        req
    }

    /// `req` with another JSON body, its key kept where it travels (a key
    /// in the body is written into the new one).
    pub fn rebody(&self, req: &Request, body: &Value) -> Request {
        match &self.manifest.key.body_pointer {
            Some(pointer) => {
                let key = self.key_of(req);
                let mut with_key = body.clone();
                put_at(&mut with_key, pointer, Value::String(key));
                req.clone().json_body(&with_key)
            }
            None => req.clone().json_body(body),
        }
    }

    /// `req` under its key with a body drawn afresh for `marker` (so the
    /// probe sees both, with another amount), drawn again up to five times
    /// while it equals `req`'s; the last draw when none differed, which the
    /// caller can tell by comparing bodies.
    pub fn redrawn(&self, req: &Request, caller: usize, marker: &str) -> Request {
        let mut other = self.rebody(req, &self.body(caller, marker));
        for _ in 0..5 {
            if other.body != req.body {
                break;
            }
            other = self.rebody(req, &self.body(caller, marker));
        }
        other
    }

    /// The key `req` carries where the target reads it (header or body).
    pub fn key_of(&self, req: &Request) -> String {
        match &self.manifest.key.body_pointer {
            Some(pointer) => req
                .body
                .as_deref()
                .and_then(|b| serde_json::from_slice::<Value>(b).ok())
                .and_then(|v| {
                    v.pointer(pointer)
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .unwrap_or_default(),
            None => {
                let kh = self.key_header();
                req.headers
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(kh))
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_default()
            }
        }
    }

    /// Records that the operation `marker` was sent with `key` (bare form).
    pub fn remember_key(&self, marker: &str, key: &str) {
        if let Ok(mut keys) = self.keys.lock() {
            let v = keys.entry(marker.to_owned()).or_default();
            if !v.iter().any(|k| k == key) {
                v.push(key.to_owned());
            }
        }
    }

    fn keys_of(&self, marker: &str) -> Vec<String> {
        self.keys
            .lock()
            .ok()
            .and_then(|k| k.get(marker).cloned())
            .unwrap_or_default()
    }

    /// Counts the side effects of the operation `caller` marked `marker`.
    /// The probe asks as the manifest's probe caller when one is declared,
    /// else as the caller that sent the operation (listings are per caller).
    pub async fn effects(
        &self,
        caller: usize,
        marker: &str,
        seen: &[&Response],
    ) -> Result<u64, ProbeError> {
        let caller = self
            .manifest
            .probe_caller()
            .and_then(|n| self.manifest.callers.iter().position(|c| c.name == n))
            .unwrap_or(caller);
        let keys = self.keys_of(marker);
        probe::effects(
            &self.manifest.probe,
            &self.client,
            &self.manifest.target.base_url,
            &self.auth(caller),
            self.signer(caller),
            Subject {
                marker,
                keys: &keys,
            },
            seen,
        )
        .await
    }

    /// Like [`effects`](Self::effects), for a check expecting `want`: a
    /// count below it is read again (every 100 ms, for at most
    /// `limits.probe_settle_ms`), since many listings catch up with a write
    /// a moment late. A count at or above `want` is final at once.
    pub async fn effects_settled(
        &self,
        caller: usize,
        marker: &str,
        seen: &[&Response],
        want: u64,
    ) -> Result<u64, ProbeError> {
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(self.manifest.limits.probe_settle_ms);
        loop {
            let n = self.effects(caller, marker, seen).await?;
            let fixed = matches!(self.manifest.probe, EffectProbe::ResourceId { .. });
            if n >= want || fixed || tokio::time::Instant::now() >= deadline {
                return Ok(n);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Counts handler runs for `marker` through `hooks.execution_probe`;
    /// `None` when none is declared.
    pub async fn executions(&self, marker: &str) -> Option<Result<u64, ProbeError>> {
        let p = self.manifest.hooks.execution_probe.as_ref()?;
        let keys = self.keys_of(marker);
        Some(self.probe_with(p, marker, &keys).await)
    }

    async fn probe_with(
        &self,
        p: &EffectProbe,
        marker: &str,
        keys: &[String],
    ) -> Result<u64, ProbeError> {
        let caller = match p {
            EffectProbe::Count { caller, .. } | EffectProbe::List { caller, .. } => caller
                .as_ref()
                .and_then(|n| self.manifest.callers.iter().position(|c| &c.name == n)),
            EffectProbe::ResourceId { .. } => None,
        };
        let headers = caller.map(|c| self.auth(c)).unwrap_or_default();
        probe::effects(
            p,
            &self.client,
            &self.manifest.target.base_url,
            &headers,
            caller.and_then(|c| self.signer(c)),
            Subject { marker, keys },
            &[],
        )
        .await
    }

    /// Whether `r`, a 2xx answer to `caller`'s operation `marker`, is
    /// `other` (another caller's stored response, for that caller's
    /// operation `other_marker`) leaked rather than an answer of its own,
    /// and what proves it. The same document (bytes, or JSON members in
    /// any order) is necessary; it is sufficient when the answer carries
    /// something only the other operation had (its run-unique marker, when
    /// this request did not carry it), when the probe is a resource id (the
    /// same id), or when this operation's effect count did not move from
    /// `before` (the answer is not the record of an execution of its own).
    /// Identical documents without any of that could be two executions of
    /// an API whose answers carry no id: not a leak.
    pub async fn is_leak(
        &self,
        caller: usize,
        marker: &str,
        before: u64,
        r: &Response,
        other: &Response,
        other_marker: Option<&str>,
    ) -> Result<Option<String>, ProbeError> {
        if !((200..300).contains(&r.status) && r.same_payload(other)) {
            return Ok(None);
        }
        if let Some(m) = other_marker
            && m != marker
            && String::from_utf8_lossy(&other.body).contains(m)
        {
            return Ok(Some(format!(
                "the answer carries the other operation's marker {m:?}{}",
                self.dialect().ids_side_by_side(r, other)
            )));
        }
        if matches!(self.manifest.probe, EffectProbe::ResourceId { .. }) {
            return Ok(Some(format!(
                "the same resource{}",
                self.dialect().ids_side_by_side(r, other)
            )));
        }
        let now = self.effects(caller, marker, &[r]).await?;
        Ok((now <= before).then(|| {
            format!(
                "the probe counted {now} effect(s) for this operation, {before} before it{}",
                self.dialect().ids_side_by_side(r, other)
            )
        }))
    }

    /// The target's declared dialect, for the pure judges: what they may
    /// read of the manifest, and nothing of the run.
    pub fn dialect(&self) -> Dialect<'_> {
        Dialect(&self.manifest)
    }

    /// Counts the recovery endpoint's effects in the foreign system for
    /// `marker` through `hooks.foreign_probe`; `None` when none is declared.
    /// Caller headers go out only when the probe names a caller: the
    /// target's credentials are not the foreign system's.
    pub async fn foreign_effects(&self, marker: &str) -> Option<Result<u64, ProbeError>> {
        let fp = self.manifest.hooks.foreign_probe.as_ref()?;
        let keys = self.keys_of(marker);
        Some(self.probe_with(fp, marker, &keys).await)
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
            signed_by: self.signer(0),
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
    /// The ID of the case being recorded, for harness-error messages.
    pub case_id: &'static str,
    sent: u32,
    aliases: BTreeMap<String, String>,
}

impl Rec {
    /// A recorder for one case.
    pub fn new(ctx: Arc<Ctx>) -> Self {
        Self {
            case_id: "",
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
        let reason = match f {
            Failure::Budget(b) => budget_spent(self.case_id, *b),
            _ => f.to_string(),
        };
        self.stop(v, reason);
    }

    /// Whether the case has stopped for a harness problem (a request that
    /// was not sent: budget, connect): nothing after it may be judged.
    pub fn harness_stopped(&self) -> bool {
        matches!(self.stopped, Some((Verdict::Error, _)))
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

    /// Records one check of `clause`, with the clause's level and class.
    /// Returns `ok` so cases can branch.
    pub fn check(
        &mut self,
        clause: ClauseId,
        ok: bool,
        permitted: impl Into<String>,
        observed: impl Into<String>,
    ) -> bool {
        self.checks
            .push(verdict::check(clause, ok, permitted, observed));
        ok
    }

    /// Records one check of `clause` whose failure had the consequence
    /// `seen`: the severity rule ([`Consequence::class`]) gives its class,
    /// never worse than the clause's own.
    pub fn check_as(
        &mut self,
        clause: ClauseId,
        seen: Consequence,
        ok: bool,
        permitted: impl Into<String>,
        observed: impl Into<String>,
    ) -> bool {
        self.checks
            .push(verdict::check_as(clause, seen, ok, permitted, observed));
        ok
    }

    /// Records a check whose class the severity rule already gave (a
    /// generated sequence's violation, judged by the model), never worse
    /// than the clause's own.
    pub fn check_decided(
        &mut self,
        clause: ClauseId,
        class: Class,
        ok: bool,
        permitted: impl Into<String>,
        observed: impl Into<String>,
    ) -> bool {
        let mut c = verdict::check(clause, ok, permitted, observed);
        c.class = c.class.min(class);
        self.checks.push(c);
        ok
    }

    /// Gives the last check, if it failed, the one line a report leads
    /// with: the number that proves it.
    pub fn headline(&mut self, text: impl Into<String>) {
        if let Some(c) = self.checks.last_mut()
            && c.verdict != Verdict::Pass
        {
            c.headline = Some(text.into());
        }
    }

    /// Counts effects for `marker` and checks the count equals `want`
    /// against `clause`; an unusable probe stops the case as an error, and a
    /// probe that cannot see this operation (matched by key, sent without
    /// one) as inconclusive.
    pub async fn check_effects(
        &mut self,
        clause: ClauseId,
        caller: usize,
        marker: &str,
        seen: &[&Response],
        want: u64,
        why: &str,
    ) -> Option<u64> {
        self.check_effects_as(
            clause,
            Consequence::SecondEffect,
            caller,
            marker,
            seen,
            want,
            why,
        )
        .await
    }

    /// [`check_effects`](Self::check_effects) with a milder class.
    #[allow(clippy::too_many_arguments)]
    pub async fn check_effects_as(
        &mut self,
        clause: ClauseId,
        consequence: Consequence,
        caller: usize,
        marker: &str,
        seen: &[&Response],
        want: u64,
        why: &str,
    ) -> Option<u64> {
        if self.harness_stopped() {
            // A request of this case was never sent: no count can be
            // judged (the rule: no verdict from a request not sent).
            return None;
        }
        match self.ctx.effects_settled(caller, marker, seen, want).await {
            Ok(n) => {
                // The rule: no safety failure from a count of zero. Too
                // few effects means a request was refused or lost, which
                // costs the caller a retry, never a duplicate.
                let consequence = if n == 0 && want > 0 {
                    Consequence::Behaviour
                } else {
                    consequence
                };
                self.note(format!(
                    "the probe counted {n} effect(s) for marker {marker:?}"
                ));
                if n != want {
                    // The one-sentence witness, in the style of Elle's
                    // anomaly explanations.
                    self.note(format!(
                        "so: {why}, and the probe counted {n} effect(s) where {clause} allows {want}"
                    ));
                }
                self.check_as(
                    clause,
                    consequence,
                    n == want,
                    format!("exactly {want} side effect(s): {why}"),
                    format!("{n} side effect(s)"),
                );
                self.headline(format!("{why}: {n} effect(s), {want} allowed"));
                Some(n)
            }
            Err(e) => {
                self.probe_failed(e);
                None
            }
        }
    }

    /// Counts handler runs for `marker` through the execution probe and
    /// checks the count equals `want`; `None` (and no check) when the
    /// manifest declares no execution probe.
    pub async fn check_executions(
        &mut self,
        clause: ClauseId,
        marker: &str,
        want: u64,
        why: &str,
    ) -> Option<u64> {
        self.check_executions_as(clause, Consequence::SecondEffect, marker, want, why)
            .await
    }

    /// [`check_executions`](Self::check_executions) with a milder class
    /// (the caller knows the consequence it observed). A count of zero is
    /// never safety.
    pub async fn check_executions_as(
        &mut self,
        clause: ClauseId,
        seen: Consequence,
        marker: &str,
        want: u64,
        why: &str,
    ) -> Option<u64> {
        if self.harness_stopped() {
            return None;
        }
        match self.ctx.executions(marker).await? {
            Ok(n) => {
                let seen = if n == 0 && want > 0 {
                    Consequence::Behaviour
                } else {
                    seen
                };
                self.note(format!(
                    "the execution probe counted {n} handler run(s) for marker {marker:?}"
                ));
                self.check_as(
                    clause,
                    seen,
                    n == want,
                    format!("exactly {want} handler run(s): {why}"),
                    format!("{n} handler run(s)"),
                );
                self.headline(format!("{why}: {n} handler run(s), {want} allowed"));
                Some(n)
            }
            Err(e) => {
                self.probe_failed(e);
                None
            }
        }
    }

    /// A probe gave no count: inconclusive when it cannot see the operation
    /// at all, an error when it is broken.
    pub fn probe_failed(&mut self, e: ProbeError) {
        match e {
            ProbeError::NoKey => {
                self.note(format!("not counted: {e}"));
                self.stop(Verdict::Inconclusive, e.to_string());
            }
            ProbeError::Failed(s) => self.stop(Verdict::Error, s),
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

/// The reason a case stops when the side-effect budget ran out: a harness
/// error naming the case and the setting to raise.
pub fn budget_spent(case: &str, budget: u64) -> String {
    format!(
        "the side-effect budget ran out in case {case}: limits.max_side_effects = {budget} was spent before this case's requests could be sent; raise limits.max_side_effects in the manifest (nothing was judged from the requests not sent)"
    )
}

/// How long to give a server that holds a request (pause failpoints,
/// `Prefer: wait`).
pub const HOLD: Duration = Duration::from_secs(5);

/// Writes `value` at JSON pointer `pointer` in `doc`, creating the objects
/// on the way (an array index that does not exist is left alone).
fn put_at(doc: &mut Value, pointer: &str, value: Value) {
    let mut at = doc;
    let parts: Vec<String> = pointer
        .split('/')
        .skip(1)
        .map(|p| p.replace("~1", "/").replace("~0", "~"))
        .collect();
    let Some((last, path)) = parts.split_last() else {
        *at = value;
        return;
    };
    for p in path {
        if !at.is_object() && !at.is_array() {
            *at = Value::Object(serde_json::Map::new());
        }
        let next = match at {
            Value::Object(m) => m
                .entry(p.clone())
                .or_insert_with(|| Value::Object(serde_json::Map::new())),
            Value::Array(a) => match p.parse::<usize>().ok().and_then(|i| a.get_mut(i)) {
                Some(v) => v,
                None => return,
            },
            _ => return,
        };
        at = next;
    }
    match at {
        Value::Object(m) => {
            m.insert(last.clone(), value);
        }
        Value::Array(a) => {
            if let Some(slot) = last.parse::<usize>().ok().and_then(|i| a.get_mut(i)) {
                *slot = value;
            }
        }
        other => {
            let mut m = serde_json::Map::new();
            m.insert(last.clone(), value);
            *other = Value::Object(m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::put_at;
    use serde_json::json;

    #[test]
    fn a_key_is_written_at_its_pointer_creating_what_is_missing() {
        let mut doc = json!({"amount": 3});
        put_at(&mut doc, "/id", json!("k1"));
        assert_eq!(doc, json!({"amount": 3, "id": "k1"}));
        put_at(&mut doc, "/event/id", json!("k2"));
        assert_eq!(doc["event"]["id"], "k2");
        put_at(&mut doc, "/id", json!("k3"));
        assert_eq!(doc["id"], "k3", "replaced, not duplicated");
        put_at(&mut doc, "/a~1b", json!("k4"));
        assert_eq!(doc["a/b"], "k4", "RFC 6901 escapes");
        let mut list = json!({"items": [{"x": 1}]});
        put_at(&mut list, "/items/0/id", json!("k5"));
        assert_eq!(list["items"][0]["id"], "k5");
        put_at(&mut list, "/items/9/id", json!("k6"));
        assert_eq!(
            list["items"].as_array().map(Vec::len),
            Some(1),
            "no index invented"
        );
    }
}
