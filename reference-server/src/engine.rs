//! The idempotency engine: what happens to one request with a key.
//!
//! ```text
//!   lookup (one read) ──complete, in window──► fingerprint equal? ─yes─► replay
//!         │                                             └─no──► 409 mismatch
//!         ├─in flight (committed lease) ──► 409 in use, or wait (Prefer: wait)
//!         └─absent / past window
//!               ▼
//!   local in-flight registry ──held here──► 409 in use, or wait
//!               ▼
//!   store.claim: one transaction, INSERT ... ON CONFLICT (caller, key)
//!         ├─Busy (held by another process) ──► 409 in use, or wait
//!         ├─Taken (committed since our read) ──► start over (bounded)
//!         └─Claimed ──► endpoint runs inside the same transaction
//!                         ├─2xx/4xx ──► store response + commit all
//!                         └─5xx ─────► roll back all; key absent again
//! ```
//!
//! Multi-step routes ([`crate::multistep`]) share everything up to the
//! claim; a claimed request then runs phases instead of one handler, and
//! one more case exists: a key in flight past its recovery point `started`
//! whose lease has expired is *taken over* (generation + 1) and resumed at
//! its last recovery point, instead of answering 409.
//!
//! The local registry is an optimisation and the source of wake-ups, never
//! the arbiter: two processes on one database are arbitrated by the store.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, Response, header};
use idem_spec::headers::{IDEMPOTENCY_KEY, PREFER, prefer_wait_secs};
use idem_spec::policy::{self, FailurePolicy};
use idem_spec::{Fingerprint, IdempotencyKey, KeyState, Policy, RecoveryPoint};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::clock::{Clock, Millis};
use crate::error::{Error, Result};
use crate::failpoint::{FAILPOINT_HEADER, Failpoint, Failpoints, Position, STARTED};
use crate::flaws::{Flaw, Flaws};
use crate::layer::{Caller, IdemTx};
use crate::multistep::{Driver, Start};
use crate::store::phases::AbandonedKey;
use crate::store::{
    ClaimOutcome, ClaimRequest, Claimed, KeyStore, Store, StoredHeader, StoredResponse,
};

/// Tunables of the engine. [`Default`] gives the published reference policy.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// How long a completed key is replayed (from its first request).
    pub replay_window: Duration,
    /// How long a record is kept before the reaper deletes it.
    pub retention: Duration,
    /// The lease an in-flight key holds.
    pub lease: Duration,
    /// `Retry-After` on 409 `idempotency_key_in_use`.
    pub retry_after_secs: u64,
    /// The server's bound on `Prefer: wait=N`.
    pub max_wait: Duration,
    /// While waiting on a key held by *another process*, how often the store
    /// is read again (same-process waits are woken by a notification).
    pub wait_poll_interval: Duration,
    /// Largest request body accepted on idempotent endpoints (413 above).
    pub max_body_bytes: usize,
    /// Largest response an endpoint may produce (it is stored for replay).
    pub max_response_bytes: usize,
    /// Deliberate flaws (empty unless built with the `flaws` feature).
    pub flaws: Flaws,
    /// Honour the `Idem-Failpoint` header (`--test-hooks` only).
    pub failpoints: bool,
    /// Longest a `pause-...` failpoint stalls a request.
    pub failpoint_max_pause: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        let p = Policy::default();
        Self {
            replay_window: Duration::from_secs(p.replay_window_secs),
            retention: Duration::from_secs(p.retention_secs),
            lease: Duration::from_secs(p.lease_secs),
            retry_after_secs: policy::DEFAULT_IN_USE_RETRY_AFTER_SECS,
            max_wait: Duration::from_secs(policy::DEFAULT_MAX_WAIT_SECS),
            wait_poll_interval: Duration::from_millis(50),
            max_body_bytes: 64 * 1024,
            max_response_bytes: 1024 * 1024,
            flaws: Flaws::none(),
            failpoints: false,
            failpoint_max_pause: Duration::from_secs(120),
        }
    }
}

impl EngineConfig {
    /// The published policy these settings amount to.
    pub fn policy(&self) -> Policy {
        Policy {
            replay_window_secs: self.replay_window.as_secs(),
            retention_secs: self.retention.as_secs(),
            lease_secs: self.lease.as_secs(),
            in_flight: idem_spec::policy::InFlightBehaviour::ConflictOrWait {
                retry_after_secs: self.retry_after_secs,
                max_wait_secs: self.max_wait.as_secs(),
            },
            failure_policy: FailurePolicy::FinalUnlessServerError,
        }
    }

