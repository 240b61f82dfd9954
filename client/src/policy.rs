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
//!    [`StopReason::ProblemNotRetryable`], [`StopReason::NonIdempotentWithoutKey`],
//!    [`StopReason::ServerErrorWithoutKey`])
//! 2. attempts left? An outcome that proves the server ran nothing this time (a refused
//!    connection, a `409` in flight) does not count against [`RetryPolicy::max_attempts`]
//!    ([`StopReason::AttemptsExhausted`]); every request sent counts against
//!    [`RetryPolicy::max_sends`] ([`StopReason::SendsExhausted`]). See "What counts" below.
//! 3. draw the backoff delay (the only step that consumes randomness);
//! 4. a `Retry-After` hint past the deadline stops at once ([`StopReason::RetryAfterPastDeadline`]);
//!    otherwise the delay becomes `max(backoff, hint)`;
//! 5. a sleep that would end at or past the deadline is not started ([`StopReason::DeadlineWouldPass`]);
//! 6. the budget pays, or the retry is refused ([`StopReason::BudgetExhausted`]).
//!
//! The allowlist (step 1, clause `idem.client.allowlist`) sorts outcomes by what they prove
//! about the request:
//!
//! - **never sent** ([`Outcome::ConnectError`]: refused, DNS, TLS handshake, connect timeout):
//!   retrying cannot repeat anything, so it is retried for *any* request, even a POST without a
//!   key;
//! - **maybe processed** ([`Outcome::ConnectionLost`], [`Outcome::Timeout`], and every
//!   retryable status): retried only when repeating is safe, i.e. the method is idempotent or the
//!   request carries a key (clause `idem.client.no-key-no-retry`);
//! - **the server answered for good** (other 4xx, 501, 505…, any problem saying
//!   `"retryable": false`) and ambiguous protocol failures ([`Outcome::OtherTransport`]): never.
//!
//! A 409 means two opposite things (the key's first request is still running, or the key was
//! reused for another request), so for a 409 the problem document decides: its `retryable`
//! member when present, else whether its `code` is the in-flight code of any profile
//! (`idempotency_key_in_use`, Resend's `concurrent_idempotent_requests`).
//!
//! A caller can add rows to the allowlist ([`RetryPolicy::retry_status`],
//! [`RetryPolicy::retry_problem_code`]: a `425 Too Early`, a vendor's own "try again" code), not
//! only veto retries with a hook. An added row obeys the same gates as the built-in ones: the
//! key or idempotent-method rule, `"retryable": false`, the cap, the deadline and the budget.
//!
//! ## What counts against the attempt cap, and what the budget pays for
//!
//! The attempt cap ([`RetryPolicy::max_attempts`], 3) bounds how many times one operation may
//! have been *executed* by the server: every attempt whose outcome leaves that possible (a
//! response, a lost connection, a timeout). Two outcomes prove that this attempt executed
//! nothing, and they do not count against it:
//!
//! - **a refused connection** ([`Outcome::ConnectError`]): the request never left the client.
//!   gRPC (gRFC A6) retries such RPCs "transparently", outside `maxAttempts`, for the same
//!   reason. A server that is restarting refuses connections for a moment; spending the cap on
//!   that moment is what made default clients give up 1.2 s into a 2 s restart.
//! - **a `409` in flight** ([`RetryReason::KeyInUse`]): the server says the key's first request
//!   is still running (or, after a crash, that its lease has not run out yet) and, with
//!   `Retry-After`, when to come back. It is a "not yet", like polling a pending job; counting
//!   it spent the last attempt on waiting, and the client gave up with the answer one lease away.
//!
//! Neither is free, and neither can loop: each still **pays the budget** (a refused connection is
//! a transient retry, 14 tokens, the price of a sick host; a `409` in flight a throttling retry,
//! 5), as every retry does in the AWS standard mode's retry quota and in gRPC's retry
//! throttling, so a fleet facing a host that stays down stops retrying when its buckets are
//! empty, whatever the cap. Each still **waits**: `max(backoff, Retry-After)`, with the
//! backoff's exponent counting every request sent, so waits grow as they would have. Each
//! must still fit in **the deadline** (30 s) and under **[`RetryPolicy::max_sends`]** (10), a
//! ceiling on every request sent that holds even with no budget. A `429` still counts: it is a
//! load signal about the whole service, where the fleet should give up sooner, not later.

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

