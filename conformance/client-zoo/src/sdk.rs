//! The hand-written SDK every defective client runs: the retry loop an SDK team writes over
//! reqwest, following the contract's client clauses and defaults, with each contract rule behind
//! one flag of [`Behaviour`] so that a zoo client can break exactly one.
//!
//! What it does with every flag set ([`Behaviour::CONTRACT`]): one key minted before the first
//! attempt and sent on every one; the allowlist (a refused connection, a lost connection, a
//! timeout, 408, 429, 502, 503, 504, a 500 when the request carried a key, a 409 whose problem
//! says in flight; a problem saying `"retryable": false` stops it); at most 3 attempts the server
//! may have run (a refused connection and a 409 in flight are free) and 10 requests sent; full
//! jitter `random(0, min(20 s, 500 ms * 2^n))` from a seeded `StdRng`; `Retry-After` as a
//! floor, and a hint past the deadline stops at once; one 30 s deadline, 10 s per attempt to the
//! response's head, and no sleep that would end past the deadline.
//!
//! Unlike idem-client it keeps no retry budget (one call per process never drains one), and it
//! has no "key-less POST" gate of its own: every client here means to send a key, except
//! `no-key` and `tracing-id-only`, whose defect is exactly that they retry without one.
//!
//! A flag that is not a defect by itself picks where the key travels ([`Keys::InBody`], a
//! required body field some SDKs use): such a client conforms when its counterpart is told
//! where to read the key.

use std::time::{Duration, SystemTime};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::header::{CONTENT_TYPE, RETRY_AFTER};
use tokio::time::Instant;
use uuid::Uuid;

/// The header every key travels in, unless the SDK puts it in the body.
const KEY_HEADER: &str = "Idempotency-Key";

/// The body field of [`Keys::InBody`]: a JSON pointer `/idempotency_key` to the server.
pub(crate) const BODY_KEY_FIELD: &str = "idempotency_key";

/// The per-operation tracing id of [`Keys::TracingId`] (Azure's spelling): it stays the same
/// across retries, and no server deduplicates on it.
pub(crate) const TRACING_HEADER: &str = "x-ms-client-request-id";

/// The longest single sleep of a client without a deadline: a longer `Retry-After` makes it
/// give up with that answer rather than sleep past any bound (it never retries before a hint).
/// It keeps the loop bounded in time; no kit run lives this long.
pub(crate) const LONGEST_SLEEP: Duration = Duration::from_secs(300);

/// A ceiling on requests for the client without an attempt cap, so that even its loop is
/// bounded in count (its deadline bounds it in time).
const RUNAWAY_SENDS: u32 = 1000;

/// When a key is minted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keys {
    /// Once, before the first attempt (the contract).
    PerOperation,
    /// Before every attempt (the anti-pattern of `idem.client.same-key`).
    PerAttempt,
    /// Never: the SDK knows nothing about keys.
    Never,
    /// Once per operation, but in the JSON body's [`BODY_KEY_FIELD`] instead of a header: not a
    /// defect when the server reads keys there.
    InBody,
    /// Never a key: a per-operation tracing id in [`TRACING_HEADER`], which the SDK resends
    /// unchanged as if it made a retry safe.
    TracingId,
}

/// How the backoff's ceiling `c = min(cap, base * 2^n)` becomes a delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Jitter {
    /// `random(0, c)`: the contract's default.
    Full,
    /// `c` itself: plain exponential backoff.
    None,
    /// `random(0.75 c, c)`: jitter, but over a quarter of the ceiling only.
    Narrow,
}

/// What bounds the operation in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deadline {
    /// One deadline for the whole operation, each attempt's timeout carved from what is left,
    /// and no sleep that would end past it (the contract).
    Overall,
    /// The deadline restarts with every attempt, and each attempt may use all of it.
    PerAttempt,
    /// No deadline at all: the per-attempt timeout and the attempt cap are the only bounds, and
    /// any `Retry-After` (up to [`LONGEST_SLEEP`]) is slept in full.
    None,
}

