//! Multi-step requests: endpoints that call a foreign system they cannot
//! roll back, built as atomic phases separated by recovery points.
//!
//! A single-phase endpoint ([`IdempotencyLayer`](crate::IdempotencyLayer))
//! runs in one transaction with its claim. An endpoint that charges a card
//! cannot: the charge happens outside the database and no rollback undoes
//! it. So the work is cut at each foreign call into **phases** (clause
//! `idem.multistep.phases`). Each phase runs in its own transaction, and
//! that transaction commits the phase's writes *together with* the key's
//! new **recovery point** and a fresh lease, guarded by the key's fencing
//! generation (clause `idem.lease.fencing`). A crash loses at most the
//! phase in progress; a retry with the same key (or the
//! [completer](crate::jobs)) resumes at the last committed point (clause
//! `idem.multistep.resume`).
//!
//! # Writing a multi-step endpoint
//!
//! Implement [`MultiStep`]: name the endpoint's recovery points once, as
//! an enum implementing [`Points`], then write one `match` on the point a
//! phase starts from (the compiler checks every point has its phase). Each
//! arm does its work through the [`Phase`] and returns [`Next::Commit`]
//! with the point it reached, or [`Next::Finish`] with the final response.
//! The driver does the rest: claiming, fencing every commit, renewing the
//! lease, storing the response, the failpoints, releasing the key on a
//! transient failure, and replays.
//!
//! The rules that keep it correct:
//!
//! 1. Every database write goes through [`Phase::tx`]: never commit it
//!    yourself. The first phase (`started`) runs inside the claim's
//!    transaction, so if it fails nothing at all is left behind.
//! 2. Never call a foreign system while holding [`Phase::tx`]: call it
//!    first, then open the transaction to record what it answered.
//! 3. Before a foreign call, record the intent and commit it with
//!    [`Phase::commit_intent`], and send the foreign system an idempotency
//!    key from [`Phase::foreign_key`] (clause `idem.multistep.foreign-key`):
//!    it is derived from (caller, key, first-claim time), so every attempt of
//!    this request sends the same one and the foreign system deduplicates a
//!    call repeated after a crash.
//! 4. A phase must be safe to run again from its start point: it may be cut
//!    short by a crash after its foreign call and before its commit.
//! 5. Errors: your error type renders as a response; a 4xx is a final
//!    outcome, stored with the phase's writes and replayed (clause
//!    `idem.failure.final-outcomes`); a 5xx rolls the phase back, is not
//!    stored (clause `idem.failure.5xx-not-stored`), and ends the lease so a
//!    retry resumes at once.
//! 6. Point names are stored with keys: renaming or removing one strands
//!    the keys in flight at it when the new version starts (they are
//!    answered 500 and left for the reaper). Add points; retire old ones
//!    only after a replay window without them.
//!
//! In outline (the reference server's `POST /v1/payments` is the full
//! example):
//!
//! ```
//! use axum::http::StatusCode;
//! use axum::response::IntoResponse;
//! use axum_idempotency::multistep::{MultiStep, Next, Phase, Points};
//! use axum_idempotency::failpoint::Position;
//! use axum_idempotency::{Error, SqliteStore};
//!
//! /// Where a payment can stop and resume.
//! #[derive(Debug, Clone, Copy, PartialEq, Eq)]
//! enum Point {
//!     Started,
//!     PaymentCreated,
//!     ChargeCreated,
//! }
//!
//! impl Points for Point {
//!     const ALL: &'static [Self] = &[Self::Started, Self::PaymentCreated, Self::ChargeCreated];
//!     fn name(self) -> &'static str {
//!         match self {
//!             Self::Started => "started",
//!             Self::PaymentCreated => "payment_created",
//!             Self::ChargeCreated => "charge_created",
//!         }
//!     }
//! }
//!
//! /// The failpoint around the processor call (`Idem-Failpoint: crash-after=charge-call`).
//! const CHARGE_CALL: &str = "charge-call";
//!
//! #[derive(Clone)]
//! struct Payments; // holds the processor client in a real one
//!
//! impl MultiStep<SqliteStore> for Payments {
//!     type Error = Error;
//!     type Point = Point;
//!
//!     async fn phase(&self, from: Point, p: &mut Phase<'_, SqliteStore>) -> Result<Next<Point>, Error> {
//!         match from {
//!             // Phase 1, in the claim's transaction: local rows only.
//!             Point::Started => {
//!                 let id = format!("pay_{}", &p.derive("payment")[..24]);
//!                 let tx = p.tx().await?;
//!                 sqlx::query("SELECT $1").bind(&id).execute(&mut **tx).await?;
//!                 Ok(Next::Commit(Point::PaymentCreated))
//!             }
//!             // Phase 2: intent, foreign call (no transaction open), record.
//!             Point::PaymentCreated => {
//!                 p.commit_intent().await?;
//!                 let _outbound = p.foreign_key("processor")?;
//!                 p.failpoint(Position::Before, CHARGE_CALL).await;
//!                 // ... call the processor with `_outbound` here ...
//!                 p.failpoint(Position::After, CHARGE_CALL).await;
//!                 let _tx = p.tx().await?; // write the charge id
//!                 Ok(Next::Commit(Point::ChargeCreated))
//!             }
//!             // Phase 3: store the final response with the last writes.
//!             Point::ChargeCreated => Ok(Next::Finish((StatusCode::CREATED, "{}").into_response())),
//!         }
//!     }
//! }
//! ```
//!
//! Then route it: `MultiStepEndpoint::new(engine, "POST", "/v1/payments",
//! Payments)` gives an axum handler ([`MultiStepEndpoint::handle`]), and
//! the same value, given to the [completer](crate::jobs), lets abandoned
//! payments finish without any client.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderName, Request, Response};
use axum::response::IntoResponse;
use idem_spec::{IdempotencyKey, RecoveryPoint};
use sha2::{Digest, Sha256};
use tracing::Instrument;

