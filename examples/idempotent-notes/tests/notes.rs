//! The example's promise: a retried POST makes one note, and the retry gets
//! the first answer back; a different request under the key is refused.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;

fn post(key: &str, text: &str) -> Request<Body> {
    post_json(key, format!(r#"{{"text":"{text}"}}"#))
}

fn post_json(key: &str, json: String) -> Request<Body> {
    Request::post("/notes")
        .header("x-user", "ann")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(json))
        .unwrap()
}

/// A fresh SQLite file for one test (removed first, with its WAL files).
fn fresh_file(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("notes-{}-{name}.db", std::process::id()));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    path
}

/// A second pool on the app's file, for the test's own reads and writes.
async fn pool_on(path: &Path) -> sqlx::SqlitePool {
    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
    sqlx::SqlitePool::connect_with(options).await.unwrap()
}

async fn count(pool: &sqlx::SqlitePool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(pool)
        .await
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
    let path = fresh_file("retried");
    let app = example_idempotent_notes::open(&path, Duration::from_secs(3600))
        .await
        .unwrap();
    let pool = pool_on(&path).await;

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

    assert_eq!(count(&pool, "notes").await, 2);
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        mode, "wal",
        "the file is in WAL mode, as SqliteStore::open sets"
    );
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

// clause: idem.fingerprint.inputs, idem.fingerprint.mismatch
#[tokio::test]
async fn a_retry_whose_sent_at_changed_is_the_same_note() {
    let path = fresh_file("sent-at");
    let app = example_idempotent_notes::open(&path, Duration::from_secs(3600))
        .await
        .unwrap();
    let at = |t: &str| format!(r#"{{"text":"hi","sent_at":"{t}"}}"#);
    let (status, replayed, first) = send(&app, post_json("k", at("10:00:00"))).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, None));
    let (status, replayed, again) = send(&app, post_json("k", at("10:00:05"))).await;
    assert_eq!(
        (status, replayed.as_deref()),
        (StatusCode::CREATED, Some("true")),
        "sent_at is left out of the fingerprint"
    );
    assert_eq!(again, first);
    let (status, _, _) = send(
        &app,
        post_json("k", r#"{"text":"bye","sent_at":"10:00:05"}"#.into()),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "every other field still counts"
    );
    assert_eq!(count(&pool_on(&path).await, "notes").await, 1);
}

// clause: idem.window.retention
#[tokio::test]
async fn the_app_runs_the_reaper() {
    let path = fresh_file("reaper");
    let app = example_idempotent_notes::open(&path, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(send(&app, post("k", "hi")).await.0, StatusCode::CREATED);
    let pool = pool_on(&path).await;
    assert_eq!(count(&pool, "idempotency_keys").await, 1);
    // The key's retention ends now; the reaper's next pass (at most 1 s
    // away) deletes it. Bounded: 10 s.
    sqlx::query("UPDATE idempotency_keys SET expires_at = 0")
        .execute(&pool)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(&pool, "idempotency_keys").await > 0 {
        assert!(
            Instant::now() < deadline,
            "the reaper did not delete the expired key"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(count(&pool, "notes").await, 1, "the note itself stays");
}
