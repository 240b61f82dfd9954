//! The SQL of every store operation, written once.
//!
//! Both drivers accept the same text (`$1` placeholders, `INSERT ... ON
//! CONFLICT ... RETURNING`, `BIGINT`/`TEXT` columns), so each operation is
//! one function body, expanded by [`ops!`] for `SqliteConnection` and for
//! `PgConnection`. What genuinely differs between the backends (opening a
//! write transaction, the claim's advisory lock) lives in
//! [`super::sqlite`] and [`super::postgres`].

// The MySQL store shares only the row decoding; alone, it leaves the rest unused.
#![cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    allow(dead_code, unused_imports, unused_macros)
)]

use idem_spec::{Fingerprint, KeyState, RecoveryPoint};
use sqlx::Row;

use super::{
    AbandonedKey, ClaimRequest, FencedWrite, KeyRecord, ReapBatch, StoredRequest, StoredResponse,
    TakenOver, Unfinished,
};
use crate::error::{Error, Result};
use crate::key::{Fence, KeyId};

pub(crate) const LOOKUP_SQL: &str = "SELECT fingerprint, state, recovery_point, generation, \
     lease_expires_at, created_at, replay_until, expires_at, response_status, response_headers, \
     response_body FROM idempotency_keys WHERE caller = $1 AND idem_key = $2";

// ANCHOR: claim
/// The claim: one statement, arbitrated by the primary key on
/// (caller, idem_key). A fresh key is inserted; an existing row is taken over
/// only when it is complete and its replay window is over (a brand-new
/// request, clause `idem.window.expiry`) or when it is in flight at `started`
/// with an expired lease (its owner died before doing anything durable). A
/// row in flight past `started` holds committed progress and is never
/// replaced, whatever its window (clause `idem.window.progress`): it is taken
/// over and resumed instead. In every other case the `WHERE` is false,
/// nothing changes and `RETURNING` yields no row.
const CLAIM_SQL: &str = "INSERT INTO idempotency_keys (caller, idem_key, fingerprint, state, \
     recovery_point, generation, locked_at, lease_expires_at, created_at, replay_until, expires_at, \
     request_method, request_path, request_content_type, request_body) \
     VALUES ($1, $2, $3, 'in_flight', 'started', 1, $4, $5, $4, $6, $7, $8, $9, $10, $11) \
     ON CONFLICT (caller, idem_key) DO UPDATE SET \
       fingerprint = excluded.fingerprint, state = 'in_flight', recovery_point = 'started', \
       generation = idempotency_keys.generation + 1, locked_at = excluded.locked_at, \
       lease_expires_at = excluded.lease_expires_at, created_at = excluded.created_at, \
       replay_until = excluded.replay_until, expires_at = excluded.expires_at, completed_at = NULL, \
       request_method = excluded.request_method, request_path = excluded.request_path, \
       request_content_type = excluded.request_content_type, request_body = excluded.request_body, \
       response_status = NULL, response_headers = NULL, response_body = NULL \
     WHERE (idempotency_keys.state = 'complete' AND idempotency_keys.replay_until <= excluded.created_at) \
        OR (idempotency_keys.state = 'in_flight' AND idempotency_keys.recovery_point = 'started' \
            AND idempotency_keys.lease_expires_at <= excluded.created_at) \
     RETURNING generation";
// ANCHOR_END: claim

