//! Unrelated first executions run at the same time: the time a handler
//! spends before its first write holds nothing another key needs.
//!
//! The handler of these apps waits at a barrier *before* it asks for its
//! transaction, so the barrier only opens if that many first executions
//! are inside their handlers at once. An engine that took SQLite's writer
//! (or any lock shared by unrelated keys) before the handler ran would
//! hold the barrier shut until the test's bound; the test then fails. The
//! timed version of the same scenario (150 requests whose handler spends
//! 200 ms before its one write) is the benchmark's `concurrent` scenario.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use axum_idempotency::clock::SystemClock;
use axum_idempotency::{
    Caller, Engine, EngineConfig, IdemTx, IdempotencyLayer, Store, StoreOptions, with_conn,
    with_pool,
};
use idem_test_support::{Backend, TestDb, both, db};
use tokio::sync::Barrier;
use tower::ServiceExt;

/// First executions of distinct keys by distinct callers sent at once.
const REQUESTS: usize = 150;

async fn handler(
    State(barrier): State<Arc<Barrier>>,
    tx: IdemTx<Store>,
    caller: Caller,
    Json(n): Json<i64>,
) -> Result<(StatusCode, Json<i64>), axum_idempotency::Error> {
    // The slow part of the handler (a call to another service, say),
    // before its first write.
    barrier.wait().await;
    let mut tx = tx.lock().await?;
    with_conn!(&mut *tx, c => {
        sqlx::query(&axum_idempotency::store::sql(&*c, "INSERT INTO effects (owner, n) VALUES ($1, $2)"))
            .bind(caller.as_str())
            .bind(n)
            .execute(&mut *c)
            .await?;
    });
    Ok((StatusCode::CREATED, Json(n)))
}

/// The app as the crate's README wires it, on a pool of `connections`,
/// with a barrier of `parties` in its handler.
async fn app(db: &TestDb, connections: u32, parties: usize) -> (Router, Store) {
    let store = Store::connect_with(
        &db.url,
        &StoreOptions::default().max_connections(connections),
    )
    .await
    .unwrap();
    store.migrate().await.unwrap();
    with_pool!(&store, p => {
        sqlx::query("CREATE TABLE effects (owner TEXT NOT NULL, n BIGINT NOT NULL)")
            .execute(p)
            .await
            .unwrap();
    });
    let engine = Engine::new(
        store.clone(),
        Arc::new(SystemClock),
        EngineConfig::default(),
    );
    let router = Router::new()
        .route(
            "/effects",
            post(handler).layer(IdempotencyLayer::new(engine)),
        )
        .layer(axum::middleware::from_fn(
            |mut req: Request<Body>, next: axum::middleware::Next| async move {
                if let Some(user) = req.headers().get("x-user").and_then(|v| v.to_str().ok()) {
                    let caller = Caller::new(user);
                    req.extensions_mut().insert(caller);
                }
                next.run(req).await
            },
        ))
        .with_state(Arc::new(Barrier::new(parties)));
    (router, store)
}

fn request(i: usize) -> Request<Body> {
    Request::post("/effects")
        .header("content-type", "application/json")
        .header("x-user", format!("caller-{i}"))
        .header("idempotency-key", format!("key-{i}"))
        .body(Body::from(i.to_string()))
        .unwrap()
}

/// Sends every request at once and checks each got its own first
/// execution: 201, not a replay, and exactly one effect per caller.
async fn all_at_once(router: &Router, store: &Store) {
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let router = router.clone();
            tokio::spawn(async move { router.oneshot(request(i)).await.unwrap() })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        let response = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .unwrap_or_else(|_| {
                panic!("request {i} still unanswered after 30 s: first executions are serialised")
            })
            .unwrap();
        assert_eq!(response.status(), StatusCode::CREATED, "request {i}");
        assert!(!response.headers().contains_key("idempotent-replayed"));
    }
    let per_caller: Vec<(String, i64)> = with_pool!(store, p => {
        sqlx::query_as("SELECT owner, count(*) FROM effects GROUP BY owner")
            .fetch_all(p)
            .await
            .unwrap()
    });
    assert_eq!(per_caller.len(), REQUESTS, "every caller has its effect");
    assert!(per_caller.iter().all(|(_, n)| *n == 1), "{per_caller:?}");
}

// clause: idem.claim.transactional, idem.concurrency.single-effect
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_unrelated_first_executions_are_all_inside_their_handlers_at_once() {
    // A SQLite file and a pool of 4: all 150 handlers must be past the
    // engine and waiting at the barrier together before any of them
    // writes. Their writes then queue for SQLite's one writer, each for
    // the length of its own transaction only.
    let db = db!(Backend::Sqlite, "concurrency-sqlite");
    let (router, store) = app(&db, 4, REQUESTS).await;
    all_at_once(&router, &store).await;
}

async fn unrelated_first_executions_run_up_to_the_pool(b: Backend) {
    // On PostgreSQL a request holds one pooled connection from its
    // observation to its commit (the advisory lock that shows other
    // processes its key in flight lives in that transaction), so a pool of
    // 30 runs 30 handlers at once: the barrier opens in five rounds of 30.
    // On SQLite the same app runs them all the same way.
    let db = db!(b, "concurrency-pool");
    let (router, store) = app(&db, 30, 30).await;
    all_at_once(&router, &store).await;
}

both!(unrelated_first_executions_run_up_to_the_pool);