use crate::clock::Millis;
use crate::engine::{Acted, Engine, Route};
use crate::error::{Error, Result};
use crate::failpoint::{Failpoints, Position};
use crate::key::{Caller, Fence, KeyId};
use crate::registry::RegistryGuard;
use crate::request::{Incoming, Pulse};
use crate::settle::injected_error;
use crate::store::{
    AbandonedKey, ClaimOutcome, ClaimRequest, Claimed, FencedWrite, KeyStore, StoredRequest,
};

/// Most phases one request may run: a bound against an endpoint whose
/// phases loop.
pub const MAX_PHASES: usize = 32;

/// An endpoint's recovery points, named once as a type of its own (an
/// enum): the phases `match` on it, so a point without a phase does not
/// compile, and its names are what the store keeps and what failpoints
/// (`Idem-Failpoint: crash-after=NAME`) are armed with.
///
/// The library's own two points are `started` (where every request begins,
/// so it must be the first of [`Points::ALL`]) and `finished` (written by
/// the driver when the response is stored, so it must not be one of yours).
/// [`MultiStepEndpoint::new`] checks these rules, the names' syntax
/// ([`RecoveryPoint`]) and that no name repeats.
pub trait Points: Copy + Eq + fmt::Debug + Send + Sync + 'static {
    /// Every point, `started` first.
    const ALL: &'static [Self];

    /// The stored name: lower-case ASCII letters, digits and `_`, starting
    /// with a letter.
    fn name(self) -> &'static str;
}

