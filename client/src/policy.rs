//! The retry decision, as a pure function of what happened and how much time has passed.
//!
//! Tower's split: [`RetryPolicy`] *decides* (whether, why, how long) and owns no I/O, clock or
//! socket; the middleware and the simulator *act*. Time enters as `elapsed` since the operation
//! started, randomness through a seeded [`SplitMix64`] in [`RetryState`], and the shared budget
//! as an explicit argument, so every decision can be replayed from a seed in a unit test.
//!
//! The order of checks after a failed attempt is part of the contract of this type, because it
//! decides which typed reason a caller sees:
//!
//! 1. is the outcome on the allowlist, for this method and key? ([`StopReason::NotRetryable`],
//!    [`StopReason::NonIdempotentWithoutKey`], [`StopReason::ServerErrorWithoutKey`])
//! 2. attempts left? ([`StopReason::AttemptsExhausted`])
//! 3. draw the backoff delay (the only step that consumes randomness);
//! 4. a `Retry-After` hint past the deadline fails at once ([`StopReason::RetryAfterPastDeadline`]);
//!    otherwise the delay becomes `max(backoff, hint)`;
//! 5. a sleep that would end at or past the deadline is not started ([`StopReason::DeadlineWouldPass`]);
//! 6. the budget pays, or the retry is refused ([`StopReason::BudgetExhausted`]).

use std::fmt;
use std::time::{Duration, SystemTime};

use idem_spec::{ErrorCode, Profile};
use serde::{Deserialize, Serialize};

use crate::backoff::Backoff;
use crate::budget::{RetryBudget, RetryClass};
use crate::rng::SplitMix64;

/// The default overall deadline of one logical operation, when the caller sets none.
///
/// Long enough for three attempts with the default backoff (worst case 0.5 s + 1 s of sleep) and
/// slow responses; short enough that a caller holding a user request is not stuck for minutes.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);

/// What one attempt produced, reduced to what the policy needs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// An HTTP response arrived.
    Response {
        /// Its status code.
        status: u16,
        /// The `Retry-After` hint, already turned into a delay from now (see [`parse_retry_after`]).
        retry_after: Option<Duration>,
        /// The `code` member of a problem+json body, when the policy needed it (409 only).
        problem_code: Option<String>,
    },
    /// The connection could not be established: the request never reached the server.
    ConnectError,
    /// The attempt ran out of time (its carved-out timeout fired).
    Timeout,
    /// Any other transport failure (reset mid-response, protocol error, body error). Not on the
    /// allowlist: the request may or may not have been processed.
    OtherTransport,
}

impl Outcome {
    /// A response with no hint and no code.
    pub fn status(status: u16) -> Self {
        Outcome::Response {
            status,
            retry_after: None,
            problem_code: None,
        }
    }

    /// Whether this is a successful response (1xx–3xx).
    pub fn is_success(&self) -> bool {
        matches!(self, Outcome::Response { status, .. } if *status < 400)
    }
}

/// Facts about the request that gate retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestFacts {
    /// Whether the method is idempotent by definition (RFC 9110 §9.2.2: GET, HEAD, OPTIONS,
    /// TRACE, PUT, DELETE).
    pub idempotent_method: bool,
    /// Whether the request carries an `Idempotency-Key`.
    pub has_key: bool,
}

impl RequestFacts {
    /// Facts for an HTTP method name and key presence.
    pub fn new(method: &str, has_key: bool) -> Self {
        Self {
            idempotent_method: is_idempotent_method(method),
            has_key,
        }
    }
}

/// RFC 9110 §9.2.2's idempotent methods. POST, PATCH and anything unknown are not.
pub fn is_idempotent_method(method: &str) -> bool {
    matches!(
        method,
        "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE"
    )
}

/// Why an attempt is being retried: one row of the allowlist (clause `idem.client.allowlist`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum RetryReason {
    /// Connection refused, reset before sending, DNS failure.
    ConnectError,
    /// The attempt's timeout fired.
    Timeout,
    /// 408 Request Timeout.
    RequestTimeout,
    /// 429 Too Many Requests.
    TooManyRequests,
    /// 500 Internal Server Error, retried only because the request carries a key.
    InternalErrorWithKey,
    /// 502 Bad Gateway.
    BadGateway,
    /// 503 Service Unavailable.
    ServiceUnavailable,
    /// 504 Gateway Timeout.
    GatewayTimeout,
    /// 409 with code `idempotency_key_in_use`: the first attempt is still running.
    KeyInUse,
}

