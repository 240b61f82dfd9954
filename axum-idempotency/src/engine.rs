//! The engine: what happens to one request with a key.
//!
//! [`Engine::handle`] turns the request into what the decision needs (caller,
//! key, fingerprint, `Prefer: wait`), then runs a short loop:
//!
//! ```text
//!   observe: the store's observation + this process's in-flight registry
//!      │     (single-phase on PostgreSQL: BEGIN + one statement that reads
//!      │      the record and takes the key's advisory try-lock)
//!      ▼
//!   decide (crate::decide, pure) ──► replay │ reject │ wait │ claim │ resume
//!      ▲                                               │       │       │
//!      └── wait over / claim lost a race ◄─────────────┘       │       │
//!                                                              ▼       ▼
//!   single-phase: the transaction holding the key's      take over the lease
//!   lock (no row yet) ─► endpoint runs inside it          └─► run the rest of
//!      2xx/4xx: INSERT the complete record ON CONFLICT          the phases
//!               DO UPDATE WHERE replaceable, COMMIT all
//!               (no row back: lost the race, roll back all)
//!      5xx:     roll back all; key absent again
//!   multi-step: INSERT ... ON CONFLICT (claim), phases (crate::multistep)
//! ```
//!
//! The loop ends: every turn returns, waits (bounded by the client's
//! `Prefer: wait` and the server maximum; once that is over the decision is
//! 409), or lost a claim race to a request that committed meanwhile (at most
//! [`MAX_RACES`] times; the next read then sees its record). A single-phase
//! request whose final write lost has run its endpoint (rolled back) and
//! never runs it again: it answers from the winner's record, or 409.
//!
//! Why a single-phase request claims at the end, and the race that makes
//! safe, is argued in [`crate::store`] ("The single-phase protocol").
//!
//! The local registry is an optimisation and the source of wake-ups, never
//! the arbiter: two processes on one database are arbitrated by the store.
//! On SQLite it is also what answers an in-process duplicate at once (the
//! store has a single writer, so the duplicate's claim would otherwise queue
//! behind the original's transaction).

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, Response, header};
use idem_spec::headers::{IDEMPOTENCY_KEY, PREFER, prefer_wait_secs};
use idem_spec::policy::{self, FailurePolicy};
use idem_spec::{Fingerprint, IdempotencyKey, Policy, Profile, RecoveryPoint};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::clock::{Clock, Millis};
use crate::decide::{Ask, Decision, Held, Reject, Seen, decide};
use crate::error::{Error, Result};
use crate::failpoint::{FAILPOINT_HEADER, Failpoint, Failpoints, Position};
use crate::key::{Caller, Fence, KeyId};
use crate::layer::{Finished, IdemTx};
use crate::multistep::{Driver, Pulse, Start};
use crate::store::{
    AbandonedKey, ClaimOutcome, ClaimRequest, FencedWrite, KeyRecord, KeyStore, SingleTx,
    StoredHeader, StoredRequest, StoredResponse,
};

/// Most claim races one request may lose before it answers 409.
pub const MAX_RACES: u32 = 20;

/// Decides what counts as "the same request" under one key (clause
/// `idem.fingerprint.inputs`).
///
/// The default, [`ContractFingerprint`], is the contract's: SHA-256 over
/// method, path with query and the canonical (RFC 8785) JSON body. Replace it
/// only to *narrow* what a request is, e.g. to leave out a field your clients
/// fill with the time of each attempt.
pub trait FingerprintPolicy: Send + Sync + fmt::Debug + 'static {
    /// The fingerprint of one request.
    fn fingerprint(
        &self,
        method: &str,
        path_and_query: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Fingerprint;
}

/// The contract's fingerprint ([`Fingerprint::compute`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct ContractFingerprint;

