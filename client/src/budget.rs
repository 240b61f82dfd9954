//! The retry budget: one token bucket shared by every request of a client.
//!
//! A per-request cap ("at most 3 attempts") bounds how much one call can amplify; it does nothing
//! about a fleet. When a dependency is down, every request fails, every request retries, and a
//! 3-attempt cap means the struggling service receives three times its normal load exactly when
//! it can least absorb it. A budget shared across requests measures the client's *recent* failure
//! rate instead: while failures are rare it permits retries freely, and once they dominate it
//! stops retrying, so the load the client offers falls back to about one attempt per call.
//!
//! Marc Brooker's later posts make the argument this module rests on. In "What is Backoff For?"
//! (2022, <https://brooker.co.za/blog/2022/08/11/backoff.html>) he separates closed systems,
//! where a fixed set of clients waits for answers and backing off really lowers the load, from
//! open ones, where new work keeps arriving regardless: there backoff only delays retries, it
//! does not remove any, so it cannot pull an overloaded service back. In "Fixing retries with
//! token buckets and circuit breakers" (2022, <https://brooker.co.za/blog/2022/02/28/retries.html>)
//! he compares "N retries" with a token bucket: at a low failure rate the two behave alike, but
//! when everything fails, N retries multiplies the work by N + 1 while the bucket settles at a
//! small fraction of a retry per call. A fixed retry count is a per-call promise; a budget is a
//! promise about the whole client. `idem-sim`'s outage scenario shows both fleets side by side.
//!
//! The numbers follow the AWS SDKs' 2026 "standard" mode (clause `idem.client.budget`): capacity
//! 500, a transient-error retry costs 14, a throttling retry costs 5 (throttling says "the server
//! is healthy, come back later", so it is cheaper). The refund rule is that mode's too, exactly
//! as botocore's `RetryQuotaChecker` implements it: a 2xx that ends an operation on its **first**
//! attempt returns 1 token; a 2xx that ends an operation **after retries** returns the cost of its
//! *last* retry (the earlier retries of that operation stay spent); anything else returns nothing.
//! So a failure that one retry cures costs the bucket nothing once it is cured, and only failures
//! that stay failed drain it. (A flat refund of 1 per success, this crate's first rule, drains the
//! bucket under a steady 10 % of cured failures and then refuses retries that would have worked;
//! [`RetriedRefund::Flat`] keeps it for comparison.)
//!
//! A budget measures the health of *one* service, so the middleware keeps one bucket per origin
//! (scheme, host, port) by default ([`OriginBudgets`]): twenty failing calls to one host must not
//! stop a single 503 on a healthy host from being retried. [`RetryBudget`] is one bucket; share
//! one across origins only on purpose (several names for the same backend).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

/// What kind of failure a retry answers; decides its cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RetryClass {
    /// The server or the network failed (connect error, timeout, 408, 500, 502, 503, 504).
    Transient,
    /// The server asked us to slow down or come back later (429, 503 with `Retry-After`, 409
    /// `idempotency_key_in_use`).
    Throttling,
}

impl fmt::Display for RetryClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RetryClass::Transient => "transient",
            RetryClass::Throttling => "throttling",
        })
    }
}

/// The bucket's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetConfig {
    /// Tokens when full (and at start).
    pub capacity: u32,
    /// Cost of a [`RetryClass::Transient`] retry.
    pub transient_cost: u32,
    /// Cost of a [`RetryClass::Throttling`] retry.
    pub throttling_cost: u32,
    /// Tokens returned by a 2xx on an operation's first attempt (AWS: `NO_RETRY_INCREMENT`).
    pub success_refund: u32,
    /// What a 2xx after retries returns.
    pub retried_refund: RetriedRefund,
}

/// What a success that needed retries puts back into the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum RetriedRefund {
    /// The cost of the operation's last retry (the AWS standard mode; the default): the retry
    /// that worked is paid back, earlier ones stay spent.
    #[default]
    LastRetryCost,
    /// The same [`BudgetConfig::success_refund`] as a first-attempt success. A stricter bucket
    /// that drains under a steady rate of failures one retry cures; idem-client's first rule,
    /// kept so that difference can be measured (see the `budget_figures` tests).
    Flat,
}