/// Why a [`Points`] type is refused (see [`check_points`]).
fn points_problem<P: Points>() -> Option<String> {
    let names: Vec<&str> = P::ALL.iter().map(|p| p.name()).collect();
    if names.first() != Some(&RecoveryPoint::STARTED) {
        return Some(format!(
            "the first point must be named {:?} (got {names:?})",
            RecoveryPoint::STARTED
        ));
    }
    for (i, name) in names.iter().enumerate() {
        if let Err(e) = RecoveryPoint::new(*name) {
            return Some(e.to_string());
        }
        if *name == RecoveryPoint::FINISHED {
            return Some(format!(
                "{:?} is the library's own final point",
                RecoveryPoint::FINISHED
            ));
        }
        if names[..i].contains(name) {
            return Some(format!("the name {name:?} is used twice"));
        }
    }
    None
}

/// Checks a [`Points`] type against its rules: what
/// [`MultiStepEndpoint::new`] asserts, for a test of your own.
pub fn check_points<P: Points>() -> Result<()> {
    match points_problem::<P>() {
        None => Ok(()),
        Some(why) => Err(Error::Internal(format!(
            "recovery points {}: {why}",
            std::any::type_name::<P>()
        ))),
    }
}

/// The point named `name` (as stored), if the endpoint has one.
fn point_named<P: Points>(name: &str) -> Option<P> {
    P::ALL.iter().copied().find(|p| p.name() == name)
}

/// What a phase decided.
#[derive(Debug)]
pub enum Next<P> {
    /// Commit this phase's writes with the key at this recovery point, then
    /// run the phase that starts there.
    Commit(P),
    /// The request is over: store this response with this phase's writes
    /// (2xx/4xx) and answer it. A 5xx here is treated like an `Err`: rolled
    /// back, not stored.
    Finish(Response<Body>),
}

/// A multi-step endpoint on store `K`: its phases, keyed by the recovery
/// point each one starts from. See the [module docs](self).
pub trait MultiStep<K: KeyStore>: Send + Sync + 'static {
    /// The endpoint's error type; `From<Error>` lets `?` work on the
    /// [`Phase`] methods, and its response decides final (4xx) or
    /// transient (5xx).
    type Error: IntoResponse + From<Error> + fmt::Display + Send;

    /// The endpoint's recovery points.
    type Point: Points;

    /// Runs the phase that starts at recovery point `from` (`started` for
    /// the first one).
    fn phase(
        &self,
        from: Self::Point,
        p: &mut Phase<'_, K>,
    ) -> impl Future<Output = std::result::Result<Next<Self::Point>, Self::Error>> + Send;

    /// Per-response headers (`Date`, `Set-Cookie`) that replays reproduce
    /// all the same; every other header the final phase's response sets is
    /// replayed without this (see
    /// [`stored_response`](crate::store::stored_response)).
    fn replay_headers(&self) -> Vec<HeaderName> {
        Vec::new()
    }
}

/// What a phase can see and do.
pub struct Phase<'a, K: KeyStore> {
    engine: &'a Engine<K>,
    req: &'a Incoming,
    created_at: Millis,
    fence: Fence,
    point: RecoveryPoint,
    tx: Option<K::Tx>,
    intent_committed: bool,
}

impl<K: KeyStore> fmt::Debug for Phase<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Phase")
            .field("fence", &self.fence)
            .field("point", &self.point)
            .finish_non_exhaustive()
    }
}

