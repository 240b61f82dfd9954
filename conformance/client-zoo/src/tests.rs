//! Each client's behaviour on the wire against the scripted server: its defect shows, and
//! (where a scenario does not touch it) it behaves like the contract.

use std::collections::HashSet;
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::time::Instant;

use crate::script::{Seen, Server, Step};
use crate::sdk::{self, Behaviour, Outcome, Timing};
use crate::{SLOW_START, Severity, ZooClient, call};

/// The defaults with a 1 ms backoff, for scenarios about counts rather than delays.
const FAST: Timing = Timing {
    base: Duration::from_millis(1),
    cap: Duration::from_millis(1),
    ..Timing::DEFAULT
};

fn keys(seen: &[Seen]) -> Vec<Option<String>> {
    seen.iter().map(|s| s.key.clone()).collect()
}

/// The key `key-in-body` put in a request's JSON body, if any.
fn body_key(seen: &Seen) -> Option<String> {
    let body: serde_json::Value = serde_json::from_str(&seen.body).ok()?;
    assert_eq!(body["amount"], 1000, "{body}");
    body[sdk::BODY_KEY_FIELD].as_str().map(str::to_owned)
}

fn gap(seen: &[Seen], i: usize) -> Duration {
    seen[i].at.duration_since(seen[i - 1].at)
}

/// The seed every test run uses: its draws are fixed, so a test can compute them.
const SEED: u64 = 7;

/// The exponential ceiling before retry `n` under the defaults.
fn ceiling(n: u32) -> Duration {
    Duration::from_millis(500)
        .saturating_mul(2u32.pow(n))
        .min(Duration::from_secs(20))
}

async fn run_sdk(behaviour: Behaviour, timing: Timing, script: Vec<Step>) -> (bool, Vec<Seen>) {
    run_sdk_seeded(behaviour, timing, script, SEED).await
}

async fn run_sdk_seeded(
    behaviour: Behaviour,
    timing: Timing,
    script: Vec<Step>,
    seed: u64,
) -> (bool, Vec<Seen>) {
    let server = Server::start(script).await;
    let url = format!("{}{}", server.base_url, crate::PATH);
    let ok = sdk::call(behaviour, timing, &url, seed).await;
    (ok, server.seen())
}

async fn run(client: ZooClient, script: Vec<Step>) -> (bool, Vec<Seen>) {
    let server = Server::start(script).await;
    let ok = call(client, &server.base_url, SEED).await;
    (ok, server.seen())
}

#[test]
fn names_parse_back_and_are_distinct() {
    let names: HashSet<&str> = ZooClient::ALL.iter().map(ZooClient::name).collect();
    assert_eq!(names.len(), ZooClient::ALL.len());
    for client in ZooClient::ALL {
        assert_eq!(client.name().parse::<ZooClient>().ok(), Some(client));
    }
    let err = "retries-401"
        .parse::<ZooClient>()
        .err()
        .map(|e| e.to_string());
    assert!(
        err.is_some_and(|e| e.contains("no-jitter")),
        "lists the names"
    );
}

#[test]
fn every_defect_is_a_client_clause_of_its_own_class_and_the_rest_conform() {
    let conform = [
        ZooClient::Conforming,
        ZooClient::NarrowJitter,
        ZooClient::KeyInBody,
        ZooClient::SlowStart,
    ];
    for client in ZooClient::ALL {
        match (client.defect(), client.severity()) {
            (None, None) => assert!(conform.contains(&client), "{client} has no defect"),
            (Some(id), Some(severity)) => {
                let clause = idem_spec::clauses::get(id);
                assert!(
                    clause.is_some_and(|c| c.party == idem_spec::clauses::Party::Client),
                    "{client}: {id} is not a client clause"
                );
                let class = clause.map(|c| c.class);
                let want = match severity {
                    Severity::Safety => idem_spec::clauses::Class::Safety,
                    Severity::Semantics => idem_spec::clauses::Class::Semantics,
                };
                assert_eq!(class, Some(want), "{client}: {id}'s class");
            }
            other => panic!("{client}: {other:?}"),
        }
    }
    let safety: Vec<ZooClient> = ZooClient::ALL
        .into_iter()
        .filter(|c| c.severity() == Some(Severity::Safety))
        .collect();
    assert_eq!(
        safety,
        [
            ZooClient::FreshKeyPerAttempt,
            ZooClient::ResendsKeylessAfterReset,
            ZooClient::NoKey,
            ZooClient::TracingIdOnly
        ]
    );
}

