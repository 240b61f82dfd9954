//! The single-phase route: the [`IdempotencyLayer`](crate::IdempotencyLayer)'s
//! endpoint, run once in one transaction that commits its writes with the
//! key's claim and final record, or rolls all of them back.
//!
//! The store decides when that transaction opens
//! ([`KeyStore::begin_single`]): PostgreSQL's is open from the observation,
//! its `BEGIN` taking the key's advisory lock in the same message (the lock
//! is what shows other processes the key in flight); SQLite's is opened
//! by the endpoint's first [`IdemTx::lock`], so time spent before the first
//! write holds nothing another key needs.

use std::convert::Infallible;
use std::future::Future;

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderName, Request, Response};
use idem_spec::{KeyState, RecoveryPoint};
use tracing::Instrument;

use crate::clock::Millis;
use crate::engine::{Acted, Engine, Route};
use crate::error::{Error, Result};
use crate::failpoint::{Failpoints, Position};
use crate::registry::RegistryGuard;
use crate::request::Incoming;
use crate::settle::{Recorded, injected_error};
use crate::store::{ClaimRequest, KeyRecord, KeyStore, SingleTx, stored_response};
use crate::tx::{Finished, IdemTx};

/// One request on a single-phase endpoint, not yet executed.
pub(crate) struct Single<'h, S> {
    /// The endpoint and the request's head, until it runs: a request runs
    /// its endpoint at most once, even when it then loses its final write.
    pending: Option<(S, Parts)>,
    replay_headers: &'h [HeaderName],
}

impl<'h, S> Single<'h, S> {
    pub(crate) fn new(inner: S, parts: Parts, replay_headers: &'h [HeaderName]) -> Self {
        Self {
            pending: Some((inner, parts)),
            replay_headers,
        }
    }
}

impl<K: KeyStore> Engine<K> {
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
        self.handle_with(req, |parts| Single::new(inner, parts, replay_headers))
            .await
    }
}

impl<K, S> Route<K> for Single<'_, S>
where
    K: KeyStore,
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send,
    S::Future: Send,
{
    fn phased(&self) -> bool {
        false
    }

    async fn claim<'a>(
        &'a mut self,
        engine: &'a Engine<K>,
        incoming: &'a Incoming,
        claim: ClaimRequest<'a>,
        observed: Option<K::Tx>,
        guard: RegistryGuard,
    ) -> Result<Acted> {
        let tx = match observed {
            Some(tx) => SingleTx::Open(tx),
            None => engine.store().begin_single(&claim).await?,
        };
        match tx {
            SingleTx::Busy => return Ok(Acted::Busy),
            // A record committed since the observation: answer from it.
            SingleTx::Taken => return Ok(Acted::LostRace),
            SingleTx::Open(_) | SingleTx::Deferred => {}
        }
        let Some((inner, parts)) = self.pending.take() else {
            // It ran once and lost its commit, yet no record of this key
            // stands in the way: it lost to another key's transaction (a
            // Galera certification conflict on a shared business row), or
            // the winner's record is already replaceable again (reaped, or
            // its window over). Nothing of it was written, and a request
            // never executes twice, so it is answered as the conflict it
            // was: the store's retryable 503 with `Retry-After` (not "key
            // in use": no request holds this key).
            if let SingleTx::Open(tx) = tx {
                engine.store().rollback(tx).await?;
            }
            return Err(Error::Conflict);
        };
        let acted = execute(
            engine,
            incoming,
            tx,
            &claim,
            parts,
            inner,
            self.replay_headers,
        )
        .await;
        drop(guard);
        acted
    }

    fn resume<'a>(
        &'a mut self,
        _engine: &'a Engine<K>,
        _incoming: &'a Incoming,
        _guard: RegistryGuard,
    ) -> impl Future<Output = Result<Acted>> + Send + 'a {
        std::future::ready(Err(Error::Internal(
            "resume on a single-phase route".into(),
        )))
    }
}

