//! The kit's HTTP client: every request goes through here, so the safety
//! limits (request rate, side-effect budget) hold for every case, and every
//! request can be rendered as a `curl` reproduction with secrets redacted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_spec::headers::IDEMPOTENT_REPLAYED;
use serde_json::Value;
use tokio::sync::{Barrier, Mutex};

use crate::Error;
use crate::server::sign::Signer;

/// One request, fully formed, so it can be sent, re-sent and rendered.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Request {
    /// HTTP method.
    pub method: String,
    /// Absolute URL.
    pub url: String,
    /// Header fields in order; values are raw bytes so invalid keys can be sent.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Body bytes, if any.
    pub body: Option<Vec<u8>>,
    /// Whether the request may cause a side effect (counts against the budget).
    pub state_changing: bool,
    /// The caller whose signature the client adds as the request leaves
    /// (manifest `callers[].signing`); each send is signed afresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_by: Option<String>,
}

impl Request {
    /// Adds a header with a text value.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers
            .push((name.to_owned(), value.as_bytes().to_vec()));
        self
    }

    /// Removes every header called `name`.
    pub fn without_header(mut self, name: &str) -> Self {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self
    }

    /// Replaces (or sets) the JSON body.
    pub fn json_body(mut self, body: &Value) -> Self {
        self.body = Some(body.to_string().into_bytes());
        self
    }
}

/// A response as the kit keeps it: status, headers and the exact body bytes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Response {
    /// HTTP status.
    pub status: u16,
    /// Header fields (lower-case names), values as text (lossy).
    pub headers: Vec<(String, String)>,
    /// Exact body bytes.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of a header.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether the response says it is a replay (`Idempotent-Replayed: true`).
    pub fn replayed(&self) -> bool {
        self.header(IDEMPOTENT_REPLAYED)
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    }

    /// The body as JSON, when it is JSON.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The problem document's `code`, when the body has one.
    pub fn code(&self) -> Option<String> {
        self.code_at("/code")
    }

    /// The error code at a JSON pointer (`/code`, `/error/code`), as text.
    pub fn code_at(&self, pointer: &str) -> Option<String> {
        match self.json()?.pointer(pointer)? {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }

    /// A short human rendering: `201 Idempotent-Replayed: true`,
    /// `409 code=...`, or an error's body when it has no code. Any header
    /// naming a replay is shown, whatever its spelling, so narratives read
    /// right in every dialect.
    pub fn summary(&self) -> String {
        let mut s = self.status.to_string();
        for (n, v) in &self.headers {
            if n.to_ascii_lowercase().contains("replayed") {
                s.push_str(&format!(" {}: {v}", display_header(n)));
            }
        }
        if let Some(c) = self.code() {
            s.push_str(&format!(" code={c}"));
        } else if self.status >= 400 && !self.body.is_empty() {
            let text = one_line(&String::from_utf8_lossy(&self.body));
            let short: String = text.chars().take(60).collect();
            let more = if text.chars().count() > 60 { "…" } else { "" };
            s.push_str(&format!(" {short}{more}"));
        }
        if let Some(v) = self.header("retry-after") {
            s.push_str(&format!(" Retry-After: {v}"));
        }
        s
    }

    /// Status and body identical: the comparison a replay must pass.
    pub fn same_outcome(&self, other: &Response) -> bool {
        self.status == other.status && self.body == other.body
    }

    /// Status and body the same document: identical bytes, or JSON bodies
    /// equal as values (members in any order, any whitespace). What a leak
    /// check compares: a store that re-serialises a response still hands
    /// over the other caller's document.
    pub fn same_payload(&self, other: &Response) -> bool {
        self.status == other.status
            && (self.body == other.body
                || matches!((self.json(), other.json()), (Some(a), Some(b)) if a == b))
    }
}

