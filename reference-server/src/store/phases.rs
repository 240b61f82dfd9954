//! The store side of multi-step requests: phase commits fenced by the
//! generation, taking over an expired lease, releasing a lease, and finding
//! abandoned keys for the completer.
//!
//! Every statement that changes a claimed key carries
//! `generation = $current` in its `WHERE` (clause `idem.lease.fencing`). It
//! runs inside the phase's transaction, *with* the phase's writes, so a
//! refused guard ([`Error::Fenced`]) rolls those writes back too: a worker
//! that lost its key can change nothing. On PostgreSQL the `UPDATE` takes
//! the key row's lock, so a takeover and a stale phase commit are ordered
//! by the database; READ COMMITTED re-evaluates the guard after the wait.

use sqlx::Row;

use super::{COMPLETE_SQL, DbTx, Store, StoredResponse, headers_json};
use crate::clock::Millis;
use crate::error::{Error, Result};
use crate::{with_conn, with_pool};

/// What a takeover won.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenOver {
    /// The new fencing generation (the old one plus one).
    pub generation: i64,
    /// The last committed recovery point: where to resume.
    pub recovery_point: String,
    /// When the request was first claimed (stable across takeovers; derived
    /// ids and outbound keys are computed from it).
    pub created_at: Millis,
}

/// An in-flight key whose lease has expired, with the original request, so
/// the completer can finish it without the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbandonedKey {
    /// The caller (scope).
    pub caller: String,
    /// The key.
    pub key: String,
    /// The request fingerprint (hex).
    pub fingerprint: String,
    /// Last committed recovery point.
    pub recovery_point: String,
    /// Original method.
    pub method: String,
    /// Original path (with query).
    pub path: String,
    /// Original `Content-Type`.
    pub content_type: Option<String>,
    /// Original body.
    pub body: Vec<u8>,
}

// ANCHOR: lease_fencing
/// Take over an in-flight key whose lease has expired, at whatever recovery
/// point it stopped (clause `idem.lease.takeover`): bump the generation and
/// start a fresh lease, keeping the recovery point and the original request.
/// Allowed until the key's retention ends, past its replay window too
/// (clause `idem.window.progress`).
const TAKE_OVER_SQL: &str = "UPDATE idempotency_keys SET generation = generation + 1, \
     locked_at = $3, lease_expires_at = $4 \
     WHERE caller = $1 AND idem_key = $2 AND fingerprint = $5 AND state = 'in_flight' \
       AND lease_expires_at <= $3 AND expires_at > $3 \
     RETURNING generation, recovery_point, created_at";

/// A phase commit: the new recovery point and a fresh lease, fenced.
const COMMIT_POINT_SQL: &str = "UPDATE idempotency_keys SET recovery_point = $4, \
     locked_at = $5, lease_expires_at = $6 \
     WHERE caller = $1 AND idem_key = $2 AND generation = $3 AND state = 'in_flight'";
// ANCHOR_END: lease_fencing

/// Unlocks the key at its last recovery point (the lease ends now), fenced.
const RELEASE_SQL: &str = "UPDATE idempotency_keys SET locked_at = NULL, lease_expires_at = $4 \
     WHERE caller = $1 AND idem_key = $2 AND generation = $3 AND state = 'in_flight'";

/// Keys a completer may drive: committed progress, lease over, retention
/// not over. The replay window does not end this: a key with committed
/// progress is finished, never replaced (clause `idem.window.progress`).
const ABANDONED_SQL: &str = "SELECT caller, idem_key, fingerprint, recovery_point, request_method, \
     request_path, request_content_type, request_body FROM idempotency_keys \
     WHERE state = 'in_flight' AND recovery_point <> 'started' AND lease_expires_at <= $1 \
       AND expires_at > $1 \
     ORDER BY lease_expires_at LIMIT $2";

