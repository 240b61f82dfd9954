//! Retry amplification during an outage: a fleet of clients, a backend that is down for a while,
//! and the client's own [`RetryPolicy`] deciding every retry, with and without the shared budget.
//!
//! Brooker's 2015 experiment is closed-loop: a fixed set of clients, each doing one thing, so
//! backing off really does lower the load. Production fleets are closer to open-loop: new calls
//! keep arriving whatever happened to the last ones. Then every failed call adds its retries on
//! top of the new arrivals, and an attempt cap of 3 means up to three times the normal load
//! during the outage, the moment the backend can least take it. A token bucket shared by a
//! client's calls notices that most calls are failing and stops paying for retries, so the load
//! falls back towards one attempt per call (plus the bucket's initial reserve).
//!
//! The model: `clients` clients each start a call every `1 / rate` seconds (random phase);
//! every hop takes `|Normal(10 ms, sd 2 ms)|`; the backend answers 503 (no `Retry-After`) to
//! every attempt that reaches it during the outage and 200 otherwise; the calls are POSTs with
//! an idempotency key, so every failure is retryable under the contract; the per-client budget
//! (when on) is the default 500/14/5/1 bucket. Deterministic for a seed.
//!
//! A second failure mode, [`Failure::Refused`], is a server restarting: while it is down every
//! connection is refused (the refusal comes back after one hop). A refused connection does not
//! count against the attempt cap (see [`crate::policy`]), so there the budget, the deadline and
//! the send ceiling are what bound a fleet; [`OutageConfig::budget_bound`] is the most load the
//! budget lets through while the backend is down, and the tests check every budgeted fleet stays
//! under it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use crate::budget::RetryBudget;
use crate::policy::{Decision, Outcome, RequestFacts, RetryPolicy, RetryState, StopReason};
use crate::rng::SplitMix64;

/// One fleet configuration to compare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutageScenario {
    /// Label in tables and plots.
    pub label: String,
    /// Attempt cap (1 = no retries).
    pub max_attempts: u32,
    /// Whether each client shares the default token bucket across its calls.
    pub budget: bool,
    /// The ceiling on requests sent per call ([`RetryPolicy::max_sends`]); `None` keeps the
    /// policy's default. Equal to `max_attempts`, it is the rule before issue 22: every request,
    /// refused ones included, counted against one cap.
    pub max_sends: Option<u32>,
}

impl OutageScenario {
    fn new(label: &str, max_attempts: u32, budget: bool) -> Self {
        Self {
            label: label.to_owned(),
            max_attempts,
            budget,
            max_sends: None,
        }
    }

    fn sends(mut self, max_sends: u32) -> Self {
        self.max_sends = Some(max_sends);
        self
    }
}

/// What the backend does to attempts while it is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Answers `503` (no `Retry-After`): up, but failing.
    Unavailable,
    /// Refuses the connection: down, restarting.
    Refused,
}

/// Parameters of the outage scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct OutageConfig {
    /// Clients in the fleet.
    pub clients: u32,
    /// Calls each client starts per second.
    pub rate_per_client: f64,
    /// Calls start during `[0, duration)`.
    pub duration: Duration,
    /// When the backend goes down.
    pub outage_start: Duration,
    /// For how long.
    pub outage_len: Duration,
    /// Width of a load-over-time bin.
    pub bin: Duration,
    /// Mean per-hop delay, ms.
    pub net_mean_ms: f64,
    /// Standard deviation of the per-hop delay, ms.
    pub net_sd_ms: f64,
    /// Seed.
    pub seed: u64,
    /// What the backend does while down.
    pub failure: Failure,
    /// Fleets to compare.
    pub scenarios: Vec<OutageScenario>,
}

impl Default for OutageConfig {
    /// 100 clients at 10 calls/s each, 60 s, backend down from 10 s to 20 s.
    fn default() -> Self {
        Self {
            clients: 100,
            rate_per_client: 10.0,
            duration: Duration::from_secs(60),
            outage_start: Duration::from_secs(10),
            outage_len: Duration::from_secs(10),
            bin: Duration::from_millis(500),
            net_mean_ms: 10.0,
            net_sd_ms: 2.0,
            seed: 2022,
            failure: Failure::Unavailable,
            scenarios: vec![
                OutageScenario::new("no retries", 1, false),
                OutageScenario::new("3 attempts", 3, false),
                OutageScenario::new("3 attempts + budget", 3, true),
                OutageScenario::new("10 attempts", 10, false),
                OutageScenario::new("10 attempts + budget", 10, true),
            ],
        }
    }
}

