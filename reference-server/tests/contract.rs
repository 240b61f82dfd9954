//! The reference profile, behaviour by behaviour, on both stores. Each
//! shared test body runs as `NAME::sqlite` and `NAME::postgres`.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use support::*;

// clause: idem.errors.problem-json, idem.failure.unclaimed
async fn unauthenticated_is_401_and_consumes_nothing(b: Backend) {
    let db = db!(b, "unauth");
    let app = app(&db, &[]).await;
    let r = &app.router;
    let body = move_body("alice", 100);
    let mut req = transfer("wrong-token", Some("k-auth"), &body);
    let resp = send(r, req).await;
    assert_eq!(resp.status, StatusCode::UNAUTHORIZED);
    assert_eq!(resp.problem_code(), "unauthenticated");
    req = Request::post("/v1/transfers")
        .header("idempotency-key", "k-auth")
        .header("content-type", "application/json")
        .body(Body::from(body.clone()))
        .unwrap();
    assert_eq!(send(r, req).await.status, StatusCode::UNAUTHORIZED);
    // The same key, now authenticated, executes normally.
    let ok = send(r, transfer("demo-alice", Some("k-auth"), &body)).await;
    assert_eq!(ok.status, StatusCode::CREATED);
    assert!(!ok.replayed());
    assert_eq!(balances(r, "alice").await, (99_900, 100_100));
}
both!(unauthenticated_is_401_and_consumes_nothing);

// clause: idem.key.required, idem.errors.distinct
async fn missing_key_is_400_missing(b: Backend) {
    let db = db!(b, "missing");
    let app = app(&db, &[]).await;
    let resp = send(
        &app.router,
        transfer("demo-alice", None, &move_body("alice", 5)),
    )
    .await;
    assert_eq!(resp.status, StatusCode::BAD_REQUEST);
    assert_eq!(resp.problem_code(), "idempotency_key_missing");
    assert_eq!(transfer_count(&app.router, "alice").await, 0);
}
both!(missing_key_is_400_missing);

// clause: idem.key.invalid, idem.failure.unclaimed, idem.errors.distinct
async fn invalid_keys_are_400_invalid_and_change_nothing(b: Backend) {
    let db = db!(b, "invalid");
    let app = app(&db, &[]).await;
    let r = &app.router;
    let body = move_body("alice", 7);
    let bad: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"has space".to_vec(),
        b"tab\there".to_vec(),
        // Other control characters (0x00-0x1F but tab, and 0x7F) cannot even
        // be carried in an HTTP header value: the HTTP parser refuses them
        // before any application code runs.
        b"tab-at-end\t\tx".to_vec(),
        "\u{1F600}".as_bytes().to_vec(),
        "caf\u{e9}".as_bytes().to_vec(),
        vec![b'k'; 256],
        vec![b'k'; 10 * 1024],
        b"\"unterminated".to_vec(),
        b"\"bad\\nescape\"".to_vec(),
        b"\"x\"trailing".to_vec(),
        b"\"\"".to_vec(),
    ];
    for value in bad {
        let req = Request::post("/v1/transfers")
            .header("authorization", "Bearer demo-alice")
            .header("content-type", "application/json")
            .header(
                "idempotency-key",
                axum::http::HeaderValue::from_bytes(&value).unwrap(),
            )
            .body(Body::from(body.clone()))
            .unwrap();
        let resp = send(r, req).await;
        assert_eq!(resp.status, StatusCode::BAD_REQUEST, "key {value:?}");
        assert_eq!(
            resp.problem_code(),
            "idempotency_key_invalid",
            "key {value:?}"
        );
    }
    // Duplicated header, even with identical values.
    let req = Request::post("/v1/transfers")
        .header("authorization", "Bearer demo-alice")
        .header("content-type", "application/json")
        .header("idempotency-key", "same")
        .header("idempotency-key", "same")
        .body(Body::from(body.clone()))
        .unwrap();
    let resp = send(r, req).await;
    assert_eq!(resp.problem_code(), "idempotency_key_invalid");
    assert_eq!(balances(r, "alice").await, (100_000, 100_000));
    assert_eq!(transfer_count(r, "alice").await, 0);
    // Boundaries are accepted: 1 and 255 characters.
    for (i, k) in ["x".to_owned(), "y".repeat(255)].iter().enumerate() {
        let resp = send(
            r,
            transfer("demo-alice", Some(k), &move_body("alice", 1 + i as i64)),
        )
        .await;
        assert_eq!(resp.status, StatusCode::CREATED);
    }
}
both!(invalid_keys_are_400_invalid_and_change_nothing);