// ANCHOR: claim_final
/// The single-phase claim: claims the key *and* records its final response
/// in one statement, at the end of the transaction that carries the
/// endpoint's writes (see "The single-phase protocol" in the store docs).
/// Arbitrated by the primary key exactly like the claim above, with the same
/// `WHERE`: a fresh key is inserted complete; an existing row is replaced
/// only when its window is over or it is in flight at `started` with an
/// expired lease. Otherwise (someone else's record committed meanwhile)
/// nothing changes, `RETURNING` yields no row, and the caller rolls the
/// whole transaction back, the endpoint's writes with it.
const CLAIM_FINAL_SQL: &str = "INSERT INTO idempotency_keys (caller, idem_key, fingerprint, state, \
     recovery_point, generation, locked_at, lease_expires_at, created_at, replay_until, expires_at, \
     completed_at, request_method, request_path, request_content_type, request_body, \
     response_status, response_headers, response_body) \
     VALUES ($1, $2, $3, 'complete', 'finished', 1, NULL, NULL, $4, $5, $6, $7, $8, $9, $10, $11, \
             $12, $13, $14) \
     ON CONFLICT (caller, idem_key) DO UPDATE SET \
       fingerprint = excluded.fingerprint, state = 'complete', recovery_point = 'finished', \
       generation = idempotency_keys.generation + 1, locked_at = NULL, lease_expires_at = NULL, \
       created_at = excluded.created_at, replay_until = excluded.replay_until, \
       expires_at = excluded.expires_at, completed_at = excluded.completed_at, \
       request_method = excluded.request_method, request_path = excluded.request_path, \
       request_content_type = excluded.request_content_type, request_body = excluded.request_body, \
       response_status = excluded.response_status, response_headers = excluded.response_headers, \
       response_body = excluded.response_body \
     WHERE (idempotency_keys.state = 'complete' AND idempotency_keys.replay_until <= excluded.created_at) \
        OR (idempotency_keys.state = 'in_flight' AND idempotency_keys.recovery_point = 'started' \
            AND idempotency_keys.lease_expires_at <= excluded.created_at) \
     RETURNING generation";
// ANCHOR_END: claim_final

/// The final write is fenced: it only touches the row if this request's
/// generation is still the current one (clause `idem.lease.fencing`). A key
/// finished after its replay window (resumed under `idem.window.progress`)
/// is replayed until its retention ends, so that the finished request is
/// never re-executed by the next retry.
const COMPLETE_SQL: &str = "UPDATE idempotency_keys SET state = 'complete', \
     recovery_point = 'finished', completed_at = $1, locked_at = NULL, lease_expires_at = NULL, \
     replay_until = CASE WHEN replay_until <= $1 THEN expires_at ELSE replay_until END, \
     response_status = $2, response_headers = $3, response_body = $4 \
     WHERE caller = $5 AND idem_key = $6 AND generation = $7 AND state = 'in_flight'";

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

/// The heartbeat: a fresh lease for a key its worker still holds, fenced.
/// `locked_at IS NOT NULL` keeps a heartbeat that raced a release (the key
/// was just unlocked for a retry) from locking it again.
const RENEW_SQL: &str = "UPDATE idempotency_keys SET locked_at = $4, lease_expires_at = $5 \
     WHERE caller = $1 AND idem_key = $2 AND generation = $3 AND state = 'in_flight' \
     AND locked_at IS NOT NULL";

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

/// The completer's queue counted: the same predicate as [`ABANDONED_SQL`].
const ORPHANS_SQL: &str = "SELECT COUNT(*), MIN(lease_expires_at) FROM idempotency_keys \
     WHERE state = 'in_flight' AND recovery_point <> 'started' AND lease_expires_at <= $1 \
       AND expires_at > $1";

/// The oldest retention end the reaper has not deleted yet.
const OLDEST_EXPIRED_SQL: &str =
    "SELECT MIN(expires_at) FROM idempotency_keys WHERE expires_at <= $1";

/// One reaper batch: at most `$2` records past retention, oldest first,
/// deleted in one statement that says which ones (and which were still in
/// flight), so the transaction that holds the table is short whatever the
/// backlog (clause `idem.reaper.retention`).
const REAP_BATCH_SQL: &str = "DELETE FROM idempotency_keys WHERE (caller, idem_key) IN \
     (SELECT caller, idem_key FROM idempotency_keys WHERE expires_at <= $1 \
      ORDER BY expires_at LIMIT $2) \
     RETURNING caller, idem_key, state, recovery_point";

const STAGE_SQL: &str = "INSERT INTO staged_jobs (kind, payload, created_at) VALUES ($1, $2, $3)";
const STAGED_SQL: &str = "SELECT id, kind, payload FROM staged_jobs ORDER BY id LIMIT $1";
const DELETE_JOB_SQL: &str = "DELETE FROM staged_jobs WHERE id = $1";