    fn replay_window_ms(&self) -> Millis {
        // FLAW(keys-expire-early): a window of one minute instead of the
        // published one.
        if self.flaws.on(Flaw::KeysExpireEarly) {
            return 60_000;
        }
        ms(self.replay_window)
    }
}

fn ms(d: Duration) -> Millis {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The engine, shared by every [`IdempotencyLayer`](crate::IdempotencyLayer)
/// built from it. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Engine<K: KeyStore> {
    store: K,
    clock: Arc<dyn Clock>,
    config: Arc<EngineConfig>,
    registry: Arc<Registry>,
    waiting: Arc<AtomicUsize>,
    failpoints: Arc<Failpoints>,
}

impl<K: KeyStore> Engine<K> {
    /// An engine over `store`, reading time from `clock`.
    pub fn new(store: K, clock: Arc<dyn Clock>, config: EngineConfig) -> Self {
        let failpoints = Arc::new(Failpoints::new(config.failpoint_max_pause));
        Self {
            store,
            clock,
            config: Arc::new(config),
            registry: Arc::new(Registry::default()),
            waiting: Arc::new(AtomicUsize::new(0)),
            failpoints,
        }
    }

    /// The failpoint registry (paused requests, the release signal).
    pub fn failpoints(&self) -> &Arc<Failpoints> {
        &self.failpoints
    }

    /// The lease length in milliseconds.
    pub fn lease_ms(&self) -> Millis {
        ms(self.config.lease)
    }

