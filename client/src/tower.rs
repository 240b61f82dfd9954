//! The same retry policy for tower and hyper users: [`IdemRetryPolicy`] is a
//! [`tower::retry::Policy`] whose every "whether" and "how long" is
//! [`RetryPolicy::decide`]'s, and [`IdemRetryLayer`] adds it (with automatic keys) to any
//! `Service<http::Request<B>>` whose body can be cloned.
//!
//! ```
//! use std::time::Duration;
//! use idem_client::tower::IdemRetryLayer;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! // Any `Service<http::Request<B>>` with a clonable body: a hyper client, or this stand-in.
//! let svc = tower::service_fn(|req: http::Request<String>| async move {
//!     // The layer gave the POST a key, which every attempt carries.
//!     assert!(req.headers().contains_key("idempotency-key"));
//!     Ok::<_, tower::BoxError>(http::Response::new(String::new()))
//! });
//! let client = ServiceBuilder::new()
//!     .layer(IdemRetryLayer::default())
//!     // Inside the retry layer: each attempt gets its own timeout to the response's head.
//!     .timeout(Duration::from_secs(10))
//!     .service(svc);
//! let resp = client
//!     .oneshot(http::Request::post("http://127.0.0.1:8080/orders").body("{}".to_owned())?)
//!     .await?;
//! assert_eq!(resp.status(), 200);
//! # Ok(()) }
//! ```
//!
//! What differs from [`RetryMiddleware`](crate::RetryMiddleware), because a tower policy sees
//! less:
//!
//! - the deadline runs from the moment the service is called; the attempt timeout is a
//!   `tower::timeout` layer *inside* this one (as above), whose `Elapsed` error is a timeout;
//! - the policy sees status and headers, not the body: a `409` counts as in flight when its
//!   response carries a [`ProblemHint`] extension (put there by an inner layer that reads the
//!   problem document) saying so; without one, a `409` is final, the safe reading;
//! - errors are sorted by [`outcome_of_error`] (walking the error's sources: a refused
//!   connection, a reset, a timeout), or by the classifier given to
//!   [`IdemRetryPolicy::with_error_classifier`].
//!
//! tower clones the policy for each request (`Retry::call`), and each clone starts a fresh
//! operation: its own attempt count, jitter stream and deadline, sharing the budgets and the
//! seed stream of the policy it was cloned from.
//!
//! Every attempt carries [`REQUEST_DEADLINE_MS`], what is left of the policy's deadline in
//! milliseconds (clause `idem.client.deadline-header`), unless
//! [`IdemRetryLayer::without_deadline_header`] turns it off. A policy cannot touch the first
//! attempt, and what it could write on a retry is read before its sleep, so the layer marks the
//! request with the operation's end and a service *inside* the retry writes the value as each
//! attempt leaves: it never exceeds what is left (`idem.client.deadline-header-truthful`).

use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use http::{HeaderName, HeaderValue, Request, Response};
use idem_spec::headers::{
    IDEMPOTENCY_KEY, REQUEST_DEADLINE_MAX_MS, REQUEST_DEADLINE_MS, RETRY_AFTER,
};
use tokio::time::Instant;

use crate::budget::{OriginBudgets, RetryBudget};
use crate::key::mint_key;
use crate::middleware::{ATTEMPT_COUNT_HEADER, Budgets};
use crate::policy::{
    Decision, Outcome, RequestFacts, RetryPolicy, RetryState, is_idempotent_method,
    parse_retry_after,
};
use crate::rng::SplitMix64;
use crate::telemetry;

/// The error type of most tower stacks.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What an inner layer read from a response's problem document, for the policy: put it in the
/// response's extensions. Without it, the policy decides from status and headers alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProblemHint {
    /// The problem's `code`.
    pub code: Option<String>,
    /// The problem's `retryable` member.
    pub retryable: Option<bool>,
}