/// One flag (or one number) per SDK client: no two are alike, and none is the contract.
#[test]
fn every_sdk_client_is_the_contract_with_its_own_change() {
    let sdk: Vec<ZooClient> = ZooClient::ALL
        .into_iter()
        .filter(|c| !crate::IDEM_CLIENT_ONES.contains(c))
        .collect();
    assert_eq!(sdk.len(), ZooClient::ALL.len() - 2);
    for (i, a) in sdk.iter().enumerate() {
        assert_ne!(
            (a.behaviour(), a.timing()),
            (Behaviour::CONTRACT, Timing::DEFAULT),
            "{a}"
        );
        for b in &sdk[i + 1..] {
            assert_ne!(
                (a.behaviour(), a.timing()),
                (b.behaviour(), b.timing()),
                "{a} {b}"
            );
        }
    }
    // The short hang is the long hint's client with one number changed.
    let (short, long) = (
        ZooClient::NoDeadlineShortHang,
        ZooClient::LongHintNoDeadline,
    );
    assert_eq!(short.behaviour(), long.behaviour());
    assert_eq!(
        Timing {
            attempt_timeout: Timing::DEFAULT.attempt_timeout,
            ..short.timing()
        },
        long.timing()
    );
}

#[test]
fn only_key_in_body_needs_kit_arguments() {
    for client in ZooClient::ALL {
        match client {
            ZooClient::KeyInBody => {
                assert_eq!(client.kit_args(), ["--key-pointer", "/idempotency_key"]);
                let pointer = client.kit_args()[1].trim_start_matches('/');
                assert_eq!(pointer, sdk::BODY_KEY_FIELD);
            }
            // exits-1-after-success included: the kit's default success body must stay.
            _ => assert!(client.kit_args().is_empty(), "{client}"),
        }
    }
}

#[test]
fn no_jitter_sleeps_the_ceilings_and_jitter_draws_under_them_per_seed() {
    let ceilings: Vec<Duration> = [500, 1000, 2000, 4000, 8000, 16000, 20000, 20000]
        .map(Duration::from_millis)
        .to_vec();
    let schedule = |b: Behaviour, seed: u64| -> Vec<Duration> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..8)
            .map(|n| b.backoff(&Timing::DEFAULT, n, &mut rng))
            .collect()
    };
    let no_jitter = ZooClient::NoJitter.behaviour();
    assert_eq!(schedule(no_jitter, 1), ceilings);
    assert_eq!(schedule(no_jitter, 2), ceilings);
    let contract = Behaviour::CONTRACT;
    let (one, again, two) = (
        schedule(contract, 1),
        schedule(contract, 1),
        schedule(contract, 2),
    );
    assert_eq!(one, again, "the same seed draws the same delays");
    assert_ne!(one, two, "another seed draws others");
    for (d, c) in one.iter().chain(&two).zip(ceilings.iter().cycle()) {
        assert!(d <= c, "{d:?} above its ceiling {c:?}");
    }
}

/// 503 with `Retry-After: 1`, then 201: every client gets its 201 on the second request; the
/// keys and the wait show each one's manners.
#[tokio::test]
async fn after_a_503_with_retry_after_each_client_retries_with_its_keys() {
    let mut runs = Vec::new();
    for client in ZooClient::ALL {
        runs.push((
            client,
            tokio::spawn(run(client, vec![Step::retry_after(503, "1")])),
        ));
    }
    for (client, run) in runs {
        let (ok, seen) = run.await.expect("the run completes");
        assert!(ok, "{client} gets its 201");
        assert_eq!(seen.len(), 2, "{client}: {seen:?}");
        assert!(seen.iter().all(|s| s.line == "POST /payments"), "{seen:?}");
        if client == ZooClient::KeyInBody {
            let key = body_key(&seen[0]);
            assert!(key.is_some() && key == body_key(&seen[1]), "{seen:?}");
        } else {
            assert!(seen.iter().all(|s| s.body == crate::BODY), "{seen:?}");
        }
        let tracing_ids: Vec<Option<&str>> =
            seen.iter().map(|s| s.header(sdk::TRACING_HEADER)).collect();
        if client == ZooClient::TracingIdOnly {
            assert!(tracing_ids[0].is_some() && tracing_ids[0] == tracing_ids[1]);
        } else {
            assert_eq!(tracing_ids, [None, None], "{client}");
        }
        let keys = keys(&seen);
        match client {
            ZooClient::FreshKeyPerAttempt => {
                assert!(keys[0].is_some() && keys[1].is_some() && keys[0] != keys[1]);
            }
            ZooClient::NoKey | ZooClient::TracingIdOnly => {
                assert_eq!(keys, [None, None], "{client} retried without a key");
            }
            ZooClient::KeyInBody => assert_eq!(keys, [None, None], "no key header"),
            _ => {
                assert!(
                    keys[0].is_some() && keys[0] == keys[1],
                    "{client}: {keys:?}"
                );
            }
        }
        if client != ZooClient::IgnoresRetryAfter {
            assert!(gap(&seen, 1) >= Duration::from_secs(1), "{client} waited");
        }
    }
}

