//! Multi-step requests in process: `POST /v1/payments` against an
//! in-process fake processor, on SQLite and PostgreSQL. Phases, decline,
//! unavailability and resume, lease takeover with fencing (a writer paused
//! past its lease), the completer, the enqueuer, the reaper, and the
//! failpoint header's off switch. The crash gate with real processes is in
//! `crash_gate.rs`.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum_idempotency::store::KeyStore;
use idem_fake_processor::{ControlMode, ControlRequest, InProcessProcessor, spawn_in_process};
use idem_server::app::App;
use idem_server::config::Cli;
use idem_spec::KeyState;
use support::{Backend, Resp, TestDb, advance, both, send};

const BODY: &str = r#"{"amount":1250,"currency":"usd","source":"tok_visa"}"#;

struct Env {
    _db: TestDb,
    processor: InProcessProcessor,
    app: App,
    router: Router,
    processor_db: std::path::PathBuf,
}

impl Drop for Env {
    fn drop(&mut self) {
        for s in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{s}", self.processor_db.display()));
        }
    }
}

async fn env(backend: Backend, test: &str, extra: &[&str]) -> Option<Env> {
    let db = TestDb::new(backend, test).await?;
    let processor_db = std::env::temp_dir().join(format!(
        "idem-proc-{test}-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let processor = spawn_in_process(&processor_db).await.expect("processor");
    let mut args = vec!["--processor-url", processor.base_url(), "--lease-secs", "5"];
    args.extend_from_slice(extra);
    let app = support::app(&db, &args).await;
    let router = app.router.clone();
    Some(Env {
        _db: db,
        processor,
        app,
        router,
        processor_db,
    })
}

fn payment(key: &str, body: &str, failpoint: Option<&str>) -> Request<Body> {
    let mut b = Request::post("/v1/payments")
        .header("authorization", "Bearer demo-alice")
        .header("content-type", "application/json")
        .header("idempotency-key", key);
    if let Some(f) = failpoint {
        b = b.header("idem-failpoint", f);
    }
    b.body(Body::from(body.to_owned())).unwrap()
}

async fn payment_by_key(router: &Router, key: &str) -> Option<serde_json::Value> {
    let r = send(
        router,
        support::get("demo-alice", &format!("/v1/payments?idempotency_key={key}")),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let v = r.json();
    assert!(v["count"].as_u64().unwrap() <= 1);
    v["payments"].as_array().unwrap().first().cloned()
}

async fn post_hook(router: &Router, path: &str) -> serde_json::Value {
    let r = send(router, Request::post(path).body(Body::empty()).unwrap()).await;
    assert_eq!(r.status, StatusCode::OK, "{path}: {:?}", r.body);
    r.json()
}

/// Polls `GET /_test/failpoints` until `label` is paused (bounded).
async fn wait_paused(router: &Router, label: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let r = send(
            router,
            Request::get("/_test/failpoints")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
        let paused = r.json()["paused"].clone();
        if paused.as_array().unwrap().iter().any(|p| p == label) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no request paused at {label}; paused: {paused}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn spawn_payment(
    router: &Router,
    key: &str,
    failpoint: &str,
) -> tokio::task::JoinHandle<Resp> {
    let router = router.clone();
    let req = payment(key, BODY, Some(failpoint));
    tokio::spawn(async move { send(&router, req).await })
}

// clause: idem.multistep.phases, idem.multistep.foreign-key, idem.claim.transactional, idem.failure.final-outcomes
async fn payment_runs_its_phases_once_and_replays(backend: Backend) {
    let Some(e) = env(backend, "ms_phases", &[]).await else {
        return;
    };
    let r = send(&e.router, payment("pay-1", BODY, None)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    assert!(!r.replayed());
    let body = r.json();
    assert_eq!(body["status"], "succeeded");
    assert_eq!(body["amount"], 1250);
    let id = body["id"].as_str().unwrap().to_owned();
    assert_eq!(
        r.header("location"),
        Some(format!("/v1/payments/{id}").as_str())
    );
    let state = e.processor.client().charges().await.unwrap();
    assert_eq!(state.count, 1, "exactly one charge");
    let charge = &state.charges[0];
    assert_eq!(body["charge_id"], charge.id.as_str());
    // The outbound key is derived, not the caller's key passed through.
    assert!(charge.idempotency_key.starts_with("idemkit-processor-"));
    assert_ne!(charge.idempotency_key, "pay-1");
    assert_eq!(state.calls_for(&charge.idempotency_key), 1);

    let again = send(&e.router, payment("pay-1", BODY, None)).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(again.body, r.body);
    assert_eq!(
        e.processor.client().charges().await.unwrap().total_calls(),
        1
    );
    let rec = e
        .app
        .state
        .store
        .lookup(&support::kid("alice", "pay-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.state, KeyState::Complete);
    assert_eq!(rec.recovery_point.as_str(), "finished");

    // A final 4xx from the first phase is stored too, and calls nobody.
    let bad = r#"{"amount":0,"currency":"usd"}"#;
    let r422 = send(&e.router, payment("pay-bad", bad, None)).await;
    assert_eq!(r422.status, StatusCode::UNPROCESSABLE_ENTITY);
    let again422 = send(&e.router, payment("pay-bad", bad, None)).await;
    assert!(again422.replayed());
    assert_eq!(again422.body, r422.body);
    assert!(payment_by_key(&e.router, "pay-bad").await.is_none());
    assert_eq!(
        e.processor.client().charges().await.unwrap().total_calls(),
        1
    );

    // Bob's payment with the same key is his own: a different outbound key.
    let bob = Request::post("/v1/payments")
        .header("authorization", "Bearer demo-bob")
        .header("content-type", "application/json")
        .header("idempotency-key", "pay-1")
        .body(Body::from(BODY))
        .unwrap();
    assert_eq!(send(&e.router, bob).await.status, StatusCode::CREATED);
    let state = e.processor.client().charges().await.unwrap();
    assert_eq!(state.count, 2);
    assert_ne!(
        state.charges[0].idempotency_key,
        state.charges[1].idempotency_key
    );
}
both!(payment_runs_its_phases_once_and_replays);

// clause: idem.failure.final-outcomes
async fn a_decline_is_a_stored_402(backend: Backend) {
    let Some(e) = env(backend, "ms_decline", &[]).await else {
        return;
    };
    e.processor
        .client()
        .set_control(&ControlRequest::new(ControlMode::Decline).for_calls(1))
        .await
        .unwrap();
    let r = send(&e.router, payment("dec-1", BODY, None)).await;
    assert_eq!(r.status, StatusCode::PAYMENT_REQUIRED, "{:?}", r.body);
    assert_eq!(r.problem_code(), "payment_declined");
    let again = send(&e.router, payment("dec-1", BODY, None)).await;
    assert_eq!(again.status, StatusCode::PAYMENT_REQUIRED);
    assert!(again.replayed());
    assert_eq!(again.body, r.body);
    let state = e.processor.client().charges().await.unwrap();
    assert_eq!(state.total_calls(), 1, "the replayed decline called nobody");
    let p = payment_by_key(&e.router, "dec-1").await.unwrap();
    assert_eq!(p["status"], "declined");
    assert_eq!(p["failure_code"], "card_declined");
}
both!(a_decline_is_a_stored_402);

// clause: idem.failure.5xx-not-stored, idem.multistep.resume
async fn processor_unavailable_is_a_503_and_a_retry_resumes(backend: Backend) {
    let Some(e) = env(backend, "ms_unavail", &[]).await else {
        return;
    };
    e.processor
        .client()
        .set_control(&ControlRequest::new(ControlMode::Unavailable).for_calls(1))
        .await
        .unwrap();
    let r = send(&e.router, payment("un-1", BODY, None)).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", r.body);
    assert_eq!(r.problem_code(), "upstream_unavailable");
    assert!(r.header("retry-after").is_some());
    let rec = e
        .app
        .state
        .store
        .lookup(&support::kid("alice", "un-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.state, KeyState::InFlight, "not stored");
    assert_eq!(rec.recovery_point.as_str(), "payment_created");
    assert!(rec.response.is_none());
    let p = payment_by_key(&e.router, "un-1").await.unwrap();
    assert_eq!(p["status"], "pending");
    assert_eq!(p["charge_attempts"], 1);

    // No clock move: the key was unlocked, so the retry resumes at once,
    // without redoing phase 1 (one payment row, same id).
    let r2 = send(&e.router, payment("un-1", BODY, None)).await;
    assert_eq!(r2.status, StatusCode::CREATED, "{:?}", r2.body);
    assert!(!r2.replayed());
    assert_eq!(r2.json()["id"], p["id"]);
    assert_eq!(r2.json()["charge_attempts"], 2);
    let state = e.processor.client().charges().await.unwrap();
    assert_eq!(state.count, 1);
    assert_eq!(state.total_calls(), 2, "the 503 call and the resumed one");
    let all = send(&e.router, support::get("demo-alice", "/v1/payments")).await;
    assert_eq!(all.json()["count"], 1);
}
both!(processor_unavailable_is_a_503_and_a_retry_resumes);

// clause: idem.lease.takeover, idem.lease.fencing
async fn a_writer_paused_past_its_lease_is_fenced(backend: Backend) {
    let Some(e) = env(backend, "ms_fence", &[]).await else {
        return;
    };
    // Writer A calls the processor, then stalls before recording the charge.
    let a = spawn_payment(&e.router, "fence-1", "pause-after=charge-call").await;
    wait_paused(&e.router, "after=charge-call").await;
    let before = e
        .app
        .state
        .store
        .lookup(&support::kid("alice", "fence-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(before.recovery_point.as_str(), "payment_created");
    assert_eq!(before.generation, 1);

    // While A's lease lives, a retry is refused...
    let busy = send(&e.router, payment("fence-1", BODY, None)).await;
    assert_eq!(busy.status, StatusCode::CONFLICT);
    assert_eq!(busy.problem_code(), "idempotency_key_in_use");
    // ...once it has expired, the retry takes the key over and finishes.
    advance(&e.router, 6).await;
    let b = send(&e.router, payment("fence-1", BODY, None)).await;
    assert_eq!(b.status, StatusCode::CREATED, "{:?}", b.body);
    assert!(!b.replayed());
    let after_b = e
        .app
        .state
        .store
        .lookup(&support::kid("alice", "fence-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after_b.generation, 2, "taking over advances the generation");
    assert_eq!(after_b.state, KeyState::Complete);
    let paid = payment_by_key(&e.router, "fence-1").await.unwrap();
    assert_eq!(paid["generation"], 2);
    assert_eq!(paid["status"], "succeeded");

    // Release A: its phase commit carries generation 1 and is refused.
    post_hook(&e.router, "/_test/failpoints/release").await;
    let a = tokio::time::timeout(Duration::from_secs(20), a)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.status, StatusCode::CONFLICT, "{:?}", a.body);
    assert_eq!(a.problem_code(), "idempotency_key_in_use");
    // ...and changed nothing: not the key, not the payment row.
    let after_a = e
        .app
        .state
        .store
        .lookup(&support::kid("alice", "fence-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after_a, after_b);
    assert_eq!(payment_by_key(&e.router, "fence-1").await.unwrap(), paid);
    let state = e.processor.client().charges().await.unwrap();
    assert_eq!(state.count, 1, "one charge despite two workers");
    assert_eq!(state.total_calls(), 2, "A's call and B's deduplicated one");
    let replay = send(&e.router, payment("fence-1", BODY, None)).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, b.body);
}
both!(a_writer_paused_past_its_lease_is_fenced);

// clause: idem.completer.drives, idem.lease.takeover, idem.lease.fencing
async fn the_completer_takes_over_from_a_paused_writer(backend: Backend) {
    let Some(e) = env(backend, "ms_comp_fence", &[]).await else {
        return;
    };
    let a = spawn_payment(&e.router, "cf-1", "pause-before=charge-call").await;
    wait_paused(&e.router, "before=charge-call").await;
    // A live lease is not abandoned.
    assert_eq!(post_hook(&e.router, "/_test/complete").await["found"], 0);
    advance(&e.router, 6).await;
    let report = post_hook(&e.router, "/_test/complete").await;
    assert_eq!(report["finished"], 1, "{report}");
    let done = payment_by_key(&e.router, "cf-1").await.unwrap();
    assert_eq!(done["status"], "succeeded");
    assert_eq!(done["generation"], 2);
    // The paused writer wakes up, calls the processor (deduplicated by
    // the outbound key) and is refused at its commit.
    post_hook(&e.router, "/_test/failpoints/release").await;
    let a = tokio::time::timeout(Duration::from_secs(20), a)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.status, StatusCode::CONFLICT, "{:?}", a.body);
    assert_eq!(payment_by_key(&e.router, "cf-1").await.unwrap(), done);
    let state = e.processor.client().charges().await.unwrap();
    assert_eq!(state.count, 1);
    assert_eq!(state.total_calls(), 2);
}
both!(the_completer_takes_over_from_a_paused_writer);

// clause: idem.completer.drives
async fn the_completer_finishes_an_abandoned_payment(backend: Backend) {
    let Some(e) = env(backend, "ms_completer", &[]).await else {
        return;
    };
    e.processor
        .client()
        .set_control(&ControlRequest::new(ControlMode::Unavailable).for_calls(1))
        .await
        .unwrap();
    let r = send(&e.router, payment("comp-1", BODY, None)).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    // The client walks away. One completer pass finishes the payment.
    let report = post_hook(&e.router, "/_test/complete").await;
    assert_eq!(report["found"], 1);
    assert_eq!(report["finished"], 1, "{report}");
    let p = payment_by_key(&e.router, "comp-1").await.unwrap();
    assert_eq!(p["status"], "succeeded");
    let rec = e
        .app
        .state
        .store
        .lookup(&support::kid("alice", "comp-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.state, KeyState::Complete);
    assert_eq!(rec.generation, 2, "the completer took the key over");
    // A later retry gets the completer's stored answer.
    let again = send(&e.router, payment("comp-1", BODY, None)).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(again.json()["id"], p["id"]);
    assert_eq!(e.processor.client().charges().await.unwrap().count, 1);
    // Nothing left to do.
    assert_eq!(post_hook(&e.router, "/_test/complete").await["found"], 0);
}
both!(the_completer_finishes_an_abandoned_payment);

async fn receipts(router: &Router) -> serde_json::Value {
    let r = send(router, support::get("demo-alice", "/v1/receipts")).await;
    assert_eq!(r.status, StatusCode::OK);
    r.json()
}

// clause: idem.multistep.phases, idem.multistep.staged-jobs
async fn the_enqueuer_never_sees_a_job_before_its_commit(backend: Backend) {
    let Some(e) = env(backend, "ms_enqueue", &[]).await else {
        return;
    };
    // The receipt job is staged and the response stored, not yet committed.
    let a = spawn_payment(&e.router, "enq-1", "pause-before=finished").await;
    wait_paused(&e.router, "before=finished").await;
    assert_eq!(post_hook(&e.router, "/_test/enqueue").await["delivered"], 0);
    assert_eq!(receipts(&e.router).await["count"], 0);
    post_hook(&e.router, "/_test/failpoints/release").await;
    let a = tokio::time::timeout(Duration::from_secs(20), a)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.status, StatusCode::CREATED);
    assert_eq!(post_hook(&e.router, "/_test/enqueue").await["delivered"], 1);
    let list = receipts(&e.router).await;
    assert_eq!(list["count"], 1);
    assert_eq!(list["receipts"][0]["payment_id"], a.json()["id"]);
    // Drained: a second pass delivers nothing more.
    assert_eq!(post_hook(&e.router, "/_test/enqueue").await["delivered"], 0);
    assert_eq!(receipts(&e.router).await["count"], 1);
}
both!(the_enqueuer_never_sees_a_job_before_its_commit);

// clause: idem.reaper.retention, idem.lease.fencing
async fn the_reaper_reports_an_unfinished_payment_and_its_writer_is_fenced(backend: Backend) {
    let Some(e) = env(backend, "ms_reaper", &[]).await else {
        return;
    };
    let a = spawn_payment(&e.router, "reap-1", "pause-after=payment_created").await;
    wait_paused(&e.router, "after=payment_created").await;
    advance(&e.router, idem_spec::policy::DEFAULT_RETENTION_SECS + 1).await;
    let reaped = post_hook(&e.router, "/_test/reap").await;
    assert_eq!(reaped["deleted"], 1);
    assert_eq!(reaped["unfinished"], 1, "the in-flight payment is reported");
    post_hook(&e.router, "/_test/failpoints/release").await;
    let a = tokio::time::timeout(Duration::from_secs(20), a)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.status, StatusCode::CONFLICT, "{:?}", a.body);
    let state = e.processor.client().charges().await.unwrap();
    assert_eq!(state.total_calls(), 0, "a reaped key charges nobody");
}
both!(the_reaper_reports_an_unfinished_payment_and_its_writer_is_fenced);

// clause: idem.failure.5xx-not-stored
#[tokio::test]
async fn an_unreachable_processor_is_a_503_that_keeps_the_payment() {
    let db = TestDb::new(Backend::Sqlite, "ms_unreach").await.unwrap();
    // A port nothing listens on: bind one, then free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let app = support::app(
        &db,
        &["--processor-url", &url, "--processor-timeout-secs", "5"],
    )
    .await;
    let r = send(&app.router, payment("ur-1", BODY, None)).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", r.body);
    assert_eq!(r.problem_code(), "upstream_unavailable");
    assert_eq!(r.header("retry-after"), Some("1"));
    let rec = app
        .state
        .store
        .lookup(&support::kid("alice", "ur-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.state, KeyState::InFlight);
    assert_eq!(rec.recovery_point.as_str(), "payment_created");
    assert!(rec.response.is_none(), "a 503 is never stored");
    let p = payment_by_key(&app.router, "ur-1").await.unwrap();
    assert_eq!(p["status"], "pending");
}

// clause: idem.failure.unclaimed
#[tokio::test]
async fn without_a_processor_payments_answer_a_clear_503() {
    let db = TestDb::new(Backend::Sqlite, "ms_noproc").await.unwrap();
    let app = support::app(&db, &[]).await;
    let r = send(&app.router, payment("np-1", BODY, None)).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.problem_code(), "upstream_unavailable");
    let detail = r.json()["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("--processor-url"), "{detail}");
    assert!(
        app.state
            .store
            .lookup(&support::kid("alice", "np-1"))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn without_test_hooks_the_failpoint_header_is_ignored() {
    let db = TestDb::new(Backend::Sqlite, "ms_nohooks").await.unwrap();
    let path = std::env::temp_dir().join(format!(
        "idem-proc-nohooks-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let processor = spawn_in_process(&path).await.unwrap();
    let cli = Cli::from_args([
        "idem-server",
        "--database-url",
        &db.url,
        "--processor-url",
        processor.base_url(),
    ])
    .unwrap();
    let app = idem_server::app::build(&cli).await.unwrap();
    // With hooks this would stall (or abort the test binary); without them
    // the request runs straight through.
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        send(
            &app.router,
            payment(
                "nh-1",
                BODY,
                Some("pause-after=payment_created, crash-after=charge_created"),
            ),
        ),
    )
    .await
    .expect("the failpoint header must be ignored without --test-hooks");
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let hooks = send(
        &app.router,
        Request::get("/_test/failpoints")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(hooks.status, StatusCode::NOT_FOUND);
    drop(processor);
    for s in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{s}", path.display()));
    }
}

#[tokio::test]
async fn a_malformed_failpoint_header_is_refused_before_the_claim() {
    let Some(e) = env(Backend::Sqlite, "ms_badfp", &[]).await else {
        return;
    };
    let r = send(
        &e.router,
        payment("bad-1", BODY, Some("explode-after=finished")),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        e.app
            .state
            .store
            .lookup(&support::kid("alice", "bad-1"))
            .await
            .unwrap()
            .is_none()
    );
}

// clause: idem.failure.5xx-not-stored, idem.claim.transactional
async fn an_injected_error_rolls_back_and_releases_the_key(backend: Backend) {
    let Some(e) = env(backend, "ms_inject_err", &[]).await else {
        return;
    };
    // Multi-step: the 500 comes after the claim, before phase 1 runs.
    let body = r#"{"amount":700,"currency":"usd","description":"inj-1"}"#;
    let r = send(
        &e.router,
        payment("inj-1", body, Some("error-after=started")),
    )
    .await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{:?}", r.body);
    assert!(
        e.app
            .state
            .store
            .lookup(&support::kid("alice", "inj-1"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(payment_by_key(&e.router, "inj-1").await.is_none());
    assert_eq!(
        e.processor.client().charges().await.unwrap().total_calls(),
        0
    );
    let r2 = send(&e.router, payment("inj-1", body, None)).await;
    assert_eq!(r2.status, StatusCode::CREATED, "{:?}", r2.body);
    assert!(!r2.replayed(), "the 500 was not stored");
    // The description filter is what the conformance kit's probe uses.
    let listed = send(
        &e.router,
        support::get("demo-alice", "/v1/payments?description=inj-1"),
    )
    .await;
    assert_eq!(listed.json()["count"], 1);
    assert_eq!(listed.json()["payments"][0]["id"], r2.json()["id"]);

    // Single-phase: the same failpoint, the same failure policy.
    let before = support::transfer_count(&e.router, "alice").await;
    let req = |fp: Option<&str>| {
        let mut r = support::transfer("demo-alice", Some("inj-2"), &support::move_body("alice", 5));
        if let Some(f) = fp {
            r.headers_mut().insert("idem-failpoint", f.parse().unwrap());
        }
        r
    };
    let r = send(&e.router, req(Some("error-after=started"))).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{:?}", r.body);
    assert_eq!(support::transfer_count(&e.router, "alice").await, before);
    assert!(
        e.app
            .state
            .store
            .lookup(&support::kid("alice", "inj-2"))
            .await
            .unwrap()
            .is_none()
    );
    let r2 = send(&e.router, req(None)).await;
    assert_eq!(r2.status, StatusCode::CREATED, "{:?}", r2.body);
    assert!(!r2.replayed());
    assert_eq!(
        support::transfer_count(&e.router, "alice").await,
        before + 1
    );
}
both!(an_injected_error_rolls_back_and_releases_the_key);

// clause: idem.inflight.conflict
async fn a_transfer_paused_after_its_claim_is_in_flight(backend: Backend) {
    let Some(e) = env(backend, "ms_pause_transfer", &[]).await else {
        return;
    };
    let body = support::move_body("alice", 3);
    let mut held = support::transfer("demo-alice", Some("tp-1"), &body);
    held.headers_mut()
        .insert("idem-failpoint", "pause-after=started".parse().unwrap());
    let router = e.router.clone();
    let original = tokio::spawn(async move { send(&router, held).await });
    wait_paused(&e.router, "after=started").await;
    let dup = send(
        &e.router,
        support::transfer("demo-alice", Some("tp-1"), &body),
    )
    .await;
    assert_eq!(dup.status, StatusCode::CONFLICT, "{:?}", dup.body);
    assert!(dup.header("retry-after").is_some());
    post_hook(&e.router, "/_test/failpoints/release").await;
    let first = tokio::time::timeout(Duration::from_secs(20), original)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{:?}", first.body);
    let again = send(
        &e.router,
        support::transfer("demo-alice", Some("tp-1"), &body),
    )
    .await;
    assert!(again.replayed());
}
both!(a_transfer_paused_after_its_claim_is_in_flight);

// clause: idem.deadline.bound, idem.multistep.resume
async fn a_processor_call_ends_at_the_callers_deadline(backend: Backend) {
    // The server's own processor timeout is long (20 s) and the processor
    // answers after 4 s: only the caller's deadline (300 ms) can end the
    // call before the processor does.
    let Some(e) = env(backend, "ms_deadline", &["--processor-timeout-secs", "20"]).await else {
        return;
    };
    e.processor
        .client()
        .set_control(
            &ControlRequest::new(ControlMode::Slow)
                .slow_ms(4000)
                .for_calls(1),
        )
        .await
        .unwrap();
    let mut req = payment("dl-1", BODY, None);
    req.headers_mut()
        .insert("request-deadline-ms", "300".parse().unwrap());
    let sent = std::time::Instant::now();
    let r = send(&e.router, req).await;
    let took = sent.elapsed();
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{:?}", r.body);
    assert_eq!(r.problem_code(), "upstream_unavailable");
    assert!(
        took < Duration::from_millis(4000),
        "the call was not cut at the caller's deadline: {took:?}"
    );
    let p = payment_by_key(&e.router, "dl-1").await.unwrap();
    assert_eq!(p["status"], "pending", "left at its recovery point");
    // The retry, with time left, resumes: the processor's charge (recorded
    // before its slow answer) is found by its key, never made twice.
    let r2 = send(&e.router, payment("dl-1", BODY, None)).await;
    assert_eq!(r2.status, StatusCode::CREATED, "{:?}", r2.body);
    assert_eq!(r2.json()["id"], p["id"]);
    let state = e.processor.client().charges().await.unwrap();
    assert_eq!(state.count, 1, "one charge");
    assert_eq!(state.total_calls(), 2, "the cut call and the resumed one");
}
both!(a_processor_call_ends_at_the_callers_deadline);
