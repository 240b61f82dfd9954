//! The pure policy, row by row: every allowlist entry, every refusal, the deadline arithmetic,
//! the budget, and the published golden schedules.

use std::time::Duration;

use idem_client::budget::{BudgetConfig, RetryBudget};
use idem_client::{
    Backoff, Decision, Jitter, Outcome, RequestFacts, RetryClass, RetryPolicy, RetryReason,
    RetryState, StopReason, vectors,
};

const SEED: u64 = 42;

fn policy() -> RetryPolicy {
    RetryPolicy::default()
}

fn get() -> RequestFacts {
    RequestFacts::new("GET", false)
}

fn post_with_key() -> RequestFacts {
    RequestFacts::new("POST", true)
}

fn post_without_key() -> RequestFacts {
    RequestFacts::new("POST", false)
}

fn response(status: u16, retry_after: Option<Duration>, code: Option<&str>) -> Outcome {
    Outcome::Response {
        status,
        retry_after,
        problem_code: code.map(str::to_owned),
        problem_retryable: None,
    }
}

fn problem(status: u16, code: Option<&str>, retryable: Option<bool>) -> Outcome {
    Outcome::status(status).with_problem(code, retryable)
}

/// One decision on a fresh operation at t = 0, with a fresh default budget.
fn first(facts: RequestFacts, outcome: Outcome) -> Decision {
    policy().decide(
        &mut RetryState::seeded(SEED),
        facts,
        &outcome,
        Duration::ZERO,
        Some(&RetryBudget::default()),
    )
}

fn retried(d: &Decision) -> Option<(RetryReason, RetryClass)> {
    match d {
        Decision::Retry(p) => Some((p.reason, p.class)),
        _ => None,
    }
}

// clause: idem.client.allowlist
#[test]
fn every_allowlist_row_is_retried_with_its_class() {
    use RetryClass::*;
    let in_use = Some("idempotency_key_in_use");
    let rows: Vec<(Outcome, RetryReason, RetryClass)> = vec![
        (Outcome::ConnectError, RetryReason::ConnectError, Transient),
        (
            Outcome::ConnectionLost,
            RetryReason::ConnectionLost,
            Transient,
        ),
        (Outcome::Timeout, RetryReason::Timeout, Transient),
        (
            response(408, None, None),
            RetryReason::RequestTimeout,
            Transient,
        ),
        (
            response(429, None, None),
            RetryReason::TooManyRequests,
            Throttling,
        ),
        (
            response(502, None, None),
            RetryReason::BadGateway,
            Transient,
        ),
        (
            response(503, None, None),
            RetryReason::ServiceUnavailable,
            Transient,
        ),
        (
            response(503, Some(Duration::from_secs(1)), None),
            RetryReason::ServiceUnavailable,
            Throttling,
        ),
        (
            response(504, None, None),
            RetryReason::GatewayTimeout,
            Transient,
        ),
        (
            response(409, None, in_use),
            RetryReason::KeyInUse,
            Throttling,
        ),
        (
            response(409, None, Some("concurrent_idempotent_requests")),
            RetryReason::KeyInUse,
            Throttling,
        ),
    ];
    for (outcome, reason, class) in rows {
        // Safe for an idempotent method without a key and for a POST with one.
        for facts in [get(), post_with_key()] {
            let d = first(facts, outcome.clone());
            assert_eq!(retried(&d), Some((reason, class)), "{outcome:?} {facts:?}");
        }
    }
}

// clause: idem.client.allowlist
#[test]
fn every_other_4xx_and_unlisted_5xx_is_refused() {
    let listed = [408u16, 409, 429];
    for status in (400u16..500).filter(|s| !listed.contains(s)) {
        assert_eq!(
            first(post_with_key(), response(status, None, None)),
            Decision::Stop(StopReason::NotRetryable {
                status: Some(status)
            }),
            "{status}"
        );
    }
    for status in [501u16, 505, 507, 511, 599] {
        assert_eq!(
            first(post_with_key(), response(status, None, None)),
            Decision::Stop(StopReason::NotRetryable {
                status: Some(status)
            })
        );
    }
    // A 409 is retried only for the in-use code: a mismatch is final, and so is a bare 409.
    for code in [
        Some("idempotency_key_mismatch"),
        Some("idempotency_error"),
        None,
    ] {
        assert_eq!(
            first(post_with_key(), response(409, None, code)),
            Decision::Stop(StopReason::NotRetryable { status: Some(409) })
        );
    }
    // A failure that is not a lost connection (an unparsable response, a redirect loop) is
    // not on the allowlist.
    assert_eq!(
        first(get(), Outcome::OtherTransport),
        Decision::Stop(StopReason::NotRetryable { status: None })
    );
}