impl<K: KeyStore> Phase<'_, K> {
    /// The record this request holds.
    pub fn id(&self) -> &KeyId {
        &self.req.id
    }

    /// The caller (scope).
    pub fn caller(&self) -> &Caller {
        self.req.id.caller()
    }

    /// The caller's deadline for this request, from its
    /// `Request-Deadline-Ms`; `None` when it sent none, and when the
    /// completer resumes an abandoned request (no caller is waiting). A
    /// phase bounds every outbound call by it (clause
    /// `idem.deadline.bound`): [`RequestDeadline::bound`].
    ///
    /// [`RequestDeadline::bound`]: crate::RequestDeadline::bound
    pub fn deadline(&self) -> Option<crate::RequestDeadline> {
        self.req.caller_deadline.map(crate::RequestDeadline::at)
    }

    /// The caller's idempotency key.
    pub fn key(&self) -> &IdempotencyKey {
        self.req.id.key()
    }

    /// The original request (method, path, content type, body): the same
    /// on every attempt and when the completer resumes it.
    pub fn request(&self) -> &StoredRequest {
        &self.req.request
    }

    /// The fencing generation this worker holds.
    pub fn generation(&self) -> i64 {
        self.fence.generation()
    }

    /// The last committed recovery point.
    pub fn recovery_point(&self) -> &RecoveryPoint {
        &self.point
    }

    /// The engine clock's now.
    pub fn now(&self) -> Millis {
        self.engine.clock().now_ms()
    }

    /// The store, for reads of committed data outside the transaction.
    pub fn store(&self) -> &K {
        self.engine.store()
    }

    /// The phase's transaction, opened on first use. Its writes commit with
    /// the next recovery point, fenced by the generation. Never hold it
    /// across a foreign call.
    pub async fn tx(&mut self) -> Result<&mut K::Tx> {
        if self.tx.is_none() {
            self.tx = Some(self.engine.store().begin().await?);
        }
        self.tx
            .as_mut()
            .ok_or_else(|| Error::Internal("phase transaction vanished".into()))
    }

    /// Commits what the phase wrote so far (its *intent*) without moving
    /// the recovery point, fenced by the generation, and renews the lease.
    /// Call it right before a foreign call.
    pub async fn commit_intent(&mut self) -> Result<()> {
        let tx = match self.tx.take() {
            Some(tx) => tx,
            None => self.engine.store().begin().await?,
        };
        let lease_expires_at = self.engine.lease_ends(self.now());
        let write = FencedWrite::Point {
            point: &self.point,
            lease_expires_at,
        };
        self.engine
            .commit_fenced(tx, &self.fence, write, self.req, None)
            .await?;
        self.intent_committed = true;
        // The key is committed now: keep its lease alive through the
        // foreign call that follows.
        self.req.pulse.committed();
        Ok(())
    }

    /// A hex digest stable for this request across retries, takeovers and
    /// restarts: SHA-256 of (caller, key, first-claim time, `label`). A key
    /// reused after its replay window is a new request with a new
    /// first-claim time, so it derives new values.
    pub fn derive(&self, label: &str) -> String {
        let mut h = Sha256::new();
        for part in [
            self.caller().as_str().as_bytes(),
            self.key().as_str().as_bytes(),
            self.created_at.to_string().as_bytes(),
            label.as_bytes(),
        ] {
            h.update(part);
            h.update([0x1f]);
        }
        hex::encode(h.finalize())
    }

    /// The idempotency key to send to foreign system `system`:
    /// `idemkit-{system}-{first 40 hex digits of derive(system)}`. The
    /// caller's own key never leaves the server.
    pub fn foreign_key(&self, system: &str) -> Result<IdempotencyKey> {
        let digest = self.derive(system);
        IdempotencyKey::parse(&format!("idemkit-{system}-{}", &digest[..40]))
            .map_err(|e| Error::Internal(format!("derived key invalid: {e}")))
    }

    /// Fires the request's failpoints armed at (`position`, `name`) (only
    /// when the engine opted in to failpoints).
    pub async fn failpoint(&self, position: Position, name: &str) {
        self.engine.hit(self.req, position, name).await;
    }
}

/// How often the heartbeat renews a lease: a third of it, so two renewals
/// can fail (a slow store, a busy writer gate) before the lease runs out.
pub const HEARTBEAT_FRACTION: u32 = 3;

/// The lease heartbeat of one multi-step request (clause
/// `idem.lease.heartbeat`): a task that renews the key's lease every
/// lease / [`HEARTBEAT_FRACTION`] while the request runs, a foreign call
/// included, each renewal fenced by the generation. So the lease can be
/// short (10 s by default) and a crashed worker's key is taken over soon,
/// while a live one is never taken over however long its phases take.
/// A renewal that finds the key taken over (or settled) ends the task: the
/// worker's next commit is fenced anyway. Aborted on drop.
struct Heartbeat(tokio::task::JoinHandle<()>);