    /// The store.
    pub fn store(&self) -> &K {
        &self.store
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// How many duplicates `Prefer: wait` is holding right now: a gauge for
    /// metrics, and what tests watch to know a duplicate is really waiting.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Serves one request on an idempotent endpoint: replays, rejects, waits
    /// or executes it through `inner` inside the claim's transaction.
    pub async fn handle<S>(
        &self,
        req: Request<Body>,
        inner: S,
        replay_headers: &[HeaderName],
    ) -> Response<Body>
    where
        S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send,
        S::Future: Send,
    {
        let mode = Mode::Single {
            inner,
            replay_headers,
        };
        match self.handle_inner(req, mode).await {
            Ok(r) => r,
            Err(e) => axum::response::IntoResponse::into_response(e),
        }
    }

    async fn handle_inner<S>(
        &self,
        req: Request<Body>,
        mode: Mode<'_, S, K>,
    ) -> Result<Response<Body>>
    where
        S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send,
        S::Future: Send,
    {
        let (parts, body) = req.into_parts();
        // Everything up to the claim rejects without touching the store, so
        // the key is not consumed (clause idem.failure.unclaimed).
        let caller = parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or(Error::Unauthenticated(
                "send Authorization: Bearer <token>; idempotency keys are scoped to the authenticated caller",
            ))?;
        let key = IdempotencyKey::from_header_values(
            parts
                .headers
                .get_all(IDEMPOTENCY_KEY)
                .iter()
                .map(HeaderValue::as_bytes),
        )
        .map_err(|e| match e {
            idem_spec::Error::KeyMissing => Error::KeyMissing,
            other => Error::KeyInvalid(other),
        })?;
        let body = read_body(body, &parts.headers, self.config.max_body_bytes).await?;
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let path = parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned());
        let method = parts.method.as_str().to_owned();
        let fingerprint =
            Fingerprint::compute(&method, &path, content_type.as_deref(), &body).to_hex();
        // FLAW(global-keys): every caller shares one key space.
        let scope_caller = if self.config.flaws.on(Flaw::GlobalKeys) {
            "*".to_owned()
        } else {
            caller.0.clone()
        };
        let wait = prefer_wait_secs(
            parts
                .headers
                .get_all(PREFER)
                .iter()
                .filter_map(|v| v.to_str().ok()),
        )
        .map(|n| Duration::from_secs(n).min(self.config.max_wait));
        let deadline = Instant::now() + wait.unwrap_or_default();
        // Failpoints exist only with --test-hooks; otherwise the header is
        // not even read.
        let mut failpoints = Vec::new();
        if self.config.failpoints {
            for v in parts.headers.get_all(FAILPOINT_HEADER) {
                let v = v
                    .to_str()
                    .map_err(|_| Error::Validation("Idem-Failpoint must be ASCII".into()))?;
                failpoints.extend(crate::failpoint::parse(v)?);
            }
        }
        let multi = matches!(mode, Mode::Multi(_));

        let req = Pending {
            caller: scope_caller,
            key: key.as_str().to_owned(),
            fingerprint,
            method,
            path,
            content_type,
            body,
            wait,
            failpoints,
        };
        // Bounded: each turn returns, waits (bounded by the deadline), or
        // lost a claim race to a request that committed meanwhile, which the
        // next read will replay.
        let mut taken_races = 0u32;
        let mut waited = false;
        for _ in 0..10_000 {
            let now = self.clock.now_ms();
            let in_flight = match self.classify(&req, now, waited, multi).await? {
                Step::Replay(r) => return Ok(r),
                Step::InFlight(entry) => entry,
                Step::Resumable => {
                    let Mode::Multi(driver) = mode else {
                        return Err(Error::Internal(
                            "resumable key on a single-phase route".into(),
                        ));
                    };
                    // The lease is over, so the store arbitrates: take the
                    // local slot even if a (paused, stale) local holder has
                    // it; fencing refuses that holder's later commits.
                    let guard =
                        self.registry
                            .force_acquire(&req.caller, &req.key, &req.fingerprint);
                    match driver.run(self, &req, Start::Resume, guard).await? {
                        Some(r) => return Ok(r),
                        None => {
                            taken_races += 1;
                            if taken_races > 20 {
                                return Err(self.in_use());
                            }
                            continue;
                        }
                    }
                }
                Step::Claimable => {
                    // FLAW(check-then-insert): we read the key and found
                    // nothing; execute without claiming and write the record
                    // at the end. Two duplicates that both read "absent" both
                    // execute.
                    #[cfg(feature = "flaws")]
                    if self.config.flaws.on(Flaw::CheckThenInsert)
                        && let Mode::Single {
                            inner,
                            replay_headers,
                        } = mode
                    {
                        return self
                            .execute_unclaimed(&req, parts, inner, replay_headers, true)
                            .await;
                    }
                    match self.try_claim(&req, now).await? {
                        TryClaim::Executed(guard, claimed) => {
                            return match mode {
                                Mode::Single {
                                    inner,
                                    replay_headers,
                                } => {
                                    self.execute(&req, claimed, parts, inner, replay_headers, guard)
                                        .await
                                }
                                Mode::Multi(driver) => driver
                                    .run(self, &req, Start::Fresh(claimed, now), guard)
                                    .await?
                                    .ok_or_else(|| {
                                        Error::Internal("a fresh claim cannot lose".into())
                                    }),
                            };
                        }
                        TryClaim::InFlight(entry) => entry,
                        TryClaim::Taken => {
                            taken_races += 1;
                            if taken_races > 20 {
                                return Err(self.in_use());
                            }
                            continue;
                        }
                    }
                }
            };
            // FLAW(no-in-flight-state): the duplicate of an in-flight
            // request executes as if it were new.
            #[cfg(feature = "flaws")]
            if self.config.flaws.on(Flaw::NoInFlightState)
                && let Mode::Single {
                    inner,
                    replay_headers,
                } = mode
            {
                return self
                    .execute_unclaimed(&req, parts, inner, replay_headers, false)
                    .await;
            }
            self.wait_or_conflict(&req, deadline, in_flight.as_deref())
                .await?;
            waited = true;
        }
        Err(self.in_use())
    }

    /// Local registry first (cheap, and the source of wake-ups), then the
    /// store's atomic claim (the arbiter).
    async fn try_claim(&self, req: &Pending, now: Millis) -> Result<TryClaim<K::Tx>> {
        let guard = match self
            .registry
            .try_acquire(&req.caller, &req.key, &req.fingerprint)
        {
            Ok(guard) => guard,
            Err(entry) => {
                if entry.fingerprint != req.fingerprint
                    && !self.config.flaws.on(Flaw::NoFingerprintCheck)
                {
                    return Err(Error::KeyMismatch);
                }
                return Ok(TryClaim::InFlight(Some(entry)));
            }
        };
        let claim = req.claim_request(now, &self.config);
        match self.store.claim(&claim).await? {
            ClaimOutcome::Claimed(claimed) => Ok(TryClaim::Executed(guard, claimed)),
            ClaimOutcome::Busy => Ok(TryClaim::InFlight(None)),
            ClaimOutcome::Taken => Ok(TryClaim::Taken),
        }
    }