impl Store {
    /// Takes over (caller, key) if it is in flight with an expired lease
    /// and the same fingerprint, in its own short transaction. `None` when
    /// it is not (someone else holds or took it, or it completed).
    pub async fn take_over(
        &self,
        caller: &str,
        key: &str,
        fingerprint: &str,
        now: Millis,
        lease_expires_at: Millis,
    ) -> Result<Option<TakenOver>> {
        let mut tx = self.begin().await?;
        let taken = with_conn!(&mut tx, c => {
            let row = sqlx::query(TAKE_OVER_SQL)
                .bind(caller)
                .bind(key)
                .bind(now)
                .bind(lease_expires_at)
                .bind(fingerprint)
                .fetch_optional(&mut *c)
                .await?;
            match row {
                Some(r) => Some(TakenOver {
                    generation: r.try_get("generation")?,
                    recovery_point: r.try_get("recovery_point")?,
                    created_at: r.try_get("created_at")?,
                }),
                None => None,
            }
        });
        tx.commit().await?;
        Ok(taken)
    }

    /// Inside `tx`: moves the key to `point` with a lease ending at
    /// `lease_expires_at`, if `generation` is still current. The caller
    /// commits `tx`; on [`Error::Fenced`] it must roll it back.
    // The key's identity, its fence and the two times are all needed; a
    // struct for one call site would only rename them.
    #[allow(clippy::too_many_arguments)]
    pub async fn commit_point(
        &self,
        tx: &mut DbTx,
        caller: &str,
        key: &str,
        generation: i64,
        point: &str,
        now: Millis,
        lease_expires_at: Millis,
    ) -> Result<()> {
        let updated = with_conn!(tx, c => {
            sqlx::query(COMMIT_POINT_SQL)
                .bind(caller)
                .bind(key)
                .bind(generation)
                .bind(point)
                .bind(now)
                .bind(lease_expires_at)
                .execute(&mut *c)
                .await?
                .rows_affected()
        });
        if updated == 1 {
            Ok(())
        } else {
            Err(Error::Fenced)
        }
    }

    /// Inside `tx`: stores the final response (recovery point `finished`),
    /// if `generation` is still current. The caller commits `tx`.
    pub async fn store_final(
        &self,
        tx: &mut DbTx,
        caller: &str,
        key: &str,
        generation: i64,
        response: &StoredResponse,
        now: Millis,
    ) -> Result<()> {
        let headers = headers_json(response)?;
        let updated = with_conn!(tx, c => {
            sqlx::query(COMPLETE_SQL)
                .bind(now)
                .bind(i64::from(response.status))
                .bind(&headers)
                .bind(&response.body)
                .bind(caller)
                .bind(key)
                .bind(generation)
                .execute(&mut *c)
                .await?
                .rows_affected()
        });
        if updated == 1 {
            Ok(())
        } else {
            Err(Error::Fenced)
        }
    }

    /// Ends the lease now, leaving the key in flight at its last recovery
    /// point, so a retry (or the completer) can resume at once. A no-op when
    /// `generation` is no longer current.
    pub async fn release_lease(
        &self,
        caller: &str,
        key: &str,
        generation: i64,
        now: Millis,
    ) -> Result<bool> {
        let mut tx = self.begin().await?;
        let updated = with_conn!(&mut tx, c => {
            sqlx::query(RELEASE_SQL)
                .bind(caller)
                .bind(key)
                .bind(generation)
                .bind(now)
                .execute(&mut *c)
                .await?
                .rows_affected()
        });
        tx.commit().await?;
        Ok(updated == 1)
    }

    /// Up to `limit` in-flight keys with committed progress whose lease
    /// ended by `now`, oldest lease first.
    pub async fn abandoned(&self, now: Millis, limit: i64) -> Result<Vec<AbandonedKey>> {
        with_pool!(self, p => {
            let rows = sqlx::query(ABANDONED_SQL).bind(now).bind(limit).fetch_all(p).await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push(AbandonedKey {
                    caller: r.try_get("caller")?,
                    key: r.try_get("idem_key")?,
                    fingerprint: r.try_get("fingerprint")?,
                    recovery_point: r.try_get("recovery_point")?,
                    method: r.try_get("request_method")?,
                    path: r.try_get("request_path")?,
                    content_type: r.try_get("request_content_type")?,
                    body: r.try_get::<Option<Vec<u8>>, _>("request_body")?.unwrap_or_default(),
                });
            }
            Ok(out)
        })
    }
}
