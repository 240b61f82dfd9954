//! The lease heartbeat (clause `idem.lease.heartbeat`): a live multi-step
//! request keeps its short lease however long its processor call takes,
//! and a crashed one (the server killed with SIGKILL in the middle of the
//! call) is taken over soon enough that a client with the default retry
//! settings of `idem-client` (three attempts, 30 s deadline) succeeds, with
//! one charge at the processor.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum_idempotency::store::KeyStore;
use axum_idempotency::{Caller, IdempotencyKey, KeyId};
use idem_fake_processor::{ControlMode, ControlRequest, spawn_in_process};
use idem_test_support::{ChildServer, TempDir};
use support::{Backend, TestDb, send};
use tokio::time::Instant;

const BODY: &str = r#"{"amount":4200,"currency":"eur","source":"tok_lease"}"#;

/// Longest any poll of these tests may take before the test fails.
const GUARD: Duration = Duration::from_secs(60);

fn payment(key: &str) -> Request<Body> {
    Request::post("/v1/payments")
        .header("authorization", "Bearer demo-alice")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Body::from(BODY))
        .unwrap()
}

// clause: idem.lease.heartbeat, idem.lease.takeover
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_payment_keeps_its_lease_through_a_processor_call_longer_than_the_lease() {
    const LEASE: Duration = Duration::from_secs(2);
    let dir = TempDir::new("idem-lease-live");
    let processor = spawn_in_process(dir.join("processor.db")).await.unwrap();
    let db = TestDb::new(Backend::Sqlite, "lease-live").await.unwrap();
    let app = support::app(
        &db,
        &[
            "--processor-url",
            processor.base_url(),
            "--lease-secs",
            "2",
            // No completer pass during the test: only the heartbeat keeps
            // the key.
            "--completer-interval-ms",
            "600000",
        ],
    )
    .await;
    // The processor answers the next charge after three leases.
    processor
        .client()
        .set_control(
            &ControlRequest::new(ControlMode::Slow)
                .slow_ms(3 * 2000)
                .for_calls(1),
        )
        .await
        .unwrap();
    let router = app.router.clone();
    let original = tokio::spawn(async move { send(&router, payment("live-1")).await });
    // The charge is recorded before the processor's delay: from here on the
    // request is inside its processor call.
    let deadline = Instant::now() + GUARD;
    while processor.client().charges().await.unwrap().total_calls() < 1 {
        assert!(Instant::now() < deadline, "the processor was never called");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let call_began = Instant::now();
    let id = KeyId::new(
        Caller::new("alice"),
        IdempotencyKey::parse("live-1").unwrap(),
    );
    // Duplicates all through the call, past the first lease's end and the
    // second's: each must be refused (409), none may take the key over.
    let (mut refused, mut renewed_seen) = (0, false);
    while !original.is_finished() {
        assert!(Instant::now() < deadline, "the original never finished");
        let dup = send(&app.router, payment("live-1")).await;
        if original.is_finished() && dup.status == StatusCode::CREATED {
            break; // the replay after the original finished
        }
        assert_eq!(dup.status, StatusCode::CONFLICT, "{:?}", dup.body);
        refused += 1;
        if call_began.elapsed() > LEASE + Duration::from_millis(500) {
            // A lease taken at the call's start would be over by now: the
            // stored one must have been renewed since.
            let record = app.state.store.lookup(&id).await.unwrap().unwrap();
            let now = app.state.clock.now_ms();
            if record.lease_expires_at.is_some_and(|end| end > now) {
                renewed_seen = true;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let original = original.await.unwrap();
    assert_eq!(original.status, StatusCode::CREATED, "{:?}", original.body);
    assert!(refused > 0);
    assert!(
        renewed_seen,
        "the lease was renewed during the call ({:?} long)",
        call_began.elapsed()
    );
    let charges = processor.client().charges().await.unwrap();
    assert_eq!(charges.count, 1, "one charge");
    assert_eq!(
        charges.total_calls(),
        1,
        "no duplicate took the live key over and called the processor again"
    );
}

// clause: idem.lease.heartbeat, idem.lease.takeover, idem.multistep.resume
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_payment_is_taken_over_inside_a_default_clients_deadline() {
    let dir = TempDir::new("idem-lease-kill");
    let processor = spawn_in_process(dir.join("processor.db")).await.unwrap();
    let db_url = format!("sqlite://{}", dir.join("idem.db").display());
    // The defaults: lease, completer interval, everything.
    let mut server = ChildServer::command(env!("CARGO_BIN_EXE_idem-server"))
        .args(["--listen", "127.0.0.1:0", "--database-url", &db_url])
        .args(["--processor-url", processor.base_url()])
        .env("RUST_LOG", "error")
        .start()
        .await
        .expect("start idem-server");
    processor
        .client()
        .set_control(
            &ControlRequest::new(ControlMode::Slow)
                .slow_ms(20_000)
                .for_calls(1),
        )
        .await
        .unwrap();
    let plain = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let url = format!("{}/v1/payments", server.base_url());
    let first = {
        let (plain, url) = (plain.clone(), url.clone());
        tokio::spawn(async move {
            plain
                .post(url)
                .header("authorization", "Bearer demo-alice")
                .header("content-type", "application/json")
                .header("idempotency-key", "kill-1")
                .body(BODY)
                .send()
                .await
        })
    };
    let deadline = Instant::now() + GUARD;
    while processor.client().charges().await.unwrap().total_calls() < 1 {
        assert!(Instant::now() < deadline, "the processor was never called");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Mid-call, with a heartbeat or more behind it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.kill().await.unwrap();
    let killed_at = Instant::now();
    assert!(
        first.await.unwrap().is_err(),
        "the killed server answered nothing"
    );
    server.restart().await.expect("restart idem-server");
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(idem_client::RetryMiddleware::default())
        .build();
    let retried = client
        .post(&url)
        .header("authorization", "Bearer demo-alice")
        .header("content-type", "application/json")
        .header("idempotency-key", "kill-1")
        .body(BODY)
        .send()
        .await
        .expect("the default client gets an answer");
    let took_over = killed_at.elapsed();
    let report = retried
        .extensions()
        .get::<idem_client::RetryReport>()
        .cloned();
    assert_eq!(
        retried.status().as_u16(),
        201,
        "a default client succeeds after the kill: {report:?}"
    );
    eprintln!(
        "takeover after kill -9 mid-payment: {took_over:?} from the kill to the client's 201 \
         (default lease {} s; client report {report:?})",
        idem_spec::policy::DEFAULT_LEASE_SECS
    );
    let charges = processor.client().charges().await.unwrap();
    assert_eq!(charges.count, 1, "one charge for the key");
    let v: serde_json::Value = plain
        .get(format!(
            "{}/v1/payments?idempotency_key=kill-1",
            server.base_url()
        ))
        .header("authorization", "Bearer demo-alice")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["payments"].as_array().unwrap().len(), 1, "one payment");
    assert_eq!(v["payments"][0]["status"], "succeeded", "{v}");
}
