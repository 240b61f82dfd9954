//! Shared test harness: throwaway databases on both backends, an app built
//! from command-line flags, and small request helpers.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Request, StatusCode};
use axum_idempotency::{Caller, IdempotencyKey, KeyId, Store, with_conn};
use idem_server::api::auth::Principal;
use idem_server::app::App;
use idem_server::config::Cli;
use tokio::sync::{Semaphore, mpsc};
use tower::ServiceExt;

#[allow(unused_imports)]
pub use idem_test_support::{Backend, TestDb, both, db};

/// Builds the app on `db` with extra flags (`--test-hooks` is always on).
pub async fn app(db: &TestDb, extra: &[&str]) -> App {
    let mut args = vec![
        "idem-server",
        "--database-url",
        &db.url,
        "--test-hooks",
        "--max-connections",
        "8",
    ];
    args.extend_from_slice(extra);
    let cli = Cli::from_args(args).expect("flags");
    idem_server::app::build(&cli).await.expect("build app")
}

/// A response, buffered.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }
    /// The problem `code`, asserting the body is a well-formed problem document.
    pub fn problem_code(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "status {} body {:?}",
            self.status,
            self.body
        );
        let p: idem_spec::Problem = serde_json::from_slice(&self.body).expect("problem body");
        assert_eq!(p.status, self.status.as_u16());
        assert!(p.detail.as_deref().is_some_and(|d| !d.is_empty()));
        p.code
    }
}