impl Default for BudgetConfig {
    /// 500 / 14 / 5, refund 1, or the last retry's cost after retries (clause `idem.client.budget`).
    fn default() -> Self {
        Self {
            capacity: 500,
            transient_cost: 14,
            throttling_cost: 5,
            success_refund: 1,
            retried_refund: RetriedRefund::LastRetryCost,
        }
    }
}

impl BudgetConfig {
    /// The cost of one retry of `class`.
    pub fn cost(&self, class: RetryClass) -> u32 {
        match class {
            RetryClass::Transient => self.transient_cost,
            RetryClass::Throttling => self.throttling_cost,
        }
    }
}

/// Why a withdrawal was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exhausted {
    /// What the retry would have cost.
    pub cost: u32,
    /// What was left.
    pub available: u32,
}

/// The bucket itself: plain data, no locking. [`RetryBudget`] shares one between requests; the
/// simulator drives one per simulated client directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    config: BudgetConfig,
    available: u32,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(config: BudgetConfig) -> Self {
        Self {
            config,
            available: config.capacity,
        }
    }

    /// Tokens left.
    pub fn available(&self) -> u32 {
        self.available
    }

    /// The parameters.
    pub fn config(&self) -> BudgetConfig {
        self.config
    }

    /// Withdraws the cost of one retry of `class`, or refuses without withdrawing anything.
    /// Returns the cost paid.
    pub fn try_withdraw(&mut self, class: RetryClass) -> Result<u32, Exhausted> {
        let cost = self.config.cost(class);
        if cost > self.available {
            return Err(Exhausted {
                cost,
                available: self.available,
            });
        }
        self.available -= cost;
        Ok(cost)
    }

    /// Records a 2xx that ended an operation. `last_retry_cost` is what the operation's last
    /// retry paid, `None` when it succeeded on its first attempt. Refunds (up to capacity)
    /// [`BudgetConfig::success_refund`] for a first-attempt success, and after retries what
    /// [`BudgetConfig::retried_refund`] says.
    pub fn on_success(&mut self, last_retry_cost: Option<u32>) {
        let tokens = match (last_retry_cost, self.config.retried_refund) {
            (Some(cost), RetriedRefund::LastRetryCost) => cost,
            (Some(_), RetriedRefund::Flat) | (None, _) => self.config.success_refund,
        };
        self.deposit(tokens);
    }

    /// Whether the bucket is at capacity, i.e. indistinguishable from a new one.
    pub fn is_full(&self) -> bool {
        self.available >= self.config.capacity
    }

    /// Returns tokens taken for a retry that did not happen (e.g. vetoed by a hook).
    pub fn deposit(&mut self, tokens: u32) {
        self.available = self
            .available
            .saturating_add(tokens)
            .min(self.config.capacity);
    }
}

/// A cheaply clonable handle to one bucket shared by every request of a client.
#[derive(Debug, Clone)]
pub struct RetryBudget {
    inner: Arc<Mutex<TokenBucket>>,
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self::new(BudgetConfig::default())
    }
}

impl RetryBudget {
    /// A full bucket with `config`.
    pub fn new(config: BudgetConfig) -> Self {
        Self {
            inner: Arc::new(Mutex::new(TokenBucket::new(config))),
        }
    }

    /// Runs `f` with the bucket locked. A poisoned lock is recovered: the bucket is plain
    /// counters, always consistent between statements.
    pub fn with<R>(&self, f: impl FnOnce(&mut TokenBucket) -> R) -> R {
        let mut guard = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut guard)
    }

    /// Tokens left right now.
    pub fn available(&self) -> u32 {
        self.with(|b| b.available())
    }

    /// See [`TokenBucket::try_withdraw`].
    pub fn try_withdraw(&self, class: RetryClass) -> Result<u32, Exhausted> {
        self.with(|b| b.try_withdraw(class))
    }

    /// See [`TokenBucket::on_success`].
    pub fn on_success(&self, last_retry_cost: Option<u32>) {
        self.with(|b| b.on_success(last_retry_cost))
    }

    /// See [`TokenBucket::deposit`].
    pub fn deposit(&self, tokens: u32) {
        self.with(|b| b.deposit(tokens))
    }

    /// Whether `self` and `other` are handles to the same bucket.
    pub fn same_bucket(&self, other: &RetryBudget) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Full and held by nobody but the map it sits in: dropping it loses nothing, because a new
    /// bucket for that origin starts full too.
    fn is_idle_and_full(&self) -> bool {
        Arc::strong_count(&self.inner) == 1 && self.with(|b| b.is_full())
    }
}