// clause: idem.client.allowlist, idem.client.no-key-no-retry
#[test]
fn transport_failures_are_retried_by_what_they_prove_about_the_request() {
    // Maybe processed (lost connection, timeout): retried exactly when repeating is safe.
    for outcome in [Outcome::ConnectionLost, Outcome::Timeout] {
        for (method, key, safe) in [
            ("GET", false, true),
            ("HEAD", false, true),
            ("PUT", false, true),
            ("DELETE", false, true),
            ("POST", true, true),
            ("PATCH", true, true),
            ("POST", false, false),
            ("PATCH", false, false),
        ] {
            let d = first(RequestFacts::new(method, key), outcome.clone());
            if safe {
                assert!(
                    retried(&d).is_some(),
                    "{outcome:?} {method} key={key}: {d:?}"
                );
            } else {
                assert_eq!(
                    d,
                    Decision::Stop(StopReason::NonIdempotentWithoutKey),
                    "{outcome:?} {method} key={key}"
                );
            }
        }
    }
    // Never sent (connection refused): retried for any request, even a POST without a key.
    for (method, key) in [
        ("POST", false),
        ("PATCH", false),
        ("CUSTOM", false),
        ("GET", false),
    ] {
        assert_eq!(
            retried(&first(
                RequestFacts::new(method, key),
                Outcome::ConnectError
            )),
            Some((RetryReason::ConnectError, RetryClass::Transient)),
            "{method}"
        );
    }
}

// clause: idem.client.allowlist
#[test]
fn a_409_is_retried_when_its_problem_says_in_flight() {
    let in_flight = Some((RetryReason::KeyInUse, RetryClass::Throttling));
    // Every profile's in-flight code, with or without the `retryable` member.
    for code in ["idempotency_key_in_use", "concurrent_idempotent_requests"] {
        assert_eq!(
            retried(&first(post_with_key(), problem(409, Some(code), None))),
            in_flight
        );
        assert_eq!(
            retried(&first(
                post_with_key(),
                problem(409, Some(code), Some(true))
            )),
            in_flight
        );
    }
    // `retryable` decides when present: a 409 with an unknown code that says it is retryable
    // is in flight; one that says it is not is final, whatever its code.
    assert_eq!(
        retried(&first(
            post_with_key(),
            problem(409, Some("vendor_busy"), Some(true))
        )),
        in_flight
    );
    assert_eq!(
        retried(&first(post_with_key(), problem(409, None, Some(true)))),
        in_flight
    );
    for code in [
        Some("idempotency_key_in_use"),
        Some("invalid_idempotent_request"),
        None,
    ] {
        assert_eq!(
            first(post_with_key(), problem(409, code, Some(false))),
            Decision::Stop(StopReason::NotRetryable { status: Some(409) }),
            "{code:?}"
        );
    }
    // Every profile's mismatch spelling without the member: final.
    for code in [
        "idempotency_key_mismatch",
        "invalid_idempotent_request",
        "idempotency_error",
    ] {
        assert_eq!(
            first(post_with_key(), problem(409, Some(code), None)),
            Decision::Stop(StopReason::NotRetryable { status: Some(409) })
        );
    }
}

// clause: idem.client.allowlist
#[test]
fn a_problem_saying_retryable_false_is_never_retried() {
    for status in [408u16, 429, 500, 502, 503, 504] {
        assert_eq!(
            first(
                post_with_key(),
                problem(status, Some("vendor_final"), Some(false))
            ),
            Decision::Stop(StopReason::ProblemNotRetryable { status }),
            "{status}"
        );
        assert!(
            retried(&first(
                post_with_key(),
                problem(status, Some("x"), Some(true))
            ))
            .is_some(),
            "{status}"
        );
    }
    // `retryable: true` never puts another 4xx on the allowlist.
    for status in [400u16, 401, 404, 422] {
        assert_eq!(
            first(post_with_key(), problem(status, None, Some(true))),
            Decision::Stop(StopReason::NotRetryable {
                status: Some(status)
            })
        );
    }
}