impl RetryReason {
    /// The stable name used in events and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryReason::ConnectError => "connect-error",
            RetryReason::Timeout => "timeout",
            RetryReason::RequestTimeout => "408-request-timeout",
            RetryReason::TooManyRequests => "429-too-many-requests",
            RetryReason::InternalErrorWithKey => "500-with-key",
            RetryReason::BadGateway => "502-bad-gateway",
            RetryReason::ServiceUnavailable => "503-service-unavailable",
            RetryReason::GatewayTimeout => "504-gateway-timeout",
            RetryReason::KeyInUse => "409-key-in-use",
        }
    }
}

impl fmt::Display for RetryReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the client stopped without success. Every refusal has its own variant, so callers and
/// dashboards can tell "the server said no" from "we ran out of time" from "we chose not to".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum StopReason {
    /// The outcome is not on the allowlist (any other 4xx, 501, 505…, or an ambiguous
    /// transport error).
    NotRetryable {
        /// The status, when a response arrived.
        status: Option<u16>,
    },
    /// POST, PATCH or another non-idempotent method without an `Idempotency-Key`
    /// (clause `idem.client.no-key-no-retry`).
    NonIdempotentWithoutKey,
    /// A 500 on a request without a key (clause `idem.client.500-with-key`).
    ServerErrorWithoutKey,
    /// The attempt cap was reached.
    AttemptsExhausted {
        /// Attempts made.
        attempts: u32,
    },
    /// The server's `Retry-After` lands past the deadline: waiting is pointless.
    RetryAfterPastDeadline {
        /// The hint, as a delay from the moment it was read.
        hint: Duration,
        /// What was left of the deadline.
        remaining: Duration,
    },
    /// The chosen sleep would end at or past the deadline, so it is not started.
    DeadlineWouldPass {
        /// The sleep that would have been taken.
        delay: Duration,
        /// What was left of the deadline.
        remaining: Duration,
    },
    /// The shared budget cannot pay for this retry.
    BudgetExhausted {
        /// What the retry would have cost.
        cost: u32,
        /// Tokens left.
        available: u32,
    },
    /// An `on_retry` hook vetoed the retry.
    Vetoed,
    /// The request body is a stream that cannot be sent twice.
    BodyNotReplayable,
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::NotRetryable { status: Some(s) } => {
                write!(f, "status {s} is not on the retry allowlist")
            }
            StopReason::NotRetryable { status: None } => {
                f.write_str("this transport error is not on the retry allowlist")
            }
            StopReason::NonIdempotentWithoutKey => {
                f.write_str("a non-idempotent request without an Idempotency-Key is never retried")
            }
            StopReason::ServerErrorWithoutKey => {
                f.write_str("a 500 is retried only when the request carries an Idempotency-Key")
            }
            StopReason::AttemptsExhausted { attempts } => {
                write!(f, "gave up after {attempts} attempts")
            }
            StopReason::RetryAfterPastDeadline { hint, remaining } => write!(
                f,
                "the server asked to wait {hint:?}, past the deadline ({remaining:?} left)"
            ),
            StopReason::DeadlineWouldPass { delay, remaining } => write!(
                f,
                "a {delay:?} sleep would end past the deadline ({remaining:?} left)"
            ),
            StopReason::BudgetExhausted { cost, available } => write!(
                f,
                "retry budget exhausted: the retry costs {cost} tokens, {available} left"
            ),
            StopReason::Vetoed => f.write_str("an on_retry hook vetoed the retry"),
            StopReason::BodyNotReplayable => {
                f.write_str("the request body is a stream and cannot be sent twice")
            }
        }
    }
}

/// A decided retry: everything the event, the hook and the sleeper need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryPlan {
    /// The attempt that just failed (1-based).
    pub failed_attempt: u32,
    /// Why it is retried.
    pub reason: RetryReason,
    /// Its budget class.
    pub class: RetryClass,
    /// How long to sleep before the next attempt (`max(backoff, Retry-After)`).
    pub delay: Duration,
    /// The server's hint, when one was honoured.
    pub retry_after: Option<Duration>,
    /// Tokens paid to the budget (0 when no budget is used).
    pub cost: u32,
    /// Tokens left after paying (`None` when no budget is used).
    pub budget_left: Option<u32>,
    /// Deadline left after the sleep ends: the most the next attempt may take.
    pub remaining_after_sleep: Duration,
}

