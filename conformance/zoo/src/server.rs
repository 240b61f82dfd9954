//! The HTTP side: the idempotent `POST /v1/orders`, its read-only probes,
//! and each dialect's spelling of every error.
//!
//! Every answer (success, rejection, failure, contract error) is first built
//! as a [`Stored`] response, so what is stored and what is replayed are the
//! same bytes by construction.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idem_spec::fingerprint::Fingerprint;
use idem_spec::headers::IDEMPOTENCY_KEY;
use idem_spec::key::IdempotencyKey;
use idem_spec::problem::{ErrorCode, PROBLEM_CONTENT_TYPE, Problem, Profile};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{Semaphore, watch};

use crate::{
    CALLERS, Defect, EXECUTIONS_PATH, ORDERS_PATH as ORDERS, Quirk, SERVER_ERROR_AMOUNT, ZooConfig,
};

/// The longest a gated handler waits for its release before going on, so a
/// test that forgets to release cannot hang the server.
const GATE_LIMIT: Duration = Duration::from_secs(crate::GATE_LIMIT_SECS);

/// The least time the `race-double-execution` defect leaves between its
/// check and its insert, so the defect shows even with no configured delay.
const RACE_WINDOW: Duration = Duration::from_millis(50);

/// How long the `in-flight-lock-global` defect's lock outlives its request:
/// long enough that the other caller's request, sent right after, meets it
/// even on a machine that stalls for seconds (keys are unique per case, so
/// no other case waits on it).
const LOCK_TTL: Duration = Duration::from_secs(10);

/// The replay window the zoo says on its answers (its manifests declare
/// it). Records are kept for the process's life, so it is never shorter.
const REPLAY_WINDOW: Duration = Duration::from_secs(86_400);

/// The contract's key-expiry header.
const EXPIRES: HeaderName = HeaderName::from_static("idempotency-key-expires");

/// A test hook that holds every handler run after its claim (and after it is
/// counted by `/_zoo/executions`) until the test releases it, so in-flight
/// duplicates can be sent deterministically instead of racing a timer.
#[derive(Clone)]
pub struct Gate(Arc<GateInner>);

struct GateInner {
    entered: watch::Sender<usize>,
    permits: Semaphore,
}

impl Default for Gate {
    fn default() -> Self {
        Self(Arc::new(GateInner {
            entered: watch::Sender::new(0),
            permits: Semaphore::new(0),
        }))
    }
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Waits, at most `limit`, until `n` handler runs in total have reached
    /// the gate. Returns whether they did.
    pub async fn wait_entered(&self, n: usize, limit: Duration) -> bool {
        let mut rx = self.0.entered.subscribe();
        matches!(
            tokio::time::timeout(limit, rx.wait_for(|v| *v >= n)).await,
            Ok(Ok(_))
        )
    }

    /// Lets `n` held (or future) handler runs through.
    pub fn release(&self, n: usize) {
        self.0.permits.add_permits(n);
    }

    async fn pass(&self) {
        self.0.entered.send_modify(|v| *v += 1);
        match tokio::time::timeout(GATE_LIMIT, self.0.permits.acquire()).await {
            Ok(Ok(permit)) => permit.forget(),
            _ => tracing::warn!("zoo gate not released within {GATE_LIMIT:?}; going on"),
        }
    }
}

