//! The engine: what happens to one request with a key.
//!
//! [`Engine::handle`] reads the request (module `request`: caller, key,
//! fingerprint, `Prefer: wait`), then runs turns of three named steps until
//! one answers:
//!
//! ```text
//!   observe ─► the store's record of the key (+ PostgreSQL: the key's
//!      │        advisory lock, taken by the same statement) and this
//!      │        process's in-flight registry               [Engine::observe]
//!      ▼
//!   decide  ─► crate::decide, pure: replay │ reject │ wait │ claim │ resume
//!      │
//!      ▼
//!   act     ─► replay / reject: answer                      [Engine::act]
//!              wait: until the holder settles (bounded), then a new turn
//!              claim / resume: the route runs the request [Route]:
//!                single-phase (crate::single): the endpoint in one
//!                  transaction, claim and record in one write at the end
//!                multi-step (crate::multistep): phases, recovery points
//!              └─ lost a race to a request that committed meanwhile, or
//!                 the key turned out busy: a new turn (observe again)
//! ```
//!
//! A turn carries nothing to the next but what happened (`Turns`: races
//! lost, waits made), so the loop ends: every turn answers, waits (bounded
//! by the client's `Prefer: wait` and the server maximum; once that is over
//! the decision is 409), or lost a race (at most [`MAX_RACES`] times; the
//! next observation then sees the winner's record). Settling a claimed
//! request (storing the final response with its writes, or releasing the
//! key) is the module `settle`, shared by both routes.
//!
//! Why a single-phase request claims at the end, and the race that makes
//! safe, is argued in [`crate::store`] ("The single-phase protocol").

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, Request, Response};
use tokio::time::Instant;
use tracing::Instrument;

use crate::clock::{Clock, Millis};
use crate::decide::{Ask, Decision, Held, Reject, Seen, decide};
use crate::error::{Error, Result};
use crate::failpoint::{Failpoints, Position};
use crate::key::KeyId;
use crate::registry::{Entry, Gauge, Registry, RegistryGuard};
use crate::request::{Incoming, RequestDeadline};
use crate::store::{ClaimRequest, KeyRecord, KeyStore, StoredResponse};

pub(crate) use crate::config::ms;
pub use crate::config::{
    ContractFingerprint, DEFAULT_COMPLETER_GRACE, EngineConfig, FingerprintPolicy,
};
pub use crate::store::stored_response;

/// Most claim races one request may lose before it answers 409.
pub const MAX_RACES: u32 = 20;

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

/// How a claimed request is executed: the two routes' side of the act
/// step. [`crate::single`] runs one endpoint in one transaction;
/// [`multistep`](crate::multistep) runs phases. The engine knows only this
/// trait, so neither route's module and the engine import each other.
pub(crate) trait Route<K: KeyStore>: Send {
    /// Whether the route runs phases: it observes with a plain read (its
    /// claim takes the key's lock itself) and may resume a key at its last
    /// recovery point.
    fn phased(&self) -> bool;

    /// Claims the key (a [`Decision::Claim`]) and runs the request.
    /// `observed` is the transaction the observation left open holding
    /// the key's lock (PostgreSQL, single-phase), to run in.
    fn claim<'a>(
        &'a mut self,
        engine: &'a Engine<K>,
        incoming: &'a Incoming,
        claim: ClaimRequest<'a>,
        observed: Option<K::Tx>,
        guard: RegistryGuard,
    ) -> impl Future<Output = Result<Acted>> + Send + 'a;

    /// Takes an expired lease over and runs the rest (a
    /// [`Decision::Resume`]).
    fn resume<'a>(
        &'a mut self,
        engine: &'a Engine<K>,
        incoming: &'a Incoming,
        guard: RegistryGuard,
    ) -> impl Future<Output = Result<Acted>> + Send + 'a;
}

/// What a route's claim or resume came to.
#[derive(Debug)]
pub(crate) enum Acted {
    /// The request's answer.
    Answered(Response<Body>),
    /// A concurrent request won the key (its record committed meanwhile):
    /// observe again and answer from it.
    LostRace,
    /// Another transaction holds the key right now: it is in flight.
    Busy,
}

/// What one turn of the loop came to.
#[derive(Debug)]
enum Turn {
    /// The answer.
    Answer(Response<Body>),
    /// Observe again, because of this.
    Again(Again),
}

/// Why a turn did not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Again {
    /// Waited for an in-flight original (`Prefer: wait`).
    Waited,
    /// Lost a claim race.
    LostRace,
}

/// What earlier turns of one request did: the only state the loop keeps.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    races: u32,
    waited: bool,
}

impl Turns {
    /// Records a turn that did not answer; past [`MAX_RACES`] lost races
    /// the request is answered 409 (`Err`).
    fn record(&mut self, again: Again) -> std::result::Result<(), ()> {
        match again {
            Again::Waited => self.waited = true,
            Again::LostRace => self.races += 1,
        }
        if self.races > MAX_RACES {
            Err(())
        } else {
            Ok(())
        }
    }
}