/// The most origins [`OriginBudgets`] tracks by default before sharing one overflow bucket.
pub const DEFAULT_MAX_ORIGINS: usize = 1024;

/// One [`RetryBudget`] per origin, each created full on first use: the middleware's default.
///
/// An origin is what [`url::Origin::ascii_serialization`](reqwest::Url::origin) prints
/// (`https://api.example.com`, `http://127.0.0.1:8080`): scheme, host and port, so two hosts
/// never share a bucket and one host's outage never spends another's retries. Clones share the
/// same buckets (share one value between clients that call the same services).
///
/// Memory is bounded: at most `max_origins` buckets are kept. When a new origin arrives at the
/// limit, buckets that are full and not in use are dropped first (a full bucket is
/// indistinguishable from a new one, so nothing is lost); if every bucket is still draining, the
/// new origin shares one overflow bucket with the other late arrivals, which can only make
/// retries scarcer, never more plentiful.
#[derive(Debug, Clone)]
pub struct OriginBudgets {
    config: BudgetConfig,
    max_origins: usize,
    inner: Arc<Mutex<OriginMap>>,
}

#[derive(Debug)]
struct OriginMap {
    buckets: HashMap<String, RetryBudget>,
    overflow: RetryBudget,
}

impl Default for OriginBudgets {
    fn default() -> Self {
        Self::new(BudgetConfig::default())
    }
}

impl OriginBudgets {
    /// Buckets with `config`, at most [`DEFAULT_MAX_ORIGINS`] of them.
    pub fn new(config: BudgetConfig) -> Self {
        Self {
            config,
            max_origins: DEFAULT_MAX_ORIGINS,
            inner: Arc::new(Mutex::new(OriginMap {
                buckets: HashMap::new(),
                overflow: RetryBudget::new(config),
            })),
        }
    }

    /// Keeps at most `max` per-origin buckets (at least 1).
    pub fn with_max_origins(mut self, max: usize) -> Self {
        self.max_origins = max.max(1);
        self
    }

    /// The parameters every bucket starts with.
    pub fn config(&self) -> BudgetConfig {
        self.config
    }

    /// The bucket of `url`'s origin.
    pub fn for_url(&self, url: &reqwest::Url) -> RetryBudget {
        self.for_origin(&url.origin().ascii_serialization())
    }

    /// The bucket of `origin` (as [`OriginBudgets::for_url`] spells it), created full when new.
    pub fn for_origin(&self, origin: &str) -> RetryBudget {
        let mut map = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(b) = map.buckets.get(origin) {
            return b.clone();
        }
        if map.buckets.len() >= self.max_origins {
            map.buckets.retain(|_, b| !b.is_idle_and_full());
        }
        if map.buckets.len() >= self.max_origins {
            return map.overflow.clone();
        }
        let bucket = RetryBudget::new(self.config);
        map.buckets.insert(origin.to_owned(), bucket.clone());
        bucket
    }

    /// Tokens left for `origin`: the capacity when it has no bucket (yet, or any more).
    pub fn available(&self, origin: &str) -> u32 {
        let map = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        map.buckets
            .get(origin)
            .map_or(self.config.capacity, RetryBudget::available)
    }