impl FingerprintPolicy for ContractFingerprint {
    fn fingerprint(
        &self,
        method: &str,
        path_and_query: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Fingerprint {
        Fingerprint::compute(method, path_and_query, content_type, body)
    }
}

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
    /// The status and error codes the engine's own answers use.
    pub profile: Profile,
    /// Which outcomes are final (stored and replayed). Only the default,
    /// [`FailurePolicy::FinalUnlessServerError`], keeps the contract.
    pub failure_policy: FailurePolicy,
    /// What counts as the same request.
    pub fingerprint: Arc<dyn FingerprintPolicy>,
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
            profile: Profile::Reference,
            failure_policy: FailurePolicy::FinalUnlessServerError,
            fingerprint: Arc::new(ContractFingerprint),
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
            failure_policy: self.failure_policy,
        }
    }
}

pub(crate) fn ms(d: Duration) -> Millis {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The engine, shared by every [`IdempotencyLayer`](crate::IdempotencyLayer)
/// and [`MultiStepEndpoint`](crate::multistep::MultiStepEndpoint) built
/// from it. Cheap to clone.
#[derive(Clone)]
pub struct Engine<K: KeyStore> {
    store: K,
    clock: Arc<dyn Clock>,
    config: Arc<EngineConfig>,
    registry: Arc<Registry>,
    waiting: Arc<AtomicUsize>,
    failpoints: Option<Arc<Failpoints>>,
}

impl<K: KeyStore> fmt::Debug for Engine<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("config", &self.config)
            .field("failpoints", &self.failpoints.is_some())
            .finish_non_exhaustive()
    }
}

/// What the engine knows about a request once it has read it.
#[derive(Debug)]
pub(crate) struct Incoming {
    pub(crate) id: KeyId,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) request: StoredRequest,
    pub(crate) wait: Option<Duration>,
    pub(crate) armed: Vec<Failpoint>,
    /// What the lease heartbeat of this request needs to know.
    pub(crate) pulse: Arc<Pulse>,
}

/// How a claimed request is executed. Built once per request and never
/// moved around, so the size difference between the variants costs nothing.
#[allow(clippy::large_enum_variant)]
enum Route<'a, S, K: KeyStore> {
    /// One transaction with the claim (the `IdempotencyLayer`).
    Single {
        inner: S,
        parts: Parts,
        replay_headers: &'a [HeaderName],
    },
    /// Phases with recovery points.
    Multi(&'a dyn Driver<K>),
}

impl<K: KeyStore> Engine<K> {
    /// An engine over `store`, reading time from `clock`. Failpoints are off.
    pub fn new(store: K, clock: Arc<dyn Clock>, config: EngineConfig) -> Self {
        Self {
            store,
            clock,
            config: Arc::new(config),
            registry: Arc::new(Registry::default()),
            waiting: Arc::new(AtomicUsize::new(0)),
            failpoints: None,
        }
    }

    /// Opts in to the `Idem-Failpoint` request header (crash, pause or fail
    /// a request at a named point; see [`crate::failpoint`]). For test
    /// builds only: without this call the header is never even read.
    pub fn with_failpoints(mut self, failpoints: Arc<Failpoints>) -> Self {
        self.failpoints = Some(failpoints);
        self
    }

    /// The failpoint registry, when failpoints are on.
    pub fn failpoints(&self) -> Option<&Arc<Failpoints>> {
        self.failpoints.as_ref()
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

    /// Whether an outcome with `status` is final: stored and replayed. The
    /// one place this is asked (clauses `idem.failure.final-outcomes`,
    /// `idem.failure.5xx-not-stored`).
    pub fn is_final(&self, status: u16) -> bool {
        self.config.failure_policy.stores(status)
    }

    pub(crate) fn lease_ends(&self, now: Millis) -> Millis {
        now.saturating_add(ms(self.config.lease))
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
        let (parts, body) = req.into_parts();
        let result = match self.read_request(&parts, body).await {
            Ok(incoming) => {
                let route = Route::Single {
                    inner,
                    parts,
                    replay_headers,
                };
                self.serve(incoming, route).await
            }
            Err(e) => Err(e),
        };
        result.unwrap_or_else(|e| e.into_response_in(self.config.profile))
    }

    /// Serves one request on a multi-step route.
    pub(crate) async fn handle_multistep(
        &self,
        req: Request<Body>,
        driver: &dyn Driver<K>,
    ) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let result = match self.read_request(&parts, body).await {
            Ok(incoming) => {
                self.serve::<NoService>(incoming, Route::Multi(driver))
                    .await
            }
            Err(e) => Err(e),
        };
        result.unwrap_or_else(|e| e.into_response_in(self.config.profile))
    }