// clause: idem.replay.verbatim, idem.replay.marker, idem.replay.no-reexecution, idem.state.three-states
async fn complete_key_replays_byte_for_byte(b: Backend) {
    let db = db!(b, "replay");
    let app = app(&db, &[]).await;
    let r = &app.router;
    let body = move_body("alice", 250);
    let first = send(r, transfer("demo-alice", Some("order-1"), &body)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    for _ in 0..3 {
        let again = send(r, transfer("demo-alice", Some("order-1"), &body)).await;
        assert_eq!(again.status, first.status);
        assert_eq!(again.body, first.body, "body byte for byte");
        for h in ["content-type", "location", "etag"] {
            assert!(first.header(h).is_some(), "{h} on the original");
            assert_eq!(again.header(h), first.header(h), "{h}");
        }
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
    }
    assert_eq!(balances(r, "alice").await, (99_750, 100_250));
    assert_eq!(transfer_count(r, "alice").await, 1);
    // The effect probe black-box testers use: count transfers by memo.
    let marked =
        r#"{"from":"acc_alice_main","to":"acc_alice_savings","amount":1,"memo":"run-7f3"}"#;
    for _ in 0..2 {
        send(r, transfer("demo-alice", Some("marked"), marked)).await;
    }
    let probe = send(r, get("demo-alice", "/v1/transfers?memo=run-7f3")).await;
    assert_eq!(probe.json()["count"], 1);
    let bad = send(r, get("demo-alice", "/v1/transfers?colour=red")).await;
    assert_eq!(bad.problem_code(), "validation_failed");
}
both!(complete_key_replays_byte_for_byte);

// clause: idem.key.syntax, idem.fingerprint.canonical-json
async fn quoted_key_and_reordered_json_are_the_same_request(b: Backend) {
    let db = db!(b, "syntax");
    let app = app(&db, &[]).await;
    let r = &app.router;
    let first = send(
        r,
        transfer("demo-alice", Some("abc-1"), &move_body("alice", 10)),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let reordered = r#"{ "amount": 10,
        "to": "acc_alice_savings", "from": "acc_alice_main" }"#;
    let again = send(r, transfer("demo-alice", Some("\"abc-1\""), reordered)).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(transfer_count(r, "alice").await, 1);
}
both!(quoted_key_and_reordered_json_are_the_same_request);

// clause: idem.fingerprint.mismatch, idem.fingerprint.inputs, idem.errors.distinct
async fn same_key_other_request_is_409_mismatch(b: Backend) {
    let db = db!(b, "mismatch");
    let app = app(&db, &[]).await;
    let r = &app.router;
    let first = send(
        r,
        transfer("demo-alice", Some("m-1"), &move_body("alice", 10)),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED);
    let other_body = send(
        r,
        transfer("demo-alice", Some("m-1"), &move_body("alice", 11)),
    )
    .await;
    assert_eq!(other_body.status, StatusCode::CONFLICT);
    assert_eq!(other_body.problem_code(), "idempotency_key_mismatch");
    // Same body, other query string: a different request too.
    let req = Request::post("/v1/transfers?dry_run=true")
        .header("authorization", "Bearer demo-alice")
        .header("content-type", "application/json")
        .header("idempotency-key", "m-1")
        .body(Body::from(move_body("alice", 10)))
        .unwrap();
    let other_query = send(r, req).await;
    assert_eq!(other_query.problem_code(), "idempotency_key_mismatch");
    assert_eq!(balances(r, "alice").await, (99_990, 100_010));
    assert_eq!(transfer_count(r, "alice").await, 1);
}
both!(same_key_other_request_is_409_mismatch);

// clause: idem.scope.caller
async fn keys_are_scoped_to_the_caller(b: Backend) {
    let db = db!(b, "scope");
    let app = app(&db, &[]).await;
    let r = &app.router;
    let a = send(
        r,
        transfer("demo-alice", Some("shared-key"), &move_body("alice", 30)),
    )
    .await;
    // Bob's request with the same key is neither a replay nor a mismatch.
    let bob = send(
        r,
        transfer("demo-bob", Some("shared-key"), &move_body("bob", 40)),
    )
    .await;
    assert_eq!(
        (a.status, bob.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!bob.replayed());
    assert_ne!(a.body, bob.body);
    assert_eq!(balances(r, "bob").await, (99_960, 100_040));
    // Bob cannot reach Alice's accounts either.
    let steal = send(
        r,
        transfer(
            "demo-bob",
            Some("steal"),
            r#"{"from":"acc_alice_main","to":"acc_bob_main","amount":1}"#,
        ),
    )
    .await;
    assert_eq!(steal.status, StatusCode::NOT_FOUND);
    assert_eq!(balances(r, "alice").await, (99_970, 100_030));
}
both!(keys_are_scoped_to_the_caller);

// clause: idem.failure.final-outcomes
async fn a_4xx_outcome_is_stored_and_replayed(b: Backend) {
    let db = db!(b, "final4xx");
    let app = app(&db, &[]).await;
    let r = &app.router;
    let too_much = move_body("alice", 100_001);
    let first = send(r, transfer("demo-alice", Some("big"), &too_much)).await;
    assert_eq!(first.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(first.problem_code(), "validation_failed");
    assert!(!first.replayed());
    // Money arrives; the same request with the same key still gets the
    // stored 422, because a claimed 4xx is final.
    assert_eq!(
        send(
            r,
            transfer(
                "demo-alice",
                Some("top-up"),
                r#"{"from":"acc_alice_savings","to":"acc_alice_main","amount":50000}"#
            )
        )
        .await
        .status,
        StatusCode::CREATED
    );
    let again = send(r, transfer("demo-alice", Some("big"), &too_much)).await;
    assert_eq!(again.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(transfer_count(r, "alice").await, 1);
}
both!(a_4xx_outcome_is_stored_and_replayed);

// clause: idem.failure.5xx-not-stored, idem.claim.transactional
async fn a_5xx_is_not_stored_its_writes_roll_back_and_the_key_is_released(b: Backend) {
    let db = db!(b, "5xx");
    let app = app(&db, &[]).await;
    let (r, mut gate) = with_gate(&app);
    gate.set_status(500);
    gate.release(1);
    let first = send(&r, gated_req("demo-alice", "g-500", "{}")).await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(gate.wait_entered().await, 1);
    // The handler's +1 on the main account was rolled back with the claim.
    assert_eq!(balances(&r, "alice").await, (100_000, 100_000));
    use axum_idempotency::store::KeyStore;
    assert!(
        app.state
            .store
            .lookup(&support::kid("alice", "g-500"))
            .await
            .unwrap()
            .is_none()
    );
    // A retry with the same key executes again, and its 201 is stored.
    gate.set_status(201);
    gate.release(1);
    let retry = send(&r, gated_req("demo-alice", "g-500", "{}")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed());
    assert_eq!(gate.executions(), 2);
    assert_eq!(balances(&r, "alice").await, (100_001, 100_000));
    let replay = send(&r, gated_req("demo-alice", "g-500", "{}")).await;
    assert!(replay.replayed());
    assert_eq!(
        replay.header("x-execution"),
        Some("2"),
        "declared header replayed"
    );
    assert_eq!(gate.executions(), 2);
}
both!(a_5xx_is_not_stored_its_writes_roll_back_and_the_key_is_released);

// clause: idem.inflight.conflict, idem.inflight.retry-after, idem.state.three-states
async fn a_duplicate_in_flight_gets_409_in_use_with_retry_after(b: Backend) {
    let db = db!(b, "inflight");
    let app = app(&db, &["--retry-after-secs", "3"]).await;
    let (r, mut gate) = with_gate(&app);
    let r1 = r.clone();
    let original =
        tokio::spawn(async move { send(&r1, gated_req("demo-alice", "busy", "{}")).await });
    gate.wait_entered().await;
    let dup = send(&r, gated_req("demo-alice", "busy", "{}")).await;
    assert_eq!(dup.status, StatusCode::CONFLICT);
    assert_eq!(dup.problem_code(), "idempotency_key_in_use");
    assert_eq!(dup.header("retry-after"), Some("3"));
    // A different body while in flight is still refused, never executed.
    let other = send(&r, gated_req("demo-alice", "busy", r#"{"x":1}"#)).await;
    assert_eq!(other.status, StatusCode::CONFLICT);
    gate.release(1);
    let first = original.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(gate.executions(), 1);
    let after = send(&r, gated_req("demo-alice", "busy", "{}")).await;
    assert!(after.replayed());
    assert_eq!(after.body, first.body);
}
both!(a_duplicate_in_flight_gets_409_in_use_with_retry_after);

// clause: idem.inflight.prefer-wait
async fn prefer_wait_holds_the_duplicate_then_replays(b: Backend) {
    let db = db!(b, "wait");
    let app = app(&db, &[]).await;
    let (r, mut gate) = with_gate(&app);
    let r1 = r.clone();
    let original = tokio::spawn(async move { send(&r1, gated_req("demo-alice", "w", "{}")).await });
    gate.wait_entered().await;
    let r2 = r.clone();
    let waiter = tokio::spawn(async move {
        let mut req = gated_req("demo-alice", "w", "{}");
        req.headers_mut()
            .insert("prefer", "wait=10".parse().unwrap());
        send(&r2, req).await
    });
    // Readiness: wait (bounded) until the engine reports the duplicate held.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while app.state.engine.waiting() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the duplicate never waited"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(!waiter.is_finished(), "held while the original runs");
    gate.release(1);
    let first = original.await.unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("waiter woken")
        .unwrap();
    assert_eq!(waited.status, StatusCode::CREATED);
    assert!(waited.replayed());
    assert_eq!(waited.body, first.body);
    assert_eq!(waited.header("preference-applied"), Some("wait=10"));
    assert_eq!(gate.executions(), 1);
}
both!(prefer_wait_holds_the_duplicate_then_replays);

// clause: idem.inflight.prefer-wait, idem.inflight.conflict
async fn prefer_wait_is_bounded_by_the_server_maximum(b: Backend) {
    let db = db!(b, "waitbound");
    let app = app(&db, &["--max-wait-secs", "1"]).await;
    let (r, mut gate) = with_gate(&app);
    let r1 = r.clone();
    let original =
        tokio::spawn(async move { send(&r1, gated_req("demo-alice", "wb", "{}")).await });
    gate.wait_entered().await;
    let started = std::time::Instant::now();
    let mut req = gated_req("demo-alice", "wb", "{}");
    req.headers_mut()
        .insert("prefer", "wait=600".parse().unwrap());
    let dup = send(&r, req).await;
    let held = started.elapsed();
    assert_eq!(dup.problem_code(), "idempotency_key_in_use");
    assert!(held >= Duration::from_millis(900), "held {held:?}");
    assert!(
        held < Duration::from_secs(5),
        "held {held:?}: the server bound is 1 s"
    );
    gate.release(1);
    assert_eq!(original.await.unwrap().status, StatusCode::CREATED);
}
both!(prefer_wait_is_bounded_by_the_server_maximum);

// clause: idem.window.replay, idem.window.expiry
async fn a_key_reused_after_its_window_is_a_new_request(b: Backend) {
    let db = db!(b, "window");
    let app = app(&db, &[]).await;
    let r = &app.router;
    let body = move_body("alice", 100);
    let first = send(r, transfer("demo-alice", Some("daily"), &body)).await;
    advance(r, 24 * 3600 - 60).await;
    let inside = send(r, transfer("demo-alice", Some("daily"), &body)).await;
    assert!(inside.replayed(), "still inside the 24 h window");
    assert_eq!(inside.body, first.body);
    advance(r, 120).await;
    let after = send(r, transfer("demo-alice", Some("daily"), &body)).await;
    assert_eq!(after.status, StatusCode::CREATED);
    assert!(!after.replayed(), "past the window: executes again");
    assert_ne!(after.body, first.body);
    assert_eq!(transfer_count(r, "alice").await, 2);
    // Its new outcome is what is replayed now.
    let again = send(r, transfer("demo-alice", Some("daily"), &body)).await;
    assert_eq!(again.body, after.body);
    // After the window a different body is a new request too, not a mismatch.
    advance(r, 25 * 3600).await;
    let other = send(
        r,
        transfer("demo-alice", Some("daily"), &move_body("alice", 1)),
    )
    .await;
    assert_eq!(other.status, StatusCode::CREATED);
    assert!(!other.replayed());
}
both!(a_key_reused_after_its_window_is_a_new_request);

// clause: idem.window.retention, idem.reaper.retention
async fn the_reaper_deletes_records_past_retention_only(b: Backend) {
    let db = db!(b, "reaper");
    let app = app(&db, &[]).await;
    let r = &app.router;
    use axum_idempotency::store::KeyStore;
    send(
        r,
        transfer("demo-alice", Some("old"), &move_body("alice", 1)),
    )
    .await;
    advance(r, 48 * 3600).await;
    send(
        r,
        transfer("demo-alice", Some("young"), &move_body("alice", 1)),
    )
    .await;
    let store = &app.state.store;
    let clock = app.state.clock.as_ref();
    let report = axum_idempotency::reaper::reap_once(store, clock)
        .await
        .unwrap();
    assert_eq!(report.deleted, 0, "48 h < 72 h retention");
    assert!(
        store
            .lookup(&support::kid("alice", "old"))
            .await
            .unwrap()
            .is_some()
    );
    advance(r, 24 * 3600 + 1).await;
    let report = axum_idempotency::reaper::reap_once(store, clock)
        .await
        .unwrap();
    assert_eq!(report.deleted, 1);
    assert!(
        store
            .lookup(&support::kid("alice", "old"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .lookup(&support::kid("alice", "young"))
            .await
            .unwrap()
            .is_some()
    );
}
both!(the_reaper_deletes_records_past_retention_only);

// clause: idem.claim.transactional, idem.failure.5xx-not-stored
async fn a_request_that_dies_mid_execution_leaves_nothing(b: Backend) {
    let db = db!(b, "crash");
    let app = app(&db, &[]).await;
    let (r, mut gate) = with_gate(&app);
    let r1 = r.clone();
    // The handler writes (+1) and then hangs; we kill the request there, as
    // a process crash or a dropped connection would.
    let doomed =
        tokio::spawn(async move { send(&r1, gated_req("demo-alice", "crash", "{}")).await });
    gate.wait_entered().await;
    doomed.abort();
    assert!(doomed.await.unwrap_err().is_cancelled());
    // Neither the write nor the claim survived; the key executes afresh.
    // The dropped transaction's rollback reaches the database asynchronously
    // (when its connection goes back to the pool); until then PostgreSQL
    // still reports the key in flight, so the retry asks to wait for it.
    gate.release(1);
    let mut req = gated_req("demo-alice", "crash", "{}");
    req.headers_mut()
        .insert("prefer", "wait=10".parse().unwrap());
    let retry = tokio::time::timeout(Duration::from_secs(20), send(&r, req))
        .await
        .expect("retry finishes");
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed());
    assert_eq!(gate.executions(), 2);
    assert_eq!(balances(&r, "alice").await, (100_001, 100_000));
}
both!(a_request_that_dies_mid_execution_leaves_nothing);

// clause: idem.concurrency.single-effect, idem.claim.atomic
async fn sixty_four_identical_requests_execute_once(b: Backend) {
    let db = db!(b, "gate64");
    let app = app(&db, &[]).await;
    let r = app.router.clone();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(64));
    let body = move_body("alice", 123);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (r, barrier, body) = (r.clone(), barrier.clone(), body.clone());
        tasks.spawn(async move {
            barrier.wait().await;
            send(&r, transfer("demo-alice", Some("gate"), &body)).await
        });
    }
    let mut answers = Vec::new();
    while let Some(a) = tasks.join_next().await {
        answers.push(a.unwrap());
    }
    let firsts: Vec<_> = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED && !a.replayed())
        .collect();
    assert_eq!(firsts.len(), 1, "exactly one execution");
    for a in &answers {
        if a.status == StatusCode::CONFLICT {
            assert_eq!(a.problem_code(), "idempotency_key_in_use");
        } else {
            assert_eq!(a.status, StatusCode::CREATED);
            assert_eq!(a.body, firsts[0].body);
        }
    }
    assert_eq!(balances(&r, "alice").await, (99_877, 100_123));
    assert_eq!(transfer_count(&r, "alice").await, 1);
}
both!(sixty_four_identical_requests_execute_once);

// clause: idem.errors.profiles
async fn profiles_switch_statuses_and_codes(b: Backend) {
    let db = db!(b, "profiles");
    for (profile, mismatch, in_use, invalid) in [
        (
            "reference",
            (409, "idempotency_key_mismatch"),
            (409, "idempotency_key_in_use"),
            (400, "idempotency_key_invalid"),
        ),
        (
            "ietf-draft",
            (422, "idempotency_key_mismatch"),
            (409, "idempotency_key_in_use"),
            (400, "idempotency_key_invalid"),
        ),
        (
            "stripe",
            (400, "idempotency_error"),
            (409, "idempotency_key_in_use"),
            (400, "idempotency_key_invalid"),
        ),
        (
            "resend",
            (409, "invalid_idempotent_request"),
            (409, "concurrent_idempotent_requests"),
            (400, "invalid_idempotency_key"),
        ),
    ] {
        let app = app(&db, &["--profile", profile]).await;
        let (r, mut gate) = with_gate(&app);
        let key = format!("p-{profile}");
        gate.release(1);
        send(&r, gated_req("demo-alice", &key, "{}")).await;
        gate.wait_entered().await;
        let m = send(&r, gated_req("demo-alice", &key, r#"{"other":true}"#)).await;
        assert_eq!(
            (m.status.as_u16(), m.problem_code().as_str()),
            mismatch,
            "{profile}"
        );
        let busy_key = format!("busy-{profile}");
        let r1 = r.clone();
        let k1 = busy_key.clone();
        let original =
            tokio::spawn(async move { send(&r1, gated_req("demo-alice", &k1, "{}")).await });
        gate.wait_entered().await;
        let u = send(&r, gated_req("demo-alice", &busy_key, "{}")).await;
        assert_eq!(
            (u.status.as_u16(), u.problem_code().as_str()),
            in_use,
            "{profile}"
        );
        gate.release(1);
        original.await.unwrap();
        let mut req = gated_req("demo-alice", "x", "{}");
        req.headers_mut()
            .insert("idempotency-key", "bad key".parse().unwrap());
        let i = send(&r, req).await;
        assert_eq!(
            (i.status.as_u16(), i.problem_code().as_str()),
            invalid,
            "{profile}"
        );
        app.state.store.close().await;
    }
}
both!(profiles_switch_statuses_and_codes);

// clause: idem.window.published, idem.key.header
async fn openapi_publishes_the_idempotency_surface(b: Backend) {
    let db = db!(b, "openapi");
    let app = app(
        &db,
        &["--replay-window-secs", "3600", "--retention-secs", "7200"],
    )
    .await;
    let resp = send(
        &app.router,
        Request::get("/openapi.json").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(resp.status, StatusCode::OK);
    let doc = resp.json();
    let post = &doc["paths"]["/v1/transfers"]["post"];
    let params = post["parameters"].as_array().unwrap();
    assert!(
        params.iter().any(|p| p["name"] == "Idempotency-Key"
            && p["in"] == "header"
            && p["required"] == true)
    );
    assert!(post["responses"]["201"]["headers"]["Idempotent-Replayed"].is_object());
    assert!(post["responses"]["409"].is_object());
    assert!(post["responses"]["400"].is_object());
    assert_eq!(doc["x-idempotency"]["policy"]["replay_window_secs"], 3600);
    assert_eq!(doc["x-idempotency"]["policy"]["retention_secs"], 7200);
    assert!(doc["components"]["schemas"]["Problem"].is_object());
    assert!(doc["components"]["schemas"]["NewTransfer"].is_object());
    // GET endpoints take no key.
    let get_params = doc["paths"]["/v1/transfers"]["get"]["parameters"]
        .as_array()
        .unwrap();
    assert!(get_params.iter().all(|p| p["name"] != "Idempotency-Key"));
    assert!(get_params.iter().any(|p| p["name"] == "memo"));
    // The multi-step payment takes a key too, and says it is multi-step.
    let pay = &doc["paths"]["/v1/payments"]["post"];
    assert!(
        pay["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "Idempotency-Key")
    );
    assert!(pay["responses"]["402"].is_object());
    assert_eq!(
        doc["x-idempotency"]["multi_step_operations"],
        serde_json::json!(["POST /v1/payments"])
    );
}
both!(openapi_publishes_the_idempotency_surface);

// clause: idem.failure.5xx-not-stored, idem.claim.transactional
async fn an_endpoint_that_outlives_its_lease_is_cut_off_and_releases_the_key(b: Backend) {
    let db = db!(b, "lease");
    let app = app(&db, &["--lease-secs", "1"]).await;
    let (r, mut gate) = with_gate(&app);
    // Never released: the endpoint hangs past its 1 s lease.
    let stuck = send(&r, gated_req("demo-alice", "slow", "{}")).await;
    assert_eq!(gate.wait_entered().await, 1);
    assert_eq!(stuck.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(stuck.problem_code(), "internal_error");
    assert_eq!(
        balances(&r, "alice").await,
        (100_000, 100_000),
        "its write rolled back"
    );
    gate.release(1);
    let retry = send(&r, gated_req("demo-alice", "slow", "{}")).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(!retry.replayed());
    assert_eq!(balances(&r, "alice").await, (100_001, 100_000));
}
both!(an_endpoint_that_outlives_its_lease_is_cut_off_and_releases_the_key);

// No clause: the example bank's own invariant. Opposite transfers between
// the same two accounts, all at once, lock the rows in one order (no deadlock
// on PostgreSQL, which would surface as 5xx), and money is conserved.
async fn opposite_transfers_at_once_all_succeed_and_conserve_money(b: Backend) {
    let db = db!(b, "opposite");
    let app = app(&db, &[]).await;
    let r = &app.router;
    let (main0, savings0) = balances(r, "alice").await;
    let back = r#"{"from":"acc_alice_savings","to":"acc_alice_main","amount":5}"#;
    let there = move_body("alice", 7);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..24 {
        let router = r.clone();
        let body = if i % 2 == 0 {
            there.clone()
        } else {
            back.to_owned()
        };
        tasks.spawn(async move {
            send(
                &router,
                transfer("demo-alice", Some(&format!("opp-{i}")), &body),
            )
            .await
            .status
        });
    }
    while let Some(status) = tasks.join_next().await {
        assert_eq!(status.unwrap(), StatusCode::CREATED);
    }
    assert_eq!(
        balances(r, "alice").await,
        (main0 - 12 * 7 + 12 * 5, savings0 + 12 * 7 - 12 * 5)
    );
    assert_eq!(transfer_count(r, "alice").await, 24);
}
both!(opposite_transfers_at_once_all_succeed_and_conserve_money);
