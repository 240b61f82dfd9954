//! Background tasks besides the [reaper](crate::reaper): the completer and
//! the enqueuer. Each has a `*_once` function (one pass, for tests and
//! on-demand hooks) and a `run_*` future to `tokio::spawn`, which loops until
//! the task is dropped or aborted and logs (never panics on) a failed pass.
//!
//! - The **completer** (clause `idem.completer.drives`) finds in-flight
//!   multi-step keys whose lease has expired (their worker died, or a
//!   transient failure released them) and drives each to its end from the
//!   request stored with the key, with no client involved. It takes the key
//!   over like a retry would (the generation advances, clause
//!   `idem.lease.takeover`), so a worker that was only paused is fenced.
//! - The **enqueuer** drains the `staged_jobs` table (clause
//!   `idem.multistep.staged-jobs`). Endpoints stage a job with
//!   [`StagedJobs::stage`] in the same transaction as the writes that need
//!   it, so a job exists only if that transaction committed; the enqueuer
//!   reads only committed rows and therefore never sees a job before its
//!   transaction commits, or one whose transaction rolled back. Each job is
//!   handed to your [`Deliver`] inside a transaction that also deletes the
//!   staged row: a target in the same database (a table) is delivered
//!   exactly once; with a real queue (Redis, SQS) delivery comes first and
//!   the deletion after, and a crash in between delivers the job again (at
//!   least once), so key the target by [`StagedJob::id`] to absorb a
//!   redelivery.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::clock::Clock;
use crate::error::Result;
use crate::multistep::MultiStepEndpoint;
use crate::store::{KeyStore, StagedJob, StagedJobs};

/// Most keys one completer pass takes on.
pub const COMPLETER_BATCH: i64 = 32;

/// Most staged jobs one enqueuer pass drains.
pub const ENQUEUER_BATCH: i64 = 100;

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

/// One completer pass over `endpoints` (all on one engine and store): every
/// key whose lease has ended, now (an operator's or a test's explicit pass).
pub async fn complete_once<K: KeyStore>(
    store: &K,
    clock: &dyn Clock,
    endpoints: &[MultiStepEndpoint<K>],
) -> Result<CompleterReport> {
    complete_pass(store, clock, endpoints, Duration::ZERO).await
}

/// One completer pass over the keys whose lease ended at least `grace`
/// ago: the background completer's, which leaves a key to its client's own
/// retry for [`EngineConfig::completer_grace`](crate::EngineConfig::completer_grace).
pub async fn complete_pass<K: KeyStore>(
    store: &K,
    clock: &dyn Clock,
    endpoints: &[MultiStepEndpoint<K>],
    grace: Duration,
) -> Result<CompleterReport> {
    let cutoff = clock
        .now_ms()
        .saturating_sub(i64::try_from(grace.as_millis()).unwrap_or(i64::MAX));
    let keys = store.abandoned(cutoff, COMPLETER_BATCH).await?;
    let mut report = CompleterReport {
        found: keys.len(),
        ..CompleterReport::default()
    };
    for key in &keys {
        let (method, path) = (&key.request.method, &key.request.path);
        let Some(endpoint) = endpoints.iter().find(|e| e.matches(method, path)) else {
            tracing::warn!(key_hash = %key.id, %method, %path,
                "completer: no multi-step endpoint for this stored request");
            report.unfinished += 1;
            continue;
        };
        tracing::info!(key_hash = %key.id, recovery_point = %key.recovery_point,
            "completer: resuming an abandoned request");
        // The completer's own span: the recovery points it commits land on it.
        let span = tracing::info_span!(
            "idem.complete",
            key_hash = %key.id,
            recovery_point = %key.recovery_point,
        );
        let finished = match endpoint.complete(key).instrument(span).await {
            Ok(Some(response)) if endpoint.engine().is_final(response.status().as_u16()) => {
                report.finished += 1;
                tracing::info!(key_hash = %key.id, status = response.status().as_u16(), "completer: finished");
                true
            }
            Ok(Some(response)) => {
                report.unfinished += 1;
                tracing::warn!(key_hash = %key.id, status = response.status().as_u16(), "completer: not finished; will retry");
                false
            }
            Ok(None) => {
                report.unfinished += 1;
                false
            }
            Err(e) => {
                report.unfinished += 1;
                tracing::warn!(key_hash = %key.id, error = %e, "completer: not finished; will retry");
                false
            }
        };
        crate::metrics::completer_resumption(finished);
    }
    Ok(report)
}