    /// The completer's entry: take over an abandoned key and finish it from
    /// its stored request. `Ok(None)` when another worker holds it.
    pub(crate) async fn resume_abandoned(
        &self,
        key: &AbandonedKey,
        driver: &dyn Driver<K>,
    ) -> Result<Option<Response<Body>>> {
        let incoming = Incoming {
            id: key.id.clone(),
            fingerprint: key.fingerprint,
            request: key.request.clone(),
            wait: None,
            armed: Vec::new(),
            pulse: Arc::default(),
        };
        let guard = self.registry.force_acquire(&incoming);
        driver.run(self, &incoming, Start::Resume, guard).await
    }

    /// Everything up to the claim rejects without touching the store, so the
    /// key is not consumed (clause `idem.failure.unclaimed`).
    async fn read_request(&self, parts: &Parts, body: Body) -> Result<Incoming> {
        let caller = parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or(Error::Unauthenticated)?;
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
            self.config
                .fingerprint
                .fingerprint(&method, &path, content_type.as_deref(), &body);
        let wait = prefer_wait_secs(
            parts
                .headers
                .get_all(PREFER)
                .iter()
                .filter_map(|v| v.to_str().ok()),
        )
        .map(|n| Duration::from_secs(n).min(self.config.max_wait));
        // Without the opt-in the header is not even read.
        let mut armed = Vec::new();
        if self.failpoints.is_some() {
            for v in parts.headers.get_all(FAILPOINT_HEADER) {
                let v = v
                    .to_str()
                    .map_err(|_| Error::Failpoint("Idem-Failpoint must be ASCII".into()))?;
                armed.extend(crate::failpoint::parse(v)?);
            }
        }
        Ok(Incoming {
            id: KeyId::new(caller, key),
            fingerprint,
            request: StoredRequest {
                method,
                path,
                content_type,
                body,
            },
            wait,
            armed,
            pulse: Arc::default(),
        })
    }