/// Text on one line for a console: HTML tags dropped, every run of
/// whitespace or control characters one space.
pub fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(256));
    let mut in_tag = false;
    let looks_html = text.trim_start().starts_with('<');
    let mut space = false;
    for c in text.chars() {
        if looks_html && c == '<' {
            in_tag = true;
            continue;
        }
        if in_tag {
            in_tag = c != '>';
            if !in_tag && !out.is_empty() {
                space = true;
            }
            continue;
        }
        if c.is_whitespace() || c.is_control() {
            space = !out.is_empty();
            continue;
        }
        if space {
            out.push(' ');
            space = false;
        }
        out.push(c);
    }
    out
}

/// `idempotent-replayed` → `Idempotent-Replayed`.
fn display_header(lower: &str) -> String {
    lower
        .split('-')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// Why a request produced no response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The request timed out: it may or may not have taken effect.
    Timeout(String),
    /// The connection broke after the request may have been sent: the kit
    /// cannot know whether the target acted.
    Transport(String),
    /// No connection could be made: nothing was sent (a harness or network
    /// problem, not a verdict about the target).
    Connect(String),
    /// The side-effect budget would be exceeded; nothing was sent.
    Budget(u64),
    /// The request could not be formed.
    Harness(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Timeout(s) => write!(f, "timed out: {s}"),
            Self::Transport(s) => write!(f, "transport error: {s}"),
            Self::Connect(s) => write!(f, "could not connect: {s}"),
            Self::Budget(b) => write!(
                f,
                "the side-effect budget (limits.max_side_effects = {b}) is spent; not sent"
            ),
            Self::Harness(s) => write!(f, "harness: {s}"),
        }
    }
}

/// Result of one send.
pub type Sent = Result<Response, Failure>;