    /// How many origins have a bucket of their own right now.
    pub fn tracked(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .buckets
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // clause: idem.client.budget
    #[test]
    fn transient_retries_exhaust_a_full_bucket_after_35() {
        let mut b = TokenBucket::new(BudgetConfig::default());
        assert_eq!(b.available(), 500);
        for i in 0..35 {
            assert_eq!(b.try_withdraw(RetryClass::Transient), Ok(14), "retry {i}");
        }
        assert_eq!(b.available(), 10);
        assert_eq!(
            b.try_withdraw(RetryClass::Transient),
            Err(Exhausted {
                cost: 14,
                available: 10
            })
        );
        // A refusal withdraws nothing; a cheaper throttling retry still fits twice.
        assert_eq!(b.try_withdraw(RetryClass::Throttling), Ok(5));
        assert_eq!(b.try_withdraw(RetryClass::Throttling), Ok(5));
        assert_eq!(b.available(), 0);
        assert!(b.try_withdraw(RetryClass::Throttling).is_err());
    }

    // clause: idem.client.budget
    #[test]
    fn throttling_retries_cost_5_and_successes_refill_by_1_up_to_capacity() {
        let mut b = TokenBucket::new(BudgetConfig::default());
        for _ in 0..100 {
            b.try_withdraw(RetryClass::Throttling)
                .expect("100 throttling retries fit");
        }
        assert_eq!(b.available(), 0);
        for _ in 0..13 {
            b.on_success(None);
        }
        assert!(b.try_withdraw(RetryClass::Transient).is_err());
        b.on_success(None);
        assert_eq!(b.try_withdraw(RetryClass::Transient), Ok(14));
        for _ in 0..1000 {
            b.on_success(None);
        }
        assert_eq!(b.available(), 500);
    }

    // clause: idem.client.budget
    #[test]
    fn clones_share_one_bucket() {
        let a = RetryBudget::default();
        let b = a.clone();
        a.try_withdraw(RetryClass::Transient).expect("full");
        assert_eq!(b.available(), 486);
        b.deposit(100);
        assert_eq!(a.available(), 500);
    }

    // clause: idem.client.budget
    #[test]
    fn a_retried_success_refunds_its_last_retry_and_a_first_attempt_success_refunds_1() {
        let mut b = TokenBucket::new(BudgetConfig::default());
        // An operation that retried twice (transient, then throttling) and then succeeded: the
        // last retry's 5 come back, the first retry's 14 stay spent.
        b.try_withdraw(RetryClass::Transient).expect("full");
        b.try_withdraw(RetryClass::Throttling).expect("full");
        assert_eq!(b.available(), 481);
        b.on_success(Some(5));
        assert_eq!(b.available(), 486);
        // One transient retry that worked costs nothing in the end.
        b.try_withdraw(RetryClass::Transient).expect("enough");
        b.on_success(Some(14));
        assert_eq!(b.available(), 486);
        b.on_success(None);
        assert_eq!(b.available(), 487);
        // Never above capacity.
        for _ in 0..20 {
            b.on_success(Some(14));
        }
        assert_eq!(b.available(), 500);

        let mut flat = TokenBucket::new(BudgetConfig {
            retried_refund: RetriedRefund::Flat,
            ..BudgetConfig::default()
        });
        flat.try_withdraw(RetryClass::Transient).expect("full");
        flat.on_success(Some(14));
        assert_eq!(flat.available(), 487);
    }

    // clause: idem.client.budget
    #[test]
    fn each_origin_has_its_own_bucket() {
        let budgets = OriginBudgets::default();
        let a = budgets.for_origin("http://127.0.0.1:1");
        let b = budgets.for_origin("http://127.0.0.1:2");
        assert!(!a.same_bucket(&b));
        assert!(a.same_bucket(&budgets.for_origin("http://127.0.0.1:1")));
        for _ in 0..35 {
            a.try_withdraw(RetryClass::Transient).expect("fits");
        }
        assert_eq!(budgets.available("http://127.0.0.1:1"), 10);
        assert_eq!(budgets.available("http://127.0.0.1:2"), 500);
        assert_eq!(budgets.available("http://never.seen"), 500);
        let url = reqwest::Url::parse("http://127.0.0.1:1/orders?x=1").expect("url");
        assert!(budgets.for_url(&url).same_bucket(&a));
        // Scheme and port are part of the origin.
        let https = reqwest::Url::parse("https://127.0.0.1:1/orders").expect("url");
        assert!(!budgets.for_url(&https).same_bucket(&a));
    }

    // clause: idem.client.budget
    #[test]
    fn origin_buckets_are_bounded_and_never_forget_a_draining_bucket() {
        let budgets = OriginBudgets::default().with_max_origins(2);
        let draining = budgets.for_origin("a");
        draining.try_withdraw(RetryClass::Transient).expect("full");
        drop(draining);
        // "b" is full and idle: it is dropped to make room for "c"; "a" is kept.
        drop(budgets.for_origin("b"));
        let c = budgets.for_origin("c");
        assert_eq!(budgets.tracked(), 2);
        assert_eq!(budgets.available("a"), 486);
        // "c" is in use (held here), "a" is draining: "d" shares the overflow bucket.
        let d = budgets.for_origin("d");
        let e = budgets.for_origin("e");
        assert!(d.same_bucket(&e));
        assert!(!d.same_bucket(&c));
        assert_eq!(budgets.tracked(), 2);
        assert_eq!(budgets.available("a"), 486);
    }
}
