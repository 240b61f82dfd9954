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
//! `no-key`, whose defect is exactly that it retries without one.

use std::time::{Duration, SystemTime};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::header::{CONTENT_TYPE, RETRY_AFTER};
use tokio::time::Instant;
use uuid::Uuid;

/// The header every key travels in.
const KEY_HEADER: &str = "Idempotency-Key";

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
}

/// The SDK's rules, each of which one zoo client gets wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Behaviour {
    /// When the key is minted.
    pub(crate) keys: Keys,
    /// Full jitter; false: the plain exponential ceiling itself.
    pub(crate) jitter: bool,
    /// Whether a 400 is retried (as if a proxy's glitch).
    pub(crate) retry_400: bool,
    /// Whether `Retry-After` is read at all.
    pub(crate) honour_retry_after: bool,
    /// Whether the attempt cap (3) and the ceiling on sends (10) apply.
    pub(crate) attempt_cap: bool,
    /// One deadline for the whole operation; false: the deadline restarts with every attempt,
    /// and each attempt may use all of it.
    pub(crate) overall_deadline: bool,
    /// Whether the key is still on the request resent after a lost connection.
    pub(crate) key_survives_reset: bool,
}

impl Behaviour {
    /// The contract's behaviour: no defect.
    pub(crate) const CONTRACT: Behaviour = Behaviour {
        keys: Keys::PerOperation,
        jitter: true,
        retry_400: false,
        honour_retry_after: true,
        attempt_cap: true,
        overall_deadline: true,
        key_survives_reset: true,
    };

    /// The backoff before retry number `n` (counted from 0): full jitter under the exponential
    /// ceiling, or the ceiling itself without jitter.
    pub(crate) fn backoff(&self, timing: &Timing, n: u32, rng: &mut StdRng) -> Duration {
        let ceiling = timing
            .base
            .saturating_mul(2u32.saturating_pow(n))
            .min(timing.cap);
        if self.jitter {
            let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
            Duration::from_nanos(rng.random_range(0..=nanos))
        } else {
            ceiling
        }
    }

    /// Whether an outcome is retried: `Some(counts)` where `counts` says whether it spends one
    /// of the attempts, `None` when the answer is final.
    fn retry(&self, outcome: &Outcome, key_sent: bool, in_use_codes: &[String]) -> Option<bool> {
        match outcome {
            Outcome::Refused => Some(false),
            Outcome::Lost | Outcome::TimedOut => Some(true),
            Outcome::Other => None,
            Outcome::Answer {
                status,
                code,
                retryable,
                ..
            } => match *status {
                // The defect: status table only, a 400 body is never looked at.
                400 if self.retry_400 => Some(true),
                409 => retryable
                    .unwrap_or_else(|| {
                        code.as_ref()
                            .is_some_and(|c| in_use_codes.iter().any(|k| k == c))
                    })
                    .then_some(false),
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
    /// The overall deadline.
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
enum Outcome {
    /// A response head (and, for a failure, its problem body).
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

/// Posts [`crate::BODY`] to `url` with `behaviour`; true iff the final answer is a 2xx.
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
    // `RUNAWAY_SENDS` (and the deadline) end the loop.
    for sends in 1..=RUNAWAY_SENDS {
        let timeout = if behaviour.overall_deadline {
            let remaining = timing.deadline.saturating_sub(start.elapsed());
            if remaining.is_zero() {
                tracing::info!(sends, "deadline passed");
                return false;
            }
            timing.attempt_timeout.min(remaining)
        } else {
            // The defect of `deadline-reset-per-attempt`: the deadline restarts with each
            // attempt, and the attempt may use all of it.
            timing.deadline
        };
        let key = match behaviour.keys {
            Keys::PerOperation if !key_lost => Some(operation_key.clone()),
            Keys::PerOperation | Keys::Never => None,
            Keys::PerAttempt => Some(Uuid::new_v4().to_string()),
        };
        let mut request = http
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .body(crate::BODY);
        if let Some(key) = &key {
            request = request.header(KEY_HEADER, key);
        }
        let outcome = attempt(request, timeout).await;
        tracing::debug!(sends, ?key, ?outcome, "attempt");
        if let Outcome::Answer { status, .. } = &outcome
            && (200..300).contains(status)
        {
            return true;
        }
        let Some(counts) = behaviour.retry(&outcome, key.is_some(), &in_use_codes) else {
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
        let backoff = behaviour.backoff(&timing, sends - 1, &mut rng);
        let hint = match &outcome {
            Outcome::Answer { retry_after, .. } if behaviour.honour_retry_after => *retry_after,
            _ => None,
        };
        // Without an overall deadline, the next attempt's deadline starts after the sleep.
        let remaining = if behaviour.overall_deadline {
            timing.deadline.saturating_sub(start.elapsed())
        } else {
            timing.deadline
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
        tokio::time::sleep(delay).await;
    }
    false
}

/// Sends one request and waits at most `timeout` for its head (and a failure's small body).
async fn attempt(request: reqwest::RequestBuilder, timeout: Duration) -> Outcome {
    let exchange = async {
        let resp = match request.send().await {
            Ok(resp) => resp,
            Err(e) => return transport(&e),
        };
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| idem_client::policy::parse_retry_after(v, SystemTime::now()));
        let (mut code, mut retryable) = (None, None);
        if !(200..300).contains(&status)
            && let Ok(body) = resp.bytes().await
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
