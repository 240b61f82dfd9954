//! [`Incoming`]: what the engine knows about a request once it has read it
//! (caller, key, fingerprint, `Prefer: wait`, armed failpoints), and the
//! [`Pulse`] its lease heartbeat reads.
//!
//! Everything here happens before the claim and touches no store, so a
//! request refused here does not consume its key (clause
//! `idem.failure.unclaimed`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, header};
use idem_spec::headers::{
    IDEMPOTENCY_KEY, PREFER, REQUEST_DEADLINE_MS, parse_request_deadline_ms, prefer_wait_secs,
};
use idem_spec::{Fingerprint, IdempotencyKey};
use tokio::time::Instant;

use crate::config::EngineConfig;
use crate::error::{Error, Result};
use crate::failpoint::{FAILPOINT_HEADER, Failpoint};
use crate::key::{Caller, KeyId};
use crate::store::{AbandonedKey, StoredRequest};

/// What the engine knows about a request once it has read it.
#[derive(Debug)]
pub(crate) struct Incoming {
    pub(crate) id: KeyId,
    pub(crate) fingerprint: Fingerprint,
    pub(crate) request: StoredRequest,
    pub(crate) wait: Option<Duration>,
    pub(crate) armed: Vec<Failpoint>,
    /// What the lease heartbeat of this request needs to know.
    pub(crate) pulse: Arc<Pulse>,
    /// When the caller gives up, from its `Request-Deadline-Ms` (clause
    /// `idem.deadline.spent`), measured from the request's arrival.
    pub(crate) caller_deadline: Option<Instant>,
}

/// The caller's deadline for this request, from its `Request-Deadline-Ms`
/// header, as a handler behind [`IdempotencyLayer`](crate::IdempotencyLayer)
/// finds it in the request's extensions
/// (`Option<Extension<RequestDeadline>>`; absent when the caller sent none
/// or sent a value the contract's grammar refuses).
///
/// The engine has already refused to start a request whose deadline was
/// spent (clause `idem.deadline.spent`); the handler's part is to bound
/// its work and every outbound call by [`remaining`](Self::remaining)
/// (`idem.deadline.bound`), e.g. `reqwest`'s `RequestBuilder::timeout` with
/// the smaller of its own timeout and this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestDeadline {
    at: Instant,
}

impl RequestDeadline {
    /// A deadline at `at`.
    pub fn at(at: Instant) -> Self {
        Self { at }
    }

    /// The instant the caller gives up.
    pub fn instant(&self) -> Instant {
        self.at
    }

    /// What is left of it now; zero once it has passed.
    pub fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// Whether it has passed.
    pub fn is_spent(&self) -> bool {
        self.remaining().is_zero()
    }

    /// `limit`, or what is left of the deadline when that is smaller: the
    /// timeout of an outbound call made for the request.
    pub fn bound(&self, limit: Duration) -> Duration {
        self.remaining().min(limit)
    }
}

/// Where an endpoint's requests carry their idempotency key. The default
/// is the contract's `Idempotency-Key` header; a webhook receiver takes the
/// sender's event id instead, from its own header (the Standard Webhooks
/// `webhook-id`) or from the body (Stripe's event `id`). Whatever the
/// source, the key is the contract's (1 to 255 visible ASCII characters),
/// scoped to the [`Caller`] the endpoint's authentication set (for a
/// webhook, the verified sender), and the request is fingerprinted as
/// usual. Set it with [`IdempotencyLayer::key_source`](crate::IdempotencyLayer::key_source).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A request header, read like `Idempotency-Key` (bare or an RFC 8941
    /// sf-string; sent twice is invalid).
    Header(axum::http::HeaderName),
    /// A JSON pointer (RFC 6901) into the request's JSON body, e.g. `/id`;
    /// the value there is a string (or a number, taken as its decimal text).
    BodyPointer(String),
}

impl Default for KeySource {
    fn default() -> Self {
        Self::Header(axum::http::HeaderName::from_static("idempotency-key"))
    }
}

impl KeySource {
    /// Where the key is, for error details: `the Idempotency-Key header`,
    /// `the webhook-id header`, `the body at /id`.
    pub fn describe(&self) -> String {
        match self {
            Self::Header(h) if h.as_str().eq_ignore_ascii_case(IDEMPOTENCY_KEY) => {
                format!("the {IDEMPOTENCY_KEY} header")
            }
            Self::Header(h) => format!("the {h} header"),
            Self::BodyPointer(p) => format!("the JSON body at {p}"),
        }
    }
}

/// The key error for `source`: the contract's own wording for the default
/// header, one that names the source otherwise.
fn key_error(e: idem_spec::Error, source: &KeySource) -> Error {
    match e {
        idem_spec::Error::KeyMissing if *source == KeySource::default() => Error::KeyMissing,
        idem_spec::Error::KeyMissing => Error::KeyMissingAt(source.describe()),
        other => Error::KeyInvalid(other),
    }
}