/// Builds the router; `gate` holds handler runs for tests.
pub(crate) fn build(config: ZooConfig, gate: Option<Gate>) -> Router {
    let shared = Arc::new(Shared {
        config,
        gate,
        inner: Mutex::new(Inner::default()),
        done: watch::Sender::new(0),
        released: watch::Sender::new(0),
        key_locks: Mutex::new(HashMap::new()),
    });
    Router::new()
        .route(ORDERS, get(list_orders).post(create_order))
        .route("/v1/orders/{id}", get(show_order))
        .route(EXECUTIONS_PATH, get(count_executions))
        .route(crate::RELEASE_PATH, post(release_paused))
        .fallback(unknown_route)
        .method_not_allowed_fallback(unsupported_method)
        .layer(middleware::from_fn_with_state(
            shared.clone(),
            refuse_oversized,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(shared)
}

/// The largest request body the zoo reads.
pub const MAX_BODY: usize = 64 * 1024;

/// Refuses a request whose declared `Content-Length` is over [`MAX_BODY`]
/// with 413 at once, before any key is claimed and without waiting for the
/// body (`idem.failure.before-claim`): a client that declared 64 MiB need
/// not send it to learn the answer.
async fn refuse_oversized(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        let mut r = error(s.config, Kind::TooLarge).into_response();
        // The rest of the body is never read: say so, and close.
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return r;
    }
    next.run(req).await
}

/// (caller scope, key name): what one record is stored under.
type Slot = (String, String);

struct Shared {
    config: ZooConfig,
    gate: Option<Gate>,
    inner: Mutex<Inner>,
    /// Bumped whenever a run finishes, so held duplicates (the
    /// `always-wait` quirk) look again.
    done: watch::Sender<u64>,
    /// Bumped by `POST /_zoo/release`: paused requests go on.
    released: watch::Sender<u64>,
    /// Per-key locks of the `no-in-flight-state` quirk.
    key_locks: Mutex<HashMap<Slot, Arc<tokio::sync::Mutex<()>>>>,
}

#[derive(Default)]
struct Inner {
    /// (caller scope, key) → record. The map key is the unique constraint:
    /// inserting under the lock is the atomic claim.
    keys: HashMap<(String, String), Record>,
    /// Effects: every order created.
    orders: Vec<Order>,
    /// Handler runs: (marker, key), one per execution whatever its outcome.
    executions: Vec<(String, String)>,
    /// The `in-flight-lock-global` defect's locks: key → (holder, expiry;
    /// none while its request runs).
    locks: HashMap<String, (String, Option<tokio::time::Instant>)>,
    next_id: u64,
}

enum Record {
    InFlight(Fingerprint),
    /// The outcome, and the caller whose request produced it.
    Complete(Fingerprint, Stored, String),
    /// A 5xx left the key taken (the `server-error-locks-key` defect).
    Failed,
}

#[derive(Clone)]
struct Order {
    id: String,
    amount: i64,
    marker: String,
    caller: String,
    key: String,
}

impl Order {
    fn body(&self) -> Value {
        json!({"id": self.id, "amount": self.amount, "marker": self.marker, "caller": self.caller})
    }
    fn etag(&self) -> String {
        format!("\"{}-1\"", self.id)
    }
}

/// A complete response as stored and replayed.
#[derive(Clone)]
struct Stored {
    status: StatusCode,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
}

impl Stored {
    fn json(status: StatusCode, content_type: &'static str, body: &Value) -> Self {
        Self {
            status,
            headers: vec![(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
            body: Bytes::from(body.to_string()),
        }
    }

    fn with_header(mut self, name: HeaderName, value: &str) -> Self {
        if let Ok(v) = HeaderValue::from_str(value) {
            self.headers.push((name, v));
        }
        self
    }

    fn into_response(self) -> Response {
        let mut response = Response::new(Body::from(self.body));
        *response.status_mut() = self.status;
        for (name, value) in self.headers {
            response.headers_mut().append(name, value);
        }
        response
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn has(&self, defect: Defect) -> bool {
        self.config.defect == Some(defect)
    }

    /// The answer for a key that already has a record, or `None` when the
    /// key is absent and the request may execute.
    fn existing(
        &self,
        inner: &Inner,
        slot: &(String, String),
        fp: Fingerprint,
        caller: &str,
    ) -> Option<Stored> {
        let config = self.config;
        let (stored_fp, stored, owner) = match inner.keys.get(slot)? {
            Record::InFlight(f) => (*f, None, None),
            Record::Complete(f, s, owner) => (*f, Some(s), Some(owner.as_str())),
            // Defect: the key of a failed request stays taken.
            Record::Failed => return Some(error(config, Kind::KeyFailed)),
        };
        if stored_fp != fp && !self.has(Defect::SilentMismatchReplay) {
            let refusal = error(config, Kind::Mismatch);
            // The key's window is the stored outcome's: the refusal says it too.
            let window = stored.and_then(|s| s.headers.iter().find(|(n, _)| *n == EXPIRES));
            return Some(match window {
                Some((n, v)) => {
                    let mut r = refusal;
                    r.headers.push((n.clone(), v.clone()));
                    r
                }
                None => refusal,
            });
        }
        match stored {
            None => Some(error(config, Kind::InUse)),
            // Defect: a completed key is reported as still running, forever.
            Some(_) if self.has(Defect::BrokenReplayAfterCompletion) => {
                Some(error(config, Kind::InUse))
            }
            Some(s) => {
                let out = self.replay(s, &slot.1);
                // Defect: another caller's response, re-serialised.
                if self.has(Defect::LeakReorderedJson) && owner.is_some_and(|o| o != caller) {
                    Some(reordered(out))
                } else {
                    Some(out)
                }
            }
        }
    }

    /// Whether another caller's request holds `slot`'s key (the
    /// `in-flight-lock-global` defect: a lock on the key alone, left to
    /// expire [`LOCK_TTL`] after the request finished).
    fn held_by_other(&self, inner: &Inner, slot: &(String, String)) -> bool {
        self.has(Defect::InFlightLockGlobal)
            && inner.locks.get(&slot.1).is_some_and(|(owner, until)| {
                owner != &slot.0 && until.is_none_or(|t| tokio::time::Instant::now() < t)
            })
    }

    /// Another caller's stored response for the same key, for the
    /// `leak-after-execution` defect.
    fn other_callers_stored(&self, slot: &(String, String)) -> Option<Stored> {
        let inner = self.lock();
        inner.keys.iter().find_map(|((scope, name), r)| match r {
            Record::Complete(_, s, _) if name == &slot.1 && scope != &slot.0 => Some(s.clone()),
            _ => None,
        })
    }

    fn replay(&self, stored: &Stored, key: &str) -> Stored {
        let mut out = stored.clone();
        if self.has(Defect::ReplayHeadersDropped) {
            out.headers
                .retain(|(n, _)| n != header::LOCATION && n != header::ETAG);
            return out;
        }
        // `HeaderName::from_bytes` lower-cases the mixed-case constant.
        match self
            .config
            .dialect
            .replay_marker()
            .and_then(|m| HeaderName::from_bytes(m.as_bytes()).ok())
        {
            Some(marker) => {
                let value = match self.config.quirk {
                    Some(Quirk::MarkerValueOne) => "1",
                    Some(Quirk::MarkerIsKey) => key,
                    _ => "true",
                };
                out.with_header(marker, value)
            }
            None => out,
        }
    }

    /// Stamps an outcome the key keeps (2xx, 4xx) with the end of its
    /// replay window, `Idempotency-Key-Expires`; a 5xx releases the key and
    /// says nothing. Stored with the outcome, so every replay says the same.
    fn with_window(&self, outcome: Stored) -> Stored {
        if outcome.status.is_server_error() {
            return outcome;
        }
        // Defect: the header promises six days more than the window kept.
        let said = if self.has(Defect::ExpiryHeaderLate) {
            REPLAY_WINDOW + Duration::from_secs(6 * 86_400)
        } else {
            REPLAY_WINDOW
        };
        let end = httpdate::fmt_http_date(SystemTime::now() + said);
        outcome.with_header(EXPIRES, &end)
    }

    /// One handler run: counted, delayed, then the body decides the outcome.
    async fn execute(
        &self,
        caller: &str,
        key: &str,
        req: &OrderRequest,
        delay: bool,
        paused: bool,
    ) -> Stored {
        self.lock()
            .executions
            .push((req.marker.clone(), key.to_owned()));
        if delay {
            tokio::time::sleep(self.config.delay).await;
        }
        if let Some(gate) = &self.gate {
            gate.pass().await;
        }
        if paused {
            // Held until the next release; the kit repeats its release
            // until the request answers, so one sent before the pause was
            // reached is not lost.
            let mut released = self.released.subscribe();
            if tokio::time::timeout(GATE_LIMIT, released.changed())
                .await
                .is_err()
            {
                tracing::warn!("zoo pause not released within {GATE_LIMIT:?}; going on");
            }
        }
        if req.amount == SERVER_ERROR_AMOUNT {
            return error(self.config, Kind::Internal);
        }
        if req.amount < 0 {
            return error(self.config, Kind::Rejected);
        }
        let order = {
            let mut inner = self.lock();
            inner.next_id += 1;
            let order = Order {
                id: format!("ord_{}", inner.next_id),
                amount: req.amount,
                marker: req.marker.clone(),
                caller: caller.to_owned(),
                key: key.to_owned(),
            };
            inner.orders.push(order.clone());
            order
        };
        Stored::json(StatusCode::CREATED, "application/json", &order.body())
            .with_header(header::LOCATION, &format!("{ORDERS}/{}", order.id))
            .with_header(header::ETAG, &order.etag())
    }

    /// Stores a final outcome (2xx, 4xx) and releases the key after a 5xx.
    fn finish(&self, slot: (String, String), fp: Fingerprint, outcome: &Stored, caller: &str) {
        let keep = if outcome.status.is_server_error() {
            self.has(Defect::ServerErrorStored)
        } else if outcome.status.is_client_error() {
            !self.has(Defect::ClientErrorReexecuted)
        } else {
            true
        };
        let mut inner = self.lock();
        if self.has(Defect::InFlightLockGlobal) {
            // Defect: the lock is not deleted; it expires.
            let until = tokio::time::Instant::now() + LOCK_TTL;
            inner
                .locks
                .insert(slot.1.clone(), (slot.0.clone(), Some(until)));
        }
        if keep {
            inner.keys.insert(
                slot,
                Record::Complete(fp, outcome.clone(), caller.to_owned()),
            );
        } else if outcome.status.is_server_error() && self.has(Defect::ServerErrorLocksKey) {
            inner.keys.insert(slot, Record::Failed);
        } else {
            inner.keys.remove(&slot);
        }
        drop(inner);
        self.done.send_modify(|n| *n += 1);
    }
}

#[derive(Deserialize)]
struct OrderRequest {
    amount: i64,
    #[serde(default)]
    marker: String,
}

fn caller(headers: &HeaderMap) -> Option<&'static str> {
    let sent = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    CALLERS
        .iter()
        .find(|(_, token)| *token == sent)
        .map(|(name, _)| *name)
}

async fn create_order(
    State(s): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let config = s.config;
    let Some(caller) = caller(&headers) else {
        return error(config, Kind::Unauthenticated).into_response();
    };
    // Quirk: the key is the sender's event id, in its own header.
    let key_header = if config.quirk == Some(Quirk::KeyInWebhookId) {
        "webhook-id"
    } else {
        IDEMPOTENCY_KEY
    };
    let values = headers.get_all(key_header);
    // Quirk: the key is the event's id in the body (Stripe's events).
    let parsed = if config.quirk == Some(Quirk::KeyInBody) {
        serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| {
                v.pointer("/event_id")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .map_or(Err(idem_spec::Error::KeyMissing), |k| {
                IdempotencyKey::parse(&k)
            })
    } else {
        IdempotencyKey::from_header_values(values.iter().map(HeaderValue::as_bytes))
    };
    let key = match parsed {
        Ok(k) => k,
        Err(idem_spec::Error::KeyMissing) => {
            return error(config, Kind::KeyMissing).into_response();
        }
        Err(e) => return error(config, Kind::KeyInvalid(e.to_string())).into_response(),
    };
    // Quirk: only UUID keys, refused as a plain 400 in the library's words.
    if config.quirk == Some(Quirk::UuidKeys) && uuid::Uuid::try_parse(key.as_str()).is_err() {
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "application/json")],
            r#"{"code":"INVALID_UUID_FORMAT","message":"Idempotency-Key must be a UUID"}"#,
        )
            .into_response();
    }
    let req: OrderRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(config, Kind::MalformedBody(e.to_string())).into_response(),
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let target = uri.path_and_query().map_or(ORDERS, |p| p.as_str());
    // Quirk: the trace context is part of what is fingerprinted.
    let fingerprinted: Vec<u8> = if config.quirk == Some(Quirk::FingerprintsTraceparent) {
        let trace = headers
            .get("traceparent")
            .map_or(&b""[..], HeaderValue::as_bytes);
        [&body[..], b"\n", trace].concat()
    } else {
        body.to_vec()
    };
    let fp = Fingerprint::compute("POST", target, content_type, &fingerprinted);
    // Defect: no caller in the slot, so one key names one record for everyone.
    let scope = if s.has(Defect::GlobalKeySpace) || s.has(Defect::LeakReorderedJson) {
        String::new()
    } else {
        caller.to_owned()
    };
    // Defect: the raw header spelling, so `"abc"` and `abc` get two records.
    let name = match values.iter().next() {
        Some(raw) if s.has(Defect::QuotedKeyDistinct) => {
            String::from_utf8_lossy(raw.as_bytes()).trim().to_owned()
        }
        _ => key.as_str().to_owned(),
    };
    let slot = (scope, name);
    let paused = headers
        .get(crate::FAILPOINT_HEADER)
        .is_some_and(|v| v.as_bytes() == crate::PAUSE_VALUE.as_bytes());

    // A new request for a caller whose deadline is spent is not started;
    // a stored outcome is still replayed. Defect: the deadline is ignored.
    if deadline_spent(&headers) && !s.has(Defect::DeadlineIgnored) {
        let seen = {
            let inner = s.lock();
            s.existing(&inner, &slot, fp, caller)
        };
        return seen
            .unwrap_or_else(|| error(config, Kind::DeadlineSpent))
            .into_response();
    }

    // Quirk: no in-flight record; requests with one key take turns.
    let turn = if config.quirk == Some(Quirk::NoInFlightState) {
        let lock = {
            let mut locks = s.key_locks.lock().unwrap_or_else(PoisonError::into_inner);
            locks.entry(slot.clone()).or_default().clone()
        };
        match tokio::time::timeout(GATE_LIMIT, lock.lock_owned()).await {
            Ok(guard) => Some(guard),
            Err(_) => return error(config, Kind::InUse).into_response(),
        }
    } else {
        None
    };

    let delay_left = if s.has(Defect::RaceDoubleExecution) {
        // Defect: check, work, then insert: the check and the claim are two
        // steps with the handler's delay between them.
        let seen = {
            let inner = s.lock();
            s.existing(&inner, &slot, fp, caller)
        };
        if let Some(answer) = seen {
            return answer.into_response();
        }
        tokio::time::sleep(s.config.delay.max(RACE_WINDOW)).await;
        s.lock().keys.insert(slot.clone(), Record::InFlight(fp));
        false
    } else {
        match claim(&s, &slot, fp, caller, turn.is_some()).await {
            Ok(()) => true,
            Err(answer) => return answer.into_response(),
        }
    };
    // The run is its own task so a client that hangs up mid-request does not
    // cancel it: like a real server, it commits and stores its outcome, and
    // the retry gets the replay (the lost-response case) instead of a key
    // stuck in flight.
    let run = {
        let s = Arc::clone(&s);
        let slot = slot.clone();
        tokio::spawn(async move {
            let outcome = s
                .execute(caller, key.as_str(), &req, delay_left, paused)
                .await;
            let outcome = s.with_window(outcome);
            // Defect: executed, then answered with another caller's response.
            let outcome = if s.has(Defect::LeakAfterExecution) {
                s.other_callers_stored(&slot).unwrap_or(outcome)
            } else {
                outcome
            };
            s.finish(slot, fp, &outcome, caller);
            drop(turn);
            outcome
        })
    };
    match run.await {
        Ok(outcome) => outcome.into_response(),
        Err(e) => {
            tracing::error!("zoo handler run failed: {e}");
            s.lock().keys.remove(&slot);
            error(config, Kind::Internal).into_response()
        }
    }
}

/// Whether the request says its caller's deadline is spent
/// (`Request-Deadline-Ms: 0`).
fn deadline_spent(headers: &HeaderMap) -> bool {
    headers
        .get(idem_spec::headers::REQUEST_DEADLINE_MS)
        .and_then(|v| v.to_str().ok())
        .and_then(idem_spec::headers::parse_request_deadline_ms)
        .is_some_and(|left| left.is_zero())
}

/// The atomic claim: one check and one insert under the lock. Returns the
/// answer instead when the key already has a record (held until that
/// record completes under the `always-wait` quirk). `unrecorded` (the
/// `no-in-flight-state` quirk) claims without writing an in-flight record.
async fn claim(
    s: &Shared,
    slot: &(String, String),
    fp: Fingerprint,
    caller: &str,
    unrecorded: bool,
) -> Result<(), Stored> {
    let deadline = tokio::time::Instant::now() + GATE_LIMIT;
    loop {
        let mut changed = s.done.subscribe();
        {
            let mut inner = s.lock();
            let in_flight = matches!(inner.keys.get(slot), Some(Record::InFlight(_)));
            let waits = s.config.quirk == Some(Quirk::AlwaysWait) && in_flight;
            if !waits {
                if s.held_by_other(&inner, slot) {
                    return Err(error(s.config, Kind::InUse));
                }
                if let Some(answer) = s.existing(&inner, slot, fp, caller) {
                    return Err(answer);
                }
                if !unrecorded {
                    inner.keys.insert(slot.clone(), Record::InFlight(fp));
                }
                if s.has(Defect::InFlightLockGlobal) {
                    inner.locks.insert(slot.1.clone(), (slot.0.clone(), None));
                }
                return Ok(());
            }
        }
        // Quirk: hold the duplicate until the first request finishes.
        if tokio::time::timeout_at(deadline, changed.changed())
            .await
            .is_err()
        {
            return Err(error(s.config, Kind::InUse));
        }
    }
}

/// `out` with its JSON object's members in reverse order (the bytes
/// differ; the document does not).
fn reordered(mut out: Stored) -> Stored {
    if let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(&out.body) {
        let members: Vec<String> = map
            .iter()
            .rev()
            .map(|(k, v)| format!("{}:{v}", Value::String(k.clone())))
            .collect();
        out.body = Bytes::from(format!("{{{}}}", members.join(",")));
    }
    out
}

/// Filters for the read-only probes.
#[derive(Deserialize)]
struct ProbeQuery {
    marker: Option<String>,
    idempotency_key: Option<String>,
}

impl ProbeQuery {
    fn matches(&self, marker: &str, key: &str) -> bool {
        let key_wanted = self.idempotency_key.as_deref().map(|k| {
            IdempotencyKey::parse(k).map_or_else(|_| k.to_owned(), |k| k.as_str().to_owned())
        });
        self.marker.as_deref().is_none_or(|m| m == marker) && key_wanted.is_none_or(|k| k == key)
    }
}

async fn list_orders(State(s): State<Arc<Shared>>, Query(q): Query<ProbeQuery>) -> Response {
    let items: Vec<Value> = s
        .lock()
        .orders
        .iter()
        .filter(|o| q.matches(&o.marker, &o.key))
        .map(|o| {
            let mut v = o.body();
            v["idempotency_key"] = json!(o.key);
            v
        })
        .collect();
    axum::Json(json!({"count": items.len(), "items": items})).into_response()
}

/// `POST /_zoo/release`: every paused request goes on.
async fn release_paused(State(s): State<Arc<Shared>>) -> StatusCode {
    s.released.send_modify(|n| *n += 1);
    StatusCode::NO_CONTENT
}

async fn count_executions(State(s): State<Arc<Shared>>, Query(q): Query<ProbeQuery>) -> Response {
    let count = s
        .lock()
        .executions
        .iter()
        .filter(|(m, k)| q.matches(m, k))
        .count();
    axum::Json(json!({"count": count})).into_response()
}

async fn show_order(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    let order = s.lock().orders.iter().find(|o| o.id == id).cloned();
    match order {
        Some(o) => Stored::json(StatusCode::OK, "application/json", &o.body())
            .with_header(header::ETAG, &o.etag())
            .into_response(),
        None => error(s.config, Kind::NotFound).into_response(),
    }
}

async fn unknown_route(State(s): State<Arc<Shared>>) -> Response {
    error(s.config, Kind::UnknownRoute).into_response()
}

async fn unsupported_method(State(s): State<Arc<Shared>>) -> Response {
    error(s.config, Kind::UnsupportedMethod).into_response()
}

/// Every error the zoo answers, before its dialect spells it.
enum Kind {
    Unauthenticated,
    KeyMissing,
    KeyInvalid(String),
    MalformedBody(String),
    Mismatch,
    InUse,
    /// The body-triggered final rejection (`amount` < 0).
    Rejected,
    /// The body-triggered failure (`amount` == 500).
    Internal,
    NotFound,
    UnknownRoute,
    UnsupportedMethod,
    /// A declared body over the limit, refused before the claim.
    TooLarge,
    /// The key of a request that failed (`server-error-locks-key`).
    KeyFailed,
    /// A new request whose `Request-Deadline-Ms` is 0, refused before the
    /// claim.
    DeadlineSpent,
}

impl Kind {
    fn code(&self) -> ErrorCode {
        match self {
            Self::Unauthenticated => ErrorCode::Unauthenticated,
            Self::KeyMissing => ErrorCode::IdempotencyKeyMissing,
            Self::KeyInvalid(_) => ErrorCode::IdempotencyKeyInvalid,
            Self::MalformedBody(_) => ErrorCode::MalformedBody,
            Self::Mismatch => ErrorCode::IdempotencyKeyMismatch,
            Self::InUse => ErrorCode::IdempotencyKeyInUse,
            Self::Rejected => ErrorCode::ValidationFailed,
            Self::Internal => ErrorCode::InternalError,
            Self::NotFound | Self::UnknownRoute => ErrorCode::NotFound,
            Self::UnsupportedMethod => ErrorCode::MethodNotAllowed,
            Self::TooLarge => ErrorCode::PayloadTooLarge,
            Self::KeyFailed => ErrorCode::ValidationFailed,
            Self::DeadlineSpent => ErrorCode::DeadlineExceeded,
        }
    }

    fn detail(&self) -> String {
        match self {
            Self::Unauthenticated => "unauthorized".into(),
            Self::KeyMissing => "Idempotency-Key header is required".into(),
            Self::KeyInvalid(why) => format!("invalid Idempotency-Key: {why}"),
            Self::MalformedBody(why) => format!("malformed body: {why}"),
            Self::Mismatch => "Idempotency-Key reused with a different request".into(),
            Self::InUse => "a request with this Idempotency-Key is in progress".into(),
            Self::Rejected => "amount must not be negative".into(),
            Self::Internal => "internal error".into(),
            Self::NotFound => "no such order".into(),
            Self::UnknownRoute => "no such route".into(),
            Self::UnsupportedMethod => "method not supported".into(),
            Self::TooLarge => format!("request bodies are limited to {MAX_BODY} bytes"),
            Self::KeyFailed => "a request with this Idempotency-Key failed; use a new key".into(),
            Self::DeadlineSpent => "the caller's deadline has passed; nothing was started".into(),
        }
    }
}

/// Spells an error the dialect's way.
fn error(config: ZooConfig, kind: Kind) -> Stored {
    let dialect = config.dialect;
    let detail = kind.detail();
    let stored = if dialect.is_problem_json() {
        let problem = Problem::new(kind.code(), Profile::Reference, detail);
        let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::BAD_REQUEST);
        let body = serde_json::to_value(&problem).unwrap_or(Value::Null);
        Stored::json(status, PROBLEM_CONTENT_TYPE, &body)
    } else {
        let status = match kind {
            Kind::Unauthenticated => 401,
            Kind::KeyMissing | Kind::KeyInvalid(_) | Kind::MalformedBody(_) => 400,
            Kind::Mismatch => dialect.mismatch_status(),
            Kind::InUse => 409,
            Kind::Rejected => 422,
            Kind::Internal => 500,
            Kind::NotFound => 404,
            Kind::UnknownRoute => dialect.unknown_route_status(),
            Kind::UnsupportedMethod => dialect.unsupported_method_status(),
            Kind::TooLarge => 413,
            Kind::KeyFailed => 422,
            Kind::DeadlineSpent => 504,
        };
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
        let body = if config.quirk == Some(Quirk::NestedErrorCode) {
            json!({"error": {"code": kind.code().as_str(), "message": detail}})
        } else {
            json!({"error": detail})
        };
        Stored::json(status, "application/json", &body)
    };
    match kind {
        Kind::InUse if config.quirk != Some(Quirk::NoRetryAfter) => {
            stored.with_header(header::RETRY_AFTER, "1")
        }
        _ => stored,
    }
}