    fn in_use(&self) -> Error {
        Error::KeyInUse {
            retry_after_secs: self.config.retry_after_secs,
        }
    }

    /// The one read that decides a replay (or a mismatch, or in flight).
    /// For a replay this read is the whole cost: no transaction, no lock.
    async fn classify(
        &self,
        req: &Pending,
        now: Millis,
        waited: bool,
        multi: bool,
    ) -> Result<Step> {
        let Some(rec) = self.store.lookup(&req.caller, &req.key).await? else {
            return Ok(Step::Claimable);
        };
        let fingerprint_differs =
            rec.fingerprint != req.fingerprint && !self.config.flaws.on(Flaw::NoFingerprintCheck);
        let progressed = rec.recovery_point != RecoveryPoint::STARTED;
        let lease_live = rec.lease_expires_at.is_some_and(|t| now < t);
        match rec.state {
            KeyState::Complete if now < rec.replay_until => {
                if fingerprint_differs {
                    return Err(Error::KeyMismatch);
                }
                let stored = rec.response.ok_or_else(|| {
                    Error::Internal("complete key without a stored response".into())
                })?;
                tracing::debug!(caller = %req.caller, key = %req.key, status = stored.status, "replay");
                Ok(Step::Replay(
                    self.replay(&stored, req.wait.filter(|_| waited)),
                ))
            }
            // A multi-step request between phases whose lease is over: a
            // retry takes it over and resumes (clause idem.lease.takeover),
            // past its replay window too until its retention ends (clause
            // idem.window.progress).
            KeyState::InFlight if multi && progressed && !lease_live && now < rec.expires_at => {
                if fingerprint_differs {
                    return Err(Error::KeyMismatch);
                }
                Ok(Step::Resumable)
            }
            // Someone else's while its lease lasts; and a request with
            // committed progress is never replaced by a new one, whatever
            // its window (clause idem.window.progress).
            KeyState::InFlight if lease_live || progressed => {
                if fingerprint_differs {
                    return Err(Error::KeyMismatch);
                }
                Ok(Step::InFlight(self.registry.entry(&req.caller, &req.key)))
            }
            // Complete and past its window, or abandoned before doing
            // anything durable: the claim statement may take it over.
            _ => Ok(Step::Claimable),
        }
    }

    /// Answers 409 when the client did not ask to wait or its wait is over;
    /// otherwise waits for a wake-up (the holder is in this process) or one
    /// poll interval (it is in another process) and returns to try again.
    async fn wait_or_conflict(
        &self,
        req: &Pending,
        deadline: Instant,
        entry: Option<&Entry>,
    ) -> Result<()> {
        let now = Instant::now();
        if req.wait.is_none() || now >= deadline {
            tracing::debug!(caller = %req.caller, key = %req.key, "in flight: 409");
            return Err(self.in_use());
        }
        let remaining = deadline - now;
        self.waiting.fetch_add(1, Ordering::SeqCst);
        // Decremented on every exit, including a dropped request.
        let _gauge = Gauge(&self.waiting);
        match entry {
            Some(entry) => {
                // Register interest *before* checking `done`, so a holder that
                // finishes in between cannot slip its wake-up past us.
                let notified = entry.notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if !entry.done.load(Ordering::Acquire) {
                    let _ = tokio::time::timeout(remaining, notified).await;
                }
            }
            None => {
                tokio::time::sleep(self.config.wait_poll_interval.min(remaining)).await;
            }
        }
        Ok(())
    }

