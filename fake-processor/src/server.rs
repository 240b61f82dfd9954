//! The HTTP service: routes, the charge handler and the ways to run it (a
//! bound listener for the binary, a tokio task for in-process tests).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use idem_spec::headers::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, RETRY_AFTER};
use idem_spec::problem::PROBLEM_CONTENT_TYPE;
use idem_spec::{ErrorCode, Fingerprint, IdempotencyKey, Problem, Profile};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::Error;
use crate::control::Control;
use crate::model::{
    BEHAVIOR_HEADER, Behavior, Charge, ChargeRequest, ChargeStatus, ControlRequest, ControlState,
    DECLINE_CODE, Fault,
};
use crate::store::{Claim, Store};

/// The binary prints this prefix followed by the base URL once it accepts
/// connections; a parent process (e.g. `idem_test_support::ChildServer`) waits for it.
pub const READY_LINE_PREFIX: &str = "listening on ";

/// Seconds a 503 asks the caller to wait (`Retry-After`).
const RETRY_AFTER_SECS: &str = "1";

/// The processor application: its database and its fault schedule. Cheap
/// to clone; clones share state.
#[derive(Debug, Clone)]
pub struct Processor {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Store,
    control: Control,
}

impl Processor {
    /// Opens (or creates) the database at `db_path`, applying migrations.
    pub async fn open(db_path: impl AsRef<Path>) -> Result<Self, Error> {
        let store = Store::open(db_path.as_ref()).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                control: Control::default(),
            }),
        })
    }

    /// The axum router serving every endpoint.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/health", get(health))
            .route("/charges", get(list_charges).post(create_charge))
            .route("/charges/{id}", get(get_charge))
            .route(
                "/_control",
                get(get_control).post(set_control).delete(reset_control),
            )
            .fallback(not_found)
            .with_state(self.clone())
    }

    /// Binds `addr` (port 0 picks a free one) without serving yet, so the
    /// caller can announce the real address first.
    pub async fn bind(self, addr: SocketAddr) -> Result<BoundServer, Error> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        Ok(BoundServer {
            processor: self,
            listener,
            local_addr,
        })
    }

    /// Closes the database pool.
    pub async fn close(&self) {
        self.inner.store.close().await;
    }
}

/// A processor bound to a socket, not yet serving.
#[derive(Debug)]
pub struct BoundServer {
    processor: Processor,
    listener: TcpListener,
    local_addr: SocketAddr,
}

impl BoundServer {
    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// `http://IP:PORT`, the base URL clients use.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.local_addr)
    }

    /// Serves until `shutdown` completes, then closes the database.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        let app = self.processor.router();
        axum::serve(self.listener, app)
            .with_graceful_shutdown(shutdown)
            .await?;
        self.processor.close().await;
        Ok(())
    }
}

/// A processor served on a tokio task of the current runtime. Dropping it
/// stops the server.
#[derive(Debug)]
pub struct InProcessProcessor {
    base_url: String,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), Error>>,
}

impl InProcessProcessor {
    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// A typed client for this processor.
    pub fn client(&self) -> crate::ProcessorClient {
        crate::ProcessorClient::new(&self.base_url)
    }

    /// Stops accepting, lets in-flight requests finish and closes the
    /// database, so another processor can open the same file.
    pub async fn shutdown(mut self) -> Result<(), Error> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match (&mut self.task).await {
            Ok(result) => result,
            Err(join) => Err(Error::Io(std::io::Error::other(join))),
        }
    }
}

impl Drop for InProcessProcessor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves a processor on `127.0.0.1:0` on a tokio task, with its database
/// at `db_path`. For tests that need the processor's behaviour but not a
/// separate process; run the binary as a child process for crash tests.
pub async fn spawn_in_process(db_path: impl AsRef<Path>) -> Result<InProcessProcessor, Error> {
    let bound = Processor::open(db_path)
        .await?
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await?;
    let base_url = bound.base_url();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(bound.serve(async {
        let _ = rx.await;
    }));
    Ok(InProcessProcessor {
        base_url,
        shutdown: Some(tx),
        task,
    })
}