impl Heartbeat {
    fn start<K: KeyStore>(engine: &Engine<K>, fence: &Fence, pulse: Arc<Pulse>) -> Self {
        let (engine, fence) = (engine.clone(), fence.clone());
        let every = (engine.config().lease / HEARTBEAT_FRACTION).max(Duration::from_millis(50));
        Self(tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if !pulse.beats() {
                    continue;
                }
                let now = engine.clock().now_ms();
                match engine
                    .store()
                    .renew_lease(&fence, now, engine.lease_ends(now))
                    .await
                {
                    Ok(true) => tracing::trace!(%fence, "lease renewed"),
                    Ok(false) => {
                        tracing::warn!(%fence, "lease heartbeat: the key was taken over or \
                            settled; this worker's commits will be fenced");
                        return;
                    }
                    Err(e) => tracing::warn!(%fence, error = %e,
                        "lease heartbeat failed; trying again at the next beat"),
                }
            }
        }))
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Where a run starts.
pub(crate) enum Start<Tx> {
    /// A fresh claim (at this time): the first phase joins its transaction.
    Fresh(Claimed<Tx>, Millis),
    /// Take over an expired lease and resume at its recovery point.
    Resume,
}

type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe face of a [`MultiStep`] endpoint, for the engine.
pub(crate) trait Driver<K: KeyStore>: Send + Sync {
    /// Runs the request to its end; `Ok(None)` when a resume lost the
    /// takeover race (someone else holds the key now).
    fn run<'a>(
        &'a self,
        engine: &'a Engine<K>,
        req: &'a Incoming,
        start: Start<K::Tx>,
        guard: RegistryGuard,
    ) -> BoxFut<'a, Result<Option<Response<Body>>>>;
}

struct Driven<M> {
    endpoint: M,
    replay_headers: Vec<HeaderName>,
}

impl<K: KeyStore, M: MultiStep<K>> Driver<K> for Driven<M> {
    fn run<'a>(
        &'a self,
        engine: &'a Engine<K>,
        req: &'a Incoming,
        start: Start<K::Tx>,
        guard: RegistryGuard,
    ) -> BoxFut<'a, Result<Option<Response<Body>>>> {
        Box::pin(async move {
            let result = self.drive(engine, req, start).await;
            drop(guard);
            result
        })
    }
}

