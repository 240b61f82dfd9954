//! The reaper: deletes key records past retention.
//!
//! Retention (72 h by default) is longer than the replay window (24 h) so
//! that unfinished requests can still be recovered and investigated after
//! clients have stopped retrying (clause `idem.window.retention`). When the
//! reaper deletes a record that never finished, it logs it at WARN: that is
//! a request whose outcome nobody knows, and a human should look.

use std::time::Duration;

use crate::clock::Clock;
use crate::error::Result;
use crate::store::{KeyStore, ReapReport};

/// One pass: delete every record whose retention ended before the clock's
/// now, logging the unfinished ones.
pub async fn reap_once<K: KeyStore>(store: &K, clock: &dyn Clock) -> Result<ReapReport> {
    let report = store.reap(clock.now_ms()).await?;
    for u in &report.unfinished {
        tracing::warn!(
            key = %u.id, recovery_point = %u.recovery_point,
            "reaper deleted an unfinished request past retention; its outcome is unknown"
        );
    }
    if report.deleted > 0 {
        tracing::info!(
            deleted = report.deleted,
            "reaper deleted expired idempotency keys"
        );
    }
    Ok(report)
}

/// Runs [`reap_once`] every `interval` until the task is dropped. Errors are
/// logged and the next pass tries again.
pub async fn run<K: KeyStore>(store: K, clock: std::sync::Arc<dyn Clock>, interval: Duration) {
    let mut tick = tokio::time::interval(interval.max(Duration::from_secs(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = reap_once(&store, clock.as_ref()).await {
            tracing::error!(error = %e, "reaper pass failed");
        }
    }
}