// clause: idem.client.deadline
#[test]
fn each_attempt_gets_the_least_of_its_timeout_and_the_deadline_left() {
    let p = policy();
    assert_eq!(p.attempt_timeout, Duration::from_secs(10));
    assert_eq!(
        p.timeout_for_attempt(Duration::ZERO),
        Duration::from_secs(10)
    );
    assert_eq!(
        p.timeout_for_attempt(Duration::from_millis(20_531)),
        Duration::from_millis(9_469)
    );
    assert_eq!(
        p.timeout_for_attempt(Duration::from_secs(31)),
        Duration::ZERO
    );
    let short = RetryPolicy {
        attempt_timeout: Duration::from_millis(300),
        ..policy()
    };
    assert_eq!(
        short.timeout_for_attempt(Duration::from_secs(29)),
        Duration::from_millis(300)
    );
}

// clause: idem.client.500-with-key
#[test]
fn a_500_is_retried_only_with_a_key() {
    assert_eq!(
        retried(&first(post_with_key(), response(500, None, None))),
        Some((RetryReason::InternalErrorWithKey, RetryClass::Transient))
    );
    assert_eq!(
        retried(&first(
            RequestFacts::new("PUT", true),
            response(500, None, None)
        )),
        Some((RetryReason::InternalErrorWithKey, RetryClass::Transient))
    );
    for facts in [get(), post_without_key()] {
        assert_eq!(
            first(facts, response(500, None, None)),
            Decision::Stop(StopReason::ServerErrorWithoutKey)
        );
    }
}

// clause: idem.client.no-key-no-retry
#[test]
fn non_idempotent_requests_without_a_key_are_never_retried() {
    for method in ["POST", "PATCH", "CONNECT", "CUSTOM"] {
        for outcome in [
            Outcome::ConnectionLost,
            Outcome::Timeout,
            response(503, None, None),
            response(429, None, None),
        ] {
            assert_eq!(
                first(RequestFacts::new(method, false), outcome.clone()),
                Decision::Stop(StopReason::NonIdempotentWithoutKey),
                "{method} {outcome:?}"
            );
            assert!(
                retried(&first(RequestFacts::new(method, true), outcome)).is_some(),
                "{method} with a key"
            );
        }
    }
    for method in ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"] {
        assert!(
            retried(&first(
                RequestFacts::new(method, false),
                Outcome::ConnectError
            ))
            .is_some()
        );
    }
}

// clause: idem.client.max-attempts
#[test]
fn at_most_three_attempts_by_default() {
    let p = policy();
    let mut state = RetryState::seeded(SEED);
    let out = response(503, None, None);
    let mut decisions = Vec::new();
    for _ in 0..3 {
        decisions.push(p.decide(&mut state, get(), &out, Duration::ZERO, None));
    }
    assert!(matches!(decisions[0], Decision::Retry(_)));
    assert!(matches!(decisions[1], Decision::Retry(_)));
    assert_eq!(
        decisions[2],
        Decision::Stop(StopReason::AttemptsExhausted { attempts: 3 })
    );
}

// clause: idem.client.backoff-jitter
#[test]
fn default_schedule_for_seed_42_is_golden() {
    // ANCHOR: golden_schedule
    let p = RetryPolicy::default(); // 3 attempts, full jitter, base 500 ms, cap 20 s
    let mut state = RetryState::seeded(42);
    let mut sleeps = Vec::new();
    for _ in 0..3 {
        let outcome = Outcome::status(503);
        match p.decide(
            &mut state,
            RequestFacts::new("GET", false),
            &outcome,
            Duration::ZERO,
            None,
        ) {
            Decision::Retry(plan) => sleeps.push(plan.delay),
            Decision::Stop(reason) => {
                assert_eq!(reason, StopReason::AttemptsExhausted { attempts: 3 });
            }
            Decision::Done => unreachable!("503 is not a success"),
        }
    }
    // Before retry 1 (n = 0): U[0, 500 ms); before retry 2 (n = 1): U[0, 1 s). Same numbers in
    // every language, and the same ones the book shows (370 ms, 159 ms).
    assert_eq!(
        sleeps,
        [
            Duration::from_micros(370_782),
            Duration::from_micros(159_910)
        ]
    );
    // ANCHOR_END: golden_schedule
}