/// What to do after an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A successful response: hand it back.
    Done,
    /// Sleep, then send the same request again.
    Retry(RetryPlan),
    /// Stop and hand back the last outcome, with the reason.
    Stop(StopReason),
}

/// The policy: pure configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts per logical operation, the first included (clause `idem.client.max-attempts`).
    pub max_attempts: u32,
    /// The delay formula.
    pub backoff: Backoff,
    /// The overall deadline of one logical operation, measured from its start.
    pub deadline: Duration,
    /// `code` values that mean "key in use" on a 409. Defaults to every profile's spelling
    /// (`idempotency_key_in_use`, Resend's `concurrent_idempotent_requests`), so one client
    /// works against any API the conformance kit knows.
    pub in_use_codes: Vec<String>,
}

impl Default for RetryPolicy {
    /// 3 attempts, full jitter 500 ms / 20 s, 30 s deadline.
    fn default() -> Self {
        let mut in_use_codes: Vec<String> = Profile::ALL
            .iter()
            .map(|p| ErrorCode::IdempotencyKeyInUse.wire_code(*p).to_owned())
            .collect();
        in_use_codes.sort();
        in_use_codes.dedup();
        Self {
            max_attempts: 3,
            backoff: Backoff::default(),
            deadline: DEFAULT_DEADLINE,
            in_use_codes,
        }
    }
}

/// The mutable part of one logical operation: attempts made, the previous sleep (decorrelated
/// jitter) and the random stream.
#[derive(Debug, Clone)]
pub struct RetryState {
    attempts: u32,
    previous_delay: Option<Duration>,
    rng: SplitMix64,
}

impl RetryState {
    /// A fresh operation whose jitter is drawn from `rng`.
    pub fn new(rng: SplitMix64) -> Self {
        Self {
            attempts: 0,
            previous_delay: None,
            rng,
        }
    }

    /// A fresh operation with a seeded stream (tests, vectors, simulator).
    pub fn seeded(seed: u64) -> Self {
        Self::new(SplitMix64::new(seed))
    }

    /// Attempts recorded so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The generator, for callers that draw their own randomness from the same stream.
    pub fn rng(&mut self) -> &mut SplitMix64 {
        &mut self.rng
    }
}

impl RetryPolicy {
    /// What is left of the deadline after `elapsed` (zero once passed). The caller carves each
    /// attempt's timeout from this (clause `idem.client.deadline`).
    pub fn remaining(&self, elapsed: Duration) -> Duration {
        self.deadline.saturating_sub(elapsed)
    }

    /// Classifies an outcome against the allowlist: `Ok(reason)` when it may be retried,
    /// `Err(reason)` when it must not be, `Ok` never for a success.
    pub fn classify(
        &self,
        facts: RequestFacts,
        outcome: &Outcome,
    ) -> Result<(RetryReason, RetryClass), StopReason> {
        use RetryClass::*;
        let (reason, class) = match outcome {
            Outcome::ConnectError => (RetryReason::ConnectError, Transient),
            Outcome::Timeout => (RetryReason::Timeout, Transient),
            Outcome::OtherTransport => return Err(StopReason::NotRetryable { status: None }),
            Outcome::Response {
                status,
                retry_after,
                problem_code,
            } => match status {
                408 => (RetryReason::RequestTimeout, Transient),
                429 => (RetryReason::TooManyRequests, Throttling),
                409 if problem_code
                    .as_deref()
                    .is_some_and(|c| self.in_use_codes.iter().any(|k| k == c)) =>
                {
                    (RetryReason::KeyInUse, Throttling)
                }
                500 if facts.has_key => (RetryReason::InternalErrorWithKey, Transient),
                500 => return Err(StopReason::ServerErrorWithoutKey),
                502 => (RetryReason::BadGateway, Transient),
                503 if retry_after.is_some() => (RetryReason::ServiceUnavailable, Throttling),
                503 => (RetryReason::ServiceUnavailable, Transient),
                504 => (RetryReason::GatewayTimeout, Transient),
                s => {
                    return Err(StopReason::NotRetryable { status: Some(*s) });
                }
            },
        };
        if !facts.idempotent_method && !facts.has_key {
            return Err(StopReason::NonIdempotentWithoutKey);
        }
        Ok((reason, class))
    }