/// A problem+json answer under the reference profile.
fn problem(code: ErrorCode, detail: impl Into<String>) -> Response {
    let p = Problem::new(code, Profile::Reference, detail);
    let status = StatusCode::from_u16(p.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, PROBLEM_CONTENT_TYPE)],
        Json(p),
    )
        .into_response()
}

/// Storage failures are logged in full and answered without details.
fn internal(err: &Error) -> Response {
    tracing::error!(error = %err, "processor storage failed");
    problem(ErrorCode::InternalError, "the processor's database failed")
}

async fn health(State(p): State<Processor>) -> Response {
    match p.inner.store.ping().await {
        Ok(()) => Json(serde_json::json!({ "status": "ok" })).into_response(),
        Err(e) => internal(&e),
    }
}

async fn not_found() -> Response {
    problem(ErrorCode::NotFound, "no such route on the fake processor")
}

async fn list_charges(State(p): State<Processor>) -> Response {
    match p.inner.store.list().await {
        Ok(list) => Json(list).into_response(),
        Err(e) => internal(&e),
    }
}

async fn get_charge(State(p): State<Processor>, UrlPath(id): UrlPath<String>) -> Response {
    match p.inner.store.get(&id).await {
        Ok(Some(charge)) => Json(charge).into_response(),
        Ok(None) => problem(ErrorCode::NotFound, format!("no charge {id:?}")),
        Err(e) => internal(&e),
    }
}

async fn get_control(State(p): State<Processor>) -> Json<ControlState> {
    Json(p.inner.control.state())
}

async fn set_control(State(p): State<Processor>, body: Bytes) -> Response {
    let req: ControlRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return problem(ErrorCode::MalformedBody, e.to_string()),
    };
    match req.behavior() {
        Ok(behavior) => {
            tracing::info!(?req, "control period set");
            Json(p.inner.control.set(&req, behavior)).into_response()
        }
        Err(e) => problem(ErrorCode::ValidationFailed, e.to_string()),
    }
}

async fn reset_control(State(p): State<Processor>) -> Json<ControlState> {
    tracing::info!("control period reset");
    Json(p.inner.control.reset())
}

/// `POST /charges`.
///
/// The work runs on its own task because hyper drops a handler's future
/// when the caller hangs up, and a real processor does not abandon a charge
/// half-way because its client timed out. Only the `slow` delay, which comes
/// after the outcome is recorded, is cut short by a disconnect.
async fn create_charge(State(p): State<Processor>, headers: HeaderMap, body: Bytes) -> Response {
    let (response, delay_ms) = match tokio::spawn(handle_charge(p, headers, body)).await {
        Ok(done) => done,
        Err(join) => {
            tracing::error!(error = %join, "charge task failed");
            let err = Error::Io(std::io::Error::other(join));
            (internal(&err), 0)
        }
    };
    if delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    }
    response
}

/// The charge itself, returning the answer and the delay to apply. Order
/// matters and is part of this double's contract: key, then the call count
/// (so every call with a valid key is counted), then the behaviour, then the
/// body, then the atomic claim.
async fn handle_charge(p: Processor, headers: HeaderMap, body: Bytes) -> (Response, u64) {
    let key = match IdempotencyKey::from_header_values(
        headers
            .get_all(IDEMPOTENCY_KEY)
            .iter()
            .map(|v| v.as_bytes()),
    ) {
        Ok(k) => k,
        Err(idem_spec::Error::KeyMissing) => {
            let detail = "POST /charges requires an Idempotency-Key header";
            return (problem(ErrorCode::IdempotencyKeyMissing, detail), 0);
        }
        Err(e) => return (problem(ErrorCode::IdempotencyKeyInvalid, e.to_string()), 0),
    };
    let calls = match p.inner.store.count_call(key.as_str()).await {
        Ok(n) => n,
        Err(e) => return (internal(&e), 0),
    };
    let behavior = match headers.get(BEHAVIOR_HEADER) {
        None => p.inner.control.take(),
        Some(v) => match v
            .to_str()
            .map_err(|_| Error::InvalidBehavior("not visible ASCII".into()))
            .and_then(Behavior::parse_header)
        {
            Ok(b) => b,
            Err(e) => return (problem(ErrorCode::ValidationFailed, e.to_string()), 0),
        },
    };
    tracing::info!(key = %key, calls, behavior = %behavior, "charge call");
    (
        charge_outcome(&p, &key, behavior, &body).await,
        behavior.delay_ms,
    )
}

