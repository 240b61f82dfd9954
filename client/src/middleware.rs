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
//! 2. fixes one deadline (a [`Deadline`] extension, else the policy's) and picks the retry
//!    budget of the request's origin (one bucket per scheme, host and port by default);
//! 3. gives each attempt [`RetryPolicy::timeout_for_attempt`] to get the response's head: the
//!    least of `attempt_timeout` and what is left of the deadline. It does so with its own timer
//!    around the attempt and never by rewriting the request's timeout, so a shorter timeout of
//!    the `reqwest::Client` itself (or of the request) still applies: the attempt ends at
//!    whichever fires first. The body of the response handed back is not cut by that timer (a
//!    large download or a stream is the caller's to read), unless
//!    [`RetryPolicy::body_timeout`] is set;
//! 4. runs each attempt inside a `tracing` span (`idem_client.attempt`: attempt number, why it
//!    is sent, the wait before it, its outcome and the decision), after each attempt asks the
//!    policy, emits a `tracing` event for every retry, lets the `on_retry` hook observe or veto,
//!    sleeps on the injected [`Clock`], and re-sends a clone of the same request (with the
//!    attempt number in a header, when [`RetryMiddleware::with_attempt_header`] is on);
//! 5. hands back the last response, whatever its status and why it stopped (even a `429` whose
//!    `Retry-After` lands past the deadline: its headers and body are the caller's to read), with
//!    a [`RetryReport`] (key, attempts, sleeps, why it stopped) in its extensions; when the last
//!    attempt got no response at all, it returns [`Error::GaveUp`] with the same facts.
//!
//! It counts what it does through the `metrics` facade (see [`crate::telemetry`]), so the
//! application's exporter sees attempts, retries by reason, give-ups and budget levels.
//!
//! The middleware decides nothing itself: every "whether" and "how long" is
//! [`RetryPolicy::decide`]'s, and every loop here is bounded by its attempt cap and deadline.
//! Attempts, timeouts and the body are real time (tokio); the deadline and the sleeps between
//! attempts are on the [`Clock`], so tests can run a schedule instantly against a real socket.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::Extensions;
use http::HeaderName;
use idem_spec::IdempotencyKey;
use idem_spec::headers::{
    IDEMPOTENCY_KEY, REQUEST_DEADLINE_MAX_MS, REQUEST_DEADLINE_MS, RETRY_AFTER,
};
use reqwest::header::HeaderValue;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use crate::body;
use crate::budget::{OriginBudgets, RetryBudget};
use crate::clock::{Clock, SystemClock};
use crate::error::{AttemptError, Error};
use crate::key::mint_key;
use crate::policy::{
    Decision, Outcome, RequestFacts, RetryPlan, RetryPolicy, RetryState, StopReason,
    parse_retry_after,
};
use crate::rng::SplitMix64;
use crate::telemetry;
use tracing::Instrument;

/// The request header [`RetryMiddleware::with_attempt_header`] sends: this attempt's number,
/// 1-based (`Attempt-Count: 2` on the first retry). Off by default; a server may log it, and
/// should treat it as a hint only (see the book's "Seeing retries").
pub const ATTEMPT_COUNT_HEADER: &str = "attempt-count";

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

/// Put in the request's extensions before each attempt, for the middlewares inside this one
/// (to propagate the remaining time downstream, to log) and for tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptInfo {
    /// The attempt about to be sent (1-based).
    pub number: u32,
    /// Its timeout: the least of `attempt_timeout` and what is left of the deadline. The
    /// request's own timeout, or the client's, may still end it sooner.
    pub timeout: Duration,
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

/// Which bucket pays for a request's retries, as the budget-level metric labels it: the origin,
/// or `shared` for one bucket shared by every origin.
fn bucket_label(budgets: &Budgets, url: &reqwest::Url) -> String {
    match budgets {
        Budgets::PerOrigin(_) => url.origin().ascii_serialization(),
        Budgets::Shared(_) | Budgets::None => "shared".to_owned(),
    }
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
    /// Tokens left in the budget of the request's origin, if one is used.
    pub budget_left: Option<u32>,
    /// Attempts that counted against the attempt cap (refused connections and `409`s in
    /// flight do not; see [`crate::policy`]).
    pub counted_attempts: u32,
}