/// The SDK's rules, each of which one zoo client gets wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Behaviour {
    /// When the key is minted.
    pub(crate) keys: Keys,
    /// How the backoff is drawn under its ceiling.
    pub(crate) jitter: Jitter,
    /// Whether a 400 is retried (as if a proxy's glitch).
    pub(crate) retry_400: bool,
    /// Whether a 409 that is not in flight (a mismatch, a conflict) is retried, with the same
    /// key and counted, as the Stripe SDKs retry every 409.
    pub(crate) retry_final_409: bool,
    /// Whether `Retry-After` is read at all.
    pub(crate) honour_retry_after: bool,
    /// Whether the attempt cap (3) and the ceiling on sends (10) apply.
    pub(crate) attempt_cap: bool,
    /// Whether a lost connection and a timeout spend one of the 3 attempts; false: only
    /// answers do. The ceiling on sends counts every request either way.
    pub(crate) count_transport_failures: bool,
    /// What bounds the operation in time.
    pub(crate) deadline: Deadline,
    /// Whether the key is still on the request resent after a lost connection.
    pub(crate) key_survives_reset: bool,
    /// Whether a resend after a lost connection waits its backoff; false: it goes at once,
    /// with no sleep at all.
    pub(crate) backoff_after_reset: bool,
    /// Whether the SDK parses a 2xx body into its result type, which needs a string `id`: a
    /// success without one fails the call (after the server's effect).
    pub(crate) success_needs_id: bool,
}

impl Behaviour {
    /// The contract's behaviour: no defect.
    pub(crate) const CONTRACT: Behaviour = Behaviour {
        keys: Keys::PerOperation,
        jitter: Jitter::Full,
        retry_400: false,
        retry_final_409: false,
        honour_retry_after: true,
        attempt_cap: true,
        count_transport_failures: true,
        deadline: Deadline::Overall,
        key_survives_reset: true,
        backoff_after_reset: true,
        success_needs_id: false,
    };

    /// The backoff before retry number `n` (counted from 0) under the exponential ceiling
    /// `min(cap, base * 2^n)`, drawn as [`Behaviour::jitter`] says.
    pub(crate) fn backoff(&self, timing: &Timing, n: u32, rng: &mut StdRng) -> Duration {
        let ceiling = timing
            .base
            .saturating_mul(2u32.saturating_pow(n))
            .min(timing.cap);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        match self.jitter {
            Jitter::Full => Duration::from_nanos(rng.random_range(0..=nanos)),
            Jitter::None => ceiling,
            Jitter::Narrow => Duration::from_nanos(rng.random_range(nanos - nanos / 4..=nanos)),
        }
    }

    /// The backoff after the `n`-th retried outcome (counted from 0): [`Behaviour::backoff`],
    /// except none at all after a lost connection for the client that resends at once (which
    /// then draws nothing from `rng`).
    pub(crate) fn backoff_after(
        &self,
        outcome: &Outcome,
        timing: &Timing,
        n: u32,
        rng: &mut StdRng,
    ) -> Duration {
        if matches!(outcome, Outcome::Lost) && !self.backoff_after_reset {
            Duration::ZERO
        } else {
            self.backoff(timing, n, rng)
        }
    }

    /// Whether an outcome is retried: `Some(counts)` where `counts` says whether it spends one
    /// of the attempts, `None` when the answer is final.
    fn retry(&self, outcome: &Outcome, key_sent: bool, in_use_codes: &[String]) -> Option<bool> {
        match outcome {
            Outcome::Refused => Some(false),
            // The defect of `resets-uncounted` when false: the server may have run them.
            Outcome::Lost | Outcome::TimedOut => Some(self.count_transport_failures),
            // Never reached: a 2xx ends the call before it is sorted.
            Outcome::Success(_) | Outcome::Other => None,
            Outcome::Answer {
                status,
                code,
                retryable,
                ..
            } => match *status {
                // The defect: status table only, a 400 body is never looked at.
                400 if self.retry_400 => Some(true),
                409 => {
                    let in_flight = retryable.unwrap_or_else(|| {
                        code.as_ref()
                            .is_some_and(|c| in_use_codes.iter().any(|k| k == c))
                    });
                    // The defect of `retries-409`: any other 409 too, counted, same key.
                    if in_flight {
                        Some(false)
                    } else {
                        self.retry_final_409.then_some(true)
                    }
                }
                _ if *retryable == Some(false) => None,
                408 | 429 | 502 | 503 | 504 => Some(true),
                500 if key_sent => Some(true),
                _ => None,
            },
        }
    }
}