/// A hint longer than the deadline: the contract stops at once with that answer; the client
/// that ignores `Retry-After` sleeps its own short backoff and tries again.
#[tokio::test]
async fn a_retry_after_past_the_deadline_stops_all_but_ignores_retry_after() {
    let script = || vec![Step::retry_after(429, "3600")];
    let (ok, seen) = run(ZooClient::Conforming, script()).await;
    assert!(!ok && seen.len() == 1, "{seen:?}");
    let (ok, seen) = run_sdk(Behaviour::CONTRACT, Timing::DEFAULT, script()).await;
    assert!(!ok && seen.len() == 1, "{seen:?}");
    let (ok, seen) = run(ZooClient::IgnoresRetryAfter, script()).await;
    assert!(ok && seen.len() == 2, "{seen:?}");
    // Without a deadline, a hint past its longest sleep stops it too: it never retries early.
    let long = ZooClient::LongHintNoDeadline.behaviour();
    let (ok, seen) = run_sdk(long, Timing::DEFAULT, script()).await;
    assert!(!ok && seen.len() == 1, "{seen:?}");
}

/// 503 twice without a hint: the client without jitter waits the full ceilings, 500 ms then 1 s.
#[tokio::test]
async fn no_jitter_waits_the_full_exponential_ceilings() {
    let plain = Step::Answer(503, Vec::new(), String::new());
    let (ok, seen) = run(ZooClient::NoJitter, vec![plain.clone(), plain]).await;
    assert!(ok && seen.len() == 3, "{seen:?}");
    assert!(gap(&seen, 1) >= Duration::from_millis(500));
    assert!(gap(&seen, 2) >= Duration::from_secs(1));
}

/// A final 400 (with a problem saying so): only retries-400 sends it again.
#[tokio::test]
async fn a_400_is_final_except_for_retries_400() {
    let bad = || {
        vec![Step::Answer(
            400,
            Vec::new(),
            r#"{"code":"invalid_request","retryable":false}"#.to_owned(),
        )]
    };
    let (ok, seen) = run(ZooClient::Conforming, bad()).await;
    assert!(!ok && seen.len() == 1, "{seen:?}");
    let (ok, seen) = run_sdk(Behaviour::CONTRACT, FAST, bad()).await;
    assert!(!ok && seen.len() == 1, "{seen:?}");
    let (ok, seen) = run_sdk(ZooClient::Retries400.behaviour(), FAST, bad()).await;
    assert!(ok && seen.len() == 2, "{seen:?}");
}

/// 503 five times: the contract gives up after 3 attempts; the client without a cap keeps on
/// until the sixth request gets its 201.
#[tokio::test]
async fn only_no_attempt_cap_goes_past_three_attempts() {
    let script = || vec![Step::Answer(503, Vec::new(), String::new()); 5];
    let (ok, seen) = run_sdk(Behaviour::CONTRACT, FAST, script()).await;
    assert!(!ok && seen.len() == 3, "{seen:?}");
    let (ok, seen) = run_sdk(ZooClient::NoAttemptCap.behaviour(), FAST, script()).await;
    assert!(ok && seen.len() == 6, "{seen:?}");
    assert!(
        keys(&seen)
            .windows(2)
            .all(|w| w[0].is_some() && w[0] == w[1])
    );
}