impl OutageConfig {
    /// The same fleet facing a restart: connections refused for 2 s, from 10 s to 12 s. The
    /// first fleet is the rule before issue 22 (every request counted against a cap of 3); the
    /// others are today's policy (refused connections not counted), with and without the
    /// budget.
    pub fn restart() -> Self {
        Self {
            failure: Failure::Refused,
            outage_len: Duration::from_secs(2),
            scenarios: vec![
                OutageScenario::new("no retries", 1, false),
                OutageScenario::new("3 sends + budget (before)", 3, true).sends(3),
                OutageScenario::new("3 attempts + budget (now)", 3, true),
                OutageScenario::new("3 attempts, no budget (now)", 3, false),
            ],
            ..Self::default()
        }
    }

    /// The most attempts per second the budget lets reach the backend while it is down: the
    /// calls themselves, plus what a full bucket of every client pays for at the cheapest
    /// retry this failure costs (nothing succeeds, so nothing is refunded).
    pub fn budget_bound(&self) -> f64 {
        let config = crate::budget::BudgetConfig::default();
        // 503 without Retry-After and a refused connection are both transient retries.
        let retries_per_client = f64::from(config.capacity / config.transient_cost);
        f64::from(self.clients) * self.rate_per_client
            + f64::from(self.clients) * retries_per_client / self.outage_len.as_secs_f64()
    }

    /// One line describing the parameters.
    pub fn describe(&self) -> String {
        let failure = match self.failure {
            Failure::Unavailable => "returns 503",
            Failure::Refused => "refuses connections (restarting)",
        };
        format!(
            "{} clients x {} calls/s for {} s; backend {failure} from {} s to {} s; every hop |Normal({} ms, sd {} ms)|; default policy (full jitter 500 ms / 20 s, deadline 30 s, at most 10 requests sent) with the attempt cap shown; budget = one 500/14/5/1 bucket per client; seed {}",
            self.clients,
            self.rate_per_client,
            self.duration.as_secs_f64(),
            self.outage_start.as_secs_f64(),
            (self.outage_start + self.outage_len).as_secs_f64(),
            self.net_mean_ms,
            self.net_sd_ms,
            self.seed
        )
    }
}

/// What one fleet did.
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioResult {
    /// The fleet.
    pub scenario: OutageScenario,
    /// Calls started.
    pub calls: u64,
    /// Attempts that reached the backend.
    pub attempts: u64,
    /// Calls that ended in a 200.
    pub succeeded: u64,
    /// Calls that gave up.
    pub failed: u64,
    /// Retries refused because the budget was empty.
    pub refused_by_budget: u64,
    /// Backend load per bin, attempts per second, over `[0, duration)`.
    pub load: Vec<f64>,
    /// Mean backend load while it was down, attempts per second.
    pub outage_load: f64,
    /// Highest load of any bin, attempts per second.
    pub peak_load: f64,
}

impl ScenarioResult {
    /// Attempts per call.
    pub fn amplification(&self) -> f64 {
        self.attempts as f64 / self.calls.max(1) as f64
    }
}

/// All fleets.
#[derive(Debug, Clone, PartialEq)]
pub struct OutageResults {
    /// The parameters.
    pub config: OutageConfig,
    /// One per scenario, in order.
    pub scenarios: Vec<ScenarioResult>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// An attempt reaches the backend.
    Arrive,
    /// The backend's answer reaches the client.
    Reply(bool),
}

struct Call {
    client: u32,
    start_us: u64,
    state: RetryState,
}

