//! Background jobs besides the [reaper](crate::reaper): the completer and
//! the enqueuer.
//!
//! - The **completer** (clause `idem.completer.drives`) finds in-flight
//!   multi-step keys whose lease has expired (their worker died, or a
//!   transient failure released them) and drives each to its end from the
//!   request stored with the key, with no client involved. It takes the key
//!   over like a retry would (the generation advances, clause
//!   `idem.lease.takeover`), so a worker that was only paused is fenced.
//!   Interval: `--completer-interval-ms`.
//! - The **enqueuer** drains the `staged_jobs` table. Endpoints stage a job
//!   in the same transaction as the writes that need it, so a job exists
//!   only if that transaction committed; the enqueuer reads only committed
//!   rows and therefore never sees a job before its transaction commits, or
//!   one whose transaction rolled back. The "queue" of this example is the
//!   `receipts` table (visible at `GET /v1/receipts`); it lives in the same
//!   database, so delivery and deletion of the staged row commit together.
//!   With a real queue (Redis, SQS) delivery comes first and deletion after,
//!   and a crash in between delivers the job again: at least once. So the
//!   target is keyed by the job id (`ON CONFLICT (job_id) DO NOTHING`) and
//!   absorbs a redelivery either way.
//!   Interval: `--enqueuer-interval-ms`.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Row;

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::multistep::MultiStepEndpoint;
use crate::store::Store;
use crate::{with_conn, with_pool};

/// Most keys one completer pass takes on.
pub const COMPLETER_BATCH: i64 = 32;

/// Most staged jobs one enqueuer pass drains.
pub const ENQUEUER_BATCH: i64 = 100;

/// The staged-job kind of a payment receipt.
pub const RECEIPT_JOB: &str = "send_receipt";

/// What one completer pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CompleterReport {
    /// Abandoned keys found.
    pub found: usize,
    /// Driven to a stored final response.
    pub finished: usize,
    /// Still unfinished (transient failure, or taken by another worker).
    pub unfinished: usize,
}

/// One completer pass over `endpoints`.
pub async fn complete_once(
    store: &Store,
    clock: &dyn Clock,
    endpoints: &[MultiStepEndpoint],
) -> Result<CompleterReport> {
    let keys = store.abandoned(clock.now_ms(), COMPLETER_BATCH).await?;
    let mut report = CompleterReport {
        found: keys.len(),
        ..CompleterReport::default()
    };
    for key in &keys {
        let Some(endpoint) = endpoints.iter().find(|e| e.matches(&key.method, &key.path)) else {
            tracing::warn!(caller = %key.caller, key = %key.key, method = %key.method, path = %key.path,
                "completer: no multi-step endpoint for this stored request");
            report.unfinished += 1;
            continue;
        };
        tracing::info!(caller = %key.caller, key = %key.key, recovery_point = %key.recovery_point,
            "completer: resuming an abandoned request");
        match endpoint.complete(key).await {
            Ok(Some(response)) => {
                let status = response.status().as_u16();
                if status < 500 {
                    report.finished += 1;
                    tracing::info!(caller = %key.caller, key = %key.key, status, "completer: finished");
                } else {
                    report.unfinished += 1;
                    tracing::warn!(caller = %key.caller, key = %key.key, status, "completer: not finished; will retry");
                }
            }
            Ok(None) => report.unfinished += 1,
            Err(e) => {
                report.unfinished += 1;
                tracing::warn!(caller = %key.caller, key = %key.key, error = %e, "completer: not finished; will retry");
            }
        }
    }
    Ok(report)
}

/// Runs [`complete_once`] every `interval` (the first pass one interval
/// after start) until the task is dropped.
pub async fn run_completer(
    store: Store,
    clock: Arc<dyn Clock>,
    endpoints: Arc<Vec<MultiStepEndpoint>>,
    interval: Duration,
) {
    let interval = interval.max(Duration::from_millis(10));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = complete_once(&store, clock.as_ref(), &endpoints).await {
            tracing::error!(error = %e, "completer pass failed");
        }
    }
}

/// Stages a receipt job inside `tx` (the transaction that finishes the
/// payment).
pub async fn stage_receipt(
    tx: &mut crate::store::DbTx,
    payload: &serde_json::Value,
    now: i64,
) -> Result<()> {
    let payload = payload.to_string();
    with_conn!(tx, c => {
        sqlx::query("INSERT INTO staged_jobs (kind, payload, created_at) VALUES ($1, $2, $3)")
            .bind(RECEIPT_JOB)
            .bind(&payload)
            .bind(now)
            .execute(&mut *c)
            .await?;
    });
    Ok(())
}

#[derive(serde::Deserialize)]
struct ReceiptPayload {
    payment_id: String,
    owner: String,
    amount: i64,
    currency: String,
}

// ANCHOR: enqueuer
/// One enqueuer pass: delivers up to [`ENQUEUER_BATCH`] committed staged
/// jobs and returns how many it delivered.
pub async fn enqueue_once(store: &Store, clock: &dyn Clock) -> Result<u64> {
    // A plain read outside any transaction sees committed rows only: a job
    // staged by a transaction still open (or rolled back) is invisible.
    let jobs: Vec<(i64, String, String)> = with_pool!(store, p => {
        let rows = sqlx::query("SELECT id, kind, payload FROM staged_jobs ORDER BY id LIMIT $1")
            .bind(ENQUEUER_BATCH)
            .fetch_all(p)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            out.push((r.try_get("id")?, r.try_get("kind")?, r.try_get("payload")?));
        }
        out
    });
    let mut delivered = 0;
    for (id, kind, payload) in jobs {
        if kind != RECEIPT_JOB {
            tracing::warn!(job_id = id, %kind, "enqueuer: unknown job kind left in place");
            continue;
        }
        let p: ReceiptPayload = serde_json::from_str(&payload)
            .map_err(|e| Error::Internal(format!("staged job {id} unreadable: {e}")))?;
        let mut tx = store.begin().await?;
        with_conn!(&mut tx, c => {
            sqlx::query(
                "INSERT INTO receipts (job_id, payment_id, owner, amount, currency, enqueued_at) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (job_id) DO NOTHING",
            )
            .bind(id)
            .bind(&p.payment_id)
            .bind(&p.owner)
            .bind(p.amount)
            .bind(&p.currency)
            .bind(clock.now_ms())
            .execute(&mut *c)
            .await?;
            sqlx::query("DELETE FROM staged_jobs WHERE id = $1")
                .bind(id)
                .execute(&mut *c)
                .await?;
        });
        tx.commit().await?;
        delivered += 1;
        tracing::info!(job_id = id, payment_id = %p.payment_id, "enqueuer: receipt job delivered");
    }
    Ok(delivered)
}
// ANCHOR_END: enqueuer

/// Runs [`enqueue_once`] every `interval` until the task is dropped.
pub async fn run_enqueuer(store: Store, clock: Arc<dyn Clock>, interval: Duration) {
    let mut tick = tokio::time::interval(interval.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = enqueue_once(&store, clock.as_ref()).await {
            tracing::error!(error = %e, "enqueuer pass failed");
        }
    }
}
