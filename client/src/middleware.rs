//! The mechanism: a `reqwest_middleware::Middleware` that runs [`RetryPolicy`] around `reqwest`.
//!
//! ```no_run
//! use idem_client::RetryMiddleware;
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(RetryMiddleware::default())
//!     .build();
//! ```
//!
//! Per operation the middleware:
//!
//! 1. resolves the idempotency key **once**: the request's own `Idempotency-Key` header, else an
//!    [`IdempotencyKey`] extension, else (for POST, PATCH and other non-idempotent methods, when
//!    auto keys are on) a freshly minted UUID; the key is written into the one request it holds;
//! 2. fixes one deadline (a [`Deadline`] extension, else the policy's) and gives each attempt
//!    a timeout equal to what is left of it;
//! 3. after each attempt asks the policy, emits a `tracing` event for every retry, lets the
//!    `on_retry` hook observe or veto, sleeps on the injected [`Clock`], and re-sends a clone of
//!    the same request;
//! 4. attaches a [`RetryReport`] (key, attempts, sleeps, why it stopped) to the response it hands
//!    back, so the caller can persist the key and see what happened.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::Extensions;
use idem_spec::IdempotencyKey;
use idem_spec::headers::{IDEMPOTENCY_KEY, RETRY_AFTER};
use reqwest::header::{CONTENT_TYPE, HeaderValue};
use reqwest::{Request, Response, ResponseBuilderExt};
use reqwest_middleware::{Middleware, Next};

use crate::Error;
use crate::budget::RetryBudget;
use crate::clock::{Clock, SystemClock};
use crate::key::mint_key;
use crate::policy::{
    Decision, Outcome, RequestFacts, RetryPlan, RetryPolicy, RetryState, StopReason,
    parse_retry_after,
};
use crate::rng::SplitMix64;

/// The largest 409 body read to find its problem `code`; problem documents are tiny, and a
/// bigger body is not one.
const MAX_PROBLEM_BODY: u64 = 64 * 1024;

/// Overrides the policy's deadline for one operation: put it in the request's extensions with
/// `reqwest_middleware::RequestBuilder::with_extension`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// The operation must finish within this long of entering the middleware.
    Within(Duration),
    /// The operation must finish by this instant (of the middleware's [`Clock`]); use it to pass
    /// down a deadline set higher up.
    At(Instant),
}

/// What the `on_retry` hook and the `tracing` event see before each retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryEvent {
    /// The decided retry: failed attempt, reason, delay, budget left.
    pub plan: RetryPlan,
    /// The operation's key, if any.
    pub key: Option<IdempotencyKey>,
    /// The request method.
    pub method: String,
    /// The request URL.
    pub url: String,
}

/// The hook's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookVerdict {
    /// Go ahead with the retry.
    Proceed,
    /// Do not retry; the last outcome is handed back with [`StopReason::Vetoed`].
    Veto,
}

/// A hook called before every retry.
pub type RetryHook = Arc<dyn Fn(&RetryEvent) -> HookVerdict + Send + Sync>;

/// Attached to every response the middleware hands back (`response.extensions().get::<RetryReport>()`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryReport {
    /// The key every attempt carried; persist it to retry the operation later.
    pub key: Option<IdempotencyKey>,
    /// Whether the middleware minted the key (as opposed to the caller supplying it).
    pub key_minted: bool,
    /// Attempts made, the first included.
    pub attempts: u32,
    /// The sleeps taken between attempts.
    pub delays: Vec<Duration>,
    /// Why the middleware stopped, when the response is not a success.
    pub stopped: Option<StopReason>,
    /// What was left of the deadline when the response arrived.
    pub remaining: Duration,
    /// Tokens left in the shared budget, if one is used.
    pub budget_left: Option<u32>,
}

/// The retry middleware. Build one per client: every request through that client shares its
/// budget and its seed stream.
pub struct RetryMiddleware {
    policy: RetryPolicy,
    budget: Option<RetryBudget>,
    clock: Arc<dyn Clock>,
    seeds: Mutex<SplitMix64>,
    hook: Option<RetryHook>,
    auto_keys: bool,
}