/// Runs every scenario of `config`.
pub fn run(config: &OutageConfig) -> OutageResults {
    let scenarios = config
        .scenarios
        .iter()
        .map(|s| run_scenario(config, s))
        .collect();
    OutageResults {
        config: config.clone(),
        scenarios,
    }
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn run_scenario(config: &OutageConfig, scenario: &OutageScenario) -> ScenarioResult {
    // Arrivals come from their own stream, so every scenario faces exactly the same calls.
    let mut arrivals = SplitMix64::new(SplitMix64::derive(config.seed, 0));
    let mut rng = SplitMix64::new(SplitMix64::derive(config.seed, 1));
    let defaults = RetryPolicy::default();
    let policy = RetryPolicy {
        max_attempts: scenario.max_attempts,
        max_sends: scenario.max_sends.unwrap_or(defaults.max_sends),
        ..defaults
    };
    let facts = RequestFacts::new("POST", true);
    let budgets: Vec<Option<RetryBudget>> = (0..config.clients)
        .map(|_| scenario.budget.then(RetryBudget::default))
        .collect();
    let period_us = (1e6 / config.rate_per_client.max(1e-9)) as u64;
    let duration_us = us(config.duration);
    let (down_from, down_to) = (
        us(config.outage_start),
        us(config.outage_start + config.outage_len),
    );
    let bin_us = us(config.bin).max(1);
    let bins = duration_us.div_ceil(bin_us) as usize;
    let mut counts = vec![0u64; bins];

    let mut calls: Vec<Call> = Vec::new();
    let mut heap: BinaryHeap<Reverse<(u64, u64, usize, Kind)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let hop = |rng: &mut SplitMix64| -> u64 {
        ((config.net_mean_ms + config.net_sd_ms * rng.next_normal()).abs() * 1000.0) as u64
    };
    for client in 0..config.clients {
        let mut t = arrivals.uniform_u64(0, period_us);
        while t < duration_us {
            let id = calls.len();
            calls.push(Call {
                client,
                start_us: t,
                state: RetryState::seeded(arrivals.next_u64()),
            });
            seq += 1;
            heap.push(Reverse((t + hop(&mut rng), seq, id, Kind::Arrive)));
            t += period_us;
        }
    }
    let (mut attempts, mut succeeded, mut failed, mut refused) = (0u64, 0u64, 0u64, 0u64);
    while let Some(Reverse((t, _, id, kind))) = heap.pop() {
        match kind {
            Kind::Arrive => {
                attempts += 1;
                if let Some(c) = counts.get_mut((t / bin_us) as usize) {
                    *c += 1;
                }
                let up = !(down_from..down_to).contains(&t);
                seq += 1;
                heap.push(Reverse((t + hop(&mut rng), seq, id, Kind::Reply(up))));
            }
            Kind::Reply(up) => {
                let call = &mut calls[id];
                let outcome = match (up, config.failure) {
                    (true, _) => Outcome::status(200),
                    (false, Failure::Unavailable) => Outcome::status(503),
                    (false, Failure::Refused) => Outcome::ConnectError,
                };
                let elapsed = Duration::from_micros(t - call.start_us);
                let budget = budgets[call.client as usize].as_ref();
                match policy.decide(&mut call.state, facts, &outcome, elapsed, budget) {
                    Decision::Done => succeeded += 1,
                    Decision::Retry(plan) => {
                        seq += 1;
                        let next = t + us(plan.delay) + hop(&mut rng);
                        heap.push(Reverse((next, seq, id, Kind::Arrive)));
                    }
                    Decision::Stop(reason) => {
                        failed += 1;
                        if matches!(reason, StopReason::BudgetExhausted { .. }) {
                            refused += 1;
                        }
                    }
                }
            }
        }
    }
    let per_sec = 1e6 / bin_us as f64;
    let load: Vec<f64> = counts.iter().map(|&c| c as f64 * per_sec).collect();
    let outage_bins: Vec<f64> = load
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            let start = *i as u64 * bin_us;
            start >= down_from && start + bin_us <= down_to
        })
        .map(|(_, l)| *l)
        .collect();
    ScenarioResult {
        scenario: scenario.clone(),
        calls: calls.len() as u64,
        attempts,
        succeeded,
        failed,
        refused_by_budget: refused,
        outage_load: outage_bins.iter().sum::<f64>() / outage_bins.len().max(1) as f64,
        peak_load: load.iter().copied().fold(0.0, f64::max),
        load,
    }
}