/// Runs [`complete_pass`] every `interval` (the first pass one interval
/// after start) until the task is dropped, with the engine's
/// [`completer_grace`](crate::EngineConfig::completer_grace).
pub async fn run_completer<K: KeyStore>(
    store: K,
    clock: Arc<dyn Clock>,
    endpoints: Arc<Vec<MultiStepEndpoint<K>>>,
    interval: Duration,
) {
    let interval = interval.max(Duration::from_millis(10));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let grace = endpoints
            .first()
            .map_or(Duration::ZERO, |e| e.engine().config().completer_grace);
        let pass = complete_pass(&store, clock.as_ref(), &endpoints, grace).await;
        crate::metrics::completer_pass(pass.is_ok());
        if let Err(e) = pass {
            tracing::error!(error = %e, "completer pass failed");
        }
        measure_orphans(&store, clock.as_ref()).await;
    }
}

/// Sets the orphaned-key gauges (`idem_orphaned_keys`, its oldest age) from
/// one aggregate read, as the completer's loop does after every pass. A
/// failed read leaves the gauges as they were (and is counted as a store
/// error).
pub async fn measure_orphans<K: KeyStore>(store: &K, clock: &dyn Clock) {
    let now = clock.now_ms();
    match store.orphans(now).await {
        Ok(o) => crate::metrics::orphans(o.count, o.oldest_lease_end, now),
        Err(e) => tracing::warn!(error = %e, "completer: counting orphaned keys failed"),
    }
}

/// Where the enqueuer hands staged jobs.
pub trait Deliver<K: KeyStore>: Send + Sync {
    /// Delivers `job`. `tx` is the transaction that deletes the staged row
    /// when this returns `Ok(true)`: writes to a target in the same
    /// database commit with the deletion. `Ok(false)` leaves the job staged
    /// (e.g. a kind this deliverer does not know); an error leaves it staged
    /// for the next pass.
    fn deliver(&self, job: &StagedJob, tx: &mut K::Tx)
    -> impl Future<Output = Result<bool>> + Send;
}

// ANCHOR: enqueuer
/// One enqueuer pass: delivers up to [`ENQUEUER_BATCH`] committed staged
/// jobs and returns how many it delivered.
pub async fn enqueue_once<K: StagedJobs, D: Deliver<K>>(store: &K, deliver: &D) -> Result<u64> {
    // A plain read outside any transaction sees committed rows only: a job
    // staged by a transaction still open (or rolled back) is invisible.
    let jobs = store.staged(ENQUEUER_BATCH).await?;
    let mut delivered = 0;
    for job in jobs {
        let mut tx = store.begin().await?;
        if !deliver.deliver(&job, &mut tx).await? {
            store.rollback(tx).await?;
            tracing::warn!(job_id = job.id, kind = %job.kind, "enqueuer: job left in place");
            continue;
        }
        store.delete_job(&mut tx, job.id).await?;
        store.commit(tx).await?;
        delivered += 1;
        tracing::info!(job_id = job.id, kind = %job.kind, "enqueuer: job delivered");
    }
    Ok(delivered)
}
// ANCHOR_END: enqueuer

/// Runs [`enqueue_once`] every `interval` until the task is dropped.
pub async fn run_enqueuer<K: StagedJobs, D: Deliver<K>>(store: K, deliver: D, interval: Duration) {
    let mut tick = tokio::time::interval(interval.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = enqueue_once(&store, &deliver).await {
            tracing::error!(error = %e, "enqueuer pass failed");
        }
    }
}
