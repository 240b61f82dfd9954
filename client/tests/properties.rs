//! Properties of the policy over random seeds, parameters and outcome sequences.

use std::time::Duration;

use idem_client::rng::SplitMix64;
use idem_client::{
    Backoff, BudgetConfig, Decision, Jitter, Outcome, RequestFacts, RetryBudget, RetryPolicy,
    RetryState, StopReason,
};
use proptest::prelude::*;

fn jitter() -> impl Strategy<Value = Jitter> {
    prop::sample::select(Jitter::ALL.to_vec())
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        Just(Outcome::ConnectError),
        Just(Outcome::Timeout),
        Just(Outcome::ConnectionLost),
        Just(Outcome::OtherTransport),
        (
            prop::sample::select(vec![
                200u16, 201, 400, 404, 408, 409, 422, 429, 500, 502, 503, 504
            ]),
            prop::option::of(0u64..40_000),
            prop::option::of(prop::sample::select(vec![
                "idempotency_key_in_use",
                "idempotency_key_mismatch",
                "concurrent_idempotent_requests",
            ])),
            prop::option::of(any::<bool>()),
        )
            .prop_map(|(status, ra, code, retryable)| Outcome::Response {
                status,
                retry_after: ra.map(Duration::from_millis),
                problem_code: code.map(str::to_owned),
                problem_retryable: retryable,
            }),
    ]
}

proptest! {
    // clause: idem.client.backoff-jitter
    #[test]
    fn every_delay_obeys_its_formula(
        j in jitter(),
        base_ms in 1u64..2_000,
        cap_ms in 1u64..60_000,
        seed in any::<u64>(),
        n in 0u32..80,
        prev_ms in prop::option::of(0u64..100_000),
    ) {
        let b = Backoff { base: Duration::from_millis(base_ms), cap: Duration::from_millis(cap_ms), jitter: j };
        let e = b.envelope(n);
        prop_assert!(e <= b.cap);
        let d = b.delay(n, prev_ms.map(Duration::from_millis), &mut SplitMix64::new(seed));
        match j {
            Jitter::None => prop_assert_eq!(d, Duration::ZERO),
            Jitter::Exponential => prop_assert_eq!(d, e),
            Jitter::Full => prop_assert!(d < e || e.is_zero()),
            Jitter::Equal => prop_assert!(d >= e / 2 && (d < e || e.is_zero())),
            Jitter::Decorrelated => prop_assert!(d <= b.cap),
            _ => {}
        }
    }

    // clause: idem.client.deadline, idem.client.max-attempts, idem.client.budget
    #[test]
    fn no_sleep_ends_past_the_deadline_and_attempts_are_capped(
        outcomes in prop::collection::vec(outcome(), 1..12),
        seed in any::<u64>(),
        max_attempts in 1u32..6,
        deadline_ms in 1u64..40_000,
        has_key in any::<bool>(),
        post in any::<bool>(),
        attempt_ms in prop::collection::vec(0u64..3_000, 12),
    ) {
        let p = RetryPolicy {
            max_attempts,
            deadline: Duration::from_millis(deadline_ms),
            ..RetryPolicy::default()
        };
        let budget = RetryBudget::new(BudgetConfig { capacity: 60, ..BudgetConfig::default() });
        let facts = RequestFacts::new(if post { "POST" } else { "GET" }, has_key);
        let mut state = RetryState::seeded(seed);
        let mut elapsed = Duration::ZERO;
        // Requests sent, and those the server may have executed (all but refused connections
        // and 409s in flight), which alone count against the cap.
        let (mut sends, mut counted) = (0, 0);
        for (i, out) in outcomes.iter().enumerate() {
            sends += 1;
            // (A cap of 1 turns every retry off, these included.)
            let free = max_attempts > 1
                && (matches!(out, Outcome::ConnectError)
                    || matches!(out, Outcome::Response { status: 409, .. }));
            if !free {
                counted += 1;
            }
            elapsed += Duration::from_millis(attempt_ms[i]);
            match p.decide(&mut state, facts, out, elapsed, Some(&budget)) {
                Decision::Retry(plan) => {
                    prop_assert!(counted < max_attempts);
                    prop_assert!(sends < p.max_sends);
                    prop_assert_eq!(state.counted_attempts(), counted);
                    prop_assert!(elapsed + plan.delay < p.deadline);
                    prop_assert_eq!(plan.remaining_after_sleep, p.deadline - elapsed - plan.delay);
                    if let Some(h) = plan.retry_after { prop_assert!(plan.delay >= h); }
                    // Only a request that was never sent is retried whatever its method and key.
                    if !matches!(out, Outcome::ConnectError) {
                        prop_assert!(facts.idempotent_method || facts.has_key);
                    }
                    prop_assert!(!matches!(out, Outcome::OtherTransport));
                    if let Outcome::Response { status, problem_retryable, .. } = out {
                        prop_assert!([408, 409, 429, 500, 502, 503, 504].contains(status));
                        prop_assert_ne!(*problem_retryable, Some(false));
                        if *status == 500 { prop_assert!(facts.has_key); }
                    }
                    elapsed += plan.delay;
                }
                Decision::Done => { prop_assert!(out.is_success()); break; }
                Decision::Stop(reason) => {
                    if let StopReason::AttemptsExhausted { attempts: a } = reason {
                        prop_assert_eq!(a, max_attempts);
                        prop_assert_eq!(counted, max_attempts);
                    }
                    if let StopReason::SendsExhausted { sends: s } = reason {
                        prop_assert_eq!(s, p.max_sends);
                        prop_assert_eq!(sends, p.max_sends);
                    }
                    break;
                }
            }
            prop_assert!(budget.available() <= 60);
        }
    }
}