/// Token bucket over request starts; bursts up to `capacity` so the
/// concurrency gate can release its requests together.
#[derive(Debug)]
struct RateLimit {
    per_sec: f64,
    capacity: f64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimit {
    async fn acquire(&self, n: u32) {
        let n = f64::from(n).min(self.capacity);
        // Bounded: each round either takes the tokens or waits exactly for
        // the deficit to refill, so two rounds suffice unless contended.
        for _ in 0..10_000 {
            let wait = {
                let mut st = self.state.lock().await;
                let now = Instant::now();
                st.0 = (st.0 + now.duration_since(st.1).as_secs_f64() * self.per_sec)
                    .min(self.capacity);
                st.1 = now;
                if st.0 >= n {
                    st.0 -= n;
                    return;
                }
                (n - st.0) / self.per_sec
            };
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
    }
}

/// The limited, counting client shared by a run.
#[derive(Debug, Clone)]
pub struct Client {
    /// The pool in use and its generation; replaced by a fresh one after a
    /// 5xx or a broken connection (see [`Client::fresh_pool`]).
    inner: Arc<std::sync::RwLock<Pool>>,
    timeout: Duration,
    rate: Arc<RateLimit>,
    budget: u64,
    effects: Arc<AtomicU64>,
    /// The share of one case (and its view of the client), when counted.
    case_effects: Option<Arc<AtomicU64>>,
    requests: Arc<AtomicU64>,
    secrets: Arc<BTreeSet<String>>,
    signers: Arc<BTreeMap<String, Signer>>,
}

impl Client {
    /// Builds a client with the manifest's limits. `secret_headers` names
    /// the headers whose values are redacted in reproductions.
    pub fn new(
        timeout: Duration,
        requests_per_second: u32,
        burst: u32,
        max_side_effects: u64,
        secret_headers: impl IntoIterator<Item = String>,
    ) -> Result<Self, Error> {
        let inner = build(timeout).map_err(|e| Error::Http(e.to_string()))?;
        let per_sec = f64::from(requests_per_second.max(1));
        let capacity = per_sec.max(f64::from(burst) + 4.0);
        Ok(Self {
            inner: Arc::new(std::sync::RwLock::new(Pool {
                client: inner,
                generation: 0,
                retired_by_5xx: 0,
            })),
            timeout,
            rate: Arc::new(RateLimit {
                per_sec,
                capacity,
                state: Mutex::new((capacity, Instant::now())),
            }),
            budget: max_side_effects,
            effects: Arc::new(AtomicU64::new(0)),
            case_effects: None,
            requests: Arc::new(AtomicU64::new(0)),
            secrets: Arc::new(
                secret_headers
                    .into_iter()
                    .map(|h| h.to_ascii_lowercase())
                    .collect(),
            ),
            signers: Arc::new(BTreeMap::new()),
        })
    }

    /// The same client signing the requests of the named callers.
    pub fn with_signers(mut self, signers: BTreeMap<String, Signer>) -> Self {
        self.signers = Arc::new(signers);
        self
    }

    /// The connection pool requests go out on now, and its generation.
    fn pool(&self) -> (reqwest::Client, u64) {
        let p = self
            .inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        (p.client.clone(), p.generation)
    }

    /// Whether the pool of `generation` (or a later one) was retired
    /// because a request on it was answered with a 5xx.
    fn retired_by_5xx(&self, generation: u64) -> bool {
        self.inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retired_by_5xx
            > generation
    }

    /// Starts a fresh connection pool: the connections the old one holds
    /// are never used again. Called after a 5xx or a broken connection,
    /// since many servers close a connection after an error without saying
    /// `Connection: close`, and the next request sent on it would get no
    /// answer through no fault of the case.
    pub fn fresh_pool(&self) {
        self.retire(false);
    }

    fn retire(&self, after_5xx: bool) {
        if let Ok(c) = build(self.timeout) {
            let mut p = self
                .inner
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            p.client = c;
            p.generation += 1;
            if after_5xx {
                p.retired_by_5xx = p.generation;
            }
        }
    }

    /// State-changing requests sent so far.
    pub fn effects_used(&self) -> u64 {
        self.effects.load(Ordering::SeqCst)
    }

    /// Requests sent so far.
    pub fn requests_sent(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }

    /// The declared side-effect budget.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// The same client (limits, pool, budget) counting one case's share
    /// of the budget apart.
    pub fn for_case(&self) -> Client {
        Client {
            case_effects: Some(Arc::new(AtomicU64::new(0))),
            ..self.clone()
        }
    }

    /// State-changing requests sent through this case's view.
    pub fn case_effects_used(&self) -> u64 {
        self.case_effects
            .as_ref()
            .map_or(0, |c| c.load(Ordering::SeqCst))
    }

    /// Reserves `n` side effects, or refuses without reserving any.
    fn reserve(&self, n: u64) -> Result<(), Failure> {
        self.effects
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                (used + n <= self.budget).then_some(used + n)
            })
            .map(|_| ())
            .map_err(|_| Failure::Budget(self.budget))?;
        if let Some(c) = &self.case_effects {
            c.fetch_add(n, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Sends one request under the limits. A read-only GET (a probe) that
    /// meets a broken connection is sent once more on a fresh one: it
    /// changes nothing, and a connection the server closed after an error
    /// says nothing about the target's idempotency.
    pub async fn send(&self, req: &Request) -> Sent {
        if req.state_changing {
            self.reserve(1)?;
        }
        self.rate.acquire(1).await;
        let sent = self.send_now(req).await;
        if !req.state_changing
            && req.method.eq_ignore_ascii_case("GET")
            && matches!(sent, Err(Failure::Transport(_)))
        {
            self.rate.acquire(1).await;
            return self.send_now(req).await;
        }
        sent
    }

    /// Opens up to `n` pooled connections to `url`'s host by sending `n`
    /// concurrent GETs to `url` (answers are ignored), so a following burst
    /// does not spend its first milliseconds on TCP handshakes and its
    /// requests reach the target closer together.
    pub async fn warm(&self, url: &str, n: usize) {
        self.rate.acquire(n as u32).await;
        let barrier = Arc::new(Barrier::new(n));
        let mut tasks = Vec::with_capacity(n);
        for _ in 0..n {
            let (inner, _) = self.pool();
            let url = url.to_owned();
            let barrier = barrier.clone();
            let requests = self.requests.clone();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                requests.fetch_add(1, Ordering::SeqCst);
                if let Ok(r) = inner.get(&url).send().await {
                    let _ = r.bytes().await;
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    }

    /// Sends every request at once: budget and rate are taken for the whole
    /// burst first, then all tasks wait at one barrier and are released
    /// together. Results come back in request order.
    pub async fn burst(&self, reqs: Vec<Request>) -> Vec<Sent> {
        let changing = reqs.iter().filter(|r| r.state_changing).count() as u64;
        if let Err(f) = self.reserve(changing) {
            return reqs.iter().map(|_| Err(f.clone())).collect();
        }
        self.rate.acquire(reqs.len() as u32).await;
        let barrier = Arc::new(Barrier::new(reqs.len()));
        let mut tasks = Vec::with_capacity(reqs.len());
        for req in reqs {
            let me = self.clone();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                me.send_now(&req).await
            }));
        }
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(
                t.await
                    .unwrap_or_else(|e| Err(Failure::Harness(e.to_string()))),
            );
        }
        out
    }

    /// Sends `req` on the pool in use. A request that broke on a pool
    /// retired while it was out because another request on it was answered
    /// with a 5xx is sent once more on the fresh pool: it may have gone out
    /// on the very connection the kit had stopped trusting, one a server
    /// closes after an error without saying so, which says nothing about
    /// the target's idempotency. The resend is the same request with the
    /// same key (what any client's retry is), counted against the budget
    /// like the first. A pool retired for a broken connection triggers no
    /// resend (a crash is what some cases cause on purpose), nor does a
    /// body that breaks after its status arrived (the target answered).
    async fn send_now(&self, req: &Request) -> Sent {
        self.send_now_from(req, self.pool()).await
    }

    /// [`Client::send_now`] with the first attempt on `pool` (a pool and
    /// its generation, maybe retired since it was taken).
    async fn send_now_from(
        &self,
        req: &Request,
        (pool, generation): (reqwest::Client, u64),
    ) -> Sent {
        let resp = match self.send_head(req, &pool).await {
            Err(Failure::Transport(why)) if self.retired_by_5xx(generation) => {
                if req.state_changing && self.reserve(1).is_err() {
                    return Err(Failure::Transport(why));
                }
                tracing::debug!(
                    url = %req.url,
                    "sent again on a fresh connection: the first went out on a retired pool ({why})"
                );
                self.send_head(req, &self.pool().0).await?
            }
            head => head?,
        };
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let body = resp.bytes().await.map_err(classify)?.to_vec();
        Ok(Response {
            status,
            headers,
            body,
        })
    }

    /// Sends `req` on `pool` up to its status line and headers, retiring
    /// the pool after a 5xx or a broken connection.
    async fn send_head(
        &self,
        req: &Request,
        pool: &reqwest::Client,
    ) -> Result<reqwest::Response, Failure> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let method = reqwest::Method::from_bytes(req.method.as_bytes())
            .map_err(|e| Failure::Harness(e.to_string()))?;
        let mut b = pool.request(method, &req.url);
        let signed;
        let mut fields = &req.headers;
        if let Some(who) = &req.signed_by {
            let signer = self.signers.get(who).ok_or_else(|| {
                Failure::Harness(format!("caller {who:?} signs requests but has no signer"))
            })?;
            let mut h = req.headers.clone();
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            signer.sign(&mut h, req.body.as_deref().unwrap_or_default(), now);
            signed = h;
            fields = &signed;
        }
        let mut headers = reqwest::header::HeaderMap::new();
        for (name, value) in fields {
            let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| Failure::Harness(format!("header name {name:?}: {e}")))?;
            let value = reqwest::header::HeaderValue::from_bytes(value)
                .map_err(|e| Failure::Harness(format!("header value for {name}: {e}")))?;
            headers.append(name, value);
        }
        b = b.headers(headers);
        if let Some(body) = &req.body {
            b = b.body(body.clone());
        }
        match b.send().await {
            Ok(r) => {
                if r.status().as_u16() >= 500 {
                    self.retire(true);
                }
                Ok(r)
            }
            Err(e) => {
                self.fresh_pool();
                Err(classify(e))
            }
        }
    }

    /// A `curl` command reproducing `req`, with secret header values
    /// replaced by `<redacted>`.
    pub fn curl(&self, req: &Request) -> String {
        curl(req, &self.secrets)
    }
}