/// A server that never answers, with a 300 ms deadline: the contract's one attempt uses all of
/// it and stops; the client that resets its deadline makes 3 attempts of 300 ms each.
#[tokio::test]
async fn a_hanging_server_bounds_the_contract_but_not_deadline_reset() {
    let timing = Timing {
        deadline: Duration::from_millis(300),
        ..FAST
    };
    let script = || vec![Step::Hang; 3];
    let (ok, seen) = run_sdk(Behaviour::CONTRACT, timing, script()).await;
    assert!(!ok && seen.len() == 1, "{seen:?}");
    let started = Instant::now();
    let reset = ZooClient::DeadlineResetPerAttempt.behaviour();
    let (ok, seen) = run_sdk(reset, timing, script()).await;
    assert!(!ok && seen.len() == 3, "{seen:?}");
    assert!(
        started.elapsed() >= 3 * timing.deadline,
        "each attempt got it all"
    );
}

/// The connection closes under the first request: the contract resends with the same key;
/// resends-keyless-after-reset resends without one.
#[tokio::test]
async fn after_a_reset_only_resends_keyless_drops_the_key() {
    let (ok, seen) = run(ZooClient::Conforming, vec![Step::Close]).await;
    assert!(ok && seen.len() == 2, "{seen:?}");
    assert!(seen[0].key.is_some() && seen[0].key == seen[1].key);
    let (ok, seen) = run_sdk(Behaviour::CONTRACT, FAST, vec![Step::Close]).await;
    assert!(ok && seen.len() == 2, "{seen:?}");
    assert!(seen[0].key.is_some() && seen[0].key == seen[1].key);
    let keyless = ZooClient::ResendsKeylessAfterReset.behaviour();
    let (ok, seen) = run_sdk(keyless, FAST, vec![Step::Close, Step::Close]).await;
    assert!(ok && seen.len() == 3, "{seen:?}");
    assert!(seen[0].key.is_some(), "the first attempt has its key");
    assert_eq!(keys(&seen[1..]), [None, None], "the resends do not");
}

/// A 409 in flight is retried (and does not spend an attempt); a 409 mismatch is final.
#[tokio::test]
async fn a_409_in_flight_is_retried_and_a_mismatch_is_not() {
    let in_flight = Step::Answer(
        409,
        vec![("retry-after", "0".to_owned())],
        r#"{"code":"idempotency_key_in_use"}"#.to_owned(),
    );
    let (ok, seen) = run_sdk(Behaviour::CONTRACT, FAST, vec![in_flight; 3]).await;
    assert!(ok && seen.len() == 4, "{seen:?}");
    let mismatch = Step::Answer(
        409,
        Vec::new(),
        r#"{"code":"idempotency_key_mismatch","retryable":false}"#.to_owned(),
    );
    let (ok, seen) = run_sdk(Behaviour::CONTRACT, FAST, vec![mismatch]).await;
    assert!(!ok && seen.len() == 1, "{seen:?}");
}

/// A 500 is retried only with a key: no-key sends it once.
#[tokio::test]
async fn a_500_is_retried_only_with_a_key() {
    let error = || vec![Step::Answer(500, Vec::new(), String::new())];
    let (ok, seen) = run_sdk(Behaviour::CONTRACT, FAST, error()).await;
    assert!(ok && seen.len() == 2, "{seen:?}");
    let (ok, seen) = run_sdk(ZooClient::NoKey.behaviour(), FAST, error()).await;
    assert!(!ok && seen.len() == 1, "{seen:?}");
}

/// A mismatch 409 (`"retryable": false`): the contract stops; retries-409 resends it with the
/// same key, and counts it, so three of them end the call.
#[tokio::test]
async fn only_retries_409_resends_a_final_409_and_with_its_key() {
    let mismatch = Step::Answer(
        409,
        Vec::new(),
        r#"{"code":"idempotency_key_mismatch","retryable":false}"#.to_owned(),
    );
    let (ok, seen) = run_sdk(Behaviour::CONTRACT, FAST, vec![mismatch.clone()]).await;
    assert!(!ok && seen.len() == 1, "{seen:?}");
    let retries = ZooClient::Retries409.behaviour();
    let (ok, seen) = run_sdk(retries, FAST, vec![mismatch.clone()]).await;
    assert!(ok && seen.len() == 2, "{seen:?}");
    assert!(seen[0].key.is_some() && seen[0].key == seen[1].key);
    let (ok, seen) = run_sdk(retries, FAST, vec![mismatch; 3]).await;
    assert!(!ok && seen.len() == 3, "counted against the cap: {seen:?}");
    assert!(keys(&seen).windows(2).all(|w| w[0] == w[1]));
    // A 409 in flight is still free for it, as for the contract.
    let in_flight = Step::Answer(
        409,
        Vec::new(),
        r#"{"code":"idempotency_key_in_use","retryable":true}"#.to_owned(),
    );
    let (ok, seen) = run_sdk(retries, FAST, vec![in_flight; 3]).await;
    assert!(ok && seen.len() == 4, "{seen:?}");
}