/// The Markdown table of an outage run.
pub fn markdown(results: &OutageResults) -> String {
    let mut out = String::from("<!-- Generated by `idem-sim`; do not edit. -->\n");
    out.push_str(&format!("Parameters: {}.\n\n", results.config.describe()));
    out.push_str("<!-- ANCHOR: outage -->\n");
    out.push_str("| fleet | calls | attempts | attempts per call | load while down (attempts/s) | peak load (attempts/s) | succeeded | gave up | refused by budget |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in &results.scenarios {
        out.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.0} | {:.0} | {} | {} | {} |\n",
            r.scenario.label,
            r.calls,
            r.attempts,
            r.amplification(),
            r.outage_load,
            r.peak_load,
            r.succeeded,
            r.failed,
            r.refused_by_budget
        ));
    }
    out.push_str("<!-- ANCHOR_END: outage -->\n");
    out.push_str(&format!(
        "\nThe budget's bound while the backend is down: {:.0} attempts/s (the calls, plus a full \
         bucket per client spent on 14-token retries over the outage).\n",
        results.config.budget_bound()
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> OutageConfig {
        OutageConfig {
            clients: 10,
            duration: Duration::from_secs(30),
            ..OutageConfig::default()
        }
    }

    #[test]
    fn every_call_ends_exactly_once() {
        let r = run(&small());
        for s in &r.scenarios {
            assert_eq!(s.succeeded + s.failed, s.calls, "{}", s.scenario.label);
            assert!(s.attempts >= s.calls);
        }
        // Same arrivals in every scenario.
        assert!(r.scenarios.iter().all(|s| s.calls == r.scenarios[0].calls));
    }

    // clause: idem.client.budget
    #[test]
    fn the_budget_cuts_amplification_during_an_outage() {
        let r = run(&small());
        let by = |label: &str| {
            r.scenarios
                .iter()
                .find(|s| s.scenario.label == label)
                .expect("scenario present")
        };
        let none = by("no retries");
        let capped = by("3 attempts");
        let budget = by("3 attempts + budget");
        let many = by("10 attempts");
        let many_budget = by("10 attempts + budget");
        assert_eq!(none.attempts, none.calls);
        // Without a budget the fleet nearly triples its load while the backend is down.
        assert!(capped.outage_load > 2.5 * none.outage_load);
        // With it, the load while down stays far closer to one attempt per call.
        assert!(budget.outage_load < 0.6 * capped.outage_load);
        assert!(many_budget.attempts < many.attempts / 2);
        assert!(budget.refused_by_budget > 0);
    }

    // clause: idem.client.budget, idem.client.max-attempts
    #[test]
    fn during_a_restart_the_budget_bounds_the_fleet_although_refusals_do_not_spend_the_cap() {
        let config = OutageConfig {
            clients: 10,
            duration: Duration::from_secs(30),
            ..OutageConfig::restart()
        };
        let r = run(&config);
        let by = |label: &str| {
            r.scenarios
                .iter()
                .find(|s| s.scenario.label == label)
                .expect("scenario present")
        };
        let none = by("no retries");
        let before = by("3 sends + budget (before)");
        let now = by("3 attempts + budget (now)");
        let unbudgeted = by("3 attempts, no budget (now)");
        // Not counting refusals gives up on no more calls than the old cap did…
        assert!(now.succeeded >= before.succeeded);
        // …and the load while the backend is down stays under the budget's bound, no higher
        // than under the old rule.
        let bound = config.budget_bound();
        for s in [before, now] {
            assert!(
                s.outage_load <= bound,
                "{}: {} > {bound}",
                s.scenario.label,
                s.outage_load
            );
        }
        assert!(now.outage_load <= before.outage_load * 1.05);
        // Every retry was paid: at most a full bucket per client, plus refunds of successes.
        assert!(now.attempts - now.calls <= u64::from(config.clients) * 35 + now.succeeded);
        // Without a budget, nothing but the deadline and the send ceiling holds refusals back.
        assert!(unbudgeted.attempts > now.attempts);
        assert_eq!(none.attempts, none.calls);
    }

    // clause: idem.client.budget
    #[test]
    fn the_budgeted_fleets_stay_under_the_budgets_bound_during_a_503_outage() {
        let config = small();
        let r = run(&config);
        for s in r.scenarios.iter().filter(|s| s.scenario.budget) {
            assert!(
                s.outage_load <= config.budget_bound(),
                "{}",
                s.scenario.label
            );
        }
    }
}