/// How a middleware budgets its retries.
#[derive(Debug, Clone)]
pub enum Budgets {
    /// No budget: only the attempt cap and the deadline bound retries.
    None,
    /// One bucket for every request, whatever its origin.
    Shared(RetryBudget),
    /// One bucket per origin (the default).
    PerOrigin(OriginBudgets),
}

impl Budgets {
    /// The bucket that pays for retries of a request to `url`.
    pub fn for_url(&self, url: &reqwest::Url) -> Option<RetryBudget> {
        match self {
            Budgets::None => None,
            Budgets::Shared(b) => Some(b.clone()),
            Budgets::PerOrigin(o) => Some(o.for_url(url)),
        }
    }

    /// The bucket that pays for retries of a request to `origin` (`scheme://host[:port]`).
    pub fn for_origin(&self, origin: &str) -> Option<RetryBudget> {
        match self {
            Budgets::None => None,
            Budgets::Shared(b) => Some(b.clone()),
            Budgets::PerOrigin(o) => Some(o.for_origin(origin)),
        }
    }
}

/// The retry middleware. Build one per client: every request through that client shares its
/// budgets (one bucket per origin) and its seed stream.
pub struct RetryMiddleware {
    policy: RetryPolicy,
    budgets: Budgets,
    clock: Arc<dyn Clock>,
    seeds: Mutex<SplitMix64>,
    hook: Option<RetryHook>,
    auto_keys: bool,
    attempt_header: Option<HeaderName>,
    deadline_header: bool,
}

impl std::fmt::Debug for RetryMiddleware {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryMiddleware")
            .field("policy", &self.policy)
            .field("budgets", &self.budgets)
            .field("clock", &self.clock)
            .field("hook", &self.hook.is_some())
            .field("auto_keys", &self.auto_keys)
            .field("attempt_header", &self.attempt_header)
            .field("deadline_header", &self.deadline_header)
            .finish()
    }
}

impl Default for RetryMiddleware {
    /// Default policy, default budgets (one bucket per origin), the system clock,
    /// entropy-seeded jitter, auto keys.
    fn default() -> Self {
        Self::new(RetryPolicy::default())
    }
}

