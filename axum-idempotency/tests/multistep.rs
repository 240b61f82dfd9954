//! The multi-step driver end to end, on both stores: a three-phase
//! endpoint whose "foreign system" is a counter the test can make fail.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum_idempotency::clock::SystemClock;
use axum_idempotency::jobs::complete_once;
use axum_idempotency::multistep::{MultiStep, MultiStepEndpoint, Next, Phase, Points};
use axum_idempotency::store::KeyStore;
use axum_idempotency::{
    Caller, Engine, EngineConfig, IdempotencyKey, KeyId, Store, with_conn, with_pool,
};
use idem_test_support::{Backend, TestDb, both, db};

/// The foreign system: calls per outbound key, and failures still to serve.
#[derive(Clone, Default)]
struct Foreign {
    calls: Arc<Mutex<BTreeMap<String, u32>>>,
    fail_next: Arc<Mutex<u32>>,
}

#[derive(Debug)]
enum AppError {
    Unavailable,
    Engine(axum_idempotency::Error),
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl From<axum_idempotency::Error> for AppError {
    fn from(e: axum_idempotency::Error) -> Self {
        Self::Engine(e)
    }
}

impl From<sqlx::Error> for AppError {
    fn from(e: sqlx::Error) -> Self {
        Self::Engine(e.into())
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        match self {
            Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE.into_response(),
            Self::Engine(e) => e.into_response(),
        }
    }
}

#[derive(Clone)]
struct Order {
    foreign: Foreign,
}

/// Where an order can stop and resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Point {
    Started,
    Reserved,
    Charged,
}

impl Points for Point {
    const ALL: &'static [Self] = &[Self::Started, Self::Reserved, Self::Charged];
    fn name(self) -> &'static str {
        match self {
            Self::Started => "started",
            Self::Reserved => "reserved",
            Self::Charged => "charged",
        }
    }
}

impl MultiStep<Store> for Order {
    type Error = AppError;
    type Point = Point;

    async fn phase(&self, from: Point, p: &mut Phase<'_, Store>) -> Result<Next<Point>, AppError> {
        let id = p.derive("order")[..16].to_owned();
        match from {
            Point::Started => {
                let tx = p.tx().await?;
                with_conn!(tx, c => {
                    sqlx::query(&axum_idempotency::store::sql(&*c, "INSERT INTO orders (id, status) VALUES ($1, 'reserved')"))
                        .bind(&id)
                        .execute(&mut *c)
                        .await?;
                });
                Ok(Next::Commit(Point::Reserved))
            }
            Point::Reserved => {
                p.commit_intent().await?;
                let outbound = p.foreign_key("shop")?.as_str().to_owned();
                *self
                    .foreign
                    .calls
                    .lock()
                    .unwrap()
                    .entry(outbound)
                    .or_default() += 1;
                {
                    let mut fail = self.foreign.fail_next.lock().unwrap();
                    if *fail > 0 {
                        *fail -= 1;
                        return Err(AppError::Unavailable);
                    }
                }
                let tx = p.tx().await?;
                with_conn!(tx, c => {
                    sqlx::query(&axum_idempotency::store::sql(&*c, "UPDATE orders SET status = 'charged' WHERE id = $1"))
                        .bind(&id)
                        .execute(&mut *c)
                        .await?;
                });
                Ok(Next::Commit(Point::Charged))
            }
            Point::Charged => Ok(Next::Finish(
                (StatusCode::CREATED, format!("order {id}")).into_response(),
            )),
        }
    }
}

struct App {
    endpoint: MultiStepEndpoint<Store>,
    store: Store,
    foreign: Foreign,
    _db: TestDb,
}

async fn app(db: TestDb) -> App {
    let store = Store::connect(&db.url, 4).await.unwrap();
    store.migrate().await.unwrap();
    with_pool!(&store, p => {
        sqlx::query("CREATE TABLE orders (id VARCHAR(64) PRIMARY KEY, status TEXT NOT NULL)")
            .execute(p)
            .await
            .unwrap();
    });
    let config = EngineConfig {
        lease: Duration::from_secs(30),
        ..EngineConfig::default()
    };
    let engine = Engine::new(store.clone(), Arc::new(SystemClock), config);
    let foreign = Foreign::default();
    let endpoint = MultiStepEndpoint::new(
        engine,
        "POST",
        "/orders",
        Order {
            foreign: foreign.clone(),
        },
    );
    App {
        endpoint,
        store,
        foreign,
        _db: db,
    }
}