    /// Runs the endpoint inside the claim's transaction and settles the key.
    ///
    /// This is where "a first execution costs one transaction" holds: the
    /// transaction opened by the claim carries the endpoint's writes and the
    /// stored response, and commits once.
    async fn execute<S>(
        &self,
        req: &Pending,
        claimed: Claimed<K::Tx>,
        mut parts: axum::http::request::Parts,
        inner: S,
        replay_headers: &[HeaderName],
        guard: RegistryGuard,
    ) -> Result<Response<Body>>
    where
        S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send,
        S::Future: Send,
    {
        tracing::debug!(caller = %req.caller, key = %req.key, generation = claimed.generation, "claimed; executing");
        let slot = IdemTx::new(claimed.tx);
        parts.extensions.insert(slot.clone());
        self.failpoints
            .hit(&req.failpoints, Position::After, STARTED)
            .await;
        // A single-phase request may not hold its key longer than its lease:
        // past it, the endpoint's future is dropped, its writes are rolled
        // back with the claim and the client gets a retryable 500. (On SQLite
        // this also bounds how long one request can hold the writer.)
        let response = if Failpoints::injects_error(&req.failpoints) {
            // The injected server error stands in for the endpoint and goes
            // through the same failure policy as a real one.
            Ok(injected_error())
        } else {
            tokio::time::timeout(
                self.config.lease,
                call(
                    inner,
                    Request::from_parts(parts, Body::from(req.body.clone())),
                ),
            )
            .await
        };
        let tx = slot.take().await;
        let response = match response {
            Ok(r) => r,
            Err(_) => {
                if let Some(tx) = tx {
                    self.store.abandon(tx).await?;
                }
                return Err(Error::Internal(format!(
                    "the endpoint did not finish within its lease of {} s",
                    self.config.lease.as_secs()
                )));
            }
        };
        let (resp_parts, resp_body) = response.into_parts();
        let Some(tx) = tx else {
            return Err(Error::Internal(
                "the endpoint kept or consumed the idempotency transaction".into(),
            ));
        };
        let body = match axum::body::to_bytes(resp_body, self.config.max_response_bytes).await {
            Ok(b) => b,
            Err(e) => {
                self.store.abandon(tx).await?;
                return Err(Error::Internal(format!(
                    "endpoint response unreadable: {e}"
                )));
            }
        };
        let status = resp_parts.status.as_u16();
        // FLAW(store-5xx): every outcome is stored, server errors included.
        let stores =
            FailurePolicy::default().stores(status) || self.config.flaws.on(Flaw::Store5xx);
        if stores {
            let stored = stored_response(status, &resp_parts.headers, replay_headers, &body);
            self.store
                .complete(
                    tx,
                    &req.caller,
                    &req.key,
                    claimed.generation,
                    &stored,
                    self.clock.now_ms(),
                )
                .await?;
            self.failpoints
                .hit(&req.failpoints, Position::After, RecoveryPoint::FINISHED)
                .await;
        } else {
            // A 5xx is never stored: roll back the endpoint's writes and the
            // claim together, so the key is absent again and a retry with the
            // same key executes afresh (clause idem.failure.5xx-not-stored).
            self.store.abandon(tx).await?;
            tracing::info!(caller = %req.caller, key = %req.key, status, "server error: rolled back, key released");
        }
        drop(guard);
        Ok(Response::from_parts(resp_parts, Body::from(body)))
    }

    /// FLAW support: execute with no claim at all; store at the end only when
    /// `store_at_end` (check-then-insert), not at all otherwise (no
    /// in-flight state).
    #[cfg(feature = "flaws")]
    async fn execute_unclaimed<S>(
        &self,
        req: &Pending,
        mut parts: axum::http::request::Parts,
        inner: S,
        replay_headers: &[HeaderName],
        store_at_end: bool,
    ) -> Result<Response<Body>>
    where
        S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send,
        S::Future: Send,
    {
        let tx = self.store.begin_unclaimed().await?;
        let slot = IdemTx::new(tx);
        parts.extensions.insert(slot.clone());
        let response = call(
            inner,
            Request::from_parts(parts, Body::from(req.body.clone())),
        )
        .await;
        let tx = slot
            .take()
            .await
            .ok_or_else(|| Error::Internal("transaction taken".into()))?;
        let (resp_parts, resp_body) = response.into_parts();
        let body = axum::body::to_bytes(resp_body, self.config.max_response_bytes)
            .await
            .map_err(|e| Error::Internal(format!("endpoint response unreadable: {e}")))?;
        let status = resp_parts.status.as_u16();
        if store_at_end && FailurePolicy::default().stores(status) {
            let now = self.clock.now_ms();
            let claim = req.claim_request(now, &self.config);
            let stored = stored_response(status, &resp_parts.headers, replay_headers, &body);
            self.store.overwrite_complete(tx, &claim, &stored).await?;
        } else if (200..500).contains(&status) {
            self.store.commit_unclaimed(tx).await?;
        } else {
            self.store.abandon(tx).await?;
        }
        Ok(Response::from_parts(resp_parts, Body::from(body)))
    }