pub async fn send(router: &Router, req: Request<Body>) -> Resp {
    let resp = router.clone().oneshot(req).await.expect("infallible");
    let (parts, body) = resp.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.expect("body");
    Resp {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// A POST /v1/transfers request from `token` with `key` and a JSON body.
pub fn transfer(token: &str, key: Option<&str>, body: &str) -> Request<Body> {
    let mut b = Request::post("/v1/transfers")
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b.body(Body::from(body.to_owned())).unwrap()
}

/// A POST of 1 unit between alice's accounts with `key`, over HTTP to a
/// server process at `base`: the request the process-level suites load it
/// with (each reads what it needs of the answer).
pub fn alice_transfer(client: &reqwest::Client, base: &str, key: &str) -> reqwest::RequestBuilder {
    client
        .post(format!("{base}/v1/transfers"))
        .header("authorization", "Bearer demo-alice")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(move_body("alice", 1))
}

pub fn move_body(caller: &str, amount: i64) -> String {
    format!(r#"{{"from":"acc_{caller}_main","to":"acc_{caller}_savings","amount":{amount}}}"#)
}

pub fn get(token: &str, path: &str) -> Request<Body> {
    Request::get(path)
        .header("authorization", format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap()
}

/// (main, savings) balances of a demo caller.
pub async fn balances(router: &Router, caller: &str) -> (i64, i64) {
    let r = send(router, get(&format!("demo-{caller}"), "/v1/accounts")).await;
    assert_eq!(r.status, StatusCode::OK);
    let v = r.json();
    let find = |id: String| {
        v["accounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["id"] == id.as_str())
            .unwrap()["balance"]
            .as_i64()
            .unwrap()
    };
    (
        find(format!("acc_{caller}_main")),
        find(format!("acc_{caller}_savings")),
    )
}

pub async fn transfer_count(router: &Router, caller: &str) -> u64 {
    let r = send(router, get(&format!("demo-{caller}"), "/v1/transfers")).await;
    r.json()["count"].as_u64().unwrap()
}

pub async fn advance(router: &Router, secs: u64) {
    let r = send(
        router,
        Request::post("/_test/clock")
            .header("content-type", "application/json")
            .body(Body::from(format!(r#"{{"advance_secs":{secs}}}"#)))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
}

/// An endpoint whose executions a test controls: each execution announces
/// itself on `entered`, writes to the caller's main account through the
/// claim's transaction, then waits for one permit of `release`. It answers
/// with the status in `status` (201 by default).
#[derive(Clone)]
pub struct Gate {
    pub executions: Arc<AtomicUsize>,
    pub entered: mpsc::UnboundedSender<usize>,
    pub release: Arc<Semaphore>,
    pub status: Arc<std::sync::Mutex<u16>>,
    /// Whether each execution writes (+1 on the caller's main account).
    pub writes: Arc<std::sync::atomic::AtomicBool>,
}

pub struct GateHandle {
    pub gate: Gate,
    pub entered: mpsc::UnboundedReceiver<usize>,
}

impl GateHandle {
    pub fn executions(&self) -> usize {
        self.gate.executions.load(Ordering::SeqCst)
    }
    pub fn release(&self, n: usize) {
        self.gate.release.add_permits(n);
    }
    pub async fn wait_entered(&mut self) -> usize {
        tokio::time::timeout(std::time::Duration::from_secs(10), self.entered.recv())
            .await
            .expect("an execution should have started")
            .expect("gate open")
    }
    pub fn set_writes(&self, w: bool) {
        self.gate.writes.store(w, Ordering::SeqCst);
    }
    pub fn set_status(&self, s: u16) {
        *self.gate.status.lock().unwrap() = s;
    }
}

async fn gated(
    axum::extract::State(gate): axum::extract::State<Gate>,
    tx: axum_idempotency::IdemTx<Store>,
    caller: Principal,
    deadline: Option<axum::Extension<axum_idempotency::RequestDeadline>>,
) -> Result<(StatusCode, HeaderMap, String), idem_server::Error> {
    let n = gate.executions.fetch_add(1, Ordering::SeqCst) + 1;
    if gate.writes.load(Ordering::SeqCst) {
        let mut tx = tx.lock().await?;
        with_conn!(&mut *tx, c => {
            sqlx::query(&axum_idempotency::store::sql(&*c, "UPDATE accounts SET balance = balance + 1 WHERE id = $1"))
                .bind(format!("acc_{}_main", caller.0))
                .execute(&mut *c)
                .await?;
        });
    }
    let _ = gate.entered.send(n);
    gate.release.acquire().await.unwrap().forget();
    let status = *gate.status.lock().unwrap();
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "application/json".parse().unwrap());
    headers.insert("x-execution", n.to_string().parse().unwrap());
    // What the handler was told of its caller's deadline, when it sent one.
    if let Some(axum::Extension(d)) = deadline {
        headers.insert(
            "x-deadline-left-ms",
            d.remaining().as_millis().to_string().parse().unwrap(),
        );
    }
    Ok((
        StatusCode::from_u16(status).unwrap(),
        headers,
        format!(r#"{{"execution":{n}}}"#),
    ))
}

/// The app's routes plus `POST /gated`, behind the same auth and
/// idempotency layer (declaring `x-execution` as a replayed header).
pub fn with_gate(app: &App) -> (Router, GateHandle) {
    let (tx, rx) = mpsc::unbounded_channel();
    let gate = Gate {
        executions: Arc::new(AtomicUsize::new(0)),
        entered: tx,
        release: Arc::new(Semaphore::new(0)),
        status: Arc::new(std::sync::Mutex::new(201)),
        writes: Arc::new(std::sync::atomic::AtomicBool::new(true)),
    };
    // The same wiring as the app's own idempotent routes (flaws included).
    let route = idem_server::app::idempotent(&app.state, gated, gate.clone(), &["x-execution"]);
    let gated_routes: Router =
        idem_server::app::with_auth(Router::new().route("/gated", route), &app.state);
    let profile = app.state.profile;
    let router = app
        .router
        .clone()
        .merge(gated_routes)
        .layer(axum::middleware::from_fn(
            move |req: Request<Body>, next: axum::middleware::Next| {
                idem_server::with_profile(profile, async move { next.run(req).await })
            },
        ));
    (router, GateHandle { gate, entered: rx })
}

pub fn gated_req(token: &str, key: &str, body: &str) -> Request<Body> {
    Request::post("/gated")
        .header("authorization", format!("Bearer {token}"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

/// The record identity of `key` sent by `caller`.
pub fn kid(caller: &str, key: &str) -> KeyId {
    KeyId::new(Caller::new(caller), IdempotencyKey::parse(key).unwrap())
}