async fn order(app: &App, key: &str) -> (StatusCode, bool, String) {
    let mut req = Request::post("/orders")
        .header("idempotency-key", key)
        .body(Body::from("{}"))
        .unwrap();
    req.extensions_mut().insert(Caller::new("ann"));
    let resp = app.endpoint.handle(req).await;
    let replayed = resp.headers().contains_key("idempotent-replayed");
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        replayed,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

async fn orders(app: &App) -> Vec<String> {
    with_pool!(&app.store, p => {
        sqlx::query_scalar("SELECT status FROM orders").fetch_all(p).await.unwrap()
    })
}

fn kid(key: &str) -> KeyId {
    KeyId::new(Caller::new("ann"), IdempotencyKey::parse(key).unwrap())
}

// clause: idem.multistep.resume, idem.multistep.phases, idem.multistep.foreign-key, idem.failure.5xx-not-stored
async fn a_5xx_after_a_phase_keeps_its_progress_and_a_retry_resumes(b: Backend) {
    let app = app(db!(b, "ms-resume")).await;
    *app.foreign.fail_next.lock().unwrap() = 1;
    let first = order(&app, "o1").await;
    assert_eq!(first.0, StatusCode::SERVICE_UNAVAILABLE);
    let rec = app.store.lookup(&kid("o1")).await.unwrap().unwrap();
    assert_eq!(
        rec.recovery_point.as_str(),
        "reserved",
        "phase 1 stayed committed"
    );
    assert_eq!(orders(&app).await, vec!["reserved"]);

    let retry = order(&app, "o1").await;
    assert_eq!((retry.0, retry.1), (StatusCode::CREATED, false));
    assert_eq!(
        orders(&app).await,
        vec!["charged"],
        "phase 1 did not run again"
    );
    let calls = app.foreign.calls.lock().unwrap().clone();
    assert_eq!(
        calls.len(),
        1,
        "every attempt sent the same outbound key: {calls:?}"
    );
    assert_eq!(calls.values().copied().collect::<Vec<_>>(), vec![2]);

    let replay = order(&app, "o1").await;
    assert_eq!(
        (replay.0, replay.1, &replay.2),
        (StatusCode::CREATED, true, &retry.2)
    );
}
both!(a_5xx_after_a_phase_keeps_its_progress_and_a_retry_resumes);

// clause: idem.completer.drives, idem.lease.takeover
async fn the_completer_finishes_what_the_client_abandoned(b: Backend) {
    let app = app(db!(b, "ms-complete")).await;
    *app.foreign.fail_next.lock().unwrap() = 1;
    assert_eq!(order(&app, "o2").await.0, StatusCode::SERVICE_UNAVAILABLE);
    let generation = app
        .store
        .lookup(&kid("o2"))
        .await
        .unwrap()
        .unwrap()
        .generation;
    let report = complete_once(
        &app.store,
        &SystemClock,
        std::slice::from_ref(&app.endpoint),
    )
    .await
    .unwrap();
    assert_eq!((report.found, report.finished), (1, 1), "{report:?}");
    let rec = app.store.lookup(&kid("o2")).await.unwrap().unwrap();
    assert_eq!(
        rec.generation,
        generation + 1,
        "the completer took the key over"
    );
    assert_eq!(orders(&app).await, vec!["charged"]);
    let client = order(&app, "o2").await;
    assert_eq!(
        (client.0, client.1),
        (StatusCode::CREATED, true),
        "the client gets the replay"
    );
    let again = complete_once(
        &app.store,
        &SystemClock,
        std::slice::from_ref(&app.endpoint),
    )
    .await
    .unwrap();
    assert_eq!(again.found, 0);
}
both!(the_completer_finishes_what_the_client_abandoned);