    /// Records one attempt's outcome and decides. `elapsed` is the time since the operation
    /// started, read when the outcome arrived; `budget` is the client's shared bucket, if any.
    pub fn decide(
        &self,
        state: &mut RetryState,
        facts: RequestFacts,
        outcome: &Outcome,
        elapsed: Duration,
        budget: Option<&RetryBudget>,
    ) -> Decision {
        state.attempts += 1;
        if outcome.is_success() {
            if let Some(b) = budget {
                b.on_success();
            }
            return Decision::Done;
        }
        let (reason, class) = match self.classify(facts, outcome) {
            Ok(r) => r,
            Err(stop) => return Decision::Stop(stop),
        };
        if state.attempts >= self.max_attempts {
            return Decision::Stop(StopReason::AttemptsExhausted {
                attempts: state.attempts,
            });
        }
        // `attempts` includes the one that just failed, so `attempts - 1` retries were made
        // before it: the book's n, counted from 0, so the first ceiling is `base`.
        let retries_made = state.attempts.saturating_sub(1);
        let backoff = self
            .backoff
            .delay(retries_made, state.previous_delay, &mut state.rng);
        let remaining = self.remaining(elapsed);
        let hint = match outcome {
            Outcome::Response { retry_after, .. } => *retry_after,
            _ => None,
        };
        if let Some(hint) = hint
            && hint >= remaining
        {
            return Decision::Stop(StopReason::RetryAfterPastDeadline { hint, remaining });
        }
        let delay = hint.map_or(backoff, |h| h.max(backoff));
        if delay >= remaining {
            return Decision::Stop(StopReason::DeadlineWouldPass { delay, remaining });
        }
        let (cost, budget_left) = match budget {
            None => (0, None),
            Some(b) => match b.with(|bucket| {
                bucket
                    .try_withdraw(class)
                    .map(|cost| (cost, bucket.available()))
            }) {
                Ok((cost, left)) => (cost, Some(left)),
                Err(e) => {
                    return Decision::Stop(StopReason::BudgetExhausted {
                        cost: e.cost,
                        available: e.available,
                    });
                }
            },
        };
        state.previous_delay = Some(backoff);
        Decision::Retry(RetryPlan {
            failed_attempt: state.attempts,
            reason,
            class,
            delay,
            retry_after: hint,
            cost,
            budget_left,
            remaining_after_sleep: remaining - delay,
        })
    }
}

/// Parses a `Retry-After` value (RFC 9110 §10.2.3) into a delay from `now`: delta-seconds
/// (`120`) or an HTTP-date (`Fri, 31 Dec 1999 23:59:59 GMT`). A date in the past means "now"
/// (zero). Anything else is ignored (`None`): a malformed hint is no reason to fail or to wait.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Huge numbers saturate rather than fail: "wait forever" is still "past the deadline".
        return Some(Duration::from_secs(
            value.parse::<u64>().unwrap_or(u64::MAX),
        ));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post_with_key() -> RequestFacts {
        RequestFacts::new("POST", true)
    }

    #[test]
    fn default_in_use_codes_cover_every_profile() {
        let p = RetryPolicy::default();
        assert_eq!(
            p.in_use_codes,
            ["concurrent_idempotent_requests", "idempotency_key_in_use"]
        );
        assert_eq!(p.max_attempts, 3);
        assert_eq!(p.deadline, DEFAULT_DEADLINE);
    }

    // clause: idem.client.retry-after
    #[test]
    fn retry_after_parses_both_forms() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").expect("date");
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
        assert_eq!(parse_retry_after("1.5", now), None);
        assert_eq!(
            parse_retry_after("99999999999999999999999", now),
            Some(Duration::from_secs(u64::MAX))
        );
    }

    // clause: idem.client.backoff-jitter
    #[test]
    fn decide_draws_the_same_schedule_as_the_backoff() {
        let p = RetryPolicy {
            max_attempts: 10,
            deadline: Duration::from_secs(3600),
            ..RetryPolicy::default()
        };
        let want = p.backoff.schedule(42, 9);
        let mut state = RetryState::seeded(42);
        let mut got = Vec::new();
        for _ in 0..9 {
            match p.decide(
                &mut state,
                post_with_key(),
                &Outcome::status(503),
                Duration::ZERO,
                None,
            ) {
                Decision::Retry(plan) => got.push(plan.delay),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(got, want);
    }
}