impl std::fmt::Debug for RetryMiddleware {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryMiddleware")
            .field("policy", &self.policy)
            .field("budget", &self.budget)
            .field("clock", &self.clock)
            .field("hook", &self.hook.is_some())
            .field("auto_keys", &self.auto_keys)
            .finish()
    }
}

impl Default for RetryMiddleware {
    /// Default policy, a fresh default budget, the system clock, entropy-seeded jitter, auto keys.
    fn default() -> Self {
        Self::new(RetryPolicy::default())
    }
}

impl RetryMiddleware {
    /// A middleware running `policy` with a fresh default budget.
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            policy,
            budget: Some(RetryBudget::default()),
            clock: Arc::new(SystemClock),
            seeds: Mutex::new(SplitMix64::from_entropy()),
            hook: None,
            auto_keys: true,
        }
    }

    /// Shares `budget` (clone a [`RetryBudget`] to share one bucket across several clients or to
    /// read its level from outside).
    pub fn with_budget(mut self, budget: RetryBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Retries without a shared budget (only the attempt cap and the deadline bound them).
    pub fn without_budget(mut self) -> Self {
        self.budget = None;
        self
    }

    /// Uses `clock` for deadlines and sleeps.
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Makes jitter deterministic: operation `i` of this middleware draws from the stream seeded
    /// by the `i`-th output of `SplitMix64::new(seed)`.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seeds = Mutex::new(SplitMix64::new(seed));
        self
    }

    /// Calls `hook` before every retry; it may veto.
    pub fn on_retry(
        mut self,
        hook: impl Fn(&RetryEvent) -> HookVerdict + Send + Sync + 'static,
    ) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// Whether to mint a key for non-idempotent requests that carry none (default on). Off means
    /// such requests are sent once and never retried.
    pub fn auto_keys(mut self, on: bool) -> Self {
        self.auto_keys = on;
        self
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The shared budget, if any.
    pub fn budget(&self) -> Option<&RetryBudget> {
        self.budget.as_ref()
    }

    fn next_state(&self) -> RetryState {
        let seed = self
            .seeds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .next_u64();
        RetryState::seeded(seed)
    }

    /// Resolves the operation's key once and writes it into the request (see module docs).
    fn resolve_key(
        &self,
        req: &mut Request,
        extensions: &Extensions,
    ) -> Result<(Option<IdempotencyKey>, bool), Error> {
        let present: Vec<&[u8]> = req
            .headers()
            .get_all(IDEMPOTENCY_KEY)
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        if !present.is_empty() {
            // The caller set the header: send it untouched. An invalid one earns a 400, which is
            // final, so it is never retried either way.
            return Ok((IdempotencyKey::from_header_values(present).ok(), false));
        }
        let (key, minted) = if let Some(key) = extensions.get::<IdempotencyKey>() {
            (key.clone(), false)
        } else if self.auto_keys && !crate::policy::is_idempotent_method(req.method().as_str()) {
            (mint_key(), true)
        } else {
            return Ok((None, false));
        };
        let value = HeaderValue::from_str(&key.to_header_value()).map_err(|_| {
            // Unreachable for a parsed key (visible ASCII only), reported rather than panicking.
            Error::InvalidKey {
                key: key.to_string(),
                source: idem_spec::Error::KeyEmpty,
            }
        })?;
        req.headers_mut().insert(IDEMPOTENCY_KEY, value);
        Ok((Some(key), minted))
    }
}

/// What an attempt left in our hands.
enum Held {
    Response(Response),
    Transport(reqwest::Error),
}