async fn charge_outcome(
    p: &Processor,
    key: &IdempotencyKey,
    behavior: Behavior,
    body: &[u8],
) -> Response {
    if behavior.fault == Some(Fault::Unavailable) {
        return (
            [(RETRY_AFTER, RETRY_AFTER_SECS)],
            problem(
                ErrorCode::UpstreamUnavailable,
                "the fake processor was told to be unavailable; nothing was recorded",
            ),
        )
            .into_response();
    }
    let req: ChargeRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return problem(ErrorCode::MalformedBody, e.to_string()),
    };
    if req.amount <= 0 {
        return problem(
            ErrorCode::ValidationFailed,
            "amount must be a positive integer",
        );
    }
    if req.currency.len() != 3 || !req.currency.bytes().all(|b| b.is_ascii_alphabetic()) {
        return problem(
            ErrorCode::ValidationFailed,
            "currency must be three ASCII letters",
        );
    }
    // Re-serialising the parsed request makes the fingerprint ignore key
    // order, whitespace and an explicit `null` for an absent field.
    let canonical = match serde_json::to_vec(&req) {
        Ok(v) => v,
        Err(e) => return problem(ErrorCode::InternalError, e.to_string()),
    };
    let fingerprint =
        Fingerprint::compute("POST", "/charges", Some("application/json"), &canonical).to_hex();
    let declined = behavior.fault == Some(Fault::Decline);
    let candidate = Charge {
        id: format!("ch_{}", uuid::Uuid::new_v4().simple()),
        idempotency_key: key.as_str().to_owned(),
        amount: req.amount,
        currency: req.currency,
        source: req.source,
        description: req.description,
        status: if declined {
            ChargeStatus::Declined
        } else {
            ChargeStatus::Succeeded
        },
        failure_code: declined.then(|| DECLINE_CODE.to_owned()),
        created_at: now_micros(),
    };
    match p.inner.store.claim(&candidate, &fingerprint).await {
        Ok(Claim::Created(charge)) => {
            tracing::info!(key = %key, id = %charge.id, status = charge.status.as_str(), "charge created");
            charge_response(charge, false)
        }
        Ok(Claim::Existing {
            charge,
            fingerprint: stored,
        }) if stored == fingerprint => charge_response(charge, true),
        Ok(Claim::Existing { .. }) => problem(
            ErrorCode::IdempotencyKeyMismatch,
            format!("key {key} was first used with a different charge request"),
        ),
        Err(e) => internal(&e),
    }
}

/// 201 / 200-replayed for a success, 402 for a decline, both carrying the charge.
fn charge_response(charge: Charge, replayed: bool) -> Response {
    let status = match (charge.status, replayed) {
        (ChargeStatus::Declined, _) => StatusCode::PAYMENT_REQUIRED,
        (ChargeStatus::Succeeded, false) => StatusCode::CREATED,
        (ChargeStatus::Succeeded, true) => StatusCode::OK,
    };
    let location = HeaderValue::from_str(&format!("/charges/{}", charge.id)).ok();
    let mut response = (status, Json(charge)).into_response();
    if let Some(location) = location {
        response.headers_mut().insert(header::LOCATION, location);
    }
    if replayed {
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

/// Now, truncated to microseconds: what the database round-trips exactly.
fn now_micros() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
}
