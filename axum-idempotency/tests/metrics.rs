//! What the layer emits, read back from a recording recorder and a
//! captured log: one count per request under its outcome and its route
//! *template*, store errors by kind, and a span that carries the key's hash
//! but never the key or the caller.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum_idempotency::clock::SystemClock;
use axum_idempotency::{Caller, Engine, EngineConfig, IdemTx, IdempotencyLayer, SqliteStore};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};
use tower::ServiceExt;

async fn credit(
    tx: IdemTx<SqliteStore>,
    Path(account): Path<String>,
    body: String,
) -> Result<(StatusCode, String), axum_idempotency::Error> {
    let mut tx = tx.lock().await?;
    sqlx::query("INSERT INTO credits (account, amount) VALUES ($1, $2)")
        .bind(&account)
        .bind(body.len() as i64)
        .execute(&mut **tx)
        .await?;
    Ok((StatusCode::CREATED, account))
}

async fn app() -> (Router, SqliteStore) {
    let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
    let store = SqliteStore::new(pool.clone());
    store.migrate().await.unwrap();
    sqlx::query("CREATE TABLE credits (account TEXT, amount BIGINT)")
        .execute(&pool)
        .await
        .unwrap();
    let engine = Engine::new(
        store.clone(),
        Arc::new(SystemClock),
        EngineConfig::default(),
    );
    let router = Router::new()
        .route(
            "/accounts/{id}/credits",
            post(credit).layer(IdempotencyLayer::new(engine)),
        )
        .layer(axum::middleware::from_fn(
            |mut req: Request<Body>, next: axum::middleware::Next| async move {
                req.extensions_mut().insert(Caller::new("carol-the-caller"));
                next.run(req).await
            },
        ));
    (router, store)
}

async fn send(router: &Router, path: &str, key: Option<&str>, body: &str) -> StatusCode {
    let mut r = Request::post(path);
    if let Some(k) = key {
        r = r.header("idempotency-key", k);
    }
    router
        .clone()
        .oneshot(r.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap()
        .status()
}

/// One snapshot (the debugging recorder drains counters as it reads them).
struct Snap(Vec<(CompositeKey, DebugValue)>);

impl Snap {
    fn take(snapshotter: &Snapshotter) -> Self {
        Self(
            snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .map(|(k, _, _, v)| (k, v))
                .collect(),
        )
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let mut total = 0;
        for (key, value) in &self.0 {
            let k = key.key();
            if key.kind() != MetricKind::Counter || k.name() != name {
                continue;
            }
            let matches = labels
                .iter()
                .all(|(n, v)| k.labels().any(|l| l.key() == *n && l.value() == *v));
            if let (true, DebugValue::Counter(c)) = (matches, value) {
                total += c;
            }
        }
        total
    }

    fn label_values(&self, name: &str, label: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k.key().name() == name)
            .flat_map(|(k, _)| {
                k.key()
                    .labels()
                    .filter(|l| l.key() == label)
                    .map(|l| l.value().to_owned())
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// A current-thread runtime: the thread-local recorder and subscriber see
// every task of the test.
#[tokio::test]
async fn each_request_is_counted_once_under_its_outcome_and_route_template() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .finish();
    let _tracing = tracing::subscriber::set_default(subscriber);

    let (router, store) = app().await;
    let secret_key = "key-sekrit-4711";
    assert_eq!(
        send(&router, "/accounts/a1/credits", Some(secret_key), "x").await,
        StatusCode::CREATED
    );
    for _ in 0..2 {
        assert_eq!(
            send(&router, "/accounts/a1/credits", Some(secret_key), "x").await,
            StatusCode::CREATED
        );
    }
    assert_eq!(
        send(&router, "/accounts/a1/credits", Some(secret_key), "yy").await,
        StatusCode::CONFLICT
    );
    assert_eq!(
        send(&router, "/accounts/a2/credits", None, "x").await,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        send(&router, "/accounts/a2/credits", Some(&"k".repeat(300)), "x").await,
        StatusCode::BAD_REQUEST
    );

    let route = "/accounts/{id}/credits";
    let snap = Snap::take(&snapshotter);
    let by = |snap: &Snap, outcome: &str| {
        snap.counter(
            "idem_requests_total",
            &[("route", route), ("outcome", outcome)],
        )
    };
    assert_eq!(by(&snap, "executed"), 1);
    assert_eq!(by(&snap, "replayed"), 2);
    assert_eq!(by(&snap, "mismatch"), 1);
    assert_eq!(by(&snap, "key_missing"), 1);
    assert_eq!(by(&snap, "key_invalid"), 1);
    assert_eq!(snap.counter("idem_requests_total", &[]), 6);
    // The route label is the template, never a path with an id in it.
    let routes = snap.label_values("idem_requests_total", "route");
    assert!(routes.iter().all(|r| r == route), "{routes:?}");

    // A store that fails: counted by kind where the error happens.
    store.pool().close().await;
    assert_eq!(
        send(&router, "/accounts/a3/credits", Some("after-close"), "x").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let snap = Snap::take(&snapshotter);
    assert_eq!(by(&snap, "store_unavailable"), 1);
    assert_eq!(snap.counter("idem_requests_total", &[]), 1);
    assert!(snap.counter("idem_store_errors_total", &[("kind", "unreachable")]) >= 1);

    // The span: the key's hash, the outcome and the recovery point, and
    // never the raw key or the caller. (The engine's own DEBUG/INFO events
    // name the key in their message fields, for an operator who has to
    // find it; the span's fields, which a tracing backend indexes, do not.)
    let log = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let hash = axum_idempotency::metrics::key_hash("carol-the-caller", secret_key);
    let spans: Vec<&str> = log
        .lines()
        .filter_map(|l| {
            let start = l.find("idem.request{")?;
            let end = start + l[start..].find("}: ")?;
            Some(&l[start..=end])
        })
        .collect();
    assert!(spans.len() >= 7, "{log}");
    assert!(
        spans
            .iter()
            .any(|s| s.contains(&format!("key_hash={hash}"))),
        "the key's hash is on the span: {spans:#?}"
    );
    for s in &spans {
        assert!(!s.contains(secret_key), "the raw key on the span: {s}");
        assert!(
            !s.contains("carol-the-caller"),
            "the caller on the span: {s}"
        );
    }
    let closed: Vec<&str> = log
        .lines()
        .filter(|l| l.ends_with(" close time.busy") || l.contains(" close "))
        .collect();
    let closed = closed.join("\n");
    assert!(
        closed.contains("outcome=\"replayed\"") && closed.contains("recovery_point=\"finished\""),
        "the closed span carries the outcome and the recovery point: {closed}"
    );
    assert!(closed.contains("outcome=\"mismatch\""), "{closed}");
    assert!(closed.contains("outcome=\"store_unavailable\""), "{closed}");
}
