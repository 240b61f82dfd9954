//! Each client's behaviour on the wire against the scripted server: its defect shows, and
//! (where a scenario does not touch it) it behaves like the contract.

use std::collections::HashSet;
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::time::Instant;

use crate::script::{Seen, Server, Step};
use crate::sdk::{self, Behaviour, Timing};
use crate::{ZooClient, call};

/// The defaults with a 1 ms backoff, for scenarios about counts rather than delays.
const FAST: Timing = Timing {
    base: Duration::from_millis(1),
    cap: Duration::from_millis(1),
    ..Timing::DEFAULT
};

fn keys(seen: &[Seen]) -> Vec<Option<String>> {
    seen.iter().map(|s| s.key.clone()).collect()
}

fn gap(seen: &[Seen], i: usize) -> Duration {
    seen[i].at.duration_since(seen[i - 1].at)
}

async fn run_sdk(behaviour: Behaviour, timing: Timing, script: Vec<Step>) -> (bool, Vec<Seen>) {
    let server = Server::start(script).await;
    let url = format!("{}{}", server.base_url, crate::PATH);
    let ok = sdk::call(behaviour, timing, &url, 7).await;
    (ok, server.seen())
}

async fn run(client: ZooClient, script: Vec<Step>) -> (bool, Vec<Seen>) {
    let server = Server::start(script).await;
    let ok = call(client, &server.base_url, 7).await;
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
fn every_defect_is_a_client_clause_and_only_conforming_has_none() {
    for client in ZooClient::ALL {
        match client.defect() {
            None => assert_eq!(client, ZooClient::Conforming),
            Some(id) => {
                let clause = idem_spec::clauses::get(id);
                assert!(
                    clause.is_some_and(|c| c.party == idem_spec::clauses::Party::Client),
                    "{client}: {id} is not a client clause"
                );
                assert_ne!(client.behaviour(), Behaviour::CONTRACT, "{client}");
            }
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
        assert!(seen.iter().all(|s| s.body == crate::BODY), "{seen:?}");
        let keys = keys(&seen);
        match client {
            ZooClient::FreshKeyPerAttempt => {
                assert!(keys[0].is_some() && keys[1].is_some() && keys[0] != keys[1]);
            }
            ZooClient::NoKey => assert_eq!(keys, [None, None], "retried without a key"),
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