/// A hint longer than a (shrunk) deadline: the contract stops at once with that answer;
/// long-hint-no-deadline has no deadline to stop it, sleeps the hint in full and retries.
/// Only a hint past its longest sleep stops it, and then at once: it never retries early.
#[tokio::test]
async fn long_hint_no_deadline_sleeps_a_hint_past_the_deadline_in_full() {
    let timing = Timing {
        deadline: Duration::from_millis(500),
        ..FAST
    };
    let script = || vec![Step::retry_after(503, "1")];
    let (ok, seen) = run_sdk(Behaviour::CONTRACT, timing, script()).await;
    assert!(!ok && seen.len() == 1, "{seen:?}");
    let long = ZooClient::LongHintNoDeadline.behaviour();
    let (ok, seen) = run_sdk(long, timing, script()).await;
    assert!(ok && seen.len() == 2, "{seen:?}");
    assert!(gap(&seen, 1) >= Duration::from_secs(1), "the hint in full");
    let past = sdk::LONGEST_SLEEP.as_secs().to_string();
    let (ok, seen) = run_sdk(long, timing, vec![Step::retry_after(429, &past)]).await;
    assert!(!ok && seen.len() == 1, "{seen:?}");
}

/// A hanging server, with no-deadline-short-hang's numbers shrunk a hundredfold: three full
/// attempt timeouts, past the deadline the contract keeps to.
#[tokio::test]
async fn without_a_deadline_a_hanging_server_gets_every_full_attempt_timeout() {
    let client = ZooClient::NoDeadlineShortHang;
    let t = client.timing();
    let timing = Timing {
        base: t.base / 100,
        cap: t.cap / 100,
        deadline: t.deadline / 100,
        attempt_timeout: t.attempt_timeout / 100,
        ..t
    };
    let started = Instant::now();
    let (ok, seen) = run_sdk(client.behaviour(), timing, vec![Step::Hang; 3]).await;
    assert!(!ok && seen.len() == 3, "{seen:?}");
    let took = started.elapsed();
    assert!(took >= 3 * timing.attempt_timeout, "{took:?}");
    assert!(took > timing.deadline, "{took:?}");
}

/// no-deadline-short-hang's real numbers against the kit's hang scenario: its three attempts
/// and two jittered backoffs end past its 30 s deadline by more than the kit's tolerance
/// (1 s or 5 %), and before the earliest kill bound (the deadline plus 5 s): a kit that only
/// asks "was it killed?" would pass it.
#[test]
fn no_deadline_short_hang_ends_past_its_deadline_and_under_the_kill_bound() {
    let t = ZooClient::NoDeadlineShortHang.timing();
    let fastest = t.attempt_timeout * t.max_attempts;
    let slowest = fastest + (0..t.max_attempts - 1).map(ceiling).sum::<Duration>();
    assert_eq!(
        (fastest, slowest),
        (Duration::from_secs(33), Duration::from_millis(34_500))
    );
    let tolerance = (t.deadline / 20).max(Duration::from_secs(1));
    assert!(fastest > t.deadline + tolerance);
    assert!(slowest < t.deadline + Duration::from_secs(5));
    // Backoffs drawn under those ceilings, so `slowest` bounds them.
    let b = ZooClient::NoDeadlineShortHang.behaviour();
    for seed in 0..100 {
        let mut rng = StdRng::seed_from_u64(seed);
        for n in 0..t.max_attempts - 1 {
            assert!(b.backoff(&t, n, &mut rng) <= ceiling(n));
        }
    }
}

