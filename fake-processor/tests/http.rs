//! The processor's HTTP behaviour over a real socket on 127.0.0.1, served
//! in-process on a SQLite file.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{TempDir, charge, key};
use idem_fake_processor::{
    Behavior, ChargeOutcome, ChargeStatus, ControlMode, ControlRequest, DECLINE_CODE,
    ProcessorClient, spawn_in_process,
};
use tokio::sync::Barrier;

// clause: idem.multistep.foreign-key
#[tokio::test]
async fn repeated_key_returns_the_first_charge_and_creates_nothing() {
    let dir = TempDir::new();
    let p = spawn_in_process(dir.db()).await.unwrap();
    let c = p.client();

    let first = c
        .create_charge(&key("pay-1"), &charge(500), None)
        .await
        .unwrap();
    let ChargeOutcome::Created(created) = first else {
        panic!("first call must create: {first:?}")
    };
    assert_eq!(created.status, ChargeStatus::Succeeded);
    assert_eq!(created.amount, 500);

    // Same request, fields in another order and with whitespace: a replay,
    // byte for byte, marked as such.
    let http = reqwest::Client::new();
    let raw = http
        .post(format!("{}/charges", p.base_url()))
        .header("Idempotency-Key", "\"pay-1\"")
        .header("Content-Type", "application/json")
        .body(
            r#"{ "description":"order 42", "source":"tok_visa", "currency":"eur", "amount":500 }"#,
        )
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 200);
    assert_eq!(raw.headers()["idempotent-replayed"], "true");
    assert_eq!(
        raw.headers()["location"],
        format!("/charges/{}", created.id).as_str()
    );
    let replayed: idem_fake_processor::Charge = raw.json().await.unwrap();
    assert_eq!(replayed, created);

    let again = c
        .create_charge(&key("pay-1"), &charge(500), None)
        .await
        .unwrap();
    assert_eq!(again, ChargeOutcome::Replayed(created.clone()));

    let list = c.charges().await.unwrap();
    assert_eq!(list.count, 1);
    assert_eq!(list.charges, vec![created.clone()]);
    assert_eq!(list.calls_for("pay-1"), 3);
    assert_eq!(c.charge(&created.id).await.unwrap(), Some(created));
    assert_eq!(c.charge("ch_missing").await.unwrap(), None);
}

#[tokio::test]
async fn same_key_with_another_body_is_a_conflict_that_changes_nothing() {
    let dir = TempDir::new();
    let p = spawn_in_process(dir.db()).await.unwrap();
    let c = p.client();
    let first = c
        .create_charge(&key("k"), &charge(100), None)
        .await
        .unwrap();
    let other = c
        .create_charge(&key("k"), &charge(999), None)
        .await
        .unwrap();
    match other {
        ChargeOutcome::Rejected { status, problem } => {
            assert_eq!(status, 409);
            assert_eq!(problem.code, "idempotency_key_mismatch");
        }
        o => panic!("expected 409, got {o:?}"),
    }
    let list = c.charges().await.unwrap();
    assert_eq!(list.count, 1);
    assert_eq!(Some(&list.charges[0]), first.charge());
    assert_eq!(list.charges[0].amount, 100);
}

