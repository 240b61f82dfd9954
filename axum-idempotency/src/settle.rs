//! Settling a claimed request: what both routes do once they have a
//! response. A final outcome (2xx/4xx) is stored with the request's last
//! writes and committed, fenced by the key's generation; anything else
//! rolls back and releases the key, so a retry re-executes or resumes
//! (clauses `idem.failure.final-outcomes`, `idem.failure.5xx-not-stored`).
//!
//! The single-phase route ([`crate::single`]) settles with
//! [`Engine::record_single`] (claim and record in one write, the store's
//! single-phase protocol); the multi-step route ([`crate::multistep`]) with
//! [`Engine::settle`] and commits every phase with
//! [`Engine::commit_fenced`].

use axum::body::Body;
use axum::http::{HeaderName, Response};
use idem_spec::{Profile, RecoveryPoint};

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::failpoint::Position;
use crate::key::Fence;
use crate::request::Incoming;
use crate::store::{ClaimRequest, FencedWrite, KeyStore, StoredResponse, stored_response};

/// How a single-phase request's final write went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// Claimed, recorded and committed with the endpoint's writes.
    Committed,
    /// A record committed meanwhile may not be replaced (a concurrent
    /// request won the key): everything was rolled back.
    Lost,
}

impl<K: KeyStore> Engine<K> {
    /// The end of a single-phase request with a final outcome: in `tx`,
    /// which carries the endpoint's writes, claims the key and records
    /// `stored` in one statement, then commits all of it. A record
    /// committed meanwhile that may not be replaced makes it roll back
    /// ([`Recorded::Lost`]); a store error rolls back too.
    pub(crate) async fn record_single(
        &self,
        incoming: &Incoming,
        tx: K::Tx,
        claim: &ClaimRequest<'_>,
        stored: &StoredResponse,
    ) -> Result<Recorded> {
        let now = self.clock().now_ms();
        // A request armed to stop between its final write and the commit
        // (`before=finished`, test hooks only) needs that moment to exist;
        // every other one lets the store send both at once.
        let outcome = if self.armed_at(incoming, Position::Before, RecoveryPoint::FINISHED) {
            self.record_then_commit(incoming, tx, claim, stored, now)
                .await
        } else {
            self.store()
                .record_final_and_commit(tx, claim, stored, now)
                .await
        };
        match outcome {
            Ok(Some(generation)) => {
                tracing::debug!(key_hash = %incoming.id, generation, status = stored.status,
                    "final outcome stored and committed");
            }
            Ok(None) => {
                tracing::info!(
                    key_hash = %incoming.id,
                    "lost the final write to a record committed meanwhile; rolled back"
                );
                return Ok(Recorded::Lost);
            }
            // The database chose this transaction as a deadlock victim, or
            // refused its commit because a concurrent transaction won (a
            // Galera certification conflict: two nodes claimed the key at
            // once): nothing of this request was written; observe again and
            // replay the winner.
            Err(Error::Conflict) => {
                tracing::info!(
                    key_hash = %incoming.id,
                    "final write lost to a concurrent transaction; rolled back, observing again"
                );
                return Ok(Recorded::Lost);
            }
            Err(e) => return Err(e),
        }
        self.hit(incoming, Position::After, RecoveryPoint::FINISHED)
            .await;
        Ok(Recorded::Committed)
    }

    /// [`KeyStore::record_final_and_commit`]'s default, with the
    /// `before=finished` hook between the final write and the commit.
    async fn record_then_commit(
        &self,
        incoming: &Incoming,
        mut tx: K::Tx,
        claim: &ClaimRequest<'_>,
        stored: &StoredResponse,
        now: crate::clock::Millis,
    ) -> Result<Option<i64>> {
        let generation = match self.store().record_final(&mut tx, claim, stored, now).await {
            Ok(Some(generation)) => generation,
            Ok(None) => {
                self.store().rollback(tx).await?;
                return Ok(None);
            }
            Err(Error::Conflict) => {
                let _ = self.store().rollback(tx).await;
                return Err(Error::Conflict);
            }
            Err(e) => {
                self.store().rollback(tx).await?;
                return Err(e);
            }
        };
        self.hit(incoming, Position::Before, RecoveryPoint::FINISHED)
            .await;
        self.store().commit(tx).await?;
        Ok(Some(generation))
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
        let limit = self.config().max_response_bytes;
        let body = match axum::body::to_bytes(body, limit).await {
            Ok(b) => b,
            Err(e) => {
                self.fail(fence, tx, fresh).await?;
                return Err(unreadable_response(incoming, e, limit));
            }
        };
        let status = parts.status.as_u16();
        if self.is_final(status) {
            let stored = stored_response(status, &parts.headers, replay_headers, &body);
            let tx = match tx {
                Some(tx) => tx,
                None => self.store().begin().await?,
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
            self.store().rollback(tx).await?;
        }
        if !fresh {
            self.store()
                .release_lease(fence, self.clock().now_ms())
                .await?;
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
        let now = self.clock().now_ms();
        if let Err(e) = self.store().write_fenced(&mut tx, fence, write, now).await {
            self.store().rollback(tx).await?;
            if matches!(e, Error::Fenced) {
                tracing::warn!(%fence, "commit fenced: the key was taken over; nothing written");
            }
            return Err(e);
        }
        if let Some(name) = name {
            self.hit(req, Position::Before, name).await;
        }
        self.store().commit(tx).await?;
        if let Some(name) = name {
            self.hit(req, Position::After, name).await;
        }
        Ok(())
    }
}

/// The 500 an `error-after=started` failpoint answers instead of the endpoint.
pub(crate) fn injected_error(profile: Profile) -> Response<Body> {
    Error::Internal("server error injected by Idem-Failpoint: error-after=started".into())
        .into_response_in(profile)
}

/// The error for an endpoint response the engine could not read whole:
/// [`Error::ResponseTooLarge`] (logged at WARN: an endpoint that can never
/// succeed until `max_response_bytes` or the endpoint changes) when it
/// outgrew `limit`, an internal error otherwise.
pub(crate) fn unreadable_response(incoming: &Incoming, e: axum::Error, limit: usize) -> Error {
    let e = e.into_inner();
    if e.downcast_ref::<http_body_util::LengthLimitError>()
        .is_some()
    {
        tracing::warn!(
            key_hash = %incoming.id,
            path = %incoming.request.path,
            limit,
            "endpoint response larger than EngineConfig::max_response_bytes: not stored, \
             writes rolled back, answered 500 and the key released"
        );
        Error::ResponseTooLarge { limit }
    } else {
        Error::Internal(format!("endpoint response unreadable: {e}"))
    }
}
