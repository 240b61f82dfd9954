//! One idempotent endpoint on a fresh axum app and its own SQLite file.
//! Test: `cargo test -p example-idempotent-notes`; run: `cargo run -p example-idempotent-notes`.
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router, http::StatusCode, routing::post};
use axum_idempotency::clock::SystemClock;
use axum_idempotency::engine::{ContractFingerprint, FingerprintPolicy};
use axum_idempotency::{Caller, Engine, EngineConfig, IdemTx, IdempotencyLayer, SqliteStore};
use axum_idempotency::{Fingerprint, reaper};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct NewNote {
    text: String,
}

#[derive(Serialize)]
struct Note {
    id: i64,
    text: String,
}

/// Written as if duplicates did not exist: every write goes through `tx`.
async fn create_note(
    tx: IdemTx<SqliteStore>,
    caller: Caller,
    Json(new): Json<NewNote>,
) -> Result<(StatusCode, Json<Note>), axum_idempotency::Error> {
    let mut tx = tx.lock().await?;
    let id: i64 =
        sqlx::query_scalar("INSERT INTO notes (owner, text) VALUES ($1, $2) RETURNING id")
            .bind(caller.as_str())
            .bind(&new.text)
            .fetch_one(&mut **tx)
            .await?;
    Ok((StatusCode::CREATED, Json(Note { id, text: new.text })))
}

/// Stand-in authentication: the `x-user` header names the caller.
async fn auth(mut req: Request, next: Next) -> Response {
    match req.headers().get("x-user").and_then(|v| v.to_str().ok()) {
        Some(user) => {
            let caller = Caller::new(user);
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        None => StatusCode::UNAUTHORIZED.into_response(),
    }
}

/// What counts as the same request: the contract's fingerprint, but without
/// `sent_at`, a field our clients set to the time of each attempt. A retry
/// whose `sent_at` changed is still the same note (replayed, not a 409).
#[derive(Debug)]
struct IgnoreSentAt;

impl FingerprintPolicy for IgnoreSentAt {
    fn fingerprint(&self, method: &str, path: &str, ct: Option<&str>, body: &[u8]) -> Fingerprint {
        let mut json: serde_json::Value = match serde_json::from_slice(body) {
            Ok(json) => json,
            Err(_) => return ContractFingerprint.fingerprint(method, path, ct, body),
        };
        if let Some(fields) = json.as_object_mut() {
            fields.remove("sent_at");
        }
        let body = serde_json::to_vec(&json).unwrap_or_else(|_| body.to_vec());
        ContractFingerprint.fingerprint(method, path, ct, &body)
    }
}

/// The app on `store`: migrates (the key table beside `notes`) and routes.
pub async fn app(store: SqliteStore) -> Result<Router, axum_idempotency::Error> {
    store.migrate().await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, owner TEXT, text TEXT)")
        .execute(store.pool())
        .await?;
    let config = EngineConfig {
        fingerprint: Arc::new(IgnoreSentAt),
        ..EngineConfig::default()
    };
    let engine = Engine::new(store, Arc::new(SystemClock), config);
    Ok(Router::new()
        .route(
            "/notes",
            post(create_note).layer(IdempotencyLayer::new(engine)),
        )
        .layer(middleware::from_fn(auth)))
}

/// The whole app on the SQLite file at `path` (created if missing, WAL):
/// the router, and the reaper deleting keys past retention every
/// `reap_every` (hourly is plenty) for as long as the runtime runs.
pub async fn open(path: &Path, reap_every: Duration) -> Result<Router, axum_idempotency::Error> {
    let store = SqliteStore::open(path).await?;
    tokio::spawn(reaper::run(
        store.clone(),
        Arc::new(SystemClock),
        reap_every,
    ));
    app(store).await
}