/// After a lost connection, zero-backoff-after-reset draws no backoff at all; after anything
/// else it draws the contract's (the same draws, as it takes nothing from the generator after
/// a reset).
#[test]
fn zero_backoff_after_reset_skips_the_backoff_after_a_lost_connection_only() {
    let zero = ZooClient::ZeroBackoffAfterReset.behaviour();
    let contract = Behaviour::CONTRACT;
    let answer = Outcome::Answer {
        status: 503,
        retry_after: None,
        code: None,
        retryable: None,
    };
    // `c` follows `z` draw for draw; `r` is the contract's own after resets.
    let (mut z, mut c) = (StdRng::seed_from_u64(1), StdRng::seed_from_u64(1));
    let mut r = StdRng::seed_from_u64(2);
    let mut waits = 0;
    for n in 0..6 {
        let after_reset = zero.backoff_after(&Outcome::Lost, &Timing::DEFAULT, n, &mut z);
        assert_eq!(after_reset, Duration::ZERO);
        let contract_reset = contract.backoff_after(&Outcome::Lost, &Timing::DEFAULT, n, &mut r);
        assert!(contract_reset <= ceiling(n));
        waits += usize::from(!contract_reset.is_zero());
        for other in [&Outcome::TimedOut, &answer] {
            assert_eq!(
                zero.backoff_after(other, &Timing::DEFAULT, n, &mut z),
                contract.backoff_after(other, &Timing::DEFAULT, n, &mut c),
            );
        }
    }
    assert_eq!(waits, 6, "the contract waits after every reset");
}

/// On the wire, with a 2 s backoff base: the contract waits its drawn backoff after a reset;
/// zero-backoff-after-reset resends at once twice, then waits its drawn backoff after a 503.
#[tokio::test]
async fn zero_backoff_after_reset_resends_at_once_where_the_contract_waits() {
    let timing = Timing {
        base: Duration::from_secs(2),
        cap: Duration::from_secs(2),
        ..Timing::DEFAULT
    };
    let at_once = Duration::from_millis(500);
    let first = |seed| Behaviour::CONTRACT.backoff(&timing, 0, &mut StdRng::seed_from_u64(seed));
    // A seed whose first draw tells "at once" from "waited": over 1 s of the 2 s ceiling.
    let seed = (0..100).find(|s| first(*s) >= Duration::from_secs(1));
    let seed = seed.expect("half the seeds draw that");
    let (ok, seen) = run_sdk_seeded(Behaviour::CONTRACT, timing, vec![Step::Close], seed).await;
    assert!(ok && seen.len() == 2, "{seen:?}");
    assert!(gap(&seen, 1) >= first(seed), "the contract waited");

    let zero = ZooClient::ZeroBackoffAfterReset.behaviour();
    let plain = Step::Answer(503, Vec::new(), String::new());
    let script = vec![Step::Close, Step::Close, plain];
    let four = Timing {
        max_attempts: 4,
        ..timing
    };
    let (ok, seen) = run_sdk_seeded(zero, four, script, seed).await;
    assert!(ok && seen.len() == 4, "{seen:?}");
    assert!(
        gap(&seen, 1) < at_once && gap(&seen, 2) < at_once,
        "{seen:?}"
    );
    assert!(seen.iter().all(|s| s.key.is_some() && s.key == seen[0].key));
    // Its first draw is the one before the third retry: nothing was drawn after the resets.
    let after_503 = zero.backoff(&timing, 2, &mut StdRng::seed_from_u64(seed));
    assert_eq!(
        after_503,
        first(seed),
        "the same ceiling, the same first draw"
    );
    assert!(gap(&seen, 3) >= after_503, "it waited after the 503");
}