    /// Builds the replay of a stored response: status, the stored headers
    /// and body byte for byte, plus `Idempotent-Replayed: true`.
    fn replay(&self, stored: &StoredResponse, waited: Option<Duration>) -> Response<Body> {
        let drop_headers = self.config.flaws.on(Flaw::ReplayDropsHeaders);
        let mut response = Response::new(Body::from(stored.body.clone()));
        *response.status_mut() = axum::http::StatusCode::from_u16(stored.status)
            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        for h in &stored.headers {
            // FLAW(replay-drops-headers): only Content-Type survives.
            if drop_headers && h.name != "content-type" {
                continue;
            }
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(h.name.as_bytes()),
                HeaderValue::from_bytes(&h.value_bytes()),
            ) {
                headers.append(name, value);
            }
        }
        if !drop_headers {
            headers.insert(
                HeaderName::from_static("idempotent-replayed"),
                HeaderValue::from_static("true"),
            );
        }
        if let Some(w) = waited
            && let Ok(v) = HeaderValue::from_str(&format!("wait={}", w.as_secs()))
        {
            headers.insert(HeaderName::from_static("preference-applied"), v);
        }
        response
    }
}

/// The 500 an `error-after=started` failpoint answers instead of the endpoint.
pub(crate) fn injected_error() -> Response<Body> {
    axum::response::IntoResponse::into_response(Error::Internal(
        "server error injected by Idem-Failpoint: error-after=started".into(),
    ))
}

async fn call<S>(mut inner: S, req: Request<Body>) -> Response<Body>
where
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send,
    S::Future: Send,
{
    use tower::ServiceExt;
    match inner.ready().await {
        Ok(svc) => match svc.call(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        },
        Err(never) => match never {},
    }
}

/// Picks the headers a replay reproduces: Content-Type, Location, ETag and
/// the endpoint's declared ones (clause idem.replay.verbatim).
pub(crate) fn stored_response(
    status: u16,
    headers: &HeaderMap,
    declared: &[HeaderName],
    body: &[u8],
) -> StoredResponse {
    let mut kept = Vec::new();
    let always = [header::CONTENT_TYPE, header::LOCATION, header::ETAG];
    for name in always.iter().chain(declared) {
        for value in headers.get_all(name) {
            kept.push(StoredHeader::new(name.as_str(), value.as_bytes()));
        }
    }
    StoredResponse {
        status,
        headers: kept,
        body: body.to_vec(),
    }
}

/// Buffers the request body (it is fingerprinted and stored), refusing
/// anything over `limit` with 413 before reading it all when the client
/// declared its length.
async fn read_body(body: Body, headers: &HeaderMap, limit: usize) -> Result<axum::body::Bytes> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(Error::PayloadTooLarge { limit });
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        if e.to_string().contains("length limit") {
            Error::PayloadTooLarge { limit }
        } else {
            Error::MalformedBody(format!("the request body could not be read: {e}"))
        }
    })
}

enum TryClaim<Tx> {
    Executed(RegistryGuard, Claimed<Tx>),
    InFlight(Option<Arc<Entry>>),
    Taken,
}

/// What the engine knows about a request before deciding.
pub(crate) struct Pending {
    pub(crate) caller: String,
    pub(crate) key: String,
    pub(crate) fingerprint: String,
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) content_type: Option<String>,
    pub(crate) body: axum::body::Bytes,
    pub(crate) wait: Option<Duration>,
    pub(crate) failpoints: Vec<Failpoint>,
}

/// How a claimed request is executed.
enum Mode<'a, S, K: KeyStore> {
    /// One transaction with the claim (the `IdempotencyLayer`).
    Single {
        inner: S,
        replay_headers: &'a [HeaderName],
    },
    /// Phases with recovery points.
    Multi(&'a dyn Driver<K>),
}

impl Pending {
    fn claim_request(&self, now: Millis, config: &EngineConfig) -> ClaimRequest<'_> {
        ClaimRequest {
            caller: &self.caller,
            key: &self.key,
            fingerprint: &self.fingerprint,
            method: &self.method,
            path: &self.path,
            content_type: self.content_type.as_deref(),
            body: &self.body,
            now,
            lease_expires_at: now.saturating_add(ms(config.lease)),
            replay_until: now.saturating_add(config.replay_window_ms()),
            expires_at: now.saturating_add(ms(config.retention)),
        }
    }
}

enum Step {
    Replay(Response<Body>),
    Claimable,
    InFlight(Option<Arc<Entry>>),
    /// In flight with an expired lease (multi-step routes only).
    Resumable,
}