/// Sorts an error by what it proves about the request, walking its sources: a refused
/// connection was never sent ([`Outcome::ConnectError`]); a timeout (an `io` timeout, or tower's
/// `Elapsed`) and a reset, abort, broken pipe or incomplete message may have been processed;
/// anything else is [`Outcome::OtherTransport`], which is never retried.
pub fn outcome_of_error(err: &(dyn std::error::Error + 'static)) -> Outcome {
    use std::io::ErrorKind::*;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    // Bounded by the chain's length; error chains are short and finite.
    while let Some(e) = source {
        if e.is::<::tower::timeout::error::Elapsed>() {
            return Outcome::Timeout;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            match io.kind() {
                ConnectionRefused => return Outcome::ConnectError,
                TimedOut => return Outcome::Timeout,
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | NotConnected => {
                    return Outcome::ConnectionLost;
                }
                _ => {}
            }
        }
        if let Some(h) = e.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message() || h.is_canceled() || h.is_closed())
        {
            return Outcome::ConnectionLost;
        }
        source = e.source();
    }
    Outcome::OtherTransport
}

fn box_outcome(e: &BoxError) -> Outcome {
    outcome_of_error(e.as_ref())
}

/// The state of one operation (one call of the service).
#[derive(Debug)]
struct Operation {
    state: RetryState,
    facts: RequestFacts,
    budget: Option<RetryBudget>,
    /// The budget gauge's `bucket` label: the origin, or `shared`.
    bucket: String,
}

type Classifier<E> = Arc<dyn Fn(&E) -> Outcome + Send + Sync>;

/// A `tower::retry::Policy` for `http::Request<B>` (with `B: Clone`) running
/// [`RetryPolicy::decide`]: the same allowlist, attempt cap, deadline, `Retry-After`, budget
/// (one bucket per origin by default), metrics and events as the reqwest middleware.
pub struct IdemRetryPolicy<E = BoxError> {
    policy: Arc<RetryPolicy>,
    budgets: Budgets,
    seeds: Arc<Mutex<SplitMix64>>,
    classify: Classifier<E>,
    attempt_header: Option<HeaderName>,
    started: Instant,
    op: Option<Operation>,
}

impl<E> std::fmt::Debug for IdemRetryPolicy<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdemRetryPolicy")
            .field("policy", &self.policy)
            .field("budgets", &self.budgets)
            .field("attempt_header", &self.attempt_header)
            .field("op", &self.op)
            .finish()
    }
}

impl<E> Clone for IdemRetryPolicy<E> {
    /// A fresh operation sharing the budgets and seed stream: tower clones the policy once per
    /// request, so this is where an operation (and its deadline) starts.
    fn clone(&self) -> Self {
        Self {
            policy: self.policy.clone(),
            budgets: self.budgets.clone(),
            seeds: self.seeds.clone(),
            classify: self.classify.clone(),
            attempt_header: self.attempt_header.clone(),
            started: Instant::now(),
            op: None,
        }
    }
}

impl Default for IdemRetryPolicy<BoxError> {
    fn default() -> Self {
        Self::new(RetryPolicy::default())
    }
}

impl IdemRetryPolicy<BoxError> {
    /// `policy` for a stack whose error is [`BoxError`], sorted by [`outcome_of_error`]; one
    /// default bucket per origin.
    pub fn new(policy: RetryPolicy) -> Self {
        Self::with_error_classifier(policy, box_outcome)
    }
}

impl<E> IdemRetryPolicy<E> {
    /// `policy` for a stack with error type `E`, sorted by `classify`.
    pub fn with_error_classifier(
        policy: RetryPolicy,
        classify: impl Fn(&E) -> Outcome + Send + Sync + 'static,
    ) -> Self {
        Self {
            policy: Arc::new(policy),
            budgets: Budgets::PerOrigin(OriginBudgets::default()),
            seeds: Arc::new(Mutex::new(SplitMix64::from_entropy())),
            classify: Arc::new(classify),
            attempt_header: None,
            started: Instant::now(),
            op: None,
        }
    }

    /// Pays every retry, whatever its origin, from the one bucket `budget`.
    pub fn with_shared_budget(mut self, budget: RetryBudget) -> Self {
        self.budgets = Budgets::Shared(budget);
        self
    }

    /// Pays retries from one bucket per origin, taken from `budgets`.
    pub fn with_budget_per_origin(mut self, budgets: OriginBudgets) -> Self {
        self.budgets = Budgets::PerOrigin(budgets);
        self
    }

    /// Retries without a budget.
    pub fn without_budget(mut self) -> Self {
        self.budgets = Budgets::None;
        self
    }

