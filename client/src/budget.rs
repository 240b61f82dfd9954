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
//! is healthy, come back later", so it is cheaper), each success refunds 1.

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
    /// Tokens returned by each successful response.
    pub success_refund: u32,
}

impl Default for BudgetConfig {
    /// 500 / 14 / 5 / 1 (clause `idem.client.budget`).
    fn default() -> Self {
        Self {
            capacity: 500,
            transient_cost: 14,
            throttling_cost: 5,
            success_refund: 1,
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

    /// Records a successful response: refunds [`BudgetConfig::success_refund`], up to capacity.
    pub fn on_success(&mut self) {
        self.deposit(self.config.success_refund);
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
    pub fn on_success(&self) {
        self.with(TokenBucket::on_success)
    }

    /// See [`TokenBucket::deposit`].
    pub fn deposit(&self, tokens: u32) {
        self.with(|b| b.deposit(tokens))
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
            b.on_success();
        }
        assert!(b.try_withdraw(RetryClass::Transient).is_err());
        b.on_success();
        assert_eq!(b.try_withdraw(RetryClass::Transient), Ok(14));
        for _ in 0..1000 {
            b.on_success();
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
}
