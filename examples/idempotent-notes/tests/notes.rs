//! The example's promise: a retried POST makes one note, and the retry gets
//! the first answer back; a different request under the key is refused.
#![allow(clippy::unwrap_used)]

use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;

fn post(key: &str, text: &str) -> Request<Body> {
    Request::post("/notes")
        .header("x-user", "ann")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(format!(r#"{{"text":"{text}"}}"#)))
        .unwrap()
}

async fn send(app: &axum::Router, req: Request<Body>) -> (StatusCode, Option<String>, Vec<u8>) {
    let r = app.clone().oneshot(req).await.unwrap();
    let replayed = r
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.to_str().unwrap().to_owned());
    let status = r.status();
    let body = axum::body::to_bytes(r.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, replayed, body.to_vec())
}

// clause: idem.replay.verbatim, idem.replay.marker, idem.fingerprint.mismatch
#[tokio::test]
async fn a_retried_post_makes_one_note() {
    let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
    let app = example_idempotent_notes::app(pool.clone()).await.unwrap();

    let (status, replayed, first) = send(&app, post("k1", "hi")).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, None));
    let (status, replayed, again) = send(&app, post("k1", "hi")).await;
    assert_eq!(
        (status, replayed.as_deref()),
        (StatusCode::CREATED, Some("true"))
    );
    assert_eq!(
        again, first,
        "the replay is the first answer, byte for byte"
    );
    let (status, _, _) = send(&app, post("k1", "something else")).await;
    assert_eq!(status, StatusCode::CONFLICT, "same key, other request");
    let (status, _, _) = send(&app, post("k2", "hi")).await;
    assert_eq!(status, StatusCode::CREATED, "a new key is a new note");

    let notes: i64 = sqlx::query_scalar("SELECT count(*) FROM notes")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(notes, 2);
    let missing = Request::post("/notes")
        .header("x-user", "ann")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        send(&app, missing).await.0,
        StatusCode::BAD_REQUEST,
        "no key"
    );
}