// clause: idem.client.backoff-jitter
#[test]
fn committed_vectors_match_the_code() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("vectors/backoff.json");
    let committed = std::fs::read_to_string(&path).expect("client/vectors/backoff.json exists");
    assert!(
        committed == vectors::render(),
        "{} is stale: run `cargo run -p idem-client --bin idem-client-vectors`",
        path.display()
    );
    // The published schedules agree with the policy-level API, not only with `Backoff`.
    let parsed: vectors::BackoffVectors = serde_json::from_str(&committed).expect("valid JSON");
    let v = parsed
        .schedules
        .iter()
        .find(|s| s.jitter == Jitter::Full && s.seed == 42 && s.base_us == 500_000)
        .expect("default schedule present");
    assert_eq!(&v.delays_us[..2], &[370_782, 159_910]);

    let table = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(vectors::SCHEDULE_TABLE_PATH);
    assert!(
        std::fs::read_to_string(&table).ok() == Some(vectors::schedule_markdown()),
        "{} is stale: run `cargo run -p idem-client --bin idem-client-vectors`",
        table.display()
    );
}

// clause: idem.client.retry-after
#[test]
fn retry_after_is_the_least_delay() {
    // Full jitter before the first retry draws below 500 ms; a 5 s hint wins.
    let d = first(get(), response(429, Some(Duration::from_secs(5)), None));
    let Decision::Retry(plan) = d else {
        panic!("expected a retry, got {d:?}")
    };
    assert_eq!(plan.delay, Duration::from_secs(5));
    assert_eq!(plan.retry_after, Some(Duration::from_secs(5)));
    // A hint shorter than the drawn backoff does not shorten it.
    let drawn = Backoff::default().schedule(SEED, 1)[0];
    let d = first(get(), response(503, Some(Duration::from_millis(1)), None));
    let Decision::Retry(plan) = d else {
        panic!("expected a retry, got {d:?}")
    };
    assert_eq!(plan.delay, drawn.max(Duration::from_millis(1)));
}

// clause: idem.client.retry-after, idem.client.deadline
#[test]
fn a_hint_past_the_deadline_fails_at_once_with_the_hint() {
    let p = RetryPolicy {
        deadline: Duration::from_secs(10),
        ..policy()
    };
    let mut state = RetryState::seeded(SEED);
    let d = p.decide(
        &mut state,
        get(),
        &response(503, Some(Duration::from_secs(60)), None),
        Duration::from_secs(2),
        None,
    );
    assert_eq!(
        d,
        Decision::Stop(StopReason::RetryAfterPastDeadline {
            hint: Duration::from_secs(60),
            remaining: Duration::from_secs(8),
        })
    );
    // Exactly at the deadline is past it: the next attempt would have no time at all.
    let d = p.decide(
        &mut RetryState::seeded(SEED),
        get(),
        &response(429, Some(Duration::from_secs(8)), None),
        Duration::from_secs(2),
        None,
    );
    assert!(matches!(
        d,
        Decision::Stop(StopReason::RetryAfterPastDeadline { .. })
    ));
}

// clause: idem.client.deadline
#[test]
fn deadline_arithmetic() {
    let p = RetryPolicy {
        deadline: Duration::from_secs(5),
        backoff: Backoff {
            jitter: Jitter::Exponential,
            ..Backoff::default()
        },
        max_attempts: 10,
        ..policy()
    };
    assert_eq!(p.remaining(Duration::ZERO), Duration::from_secs(5));
    assert_eq!(
        p.remaining(Duration::from_millis(3_200)),
        Duration::from_millis(1_800)
    );
    assert_eq!(p.remaining(Duration::from_secs(9)), Duration::ZERO);

    let mut state = RetryState::seeded(SEED);
    let out = response(503, None, None);
    // Failure 1 at 1.0 s: no retry made yet, sleep e(0) = base = 500 ms, ending at 1.5 s;
    // 3.5 s remain for attempt 2.
    let Decision::Retry(plan) = p.decide(&mut state, get(), &out, Duration::from_secs(1), None)
    else {
        panic!("first failure must be retried")
    };
    assert_eq!(plan.delay, Duration::from_millis(500));
    assert_eq!(plan.remaining_after_sleep, Duration::from_millis(3_500));
    // Failure 2 at 3.9 s: e(1) = 1 s would end at 4.9 s < 5 s: allowed, 100 ms left.
    let Decision::Retry(plan) =
        p.decide(&mut state, get(), &out, Duration::from_millis(3_900), None)
    else {
        panic!("second failure must be retried")
    };
    assert_eq!(plan.delay, Duration::from_secs(1));
    assert_eq!(plan.remaining_after_sleep, Duration::from_millis(100));
    // Failure 3 at 4.95 s: e(2) = 2 s would end past the deadline: the sleep is not started.
    assert_eq!(
        p.decide(&mut state, get(), &out, Duration::from_millis(4_950), None),
        Decision::Stop(StopReason::DeadlineWouldPass {
            delay: Duration::from_secs(2),
            remaining: Duration::from_millis(50),
        })
    );
}