/// Runs the endpoint in `tx` (open, or opened by its first
/// [`IdemTx::lock`]) and settles: a final outcome is claimed and recorded
/// in one statement and committed with the endpoint's writes; anything
/// else rolls back with nothing stored.
///
/// This is where "a first execution costs one transaction and one key
/// write" holds. [`Acted::LostRace`]: the final write lost to a record
/// committed meanwhile; everything was rolled back, and the engine answers
/// from that record.
async fn execute<K, S>(
    engine: &Engine<K>,
    incoming: &Incoming,
    tx: SingleTx<K::Tx>,
    claim: &ClaimRequest<'_>,
    mut parts: Parts,
    inner: S,
    replay_headers: &[HeaderName],
) -> Result<Acted>
where
    K: KeyStore,
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Send,
    S::Future: Send,
{
    tracing::debug!(key_hash = %incoming.id, "claimed; executing");
    let slot = match tx {
        SingleTx::Open(tx) => IdemTx::<K>::new(tx),
        SingleTx::Deferred => IdemTx::<K>::deferred(engine.store().clone()),
        SingleTx::Busy => return Ok(Acted::Busy),
        SingleTx::Taken => return Ok(Acted::LostRace),
    };
    parts.extensions.insert(slot.clone());
    engine
        .hit(incoming, Position::After, RecoveryPoint::STARTED)
        .await;
    // A single-phase request may not hold its key longer than its lease:
    // past it, the endpoint's future is dropped, its writes are rolled back
    // and the client gets a retryable 500. (On SQLite this also bounds how
    // long one request can hold the writer.)
    let response = if Failpoints::injects_error(&incoming.armed) {
        // The injected server error stands in for the endpoint and goes
        // through the same failure policy as a real one.
        Ok(injected_error(engine.config().profile))
    } else {
        let request = Request::from_parts(parts, Body::from(incoming.request.body.clone()));
        tokio::time::timeout(engine.config().lease, call(inner, request))
            .instrument(tracing::trace_span!("idem.endpoint"))
            .await
    };
    let (response, tx) = match (response, slot.finish().await) {
        (Ok(r), Finished::Open(tx)) => (r, Some(tx)),
        (Ok(r), Finished::Unopened) => (r, None),
        (Err(_), finished) => {
            if let Finished::Open(tx) = finished {
                engine.store().rollback(tx).await?;
            }
            return Err(Error::Internal(format!(
                "the endpoint did not finish within its lease of {} s",
                engine.config().lease.as_secs()
            )));
        }
        (Ok(_), Finished::Gone) => {
            return Err(Error::Internal(
                "the endpoint kept or consumed the idempotency transaction".into(),
            ));
        }
    };
    let (parts, body) = response.into_parts();
    let limit = engine.config().max_response_bytes;
    let body = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(e) => {
            if let Some(tx) = tx {
                engine.store().rollback(tx).await?;
            }
            return Err(crate::settle::unreadable_response(incoming, e, limit));
        }
    };
    let status = parts.status.as_u16();
    if !engine.is_final(status) {
        // Never stored (clause idem.failure.5xx-not-stored): the key is
        // absent again.
        if let Some(tx) = tx {
            engine.store().rollback(tx).await?;
        }
        // Where a peer can commit this key while our claim is open (a
        // Galera node), the failure may be this request losing to it: the
        // winner's write set aborted our statement. When the key now has a
        // winner, answer from it, as after a commit lost to it.
        if engine.store().peers_can_commit_during_claim()
            && let Ok(Some(record)) = engine.store().lookup(&incoming.id).await
            && has_winner(&record, engine.clock().now_ms())
        {
            tracing::info!(key_hash = %incoming.id, status,
                "endpoint failed while a peer won the key; answering from the winner");
            return Ok(Acted::LostRace);
        }
        tracing::info!(key_hash = %incoming.id, status, "server error: not stored; key released");
        return Ok(Acted::Answered(Response::from_parts(
            parts,
            Body::from(body),
        )));
    }
    let stored = stored_response(status, &parts.headers, replay_headers, &body);
    // An endpoint that wrote nothing still records its outcome, in a
    // transaction of its own (on SQLite: the writer, for one statement).
    let tx = match tx {
        Some(tx) => tx,
        None => {
            engine
                .store()
                .begin()
                .instrument(tracing::trace_span!("idem.begin"))
                .await?
        }
    };
    let recorded = engine
        .record_single(incoming, tx, claim, &stored)
        .instrument(tracing::trace_span!("idem.record"))
        .await?;
    Ok(match recorded {
        Recorded::Committed => Acted::Answered(Response::from_parts(parts, Body::from(body))),
        Recorded::Lost => Acted::LostRace,
    })
}

/// Whether `record` belongs to a request that won the key: complete and
/// replayable, or in flight under a live lease. An older record this
/// request's (rolled back) claim would have replaced is neither.
fn has_winner(record: &KeyRecord, now: Millis) -> bool {
    record.replayable(now)
        || (record.state == KeyState::InFlight
            && record.lease_expires_at.is_some_and(|end| now < end))
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