#[async_trait::async_trait]
impl Middleware for RetryMiddleware {
    async fn handle(
        &self,
        mut req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let start = self.clock.now();
        let (key, key_minted) = self.resolve_key(&mut req, extensions).map_err(wrap)?;
        let facts = RequestFacts::new(req.method().as_str(), key.is_some());
        let policy = match extensions.get::<Deadline>() {
            None => Cow::Borrowed(&self.policy),
            Some(d) => Cow::Owned(RetryPolicy {
                deadline: match *d {
                    Deadline::Within(w) => w,
                    Deadline::At(at) => at.saturating_duration_since(start),
                },
                ..self.policy.clone()
            }),
        };
        // The caller's own per-request timeout still applies, inside the deadline.
        let caller_timeout = req.timeout().copied();
        let method = req.method().to_string();
        let url = req.url().to_string();
        let mut state = self.next_state();
        let mut delays = Vec::new();
        // One request for the whole operation; attempts are clones of it.
        let template = req;

        loop {
            let elapsed = self.clock.now().saturating_duration_since(start);
            let remaining = policy.remaining(elapsed);
            if remaining.is_zero() {
                return Err(wrap(Error::DeadlineExceeded {
                    attempt: state.attempts() + 1,
                    key,
                }));
            }
            let Some(mut attempt) = template.try_clone() else {
                // A streaming body can be sent exactly once: send the original itself.
                return self
                    .send_once(template, extensions, next, &policy, start, key, key_minted)
                    .await;
            };
            *attempt.timeout_mut() = Some(caller_timeout.map_or(remaining, |t| t.min(remaining)));

            let (outcome, held) = match next.clone().run(attempt, extensions).await {
                Ok(resp) => observe_response(resp, self.clock.wall()).await,
                Err(reqwest_middleware::Error::Reqwest(e)) => {
                    (transport_outcome(&e), Held::Transport(e))
                }
                // Errors of inner middlewares are theirs to explain; never retried here.
                Err(other) => return Err(other),
            };
            let elapsed = self.clock.now().saturating_duration_since(start);
            let decision =
                policy.decide(&mut state, facts, &outcome, elapsed, self.budget.as_ref());
            let report = |stopped: Option<StopReason>, delays: &Vec<Duration>| RetryReport {
                key: key.clone(),
                key_minted,
                attempts: state.attempts(),
                delays: delays.clone(),
                stopped,
                remaining: policy.remaining(elapsed),
                budget_left: self.budget.as_ref().map(RetryBudget::available),
            };
            let plan = match decision {
                Decision::Done => return finish_ok(held, report(None, &delays)),
                Decision::Stop(reason) => {
                    return finish_stop(reason, held, report, &delays, &outcome);
                }
                Decision::Retry(plan) => plan,
            };
            let event = RetryEvent {
                plan,
                key: key.clone(),
                method: method.clone(),
                url: url.clone(),
            };
            if let Some(hook) = &self.hook
                && hook(&event) == HookVerdict::Veto
            {
                if let Some(b) = &self.budget {
                    b.deposit(event.plan.cost);
                }
                tracing::info!(
                    target: "idem_client::retry",
                    attempt = event.plan.failed_attempt,
                    reason = %event.plan.reason,
                    "retry vetoed by the on_retry hook"
                );
                return finish_stop(StopReason::Vetoed, held, report, &delays, &outcome);
            }
            emit(&event);
            drop(held);
            self.clock.sleep(event.plan.delay).await;
            delays.push(event.plan.delay);
        }
    }
}

impl RetryMiddleware {
    /// The path for a request whose body cannot be cloned: one attempt, no retry.
    #[allow(clippy::too_many_arguments)]
    async fn send_once(
        &self,
        mut req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
        policy: &RetryPolicy,
        start: Instant,
        key: Option<IdempotencyKey>,
        key_minted: bool,
    ) -> reqwest_middleware::Result<Response> {
        let remaining = policy.remaining(self.clock.now().saturating_duration_since(start));
        let timeout = req.timeout().copied();
        *req.timeout_mut() = Some(timeout.map_or(remaining, |t| t.min(remaining)));
        let result = next.run(req, extensions).await;
        let elapsed = self.clock.now().saturating_duration_since(start);
        match result {
            Ok(mut resp) => {
                let success = resp.status().as_u16() < 400;
                if success && let Some(b) = &self.budget {
                    b.on_success();
                }
                resp.extensions_mut().insert(RetryReport {
                    key,
                    key_minted,
                    attempts: 1,
                    delays: Vec::new(),
                    stopped: (!success).then_some(StopReason::BodyNotReplayable),
                    remaining: policy.remaining(elapsed),
                    budget_left: self.budget.as_ref().map(RetryBudget::available),
                });
                Ok(resp)
            }
            Err(reqwest_middleware::Error::Reqwest(source)) => Err(wrap(Error::GaveUp {
                reason: StopReason::BodyNotReplayable,
                attempts: 1,
                key,
                source,
            })),
            Err(other) => Err(other),
        }
    }
}

