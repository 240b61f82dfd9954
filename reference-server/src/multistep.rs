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
//! Implement [`MultiStep`]: one `match` on the recovery point a phase
//! starts from. Each arm does its work through the [`Phase`] and returns
//! [`Next::Commit`] with the point it reached, or [`Next::Finish`] with the
//! final response. The driver does the rest: claiming, fencing every
//! commit, renewing the lease, storing the response, the failpoints,
//! releasing the key on a transient failure, and replays.
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
//! 5. Errors: a 4xx [`Error`] is a final outcome, stored with the phase's
//!    writes and replayed (clause `idem.failure.final-outcomes`); a 5xx
//!    (e.g. [`Error::UpstreamUnavailable`]) rolls the phase back, is not
//!    stored (clause `idem.failure.5xx-not-stored`), and ends the lease so a
//!    retry resumes at once.
//!
//! The example, `POST /v1/payments` ([`crate::api::payments`]), in outline:
//!
//! ```
//! use axum::response::IntoResponse;
//! use idem_server::multistep::{MultiStep, Next, Phase};
//! use idem_server::failpoint::Position;
//! use idem_server::{Error, with_conn};
//!
//! #[derive(Clone)]
//! struct Payments; // holds the processor client in the real one
//!
//! impl MultiStep for Payments {
//!     async fn phase(&self, from: &str, p: &mut Phase<'_>) -> Result<Next, Error> {
//!         match from {
//!             // Phase 1, in the claim's transaction: local rows only.
//!             "started" => {
//!                 let id = format!("pay_{}", &p.derive("payment")[..24]);
//!                 let tx = p.tx().await?;
//!                 with_conn!(tx, c => {
//!                     sqlx::query("SELECT $1").bind(&id).execute(&mut *c).await?;
//!                 });
//!                 Ok(Next::Commit("payment_created"))
//!             }
//!             // Phase 2: intent, foreign call (no transaction open), record.
//!             "payment_created" => {
//!                 p.commit_intent().await?;
//!                 let _outbound = p.foreign_key("processor")?;
//!                 p.failpoint(Position::Before, "charge-call").await;
//!                 // ... call the processor with `_outbound` here ...
//!                 p.failpoint(Position::After, "charge-call").await;
//!                 let _tx = p.tx().await?; // write the charge id
//!                 Ok(Next::Commit("charge_created"))
//!             }
//!             // Phase 3: stage the receipt job; store the final response.
//!             "charge_created" => Ok(Next::Finish(
//!                 (axum::http::StatusCode::CREATED, "{}").into_response(),
//!             )),
//!             other => Err(Error::Internal(format!("no phase starts at {other}"))),
//!         }
//!     }
//! }
//! ```
//!
//! Then route it: `MultiStepEndpoint::new(engine, "POST", "/v1/payments",
//! Payments)` gives an axum handler ([`MultiStepEndpoint::handle`]), and
//! the same value, registered with the completer, lets abandoned payments
//! finish without any client.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderName, Request, Response};
use idem_spec::{IdempotencyKey, RecoveryPoint};
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use crate::clock::Millis;
use crate::engine::{Engine, Pending, RegistryGuard, stored_response};
use crate::error::{Error, Result, current_profile};
use crate::failpoint::{Failpoints, Position};
use crate::store::phases::AbandonedKey;
use crate::store::{Claimed, DbTx, KeyStore, Store};

/// Most phases one request may run: a bound against an endpoint whose
/// phases loop.
pub const MAX_PHASES: usize = 32;

/// What a phase decided.
#[derive(Debug)]
pub enum Next {
    /// Commit this phase's writes with the key at this recovery point (a
    /// lower-case name such as `charge_created`), then run the phase that
    /// starts there.
    Commit(&'static str),
    /// The request is over: store this response with this phase's writes
    /// (2xx/4xx) and answer it. A 5xx here is treated like an `Err`: rolled
    /// back, not stored.
    Finish(Response<Body>),
}

/// A multi-step endpoint: its phases, keyed by the recovery point each one
/// starts from. See the [module docs](self).
pub trait MultiStep: Send + Sync + 'static {
    /// Runs the phase that starts at recovery point `from` (`started` for
    /// the first one).
    fn phase(&self, from: &str, p: &mut Phase<'_>) -> impl Future<Output = Result<Next>> + Send;

    /// Response headers a replay reproduces, besides `Content-Type`,
    /// `Location` and `ETag`.
    fn replay_headers(&self) -> Vec<HeaderName> {
        Vec::new()
    }
}

/// What a phase can reach: the original request, the fenced transaction,
/// derived keys and failpoints.
pub struct Phase<'a> {
    engine: &'a Engine<Store>,
    req: &'a Pending,
    created_at: Millis,
    generation: i64,
    point: String,
    tx: Option<DbTx>,
    intent_committed: bool,
}