// clause: idem.client.budget
#[test]
fn budget_exhaustion_refuses_and_successes_refill() {
    let budget = RetryBudget::new(BudgetConfig::default());
    let p = RetryPolicy {
        max_attempts: 2,
        ..policy()
    };
    let fail = response(502, None, None);
    // 35 operations each spend one transient retry: 35 * 14 = 490 of 500.
    for i in 0..35 {
        let mut state = RetryState::seeded(i);
        let d = p.decide(&mut state, get(), &fail, Duration::ZERO, Some(&budget));
        let Decision::Retry(plan) = d else {
            panic!("retry {i} should fit: {d:?}")
        };
        assert_eq!(plan.cost, 14);
        assert_eq!(plan.budget_left, Some(500 - 14 * (i as u32 + 1)));
    }
    assert_eq!(budget.available(), 10);
    let d = p.decide(
        &mut RetryState::seeded(99),
        get(),
        &fail,
        Duration::ZERO,
        Some(&budget),
    );
    assert_eq!(
        d,
        Decision::Stop(StopReason::BudgetExhausted {
            cost: 14,
            available: 10
        })
    );
    // A throttling retry is cheaper and still fits.
    let d = p.decide(
        &mut RetryState::seeded(100),
        get(),
        &response(429, None, None),
        Duration::ZERO,
        Some(&budget),
    );
    assert!(
        matches!(d, Decision::Retry(ref plan) if plan.cost == 5 && plan.budget_left == Some(5))
    );
    // Nine successes bring 5 back to 14: exactly enough for one transient retry.
    for i in 0..9 {
        let d = p.decide(
            &mut RetryState::seeded(200 + i),
            get(),
            &Outcome::status(200),
            Duration::ZERO,
            Some(&budget),
        );
        assert_eq!(d, Decision::Done);
    }
    assert_eq!(budget.available(), 14);
    assert!(matches!(
        p.decide(
            &mut RetryState::seeded(300),
            get(),
            &fail,
            Duration::ZERO,
            Some(&budget)
        ),
        Decision::Retry(_)
    ));
    assert_eq!(budget.available(), 0);
}

// clause: idem.client.budget
#[test]
fn refusals_before_the_budget_cost_nothing() {
    let budget = RetryBudget::default();
    let p = policy();
    for (facts, outcome) in [
        (get(), response(404, None, None)),
        (get(), response(500, None, None)),
        (get(), Outcome::OtherTransport),
        (post_without_key(), Outcome::ConnectionLost),
        (post_with_key(), problem(503, None, Some(false))),
    ] {
        let d = p.decide(
            &mut RetryState::seeded(1),
            facts,
            &outcome,
            Duration::ZERO,
            Some(&budget),
        );
        assert!(matches!(d, Decision::Stop(_)), "{outcome:?}");
    }
    // Attempts exhausted and deadline refusals happen before paying, too.
    let mut state = RetryState::seeded(2);
    let fail = response(503, None, None);
    let _ = p.decide(&mut state, get(), &fail, Duration::ZERO, Some(&budget));
    let _ = p.decide(&mut state, get(), &fail, Duration::ZERO, Some(&budget));
    assert_eq!(budget.available(), 500 - 2 * 14);
    assert!(matches!(
        p.decide(&mut state, get(), &fail, Duration::ZERO, Some(&budget)),
        Decision::Stop(StopReason::AttemptsExhausted { attempts: 3 })
    ));
    assert!(matches!(
        p.decide(
            &mut RetryState::seeded(3),
            get(),
            &fail,
            p.deadline,
            Some(&budget)
        ),
        Decision::Stop(StopReason::DeadlineWouldPass { .. })
    ));
    assert_eq!(budget.available(), 500 - 2 * 14);
}

