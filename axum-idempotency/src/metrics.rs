//! What the engine tells an operator: metrics through the [`metrics`] facade,
//! and one tracing span per idempotent request.
//!
//! The library only *emits*. The application installs an exporter of its
//! choice (the reference server serves Prometheus text at `GET /metrics`
//! with `metrics-exporter-prometheus`); without one every call here is a
//! no-op costing an atomic load. Every name, unit and help text is in this
//! module and nowhere else, so the list below is the whole contract.
//!
//! Labels are bounded: a route template (never a raw path with ids), an
//! [`Outcome`], a store [`Stage`], a store-error kind, a job result. No
//! label ever carries an idempotency key, a caller or a request id.
//!
//! ## The metrics
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `idem_requests_total` | counter | `route`, `outcome` | requests on idempotent routes, by [`Outcome`] |
//! | `idem_request_duration_seconds` | histogram | `route`, `outcome` | the engine's time per request (replays, 409s and executions) |
//! | `idem_store_operation_duration_seconds` | histogram | `operation` | one key-store operation ([`Stage`]): `observe` and `claim` are the two every first execution pays |
//! | `idem_store_errors_total` | counter | `kind` | store errors as they happen: `timeout`, `unreachable`, `locked`, `disk_full`, `read_only`, `other` |
//! | `idem_fence_lost_total` | counter | | a fenced write refused because another worker took the key over: **the duplicate side-effect alarm** |
//! | `idem_takeovers_total` | counter | | expired leases taken over (by a retry or the completer) |
//! | `idem_completer_resumptions_total` | counter | `result` | abandoned keys the completer drove: `finished`, `unfinished` |
//! | `idem_completer_passes_total` | counter | `result` | completer passes: `ok`, `error` |
//! | `idem_orphaned_keys` | gauge | | keys claimed, unfinished, with committed progress and an expired lease (the completer's queue), measured after each completer pass |
//! | `idem_orphaned_key_oldest_age_seconds` | gauge | | how long ago the oldest of them lost its lease (0 when there are none) |
//! | `idem_reaper_deleted_total` | counter | | records deleted past retention |
//! | `idem_reaper_unfinished_deleted_total` | counter | | of those, records still in flight (an outcome nobody knows) |
//! | `idem_reaper_passes_total` | counter | `result` | reaper passes: `ok`, `error` |
//! | `idem_reaper_expired_oldest_age_seconds` | gauge | | after a pass: how long the oldest record past retention has waited for deletion (0 when none is left): a reaper falling behind |
//!
//! The two production measurements of the design: the **duplicate
//! side-effect rate** is `idem_fence_lost_total` (zero by design; any
//! increase is an alarm that a gate regressed or a worker ran past its
//! lease), and the **orphaned-key rate** is `idem_orphaned_keys` watched as
//! a trend. Why the orphan gauge lives in the completer's loop: orphans are
//! exactly what the completer exists to drain, an application with
//! multi-step endpoints runs it anyway, and one indexed `COUNT`/`MIN` per
//! pass (on the partial in-flight index) costs nothing next to the pass. An
//! application without multi-step endpoints has no orphans to measure:
//! single-phase keys are claimed and recorded in one transaction. Keys in
//! flight at `started` with an expired lease are not counted: nothing of
//! them is committed, and the next request with the key claims it afresh.
//!
//! ## The span
//!
//! [`request_span`] opens `idem.request` per request with `route`,
//! `key_hash` (the first 16 hex digits of SHA-256 over caller and key: the
//! same for every retry of one operation, so logs correlate, and neither the
//! key nor the caller can be read from it), `outcome` and `recovery_point`
//! (the last committed one, `finished` once stored). Events the engine logs
//! while serving the request are inside it. With the `otel` feature,
//! `metrics::otel` re-exports `tracing-opentelemetry` and `opentelemetry` so the
//! application can add `tracing_opentelemetry::layer()` to its subscriber
//! and the span becomes an OpenTelemetry span.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, Response};
use sha2::{Digest, Sha256};

use crate::error::{Error, StoreFault};
use crate::key::Caller;

