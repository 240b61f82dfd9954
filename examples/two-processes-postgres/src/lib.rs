//! One app, started as several processes on one PostgreSQL database: the
//! key table and the key's advisory lock are shared, so a duplicate sent to
//! any process while the first request runs in another gets the in-flight
//! `409` (or waits, with `Prefer: wait=N`), and a later one the replay.
//! Test: `cargo test -p example-two-processes-postgres` (needs
//! `IDEM_TEST_DATABASE_URL`); run: `DATABASE_URL=postgres://... cargo run -p
//! example-two-processes-postgres` twice.
use std::sync::Arc;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router, http::StatusCode, routing::post};
use axum_idempotency::clock::SystemClock;
use axum_idempotency::{Caller, Engine, EngineConfig, IdemTx, IdempotencyLayer};
use axum_idempotency::{Store, StoreOptions};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct NewOrder {
    item: String,
}

#[derive(Serialize)]
struct Order {
    id: i64,
    item: String,
}

/// Written as if duplicates did not exist: every write goes through `tx`.
///
/// On `IdemTx<Store>` with `with_conn!`, so the same app serves a
/// `sqlite://` URL too; an app on PostgreSQL alone takes `IdemTx<PgStore>`
/// and runs its queries on `&mut **tx` (`axum-idempotency`'s
/// `tests/pg_handler.rs`).
async fn create_order(
    tx: IdemTx<Store>,
    caller: Caller,
    Json(new): Json<NewOrder>,
) -> Result<(StatusCode, Json<Order>), axum_idempotency::Error> {
    let mut tx = tx.lock().await?;
    let id: i64 = axum_idempotency::with_conn!(&mut *tx, c => {
        sqlx::query_scalar("INSERT INTO orders (owner, item) VALUES ($1, $2) RETURNING id")
            .bind(caller.as_str())
            .bind(&new.item)
            .fetch_one(&mut *c)
            .await?
    });
    Ok((StatusCode::CREATED, Json(Order { id, item: new.item })))
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

/// The app on the PostgreSQL database at `url`: connects (the tested pool
/// settings), migrates (safe from several processes at once), spawns the
/// reaper (each process may run one: a pass deletes in short batches) and
/// routes.
pub async fn app(url: &str) -> Result<Router, axum_idempotency::Error> {
    let store = Store::connect_with(url, &StoreOptions::default()).await?;
    store.migrate().await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS orders (id BIGSERIAL PRIMARY KEY, owner TEXT NOT NULL, item TEXT NOT NULL)")
        .execute(match &store {
            Store::Postgres(s) => s.pool(),
            _ => return Err(axum_idempotency::Error::Config("a postgres:// URL".into())),
        })
        .await?;
    tokio::spawn(axum_idempotency::reaper::run(
        store.clone(),
        Arc::new(SystemClock),
        std::time::Duration::from_secs(3600),
    ));
    let engine = Engine::new(store, Arc::new(SystemClock), EngineConfig::default());
    Ok(Router::new()
        .route(
            "/orders",
            post(create_order).layer(IdempotencyLayer::new(engine)),
        )
        .layer(middleware::from_fn(auth)))
}