    /// The loop: observe, decide, act (see the module docs).
    async fn serve<S>(&self, incoming: Incoming, route: Route<'_, S, K>) -> Result<Response<Body>>
    where
        S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send,
        S::Future: Send,
    {
        let deadline = Instant::now() + incoming.wait.unwrap_or_default();
        let (mut single, driver) = match route {
            Route::Single {
                inner,
                parts,
                replay_headers,
            } => (Some((inner, parts, replay_headers)), None),
            Route::Multi(driver) => (None, Some(driver)),
        };
        let resumable = driver.is_some();
        let (mut races, mut waited, mut busy) = (0u32, false, false);
        loop {
            let now = self.clock.now_ms();
            // A single-phase request observes its key through the store's
            // single-phase protocol (PostgreSQL: inside the transaction it
            // would run in, with the key's lock); a multi-step one reads it.
            let (stored, mut open) = if driver.is_none() {
                let observed = self.store.observe(&incoming.id, now).await?;
                busy |= observed.busy;
                (observed.record, observed.tx)
            } else {
                (self.store.lookup(&incoming.id).await?, None)
            };
            let local = self.registry.entry(&incoming.id);
            let held = match (&local, std::mem::take(&mut busy)) {
                (Some(entry), _) => Held::Here(&entry.fingerprint),
                (None, true) => Held::Elsewhere,
                (None, false) => Held::No,
            };
            let ask = Ask {
                fingerprint: &incoming.fingerprint,
                may_wait: incoming.wait.is_some() && Instant::now() < deadline,
                resumable,
            };
            let seen = Seen {
                stored: stored.as_ref(),
                held,
            };
            let decision = decide(&seen, &ask, now);
            if decision != Decision::Claim
                && let Some(tx) = open.take()
            {
                // Observed, not executing: nothing was written in it.
                self.store.rollback(tx).await?;
            }
            match decision {
                Decision::Replay(stored) => {
                    tracing::debug!(key = %incoming.id, status = stored.status, "replay");
                    return Ok(self.replay(stored, incoming.wait.filter(|_| waited)));
                }
                Decision::Reject(Reject::Mismatch) => return Err(Error::KeyMismatch),
                Decision::Reject(Reject::InUse) => {
                    tracing::debug!(key = %incoming.id, "in flight: 409");
                    return Err(self.in_use_of(stored.as_ref(), local.is_some(), now));
                }
                Decision::Wait => {
                    self.wait(deadline, local.as_deref()).await;
                    waited = true;
                }
                Decision::Claim => {
                    // Local registry first (cheap, and the source of
                    // wake-ups), then the store (the arbiter).
                    let Ok(guard) = self.registry.try_acquire(&incoming) else {
                        if let Some(tx) = open.take() {
                            self.store.rollback(tx).await?;
                        }
                        races += 1;
                        continue;
                    };
                    let claim = ClaimRequest {
                        id: &incoming.id,
                        fingerprint: &incoming.fingerprint,
                        request: &incoming.request,
                        now,
                        lease_expires_at: self.lease_ends(now),
                        replay_until: now.saturating_add(ms(self.config.replay_window)),
                        expires_at: now.saturating_add(ms(self.config.retention)),
                    };
                    match driver {
                        None => {
                            let tx = match open.take() {
                                Some(tx) => SingleTx::Open(tx),
                                None => self.store.begin_single(&incoming.id).await?,
                            };
                            if matches!(tx, SingleTx::Busy) {
                                busy = true;
                                continue;
                            }
                            let Some((inner, parts, replay_headers)) = single.take() else {
                                // It ran once and lost its final write, and
                                // the winner's record is already replaceable
                                // again (reaped, or its window over): a
                                // request never executes twice, so answer a
                                // retryable 409.
                                if let SingleTx::Open(tx) = tx {
                                    self.store.rollback(tx).await?;
                                }
                                return Err(self.in_use());
                            };
                            let outcome = self
                                .execute_single(&incoming, tx, &claim, parts, inner, replay_headers)
                                .await?;
                            drop(guard);
                            match outcome {
                                Some(response) => return Ok(response),
                                // Lost the final write: answer from the
                                // winner's committed record.
                                None => races += 1,
                            }
                        }
                        Some(driver) => match self.store.claim(&claim).await? {
                            ClaimOutcome::Claimed(claimed) => {
                                return driver
                                    .run(self, &incoming, Start::Fresh(claimed, now), guard)
                                    .await?
                                    .ok_or_else(|| {
                                        Error::Internal("a fresh claim cannot lose".into())
                                    });
                            }
                            ClaimOutcome::Busy => busy = true,
                            ClaimOutcome::Taken => races += 1,
                        },
                    }
                }
                Decision::Resume => {
                    let Some(driver) = driver else {
                        return Err(Error::Internal("resume on a single-phase route".into()));
                    };
                    // The lease is over, so the store arbitrates: take the
                    // local slot even if a (paused, stale) local holder has
                    // it; fencing refuses that holder's later commits.
                    let guard = self.registry.force_acquire(&incoming);
                    match driver.run(self, &incoming, Start::Resume, guard).await? {
                        Some(response) => return Ok(response),
                        None => races += 1,
                    }
                }
            }
            if races > MAX_RACES {
                return Err(self.in_use());
            }
        }
    }

    fn in_use(&self) -> Error {
        Error::KeyInUse {
            retry_after_secs: self.config.retry_after_secs,
        }
    }

    /// The 409 for a key in flight, with a `Retry-After` that tells the
    /// client when a retry can make progress. Held by this process: the
    /// holder is alive, so the configured short hint. Held elsewhere (another
    /// process, or one that crashed): the time left on its committed lease,
    /// at least the configured hint and at most one lease, because that is
    /// the earliest a retry can take the key over if its holder is gone; a
    /// client with the default retry settings (three attempts) would spend
    /// them all inside the lease otherwise (clause `idem.lease.heartbeat`).
    fn in_use_of(&self, stored: Option<&KeyRecord>, held_here: bool, now: Millis) -> Error {
        let floor = self.config.retry_after_secs;
        let lease_left = stored
            .filter(|_| !held_here)
            .and_then(|r| r.lease_expires_at)
            .map(|end| end.saturating_sub(now))
            .filter(|left| *left > 0);
        let Some(left) = lease_left else {
            return self.in_use();
        };
        let secs = u64::try_from(left.saturating_add(999) / 1000).unwrap_or(u64::MAX);
        Error::KeyInUse {
            retry_after_secs: secs.clamp(floor, self.config.lease.as_secs().max(floor)),
        }
    }

    /// Waits for a wake-up (the holder is in this process) or one poll
    /// interval (it is in another process), never past `deadline`.
    async fn wait(&self, deadline: Instant, entry: Option<&Entry>) {
        let remaining = deadline.saturating_duration_since(Instant::now());
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
    }

    /// Runs a single-phase endpoint inside `tx`, which holds its key's
    /// claim (lock) but no record of it, and settles: a final outcome is
    /// claimed and recorded in one statement and committed with the
    /// endpoint's writes; anything else rolls back with nothing stored.
    ///
    /// This is where "a first execution costs one transaction and one key
    /// write" holds. `Ok(None)`: the final write lost to a record committed
    /// meanwhile; everything was rolled back, and the caller answers from
    /// that record.
    async fn execute_single<S>(
        &self,
        incoming: &Incoming,
        tx: SingleTx<K::Tx>,
        claim: &ClaimRequest<'_>,
        mut parts: Parts,
        inner: S,
        replay_headers: &[HeaderName],
    ) -> Result<Option<Response<Body>>>
    where
        S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send,
        S::Future: Send,
    {
        tracing::debug!(key = %incoming.id, "claimed; executing");
        let slot = match tx {
            SingleTx::Open(tx) => IdemTx::<K>::new(tx),
            SingleTx::Deferred => IdemTx::<K>::deferred(self.store.clone()),
            SingleTx::Busy => return Err(Error::Internal("executing a busy key".into())),
        };
        parts.extensions.insert(slot.clone());
        self.hit(incoming, Position::After, RecoveryPoint::STARTED)
            .await;
        // A single-phase request may not hold its key longer than its lease:
        // past it, the endpoint's future is dropped, its writes are rolled
        // back and the client gets a retryable 500. (On SQLite this also
        // bounds how long one request can hold the writer.)
        let response = if Failpoints::injects_error(&incoming.armed) {
            // The injected server error stands in for the endpoint and goes
            // through the same failure policy as a real one.
            Ok(injected_error(self.config.profile))
        } else {
            let request = Request::from_parts(parts, Body::from(incoming.request.body.clone()));
            tokio::time::timeout(self.config.lease, call(inner, request)).await
        };
        let finished = slot.finish().await;
        let (response, tx) = match (response, finished) {
            (Ok(r), Finished::Open(tx)) => (r, Some(tx)),
            (Ok(r), Finished::Unopened) => (r, None),
            (Err(_), finished) => {
                if let Finished::Open(tx) = finished {
                    self.store.rollback(tx).await?;
                }
                return Err(Error::Internal(format!(
                    "the endpoint did not finish within its lease of {} s",
                    self.config.lease.as_secs()
                )));
            }
            (Ok(_), Finished::Gone) => {
                return Err(Error::Internal(
                    "the endpoint kept or consumed the idempotency transaction".into(),
                ));
            }
        };
        let (parts, body) = response.into_parts();
        let body = match axum::body::to_bytes(body, self.config.max_response_bytes).await {
            Ok(b) => b,
            Err(e) => {
                if let Some(tx) = tx {
                    self.store.rollback(tx).await?;
                }
                return Err(Error::Internal(format!(
                    "endpoint response unreadable: {e}"
                )));
            }
        };
        let status = parts.status.as_u16();
        if !self.is_final(status) {
            // Never stored (clause idem.failure.5xx-not-stored): the key is
            // absent again.
            if let Some(tx) = tx {
                self.store.rollback(tx).await?;
            }
            tracing::info!(key = %incoming.id, status, "server error: not stored; key released");
            return Ok(Some(Response::from_parts(parts, Body::from(body))));
        }
        let stored = stored_response(status, &parts.headers, replay_headers, &body);
        // An endpoint that wrote nothing still records its outcome, in a
        // transaction of its own (on SQLite: the writer, for one statement).
        let mut tx = match tx {
            Some(tx) => tx,
            None => self.store.begin().await?,
        };
        let now = self.clock.now_ms();
        match self.store.record_final(&mut tx, claim, &stored, now).await {
            Ok(Some(generation)) => {
                tracing::debug!(key = %incoming.id, generation, status, "final outcome stored");
            }
            Ok(None) => {
                self.store.rollback(tx).await?;
                tracing::info!(
                    key = %incoming.id,
                    "lost the final write to a record committed meanwhile; rolled back"
                );
                return Ok(None);
            }
            Err(e) => {
                self.store.rollback(tx).await?;
                return Err(e);
            }
        }
        self.hit(incoming, Position::Before, RecoveryPoint::FINISHED)
            .await;
        self.store.commit(tx).await?;
        self.hit(incoming, Position::After, RecoveryPoint::FINISHED)
            .await;
        Ok(Some(Response::from_parts(parts, Body::from(body))))
    }

    /// Ends a claimed request with `response`: a final outcome is stored
    /// with the transaction's writes (fenced) and committed; any other is
    /// not stored: the transaction rolls back, and when the request had
    /// committed progress its lease ends so a retry resumes at once.
    /// `fresh` is whether nothing of the request is committed yet (then the
    /// rollback takes the claim with it and the key is absent again).
    pub(crate) async fn settle(
        &self,
        incoming: &Incoming,
        fence: &Fence,
        tx: Option<K::Tx>,
        fresh: bool,
        response: Response<Body>,
        replay_headers: &[HeaderName],
    ) -> Result<Response<Body>> {
        let (parts, body) = response.into_parts();
        let body = match axum::body::to_bytes(body, self.config.max_response_bytes).await {
            Ok(b) => b,
            Err(e) => {
                self.fail(fence, tx, fresh).await?;
                return Err(Error::Internal(format!(
                    "endpoint response unreadable: {e}"
                )));
            }
        };
        let status = parts.status.as_u16();
        if self.is_final(status) {
            let stored = stored_response(status, &parts.headers, replay_headers, &body);
            let tx = match tx {
                Some(tx) => tx,
                None => self.store.begin().await?,
            };
            self.commit_fenced(
                tx,
                fence,
                FencedWrite::Final(&stored),
                incoming,
                Some(RecoveryPoint::FINISHED),
            )
            .await?;
            tracing::debug!(%fence, status, "final outcome stored");
        } else {
            // Never stored (clause idem.failure.5xx-not-stored).
            self.fail(fence, tx, fresh).await?;
            tracing::info!(%fence, status, "server error: not stored; key released");
        }
        Ok(Response::from_parts(parts, Body::from(body)))
    }

    /// A transient failure: roll back what the transaction holds; if the
    /// request has committed progress, end its lease so a retry (or the
    /// completer) resumes at its last recovery point at once.
    pub(crate) async fn fail(&self, fence: &Fence, tx: Option<K::Tx>, fresh: bool) -> Result<()> {
        if let Some(tx) = tx {
            self.store.rollback(tx).await?;
        }
        if !fresh {
            self.store.release_lease(fence, self.clock.now_ms()).await?;
        }
        Ok(())
    }

    /// The one fenced commit: makes `write` in `tx` under `fence`, fires the
    /// failpoints armed before `name`, commits, fires those after it. A
    /// refused fence rolls `tx` back (the writes of a worker that lost its
    /// key disappear) and is [`Error::Fenced`].
    pub(crate) async fn commit_fenced(
        &self,
        mut tx: K::Tx,
        fence: &Fence,
        write: FencedWrite<'_>,
        req: &Incoming,
        name: Option<&str>,
    ) -> Result<()> {
        let now = self.clock.now_ms();
        if let Err(e) = self.store.write_fenced(&mut tx, fence, write, now).await {
            self.store.rollback(tx).await?;
            if matches!(e, Error::Fenced) {
                tracing::warn!(%fence, "commit fenced: the key was taken over; nothing written");
            }
            return Err(e);
        }
        if let Some(name) = name {
            self.hit(req, Position::Before, name).await;
        }
        self.store.commit(tx).await?;
        if let Some(name) = name {
            self.hit(req, Position::After, name).await;
        }
        Ok(())
    }

    /// Fires the failpoints `req` armed at (`position`, `name`). A `pause`
    /// stands for a stalled process (a long GC pause, a frozen VM), so the
    /// request's lease heartbeat stalls with it: that is what lets a test
    /// see a paused writer taken over and fenced.
    pub(crate) async fn hit(&self, req: &Incoming, position: Position, name: &str) {
        if let Some(fp) = &self.failpoints {
            let pauses = req.armed.iter().any(|f| {
                f.action == crate::failpoint::Action::Pause
                    && f.position == position
                    && f.name == name
            });
            if pauses {
                req.pulse.stall(true);
            }
            fp.hit(&req.armed, position, name).await;
            if pauses {
                req.pulse.stall(false);
            }
        }
    }

    /// Builds the replay of a stored response: status, the stored headers
    /// and body byte for byte, plus `Idempotent-Replayed: true`.
    fn replay(&self, stored: &StoredResponse, waited: Option<Duration>) -> Response<Body> {
        let mut response = Response::new(Body::from(stored.body.clone()));
        *response.status_mut() = axum::http::StatusCode::from_u16(stored.status)
            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        for h in &stored.headers {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(h.name.as_bytes()),
                HeaderValue::from_bytes(&h.value_bytes()),
            ) {
                headers.append(name, value);
            }
        }
        headers.insert(
            HeaderName::from_static("idempotent-replayed"),
            HeaderValue::from_static("true"),
        );
        if let Some(w) = waited
            && let Ok(v) = HeaderValue::from_str(&format!("wait={}", w.as_secs()))
        {
            headers.insert(HeaderName::from_static("preference-applied"), v);
        }
        response
    }
}