fn wrap(e: Error) -> reqwest_middleware::Error {
    reqwest_middleware::Error::Middleware(e.into())
}

fn transport_outcome(e: &reqwest::Error) -> Outcome {
    if e.is_connect() {
        Outcome::ConnectError
    } else if e.is_timeout() {
        Outcome::Timeout
    } else {
        Outcome::OtherTransport
    }
}

/// Reads what the policy needs from a response: status, `Retry-After`, and for a 409 the
/// problem `code` (which means buffering that small body and handing back an equivalent
/// response).
async fn observe_response(resp: Response, wall: std::time::SystemTime) -> (Outcome, Held) {
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, wall));
    let (problem_code, resp) = if status == 409 {
        read_problem_code(resp).await
    } else {
        (None, resp)
    };
    (
        Outcome::Response {
            status,
            retry_after,
            problem_code,
        },
        Held::Response(resp),
    )
}

async fn read_problem_code(resp: Response) -> (Option<String>, Response) {
    let is_json = resp
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.contains("json"));
    let too_big = resp.content_length().is_some_and(|n| n > MAX_PROBLEM_BODY);
    if !is_json || too_big {
        return (None, resp);
    }
    let status = resp.status();
    let version = resp.version();
    let url = resp.url().clone();
    let headers = resp.headers().clone();
    let body = match resp.bytes().await {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!(target: "idem_client::retry", error = %e, "could not read a 409 body");
            Default::default()
        }
    };
    let code = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("code")?.as_str().map(str::to_owned));
    let mut builder = http::Response::builder()
        .status(status)
        .version(version)
        .url(url);
    if let Some(h) = builder.headers_mut() {
        *h = headers;
    }
    let rebuilt = match builder.body(body) {
        Ok(r) => Response::from(r),
        // The parts came from a valid response, so this cannot fail; stay panic-free anyway.
        Err(_) => Response::from(http::Response::new(Vec::<u8>::new())),
    };
    (code, rebuilt)
}

fn emit(event: &RetryEvent) {
    let p = &event.plan;
    tracing::info!(
        target: "idem_client::retry",
        attempt = p.failed_attempt,
        next_attempt = p.failed_attempt + 1,
        reason = %p.reason,
        class = %p.class,
        delay_ms = u64::try_from(p.delay.as_millis()).unwrap_or(u64::MAX),
        retry_after_ms = p.retry_after.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        budget_left = p.budget_left,
        remaining_ms = u64::try_from(p.remaining_after_sleep.as_millis()).unwrap_or(u64::MAX),
        key = event.key.as_ref().map(IdempotencyKey::as_str),
        method = %event.method,
        url = %event.url,
        "retrying"
    );
}

fn finish_ok(held: Held, report: RetryReport) -> reqwest_middleware::Result<Response> {
    match held {
        Held::Response(mut resp) => {
            resp.extensions_mut().insert(report);
            Ok(resp)
        }
        // The policy only answers Done for a response; a transport error is never a success.
        Held::Transport(source) => Err(wrap(Error::GaveUp {
            reason: StopReason::NotRetryable { status: None },
            attempts: report.attempts,
            key: report.key,
            source,
        })),
    }
}

fn finish_stop(
    reason: StopReason,
    held: Held,
    report: impl Fn(Option<StopReason>, &Vec<Duration>) -> RetryReport,
    delays: &Vec<Duration>,
    outcome: &Outcome,
) -> reqwest_middleware::Result<Response> {
    let r = report(Some(reason.clone()), delays);
    tracing::debug!(target: "idem_client::retry", attempts = r.attempts, %reason, "not retrying");
    if let StopReason::RetryAfterPastDeadline { hint, remaining } = reason {
        let status = match outcome {
            Outcome::Response { status, .. } => *status,
            _ => 0,
        };
        return Err(wrap(Error::RetryAfterPastDeadline {
            hint,
            remaining,
            attempts: r.attempts,
            key: r.key,
            status,
        }));
    }
    match held {
        Held::Response(mut resp) => {
            resp.extensions_mut().insert(r);
            Ok(resp)
        }
        Held::Transport(source) => Err(wrap(Error::GaveUp {
            reason,
            attempts: r.attempts,
            key: r.key,
            source,
        })),
    }
}
