//! A handler that queries through `IdemTx<PgStore>` is an axum handler
//! (this file failing to compile is the failure), and it runs: one
//! request, one effect, its retry replayed.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::{Router, routing::post};
use axum_idempotency::clock::SystemClock;
use axum_idempotency::{
    Caller, Engine, EngineConfig, IdemTx, IdempotencyLayer, PgStore, StoreOptions,
};
use idem_test_support::{Backend, TestDb};
use tower::ServiceExt;

async fn handler(
    tx: IdemTx<PgStore>,
    caller: Caller,
) -> Result<StatusCode, axum_idempotency::Error> {
    let mut tx = tx.lock().await?;
    sqlx::query("INSERT INTO effects (owner) VALUES ($1)")
        .bind(caller.as_str())
        .execute(&mut **tx)
        .await?;
    Ok(StatusCode::CREATED)
}

fn request() -> Request<Body> {
    let mut req = Request::post("/effects")
        .header("idempotency-key", "k-1")
        .body(Body::empty())
        .unwrap();
    req.extensions_mut().insert(Caller::new("ann"));
    req
}

// clause: idem.claim.transactional
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_on_idemtx_pgstore_serves_and_replays() {
    let Some(db) = TestDb::new(Backend::Postgres, "pg-handler").await else {
        return;
    };
    let store = PgStore::connect(&db.url, &StoreOptions::default())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    sqlx::query("CREATE TABLE effects (owner TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let engine = Engine::new(
        store.clone(),
        Arc::new(SystemClock),
        EngineConfig::default(),
    );
    let router = Router::new().route(
        "/effects",
        post(handler).layer(IdempotencyLayer::new(engine)),
    );
    let first = router.clone().oneshot(request()).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let retry = router.oneshot(request()).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(retry.headers().contains_key("idempotent-replayed"));
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(n, 1);
}
