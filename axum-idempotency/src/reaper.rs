//! The reaper: deletes key records past retention.
//!
//! Retention (72 h by default) is longer than the replay window (24 h) so
//! that unfinished requests can still be recovered and investigated after
//! clients have stopped retrying (clause `idem.window.retention`).
//!
//! Why batches: one `DELETE` over a big backlog (a million expired keys
//! after an outage of the reaper, a retention shortened) holds SQLite's
//! single writer, or PostgreSQL's row locks and WAL, for seconds, and every
//! idempotent request waits behind it. So a pass deletes at most
//! [`ReaperConfig::batch_size`] records per transaction, oldest first, and
//! pauses [`ReaperConfig::pause`] between batches so queued writers run in
//! between (clause `idem.reaper.retention`).
//!
//! Why one log line: a record deleted while still in flight is a request
//! whose outcome nobody knows, and a human should look; but 20,000 WARN
//! lines at once bury everything else. So each pass logs one summary: INFO
//! with the number deleted and the batches, and, when some were unfinished,
//! one WARN with their number and the first [`UNFINISHED_SAMPLE`] of them;
//! every unfinished record is also logged at DEBUG.

use std::time::Duration;

use crate::clock::Clock;
use crate::error::Result;
use crate::store::{KeyStore, ReapReport};

/// How many unfinished records a pass's summary names.
pub const UNFINISHED_SAMPLE: usize = 10;

/// How a reaper pass paces itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaperConfig {
    /// Most records deleted per transaction.
    pub batch_size: i64,
    /// Pause between two batches, so other writers get the store.
    pub pause: Duration,
    /// Most batches per pass; what is left waits for the next pass, so one
    /// pass always ends.
    pub max_batches: u32,
}

impl Default for ReaperConfig {
    /// 1,000 records per transaction, 20 ms between batches, at most 1,000
    /// batches (a million records) per pass.
    fn default() -> Self {
        Self {
            batch_size: 1_000,
            pause: Duration::from_millis(20),
            max_batches: 1_000,
        }
    }
}

/// One pass with [`ReaperConfig::default`]: deletes every record whose
/// retention ended before the clock's now, in batches.
pub async fn reap_once<K: KeyStore>(store: &K, clock: &dyn Clock) -> Result<ReapReport> {
    reap_once_with(store, clock, &ReaperConfig::default()).await
}

/// One pass: batches of at most `config.batch_size` records, each its own
/// transaction, until a batch comes back short (or `max_batches`), then one
/// summary log line. The clock is read once, so a pass deletes only what
/// had expired when it began.
pub async fn reap_once_with<K: KeyStore>(
    store: &K,
    clock: &dyn Clock,
    config: &ReaperConfig,
) -> Result<ReapReport> {
    let now = clock.now_ms();
    let limit = config.batch_size.max(1);
    let mut report = ReapReport::default();
    while report.batches < config.max_batches.max(1) {
        if report.batches > 0 {
            tokio::time::sleep(config.pause).await;
        }
        let batch = match store.reap(now, limit).await {
            Ok(b) => b,
            Err(e) => {
                // What the earlier batches did is committed: say so before
                // failing the pass.
                summarise(&report);
                return Err(e);
            }
        };
        report.batches += 1;
        report.deleted += batch.deleted;
        crate::metrics::reaped(batch.deleted, batch.unfinished.len() as u64);
        for u in batch.unfinished {
            tracing::debug!(key_hash = %u.id, recovery_point = %u.recovery_point,
                "reaper deleted an unfinished request past retention");
            report.unfinished += 1;
            if report.unfinished_sample.len() < UNFINISHED_SAMPLE {
                report.unfinished_sample.push(u);
            }
        }
        if batch.deleted < limit.unsigned_abs() {
            break;
        }
    }
    summarise(&report);
    Ok(report)
}

/// The pass's one summary line (two when some records were unfinished).
fn summarise(report: &ReapReport) {
    if report.deleted > 0 {
        tracing::info!(
            deleted = report.deleted,
            batches = report.batches,
            "reaper deleted expired idempotency keys"
        );
    }
    if report.unfinished > 0 {
        let sample: Vec<String> = report
            .unfinished_sample
            .iter()
            .map(|u| format!("{} at {}", u.id, u.recovery_point))
            .collect();
        tracing::warn!(
            unfinished = report.unfinished,
            first = %sample.join(", "),
            "reaper deleted unfinished requests past retention; their outcome is unknown \
             (every one is logged at DEBUG)"
        );
    }
}

/// Sets `idem_reaper_expired_oldest_age_seconds` from one `MIN` read, as
/// the reaper's loop does after every pass: 0 when everything due is
/// deleted, growing when the reaper falls behind (or stopped running).
pub async fn measure_lag<K: KeyStore>(store: &K, clock: &dyn Clock) {
    let now = clock.now_ms();
    match store.oldest_expired(now).await {
        Ok(oldest) => crate::metrics::reaper_lag(oldest, now),
        Err(e) => tracing::warn!(error = %e, "reaper: reading its backlog failed"),
    }
}

/// Runs [`reap_once`] every `interval` until the task is dropped. Errors are
/// logged and the next pass tries again.
pub async fn run<K: KeyStore>(store: K, clock: std::sync::Arc<dyn Clock>, interval: Duration) {
    run_with(store, clock, interval, ReaperConfig::default()).await;
}

/// [`run`] with a pacing of its own.
pub async fn run_with<K: KeyStore>(
    store: K,
    clock: std::sync::Arc<dyn Clock>,
    interval: Duration,
    config: ReaperConfig,
) {
    let mut tick = tokio::time::interval(interval.max(Duration::from_secs(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let pass = reap_once_with(&store, clock.as_ref(), &config).await;
        crate::metrics::reaper_pass(pass.is_ok());
        if let Err(e) = pass {
            tracing::error!(error = %e, "reaper pass failed");
        }
        measure_lag(&store, clock.as_ref()).await;
    }
}
