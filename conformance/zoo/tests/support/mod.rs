//! A small HTTP client for the zoo tests: posts orders as a caller and reads
//! the probes.

#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_zoo::{Defect, Dialect, Zoo, ZooConfig};
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

/// One answer, kept whole so replays can be compared byte for byte.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("the zoo answers JSON")
    }
}

/// A run-unique marker, so tests sharing nothing still never read each
/// other's effects.
pub fn marker(name: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("{name}-{}", N.fetch_add(1, Ordering::Relaxed))
}

pub fn order(amount: i64, marker: &str) -> Value {
    json!({"amount": amount, "marker": marker})
}

/// A zoo and a client pointed at it.
pub struct Target {
    pub zoo: Zoo,
    pub http: reqwest::Client,
}

impl Target {
    pub async fn start(dialect: Dialect, defect: Option<Defect>, delay_ms: u64) -> Self {
        let zoo = idem_zoo::spawn(ZooConfig {
            dialect,
            defect,
            delay: Duration::from_millis(delay_ms),
            quirk: None,
        })
        .await
        .expect("zoo starts");
        Self::on(zoo)
    }

    pub fn on(zoo: Zoo) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("client builds");
        Self { zoo, http }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.zoo.base_url)
    }

    /// `POST /v1/orders` as `caller` (alice, bob, or anything for a bad token).
    pub async fn post(&self, caller: &str, key: Option<&str>, body: &Value) -> Answer {
        let mut req = self
            .http
            .post(self.url("/v1/orders"))
            .header("Authorization", format!("Bearer zoo-{caller}"))
            .header("Content-Type", "application/json")
            .body(body.to_string());
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        answer(req.send().await.expect("POST reaches the zoo")).await
    }

    pub async fn send(&self, method: reqwest::Method, path: &str) -> Answer {
        let req = self
            .http
            .request(method, self.url(path))
            .header("Authorization", "Bearer zoo-alice");
        answer(req.send().await.expect("request reaches the zoo")).await
    }

    /// Orders created for `marker`, across callers.
    pub async fn effects(&self, marker: &str) -> u64 {
        self.count(&format!("/v1/orders?marker={marker}")).await
    }

    /// Handler runs for `marker`, whatever their outcome.
    pub async fn executions(&self, marker: &str) -> u64 {
        self.count(&format!("/_zoo/executions?marker={marker}"))
            .await
    }

    async fn count(&self, path: &str) -> u64 {
        let a = self.send(reqwest::Method::GET, path).await;
        assert_eq!(a.status, 200, "probe {path} answers 200");
        a.json()["count"].as_u64().expect("probe has a count")
    }
}

pub async fn answer(resp: reqwest::Response) -> Answer {
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.bytes().await.expect("body reads").to_vec();
    Answer {
        status,
        headers,
        body,
    }
}

/// Asserts `replay` is `first` again: status, body bytes and the stored
/// headers.
pub fn assert_verbatim(first: &Answer, replay: &Answer, context: &str) {
    assert_eq!(replay.status, first.status, "{context}: status");
    assert_eq!(replay.body, first.body, "{context}: body bytes");
    for name in ["content-type", "location", "etag"] {
        assert_eq!(replay.header(name), first.header(name), "{context}: {name}");
    }
}