    /// Deterministic jitter (tests).
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seeds = Arc::new(Mutex::new(SplitMix64::new(seed)));
        self
    }

    /// Sends each retry's attempt number in the [`ATTEMPT_COUNT_HEADER`] header (the first
    /// attempt goes out as the caller built it).
    pub fn with_attempt_header(mut self) -> Self {
        self.attempt_header = Some(HeaderName::from_static(ATTEMPT_COUNT_HEADER));
        self
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    fn operation<B>(&mut self, req: &Request<B>) -> &mut Operation {
        let (seeds, budgets) = (&self.seeds, &self.budgets);
        self.op.get_or_insert_with(|| {
            let seed = seeds
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .next_u64();
            let origin = match (req.uri().scheme_str(), req.uri().authority()) {
                (Some(scheme), Some(authority)) => format!("{scheme}://{authority}"),
                _ => "shared".to_owned(),
            };
            Operation {
                state: RetryState::seeded(seed),
                facts: RequestFacts::new(
                    req.method().as_str(),
                    req.headers().contains_key(IDEMPOTENCY_KEY),
                ),
                budget: budgets.for_origin(&origin),
                bucket: match budgets {
                    Budgets::PerOrigin(_) => origin,
                    Budgets::Shared(_) | Budgets::None => "shared".to_owned(),
                },
            }
        })
    }
}

/// Reads status, `Retry-After` and a [`ProblemHint`] from a response.
fn outcome_of_response<B>(resp: &Response<B>) -> Outcome {
    let retry_after = resp
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, std::time::SystemTime::now()));
    let hint = resp.extensions().get::<ProblemHint>();
    Outcome::Response {
        status: resp.status().as_u16(),
        retry_after,
        problem_code: hint.and_then(|h| h.code.clone()),
        problem_retryable: hint.and_then(|h| h.retryable),
    }
}

impl<B, RB, E> ::tower::retry::Policy<Request<B>, Response<RB>, E> for IdemRetryPolicy<E>
where
    B: Clone,
{
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        req: &mut Request<B>,
        result: &mut Result<Response<RB>, E>,
    ) -> Option<Self::Future> {
        let outcome = match result {
            Ok(resp) => outcome_of_response(resp),
            Err(e) => (self.classify)(e),
        };
        telemetry::attempt(telemetry::outcome_label(&outcome));
        let elapsed = self.started.elapsed();
        let policy = self.policy.clone();
        let header = self.attempt_header.clone();
        let op = self.operation(req);
        let decision = policy.decide(
            &mut op.state,
            op.facts,
            &outcome,
            elapsed,
            op.budget.as_ref(),
        );
        if let Some(b) = &op.budget {
            telemetry::budget_level(&op.bucket, b.available());
        }
        match decision {
            Decision::Done => {
                telemetry::done();
                None
            }
            Decision::Stop(reason) => {
                tracing::debug!(target: "idem_client::retry", attempts = op.state.attempts(), %reason, "not retrying");
                telemetry::stopped(&reason);
                None
            }
            Decision::Retry(plan) => {
                tracing::info!(
                    target: "idem_client::retry",
                    attempt = plan.failed_attempt,
                    next_attempt = plan.failed_attempt + 1,
                    reason = %plan.reason,
                    class = %plan.class,
                    delay_ms = u64::try_from(plan.delay.as_millis()).unwrap_or(u64::MAX),
                    budget_left = plan.budget_left,
                    method = %req.method(),
                    "retrying"
                );
                telemetry::retry(&plan);
                if let Some(name) = header {
                    req.headers_mut()
                        .insert(name, HeaderValue::from(plan.failed_attempt + 1));
                }
                Some(tokio::time::sleep(plan.delay))
            }
        }
    }

    fn clone_request(&mut self, req: &Request<B>) -> Option<Request<B>> {
        let mut clone = Request::new(req.body().clone());
        *clone.method_mut() = req.method().clone();
        *clone.uri_mut() = req.uri().clone();
        *clone.version_mut() = req.version();
        *clone.headers_mut() = req.headers().clone();
        *clone.extensions_mut() = req.extensions().clone();
        Some(clone)
    }
}

