//! Routes that exist only with `--test-hooks`: they let a test move the
//! server's clock, run the reaper, completer and enqueuer on demand, and
//! watch and release paused failpoints (`axum_idempotency::failpoint`), so
//! replay-window, retention, lease and crash behaviour can be checked in
//! milliseconds.
//!
//! They are unauthenticated by design (a test harness should not need a
//! caller's token to move time) and that is exactly why the server logs a
//! WARN at start when they are on: never enable them in production.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::json::ApiJson;
use super::{AppState, to_rfc3339};
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
    pub unfinished: u64,
    /// Transactions the pass took (one per batch of at most 1,000).
    pub batches: u32,
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
    let report = axum_idempotency::reaper::reap_once(&app.store, app.clock.as_ref()).await?;
    Ok(Json(ReapResult {
        deleted: report.deleted,
        unfinished: report.unfinished,
        batches: report.batches,
    }))
}

/// `POST /_test/complete`: runs one completer pass now.
pub async fn complete(
    State(app): State<AppState>,
) -> Result<Json<axum_idempotency::jobs::CompleterReport>> {
    Ok(Json(
        axum_idempotency::jobs::complete_once(&app.store, app.clock.as_ref(), &app.multistep)
            .await?,
    ))
}

/// What `POST /_test/enqueue` did.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct EnqueueResult {
    /// Staged jobs delivered by this pass.
    pub delivered: u64,
}

/// `POST /_test/enqueue`: runs one enqueuer pass now.
pub async fn enqueue(State(app): State<AppState>) -> Result<Json<EnqueueResult>> {
    Ok(Json(EnqueueResult {
        delivered: axum_idempotency::jobs::enqueue_once(
            &app.store,
            &super::payments::Receipts::new(app.clock.clone()),
        )
        .await?,
    }))
}

/// Requests paused at a failpoint.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct PausedFailpoints {
    /// One entry per paused request, e.g. `after=charge-call`.
    pub paused: Vec<String>,
}

/// `GET /_test/failpoints`: the requests paused right now.
pub async fn failpoints(State(app): State<AppState>) -> Json<PausedFailpoints> {
    Json(PausedFailpoints {
        paused: app
            .failpoints
            .as_ref()
            .map(|f| f.paused())
            .unwrap_or_default(),
    })
}

/// `POST /_test/failpoints/release`: releases every paused request.
pub async fn release(State(app): State<AppState>) -> Json<PausedFailpoints> {
    let paused = app
        .failpoints
        .as_ref()
        .map(|f| f.paused())
        .unwrap_or_default();
    if let Some(f) = &app.failpoints {
        f.release_all();
    }
    Json(PausedFailpoints { paused })
}