/// A connection pool and its place in the sequence of pools a run used.
#[derive(Debug)]
struct Pool {
    client: reqwest::Client,
    /// Bumped each time a pool is retired.
    generation: u64,
    /// The generation of the newest pool started because of a 5xx.
    retired_by_5xx: u64,
}

fn build(timeout: Duration) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .timeout(timeout)
        .pool_max_idle_per_host(256)
        .build()
}

fn classify(e: reqwest::Error) -> Failure {
    if e.is_timeout() {
        Failure::Timeout(e.to_string())
    } else if e.is_connect() {
        Failure::Connect(e.to_string())
    } else {
        Failure::Transport(format!(
            "{e} ({:?})",
            std::error::Error::source(&e).map(|s| s.to_string())
        ))
    }
}

/// Renders a request as a `curl` command; header values named in `secrets`
/// (lower-case) are redacted.
pub fn curl(req: &Request, secrets: &BTreeSet<String>) -> String {
    let mut s = format!("curl -sS -i -X {} {}", req.method, shell_quote(&req.url));
    for (name, value) in &req.headers {
        let shown = if secrets.contains(&name.to_ascii_lowercase()) {
            "<redacted>".to_owned()
        } else {
            String::from_utf8_lossy(value).into_owned()
        };
        s.push_str(&format!(" -H {}", shell_quote(&format!("{name}: {shown}"))));
    }
    if let Some(body) = &req.body {
        s.push_str(&format!(
            " --data-binary {}",
            shell_quote(&String::from_utf8_lossy(body))
        ));
    }
    if let Some(who) = &req.signed_by {
        // The signature covers a timestamp the receiver checks against its
        // clock, so a printed one would be stale by the time it is read.
        s.push_str(&format!(
            "  # signed as {who:?} when sent: add a fresh signature (webhook-timestamp, webhook-signature) to replay"
        ));
    }
    s
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_stay_on_one_line_and_leaks_compare_documents() {
        let html = Response {
            status: 502,
            headers: vec![],
            body: b"<html>\n<head><title>502 Bad Gateway</title></head>\r\n<body>\n<h1>Bad\tGateway</h1></body></html>".to_vec(),
        };
        let s = html.summary();
        assert!(
            !s.contains('\n') && !s.contains('\r') && !s.contains('<'),
            "{s}"
        );
        assert!(s.starts_with("502 502 Bad Gateway Bad Gateway"), "{s}");
        let a = Response {
            status: 201,
            headers: vec![],
            body: br#"{"id":"o1","amount":5}"#.to_vec(),
        };
        let b = Response {
            body: br#"{ "amount": 5, "id": "o1" }"#.to_vec(),
            ..a.clone()
        };
        assert!(
            !a.same_outcome(&b) && a.same_payload(&b),
            "members in another order"
        );
        let c = Response {
            body: br#"{"id":"o2","amount":5}"#.to_vec(),
            ..a.clone()
        };
        assert!(!a.same_payload(&c));
        assert_eq!(a.code_at("/id").as_deref(), Some("o1"));
    }

    #[test]
    fn curl_redacts_secret_headers_and_quotes_safely() {
        let req = Request {
            method: "POST".into(),
            url: "http://127.0.0.1:1/v1/transfers".into(),
            headers: vec![
                ("Authorization".into(), b"Bearer s3cret".to_vec()),
                ("Idempotency-Key".into(), b"run-1'x".to_vec()),
            ],
            body: Some(br#"{"a":1}"#.to_vec()),
            state_changing: true,
            signed_by: None,
        };
        let secrets: BTreeSet<String> = ["authorization".to_owned()].into();
        let c = curl(&req, &secrets);
        assert!(!c.contains("s3cret"), "{c}");
        assert!(c.contains("'Authorization: <redacted>'"), "{c}");
        assert!(c.contains(r"'Idempotency-Key: run-1'\''x'"), "{c}");
        assert!(c.contains(r#"--data-binary '{"a":1}'"#), "{c}");
    }

    #[tokio::test]
    async fn budget_refuses_before_sending() {
        let c = Client::new(Duration::from_secs(1), 100, 4, 1, []).expect("client");
        // Port 9 (discard) on loopback: nothing listens, but the budget
        // check comes first, so the second request never reaches the network.
        let req = Request {
            method: "POST".into(),
            url: "http://127.0.0.1:9/x".into(),
            headers: vec![],
            body: None,
            state_changing: true,
            signed_by: None,
        };
        let first = c.send(&req).await;
        assert!(matches!(first, Err(Failure::Connect(_))), "{first:?}");
        assert_eq!(c.send(&req).await, Err(Failure::Budget(1)));
        assert_eq!(c.effects_used(), 1);
        assert_eq!(c.requests_sent(), 1);
        let burst = c.burst(vec![req.clone(), req]).await;
        assert!(burst.iter().all(|r| *r == Err(Failure::Budget(1))));
    }

    /// A request that went out on a pool retired meanwhile after another
    /// request's 5xx, on the very connection that carried the 5xx to a
    /// server that closes such connections without saying so, is sent once
    /// more on a fresh connection and gets its answer.
    #[tokio::test]
    async fn a_request_on_a_pool_retired_by_a_5xx_is_resent_on_a_fresh_one() {
        let zoo = idem_zoo::spawn(idem_zoo::ZooConfig {
            dialect: idem_zoo::Dialect::Reference,
            defect: None,
            delay: Duration::ZERO,
            quirk: Some(idem_zoo::Quirk::ResetAfterServerError),
        })
        .await
        .expect("zoo");
        let client = Client::new(Duration::from_secs(5), 1000, 4, 10, []).expect("client");
        let order = |key: &str, amount: i64, marker: &str| Request {
            method: "POST".into(),
            url: format!("{}{}", zoo.base_url, idem_zoo::ORDERS_PATH),
            headers: vec![
                (
                    "Authorization".into(),
                    idem_zoo::CALLERS[0].1.as_bytes().to_vec(),
                ),
                ("Content-Type".into(), b"application/json".to_vec()),
                ("Idempotency-Key".into(), key.as_bytes().to_vec()),
            ],
            body: Some(format!(r#"{{"amount":{amount},"marker":"{marker}"}}"#).into_bytes()),
            state_changing: true,
            signed_by: None,
        };
        // Taken before the 5xx, as by a request another case had under way.
        let stale = client.pool();
        let failed = client
            .send(&order("k-5xx", idem_zoo::SERVER_ERROR_AMOUNT, "m-5xx"))
            .await
            .expect("an answer");
        assert_eq!(failed.status, 500);
        // The stale pool's one idle connection is the one that carried the
        // 500: the zoo reads the next request on it and closes it unanswered.
        client.reserve(1).expect("budget, as `send` takes it");
        let sent = client
            .send_now_from(&order("k-next", 7, "m-next"), stale)
            .await;
        let r = sent.expect("answered on a fresh connection");
        assert_eq!(r.status, 201, "{}", r.summary());
        assert_eq!(client.effects_used(), 3, "the resend is counted");
        zoo.shutdown().await;
    }
}
