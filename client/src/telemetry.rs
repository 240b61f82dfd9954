//! What the client counts, through the [`metrics`] facade: the application picks the exporter
//! (Prometheus, OpenTelemetry, StatsD…) by installing a recorder; without one every call here
//! is a no-op.
//!
//! Names and units follow the Prometheus conventions (`snake_case`, a `_total` suffix on
//! counters, base units in the name). Labels are small closed sets: the outcome's kind, the
//! retry reason ([`RetryReason::as_str`]), the stop reason and, for the budget gauge, the
//! bucket (an origin such as `https://api.example.com`, or `shared`). A key, a URL path or a
//! caller never appears in a label.
//!
//! | Metric | Type | Labels | Meaning |
//! |---|---|---|---|
//! | `idem_client_attempts_total` | counter | `outcome` | requests sent, by what came back: `2xx`…`5xx`, `connect_error`, `connection_lost`, `timeout`, `other_transport` |
//! | `idem_client_retries_total` | counter | `reason`, `class` | retries decided (a sleep then another attempt), by allowlist row and budget class |
//! | `idem_client_retry_wait_seconds` | histogram | `reason` | the sleep before each retry (`max(backoff, Retry-After)`) |
//! | `idem_client_operations_total` | counter | `result` | operations ended: `success`, `final` (an answer not worth retrying: a 4xx, `"retryable": false`, no key), `gave_up` |
//! | `idem_client_gave_up_total` | counter | `reason` | operations that stopped while the last outcome was retryable: `attempts-exhausted`, `sends-exhausted`, `budget-exhausted`, `deadline-would-pass`, `retry-after-past-deadline`, `deadline-exceeded`, `vetoed`, `body-not-replayable` |
//! | `idem_client_budget_tokens` | gauge | `bucket` | tokens left in the retry budget after each decision |
//!
//! Alert on the ratio `rate(idem_client_gave_up_total[5m]) / rate(idem_client_operations_total[5m])`
//! rather than on retries: retries are the client doing its job, give-ups are callers seeing
//! failures; `reason="budget-exhausted"` says the budget is shedding a fleet's retries.

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

use crate::policy::{Outcome, RetryPlan, RetryReason, StopReason};

/// Requests sent, by outcome.
pub const ATTEMPTS: &str = "idem_client_attempts_total";
/// Retries decided, by reason and class.
pub const RETRIES: &str = "idem_client_retries_total";
/// The sleep before each retry, seconds.
pub const RETRY_WAIT: &str = "idem_client_retry_wait_seconds";
/// Operations ended, by result.
pub const OPERATIONS: &str = "idem_client_operations_total";
/// Operations that stopped while their last outcome was retryable, by stop reason.
pub const GAVE_UP: &str = "idem_client_gave_up_total";
/// Tokens left in a retry budget.
pub const BUDGET_TOKENS: &str = "idem_client_budget_tokens";

/// Registers the help text and units of every metric with the installed recorder. Call it once
/// after installing the exporter (the metrics work without it; exporters just show no help).
pub fn describe() {
    describe_counter!(ATTEMPTS, "Requests sent by idem-client, by outcome.");
    describe_counter!(
        RETRIES,
        "Retries decided by idem-client, by reason and budget class."
    );
    describe_histogram!(
        RETRY_WAIT,
        metrics::Unit::Seconds,
        "Sleep before each retry (max of backoff and Retry-After)."
    );
    describe_counter!(OPERATIONS, "Operations ended by idem-client, by result.");
    describe_counter!(
        GAVE_UP,
        "Operations idem-client stopped retrying while the last outcome was retryable."
    );
    describe_gauge!(
        BUDGET_TOKENS,
        "Tokens left in idem-client's retry budget, by bucket."
    );
}

/// The `outcome` label of an attempt.
pub fn outcome_label(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Response { status, .. } => match status {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        },
        Outcome::ConnectError => "connect_error",
        Outcome::ConnectionLost => "connection_lost",
        Outcome::Timeout => "timeout",
        Outcome::OtherTransport => "other_transport",
    }
}

/// The `reason` label of a stop, and whether it is a give-up (the last outcome was retryable
/// but the client chose not to, or could not) rather than a final answer.
pub fn stop_label(reason: &StopReason) -> (&'static str, bool) {
    match reason {
        StopReason::NotRetryable { .. } => ("not-retryable", false),
        StopReason::ProblemNotRetryable { .. } => ("problem-not-retryable", false),
        StopReason::NonIdempotentWithoutKey => ("non-idempotent-without-key", false),
        StopReason::ServerErrorWithoutKey => ("server-error-without-key", false),
        StopReason::AttemptsExhausted { .. } => ("attempts-exhausted", true),
        StopReason::SendsExhausted { .. } => ("sends-exhausted", true),
        StopReason::RetryAfterPastDeadline { .. } => ("retry-after-past-deadline", true),
        StopReason::DeadlineWouldPass { .. } => ("deadline-would-pass", true),
        StopReason::BudgetExhausted { .. } => ("budget-exhausted", true),
        StopReason::Vetoed => ("vetoed", true),
        StopReason::BodyNotReplayable => ("body-not-replayable", true),
    }
}

pub(crate) fn attempt(outcome: &'static str) {
    counter!(ATTEMPTS, "outcome" => outcome).increment(1);
}

pub(crate) fn retry(plan: &RetryPlan) {
    let reason: &'static str = RetryReason::as_str(plan.reason);
    let class: &'static str = match plan.class {
        crate::budget::RetryClass::Transient => "transient",
        crate::budget::RetryClass::Throttling => "throttling",
    };
    counter!(RETRIES, "reason" => reason, "class" => class).increment(1);
    histogram!(RETRY_WAIT, "reason" => reason).record(plan.delay.as_secs_f64());
}

pub(crate) fn done() {
    counter!(OPERATIONS, "result" => "success").increment(1);
}

pub(crate) fn stopped(reason: &StopReason) {
    let (label, gave_up) = stop_label(reason);
    if gave_up {
        gave_up_with(label);
    } else {
        counter!(OPERATIONS, "result" => "final").increment(1);
    }
}

/// An operation that stopped for a reason outside [`StopReason`] (the deadline passed before
/// an attempt could start).
pub(crate) fn gave_up(label: &'static str) {
    gave_up_with(label);
}

fn gave_up_with(label: &'static str) {
    counter!(OPERATIONS, "result" => "gave_up").increment(1);
    counter!(GAVE_UP, "reason" => label).increment(1);
}

pub(crate) fn budget_level(bucket: &str, tokens: u32) {
    gauge!(BUDGET_TOKENS, "bucket" => bucket.to_owned()).set(f64::from(tokens));
}
