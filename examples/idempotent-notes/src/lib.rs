//! One idempotent endpoint on a fresh axum app and its own SQLite pool.
//! Test: `cargo test -p example-idempotent-notes`; run: `cargo run -p example-idempotent-notes`.
use std::sync::Arc;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router, http::StatusCode, routing::post};
use axum_idempotency::clock::SystemClock;
use axum_idempotency::{Caller, Engine, EngineConfig, IdemTx, IdempotencyLayer, SqliteStore};
use serde::{Deserialize, Serialize};
use sqlx::SqlitePool;

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

/// The app on `pool`: migrates (the key table beside `notes`) and routes.
pub async fn app(pool: SqlitePool) -> Result<Router, axum_idempotency::Error> {
    let store = SqliteStore::new(pool.clone());
    store.migrate().await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, owner TEXT, text TEXT)")
        .execute(&pool)
        .await?;
    let engine = Engine::new(store, Arc::new(SystemClock), EngineConfig::default());
    Ok(Router::new()
        .route(
            "/notes",
            post(create_note).layer(IdempotencyLayer::new(engine)),
        )
        .layer(middleware::from_fn(auth)))
}