/// The SDK's numbers (the contract's defaults in [`Timing::DEFAULT`]; tests shrink them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    /// The backoff's base.
    pub(crate) base: Duration,
    /// The backoff's cap.
    pub(crate) cap: Duration,
    /// The overall deadline (unused by [`Deadline::None`]).
    pub(crate) deadline: Duration,
    /// The longest wait for one attempt's response head.
    pub(crate) attempt_timeout: Duration,
    /// Attempts the server may have run.
    pub(crate) max_attempts: u32,
    /// Requests sent.
    pub(crate) max_sends: u32,
}

impl Timing {
    /// The contract's defaults, taken from idem-client's policy where it names them as
    /// constants (the backoff's base and cap and the attempt cap are literals there too).
    pub(crate) const DEFAULT: Timing = Timing {
        base: Duration::from_millis(500),
        cap: Duration::from_secs(20),
        deadline: idem_client::policy::DEFAULT_DEADLINE,
        attempt_timeout: idem_client::policy::DEFAULT_ATTEMPT_TIMEOUT,
        max_attempts: 3,
        max_sends: idem_client::policy::DEFAULT_MAX_SENDS,
    };
}

/// What one attempt produced.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// A 2xx head; its body not read yet.
    Success(reqwest::Response),
    /// A failure's head and its problem body.
    Answer {
        status: u16,
        retry_after: Option<Duration>,
        code: Option<String>,
        retryable: Option<bool>,
    },
    /// The connection was refused: the request never left.
    Refused,
    /// The connection was lost after the request may have been sent.
    Lost,
    /// No response head within the attempt's timeout.
    TimedOut,
    /// Any other failure: not retried.
    Other,
}

/// Posts [`crate::BODY`] to `url` with `behaviour`; true iff the final answer is a 2xx (and,
/// for an SDK that parses its success, the body parsed).
pub(crate) async fn call(behaviour: Behaviour, timing: Timing, url: &str, seed: u64) -> bool {
    let http = crate::http_client();
    let mut rng = StdRng::seed_from_u64(seed);
    let in_use_codes = idem_client::RetryPolicy::default().in_use_codes;
    // Random, never from the seed: a second run with the same seed is a new operation.
    let operation_key = Uuid::new_v4().to_string();
    let start = Instant::now();
    let mut key_lost = false;
    let mut counted = 0u32;
    // Bounded: every pass sends one request, and the cap, the ceiling on sends or
    // `RUNAWAY_SENDS` (and the deadline, or the attempt cap) end the loop.
    for sends in 1..=RUNAWAY_SENDS {
        // What is left of the deadline as the loop believes it, sent as
        // `Request-Deadline-Ms` (none without a deadline).
        let (timeout, left) = match behaviour.deadline {
            Deadline::Overall => {
                let remaining = timing.deadline.saturating_sub(start.elapsed());
                if remaining.is_zero() {
                    tracing::info!(sends, "deadline passed");
                    return false;
                }
                (timing.attempt_timeout.min(remaining), Some(remaining))
            }
            // The defect of `deadline-reset-per-attempt`: the deadline restarts with each
            // attempt, and the attempt may use all of it (and claims all of it).
            Deadline::PerAttempt => (timing.deadline, Some(timing.deadline)),
            Deadline::None => (timing.attempt_timeout, None),
        };
        let (mut request, key_sent) = build(&http, url, behaviour, &operation_key, key_lost);
        if let Some(left) = left {
            let ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
            request = request.header(idem_spec::headers::REQUEST_DEADLINE_MS, ms);
        }
        let outcome = attempt(request, timeout).await;
        tracing::debug!(sends, key_sent, ?outcome, "attempt");
        if let Outcome::Success(resp) = outcome {
            return !behaviour.success_needs_id || parses(resp, timing.attempt_timeout).await;
        }
        let Some(counts) = behaviour.retry(&outcome, key_sent, &in_use_codes) else {
            tracing::info!(sends, ?outcome, "final answer");
            return false;
        };
        counted += u32::from(counts);
        if behaviour.attempt_cap && (counted >= timing.max_attempts || sends >= timing.max_sends) {
            tracing::info!(sends, counted, "attempts exhausted");
            return false;
        }
        if matches!(outcome, Outcome::Lost) && !behaviour.key_survives_reset {
            // The defect of `resends-keyless-after-reset`: its reconnect path rebuilds the
            // request from the caller's template, and the key lived only on the request sent.
            key_lost = true;
        }
        let backoff = behaviour.backoff_after(&outcome, &timing, sends - 1, &mut rng);
        let hint = match &outcome {
            Outcome::Answer { retry_after, .. } if behaviour.honour_retry_after => *retry_after,
            _ => None,
        };
        // Without an overall deadline, the next attempt's deadline starts after the sleep; with
        // none at all, only `LONGEST_SLEEP` bounds a sleep.
        let remaining = match behaviour.deadline {
            Deadline::Overall => timing.deadline.saturating_sub(start.elapsed()),
            Deadline::PerAttempt => timing.deadline,
            Deadline::None => LONGEST_SLEEP,
        };
        if hint.is_some_and(|h| h >= remaining) {
            tracing::info!(?hint, "Retry-After lands past the deadline");
            return false;
        }
        let delay = hint.map_or(backoff, |h| h.max(backoff));
        if delay >= remaining {
            tracing::info!(?delay, "the next sleep would end past the deadline");
            return false;
        }
        // `zero-backoff-after-reset` sleeps not at all, not even a yield.
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }
    false
}

