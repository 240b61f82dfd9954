//! The deliberate flaws (`--features flaws`, `--flaw NAME`): each test shows
//! that the flawed behaviour really happens, so the conformance kit has
//! something real to catch. The conforming behaviour of the same scenarios
//! is tested in contract.rs.
#![cfg(feature = "flaws")]
#![allow(clippy::unwrap_used)]

mod support;

use axum::http::StatusCode;
use support::*;

async fn flawed(db: &TestDb, flaw: &str) -> idem_server::app::App {
    app(db, &["--flaw", flaw]).await
}

/// Two duplicates both inside the endpoint at once, both answered 201
/// without the replay marker: two executions.
async fn two_duplicates_both_execute(flaw: &str, b: Backend) {
    let db = db!(b, flaw);
    let app = flawed(&db, flaw).await;
    let (r, mut gate) = with_gate(&app);
    // Without writes the two executions do not queue on SQLite's write lock,
    // so the test can see both inside the handler before releasing them.
    gate.set_writes(false);
    let (r1, r2) = (r.clone(), r.clone());
    let a = tokio::spawn(async move { send(&r1, gated_req("demo-alice", "dup", "{}")).await });
    gate.wait_entered().await;
    let b2 = tokio::spawn(async move { send(&r2, gated_req("demo-alice", "dup", "{}")).await });
    gate.wait_entered().await;
    assert_eq!(gate.executions(), 2, "{flaw}: the duplicate executed too");
    gate.release(2);
    let (a, b2) = (a.await.unwrap(), b2.await.unwrap());
    assert_eq!(
        (a.status, b2.status),
        (StatusCode::CREATED, StatusCode::CREATED)
    );
    assert!(!a.replayed() && !b2.replayed());
    assert_ne!(a.body, b2.body);
}

// clause: idem.claim.atomic, idem.concurrency.single-effect
async fn check_then_insert_lets_two_concurrent_requests_execute(b: Backend) {
    two_duplicates_both_execute("check-then-insert", b).await;
}
both!(check_then_insert_lets_two_concurrent_requests_execute);

// clause: idem.inflight.conflict
async fn no_in_flight_state_executes_the_duplicate(b: Backend) {
    two_duplicates_both_execute("no-in-flight-state", b).await;
}
both!(no_in_flight_state_executes_the_duplicate);

// clause: idem.fingerprint.mismatch
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_fingerprint_check_replays_a_different_request() {
    let db = TestDb::new(Backend::Sqlite, "flaw-fp").await.unwrap();
    let app = flawed(&db, "no-fingerprint-check").await;
    let r = &app.router;
    let first = send(
        r,
        transfer("demo-alice", Some("k"), &move_body("alice", 10)),
    )
    .await;
    let other = send(
        r,
        transfer("demo-alice", Some("k"), &move_body("alice", 99)),
    )
    .await;
    assert_eq!(other.status, StatusCode::CREATED, "no 409 mismatch");
    assert!(other.replayed());
    assert_eq!(
        other.body, first.body,
        "the amount-10 transfer was replayed for amount 99"
    );
    assert_eq!(balances(r, "alice").await, (99_990, 100_010));
}

// clause: idem.scope.caller
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_keys_replay_one_callers_response_to_another() {
    let db = TestDb::new(Backend::Sqlite, "flaw-global").await.unwrap();
    let app = flawed(&db, "global-keys").await;
    let r = &app.router;
    let body = move_body("alice", 10);
    let alice = send(r, transfer("demo-alice", Some("k"), &body)).await;
    let bob = send(r, transfer("demo-bob", Some("k"), &body)).await;
    assert_eq!(
        bob.status,
        StatusCode::CREATED,
        "bob should have got 404 for alice's accounts"
    );
    assert!(bob.replayed());
    assert_eq!(bob.body, alice.body, "alice's transfer leaked to bob");
}

// clause: idem.failure.5xx-not-stored
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_5xx_replays_a_server_error() {
    let db = TestDb::new(Backend::Sqlite, "flaw-5xx").await.unwrap();
    let app = flawed(&db, "store-5xx").await;
    let (r, gate) = with_gate(&app);
    gate.set_status(500);
    gate.release(1);
    let first = send(&r, gated_req("demo-alice", "k", "{}")).await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
    gate.set_status(201);
    gate.release(1);
    let retry = send(&r, gated_req("demo-alice", "k", "{}")).await;
    assert_eq!(
        retry.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "the 500 was replayed"
    );
    assert!(retry.replayed());
    assert_eq!(gate.executions(), 1, "the retry never executed");
}

// clause: idem.replay.marker, idem.replay.verbatim
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_drops_headers_loses_the_marker_and_location() {
    let db = TestDb::new(Backend::Sqlite, "flaw-headers").await.unwrap();
    let app = flawed(&db, "replay-drops-headers").await;
    let r = &app.router;
    let body = move_body("alice", 10);
    let first = send(r, transfer("demo-alice", Some("k"), &body)).await;
    assert!(first.header("location").is_some() && first.header("etag").is_some());
    let again = send(r, transfer("demo-alice", Some("k"), &body)).await;
    assert_eq!(again.body, first.body);
    assert_eq!(again.header("idempotent-replayed"), None);
    assert_eq!(again.header("location"), None);
    assert_eq!(again.header("etag"), None);
    assert_eq!(transfer_count(r, "alice").await, 1);
}

// clause: idem.window.replay
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_expire_early_re_executes_inside_the_published_window() {
    let db = TestDb::new(Backend::Sqlite, "flaw-expire").await.unwrap();
    let app = flawed(&db, "keys-expire-early").await;
    let r = &app.router;
    let body = move_body("alice", 10);
    send(r, transfer("demo-alice", Some("k"), &body)).await;
    advance(r, 120).await;
    let again = send(r, transfer("demo-alice", Some("k"), &body)).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(
        !again.replayed(),
        "two minutes is well inside 24 h, yet it executed again"
    );
    assert_eq!(transfer_count(r, "alice").await, 2);
}
