//! A scripted HTTP server on 127.0.0.1:0 for the middleware tests.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use idem_spec::headers::IDEMPOTENCY_KEY;
use idem_spec::problem::PROBLEM_CONTENT_TYPE;
use idem_spec::{ErrorCode, Profile};

/// The `retryable` member the contract gives `code` (in any profile's spelling), as a server
/// following it would send it; false for a code the contract does not know.
pub fn contract_retryable(code: &str) -> bool {
    ErrorCode::ALL
        .iter()
        .any(|c| c.retryable() && Profile::ALL.iter().any(|p| c.wire_code(*p) == code))
}

/// One scripted answer: status, optional Retry-After, optional problem code.
#[derive(Clone)]
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<&'static str>,
    pub code: Option<&'static str>,
}

pub fn answer(status: u16) -> Answer {
    Answer {
        status,
        retry_after: None,
        code: None,
    }
}

#[derive(Default)]
pub struct Script {
    pub answers: Vec<Answer>,
    /// The `Idempotency-Key` of every request received, in order.
    pub seen_keys: Vec<Option<String>>,
    /// The `Attempt-Count` header of every request received, in order.
    pub seen_attempts: Vec<Option<String>>,
    /// The `Request-Deadline-Ms` header of every request received, in order.
    pub seen_deadlines: Vec<Option<String>>,
}

pub type Shared = Arc<Mutex<Script>>;

async fn handler(State(script): State<Shared>, headers: HeaderMap) -> Response {
    let mut s = script.lock().expect("script lock");
    let key = headers
        .get(IDEMPOTENCY_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    s.seen_keys.push(key);
    let attempt = headers
        .get("attempt-count")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    s.seen_attempts.push(attempt);
    let deadline = headers
        .get(idem_spec::headers::REQUEST_DEADLINE_MS)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    s.seen_deadlines.push(deadline);
    let a = if s.answers.is_empty() {
        answer(200)
    } else {
        s.answers.remove(0)
    };
    let status = StatusCode::from_u16(a.status).expect("valid status");
    let mut resp = match a.code {
        Some(code) => (
            status,
            [("content-type", PROBLEM_CONTENT_TYPE)],
            serde_json::json!({
                "type": format!("https://idemkit.dev/book/errors.html#{code}"),
                "title": "scripted", "status": a.status, "code": code,
                "retryable": contract_retryable(code)
            })
            .to_string(),
        )
            .into_response(),
        None => (status, r#"{"id":"ord_1"}"#).into_response(),
    };
    if let Some(ra) = a.retry_after {
        resp.headers_mut()
            .insert("retry-after", ra.parse().expect("header value"));
    }
    resp
}

/// Starts the scripted server; returns its base URL and the shared script.
pub async fn serve(answers: Vec<Answer>) -> (String, Shared) {
    let script: Shared = Arc::new(Mutex::new(Script {
        answers,
        ..Script::default()
    }));
    let app = Router::new()
        .route("/orders", any(handler))
        .with_state(script.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        axum::serve(listener, app).await.expect("server runs");
    });
    (format!("http://{addr}/orders"), script)
}
