//! The caller's deadline on the server (clause `idem.deadline.spent`): a
//! request whose `Request-Deadline-Ms` is spent is not started (504
//! `deadline_exceeded`, nothing written, the key left free), a stored
//! outcome is replayed whatever the deadline, and a value the grammar
//! refuses is ignored. The processor call bounded by the deadline
//! (`idem.deadline.bound`) is in `multistep.rs`.
#![allow(clippy::unwrap_used)]

mod support;

use axum::http::StatusCode;
use support::*;

fn with_deadline(key: &str, body: &str, deadline: &str) -> axum::http::Request<axum::body::Body> {
    let mut req = transfer("demo-alice", Some(key), body);
    req.headers_mut()
        .insert("request-deadline-ms", deadline.parse().unwrap());
    req
}

// clause: idem.deadline.spent
async fn a_spent_deadline_starts_nothing_and_leaves_the_key_free(b: Backend) {
    let db = db!(b, "deadline");
    let app = app(&db, &[]).await;
    let r = &app.router;
    let before = balances(r, "alice").await;
    let count = transfer_count(r, "alice").await;

    let spent = send(r, with_deadline("dl-1", &move_body("alice", 3), "0")).await;
    assert_eq!(spent.status, StatusCode::GATEWAY_TIMEOUT, "{spent:?}");
    assert_eq!(spent.problem_code(), "deadline_exceeded");
    assert_eq!(spent.json()["retryable"], true);
    assert_eq!(
        spent.header("idempotency-key-expires"),
        None,
        "no window: nothing claimed"
    );
    assert_eq!(balances(r, "alice").await, before, "nothing moved");
    assert_eq!(transfer_count(r, "alice").await, count, "nothing created");

    // The key is free: with time left, the same request is the first.
    let first = send(r, with_deadline("dl-1", &move_body("alice", 3), "5000")).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert!(!first.replayed());
    assert_eq!(transfer_count(r, "alice").await, count + 1);

    // Its stored outcome is replayed whatever the deadline says.
    let again = send(r, with_deadline("dl-1", &move_body("alice", 3), "0")).await;
    assert_eq!(again.status, StatusCode::CREATED, "{again:?}");
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(transfer_count(r, "alice").await, count + 1);

    // A value outside the grammar (a unit, a sign, ten digits) is ignored,
    // not taken as spent.
    for (i, bad) in ["0ms", "-1", "1234567890"].iter().enumerate() {
        let key = format!("dl-bad-{i}");
        let r2 = send(r, with_deadline(&key, &move_body("alice", 1), bad)).await;
        assert_eq!(r2.status, StatusCode::CREATED, "{bad}: {r2:?}");
    }
}
both!(a_spent_deadline_starts_nothing_and_leaves_the_key_free);

// clause: idem.deadline.bound
async fn a_handler_reads_what_is_left_of_its_callers_deadline(b: Backend) {
    let db = db!(b, "deadline-seen");
    let app = app(&db, &[]).await;
    let (router, gate) = with_gate(&app);
    gate.release(2);
    let mut req = gated_req("demo-alice", "dl-g", "{}");
    req.headers_mut()
        .insert("request-deadline-ms", "60000".parse().unwrap());
    let r = send(&router, req).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let left: u64 = r.header("x-deadline-left-ms").unwrap().parse().unwrap();
    assert!(left > 0 && left <= 60_000, "{left}");
    // Without the header the handler is told nothing.
    let r = send(&router, gated_req("demo-alice", "dl-g2", "{}")).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.header("x-deadline-left-ms"), None);
}
both!(a_handler_reads_what_is_left_of_its_callers_deadline);