impl std::fmt::Debug for Phase<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Phase")
            .field("caller", &self.req.caller)
            .field("key", &self.req.key)
            .field("generation", &self.generation)
            .field("point", &self.point)
            .finish_non_exhaustive()
    }
}

impl Phase<'_> {
    /// The authenticated caller the key belongs to.
    pub fn caller(&self) -> &str {
        &self.req.caller
    }

    /// The idempotency key (unquoted).
    pub fn key(&self) -> &str {
        &self.req.key
    }

    /// The original request body (the stored one, when resuming).
    pub fn body(&self) -> &[u8] {
        &self.req.body
    }

    /// The original body as JSON: 415 unless it was sent as JSON, 400 when
    /// broken, 422 when it does not fit `T`. All final (4xx).
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        let ct = self.req.content_type.as_deref().unwrap_or_default();
        if !idem_spec::fingerprint::is_json_media_type(ct) {
            return Err(Error::UnsupportedMediaType(format!(
                "send the body as application/json (got {:?})",
                if ct.is_empty() { "no Content-Type" } else { ct }
            )));
        }
        crate::api::json::parse(&self.req.body)
    }

    /// The fencing generation this worker holds.
    pub fn generation(&self) -> i64 {
        self.generation
    }

    /// The last committed recovery point.
    pub fn recovery_point(&self) -> &str {
        &self.point
    }

    /// The server clock's now.
    pub fn now(&self) -> Millis {
        self.engine.clock().now_ms()
    }

    /// The store, for reads of committed data outside the transaction.
    pub fn store(&self) -> &Store {
        self.engine.store()
    }

    /// The phase's transaction, opened on first use. Its writes commit with
    /// the next recovery point, fenced by the generation. Never hold it
    /// across a foreign call.
    pub async fn tx(&mut self) -> Result<&mut DbTx> {
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
        let point = self.point.clone();
        let tx = self.tx.take();
        commit(self.engine, self.req, self.generation, &point, tx).await?;
        self.intent_committed = true;
        Ok(())
    }

    /// A hex digest stable for this request across retries, takeovers and
    /// restarts: SHA-256 of (caller, key, first-claim time, `label`). A key
    /// reused after its replay window is a new request with a new
    /// first-claim time, so it derives new values.
    pub fn derive(&self, label: &str) -> String {
        let mut h = Sha256::new();
        for part in [
            self.req.caller.as_bytes(),
            self.req.key.as_bytes(),
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

    /// Fires the request's failpoints armed at (`position`, `name`).
    pub async fn failpoint(&self, position: Position, name: &str) {
        self.engine
            .failpoints()
            .hit(&self.req.failpoints, position, name)
            .await;
    }
}

/// Fenced commit of `tx` (or of an empty transaction) at `point`, with the
/// recovery-point failpoints around it when the point moves.
async fn commit(
    engine: &Engine<Store>,
    req: &Pending,
    generation: i64,
    point: &str,
    tx: Option<DbTx>,
) -> Result<()> {
    let store = engine.store();
    let mut tx = match tx {
        Some(tx) => tx,
        None => store.begin().await?,
    };
    let now = engine.clock().now_ms();
    let lease = now.saturating_add(engine.lease_ms());
    if let Err(e) = store
        .commit_point(
            &mut tx,
            &req.caller,
            &req.key,
            generation,
            point,
            now,
            lease,
        )
        .await
    {
        tx.rollback().await?;
        tracing::warn!(caller = %req.caller, key = %req.key, generation, point, "phase commit fenced: the key was taken over");
        return Err(e);
    }
    tx.commit().await
}

/// Where a run starts.
pub(crate) enum Start<Tx> {
    /// A fresh claim: the first phase joins its transaction.
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
        req: &'a Pending,
        start: Start<K::Tx>,
        guard: RegistryGuard,
    ) -> BoxFut<'a, Result<Option<Response<Body>>>>;
}