pub(crate) fn fingerprint(hex: &str) -> Result<Fingerprint> {
    Fingerprint::from_hex(hex)
        .ok_or_else(|| Error::Internal(format!("stored fingerprint {hex:?} unreadable")))
}

pub(crate) fn point(name: String) -> Result<RecoveryPoint> {
    RecoveryPoint::new(name).map_err(|e| Error::Internal(format!("stored recovery point: {e}")))
}

pub(crate) fn headers_json(response: &StoredResponse) -> Result<String> {
    serde_json::to_string(&response.headers)
        .map_err(|e| Error::Internal(format!("cannot serialise headers: {e}")))
}

pub(crate) fn decode_record<R>(row: &R) -> Result<KeyRecord>
where
    R: Row,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> i64: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> Vec<u8>: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    let state: String = row.try_get("state")?;
    let state = match state.as_str() {
        "complete" => KeyState::Complete,
        "in_flight" => KeyState::InFlight,
        other => {
            return Err(Error::Internal(format!(
                "unknown key state {other:?} in store"
            )));
        }
    };
    let status: Option<i64> = row.try_get("response_status")?;
    let headers: Option<String> = row.try_get("response_headers")?;
    let body: Option<Vec<u8>> = row.try_get("response_body")?;
    let response = match (state, status) {
        (KeyState::Complete, Some(status)) => Some(StoredResponse {
            status: u16::try_from(status)
                .map_err(|_| Error::Internal(format!("stored status {status} out of range")))?,
            headers: match headers {
                Some(h) => serde_json::from_str(&h)
                    .map_err(|e| Error::Internal(format!("stored headers unreadable: {e}")))?,
                None => Vec::new(),
            },
            body: body.unwrap_or_default(),
        }),
        _ => None,
    };
    Ok(KeyRecord {
        fingerprint: fingerprint(&row.try_get::<String, _>("fingerprint")?)?,
        state,
        recovery_point: point(row.try_get("recovery_point")?)?,
        generation: row.try_get("generation")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        created_at: row.try_get("created_at")?,
        replay_until: row.try_get("replay_until")?,
        expires_at: row.try_get("expires_at")?,
        response,
    })
}

/// A job staged in the same transaction as the writes that need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedJob {
    /// Its id, increasing in staging order (a delivery target keys on it to
    /// absorb a redelivery).
    pub id: i64,
    /// What kind of job it is (the application's name for it).
    pub kind: String,
    /// Its payload, as staged (JSON text by convention).
    pub payload: String,
}