impl<M> Driven<M> {
    async fn drive<K: KeyStore>(
        &self,
        engine: &Engine<K>,
        req: &Incoming,
        start: Start<K::Tx>,
    ) -> Result<Option<Response<Body>>>
    where
        M: MultiStep<K>,
    {
        let (fence, created_at, mut point, mut tx) = match start {
            Start::Fresh(claimed, created_at) => {
                let started = M::Point::ALL
                    .first()
                    .copied()
                    .ok_or_else(|| Error::Internal("an endpoint without recovery points".into()))?;
                (claimed.fence, created_at, started, Some(claimed.tx))
            }
            Start::Resume => {
                let now = engine.clock().now_ms();
                let lease = engine.lease_ends(now);
                let Some(t) = engine
                    .store()
                    .take_over(&req.id, &req.fingerprint, now, lease)
                    .await?
                else {
                    return Ok(None);
                };
                tracing::info!(fence = %t.fence, recovery_point = %t.recovery_point,
                    "took over an expired lease; resuming");
                crate::metrics::takeover();
                crate::metrics::recovery_point(t.recovery_point.as_str());
                let Some(point) = point_named::<M::Point>(t.recovery_point.as_str()) else {
                    // A point renamed or removed by a deploy while keys were
                    // in flight at it: nothing knows how to go on from there.
                    // The takeover's fence stays held until its lease ends.
                    return Err(Error::Internal(format!(
                        "stored recovery point {:?} is not one of this endpoint's points {:?}",
                        t.recovery_point.as_str(),
                        M::Point::ALL.iter().map(|p| p.name()).collect::<Vec<_>>()
                    )));
                };
                (t.fence, t.created_at, point, None)
            }
        };
        // Whether nothing of this request is committed yet: then a failure
        // rolls back the claim itself and the key is absent again.
        let mut fresh = tx.is_some();
        if !fresh {
            req.pulse.committed();
        }
        // Renews the lease while the phases run; stopped (dropped) before
        // the request settles or when it ends any other way.
        let heartbeat = Heartbeat::start(engine, &fence, req.pulse.clone());
        if fresh {
            engine
                .hit(req, Position::After, RecoveryPoint::STARTED)
                .await;
            if Failpoints::injects_error(&req.armed) {
                let response = injected_error(engine.config().profile);
                return engine
                    .settle(req, &fence, tx, fresh, response, &self.replay_headers)
                    .await
                    .map(Some);
            }
        }
        for _ in 0..MAX_PHASES {
            let mut phase = Phase {
                engine,
                req,
                created_at,
                fence: fence.clone(),
                point: recovery_point(point)?,
                tx: tx.take(),
                intent_committed: false,
            };
            tracing::debug!(%fence, from = point.name(), "phase");
            let outcome = self.endpoint.phase(point, &mut phase).await;
            let phase_tx = phase.tx.take();
            // An intent commit inside the phase committed the claim too.
            fresh &= !phase.intent_committed;
            drop(phase);
            let response = match outcome {
                Ok(Next::Commit(reached)) => {
                    let next = recovery_point(reached)?;
                    let t = match phase_tx {
                        Some(t) => t,
                        None => engine.store().begin().await?,
                    };
                    let write = FencedWrite::Point {
                        point: &next,
                        lease_expires_at: engine.lease_ends(engine.clock().now_ms()),
                    };
                    engine
                        .commit_fenced(t, &fence, write, req, Some(next.as_str()))
                        .await?;
                    fresh = false;
                    req.pulse.committed();
                    tracing::info!(%fence, point = %next, "recovery point committed");
                    crate::metrics::recovery_point(next.as_str());
                    point = reached;
                    continue;
                }
                Ok(Next::Finish(response)) => response,
                Err(e) => {
                    tracing::debug!(%fence, error = %e, "phase failed");
                    e.into_response()
                }
            };
            // Settling stores the response or releases the key: no renewal
            // may land after it.
            drop(heartbeat);
            return engine
                .settle(req, &fence, phase_tx, fresh, response, &self.replay_headers)
                .await
                .map(Some);
        }
        drop(heartbeat);
        engine.fail(&fence, tx, fresh).await?;
        Err(Error::Internal(format!(
            "the endpoint ran more than {MAX_PHASES} phases"
        )))
    }
}

/// A point as the store keeps it (its syntax was checked when the endpoint
/// was built, so this fails only for a `name` that is not a constant).
fn recovery_point<P: Points>(point: P) -> Result<RecoveryPoint> {
    RecoveryPoint::new(point.name())
        .map_err(|e| Error::Internal(format!("bad recovery point {point:?}: {e}")))
}

/// A [`MultiStep`] endpoint bound to an engine, a method and a path: an
/// axum handler, and something the completer can resume.
pub struct MultiStepEndpoint<K: KeyStore> {
    engine: Engine<K>,
    driver: Arc<dyn Driver<K>>,
    method: String,
    path: String,
}

impl<K: KeyStore> Clone for MultiStepEndpoint<K> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            driver: self.driver.clone(),
            method: self.method.clone(),
            path: self.path.clone(),
        }
    }
}