struct Driven<M> {
    endpoint: M,
    replay_headers: Vec<HeaderName>,
}

impl<M: MultiStep> Driver<Store> for Driven<M> {
    fn run<'a>(
        &'a self,
        engine: &'a Engine<Store>,
        req: &'a Pending,
        start: Start<DbTx>,
        guard: RegistryGuard,
    ) -> BoxFut<'a, Result<Option<Response<Body>>>> {
        Box::pin(async move {
            let result = self.drive(engine, req, start).await;
            drop(guard);
            result
        })
    }
}

impl<M: MultiStep> Driven<M> {
    async fn drive(
        &self,
        engine: &Engine<Store>,
        req: &Pending,
        start: Start<DbTx>,
    ) -> Result<Option<Response<Body>>> {
        let store = engine.store();
        let (generation, created_at, mut point, mut tx) = match start {
            Start::Fresh(claimed, created_at) => (
                claimed.generation,
                created_at,
                RecoveryPoint::STARTED.to_owned(),
                Some(claimed.tx),
            ),
            Start::Resume => {
                let now = engine.clock().now_ms();
                let lease = now.saturating_add(engine.lease_ms());
                let Some(t) = store
                    .take_over(&req.caller, &req.key, &req.fingerprint, now, lease)
                    .await?
                else {
                    return Ok(None);
                };
                tracing::info!(caller = %req.caller, key = %req.key, generation = t.generation,
                    recovery_point = %t.recovery_point, "took over an expired lease; resuming");
                (t.generation, t.created_at, t.recovery_point, None)
            }
        };
        // Whether anything of this request is committed: if not, a failure
        // rolls back the claim itself and the key is absent again.
        let mut committed = tx.is_none();
        if !committed {
            self.failpoint(engine, req, Position::After, crate::failpoint::STARTED)
                .await;
            if Failpoints::injects_error(&req.failpoints) {
                let response = crate::engine::injected_error();
                return self
                    .finish(engine, req, generation, committed, tx, &point, response)
                    .await
                    .map(Some);
            }
        }
        for _ in 0..MAX_PHASES {
            let mut phase = Phase {
                engine,
                req,
                created_at,
                generation,
                point: point.clone(),
                tx: tx.take(),
                intent_committed: false,
            };
            tracing::debug!(caller = %req.caller, key = %req.key, generation, from = %point, "phase");
            let outcome = self.endpoint.phase(&point, &mut phase).await;
            let phase_tx = phase.tx.take();
            // An intent commit inside the phase committed the claim too.
            committed |= phase.intent_committed;
            drop(phase);
            let response = match outcome {
                Ok(Next::Commit(next)) => {
                    RecoveryPoint::new(next)
                        .map_err(|e| Error::Internal(format!("bad recovery point: {e}")))?;
                    let mut t = match phase_tx {
                        Some(t) => t,
                        None => store.begin().await?,
                    };
                    let now = engine.clock().now_ms();
                    let lease = now.saturating_add(engine.lease_ms());
                    if let Err(e) = store
                        .commit_point(&mut t, &req.caller, &req.key, generation, next, now, lease)
                        .await
                    {
                        t.rollback().await?;
                        tracing::warn!(caller = %req.caller, key = %req.key, generation, point = next,
                            "phase commit fenced: the key was taken over; nothing written");
                        return Err(e);
                    }
                    self.failpoint(engine, req, Position::Before, next).await;
                    t.commit().await?;
                    committed = true;
                    tracing::info!(caller = %req.caller, key = %req.key, generation, point = next, "recovery point committed");
                    self.failpoint(engine, req, Position::After, next).await;
                    point = next.to_owned();
                    continue;
                }
                Ok(Next::Finish(r)) => r,
                Err(e) => {
                    if e.to_problem(current_profile()).status < 500 {
                        axum::response::IntoResponse::into_response(e)
                    } else {
                        self.fail(engine, req, generation, committed, phase_tx, &point)
                            .await?;
                        return Err(e);
                    }
                }
            };
            return self
                .finish(
                    engine, req, generation, committed, phase_tx, &point, response,
                )
                .await
                .map(Some);
        }
        self.fail(engine, req, generation, committed, tx, &point)
            .await?;
        Err(Error::Internal(format!(
            "the endpoint ran more than {MAX_PHASES} phases"
        )))
    }