// clause: idem.client.backoff-jitter, idem.client.decorrelated-jitter
#[test]
fn decorrelated_jitter_is_available_through_the_policy() {
    let p = RetryPolicy {
        max_attempts: 6,
        deadline: Duration::from_secs(600),
        backoff: Backoff {
            jitter: Jitter::Decorrelated,
            ..Backoff::default()
        },
        ..policy()
    };
    let mut state = RetryState::seeded(7);
    let mut got = Vec::new();
    while let Decision::Retry(plan) =
        p.decide(&mut state, get(), &Outcome::Timeout, Duration::ZERO, None)
    {
        got.push(plan.delay);
    }
    assert_eq!(got, p.backoff.schedule(7, 5));
    assert!(got.iter().all(|d| *d >= Duration::from_millis(500)));
}

/// Runs `outcomes` through one operation with the default budget, elapsed time advancing by
/// each decided delay plus 50 ms per attempt, and returns every decision.
fn run_operation(p: &RetryPolicy, budget: &RetryBudget, outcomes: &[Outcome]) -> Vec<Decision> {
    run_operation_counted(p, budget, outcomes).0
}

/// [`run_operation`], and the attempts that counted against the cap.
fn run_operation_counted(
    p: &RetryPolicy,
    budget: &RetryBudget,
    outcomes: &[Outcome],
) -> (Vec<Decision>, u32) {
    let mut state = RetryState::seeded(SEED);
    let mut elapsed = Duration::ZERO;
    let mut out = Vec::new();
    for o in outcomes {
        elapsed += Duration::from_millis(50);
        let d = p.decide(&mut state, post_with_key(), o, elapsed, Some(budget));
        if let Decision::Retry(plan) = &d {
            elapsed += plan.delay;
        }
        out.push(d);
    }
    (out, state.counted_attempts())
}

// clause: idem.client.max-attempts, idem.client.retry-after, idem.client.budget
#[test]
fn a_crash_and_restart_fit_in_the_attempt_cap_refused_and_in_flight_answers_do_not_count() {
    // The crash scenario of issue 22: the attempt in flight is lost (the server was killed),
    // three retries are refused while it restarts, the next finds the dead holder's key in
    // flight and is told to come back after its lease; that retry gets the 201.
    let in_use = response(
        409,
        Some(Duration::from_secs(10)),
        Some("idempotency_key_in_use"),
    );
    let outcomes = [
        Outcome::ConnectionLost,
        Outcome::ConnectError,
        Outcome::ConnectError,
        Outcome::ConnectError,
        in_use.clone(),
        Outcome::status(201),
    ];
    let budget = RetryBudget::default();
    let (decisions, counted) = run_operation_counted(&policy(), &budget, &outcomes);
    // Six requests sent, two that the server may have executed: the lost one and the 201.
    assert_eq!(counted, 2);
    let reasons: Vec<RetryReason> = decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Retry(plan) => Some(plan.reason),
            _ => None,
        })
        .collect();
    assert_eq!(
        reasons,
        [
            RetryReason::ConnectionLost,
            RetryReason::ConnectError,
            RetryReason::ConnectError,
            RetryReason::ConnectError,
            RetryReason::KeyInUse
        ]
    );
    assert_eq!(decisions.last(), Some(&Decision::Done));
    // The in-flight retry waited the server's hint.
    match &decisions[4] {
        Decision::Retry(plan) => assert!(plan.delay >= Duration::from_secs(10)),
        other => panic!("{other:?}"),
    }
    // Paid: four transient retries (14) and one throttling retry (5); the 201 refunds the last.
    assert_eq!(budget.available(), 500 - 4 * 14 - 5 + 5);

    // Under the old rule (every request against one cap of 3) the same operation gives up on
    // the second refused connection, 1.2 s into a 2 s restart.
    let old = RetryPolicy {
        max_sends: 3,
        ..policy()
    };
    let decisions = run_operation(&old, &RetryBudget::default(), &outcomes);
    assert_eq!(
        decisions[2],
        Decision::Stop(StopReason::SendsExhausted { sends: 3 })
    );

    // Attempts the server may have executed still count: lost, 503, lost is three.
    let decisions = run_operation(
        &policy(),
        &RetryBudget::default(),
        &[
            Outcome::ConnectionLost,
            in_use.clone(),
            Outcome::status(503),
            Outcome::ConnectError,
            Outcome::ConnectionLost,
        ],
    );
    assert_eq!(
        decisions[4],
        Decision::Stop(StopReason::AttemptsExhausted { attempts: 3 })
    );
}