/// narrow-jitter draws every delay from [0.75, 1] of its ceiling, and the draws differ:
/// jitter, over a quarter of the range full jitter uses.
#[test]
fn narrow_jitter_draws_from_the_top_quarter_under_each_ceiling() {
    let narrow = ZooClient::NarrowJitter.behaviour();
    let mut firsts = Vec::new();
    let mut full_below = 0;
    for seed in 0..200 {
        let mut rng = StdRng::seed_from_u64(seed);
        for n in 0..8 {
            let (d, c) = (narrow.backoff(&Timing::DEFAULT, n, &mut rng), ceiling(n));
            assert!(d >= c * 3 / 4 && d <= c, "{d:?} outside [0.75, 1] × {c:?}");
        }
        let mut rng = StdRng::seed_from_u64(seed);
        firsts.push(narrow.backoff(&Timing::DEFAULT, 0, &mut rng));
        let mut rng = StdRng::seed_from_u64(seed);
        let full = Behaviour::CONTRACT.backoff(&Timing::DEFAULT, 0, &mut rng);
        full_below += usize::from(full < ceiling(0) * 3 / 4);
    }
    let distinct: HashSet<Duration> = firsts.iter().copied().collect();
    assert!(
        distinct.len() > 190,
        "it jitters: {} distinct",
        distinct.len()
    );
    let (lo, hi) = (firsts.iter().min(), firsts.iter().max());
    assert!(
        lo.is_some_and(|d| *d < Duration::from_millis(390)),
        "{lo:?}"
    );
    assert!(
        hi.is_some_and(|d| *d > Duration::from_millis(485)),
        "{hi:?}"
    );
    assert!(
        full_below > 100,
        "full jitter lands below 0.75 c, {full_below} of 200"
    );
}

