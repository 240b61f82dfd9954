//! # idem-client: the retry half of the idempotency contract
//!
//! An idempotency key only protects an operation if the client retries *the right things, the
//! right way*: the same key on every attempt, only outcomes that are safe to repeat, spaced out
//! so a fleet does not stampede, and never beyond a deadline or a budget. This crate is the
//! reference implementation of the client clauses (`idem.client.*`) of the idemkit book.
//!
//! ## Layout
//!
//! - [`policy`]: the pure decision ([`RetryPolicy::decide`]): allowlist, attempt cap, deadline,
//!   `Retry-After`, budget; typed [`StopReason`]s for every refusal.
//! - [`backoff`]: the jitter family ([`Jitter`]), each formula documented on its variant.
//! - [`budget`]: the shared token bucket ([`RetryBudget`]) and why it beats a retry count.
//! - [`key`]: minting and deriving keys, and why a fresh key per attempt is impossible here.
//! - [`clock`]: injectable time ([`Clock`], [`ManualClock`]).
//! - [`decisions`]: the decision table the book prints, built from the policy itself.
//! - [`middleware`]: [`RetryMiddleware`], the mechanism, for `reqwest_middleware`.
//! - [`telemetry`]: what the client counts through the `metrics` facade.
//! - [`tower`]: the same policy as a `tower::retry::Policy`, for tower and hyper users.
//! - [`rng`]: the tiny specified generator that makes schedules reproducible in any language.
//! - [`vectors`]: the golden delay schedules published in `client/vectors/backoff.json`.
//! - `sim` (feature `sim`, off by default): the fleet simulator behind the `idem-sim` binary and
//!   the book's plots.
//!
//! ## One line for a reqwest user
//!
//! ```no_run
//! # async fn run() -> Result<(), reqwest_middleware::Error> {
//! use idem_client::RetryMiddleware;
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(RetryMiddleware::default())
//!     .build();
//! // POST without a key: the middleware mints one and reuses it on every attempt.
//! let resp = client.post("http://127.0.0.1:8080/orders").body("{}").send().await?;
//! let report = resp.extensions().get::<idem_client::RetryReport>();
//! # let _ = report; Ok(()) }
//! ```
//!
//! `examples/middleware.rs` (shown in the crate README and the book, and run by the crate's
//! tests) does the same with a key derived from the event that caused the operation, and reads
//! the report. Every response comes back, whatever its status, with a [`RetryReport`]; only an
//! operation whose last attempt got no response at all fails, with [`Error::GaveUp`] carrying
//! the key to store ([`Error::key`]).
//!
//! ## Why these defaults
//!
//! Three attempts with full jitter (500 ms base, 20 s cap) is what the large SDKs converged on,
//! and full jitter did the least work in Brooker's 2015 experiment, which `idem-sim` reproduces.
//! The attempt cap protects one call; the budget protects the service a whole fleet calls,
//! which a cap cannot, so there is one bucket per origin, refunded the way the AWS SDKs' standard
//! mode refunds it (see [`budget`]). A single deadline spans the call, because a per-attempt
//! timeout that restarts on every retry lets a "5 s timeout" take 20 s; each attempt still gets
//! at most `attempt_timeout` (10 s) of it to see the response's head, so one hung attempt leaves
//! room for another (the body is the caller's to read, and is not cut). The cap counts attempts
//! the server may have executed: a refused connection (a restart) and a `409` in flight (a
//! crashed holder's lease) pay the budget instead, so a default client rides out a server crash
//! within its deadline (see [`policy`]).
//!
//! ## How it compares
//!
//! On each behaviour the client's issue tracker asked about, next to the retry layers a Rust
//! user would otherwise reach for and the two budgets it borrows from:
//!
#![doc = include_str!("../docs/comparison.md")]

pub mod backoff;
mod body;
pub mod budget;
pub mod clock;
pub mod decisions;
mod error;
pub mod key;
pub mod middleware;
pub mod policy;
pub mod rng;
#[cfg(feature = "sim")]
pub mod sim;
pub mod telemetry;
pub mod tower;
pub mod vectors;

pub use backoff::{Backoff, Jitter};
pub use budget::{
    BudgetConfig, OriginBudgets, RetriedRefund, RetryBudget, RetryClass, TokenBucket,
};
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{AttemptError, Error};
/// The key type, re-exported so a caller can store, parse and pass keys without depending on
/// `idem-spec` itself.
pub use idem_spec::IdempotencyKey;
pub use key::{derive_key, mint_key};
pub use middleware::{
    ATTEMPT_COUNT_HEADER, AttemptInfo, Budgets, Deadline, HookVerdict, RetryEvent, RetryMiddleware,
    RetryReport,
};
pub use policy::{
    AddedRetry, Decision, Outcome, RequestFacts, RetryPlan, RetryPolicy, RetryReason, RetryState,
    StopReason,
};