/// When the operation a request belongs to must end: put in its extensions by [`AutoKey`]
/// (outside the retry, so before the policy's own clock starts) and read by [`DeadlineHeader`]
/// on each attempt. Starting earlier than the policy's clock keeps the value sent at or below
/// what the policy will still wait.
#[derive(Debug, Clone, Copy)]
struct OperationEnd(Instant);

/// Adds a minted `Idempotency-Key` to a non-idempotent request that has none, before the retry
/// layer sees it, so every attempt carries the same key; and marks the request with the end of
/// its operation's deadline, for [`DeadlineHeader`].
#[derive(Debug, Clone)]
pub struct AutoKey<S> {
    inner: S,
    /// Off: requests pass untouched (a request without a key stays without one).
    mint: bool,
    /// The policy's deadline, when the deadline header is on.
    deadline: Option<std::time::Duration>,
}

impl<S, B> ::tower::Service<Request<B>> for AutoKey<S>
where
    S: ::tower::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if self.mint
            && !is_idempotent_method(req.method().as_str())
            && !req.headers().contains_key(IDEMPOTENCY_KEY)
            && let Ok(value) = HeaderValue::from_str(&mint_key().to_header_value())
        {
            req.headers_mut().insert(IDEMPOTENCY_KEY, value);
        }
        if let Some(deadline) = self.deadline {
            // A deadline too far to represent is as good as none: no header then.
            if let Some(end) = Instant::now().checked_add(deadline) {
                req.extensions_mut().insert(OperationEnd(end));
            }
        }
        self.inner.call(req)
    }
}

/// Writes [`REQUEST_DEADLINE_MS`] on each attempt as it leaves, from the operation's end that
/// [`AutoKey`] marked the request with (a caller's own value is replaced, since only the retry
/// knows what is left). A request without the mark passes untouched.
#[derive(Debug, Clone)]
pub struct DeadlineHeader<S> {
    inner: S,
}

impl<S, B> ::tower::Service<Request<B>> for DeadlineHeader<S>
where
    S: ::tower::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if let Some(OperationEnd(end)) = req.extensions().get::<OperationEnd>().copied() {
            let left = end.saturating_duration_since(Instant::now());
            let ms = u64::try_from(left.as_millis())
                .unwrap_or(u64::MAX)
                .min(REQUEST_DEADLINE_MAX_MS);
            req.headers_mut()
                .insert(REQUEST_DEADLINE_MS, HeaderValue::from(ms));
        }
        self.inner.call(req)
    }
}

/// The layer: automatic keys (on by default) and the deadline header (on by default) around a
/// `tower::retry::Retry` running [`IdemRetryPolicy`].
#[derive(Debug, Clone)]
pub struct IdemRetryLayer<E = BoxError> {
    policy: IdemRetryPolicy<E>,
    auto_keys: bool,
    deadline_header: bool,
}

impl Default for IdemRetryLayer<BoxError> {
    fn default() -> Self {
        Self::new(IdemRetryPolicy::default())
    }
}

impl<E> IdemRetryLayer<E> {
    /// A layer running `policy`, with automatic keys and the deadline header.
    pub fn new(policy: IdemRetryPolicy<E>) -> Self {
        Self {
            policy,
            auto_keys: true,
            deadline_header: true,
        }
    }

    /// Whether to mint a key for a non-idempotent request without one (default on).
    pub fn auto_keys(mut self, on: bool) -> Self {
        self.auto_keys = on;
        self
    }

    /// Stops sending [`REQUEST_DEADLINE_MS`] (on by default, clause
    /// `idem.client.deadline-header`). For an API that rejects unknown headers; the deadline
    /// itself still holds.
    pub fn without_deadline_header(mut self) -> Self {
        self.deadline_header = false;
        self
    }
}

/// The service [`IdemRetryLayer`] builds.
pub type IdemRetry<S, E = BoxError> =
    AutoKey<::tower::retry::Retry<IdemRetryPolicy<E>, DeadlineHeader<S>>>;

impl<S, E> ::tower::Layer<S> for IdemRetryLayer<E> {
    type Service = IdemRetry<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        AutoKey {
            inner: ::tower::retry::Retry::new(self.policy.clone(), DeadlineHeader { inner }),
            mint: self.auto_keys,
            deadline: self
                .deadline_header
                .then(|| self.policy.policy().remaining(std::time::Duration::ZERO)),
        }
    }
}