/// A 201 whose body has no `id`: the effect happened, yet exits-1-after-success fails the
/// call, and does not send it again; with an `id` it succeeds like the contract.
#[tokio::test]
async fn exits_1_after_success_fails_a_2xx_it_cannot_parse_without_resending_it() {
    let answer = |body: &str| vec![Step::Answer(201, Vec::new(), body.to_owned())];
    let parser = ZooClient::ExitsOneAfterSuccess.behaviour();
    let (ok, seen) = run_sdk(Behaviour::CONTRACT, FAST, answer("{}")).await;
    assert!(ok && seen.len() == 1, "{seen:?}");
    for body in ["{}", "not json", r#"{"id":1}"#] {
        let (ok, seen) = run_sdk(parser, FAST, answer(body)).await;
        assert!(!ok && seen.len() == 1, "{body}: {seen:?}");
    }
    let (ok, seen) = run_sdk(parser, FAST, answer(r#"{"id":"pay_1"}"#)).await;
    assert!(ok && seen.len() == 1, "{seen:?}");
}

/// key-in-body: no key header, one key per operation in the body, the same on every attempt
/// (after a reset and a 503), and a new one for the next operation. With its key it may
/// retry a 500.
#[tokio::test]
async fn key_in_body_sends_one_body_key_per_operation_and_no_key_header() {
    let script = || {
        vec![
            Step::Close,
            Step::Answer(503, vec![("retry-after", "0".to_owned())], String::new()),
        ]
    };
    let (ok, seen) = run(ZooClient::KeyInBody, script()).await;
    assert!(ok && seen.len() == 3, "{seen:?}");
    assert_eq!(keys(&seen), [None, None, None], "no Idempotency-Key header");
    let key = body_key(&seen[0]);
    assert!(
        key.as_deref()
            .is_some_and(|k| uuid::Uuid::parse_str(k).is_ok()),
        "{key:?}"
    );
    assert!(seen.iter().all(|s| body_key(s) == key), "{seen:?}");
    assert_eq!(
        seen[0].body,
        sdk::body_with_key(key.as_deref().unwrap_or_default())
    );
    let (_, again) = run(ZooClient::KeyInBody, Vec::new()).await;
    assert_ne!(body_key(&again[0]), key, "a new operation, a new key");
    let error = vec![Step::Answer(500, Vec::new(), String::new())];
    let (ok, seen) = run(ZooClient::KeyInBody, error).await;
    assert!(ok && seen.len() == 2, "{seen:?}");
}

/// tracing-id-only: no key, but one `x-ms-client-request-id` per operation, resent unchanged
/// after a reset and a 503 (the defect); a 500 it does not retry, knowing it has no key.
#[tokio::test]
async fn tracing_id_only_resends_its_tracing_id_and_no_key() {
    let script = vec![
        Step::Close,
        Step::Answer(503, vec![("retry-after", "0".to_owned())], String::new()),
    ];
    let (ok, seen) = run(ZooClient::TracingIdOnly, script).await;
    assert!(ok && seen.len() == 3, "{seen:?}");
    assert_eq!(keys(&seen), [None, None, None], "{seen:?}");
    let id = seen[0].header(sdk::TRACING_HEADER);
    assert!(id.is_some() && seen.iter().all(|s| s.header(sdk::TRACING_HEADER) == id));
    assert!(seen.iter().all(|s| s.body == crate::BODY));
    let error = vec![Step::Answer(500, Vec::new(), String::new())];
    let (ok, seen) = run(ZooClient::TracingIdOnly, error).await;
    assert!(!ok && seen.len() == 1, "{seen:?}");
}

/// slow-start sends its first request no sooner than 2 s after the call starts (and not
/// absurdly later); the conforming client, for contrast, well before.
#[tokio::test]
async fn slow_start_sends_nothing_for_its_first_two_seconds() {
    for client in [ZooClient::SlowStart, ZooClient::Conforming] {
        let server = Server::start(Vec::new()).await;
        let started = Instant::now();
        let ok = call(client, &server.base_url, SEED).await;
        let seen = server.seen();
        assert!(ok && seen.len() == 1, "{client}: {seen:?}");
        let first = seen[0].at.duration_since(started);
        if client == ZooClient::SlowStart {
            assert!(first >= SLOW_START, "{first:?}");
            assert!(first < SLOW_START + Duration::from_secs(10), "{first:?}");
        } else {
            assert!(first < SLOW_START, "{first:?}");
        }
    }
}

/// Five lost connections, then a 201: the contract gives up after 3 attempts; resets-uncounted
/// resends past its cap, with its key, and gets the 201. Answers still count for it.
#[tokio::test]
async fn resets_uncounted_resends_lost_connections_past_the_cap() {
    let uncounted = ZooClient::ResetsUncounted.behaviour();
    let (ok, seen) = run_sdk(Behaviour::CONTRACT, FAST, vec![Step::Close; 5]).await;
    assert!(!ok && seen.len() == 3, "{seen:?}");
    let (ok, seen) = run_sdk(uncounted, FAST, vec![Step::Close; 5]).await;
    assert!(ok && seen.len() == 6, "{seen:?}");
    assert!(seen.iter().all(|s| s.key.is_some() && s.key == seen[0].key));
    let plain = Step::Answer(503, Vec::new(), String::new());
    let (ok, seen) = run_sdk(uncounted, FAST, vec![plain; 5]).await;
    assert!(!ok && seen.len() == 3, "{seen:?}");
}

/// Timeouts go uncounted too: four hung attempts, then a 201.
#[tokio::test]
async fn resets_uncounted_does_not_count_timeouts_either() {
    let timing = Timing {
        attempt_timeout: Duration::from_millis(50),
        ..FAST
    };
    let (ok, seen) = run_sdk(Behaviour::CONTRACT, timing, vec![Step::Hang; 4]).await;
    assert!(!ok && seen.len() == 3, "{seen:?}");
    let uncounted = ZooClient::ResetsUncounted.behaviour();
    let (ok, seen) = run_sdk(uncounted, timing, vec![Step::Hang; 4]).await;
    assert!(ok && seen.len() == 5, "{seen:?}");
}

/// A connection lost on every request: resets-uncounted resends past its cap of 3, and its
/// ceiling of 10 sends, which counts every request, ends it long before its deadline.
#[tokio::test]
async fn resets_uncounted_stops_a_reset_forever_at_its_ceiling_of_sends() {
    let timing = Timing {
        base: Duration::from_millis(10),
        cap: Duration::from_millis(10),
        deadline: Duration::from_secs(30),
        ..Timing::DEFAULT
    };
    let uncounted = ZooClient::ResetsUncounted.behaviour();
    let (ok, seen) = run_sdk(uncounted, timing, vec![Step::Close; 40]).await;
    assert!(!ok, "{seen:?}");
    assert_eq!(seen.len(), 10, "{seen:?}");
}

/// 503 twenty times, then a 201: the client without a cap sends all 21 requests, past the
/// contract's ceiling of 10 (the count MUST `idem.client.attempt-cap`); the contract stops at 3.
#[tokio::test]
async fn no_attempt_cap_goes_past_the_ceiling_of_sends() {
    let script = || vec![Step::Answer(503, Vec::new(), String::new()); 20];
    let (ok, seen) = run_sdk(Behaviour::CONTRACT, FAST, script()).await;
    assert!(!ok && seen.len() == 3, "{seen:?}");
    let (ok, seen) = run_sdk(ZooClient::NoAttemptCap.behaviour(), FAST, script()).await;
    assert!(ok && seen.len() == 21, "{seen:?}");
}