impl<K: KeyStore> fmt::Debug for MultiStepEndpoint<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiStepEndpoint")
            .field("method", &self.method)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl<K: KeyStore> MultiStepEndpoint<K> {
    /// Binds `endpoint` to `method` and `path` (the path the completer
    /// matches stored requests against).
    ///
    /// # Panics
    ///
    /// When the endpoint's [`Points`] break their rules (see
    /// [`check_points`]): a programming error found when the app starts,
    /// before any request.
    pub fn new<M: MultiStep<K>>(engine: Engine<K>, method: &str, path: &str, endpoint: M) -> Self {
        if let Err(e) = check_points::<M::Point>() {
            panic!("MultiStepEndpoint {method} {path}: {e}");
        }
        let replay_headers = endpoint.replay_headers();
        Self {
            engine,
            driver: Arc::new(Driven {
                endpoint,
                replay_headers,
            }),
            method: method.to_owned(),
            path: path.to_owned(),
        }
    }

    /// The engine it runs on.
    pub fn engine(&self) -> &Engine<K> {
        &self.engine
    }

    /// Serves one request: replay, 409, or run/resume its phases.
    pub async fn handle(&self, req: Request<Body>) -> Response<Body> {
        let started = std::time::Instant::now();
        let span = crate::metrics::request_span(
            &self.path,
            req.headers(),
            req.extensions().get::<Caller>(),
        );
        let driver = self.driver.as_ref();
        let response = self
            .engine
            .handle_with(req, |_| Phased(driver))
            .instrument(span.clone())
            .await;
        crate::metrics::finish(&span, &self.path, started, &response);
        response
    }

    /// Whether a stored request belongs to this endpoint.
    pub fn matches(&self, method: &str, path: &str) -> bool {
        self.method.eq_ignore_ascii_case(method) && self.path == path
    }

    /// Drives an abandoned key to its end without a client. `Ok(None)` when
    /// another worker took it first.
    pub async fn complete(&self, key: &AbandonedKey) -> Result<Option<Response<Body>>> {
        let incoming = Incoming::abandoned(key);
        let guard = self.engine.registry().force_acquire(&incoming);
        self.driver
            .run(&self.engine, &incoming, Start::Resume, guard)
            .await
    }
}

/// The multi-step route: the engine's act step for a [`MultiStep`]
/// endpoint.
struct Phased<'d, K: KeyStore>(&'d dyn Driver<K>);