/// `idem_requests_total{route,outcome}`.
pub const REQUESTS_TOTAL: &str = "idem_requests_total";
/// `idem_request_duration_seconds{route,outcome}`.
pub const REQUEST_DURATION: &str = "idem_request_duration_seconds";
/// `idem_store_operation_duration_seconds{operation}`.
pub const STORE_OPERATION_DURATION: &str = "idem_store_operation_duration_seconds";
/// `idem_store_errors_total{kind}`.
pub const STORE_ERRORS_TOTAL: &str = "idem_store_errors_total";
/// `idem_fence_lost_total`.
pub const FENCE_LOST_TOTAL: &str = "idem_fence_lost_total";
/// `idem_takeovers_total`.
pub const TAKEOVERS_TOTAL: &str = "idem_takeovers_total";
/// `idem_completer_resumptions_total{result}`.
pub const COMPLETER_RESUMPTIONS_TOTAL: &str = "idem_completer_resumptions_total";
/// `idem_completer_passes_total{result}`.
pub const COMPLETER_PASSES_TOTAL: &str = "idem_completer_passes_total";
/// `idem_orphaned_keys`.
pub const ORPHANED_KEYS: &str = "idem_orphaned_keys";
/// `idem_orphaned_key_oldest_age_seconds`.
pub const ORPHANED_OLDEST_AGE: &str = "idem_orphaned_key_oldest_age_seconds";
/// `idem_reaper_deleted_total`.
pub const REAPER_DELETED_TOTAL: &str = "idem_reaper_deleted_total";
/// `idem_reaper_unfinished_deleted_total`.
pub const REAPER_UNFINISHED_TOTAL: &str = "idem_reaper_unfinished_deleted_total";
/// `idem_reaper_passes_total{result}`.
pub const REAPER_PASSES_TOTAL: &str = "idem_reaper_passes_total";
/// `idem_reaper_expired_oldest_age_seconds`.
pub const REAPER_EXPIRED_OLDEST_AGE: &str = "idem_reaper_expired_oldest_age_seconds";

/// Every metric name this crate emits, for exporters that pre-register and
/// for tests that check a dashboard names only real series.
pub const ALL: &[&str] = &[
    REQUESTS_TOTAL,
    REQUEST_DURATION,
    STORE_OPERATION_DURATION,
    STORE_ERRORS_TOTAL,
    FENCE_LOST_TOTAL,
    TAKEOVERS_TOTAL,
    COMPLETER_RESUMPTIONS_TOTAL,
    COMPLETER_PASSES_TOTAL,
    ORPHANED_KEYS,
    ORPHANED_OLDEST_AGE,
    REAPER_DELETED_TOTAL,
    REAPER_UNFINISHED_TOTAL,
    REAPER_PASSES_TOTAL,
    REAPER_EXPIRED_OLDEST_AGE,
];

/// Registers units and help texts with the installed recorder (exporters
/// show them as `# HELP`), and the counters whose labels are known in
/// advance at zero: a counter that first appears at 1 has no earlier
/// sample, so `increase()` and `rate()` would never see its first
/// increment, and the fence-loss alarm would miss the first fence loss.
/// Call once after installing the recorder; harmless twice.
pub fn describe() {
    for name in [
        FENCE_LOST_TOTAL,
        TAKEOVERS_TOTAL,
        REAPER_DELETED_TOTAL,
        REAPER_UNFINISHED_TOTAL,
    ] {
        metrics::counter!(name).absolute(0);
    }
    for result in ["finished", "unfinished"] {
        metrics::counter!(COMPLETER_RESUMPTIONS_TOTAL, "result" => result).absolute(0);
    }
    for result in ["ok", "error"] {
        metrics::counter!(COMPLETER_PASSES_TOTAL, "result" => result).absolute(0);
        metrics::counter!(REAPER_PASSES_TOTAL, "result" => result).absolute(0);
    }
    for kind in [
        "timeout",
        "unreachable",
        "locked",
        "disk_full",
        "read_only",
        "other",
    ] {
        metrics::counter!(STORE_ERRORS_TOTAL, "kind" => kind).absolute(0);
    }
    describe_only();
}

