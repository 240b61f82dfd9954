//! The pure policy without reqwest: a hand-written retry loop around any transport.
//!
//! `cargo run -p idem-client --example retry_loop` prints the decisions for a server that fails
//! twice (503, then 409 in use with `Retry-After: 2`) and then succeeds.

use std::time::Duration;

use idem_client::{
    Decision, Outcome, RequestFacts, RetryBudget, RetryPolicy, RetryState, derive_key,
};

fn main() {
    // Scripted answers standing in for a real transport.
    let mut answers = vec![
        Outcome::status(503),
        Outcome::status(409)
            .with_retry_after(Duration::from_secs(2))
            .with_problem(Some("idempotency_key_in_use"), Some(true)),
        Outcome::status(201),
    ]
    .into_iter();

    // ANCHOR: retry_loop
    let policy = RetryPolicy::default(); // 3 attempts, full jitter 500 ms / 20 s, 30 s deadline, 10 s per attempt
    let budget = RetryBudget::default(); // share one per client, not per call
    let key = derive_key("order-confirm", 8412).expect("a valid key"); // one key per operation
    let facts = RequestFacts::new("POST", true);
    let mut state = RetryState::seeded(42); // production: RetryState::new(SplitMix64::from_entropy())
    let mut elapsed = Duration::ZERO; // production: measured from one Instant taken up front

    loop {
        // Every attempt sends the same `key`; its timeout is at most 10 s and what is left of
        // the deadline.
        let timeout = policy.timeout_for_attempt(elapsed);
        let outcome = answers.next().unwrap_or(Outcome::status(201));
        println!(
            "attempt {} with key {key}, timeout {timeout:?}: {outcome:?}",
            state.attempts() + 1
        );
        match policy.decide(&mut state, facts, &outcome, elapsed, Some(&budget)) {
            Decision::Done => break println!("done; budget left {}", budget.available()),
            Decision::Stop(reason) => break println!("stopped: {reason}"),
            Decision::Retry(plan) => {
                println!(
                    "  retry: {} ({}), sleep {:?}, budget left {:?}",
                    plan.reason, plan.class, plan.delay, plan.budget_left
                );
                elapsed += plan.delay; // production: sleep(plan.delay).await
            }
        }
    }
    // ANCHOR_END: retry_loop
}