/// The 500 an `error-after=started` failpoint answers instead of the endpoint.
pub(crate) fn injected_error(profile: Profile) -> Response<Body> {
    Error::Internal("server error injected by Idem-Failpoint: error-after=started".into())
        .into_response_in(profile)
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
pub fn stored_response(
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
async fn read_body(body: Body, headers: &HeaderMap, limit: usize) -> Result<Bytes> {
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

/// Keys being executed by *this* process: the in-flight state before the
/// claim commits, and the wake-up source for `Prefer: wait`.
///
/// Why a `std::sync::Mutex`: it is held for a hash-map operation only,
/// never across an `.await`, so an async mutex would only add overhead.
#[derive(Debug, Default)]
struct Registry {
    entries: Mutex<HashMap<KeyId, Arc<Entry>>>,
}

#[derive(Debug)]
struct Entry {
    fingerprint: Fingerprint,
    notify: Notify,
    done: AtomicBool,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<KeyId, Arc<Entry>>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes the local slot unless another request of this process holds it.
    fn try_acquire(
        self: &Arc<Self>,
        incoming: &Incoming,
    ) -> std::result::Result<RegistryGuard, ()> {
        let mut map = self.lock();
        if map.contains_key(&incoming.id) {
            return Err(());
        }
        Ok(self.insert(&mut map, incoming))
    }

    /// Takes the local slot even if held: for takeovers of expired leases,
    /// which the store arbitrates.
    fn force_acquire(self: &Arc<Self>, incoming: &Incoming) -> RegistryGuard {
        let mut map = self.lock();
        self.insert(&mut map, incoming)
    }

    fn insert(
        self: &Arc<Self>,
        map: &mut HashMap<KeyId, Arc<Entry>>,
        incoming: &Incoming,
    ) -> RegistryGuard {
        let entry = Arc::new(Entry {
            fingerprint: incoming.fingerprint,
            notify: Notify::new(),
            done: AtomicBool::new(false),
        });
        map.insert(incoming.id.clone(), entry.clone());
        RegistryGuard {
            registry: self.clone(),
            id: incoming.id.clone(),
            entry,
        }
    }

    fn entry(&self, id: &KeyId) -> Option<Arc<Entry>> {
        self.lock().get(id).cloned()
    }
}

/// Releases a locally held key when the request settles, *or* when its
/// future is dropped (client gone, panic): waiters are always woken.
pub(crate) struct RegistryGuard {
    registry: Arc<Registry>,
    id: KeyId,
    entry: Arc<Entry>,
}

impl Drop for RegistryGuard {
    fn drop(&mut self) {
        let mut map = self.registry.lock();
        // Only our own entry: a takeover may have replaced it.
        if map
            .get(&self.id)
            .is_some_and(|e| Arc::ptr_eq(e, &self.entry))
        {
            map.remove(&self.id);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Caller;

    fn incoming(key: &str, fp: &str) -> Incoming {
        Incoming {
            id: KeyId::new(Caller::new("ann"), IdempotencyKey::parse(key).expect("key")),
            fingerprint: Fingerprint::compute("POST", fp, None, b""),
            request: StoredRequest {
                method: "POST".into(),
                path: "/".into(),
                content_type: None,
                body: Bytes::new(),
            },
            wait: None,
            armed: Vec::new(),
            pulse: Arc::default(),
        }
    }

    // clause: idem.replay.verbatim
    #[test]
    fn a_stored_response_keeps_the_replayed_headers_only_byte_for_byte() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::LOCATION, HeaderValue::from_static("/things/1"));
        headers.append("x-declared", HeaderValue::from_static("a"));
        headers.append("x-declared", HeaderValue::from_static("b"));
        headers.insert("x-other", HeaderValue::from_static("dropped"));
        headers.insert(
            header::ETAG,
            HeaderValue::from_bytes(b"\"caf\xe9\"").expect("bytes"),
        );
        let declared = [HeaderName::from_static("x-declared")];
        let stored = stored_response(201, &headers, &declared, b"{}");
        let names: Vec<&str> = stored.headers.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "content-type",
                "location",
                "etag",
                "x-declared",
                "x-declared"
            ]
        );
        assert_eq!(
            stored.headers[2].value_bytes(),
            b"\"caf\xe9\"",
            "non-ASCII survives"
        );
        assert_eq!(
            (stored.status, stored.body.as_slice()),
            (201, b"{}".as_slice())
        );
    }

    // clause: idem.inflight.prefer-wait
    #[tokio::test]
    async fn the_local_holder_is_exclusive_and_its_end_wakes_waiters() {
        let registry = Arc::new(Registry::default());
        let a = incoming("k", "a");
        let guard = registry.try_acquire(&a).expect("free");
        assert!(registry.try_acquire(&a).is_err(), "held");
        assert!(
            registry.try_acquire(&incoming("other", "a")).is_ok(),
            "per key"
        );
        let entry = registry.entry(&a.id).expect("entry");
        assert_eq!(entry.fingerprint, a.fingerprint);
        let waiter = {
            let entry = entry.clone();
            tokio::spawn(async move {
                let notified = entry.notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if !entry.done.load(Ordering::Acquire) {
                    notified.await;
                }
            })
        };
        drop(guard);
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("woken")
            .expect("join");
        assert!(registry.entry(&a.id).is_none(), "released");
    }

    #[test]
    fn a_takeover_replaces_the_local_holder_and_the_old_guard_leaves_it_alone() {
        let registry = Arc::new(Registry::default());
        let a = incoming("k", "a");
        let stale = registry.try_acquire(&a).expect("free");
        let fresh = registry.force_acquire(&a);
        drop(stale);
        assert!(
            registry.entry(&a.id).is_some(),
            "the takeover's entry stays"
        );
        drop(fresh);
        assert!(registry.entry(&a.id).is_none());
    }

    #[test]
    fn the_default_config_publishes_the_reference_policy_and_5xx_is_not_final() {
        assert_eq!(EngineConfig::default().policy(), Policy::default());
        let p = EngineConfig::default().failure_policy;
        assert!(p.stores(201) && p.stores(422) && !p.stores(500) && !p.stores(503));
    }
}