/// Registers `idem_requests_total` at zero for every [`Outcome`] of
/// `route`, a route template as axum's `MatchedPath` gives it
/// (`"/v1/transfers"`). Call it at start-up for each idempotent route,
/// after [`describe`]: the store-outage page divides the rate of
/// `outcome="store_unavailable"` by the rate of all requests, and a series
/// that first appears during the outage has no earlier sample, so its
/// first refusals would never count.
pub fn describe_route(route: &str) {
    for outcome in Outcome::ALL {
        // The same label order as `record_outcome`: one series, not two.
        let labels = [
            ("route", route.to_owned()),
            ("outcome", outcome.as_str().to_owned()),
        ];
        metrics::counter!(REQUESTS_TOTAL, &labels).absolute(0);
    }
}

fn describe_only() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        REQUESTS_TOTAL,
        "Requests on idempotent routes, by route template and outcome."
    );
    describe_histogram!(
        REQUEST_DURATION,
        Unit::Seconds,
        "Time the idempotency engine spent on a request, by route and outcome."
    );
    describe_histogram!(
        STORE_OPERATION_DURATION,
        Unit::Seconds,
        "Time of one key-store operation (observe, lookup, claim, record_final, write_fenced, take_over)."
    );
    describe_counter!(
        STORE_ERRORS_TOTAL,
        "Key-store errors by kind (timeout, unreachable, locked, disk_full, read_only, other)."
    );
    describe_counter!(
        FENCE_LOST_TOTAL,
        "Fenced writes refused because another worker took the key over: the duplicate side-effect alarm (zero by design)."
    );
    describe_counter!(
        TAKEOVERS_TOTAL,
        "Expired leases taken over by a retry or the completer."
    );
    describe_counter!(
        COMPLETER_RESUMPTIONS_TOTAL,
        "Abandoned keys the completer drove, by result (finished, unfinished)."
    );
    describe_counter!(
        COMPLETER_PASSES_TOTAL,
        "Completer passes, by result (ok, error)."
    );
    describe_gauge!(
        ORPHANED_KEYS,
        "Keys claimed, unfinished, with committed progress and an expired lease, after the last completer pass."
    );
    describe_gauge!(
        ORPHANED_OLDEST_AGE,
        Unit::Seconds,
        "Seconds since the oldest orphaned key lost its lease (0 when there is none)."
    );
    describe_counter!(
        REAPER_DELETED_TOTAL,
        "Key records the reaper deleted past retention."
    );
    describe_counter!(
        REAPER_UNFINISHED_TOTAL,
        "Key records the reaper deleted while still in flight (their outcome is unknown)."
    );
    describe_counter!(REAPER_PASSES_TOTAL, "Reaper passes, by result (ok, error).");
    describe_gauge!(
        REAPER_EXPIRED_OLDEST_AGE,
        Unit::Seconds,
        "After the last reaper pass: seconds the oldest record past retention has waited for deletion (0 when none is left)."
    );
}