/// What the observe step saw: the committed record, whether another
/// transaction holds the key, this process's holder, and the transaction
/// the observation left open (PostgreSQL, claimable key: it holds the
/// key's advisory lock).
struct Observation<Tx> {
    record: Option<KeyRecord>,
    busy: bool,
    local: Option<Arc<Entry>>,
    tx: Option<Tx>,
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

    /// This process's in-flight registry.
    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Reads `req`, then serves it on the route `route` builds from its
    /// head; any error becomes the profile's problem response.
    pub(crate) async fn handle_with<R: Route<K>>(
        &self,
        req: Request<Body>,
        route: impl FnOnce(Parts) -> R,
    ) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        let result =
            match Incoming::read(&parts, body, &self.config, self.failpoints.is_some()).await {
                Ok(incoming) => {
                    // The handler bounds its own work by it (idem.deadline.bound).
                    if let Some(at) = incoming.caller_deadline {
                        parts.extensions.insert(RequestDeadline::at(at));
                    }
                    self.serve(incoming, route(parts)).await
                }
                Err(e) => Err(e),
            };
        result.unwrap_or_else(|e| e.into_response_in(self.config.profile))
    }

    /// The loop: observe, decide, act, until a turn answers (see the module
    /// docs).
    pub(crate) async fn serve<R: Route<K>>(
        &self,
        incoming: Incoming,
        mut route: R,
    ) -> Result<Response<Body>> {
        // A held duplicate waits no longer than its caller does.
        let mut deadline = Instant::now() + incoming.wait.unwrap_or_default();
        if let Some(caller) = incoming.caller_deadline {
            deadline = deadline.min(caller);
        }
        let mut turns = Turns::default();
        loop {
            let now = self.clock.now_ms();
            let seen = self
                .observe(&incoming.id, route.phased(), now)
                .instrument(tracing::trace_span!("idem.observe"))
                .await?;
            let ask = Ask {
                fingerprint: &incoming.fingerprint,
                may_wait: incoming.wait.is_some() && Instant::now() < deadline,
                resumable: route.phased(),
            };
            match self
                .act(&incoming, seen, &ask, now, deadline, &turns, &mut route)
                .await?
            {
                Turn::Answer(response) => return Ok(response),
                Turn::Again(again) => {
                    if turns.record(again).is_err() {
                        return Err(self.in_use());
                    }
                }
            }
        }
    }

    /// The observe step. A single-phase request observes through the
    /// store's single-phase protocol (PostgreSQL: inside the transaction it
    /// would run in, with the key's lock); a multi-step one reads the
    /// record (its claim statement takes the lock).
    async fn observe(&self, id: &KeyId, phased: bool, now: Millis) -> Result<Observation<K::Tx>> {
        // This process's holder first, the store second: a holder keeps its
        // registry entry until its commit is visible, so a request that
        // finds no holder here either reads that commit below or finds the
        // key unclaimed. The other order let a holder commit and leave
        // between the two looks, and the request ran the endpoint again.
        let local = self.registry.entry(id);
        let (record, busy, tx) = if phased {
            (self.store.lookup(id).await?, false, None)
        } else {
            let o = self.store.observe(id, now).await?;
            (o.record, o.busy, o.tx)
        };
        Ok(Observation {
            record,
            busy,
            local,
            tx,
        })
    }

    /// The decide and act steps of one turn.
    #[allow(clippy::too_many_arguments)]
    async fn act<R: Route<K>>(
        &self,
        incoming: &Incoming,
        seen: Observation<K::Tx>,
        ask: &Ask<'_>,
        now: Millis,
        deadline: Instant,
        turns: &Turns,
        route: &mut R,
    ) -> Result<Turn> {
        let Observation {
            record,
            busy,
            local,
            mut tx,
        } = seen;
        // The key's window end as committed, for the answers below.
        let window_end = record.as_ref().map(|r| r.replay_until);
        let held = match (&local, busy) {
            (Some(entry), _) => Held::Here(&entry.fingerprint),
            (None, true) => Held::Elsewhere,
            (None, false) => Held::No,
        };
        let mut decision = decide(
            &Seen {
                stored: record.as_ref(),
                held,
            },
            ask,
            now,
        );
        if decision != Decision::Claim
            && let Some(tx) = tx.take()
        {
            // Observed, not executing: nothing was written in it.
            self.store.rollback(tx).await?;
        }
        if matches!(decision, Decision::Claim | Decision::Resume) && deadline_spent(incoming) {
            // New work for a caller that has given up: refused before the
            // claim, so the key stays free (idem.deadline.spent). Only a
            // claim or a resumption starts work; a stored outcome is
            // replayed whatever the deadline.
            if let Some(tx) = tx.take() {
                self.store.rollback(tx).await?;
            }
            tracing::debug!(key_hash = %incoming.id, "caller deadline spent: 504, not started");
            return Err(Error::DeadlineExceeded);
        }
        if decision == Decision::Claim {
            let Ok(guard) = self.registry.try_acquire(incoming) else {
                // Another request of this process took the key since the
                // observation: a race, observe again.
                if let Some(tx) = tx.take() {
                    self.store.rollback(tx).await?;
                }
                return Ok(Turn::Again(Again::LostRace));
            };
            let claim = self.claim_request(incoming, now);
            let claimed_window = claim.replay_until;
            match route.claim(self, incoming, claim, tx, guard).await? {
                Acted::Answered(response) => {
                    return Ok(Turn::Answer(self.first_answer(response, claimed_window)));
                }
                Acted::LostRace => return Ok(Turn::Again(Again::LostRace)),
                // New information, decided on at once: the key is in flight
                // elsewhere, so this turn waits or answers 409.
                Acted::Busy => {
                    decision = decide(
                        &Seen {
                            stored: record.as_ref(),
                            held: Held::Elsewhere,
                        },
                        ask,
                        now,
                    );
                }
            }
        }
        match decision {
            Decision::Replay(stored) => {
                tracing::debug!(key_hash = %incoming.id, status = stored.status, "replay");
                let waited = incoming.wait.filter(|_| turns.waited);
                Ok(Turn::Answer(with_expiry(
                    self.replay(stored, waited),
                    window_end,
                )))
            }
            Decision::Reject(Reject::Mismatch) => Ok(Turn::Answer(with_expiry(
                Error::KeyMismatch.into_response_in(self.config.profile),
                window_end,
            ))),
            Decision::Reject(Reject::InUse) => {
                tracing::debug!(key_hash = %incoming.id, "in flight: 409");
                let refusal = self.in_use_of(record.as_ref(), local.is_some(), now);
                Ok(Turn::Answer(with_expiry(
                    refusal.into_response_in(self.config.profile),
                    window_end,
                )))
            }
            Decision::Wait => {
                self.wait(deadline, local.as_deref()).await;
                Ok(Turn::Again(Again::Waited))
            }
            Decision::Resume => {
                // The lease is over, so the store arbitrates: take the
                // local slot even if a (paused, stale) local holder has
                // it; fencing refuses that holder's later commits.
                let guard = self.registry.force_acquire(incoming);
                match route.resume(self, incoming, guard).await? {
                    Acted::Answered(response) => Ok(Turn::Answer(match window_end {
                        Some(end) => self.first_answer(response, end),
                        None => response,
                    })),
                    Acted::LostRace | Acted::Busy => Ok(Turn::Again(Again::LostRace)),
                }
            }
            Decision::Claim => Err(Error::Internal("a claim decided twice in one turn".into())),
        }
    }

    /// Everything the claim statement writes for `incoming` at `now`.
    fn claim_request<'a>(&self, incoming: &'a Incoming, now: Millis) -> ClaimRequest<'a> {
        ClaimRequest {
            id: &incoming.id,
            fingerprint: &incoming.fingerprint,
            request: &incoming.request,
            now,
            lease_expires_at: self.lease_ends(now),
            replay_until: now.saturating_add(ms(self.config.replay_window)),
            expires_at: now.saturating_add(ms(self.config.retention)),
        }
    }

    /// The plain 409 for a key in flight, with the configured hint.
    pub(crate) fn in_use(&self) -> Error {
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
        let _gauge = Gauge::enter(&self.waiting);
        match entry {
            Some(entry) => entry.settled(remaining).await,
            None => {
                tokio::time::sleep(self.config.wait_poll_interval.min(remaining)).await;
            }
        }
    }

    /// Fires the failpoints `req` armed at (`position`, `name`). A `pause`
    /// stands for a stalled process (a long GC pause, a frozen VM), so the
    /// request's lease heartbeat stalls with it: that is what lets a test
    /// see a paused writer taken over and fenced.
    /// Whether `req` carries a failpoint at `position` of `name` that this
    /// engine honours (test hooks on).
    pub(crate) fn armed_at(&self, req: &Incoming, position: Position, name: &str) -> bool {
        self.failpoints.is_some()
            && req
                .armed
                .iter()
                .any(|f| f.position == position && f.name == name)
    }

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

    /// A first execution's answer, with its window's end when its outcome
    /// was stored (a released 5xx leaves the key absent: no window).
    fn first_answer(&self, response: Response<Body>, window_end: Millis) -> Response<Body> {
        if self.is_final(response.status().as_u16()) {
            with_expiry(response, Some(window_end))
        } else {
            response
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

/// Whether the caller's deadline has passed.
fn deadline_spent(incoming: &Incoming) -> bool {
    incoming
        .caller_deadline
        .is_some_and(|at| Instant::now() >= at)
}

/// Adds `Idempotency-Key-Expires` (the replay window's end, an HTTP-date)
/// to an answer the key governs, when the window is known: a key whose
/// claim has not committed yet (a single-phase request still running) has
/// no window another request can see.
pub(crate) fn with_expiry(
    mut response: Response<Body>,
    window_end: Option<Millis>,
) -> Response<Body> {
    let Some(end) = window_end.and_then(|ms| u64::try_from(ms).ok()) else {
        return response;
    };
    let at = std::time::UNIX_EPOCH + Duration::from_millis(end);
    if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(at)) {
        response
            .headers_mut()
            .insert(HeaderName::from_static("idempotency-key-expires"), v);
    }
    response
}

#[cfg(test)]
mod tests;
