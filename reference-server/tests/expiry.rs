//! `Idempotency-Key-Expires` on the answers a key governs (clause
//! `idem.window.expiry-header`): the first execution, its replays and a
//! mismatch carry the same end of the replay window, 24 hours after the
//! first request; a key reused after it starts a new window; a released 5xx,
//! a refusal before the key is read, and an in-flight refusal whose claim
//! has not committed carry none.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, SystemTime};

use axum::http::StatusCode;
use support::*;

const WINDOW: Duration = Duration::from_secs(86_400);

fn expires(r: &Resp) -> Option<SystemTime> {
    r.header("idempotency-key-expires")
        .map(|v| httpdate::parse_http_date(v).unwrap_or_else(|e| panic!("{v:?}: {e}")))
}

/// Asserts `at` is `WINDOW` after a moment in `[from, to]` (the header has
/// whole seconds, truncated).
fn window_from(at: SystemTime, from: SystemTime, to: SystemTime) {
    let low = from + WINDOW - Duration::from_secs(1);
    let high = to + WINDOW;
    assert!(
        low <= at && at <= high,
        "{at:?} is not the window's end for a request sent in [{from:?}, {to:?}]"
    );
}

// clause: idem.window.expiry-header
async fn the_window_end_travels_with_every_answer_the_key_governs(b: Backend) {
    let db = db!(b, "expiry");
    let app = app(&db, &[]).await;
    let r = &app.router;
    let before = SystemTime::now();
    let first = send(
        r,
        transfer("demo-alice", Some("exp-1"), &move_body("alice", 3)),
    )
    .await;
    let after = SystemTime::now();
    assert_eq!(first.status, StatusCode::CREATED);
    let end = expires(&first).expect("the first execution says when its key expires");
    window_from(end, before, after);

    let replay = send(
        r,
        transfer("demo-alice", Some("exp-1"), &move_body("alice", 3)),
    )
    .await;
    assert!(replay.replayed());
    assert_eq!(expires(&replay), Some(end), "a replay carries the same end");

    let mismatch = send(
        r,
        transfer("demo-alice", Some("exp-1"), &move_body("alice", 4)),
    )
    .await;
    assert_eq!(mismatch.problem_code(), "idempotency_key_mismatch");
    assert_eq!(expires(&mismatch), Some(end), "a mismatch says it too");

    // A final 4xx is a stored outcome: it governs the key like a 201.
    let refused = send(
        r,
        transfer(
            "demo-alice",
            Some("exp-4xx"),
            r#"{"from":"acc_alice_main","to":"acc_alice_main","amount":1}"#,
        ),
    )
    .await;
    assert!(refused.status.is_client_error(), "{refused:?}");
    assert!(expires(&refused).is_some(), "{refused:?}");

    // Before the key is read: nothing to say.
    let missing = send(r, transfer("demo-alice", None, &move_body("alice", 3))).await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(expires(&missing), None);

    // Past the window the key takes a new request, with a new window.
    advance(r, WINDOW.as_secs() + 1).await;
    let later_from = SystemTime::now() + WINDOW + Duration::from_secs(1);
    let again = send(
        r,
        transfer("demo-alice", Some("exp-1"), &move_body("alice", 3)),
    )
    .await;
    let later_to = SystemTime::now() + WINDOW + Duration::from_secs(1);
    assert_eq!(again.status, StatusCode::CREATED);
    assert!(!again.replayed(), "a new request after the window");
    window_from(expires(&again).unwrap(), later_from, later_to);
}
both!(the_window_end_travels_with_every_answer_the_key_governs);

// clause: idem.window.expiry-header
async fn a_released_5xx_and_an_uncommitted_claim_carry_no_window(b: Backend) {
    let db = db!(b, "expiry-none");
    let app = app(&db, &[]).await;
    let (router, mut gate) = with_gate(&app);
    // In flight, claim not committed: a duplicate's 409 has no window yet.
    let r1 = router.clone();
    let first =
        tokio::spawn(async move { send(&r1, gated_req("demo-alice", "exp-g", "{}")).await });
    gate.wait_entered().await;
    let dup = send(&router, gated_req("demo-alice", "exp-g", "{}")).await;
    assert_eq!(dup.status, StatusCode::CONFLICT, "{dup:?}");
    assert_eq!(expires(&dup), None, "no committed claim, no window");
    gate.release(1);
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(expires(&first).is_some());
    // A 5xx is not stored: the key is absent again, and no window is given.
    gate.set_status(500);
    let failing = tokio::spawn({
        let r = router.clone();
        async move { send(&r, gated_req("demo-alice", "exp-5xx", "{}")).await }
    });
    gate.wait_entered().await;
    gate.release(1);
    let failed = failing.await.unwrap();
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(expires(&failed), None);
}
both!(a_released_5xx_and_an_uncommitted_claim_carry_no_window);