/// What became of one request on an idempotent route: the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// Executed for the first time (or resumed) and its final outcome
    /// (2xx/4xx) stored.
    Executed,
    /// A stored response replayed.
    Replayed,
    /// 409: the key is in flight elsewhere.
    InFlight,
    /// 409: the key was first used with a different request.
    Mismatch,
    /// 400: no `Idempotency-Key`.
    KeyMissing,
    /// 400: a malformed `Idempotency-Key`.
    KeyInvalid,
    /// 503: the key store is unavailable; nothing claimed.
    StoreUnavailable,
    /// A 5xx, from the endpoint or the engine itself (a database error
    /// that is not the store's availability, an endpoint past its lease):
    /// not stored, the key released, a retry with the same key is safe.
    ServerErrorReleased,
    /// This worker's lease was taken over; its writes were refused.
    Fenced,
    /// Refused before the claim for another reason (no caller, a body too
    /// large or unreadable, a bad failpoint header).
    Rejected,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::Replayed => "replayed",
            Self::InFlight => "in_flight",
            Self::Mismatch => "mismatch",
            Self::KeyMissing => "key_missing",
            Self::KeyInvalid => "key_invalid",
            Self::StoreUnavailable => "store_unavailable",
            Self::ServerErrorReleased => "server_error_released",
            Self::Fenced => "fenced",
            Self::Rejected => "rejected",
        }
    }

    /// Every outcome, in label order.
    pub const ALL: [Self; 10] = [
        Self::Executed,
        Self::Replayed,
        Self::InFlight,
        Self::Mismatch,
        Self::KeyMissing,
        Self::KeyInvalid,
        Self::StoreUnavailable,
        Self::ServerErrorReleased,
        Self::Fenced,
        Self::Rejected,
    ];

    /// The outcome an engine error is answered with.
    pub fn of_error(e: &Error) -> Self {
        match e {
            Error::KeyMissing | Error::KeyMissingAt(_) => Self::KeyMissing,
            Error::KeyInvalid(_) => Self::KeyInvalid,
            Error::KeyMismatch => Self::Mismatch,
            Error::KeyInUse { .. } => Self::InFlight,
            Error::Fenced => Self::Fenced,
            e if e.store_fault().is_some() => Self::StoreUnavailable,
            Error::Unauthenticated
            | Error::MalformedBody(_)
            | Error::PayloadTooLarge { .. }
            | Error::Failpoint(_)
            | Error::DeadlineExceeded => Self::Rejected,
            Error::Store(_)
            | Error::Conflict
            | Error::ClaimUnsafe(_)
            | Error::Migrate(_)
            | Error::Config(_)
            | Error::Internal(_)
            | Error::ResponseTooLarge { .. } => Self::ServerErrorReleased,
        }
    }

    /// The outcome of a response the engine produced: an engine error
    /// carries its outcome as a response extension (set where errors
    /// become responses, [`Error::into_response_in`]); a response marked
    /// with a [`StoreFault`] (an application's error rendered with
    /// [`problem_response`](crate::error::problem_response), or marked with
    /// [`StoreFault::mark`]) is the store unavailable, wherever in the
    /// request the store failed; a replay carries `Idempotent-Replayed`;
    /// any other 5xx was not stored; the rest was executed and stored.
    pub fn of_response(response: &Response<Body>) -> Self {
        if let Some(o) = response.extensions().get::<Outcome>() {
            return *o;
        }
        if response.extensions().get::<StoreFault>().is_some() {
            return Self::StoreUnavailable;
        }
        if response.headers().contains_key("idempotent-replayed") {
            Self::Replayed
        } else if response.status().is_server_error() {
            Self::ServerErrorReleased
        } else {
            Self::Executed
        }
    }
}

/// Which key-store operation a latency is of: the `operation` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Stage {
    /// Single-phase observation (SQLite: one read; PostgreSQL: BEGIN plus
    /// the read that takes the key's lock).
    Observe,
    /// A plain read of the key (multi-step requests observe with it).
    Lookup,
    /// Taking the key: the multi-step claim, or the single-phase write
    /// transaction (SQLite's writer; PostgreSQL's key lock).
    Claim,
    /// The single-phase claim-and-record of the final outcome.
    RecordFinal,
    /// A fenced write (a recovery point, or a multi-step final outcome).
    WriteFenced,
    /// Taking over an expired lease.
    TakeOver,
}

impl Stage {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Observe => "observe",
            Self::Lookup => "lookup",
            Self::Claim => "claim",
            Self::RecordFinal => "record_final",
            Self::WriteFenced => "write_fenced",
            Self::TakeOver => "take_over",
        }
    }
}

/// Counts one finished request and records its duration.
pub fn record_outcome(route: &str, outcome: Outcome, took: Duration) {
    let labels = [
        ("route", route.to_owned()),
        ("outcome", outcome.as_str().to_owned()),
    ];
    metrics::counter!(REQUESTS_TOTAL, &labels).increment(1);
    metrics::histogram!(REQUEST_DURATION, &labels).record(took.as_secs_f64());
}

/// Records how long one store operation took.
pub fn observe_latency(stage: Stage, took: Duration) {
    metrics::histogram!(STORE_OPERATION_DURATION, "operation" => stage.as_str())
        .record(took.as_secs_f64());
}

/// Runs `fut` and records its duration under `stage` (whatever it returns).
pub(crate) async fn timed<T>(stage: Stage, fut: impl std::future::Future<Output = T>) -> T {
    let start = Instant::now();
    let out = fut.await;
    observe_latency(stage, start.elapsed());
    out
}