impl RetryMiddleware {
    /// A middleware running `policy`, with one default bucket per origin.
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            policy,
            budgets: Budgets::PerOrigin(OriginBudgets::default()),
            clock: Arc::new(SystemClock),
            seeds: Mutex::new(SplitMix64::from_entropy()),
            hook: None,
            auto_keys: true,
            attempt_header: None,
            deadline_header: true,
        }
    }

    /// Pays every retry, **whatever its origin**, from the one bucket `budget` (clone a
    /// [`RetryBudget`] to share it across several clients, or to read its level from outside).
    /// This replaces the default of one bucket per origin: use it when several origins are one
    /// service; otherwise use [`RetryMiddleware::with_budget_per_origin`].
    pub fn with_shared_budget(mut self, budget: RetryBudget) -> Self {
        self.budgets = Budgets::Shared(budget);
        self
    }

    /// Pays retries from **one bucket per origin** (the default's shape), taken from `budgets`
    /// (clone an [`OriginBudgets`] to share it between clients, to read its levels from outside,
    /// or to set another [`BudgetConfig`](crate::BudgetConfig) for every origin).
    pub fn with_budget_per_origin(mut self, budgets: OriginBudgets) -> Self {
        self.budgets = Budgets::PerOrigin(budgets);
        self
    }

    /// The old name of [`RetryMiddleware::with_shared_budget`]: it silently replaced the
    /// per-origin buckets with one shared bucket, which the name did not say.
    #[deprecated(
        since = "0.1.0",
        note = "use `with_shared_budget` (one bucket for every origin) or `with_budget_per_origin`"
    )]
    pub fn with_budget(self, budget: RetryBudget) -> Self {
        self.with_shared_budget(budget)
    }

    /// The old name of [`RetryMiddleware::with_budget_per_origin`].
    #[deprecated(since = "0.1.0", note = "use `with_budget_per_origin`")]
    pub fn with_origin_budgets(self, budgets: OriginBudgets) -> Self {
        self.with_budget_per_origin(budgets)
    }

    /// Sends each attempt's number, 1-based, in the [`ATTEMPT_COUNT_HEADER`] request header
    /// (`Attempt-Count: 1`, then `2`…). Off by default: it is a hint a server may log or graph
    /// (how many requests are retries), and nothing in the contract depends on it.
    pub fn with_attempt_header(self) -> Self {
        self.with_attempt_header_named(HeaderName::from_static(ATTEMPT_COUNT_HEADER))
    }

    /// Like [`RetryMiddleware::with_attempt_header`], under another name (an API that already
    /// reads one).
    pub fn with_attempt_header_named(mut self, name: HeaderName) -> Self {
        self.attempt_header = Some(name);
        self
    }

    /// Stops sending [`REQUEST_DEADLINE_MS`] (on by default: every attempt carries what is
    /// left of the operation's deadline, in milliseconds, clause `idem.client.deadline-header`).
    /// For an API that rejects unknown headers; the deadline itself still holds.
    pub fn without_deadline_header(mut self) -> Self {
        self.deadline_header = false;
        self
    }

    /// Retries without a budget (only the attempt cap and the deadline bound them).
    pub fn without_budget(mut self) -> Self {
        self.budgets = Budgets::None;
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
    /// such requests are retried only when the connection was refused (never sent).
    pub fn auto_keys(mut self, on: bool) -> Self {
        self.auto_keys = on;
        self
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// How retries are budgeted.
    pub fn budgets(&self) -> &Budgets {
        &self.budgets
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

    fn elapsed(&self, start: Instant) -> Duration {
        self.clock.now().saturating_duration_since(start)
    }

    /// Sends one attempt under its timeout and reduces what happened to an [`Outcome`] for the
    /// policy, keeping the response or error in hand. Errors of inner middlewares are theirs to
    /// explain and are passed through, never retried.
    async fn attempt(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
        policy: &RetryPolicy,
        timeout: Duration,
    ) -> reqwest_middleware::Result<(Outcome, Held)> {
        let now = tokio::time::Instant::now();
        // A policy may say "no limit" with a huge duration; an instant cannot hold it.
        let ends = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600));
        let exchange = async {
            match next.run(req, extensions).await {
                Ok(resp) => Ok(observe_response(resp, policy, self.clock.wall()).await),
                Err(reqwest_middleware::Error::Reqwest(e)) => Ok((
                    transport_outcome(&e),
                    Held::Failed(AttemptError::Transport(e)),
                )),
                Err(other) => Err(other),
            }
        };
        match tokio::time::timeout_at(ends, exchange).await {
            Ok(result) => result,
            // Dropping the exchange closes its connection: the attempt is over.
            Err(_) => Ok((
                Outcome::Timeout,
                Held::Failed(AttemptError::TimedOut(timeout)),
            )),
        }
    }
}

/// What an attempt left in our hands.
enum Held {
    /// A response, and how long its body may take to read (`None` once it is in memory, or
    /// when the policy sets no body timeout).
    Response {
        resp: Response,
        body_deadline: Option<Duration>,
    },
    /// No response.
    Failed(AttemptError),
}

/// The facts of one operation that every report repeats.
struct Operation {
    key: Option<IdempotencyKey>,
    key_minted: bool,
    budget: Option<RetryBudget>,
}

impl Operation {
    fn report(
        &self,
        state: &RetryState,
        delays: &[Duration],
        stopped: Option<StopReason>,
        remaining: Duration,
    ) -> RetryReport {
        RetryReport {
            key: self.key.clone(),
            key_minted: self.key_minted,
            attempts: state.attempts(),
            delays: delays.to_vec(),
            stopped,
            remaining,
            budget_left: self.budget.as_ref().map(RetryBudget::available),
            counted_attempts: state.counted_attempts(),
        }
    }
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
        let op = Operation {
            key,
            key_minted,
            budget: self.budgets.for_url(req.url()),
        };
        let bucket = op
            .budget
            .as_ref()
            .map(|_| bucket_label(&self.budgets, req.url()));
        let method = req.method().to_string();
        let url = req.url().to_string();
        let mut state = self.next_state();
        let mut delays = Vec::new();
        // Why the next attempt is sent and how long we waited before it, for its span.
        let mut why: &'static str = "first";
        let mut waited = Duration::ZERO;
        // One request for the whole operation; attempts are clones of it, or, for a body that
        // can be sent only once, the request itself on its one attempt.
        let mut template = Some(req);