/// Expands every operation for one connection type.
macro_rules! ops {
    ($conn:ty) => {
        use super::*;

        pub(crate) async fn lookup(c: &mut $conn, id: &KeyId) -> Result<Option<KeyRecord>> {
            let row = sqlx::query(LOOKUP_SQL)
                .bind(id.caller().as_str())
                .bind(id.key().as_str())
                .fetch_optional(&mut *c)
                .await?;
            row.as_ref().map(decode_record).transpose()
        }

        /// The claim statement; `Some(generation)` when it claimed.
        pub(crate) async fn claim(c: &mut $conn, req: &ClaimRequest<'_>) -> Result<Option<i64>> {
            Ok(sqlx::query_scalar(CLAIM_SQL)
                .bind(req.id.caller().as_str())
                .bind(req.id.key().as_str())
                .bind(req.fingerprint.to_hex())
                .bind(req.now)
                .bind(req.lease_expires_at)
                .bind(req.replay_until)
                .bind(req.expires_at)
                .bind(&req.request.method)
                .bind(&req.request.path)
                .bind(req.request.content_type.as_deref())
                .bind(req.request.body.as_ref())
                .fetch_optional(&mut *c)
                .await?)
        }

        /// The single-phase claim-and-record; `Some(generation)` when it
        /// wrote. A request finished after its replay window (a paused
        /// request, a moved test clock) is replayed until its retention
        /// ends, as [`COMPLETE_SQL`] does.
        pub(crate) async fn claim_final(
            c: &mut $conn,
            req: &ClaimRequest<'_>,
            response: &StoredResponse,
            now: i64,
        ) -> Result<Option<i64>> {
            let replay_until = if req.replay_until <= now {
                req.expires_at
            } else {
                req.replay_until
            };
            Ok(sqlx::query_scalar(CLAIM_FINAL_SQL)
                .bind(req.id.caller().as_str())
                .bind(req.id.key().as_str())
                .bind(req.fingerprint.to_hex())
                .bind(req.now)
                .bind(replay_until)
                .bind(req.expires_at)
                .bind(now)
                .bind(&req.request.method)
                .bind(&req.request.path)
                .bind(req.request.content_type.as_deref())
                .bind(req.request.body.as_ref())
                .bind(i64::from(response.status))
                .bind(headers_json(response)?)
                .bind(&response.body)
                .fetch_optional(&mut *c)
                .await?)
        }

        pub(crate) async fn write_fenced(
            c: &mut $conn,
            fence: &Fence,
            write: FencedWrite<'_>,
            now: i64,
        ) -> Result<()> {
            let id = fence.id();
            let updated = match write {
                FencedWrite::Point {
                    point,
                    lease_expires_at,
                } => sqlx::query(COMMIT_POINT_SQL)
                    .bind(id.caller().as_str())
                    .bind(id.key().as_str())
                    .bind(fence.generation())
                    .bind(point.as_str())
                    .bind(now)
                    .bind(lease_expires_at)
                    .execute(&mut *c)
                    .await?
                    .rows_affected(),
                FencedWrite::Final(response) => sqlx::query(COMPLETE_SQL)
                    .bind(now)
                    .bind(i64::from(response.status))
                    .bind(headers_json(response)?)
                    .bind(&response.body)
                    .bind(id.caller().as_str())
                    .bind(id.key().as_str())
                    .bind(fence.generation())
                    .execute(&mut *c)
                    .await?
                    .rows_affected(),
            };
            if updated == 1 {
                Ok(())
            } else {
                crate::metrics::fence_lost();
                Err(Error::Fenced)
            }
        }

        pub(crate) async fn take_over(
            c: &mut $conn,
            id: &KeyId,
            fingerprint: &Fingerprint,
            now: i64,
            lease_expires_at: i64,
        ) -> Result<Option<TakenOver>> {
            let row = sqlx::query(TAKE_OVER_SQL)
                .bind(id.caller().as_str())
                .bind(id.key().as_str())
                .bind(now)
                .bind(lease_expires_at)
                .bind(fingerprint.to_hex())
                .fetch_optional(&mut *c)
                .await?;
            match row {
                Some(r) => Ok(Some(TakenOver {
                    fence: id.fence(r.try_get("generation")?),
                    recovery_point: point(r.try_get("recovery_point")?)?,
                    created_at: r.try_get("created_at")?,
                })),
                None => Ok(None),
            }
        }

        pub(crate) async fn renew(
            c: &mut $conn,
            fence: &Fence,
            now: i64,
            lease_expires_at: i64,
        ) -> Result<bool> {
            let id = fence.id();
            let updated = sqlx::query(RENEW_SQL)
                .bind(id.caller().as_str())
                .bind(id.key().as_str())
                .bind(fence.generation())
                .bind(now)
                .bind(lease_expires_at)
                .execute(&mut *c)
                .await?
                .rows_affected();
            Ok(updated == 1)
        }

        pub(crate) async fn release(c: &mut $conn, fence: &Fence, now: i64) -> Result<bool> {
            let id = fence.id();
            let updated = sqlx::query(RELEASE_SQL)
                .bind(id.caller().as_str())
                .bind(id.key().as_str())
                .bind(fence.generation())
                .bind(now)
                .execute(&mut *c)
                .await?
                .rows_affected();
            Ok(updated == 1)
        }

        pub(crate) async fn orphans(c: &mut $conn, now: i64) -> Result<super::super::Orphans> {
            let (count, oldest): (i64, Option<i64>) = sqlx::query_as(ORPHANS_SQL)
                .bind(now)
                .fetch_one(&mut *c)
                .await?;
            Ok(super::super::Orphans {
                count: count.unsigned_abs(),
                oldest_lease_end: oldest,
            })
        }

        pub(crate) async fn oldest_expired(c: &mut $conn, now: i64) -> Result<Option<i64>> {
            Ok(sqlx::query_scalar(OLDEST_EXPIRED_SQL)
                .bind(now)
                .fetch_one(&mut *c)
                .await?)
        }

        pub(crate) async fn abandoned(
            c: &mut $conn,
            now: i64,
            limit: i64,
        ) -> Result<Vec<AbandonedKey>> {
            let rows = sqlx::query(ABANDONED_SQL)
                .bind(now)
                .bind(limit)
                .fetch_all(&mut *c)
                .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push(AbandonedKey {
                    id: KeyId::from_stored(r.try_get("caller")?, r.try_get("idem_key")?)?,
                    fingerprint: fingerprint(&r.try_get::<String, _>("fingerprint")?)?,
                    recovery_point: point(r.try_get("recovery_point")?)?,
                    request: StoredRequest {
                        method: r.try_get("request_method")?,
                        path: r.try_get("request_path")?,
                        content_type: r.try_get("request_content_type")?,
                        body: r
                            .try_get::<Option<Vec<u8>>, _>("request_body")?
                            .unwrap_or_default()
                            .into(),
                    },
                });
            }
            Ok(out)
        }

        /// Deletes up to `limit` records past retention inside the
        /// caller's transaction, reporting the unfinished ones among them.
        pub(crate) async fn reap(c: &mut $conn, now: i64, limit: i64) -> Result<ReapBatch> {
            let rows = sqlx::query(REAP_BATCH_SQL)
                .bind(now)
                .bind(limit)
                .fetch_all(&mut *c)
                .await?;
            let mut unfinished = Vec::new();
            for r in &rows {
                if r.try_get::<String, _>("state")? == "in_flight" {
                    unfinished.push(Unfinished {
                        id: KeyId::from_stored(r.try_get("caller")?, r.try_get("idem_key")?)?,
                        recovery_point: point(r.try_get("recovery_point")?)?,
                    });
                }
            }
            Ok(ReapBatch {
                deleted: rows.len() as u64,
                unfinished,
            })
        }

        pub(crate) async fn stage(
            c: &mut $conn,
            kind: &str,
            payload: &str,
            now: i64,
        ) -> Result<()> {
            sqlx::query(STAGE_SQL)
                .bind(kind)
                .bind(payload)
                .bind(now)
                .execute(&mut *c)
                .await?;
            Ok(())
        }

        pub(crate) async fn staged(c: &mut $conn, limit: i64) -> Result<Vec<StagedJob>> {
            let rows = sqlx::query(STAGED_SQL)
                .bind(limit)
                .fetch_all(&mut *c)
                .await?;
            let mut out = Vec::with_capacity(rows.len());
            for r in &rows {
                out.push(StagedJob {
                    id: r.try_get("id")?,
                    kind: r.try_get("kind")?,
                    payload: r.try_get("payload")?,
                });
            }
            Ok(out)
        }

        pub(crate) async fn delete_job(c: &mut $conn, id: i64) -> Result<()> {
            sqlx::query(DELETE_JOB_SQL)
                .bind(id)
                .execute(&mut *c)
                .await?;
            Ok(())
        }
    };
}