/// The default longest wait for one attempt, when it is shorter than what is left of the
/// deadline (and than the HTTP client's own timeout). With the 30 s deadline it leaves room for
/// a third attempt after two that hang (the book's second worked schedule).
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

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
        /// The `code` member of a problem+json body, when the policy needed it (see
        /// [`RetryPolicy::reads_problem`]).
        problem_code: Option<String>,
        /// The `retryable` member of that problem body, when present.
        problem_retryable: Option<bool>,
    },
    /// The connection could not be established (refused, DNS failure, TLS handshake, connect
    /// timeout): the request provably never reached the server.
    ConnectError,
    /// The connection was closed, reset or aborted after the request may have been written (a
    /// broken pipe, "connection closed before message completed", a canceled exchange): the
    /// server may or may not have processed it.
    ConnectionLost,
    /// The attempt ran out of time (its timeout fired); the server may or may not have processed
    /// it.
    Timeout,
    /// Any other transport failure (an unparsable response, a redirect loop, a request body that
    /// failed to stream). Not on the allowlist: retrying would not fix it, or might not be safe.
    OtherTransport,
}

impl Outcome {
    /// A response with no hint and no problem body.
    pub fn status(status: u16) -> Self {
        Outcome::Response {
            status,
            retry_after: None,
            problem_code: None,
            problem_retryable: None,
        }
    }

    /// The same response with a `Retry-After` hint (no effect on a transport outcome).
    pub fn with_retry_after(mut self, hint: Duration) -> Self {
        if let Outcome::Response { retry_after, .. } = &mut self {
            *retry_after = Some(hint);
        }
        self
    }

    /// The same response with a problem body: its `code` and its `retryable` member (no effect
    /// on a transport outcome).
    pub fn with_problem(mut self, code: Option<&str>, retryable: Option<bool>) -> Self {
        if let Outcome::Response {
            problem_code,
            problem_retryable,
            ..
        } = &mut self
        {
            *problem_code = code.map(str::to_owned);
            *problem_retryable = retryable;
        }
        self
    }

    /// Whether this is a successful response (1xx–3xx): the operation is done.
    pub fn is_success(&self) -> bool {
        matches!(self, Outcome::Response { status, .. } if *status < 400)
    }

    /// Whether this success refunds the budget: only a 2xx does, as in the AWS standard mode.
    pub fn is_2xx(&self) -> bool {
        matches!(self, Outcome::Response { status, .. } if (200..300).contains(status))
    }
}

/// Facts about the request that gate retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestFacts {
    /// Whether the method is idempotent by definition (RFC 9110 §9.2.2: GET, HEAD, OPTIONS,
    /// TRACE, PUT, DELETE; and QUERY, see [`is_idempotent_method`]).
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

/// RFC 9110 §9.2.2's idempotent methods, and `QUERY` (the HTTP QUERY method draft defines it as
/// safe and idempotent: a read with a body). POST, PATCH and anything unknown are not.
pub fn is_idempotent_method(method: &str) -> bool {
    matches!(
        method,
        "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE" | "QUERY"
    )
}

/// Why an attempt is being retried: one row of the allowlist (clause `idem.client.allowlist`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum RetryReason {
    /// The connection could not be established: the request was never sent.
    ConnectError,
    /// The connection was closed or reset after the request may have been sent.
    ConnectionLost,
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
    /// A 409 the server marks in flight (`"retryable": true`, or an in-flight code such as
    /// `idempotency_key_in_use`): the first attempt is still running.
    KeyInUse,
    /// A status (and problem code) the caller added to the allowlist
    /// ([`RetryPolicy::retry_status`], [`RetryPolicy::retry_problem_code`]).
    CallerListed,
}