impl<K: KeyStore> Route<K> for Phased<'_, K> {
    fn phased(&self) -> bool {
        true
    }

    async fn claim<'a>(
        &'a mut self,
        engine: &'a Engine<K>,
        incoming: &'a Incoming,
        claim: ClaimRequest<'a>,
        observed: Option<K::Tx>,
        guard: RegistryGuard,
    ) -> Result<Acted> {
        if let Some(tx) = observed {
            // A plain read leaves nothing open; never run in a stray
            // transaction.
            engine.store().rollback(tx).await?;
        }
        match engine.store().claim(&claim).await? {
            ClaimOutcome::Claimed(claimed) => self
                .0
                .run(engine, incoming, Start::Fresh(claimed, claim.now), guard)
                .await?
                .map(Acted::Answered)
                .ok_or_else(|| Error::Internal("a fresh claim cannot lose".into())),
            ClaimOutcome::Busy => Ok(Acted::Busy),
            ClaimOutcome::Taken => Ok(Acted::LostRace),
        }
    }

    async fn resume<'a>(
        &'a mut self,
        engine: &'a Engine<K>,
        incoming: &'a Incoming,
        guard: RegistryGuard,
    ) -> Result<Acted> {
        Ok(
            match self.0.run(engine, incoming, Start::Resume, guard).await? {
                Some(response) => Acted::Answered(response),
                None => Acted::LostRace,
            },
        )
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::engine::EngineConfig;
    use crate::store::SqliteStore;

    fn incoming(caller: &str, key: &str) -> Incoming {
        Incoming {
            id: KeyId::new(
                Caller::new(caller),
                IdempotencyKey::parse(key).expect("key"),
            ),
            fingerprint: idem_spec::Fingerprint::compute("POST", "/", None, b""),
            request: StoredRequest {
                method: "POST".into(),
                path: "/".into(),
                content_type: None,
                body: axum::body::Bytes::new(),
            },
            wait: None,
            armed: Vec::new(),
            pulse: Arc::default(),
            caller_deadline: None,
        }
    }

    fn derived(
        engine: &Engine<SqliteStore>,
        req: &Incoming,
        created_at: Millis,
    ) -> (String, String) {
        let phase = Phase {
            engine,
            req,
            created_at,
            fence: req.id.fence(1),
            point: RecoveryPoint::started(),
            tx: None,
            intent_committed: false,
        };
        let key = phase.foreign_key("shop").expect("valid key");
        (phase.derive("order"), key.as_str().to_owned())
    }

    // clause: idem.multistep.foreign-key
    #[tokio::test]
    async fn derived_values_follow_caller_key_and_first_claim_only() {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:")
            .await
            .expect("pool");
        let engine = Engine::new(
            SqliteStore::new(pool),
            Arc::new(SystemClock),
            EngineConfig::default(),
        );
        let (a, b) = (incoming("ann", "k"), incoming("bob", "k"));
        let first = derived(&engine, &a, 1_000);
        assert_eq!(first, derived(&engine, &a, 1_000), "stable across attempts");
        assert_ne!(first, derived(&engine, &b, 1_000), "per caller");
        assert_ne!(
            first,
            derived(&engine, &incoming("ann", "k2"), 1_000),
            "per key"
        );
        assert_ne!(
            first,
            derived(&engine, &a, 2_000),
            "a key reused after its window"
        );
        let (digest, key) = first;
        assert_eq!(
            key,
            format!("idemkit-shop-{}", &derived_digest(&engine, &a)[..40])
        );
        assert_ne!(
            digest,
            derived_digest(&engine, &a),
            "labels separate values"
        );
    }

    /// A points type with these names, `name(ALL[i])` the i-th.
    macro_rules! points {
        ($ty:ident: $($name:literal),*) => {
            #[derive(Debug, Clone, Copy, PartialEq, Eq)]
            struct $ty(usize);
            impl $ty {
                const NAMES: &'static [&'static str] = &[$($name),*];
            }
            impl Points for $ty {
                const ALL: &'static [Self] = &{
                    let mut all = [$ty(0); $ty::NAMES.len()];
                    let mut i = 0;
                    while i < all.len() {
                        all[i] = $ty(i);
                        i += 1;
                    }
                    all
                };
                fn name(self) -> &'static str {
                    Self::NAMES[self.0]
                }
            }
        };
    }

    points!(Good: "started", "reserved", "charged_2");
    points!(Empty:);
    points!(NotStartedFirst: "reserved", "started");
    points!(Finished: "started", "finished");
    points!(Repeated: "started", "reserved", "reserved");
    points!(BadName: "started", "Charge-Created");

    #[test]
    fn points_are_checked_before_any_request() {
        assert!(check_points::<Good>().is_ok());
        for (problem, expected) in [
            (check_points::<Empty>(), "must be named \"started\""),
            (
                check_points::<NotStartedFirst>(),
                "must be named \"started\"",
            ),
            (check_points::<Finished>(), "library's own final point"),
            (check_points::<Repeated>(), "\"reserved\" is used twice"),
            (check_points::<BadName>(), "Charge-Created"),
        ] {
            let message = problem.expect_err(expected).to_string();
            assert!(message.contains(expected), "{message:?} lacks {expected:?}");
        }
        assert_eq!(point_named::<Good>("charged_2"), Some(Good(2)));
        assert_eq!(point_named::<Good>("renamed_since"), None);
    }

    fn derived_digest(engine: &Engine<SqliteStore>, req: &Incoming) -> String {
        let phase = Phase {
            engine,
            req,
            created_at: 1_000,
            fence: req.id.fence(1),
            point: RecoveryPoint::started(),
            tx: None,
            intent_committed: false,
        };
        phase.derive("shop")
    }
}