        // Bounded: every pass either returns or records one attempt, and the policy stops at
        // `max_sends` (and at `max_attempts`, and at the deadline).
        loop {
            let elapsed = self.elapsed(start);
            if policy.remaining(elapsed).is_zero() {
                telemetry::gave_up("deadline-exceeded");
                return Err(wrap(Error::DeadlineExceeded {
                    attempt: state.attempts() + 1,
                    key: op.key,
                }));
            }
            let timeout = policy.timeout_for_attempt(elapsed);
            let (mut attempt, replayable) = match template.as_ref().and_then(Request::try_clone) {
                Some(clone) => (clone, true),
                None => match template.take() {
                    Some(original) => (original, false),
                    // Unreachable: a request that cannot be cloned is sent once, then we stop.
                    None => {
                        return Err(wrap(Error::DeadlineExceeded {
                            attempt: state.attempts() + 1,
                            key: op.key,
                        }));
                    }
                },
            };
            let number = state.attempts() + 1;
            if let Some(name) = &self.attempt_header {
                attempt
                    .headers_mut()
                    .insert(name.clone(), HeaderValue::from(number));
            }
            if self.deadline_header {
                // From the same instant as the attempt's timeout, so it never exceeds what
                // this loop will wait (clause `idem.client.deadline-header-truthful`); a
                // caller's own value is replaced, since only this loop knows what is left.
                attempt.headers_mut().insert(
                    REQUEST_DEADLINE_MS,
                    HeaderValue::from(
                        millis(policy.remaining(elapsed)).min(REQUEST_DEADLINE_MAX_MS),
                    ),
                );
            }
            extensions.insert(AttemptInfo { number, timeout });
            let span = tracing::info_span!(
                target: "idem_client::attempt",
                "idem_client.attempt",
                attempt = number,
                reason = why,
                wait_ms = millis(waited),
                timeout_ms = millis(timeout),
                method = %method,
                outcome = tracing::field::Empty,
                status = tracing::field::Empty,
                decision = tracing::field::Empty,
            );
            let (outcome, held) = self
                .attempt(attempt, extensions, next.clone(), &policy, timeout)
                .instrument(span.clone())
                .await?;
            let outcome_label = telemetry::outcome_label(&outcome);
            span.record("outcome", outcome_label);
            if let Outcome::Response { status, .. } = &outcome {
                span.record("status", *status);
            }
            telemetry::attempt(outcome_label);
            let elapsed = self.elapsed(start);
            let budget = op.budget.as_ref();
            let decision = policy.decide(&mut state, facts, &outcome, elapsed, budget);
            if let (Some(b), Some(label)) = (budget, &bucket) {
                telemetry::budget_level(label, b.available());
            }
            let plan = match decision {
                Decision::Done => {
                    span.record("decision", "done");
                    telemetry::done();
                    let report = op.report(&state, &delays, None, policy.remaining(elapsed));
                    return finish(held, report);
                }
                Decision::Stop(reason) => {
                    span.record("decision", "stop");
                    telemetry::stopped(&reason);
                    let report =
                        op.report(&state, &delays, Some(reason), policy.remaining(elapsed));
                    return finish(held, report);
                }
                Decision::Retry(plan) if !replayable => {
                    // The policy would retry, but the body is gone: give the tokens back.
                    if let Some(b) = budget {
                        b.deposit(plan.cost);
                    }
                    span.record("decision", "stop");
                    let reason = StopReason::BodyNotReplayable;
                    telemetry::stopped(&reason);
                    let report =
                        op.report(&state, &delays, Some(reason), policy.remaining(elapsed));
                    return finish(held, report);
                }
                Decision::Retry(plan) => plan,
            };
            let event = RetryEvent {
                plan,
                key: op.key.clone(),
                method: method.clone(),
                url: url.clone(),
            };
            if let Some(hook) = &self.hook
                && hook(&event) == HookVerdict::Veto
            {
                if let Some(b) = budget {
                    b.deposit(event.plan.cost);
                }
                span.record("decision", "vetoed");
                tracing::info!(
                    target: "idem_client::retry",
                    attempt = event.plan.failed_attempt,
                    reason = %event.plan.reason,
                    "retry vetoed by the on_retry hook"
                );
                telemetry::stopped(&StopReason::Vetoed);
                let report = op.report(
                    &state,
                    &delays,
                    Some(StopReason::Vetoed),
                    policy.remaining(elapsed),
                );
                return finish(held, report);
            }
            span.record("decision", "retry");
            drop(span);
            emit(&event);
            telemetry::retry(&event.plan);
            drop(held);
            self.clock.sleep(event.plan.delay).await;
            delays.push(event.plan.delay);
            why = event.plan.reason.as_str();
            waited = event.plan.delay;
        }
    }
}