impl RetryReason {
    /// The stable name used in events and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryReason::ConnectError => "connect-error",
            RetryReason::ConnectionLost => "connection-lost",
            RetryReason::Timeout => "timeout",
            RetryReason::RequestTimeout => "408-request-timeout",
            RetryReason::TooManyRequests => "429-too-many-requests",
            RetryReason::InternalErrorWithKey => "500-with-key",
            RetryReason::BadGateway => "502-bad-gateway",
            RetryReason::ServiceUnavailable => "503-service-unavailable",
            RetryReason::GatewayTimeout => "504-gateway-timeout",
            RetryReason::KeyInUse => "409-key-in-use",
            RetryReason::CallerListed => "caller-listed",
        }
    }

    /// Whether a retry for this reason follows an attempt the server may have executed, and so
    /// counts against [`RetryPolicy::max_attempts`]. A refused connection (never sent) and a
    /// `409` in flight (the server ran nothing this time) do not; see the module docs.
    pub fn counts_as_attempt(self) -> bool {
        !matches!(self, RetryReason::ConnectError | RetryReason::KeyInUse)
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
    /// The outcome is not on the allowlist (any other 4xx, a 409 that is not in flight, 501,
    /// 505…, or a transport error that retrying would not fix).
    NotRetryable {
        /// The status, when a response arrived.
        status: Option<u16>,
    },
    /// The status is on the allowlist, but the server's problem document says
    /// `"retryable": false`: the server knows better than the status code.
    ProblemNotRetryable {
        /// The status.
        status: u16,
    },
    /// POST, PATCH or another non-idempotent method without an `Idempotency-Key`
    /// (clause `idem.client.no-key-no-retry`).
    NonIdempotentWithoutKey,
    /// A 500 on a request without a key (clause `idem.client.500-with-key`).
    ServerErrorWithoutKey,
    /// The attempt cap was reached: [`RetryPolicy::max_attempts`] attempts the server may
    /// have executed.
    AttemptsExhausted {
        /// Attempts made that count against the cap.
        attempts: u32,
    },
    /// [`RetryPolicy::max_sends`] requests were sent, counting refused connections and `409`s in
    /// flight too.
    SendsExhausted {
        /// Requests sent.
        sends: u32,
    },
    /// The server's `Retry-After` lands past the deadline: waiting is pointless, so the response
    /// that carried it is handed back at once, headers and body intact.
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
            StopReason::ProblemNotRetryable { status } => {
                write!(f, "the {status} response says \"retryable\": false")
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
            StopReason::SendsExhausted { sends } => {
                write!(f, "gave up after sending the request {sends} times")
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

/// An answer the caller added to the allowlist: a status, optionally only with a given problem
/// `code`, and the budget class its retries pay as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedRetry {
    /// The status.
    pub status: u16,
    /// When set, only a problem body with this `code` matches.
    pub code: Option<String>,
    /// What a retry for it costs: [`RetryClass::Throttling`] for "not yet" answers (a `425 Too
    /// Early`), [`RetryClass::Transient`] for "something broke".
    pub class: RetryClass,
}

/// The default ceiling on requests sent per operation ([`RetryPolicy::max_sends`]).
pub const DEFAULT_MAX_SENDS: u32 = 10;

/// The policy: pure configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts per logical operation, the first included, that the server may have executed
    /// (clause `idem.client.max-attempts`). A refused connection and a `409` in flight do not
    /// count (see the module docs); [`RetryPolicy::max_sends`] bounds those. A cap of 1 turns
    /// every retry off, those included.
    pub max_attempts: u32,
    /// Requests sent per logical operation, every kind of attempt included: the ceiling that
    /// holds even when a host refuses connections for the whole deadline with no budget set.
    /// Set it equal to `max_attempts` to count every request against one cap.
    pub max_sends: u32,
    /// The delay formula.
    pub backoff: Backoff,
    /// The overall deadline of one logical operation, measured from its start.
    pub deadline: Duration,
    /// The longest one attempt may wait for the response's head (status and headers: the time
    /// to first byte); each attempt gets the least of this, what is left of the deadline
    /// ([`RetryPolicy::timeout_for_attempt`]) and the HTTP client's own timeout. It does not
    /// cover reading the body of the response handed back: see [`RetryPolicy::body_timeout`].
    pub attempt_timeout: Duration,
    /// How long the caller may take to read the body of the response handed back, counted from
    /// its head's arrival; `None` (the default) sets no limit of the middleware's own, so a
    /// large download or a streamed response is not cut (the `reqwest::Client`'s own timeout,
    /// if any, still applies). A small problem body the policy reads to decide is read within
    /// the attempt timeout.
    pub body_timeout: Option<Duration>,
    /// `code` values that mean "key in use" on a 409 whose problem has no `retryable` member.
    /// Defaults to every profile's in-flight spelling (`idempotency_key_in_use`, Resend's
    /// `concurrent_idempotent_requests`), so one client works against any API the conformance
    /// kit knows.
    pub in_use_codes: Vec<String>,
    /// Answers the caller added to the allowlist (empty by default); see
    /// [`RetryPolicy::retry_status`].
    pub added: Vec<AddedRetry>,
}

impl Default for RetryPolicy {
    /// 3 attempts (at most 10 requests sent), full jitter 500 ms / 20 s, 30 s deadline, 10 s
    /// to the response's head per attempt, no limit on reading the body.
    fn default() -> Self {
        let mut in_use_codes: Vec<String> = Profile::ALL
            .iter()
            .map(|p| ErrorCode::IdempotencyKeyInUse.wire_code(*p).to_owned())
            .collect();
        in_use_codes.sort();
        in_use_codes.dedup();
        Self {
            max_attempts: 3,
            max_sends: DEFAULT_MAX_SENDS,
            backoff: Backoff::default(),
            deadline: DEFAULT_DEADLINE,
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
            body_timeout: None,
            in_use_codes,
            added: Vec::new(),
        }
    }
}

/// The mutable part of one logical operation: attempts made, the previous sleep (decorrelated
/// jitter) and the random stream.
#[derive(Debug, Clone)]
pub struct RetryState {
    /// Requests sent (every kind of attempt).
    attempts: u32,
    /// Attempts that count against `max_attempts`.
    counted: u32,
    previous_delay: Option<Duration>,
    /// What the last retry paid the budget: refunded if the operation then succeeds.
    last_cost: Option<u32>,
    rng: SplitMix64,
}

impl RetryState {
    /// A fresh operation whose jitter is drawn from `rng`.
    pub fn new(rng: SplitMix64) -> Self {
        Self {
            attempts: 0,
            counted: 0,
            previous_delay: None,
            last_cost: None,
            rng,
        }
    }

    /// A fresh operation with a seeded stream (tests, vectors, simulator).
    pub fn seeded(seed: u64) -> Self {
        Self::new(SplitMix64::new(seed))
    }

    /// Attempts recorded so far: every request sent.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Attempts recorded so far that count against [`RetryPolicy::max_attempts`] (refused
    /// connections and `409`s in flight excluded).
    pub fn counted_attempts(&self) -> u32 {
        self.counted
    }

    /// The generator, for callers that draw their own randomness from the same stream.
    pub fn rng(&mut self) -> &mut SplitMix64 {
        &mut self.rng
    }
}

impl RetryPolicy {
    /// Adds `status` to the allowlist, its retries paying as `class` (e.g.
    /// `retry_status(425, RetryClass::Throttling)` for `425 Too Early`). The other gates still
    /// apply: a POST without a key is not retried, a problem saying `"retryable": false` is
    /// believed. Built-in rows are unaffected.
    pub fn retry_status(mut self, status: u16, class: RetryClass) -> Self {
        self.added.push(AddedRetry {
            status,
            code: None,
            class,
        });
        self
    }

    /// Adds a `status` whose problem body has `code` to the allowlist (a vendor's "try again"
    /// code on a status the allowlist refuses, such as a `409` or a `400`), its retries paying as
    /// `class`. The middleware reads the problem body of such a status to find the code.
    pub fn retry_problem_code(
        mut self,
        status: u16,
        code: impl Into<String>,
        class: RetryClass,
    ) -> Self {
        self.added.push(AddedRetry {
            status,
            code: Some(code.into()),
            class,
        });
        self
    }

    /// The class of an added row matching `status` and `code`, if any.
    fn added_row(&self, status: u16, code: Option<&str>) -> Option<RetryClass> {
        self.added
            .iter()
            .find(|a| a.status == status && a.code.as_deref().is_none_or(|c| Some(c) == code))
            .map(|a| a.class)
    }

    /// What is left of the deadline after `elapsed` (zero once passed).
    pub fn remaining(&self, elapsed: Duration) -> Duration {
        self.deadline.saturating_sub(elapsed)
    }

    /// The timeout of an attempt starting `elapsed` into the operation: the least of
    /// [`RetryPolicy::attempt_timeout`] and what is left of the deadline (clause
    /// `idem.client.deadline`). The HTTP client's own timeout, when shorter, still applies: the
    /// middleware never lengthens it.
    pub fn timeout_for_attempt(&self, elapsed: Duration) -> Duration {
        self.attempt_timeout.min(self.remaining(elapsed))
    }

    /// Whether the decision on a response with `status` can depend on its problem body, so the
    /// mechanism should read a (small, JSON) body's `code` and `retryable` before deciding: a 409
    /// (in flight or final, the problem says which) and every status the allowlist may retry
    /// (an explicit `"retryable": false` stops it).
    pub fn reads_problem(&self, status: u16) -> bool {
        let safe = RequestFacts {
            idempotent_method: true,
            has_key: true,
        };
        status == 409
            || self.added.iter().any(|a| a.status == status)
            || self.classify(safe, &Outcome::status(status)).is_ok()
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
            // Never sent: repeating it cannot repeat an effect, whatever the method.
            Outcome::ConnectError => return Ok((RetryReason::ConnectError, Transient)),
            Outcome::ConnectionLost => (RetryReason::ConnectionLost, Transient),
            Outcome::Timeout => (RetryReason::Timeout, Transient),
            Outcome::OtherTransport => return Err(StopReason::NotRetryable { status: None }),
            Outcome::Response {
                status,
                retry_after,
                problem_code,
                problem_retryable,
            } => {
                let status = *status;
                let row = match status {
                    408 => (RetryReason::RequestTimeout, Transient),
                    409 => {
                        // The problem's own `retryable` wins; without it, the in-flight codes.
                        let in_flight = problem_retryable.unwrap_or_else(|| {
                            problem_code
                                .as_deref()
                                .is_some_and(|c| self.in_use_codes.iter().any(|k| k == c))
                        });
                        if in_flight {
                            (RetryReason::KeyInUse, Throttling)
                        } else if let Some(class) = self.added_row(409, problem_code.as_deref())
                            && *problem_retryable != Some(false)
                        {
                            (RetryReason::CallerListed, class)
                        } else {
                            return Err(StopReason::NotRetryable { status: Some(409) });
                        }
                    }
                    429 => (RetryReason::TooManyRequests, Throttling),
                    500 => (RetryReason::InternalErrorWithKey, Transient),
                    502 => (RetryReason::BadGateway, Transient),
                    503 if retry_after.is_some() => (RetryReason::ServiceUnavailable, Throttling),
                    503 => (RetryReason::ServiceUnavailable, Transient),
                    504 => (RetryReason::GatewayTimeout, Transient),
                    s => match self.added_row(s, problem_code.as_deref()) {
                        Some(class) => (RetryReason::CallerListed, class),
                        None => return Err(StopReason::NotRetryable { status: Some(s) }),
                    },
                };
                if *problem_retryable == Some(false) {
                    return Err(StopReason::ProblemNotRetryable { status });
                }
                if status == 500 && !facts.has_key {
                    return Err(StopReason::ServerErrorWithoutKey);
                }
                row
            }
        };
        if !facts.idempotent_method && !facts.has_key {
            return Err(StopReason::NonIdempotentWithoutKey);
        }
        Ok((reason, class))
    }

    /// Records one attempt's outcome and decides. `elapsed` is the time since the operation
    /// started, read when the outcome arrived; `budget` is the bucket of the service called (the
    /// middleware keeps one per origin), if any. A 2xx refunds it: 1 token on a first attempt,
    /// the last retry's cost after retries (see [`crate::budget`]).
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
            // The server executed it: it counts, like every attempt that is not a refusal or
            // a 409 in flight.
            state.counted += 1;
            if let Some(b) = budget
                && outcome.is_2xx()
            {
                b.on_success(state.last_cost);
            }
            return Decision::Done;
        }
        let (reason, class) = match self.classify(facts, outcome) {
            Ok(r) => r,
            Err(stop) => {
                // A final answer (a refusal is always retryable, so never here).
                state.counted += 1;
                return Decision::Stop(stop);
            }
        };
        // A cap of 1 means "no retries" to anyone who sets it: nothing is free then.
        if reason.counts_as_attempt() || self.max_attempts <= 1 {
            state.counted += 1;
            if state.counted >= self.max_attempts {
                return Decision::Stop(StopReason::AttemptsExhausted {
                    attempts: state.counted,
                });
            }
        }
        if state.attempts >= self.max_sends {
            return Decision::Stop(StopReason::SendsExhausted {
                sends: state.attempts,
            });
        }
        // `attempts` includes the one that just failed, so `attempts - 1` retries were made
        // before it: the book's n, counted from 0, so the first ceiling is `base`. Every request
        // sent counts here, refused ones included: the longer a host fails, the longer we wait.
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
        if budget_left.is_some() {
            state.last_cost = Some(cost);
        }
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

    #[test]
    fn the_problem_body_is_read_exactly_where_it_can_change_the_decision() {
        let p = RetryPolicy::default();
        let read: Vec<u16> = (100..600).filter(|s| p.reads_problem(*s)).collect();
        assert_eq!(read, [408, 409, 429, 500, 502, 503, 504]);
    }
}