/// The `kind` label of a store error.
pub fn store_error_kind(e: &sqlx::Error) -> &'static str {
    match StoreFault::of(e) {
        Some(StoreFault::Timeout) => "timeout",
        Some(StoreFault::Unreachable) => "unreachable",
        Some(StoreFault::Locked) => "locked",
        Some(StoreFault::DiskFull) => "disk_full",
        Some(StoreFault::ReadOnly) => "read_only",
        _ => "other",
    }
}

/// Counts one store error (called where a driver error becomes an
/// [`Error`], so each is counted once).
pub fn store_error(e: &sqlx::Error) {
    metrics::counter!(STORE_ERRORS_TOTAL, "kind" => store_error_kind(e)).increment(1);
}

/// Counts a fenced write refused: another worker holds the key.
pub fn fence_lost() {
    metrics::counter!(FENCE_LOST_TOTAL).increment(1);
}

/// Counts an expired lease taken over.
pub fn takeover() {
    metrics::counter!(TAKEOVERS_TOTAL).increment(1);
}

/// Counts one abandoned key the completer drove.
pub fn completer_resumption(finished: bool) {
    let result = if finished { "finished" } else { "unfinished" };
    metrics::counter!(COMPLETER_RESUMPTIONS_TOTAL, "result" => result).increment(1);
}

/// Counts one completer pass.
pub fn completer_pass(ok: bool) {
    let result = if ok { "ok" } else { "error" };
    metrics::counter!(COMPLETER_PASSES_TOTAL, "result" => result).increment(1);
}

/// Sets the orphaned-key gauges from an [`Orphans`](crate::store::Orphans)
/// measured at `now` (milliseconds).
pub fn orphans(count: u64, oldest_lease_end: Option<i64>, now: i64) {
    metrics::gauge!(ORPHANED_KEYS).set(count as f64);
    metrics::gauge!(ORPHANED_OLDEST_AGE).set(age_secs(oldest_lease_end, now));
}

/// Counts what one reaper pass deleted.
pub fn reaped(deleted: u64, unfinished: u64) {
    metrics::counter!(REAPER_DELETED_TOTAL).increment(deleted);
    metrics::counter!(REAPER_UNFINISHED_TOTAL).increment(unfinished);
}

/// Counts one reaper pass.
pub fn reaper_pass(ok: bool) {
    let result = if ok { "ok" } else { "error" };
    metrics::counter!(REAPER_PASSES_TOTAL, "result" => result).increment(1);
}

/// Sets the reaper's lag gauge: the oldest retention end still present.
pub fn reaper_lag(oldest_expired_at: Option<i64>, now: i64) {
    metrics::gauge!(REAPER_EXPIRED_OLDEST_AGE).set(age_secs(oldest_expired_at, now));
}

fn age_secs(since: Option<i64>, now: i64) -> f64 {
    since.map_or(0.0, |t| (now.saturating_sub(t)).max(0) as f64 / 1000.0)
}

/// The `key_hash` of a span: the first 16 hex digits of SHA-256 over the
/// caller and the key. Stable across retries of one operation; reveals
/// neither.
pub fn key_hash(caller: &str, key: &str) -> String {
    let mut h = Sha256::new();
    h.update(caller.as_bytes());
    h.update([0]);
    h.update(key.as_bytes());
    hex::encode(&h.finalize()[..8])
}

/// Opens the `idem.request` span of one request on `route`. `outcome` and
/// `recovery_point` are filled in as the request goes ([`finish`], and the
/// multi-step driver as it commits recovery points).
pub fn request_span(route: &str, headers: &HeaderMap, caller: Option<&Caller>) -> tracing::Span {
    // The key as the engine will read it, so that `"k"` and `k` (one key,
    // two spellings) hash alike here and on the completer's and the
    // reaper's lines; a header that does not parse is hashed as sent, so
    // even an invalid key never reaches a log in clear.
    let key = headers.get(idem_spec::headers::IDEMPOTENCY_KEY).map(|v| {
        idem_spec::IdempotencyKey::parse_bytes(v.as_bytes()).map_or_else(
            |_| String::from_utf8_lossy(v.as_bytes()).into_owned(),
            |k| k.as_str().to_owned(),
        )
    });
    let hash = match (caller, key) {
        (Some(c), Some(k)) => key_hash(c.as_str(), &k),
        _ => String::new(),
    };
    tracing::info_span!(
        "idem.request",
        route,
        key_hash = %hash,
        outcome = tracing::field::Empty,
        recovery_point = tracing::field::Empty,
    )
}