// clause: idem.client.max-attempts, idem.client.budget
#[test]
fn free_retries_are_bounded_by_the_send_ceiling_the_budget_and_the_deadline() {
    let in_use = response(
        409,
        Some(Duration::from_secs(1)),
        Some("idempotency_key_in_use"),
    );
    // The ceiling: with an hour of deadline, ten sends.
    let long = RetryPolicy {
        deadline: Duration::from_secs(3600),
        ..policy()
    };
    let d = run_operation(&long, &RetryBudget::default(), &vec![in_use.clone(); 12]);
    assert_eq!(
        d[9],
        Decision::Stop(StopReason::SendsExhausted { sends: 10 })
    );
    // The budget: 30 tokens pay six throttling retries (5 each), not a seventh.
    let poor = RetryBudget::new(BudgetConfig {
        capacity: 30,
        ..BudgetConfig::default()
    });
    let d = run_operation(&long, &poor, &vec![in_use.clone(); 12]);
    assert_eq!(
        d[6],
        Decision::Stop(StopReason::BudgetExhausted {
            cost: 5,
            available: 0
        })
    );
    // The deadline: a hint past what is left stops at once, however few attempts counted.
    let late = response(
        409,
        Some(Duration::from_secs(40)),
        Some("idempotency_key_in_use"),
    );
    let d = run_operation(&policy(), &RetryBudget::default(), &[late]);
    assert!(matches!(
        d[0],
        Decision::Stop(StopReason::RetryAfterPastDeadline { .. })
    ));
}

// clause: idem.client.allowlist
#[test]
fn a_caller_can_add_retryable_answers_under_the_same_gates() {
    let p = policy()
        .retry_status(425, RetryClass::Throttling)
        .retry_problem_code(400, "vendor_try_again", RetryClass::Transient);
    let decide = |facts: RequestFacts, o: &Outcome| {
        p.decide(
            &mut RetryState::seeded(SEED),
            facts,
            o,
            Duration::ZERO,
            Some(&RetryBudget::default()),
        )
    };
    // 425 Too Early is retried, as a throttling retry.
    match decide(post_with_key(), &Outcome::status(425)) {
        Decision::Retry(plan) => {
            assert_eq!(plan.reason, RetryReason::CallerListed);
            assert_eq!(plan.class, RetryClass::Throttling);
            assert_eq!(plan.cost, 5);
        }
        other => panic!("{other:?}"),
    }
    // The vendor code on a 400, and only that code.
    assert!(matches!(
        decide(post_with_key(), &problem(400, Some("vendor_try_again"), None)),
        Decision::Retry(plan) if plan.class == RetryClass::Transient
    ));
    assert_eq!(
        decide(post_with_key(), &problem(400, Some("bad_amount"), None)),
        Decision::Stop(StopReason::NotRetryable { status: Some(400) })
    );
    // The gates still hold: no key on a POST, or a problem saying "retryable": false.
    assert_eq!(
        decide(post_without_key(), &Outcome::status(425)),
        Decision::Stop(StopReason::NonIdempotentWithoutKey)
    );
    assert_eq!(
        decide(post_with_key(), &problem(425, None, Some(false))),
        Decision::Stop(StopReason::ProblemNotRetryable { status: 425 })
    );
    // The middleware reads the body of an added status to find its code.
    assert!(p.reads_problem(400) && p.reads_problem(425));
    assert!(!policy().reads_problem(400) && !policy().reads_problem(425));
    // The default policy is unchanged: 425 is final there.
    assert_eq!(
        policy().decide(
            &mut RetryState::seeded(SEED),
            post_with_key(),
            &Outcome::status(425),
            Duration::ZERO,
            None
        ),
        Decision::Stop(StopReason::NotRetryable { status: Some(425) })
    );
}

// clause: idem.client.no-key-no-retry
#[test]
fn query_is_idempotent_and_retried_without_a_key() {
    assert!(RequestFacts::new("QUERY", false).idempotent_method);
    assert!(matches!(
        policy().decide(
            &mut RetryState::seeded(SEED),
            RequestFacts::new("QUERY", false),
            &Outcome::ConnectionLost,
            Duration::ZERO,
            None
        ),
        Decision::Retry(_)
    ));
}