    async fn failpoint(&self, engine: &Engine<Store>, req: &Pending, pos: Position, name: &str) {
        engine.failpoints().hit(&req.failpoints, pos, name).await;
    }

    /// Stores a final response with the phase's writes (fenced), or treats a
    /// 5xx as a failure.
    #[allow(clippy::too_many_arguments)]
    async fn finish(
        &self,
        engine: &Engine<Store>,
        req: &Pending,
        generation: i64,
        committed: bool,
        tx: Option<DbTx>,
        point: &str,
        response: Response<Body>,
    ) -> Result<Response<Body>> {
        let (parts, body) = response.into_parts();
        let body = match axum::body::to_bytes(body, engine.config().max_response_bytes).await {
            Ok(b) => b,
            Err(e) => {
                self.fail(engine, req, generation, committed, tx, point)
                    .await?;
                return Err(Error::Internal(format!(
                    "endpoint response unreadable: {e}"
                )));
            }
        };
        let status = parts.status.as_u16();
        // FLAW(store-5xx): server errors are stored like final outcomes.
        if status >= 500 && !engine.config().flaws.on(crate::flaws::Flaw::Store5xx) {
            self.fail(engine, req, generation, committed, tx, point)
                .await?;
            return Ok(Response::from_parts(parts, Body::from(body)));
        }
        let stored = stored_response(status, &parts.headers, &self.replay_headers, &body);
        let store = engine.store();
        let mut t = match tx {
            Some(t) => t,
            None => store.begin().await?,
        };
        let now = engine.clock().now_ms();
        if let Err(e) = store
            .store_final(&mut t, &req.caller, &req.key, generation, &stored, now)
            .await
        {
            t.rollback().await?;
            tracing::warn!(caller = %req.caller, key = %req.key, generation,
                "final commit fenced: the key was taken over; nothing written");
            return Err(e);
        }
        self.failpoint(engine, req, Position::Before, RecoveryPoint::FINISHED)
            .await;
        t.commit().await?;
        self.failpoint(engine, req, Position::After, RecoveryPoint::FINISHED)
            .await;
        tracing::info!(caller = %req.caller, key = %req.key, generation, status, "multi-step request finished");
        Ok(Response::from_parts(parts, Body::from(body)))
    }

    /// A transient failure: roll the phase back; if nothing was ever
    /// committed the claim goes with it, otherwise end the lease so a retry
    /// resumes at the last recovery point at once.
    async fn fail(
        &self,
        engine: &Engine<Store>,
        req: &Pending,
        generation: i64,
        committed: bool,
        tx: Option<DbTx>,
        point: &str,
    ) -> Result<()> {
        if let Some(t) = tx {
            t.rollback().await?;
        }
        if committed {
            let now = engine.clock().now_ms();
            engine
                .store()
                .release_lease(&req.caller, &req.key, generation, now)
                .await?;
            tracing::info!(caller = %req.caller, key = %req.key, generation, recovery_point = point,
                "transient failure: not stored; key unlocked at its last recovery point");
        }
        Ok(())
    }
}

/// A [`MultiStep`] endpoint bound to an engine, a method and a path: an
/// axum handler, and something the completer can resume.
#[derive(Clone)]
pub struct MultiStepEndpoint {
    engine: Engine<Store>,
    driver: Arc<dyn Driver<Store>>,
    method: String,
    path: String,
}

impl std::fmt::Debug for MultiStepEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiStepEndpoint")
            .field("method", &self.method)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl MultiStepEndpoint {
    /// Binds `endpoint` to `method` and `path` (the path the completer
    /// matches stored requests against).
    pub fn new<M: MultiStep>(engine: Engine<Store>, method: &str, path: &str, endpoint: M) -> Self {
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

    /// Serves one request: replay, 409, or run/resume its phases.
    pub async fn handle(&self, req: Request<Body>) -> Response<Body> {
        self.engine
            .handle_multistep(req, self.driver.as_ref())
            .await
    }

    /// Whether a stored request belongs to this endpoint.
    pub fn matches(&self, method: &str, path: &str) -> bool {
        self.method.eq_ignore_ascii_case(method) && self.path == path
    }

    /// Drives an abandoned key to its end without a client. `Ok(None)` when
    /// another worker took it first.
    pub async fn complete(&self, key: &AbandonedKey) -> Result<Option<Response<Body>>> {
        self.engine
            .resume_abandoned(key, self.driver.as_ref())
            .await
    }
}
