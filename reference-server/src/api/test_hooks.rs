//! Routes that exist only with `--test-hooks`: they let a test move the
//! server's clock and run the reaper on demand, so replay-window, retention
//! and lease behaviour can be checked in milliseconds.
//!
//! They are unauthenticated by design (a test harness should not need a
//! caller's token to move time) and that is exactly why the server logs a
//! WARN at start when they are on: never enable them in production.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::json::ApiJson;
use crate::clock::to_rfc3339;
use crate::error::{Error, Result};

/// Body of `POST /_test/clock`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AdvanceClock {
    /// Seconds to move the server clock forward.
    pub advance_secs: u64,
}

/// The server clock after a change.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct ClockState {
    /// Now, in milliseconds since the epoch.
    pub now_ms: i64,
    /// Now, RFC 3339.
    pub now: String,
    /// How far ahead of the wall clock the server runs, in seconds.
    pub offset_secs: i64,
}

/// What `POST /_test/reap` did.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct ReapResult {
    /// Records deleted.
    pub deleted: u64,
    /// Of which still in flight.
    pub unfinished: usize,
}

/// `POST /_test/clock`: moves the server clock forward.
pub async fn advance_clock(
    State(app): State<AppState>,
    ApiJson(body): ApiJson<AdvanceClock>,
) -> Result<Json<ClockState>> {
    let clock = app
        .test_clock
        .as_ref()
        .ok_or_else(|| Error::NotFound("test hooks are off".into()))?;
    let now_ms = clock.advance(body.advance_secs);
    tracing::warn!(
        advance_secs = body.advance_secs,
        "test hook moved the server clock"
    );
    Ok(Json(ClockState {
        now_ms,
        now: to_rfc3339(now_ms),
        offset_secs: clock.offset_ms() / 1000,
    }))
}

/// `POST /_test/reap`: runs one reaper pass now.
pub async fn reap(State(app): State<AppState>) -> Result<Json<ReapResult>> {
    let report = crate::reaper::reap_once(&app.store, app.clock.as_ref()).await?;
    Ok(Json(ReapResult {
        deleted: report.deleted,
        unfinished: report.unfinished.len(),
    }))
}