/// The operations on a SQLite connection.
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite {
    ops!(sqlx::SqliteConnection);

    use std::sync::LazyLock;

    use futures_util::TryStreamExt;

    /// The single-phase final write for a key with no row yet, followed by
    /// `COMMIT` and a fresh (deferred, lock-free) `BEGIN`, as one statement
    /// list: one hand-off to the connection's worker thread instead of two.
    /// It is [`CLAIM_FINAL_SQL`] cut before its `ON CONFLICT`, so a row
    /// that exists (another process's record, an expired window, an
    /// abandoned claim) makes the `INSERT` fail on the primary key and
    /// SQLite stops the list there: the `COMMIT` behind it never runs
    /// without the key. The trailing `BEGIN` leaves the connection inside a
    /// transaction, as sqlx's own count of open transactions says it is;
    /// committing that empty transaction afterwards touches nothing. (sqlx
    /// 0.8 marks statement lists with arguments as deprecated, launchbadge/sqlx#3108:
    /// the store test `the_final_write_and_its_commit_as_one_step` fails
    /// on the first upgrade that drops them.)
    static INSERT_FINAL_COMMIT_SQL: LazyLock<String> = LazyLock::new(|| {
        let (insert, _) = CLAIM_FINAL_SQL
            .split_once(" ON CONFLICT")
            .expect("the final claim is an upsert");
        format!("{insert}; COMMIT; BEGIN")
    });

    /// How [`insert_final_commit`] ended.
    #[derive(Debug)]
    pub(crate) enum FinalInsert {
        /// Inserted and committed with the transaction's writes.
        Committed,
        /// Committed, but the trailing `BEGIN` failed: the connection's
        /// transaction count is off, so it must not be reused.
        CommittedConnectionSpoilt(sqlx::Error),
        /// The key has a row already: nothing ran past the `INSERT`, the
        /// transaction is open and unchanged.
        RowExists,
        /// The `INSERT` or the `COMMIT` failed: nothing is known committed.
        Failed(sqlx::Error),
    }

    /// Runs [`INSERT_FINAL_COMMIT_SQL`] with the binds of `claim_final`.
    pub(crate) async fn insert_final_commit(
        c: &mut sqlx::SqliteConnection,
        req: &ClaimRequest<'_>,
        response: &StoredResponse,
        now: i64,
    ) -> Result<FinalInsert> {
        use sqlx::Executor;
        let replay_until = if req.replay_until <= now {
            req.expires_at
        } else {
            req.replay_until
        };
        let headers = headers_json(response)?;
        let query = sqlx::query(INSERT_FINAL_COMMIT_SQL.as_str())
            .bind(req.id.caller().as_str())
            .bind(req.id.key().as_str())
            .bind(req.fingerprint.to_hex())
            .bind(req.now)
            .bind(replay_until)
            .bind(req.expires_at)
            .bind(now)
            .bind(&req.request.method)
            .bind(&req.request.path)
            .bind(req.request.content_type.as_deref())
            .bind(req.request.body.as_ref())
            .bind(i64::from(response.status))
            .bind(headers)
            .bind(&response.body);
        // Which statement of the three failed decides what is committed:
        // count the ones that finished.
        let mut done = 0usize;
        let mut steps = c.fetch_many(query);
        let failure = loop {
            match steps.try_next().await {
                Ok(Some(sqlx::Either::Left(_))) => done += 1,
                Ok(Some(sqlx::Either::Right(_))) => {}
                Ok(None) => break None,
                Err(e) => break Some(e),
            }
        };
        drop(steps);
        Ok(match (failure, done) {
            (None, 3) => FinalInsert::Committed,
            (None, n) => FinalInsert::Failed(sqlx::Error::Protocol(format!(
                "the final insert ran {n} of its 3 statements"
            ))),
            (Some(e), 0) if is_unique_violation(&e) => FinalInsert::RowExists,
            (Some(e), 0 | 1) => FinalInsert::Failed(e),
            (Some(e), _) => FinalInsert::CommittedConnectionSpoilt(e),
        })
    }

    fn is_unique_violation(e: &sqlx::Error) -> bool {
        matches!(e, sqlx::Error::Database(d) if d.is_unique_violation())
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_committing_insert_is_the_final_claim_without_its_upsert() {
            let sql = INSERT_FINAL_COMMIT_SQL.as_str();
            assert!(CLAIM_FINAL_SQL.starts_with(sql.trim_end_matches("; COMMIT; BEGIN")));
            assert!(sql.ends_with("$12, $13, $14); COMMIT; BEGIN"), "{sql}");
            assert!(!sql.contains("ON CONFLICT") && !sql.contains("RETURNING"));
        }
    }
}

/// The operations on a PostgreSQL connection.
#[cfg(feature = "postgres")]
pub(crate) mod pg {
    ops!(sqlx::PgConnection);
}