/// Keys being executed by *this* process: the in-flight state before the
/// claim commits, and the wake-up source for `Prefer: wait`.
///
/// Why a `std::sync::Mutex`: it is held for a hash-map operation only,
/// never across an `.await`, so an async mutex would only add overhead.
#[derive(Debug, Default)]
struct Registry {
    entries: Mutex<HashMap<(String, String), Arc<Entry>>>,
}

#[derive(Debug)]
struct Entry {
    fingerprint: String,
    notify: Notify,
    done: AtomicBool,
}

impl Registry {
    fn try_acquire(
        self: &Arc<Self>,
        caller: &str,
        key: &str,
        fingerprint: &str,
    ) -> std::result::Result<RegistryGuard, Arc<Entry>> {
        let mut map = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let k = (caller.to_owned(), key.to_owned());
        if let Some(existing) = map.get(&k) {
            return Err(existing.clone());
        }
        let entry = Arc::new(Entry {
            fingerprint: fingerprint.to_owned(),
            notify: Notify::new(),
            done: AtomicBool::new(false),
        });
        map.insert(k.clone(), entry.clone());
        Ok(RegistryGuard {
            registry: self.clone(),
            key: k,
            entry,
        })
    }

    /// Takes the local slot even if held: for takeovers of expired leases,
    /// which the store arbitrates.
    fn force_acquire(
        self: &Arc<Self>,
        caller: &str,
        key: &str,
        fingerprint: &str,
    ) -> RegistryGuard {
        let mut map = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let k = (caller.to_owned(), key.to_owned());
        let entry = Arc::new(Entry {
            fingerprint: fingerprint.to_owned(),
            notify: Notify::new(),
            done: AtomicBool::new(false),
        });
        map.insert(k.clone(), entry.clone());
        RegistryGuard {
            registry: self.clone(),
            key: k,
            entry,
        }
    }

    fn entry(&self, caller: &str, key: &str) -> Option<Arc<Entry>> {
        let map = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(&(caller.to_owned(), key.to_owned())).cloned()
    }
}

/// Releases a locally held key when the request settles, *or* when its
/// future is dropped (client gone, panic): waiters are always woken.
pub(crate) struct RegistryGuard {
    registry: Arc<Registry>,
    key: (String, String),
    entry: Arc<Entry>,
}

impl Drop for RegistryGuard {
    fn drop(&mut self) {
        let mut map = self
            .registry
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Only our own entry: a takeover may have replaced it.
        if map
            .get(&self.key)
            .is_some_and(|e| Arc::ptr_eq(e, &self.entry))
        {
            map.remove(&self.key);
        }
        drop(map);
        self.entry.done.store(true, Ordering::Release);
        self.entry.notify.notify_waiters();
    }
}

struct Gauge<'a>(&'a AtomicUsize);

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// No inner service: the type parameter of multi-step requests, which run
/// a [`Driver`] instead.
#[derive(Debug, Clone, Copy)]
struct NoService;

impl tower::Service<Request<Body>> for NoService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<std::result::Result<Response<Body>, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::result::Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        std::future::ready(Ok(Response::new(Body::empty())))
    }
}

impl Engine<Store> {
    /// Serves one request on a multi-step route: replays, rejects, waits,
    /// or claims (or takes over) the key and runs the driver's phases.
    pub(crate) async fn handle_multistep(
        &self,
        req: Request<Body>,
        driver: &dyn Driver<Store>,
    ) -> Response<Body> {
        match self
            .handle_inner::<NoService>(req, Mode::Multi(driver))
            .await
        {
            Ok(r) => r,
            Err(e) => axum::response::IntoResponse::into_response(e),
        }
    }

    /// The completer's entry: take over an abandoned key and finish it from
    /// its stored request. `Ok(None)` when another worker holds it.
    pub(crate) async fn resume_abandoned(
        &self,
        key: &AbandonedKey,
        driver: &dyn Driver<Store>,
    ) -> Result<Option<Response<Body>>> {
        let req = Pending {
            caller: key.caller.clone(),
            key: key.key.clone(),
            fingerprint: key.fingerprint.clone(),
            method: key.method.clone(),
            path: key.path.clone(),
            content_type: key.content_type.clone(),
            body: axum::body::Bytes::from(key.body.clone()),
            wait: None,
            failpoints: Vec::new(),
        };
        let guard = self
            .registry
            .force_acquire(&req.caller, &req.key, &req.fingerprint);
        driver.run(self, &req, Start::Resume, guard).await
    }
}