/// Records the recovery point just committed on the current span (a no-op
/// outside an `idem.request` or `idem.complete` span).
pub(crate) fn recovery_point(point: &str) {
    tracing::Span::current().record("recovery_point", point);
}

/// Ends a request: its outcome on `span` and in the metrics.
pub fn finish(span: &tracing::Span, route: &str, started: Instant, response: &Response<Body>) {
    let outcome = Outcome::of_response(response);
    span.record("outcome", outcome.as_str());
    if matches!(outcome, Outcome::Executed | Outcome::Replayed) {
        span.record("recovery_point", idem_spec::RecoveryPoint::FINISHED);
    }
    record_outcome(route, outcome, started.elapsed());
}

/// The `tracing-opentelemetry` and `opentelemetry` crates this crate was
/// built against (feature `otel`, off by default), so the layer an
/// application installs matches.
///
/// ```ignore
/// use axum_idempotency::metrics::otel::{opentelemetry, tracing_opentelemetry};
/// use opentelemetry::trace::TracerProvider as _;
/// use tracing_subscriber::prelude::*;
/// // any opentelemetry_sdk provider with the exporter of your choice:
/// let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
/// tracing_subscriber::registry()
///     .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("my-api")))
///     .init();
/// ```
#[cfg(feature = "otel")]
pub mod otel {
    pub use opentelemetry;
    pub use tracing_opentelemetry;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_hash_is_stable_per_caller_and_key_and_reveals_neither() {
        let a = key_hash("alice", "k-1");
        assert_eq!(a, key_hash("alice", "k-1"));
        assert_eq!(a.len(), 16);
        assert_ne!(a, key_hash("bob", "k-1"));
        assert_ne!(a, key_hash("alice", "k-2"));
        assert_ne!(key_hash("ab", "c"), key_hash("a", "bc"), "separated");
        assert!(!a.contains("alice") && !a.contains("k-1"));
        // The operations chapter's recipe for an operator:
        // printf 'alice\0invoice-pay-3019' | sha256sum | cut -c1-16
        assert_eq!(key_hash("alice", "invoice-pay-3019"), "fb538e48f15a551f");
    }

    #[test]
    fn outcome_labels_are_distinct_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for o in Outcome::ALL {
            let s = o.as_str();
            assert!(s.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{s}");
            assert!(seen.insert(s), "{s} twice");
        }
    }

    #[test]
    fn errors_map_to_their_outcome() {
        assert_eq!(Outcome::of_error(&Error::KeyMissing), Outcome::KeyMissing);
        assert_eq!(Outcome::of_error(&Error::KeyMismatch), Outcome::Mismatch);
        assert_eq!(
            Outcome::of_error(&Error::KeyInUse {
                retry_after_secs: 1
            }),
            Outcome::InFlight
        );
        assert_eq!(
            Outcome::of_error(&Error::Store(sqlx::Error::PoolTimedOut)),
            Outcome::StoreUnavailable
        );
        assert_eq!(
            Outcome::of_error(&Error::Store(sqlx::Error::RowNotFound)),
            Outcome::ServerErrorReleased
        );
        assert_eq!(Outcome::of_error(&Error::Fenced), Outcome::Fenced);
    }

    #[test]
    fn a_response_says_its_outcome() {
        let resp = Error::KeyMismatch.into_response_in(idem_spec::Profile::Reference);
        assert_eq!(Outcome::of_response(&resp), Outcome::Mismatch);
        let mut ok = Response::new(Body::empty());
        assert_eq!(Outcome::of_response(&ok), Outcome::Executed);
        ok.headers_mut().insert(
            "idempotent-replayed",
            axum::http::HeaderValue::from_static("true"),
        );
        assert_eq!(Outcome::of_response(&ok), Outcome::Replayed);
        let mut failed = Response::new(Body::empty());
        *failed.status_mut() = axum::http::StatusCode::BAD_GATEWAY;
        assert_eq!(Outcome::of_response(&failed), Outcome::ServerErrorReleased);
    }
}