#[tokio::test]
async fn every_call_with_a_key_is_counted_whatever_its_outcome() {
    let dir = TempDir::new();
    let p = spawn_in_process(dir.db()).await.unwrap();
    let c = p.client();

    // Key a: create, replay, a "decline" on an existing charge (still the
    // stored success), a 503, a mismatch: five calls, one charge.
    let a = key("a");
    assert!(matches!(
        c.create_charge(&a, &charge(1), None).await.unwrap(),
        ChargeOutcome::Created(_)
    ));
    assert!(matches!(
        c.create_charge(&a, &charge(1), None).await.unwrap(),
        ChargeOutcome::Replayed(_)
    ));
    assert!(matches!(
        c.create_charge(&a, &charge(1), Some(Behavior::DECLINE))
            .await
            .unwrap(),
        ChargeOutcome::Replayed(_)
    ));
    assert!(matches!(
        c.create_charge(&a, &charge(1), Some(Behavior::UNAVAILABLE))
            .await
            .unwrap(),
        ChargeOutcome::Unavailable { .. }
    ));
    assert!(matches!(
        c.create_charge(&a, &charge(2), None).await.unwrap(),
        ChargeOutcome::Rejected { status: 409, .. }
    ));

    // Key b: a body that fails validation is counted but creates nothing.
    let http = reqwest::Client::new();
    let url = format!("{}/charges", p.base_url());
    let bad = http
        .post(&url)
        .header("Idempotency-Key", "b")
        .body(r#"{"amount":0,"currency":"eur"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 422);
    let broken = http
        .post(&url)
        .header("Idempotency-Key", "b")
        .body(r#"{"amount":5,"currency":"eur","surprise":true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(broken.status(), 400);

    // No key, or an invalid one: rejected before anything is counted.
    let missing = http.post(&url).body("{}").send().await.unwrap();
    assert_eq!(missing.status(), 400);
    let problem: idem_spec::Problem = missing.json().await.unwrap();
    assert_eq!(problem.code, "idempotency_key_missing");
    let invalid = http
        .post(&url)
        .header("Idempotency-Key", "has space")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(invalid.status(), 400);
    assert_eq!(
        invalid.headers()["content-type"],
        idem_spec::problem::PROBLEM_CONTENT_TYPE
    );

    let list = c.charges().await.unwrap();
    assert_eq!(list.count, 1);
    assert_eq!(list.calls_for("a"), 5);
    assert_eq!(list.calls_for("b"), 2);
    assert_eq!(list.calls_per_key.len(), 2);
    assert_eq!(list.total_calls(), 7);
}

// clause: idem.failure.final-outcomes
#[tokio::test]
async fn a_decline_is_stored_and_replayed_as_the_same_402() {
    let dir = TempDir::new();
    let p = spawn_in_process(dir.db()).await.unwrap();
    let c = p.client();
    let k = key("declined-1");

    let first = c
        .create_charge(&k, &charge(700), Some(Behavior::DECLINE))
        .await
        .unwrap();
    let ChargeOutcome::Declined {
        charge: declined,
        replayed: false,
    } = first
    else {
        panic!("expected a first decline, got {first:?}")
    };
    assert_eq!(declined.status, ChargeStatus::Declined);
    assert_eq!(declined.failure_code.as_deref(), Some(DECLINE_CODE));

    // Without the header the processor would succeed, but the outcome is
    // stored: the replay is the same 402.
    let again = c.create_charge(&k, &charge(700), None).await.unwrap();
    assert_eq!(
        again,
        ChargeOutcome::Declined {
            charge: declined.clone(),
            replayed: true
        }
    );
    let list = c.charges().await.unwrap();
    assert_eq!(list.count, 1);
    assert_eq!(list.count_with(ChargeStatus::Declined), 1);
    assert_eq!(list.calls_for("declined-1"), 2);
}

// clause: idem.failure.5xx-not-stored
#[tokio::test]
async fn unavailable_records_nothing_so_the_same_key_succeeds_later() {
    let dir = TempDir::new();
    let p = spawn_in_process(dir.db()).await.unwrap();
    let c = p.client();
    let k = key("flaky-1");

    let first = c
        .create_charge(&k, &charge(300), Some(Behavior::UNAVAILABLE))
        .await
        .unwrap();
    assert_eq!(
        first,
        ChargeOutcome::Unavailable {
            retry_after: Some(Duration::from_secs(1))
        }
    );
    let list = c.charges().await.unwrap();
    assert_eq!(list.count, 0);
    assert_eq!(list.calls_for("flaky-1"), 1);

    // A retry with a *different* body is not a mismatch: nothing was stored.
    let retry = c.create_charge(&k, &charge(301), None).await.unwrap();
    let ChargeOutcome::Created(created) = retry else {
        panic!("the retry must create the charge, got {retry:?}")
    };
    assert_eq!(created.amount, 301);
    let list = c.charges().await.unwrap();
    assert_eq!(list.count, 1);
    assert_eq!(list.calls_for("flaky-1"), 2);
}

#[tokio::test]
async fn a_period_counted_in_calls_switches_back_by_itself() {
    let dir = TempDir::new();
    let p = spawn_in_process(dir.db()).await.unwrap();
    let c = p.client();

    let state = c
        .set_control(&ControlRequest::new(ControlMode::Unavailable).for_calls(2))
        .await
        .unwrap();
    assert!(state.active);
    assert_eq!(state.remaining_calls, Some(2));

    for k in ["p1", "p2"] {
        assert!(matches!(
            c.create_charge(&key(k), &charge(10), None).await.unwrap(),
            ChargeOutcome::Unavailable { .. }
        ));
    }
    assert!(!c.control().await.unwrap().active);
    assert!(matches!(
        c.create_charge(&key("p1"), &charge(10), None)
            .await
            .unwrap(),
        ChargeOutcome::Created(_)
    ));

    // A request with its own header neither follows nor consumes a period.
    c.set_control(&ControlRequest::new(ControlMode::Decline).for_calls(1))
        .await
        .unwrap();
    assert!(matches!(
        c.create_charge(&key("p3"), &charge(10), Some(Behavior::NORMAL))
            .await
            .unwrap(),
        ChargeOutcome::Created(_)
    ));
    assert!(matches!(
        c.create_charge(&key("p4"), &charge(10), None)
            .await
            .unwrap(),
        ChargeOutcome::Declined {
            replayed: false,
            ..
        }
    ));
    assert!(matches!(
        c.create_charge(&key("p5"), &charge(10), None)
            .await
            .unwrap(),
        ChargeOutcome::Created(_)
    ));

    // An open-ended period lasts until DELETE /_control.
    c.set_control(&ControlRequest::new(ControlMode::Unavailable))
        .await
        .unwrap();
    for _ in 0..3 {
        assert!(matches!(
            c.create_charge(&key("p6"), &charge(10), None)
                .await
                .unwrap(),
            ChargeOutcome::Unavailable { .. }
        ));
    }
    assert!(!c.reset_control().await.unwrap().active);
    assert!(matches!(
        c.create_charge(&key("p6"), &charge(10), None)
            .await
            .unwrap(),
        ChargeOutcome::Created(_)
    ));

    let list = c.charges().await.unwrap();
    assert_eq!(list.count, 5);
    assert_eq!(list.count_with(ChargeStatus::Declined), 1);
    assert_eq!(list.calls_for("p6"), 4);
}

#[tokio::test]
async fn invalid_control_requests_are_refused() {
    let dir = TempDir::new();
    let p = spawn_in_process(dir.db()).await.unwrap();
    let c = p.client();
    let err = c
        .set_control(&ControlRequest::new(ControlMode::Slow))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            idem_fake_processor::Error::UnexpectedStatus { status: 422, .. }
        ),
        "{err}"
    );
    let bad_header = reqwest::Client::new()
        .post(format!("{}/charges", p.base_url()))
        .header("Idempotency-Key", "h")
        .header("Processor-Behavior", "explode")
        .body(r#"{"amount":1,"currency":"eur"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(bad_header.status(), 422);
    assert_eq!(c.charges().await.unwrap().count, 0);
    assert!(!c.control().await.unwrap().active);
}

#[tokio::test]
async fn slow_delays_the_answer_but_the_charge_exists_before_it() {
    let dir = TempDir::new();
    let p = spawn_in_process(dir.db()).await.unwrap();
    let c = p.client();

    // A sleep never ends early, so the lower bound is robust.
    let started = Instant::now();
    let slow = c
        .create_charge(&key("s1"), &charge(5), Some(Behavior::slow(300)))
        .await
        .unwrap();
    assert!(matches!(slow, ChargeOutcome::Created(_)));
    assert!(started.elapsed() >= Duration::from_millis(300));

    // A caller that gives up during the delay has still been charged: the
    // case a multi-step server must survive. Its retry is a replay.
    let impatient = ProcessorClient::with_http(
        reqwest::Client::builder()
            .timeout(Duration::from_millis(1500))
            .build()
            .unwrap(),
        p.base_url(),
    );
    let err = impatient
        .create_charge(&key("s2"), &charge(6), Some(Behavior::slow(30_000)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, idem_fake_processor::Error::Http(e) if e.is_timeout()),
        "{err}"
    );
    // The charge is recorded before the delay, and the caller hanging up
    // does not abandon it; poll (bounded) in case the recording is still in
    // flight on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(10);
    let recorded = loop {
        let list = c.charges().await.unwrap();
        if let Some(ch) = list.charge_for("s2") {
            break ch.clone();
        }
        assert!(Instant::now() < deadline, "s2 was never recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        c.create_charge(&key("s2"), &charge(6), None).await.unwrap(),
        ChargeOutcome::Replayed(recorded)
    );
    assert_eq!(c.charges().await.unwrap().count, 2);
}

// clause: idem.claim.atomic, idem.concurrency.single-effect
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_calls_with_one_key_create_exactly_one_charge() {
    const N: usize = 16;
    let dir = TempDir::new();
    let p = spawn_in_process(dir.db()).await.unwrap();
    let c = p.client();
    let barrier = Arc::new(Barrier::new(N));
    let mut tasks = Vec::with_capacity(N);
    for _ in 0..N {
        let c = c.clone();
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            c.create_charge(&key("race"), &charge(4200), None).await
        }));
    }
    let mut created = Vec::new();
    let mut replayed = Vec::new();
    for t in tasks {
        match t.await.unwrap().unwrap() {
            ChargeOutcome::Created(ch) => created.push(ch),
            ChargeOutcome::Replayed(ch) => replayed.push(ch),
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(created.len(), 1, "exactly one call creates");
    assert_eq!(replayed.len(), N - 1);
    assert!(replayed.iter().all(|r| r == &created[0]));
    let list = c.charges().await.unwrap();
    assert_eq!(list.count, 1);
    assert_eq!(list.calls_for("race"), N as u64);
}

#[tokio::test]
async fn health_and_unknown_routes_answer() {
    let dir = TempDir::new();
    let p = spawn_in_process(dir.db()).await.unwrap();
    p.client().health().await.unwrap();
    let r = reqwest::get(format!("{}/nope", p.base_url()))
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(
        r.headers()["content-type"],
        idem_spec::problem::PROBLEM_CONTENT_TYPE
    );
    p.shutdown().await.unwrap();
}