/// The key at a body pointer: a string, or a number as its text.
fn key_in_body(body: &[u8], source: &KeySource) -> Result<IdempotencyKey> {
    let KeySource::BodyPointer(pointer) = source else {
        return Err(Error::KeyMissingAt(source.describe()));
    };
    let json: serde_json::Value =
        serde_json::from_slice(body).map_err(|_| Error::KeyMissingAt(source.describe()))?;
    let text = match json.pointer(pointer) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Number(n)) => n.to_string(),
        _ => return Err(Error::KeyMissingAt(source.describe())),
    };
    IdempotencyKey::parse(&text).map_err(|e| key_error(e, source))
}

/// Reads `Request-Deadline-Ms` at `arrived`: the first value that parses
/// (a malformed one is ignored, as the header's grammar asks).
fn caller_deadline(headers: &HeaderMap, arrived: Instant) -> Option<Instant> {
    headers
        .get_all(REQUEST_DEADLINE_MS)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(parse_request_deadline_ms)
        .map(|left| arrived + left)
}

impl Incoming {
    /// Reads the request on an idempotent endpoint: caller, key, body
    /// (bounded), fingerprint, `Prefer: wait` and, when `failpoints` is
    /// on, the failpoints it arms.
    pub(crate) async fn read(
        parts: &Parts,
        body: Body,
        config: &EngineConfig,
        failpoints: bool,
    ) -> Result<Self> {
        let arrived = Instant::now();
        let caller = parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or(Error::Unauthenticated)?;
        let source = parts
            .extensions
            .get::<KeySource>()
            .cloned()
            .unwrap_or_default();
        let from_header = match &source {
            KeySource::Header(name) => Some(
                IdempotencyKey::from_header_values(
                    parts
                        .headers
                        .get_all(name)
                        .iter()
                        .map(HeaderValue::as_bytes),
                )
                .map_err(|e| key_error(e, &source))?,
            ),
            KeySource::BodyPointer(_) => None,
        };
        let body = read_body(body, &parts.headers, config.max_body_bytes).await?;
        let key = match from_header {
            Some(key) => key,
            None => key_in_body(&body, &source)?,
        };
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let path = parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned());
        let method = parts.method.as_str().to_owned();
        let fingerprint =
            config
                .fingerprint
                .fingerprint(&method, &path, content_type.as_deref(), &body);
        let wait = prefer_wait_secs(
            parts
                .headers
                .get_all(PREFER)
                .iter()
                .filter_map(|v| v.to_str().ok()),
        )
        .map(|n| Duration::from_secs(n).min(config.max_wait));
        // Without the opt-in the header is not even read.
        let mut armed = Vec::new();
        if failpoints {
            for v in parts.headers.get_all(FAILPOINT_HEADER) {
                let v = v
                    .to_str()
                    .map_err(|_| Error::Failpoint("Idem-Failpoint must be ASCII".into()))?;
                armed.extend(crate::failpoint::parse(v)?);
            }
        }
        Ok(Self {
            id: KeyId::new(caller, key),
            fingerprint,
            request: StoredRequest {
                method,
                path,
                content_type,
                body,
            },
            wait,
            armed,
            pulse: Arc::default(),
            caller_deadline: caller_deadline(&parts.headers, arrived),
        })
    }

    /// The request stored with an abandoned key, as the completer resumes
    /// it: no client waiting, no failpoints.
    pub(crate) fn abandoned(key: &AbandonedKey) -> Self {
        Self {
            id: key.id.clone(),
            fingerprint: key.fingerprint,
            request: key.request.clone(),
            wait: None,
            armed: Vec::new(),
            pulse: Arc::default(),
            caller_deadline: None,
        }
    }
}

/// Buffers the request body (it is fingerprinted and stored), refusing
/// anything over `limit` with 413 before reading it all when the client
/// declared its length.
async fn read_body(body: Body, headers: &HeaderMap, limit: usize) -> Result<Bytes> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(Error::PayloadTooLarge { limit });
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        if e.to_string().contains("length limit") {
            Error::PayloadTooLarge { limit }
        } else {
            Error::MalformedBody(format!("the request body could not be read: {e}"))
        }
    })
}

/// What a request's lease heartbeat reads: whether the key is committed
/// (before that there is no row to renew: the claim is still inside its
/// transaction) and whether a `pause` failpoint stalls the request.
#[derive(Debug, Default)]
pub(crate) struct Pulse {
    committed: AtomicBool,
    stalled: AtomicBool,
}

impl Pulse {
    pub(crate) fn committed(&self) {
        self.committed.store(true, Ordering::Release);
    }

    pub(crate) fn stall(&self, on: bool) {
        self.stalled.store(on, Ordering::Release);
    }

    /// Whether the heartbeat should renew now.
    pub(crate) fn beats(&self) -> bool {
        self.committed.load(Ordering::Acquire) && !self.stalled.load(Ordering::Acquire)
    }
}