/// Milliseconds, saturating, for span and event fields.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn wrap(e: Error) -> reqwest_middleware::Error {
    reqwest_middleware::Error::Middleware(e.into())
}

/// Sorts a reqwest error by what it proves about the request (see [`crate::policy`]): a connect
/// error was never sent; a timeout, reset, abort, broken pipe, incomplete message or canceled
/// exchange may have been processed; anything else is not a network hiccup.
fn transport_outcome(e: &reqwest::Error) -> Outcome {
    if e.is_connect() {
        Outcome::ConnectError
    } else if e.is_timeout() {
        Outcome::Timeout
    } else if connection_lost(e) {
        Outcome::ConnectionLost
    } else {
        Outcome::OtherTransport
    }
}

/// Whether the error chain says the connection went away under the exchange.
fn connection_lost(e: &reqwest::Error) -> bool {
    use std::io::ErrorKind::*;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    // Bounded by the chain's length; error chains are short and finite.
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | NotConnected
            )
        {
            return true;
        }
        if let Some(h) = err.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message()
                || h.is_canceled()
                || h.is_closed()
                || h.is_body_write_aborted())
        {
            return true;
        }
        source = err.source();
    }
    false
}

/// Reads what the policy needs from a response: status, `Retry-After`, and, where the policy
/// says the decision can depend on it, the problem body's `code` and `retryable` (buffering that
/// small body and handing back an equivalent response).
async fn observe_response(
    resp: Response,
    policy: &RetryPolicy,
    wall: std::time::SystemTime,
) -> (Outcome, Held) {
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, wall));
    let (problem, resp, in_memory) = if policy.reads_problem(status) {
        body::read_problem(resp).await
    } else {
        (body::ProblemFacts::default(), resp, false)
    };
    (
        Outcome::Response {
            status,
            retry_after,
            problem_code: problem.code,
            problem_retryable: problem.retryable,
        },
        Held::Response {
            resp,
            body_deadline: policy.body_timeout.filter(|_| !in_memory),
        },
    )
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

/// Hands back the last response with its report, or, when the last attempt got no response,
/// [`Error::GaveUp`] with the same facts.
fn finish(held: Held, report: RetryReport) -> reqwest_middleware::Result<Response> {
    if let Some(reason) = &report.stopped {
        tracing::debug!(target: "idem_client::retry", attempts = report.attempts, %reason, "not retrying");
    }
    match held {
        Held::Response {
            resp,
            body_deadline,
        } => {
            let mut resp = match body_deadline {
                Some(limit) => {
                    let now = tokio::time::Instant::now();
                    match now.checked_add(limit) {
                        Some(ends) => body::with_deadline(resp, ends, limit),
                        None => resp,
                    }
                }
                None => resp,
            };
            resp.extensions_mut().insert(report);
            Ok(resp)
        }
        Held::Failed(source) => Err(wrap(Error::GaveUp {
            // The policy only answers Done for a response, so a failure always has a reason.
            reason: report
                .stopped
                .unwrap_or(StopReason::NotRetryable { status: None }),
            attempts: report.attempts,
            key: report.key,
            source,
        })),
    }
}