/// One attempt's request: the body and the headers that carry (or fail to carry) the key.
/// Returns whether a key went with it.
fn build(
    http: &reqwest::Client,
    url: &str,
    behaviour: Behaviour,
    operation_key: &str,
    key_lost: bool,
) -> (reqwest::RequestBuilder, bool) {
    let request = http.post(url).header(CONTENT_TYPE, "application/json");
    match behaviour.keys {
        Keys::PerOperation if !key_lost => (
            request.header(KEY_HEADER, operation_key).body(crate::BODY),
            true,
        ),
        Keys::PerAttempt => (
            request
                .header(KEY_HEADER, Uuid::new_v4().to_string())
                .body(crate::BODY),
            true,
        ),
        Keys::InBody => (request.body(body_with_key(operation_key)), true),
        // The defect of `tracing-id-only`: an id that stays the same, but is no key.
        Keys::TracingId => (
            request
                .header(TRACING_HEADER, operation_key)
                .body(crate::BODY),
            false,
        ),
        Keys::PerOperation | Keys::Never => (request.body(crate::BODY), false),
    }
}

/// [`crate::BODY`] with `key` in its [`BODY_KEY_FIELD`].
pub(crate) fn body_with_key(key: &str) -> String {
    serde_json::json!({ "amount": 1000, BODY_KEY_FIELD: key }).to_string()
}

/// Whether a success body parses into the SDK's result, which needs a string `id` (read within
/// `timeout`). The effect has happened either way; a false here is the call's answer.
async fn parses(resp: reqwest::Response, timeout: Duration) -> bool {
    let body = tokio::time::timeout(timeout, resp.bytes()).await;
    let id = match &body {
        Ok(Ok(bytes)) => serde_json::from_slice::<serde_json::Value>(bytes)
            .ok()
            .and_then(|v| v["id"].as_str().map(str::to_owned)),
        _ => None,
    };
    if id.is_none() {
        tracing::warn!("the 2xx body has no string \"id\"; the SDK cannot parse its result");
    }
    id.is_some()
}

/// Sends one request and waits at most `timeout` for its head (and a failure's small body).
async fn attempt(request: reqwest::RequestBuilder, timeout: Duration) -> Outcome {
    let exchange = async {
        let resp = match request.send().await {
            Ok(resp) => resp,
            Err(e) => return transport(&e),
        };
        let status = resp.status().as_u16();
        if resp.status().is_success() {
            return Outcome::Success(resp);
        }
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| idem_client::policy::parse_retry_after(v, SystemTime::now()));
        let (mut code, mut retryable) = (None, None);
        if let Ok(body) = resp.bytes().await
            && let Ok(problem) = serde_json::from_slice::<serde_json::Value>(&body)
        {
            code = problem["code"].as_str().map(str::to_owned);
            retryable = problem["retryable"].as_bool();
        }
        Outcome::Answer {
            status,
            retry_after,
            code,
            retryable,
        }
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .unwrap_or(Outcome::TimedOut)
}

/// Sorts a transport error by what it proves about the request.
fn transport(e: &reqwest::Error) -> Outcome {
    if e.is_connect() {
        return Outcome::Refused;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    // Bounded by the error chain's length.
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof
            ) {
                return Outcome::Lost;
            }
        }
        if let Some(h) = err.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message() || h.is_canceled() || h.is_closed())
        {
            return Outcome::Lost;
        }
        source = err.source();
    }
    Outcome::Other
}
