//! A webhook receiver on axum-idempotency: the sender retries a delivery
//! with the same event id (the Standard Webhooks `webhook-id` header), so
//! the engine keys on that id instead of `Idempotency-Key`, and the
//! verified sender, not a bearer token, is the caller the key is scoped to.
//! Two concurrent deliveries of one event create one invoice; a delivery
//! repeated within the replay window gets the stored answer. Each sender
//! sees only its own invoices (`GET /webhooks/invoices?order=...`, signed
//! like a delivery), which is also how the conformance kit counts effects
//! when it audits the receiver (`kit.toml`).
//!
//! Test: `cargo test -p example-webhook-receiver`; run:
//! `cargo run -p example-webhook-receiver` (see `main.rs`).
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router, routing::get, routing::post};
use axum_idempotency::SqliteStore;
use axum_idempotency::clock::Clock;
use axum_idempotency::{Caller, Engine, EngineConfig, IdemTx, IdempotencyLayer, KeySource};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};

/// How far a delivery's `webhook-timestamp` may be from our clock, in
/// seconds (the Standard Webhooks recommendation): an old signed request
/// replayed by someone else is refused before it reaches the key table.
pub const TOLERANCE_SECS: i64 = 5 * 60;

/// The largest delivery read, in bytes.
pub const MAX_BODY: usize = 256 * 1024;

/// The demo `billing` sender's secret (`main.rs` uses it when
/// `BILLING_WEBHOOK_SECRET` is unset): never a production value.
pub const DEMO_BILLING: &str = "whsec_ZGVtby1zZWNyZXQtYmlsbGluZw==";
/// The demo `shop` sender's secret (`SHOP_WEBHOOK_SECRET` when unset).
pub const DEMO_SHOP: &str = "whsec_ZGVtby1zZWNyZXQtc2hvcA==";

/// A sender this receiver knows: its name (the caller its events are
/// scoped to) and the secret it signs with.
#[derive(Clone)]
pub struct Sender {
    /// The caller its keys belong to.
    pub name: String,
    /// The shared signing secret (raw bytes; Standard Webhooks' `whsec_`
    /// strings are this, base64-encoded).
    pub secret: Vec<u8>,
}

impl Sender {
    /// A sender from its Standard Webhooks secret, `whsec_` and the base64
    /// of the key bytes; `None` when it is not one.
    pub fn from_whsec(name: &str, whsec: &str) -> Option<Self> {
        let secret = base64::engine::general_purpose::STANDARD
            .decode(whsec.strip_prefix("whsec_")?)
            .ok()
            .filter(|k| !k.is_empty())?;
        Some(Self {
            name: name.to_owned(),
            secret,
        })
    }

    /// The secret as Standard Webhooks writes it.
    pub fn whsec(&self) -> String {
        format!(
            "whsec_{}",
            base64::engine::general_purpose::STANDARD.encode(&self.secret)
        )
    }
}

#[derive(Clone)]
struct Verify {
    senders: Arc<[Sender]>,
    clock: Arc<dyn Clock>,
}

/// The signature of `body` as the sender computes it: base64 of
/// HMAC-SHA256 over `{id}.{timestamp}.{body}`.
pub fn sign(secret: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    sign_bytes(secret, id.as_bytes(), timestamp, body)
}

fn sign_bytes(secret: &[u8], id: &[u8], timestamp: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(id);
    mac.update(format!(".{timestamp}.").as_bytes());
    mac.update(body);
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// Checks the request's signature and timestamp, then names the sender
/// whose secret signed it as the caller. Anything unsigned, mis-signed or
/// stale is a 401 and never reaches the key table. The id is signed as
/// sent (its raw bytes, empty when absent), so a delivery with a malformed
/// or missing id is still authenticated, and then refused by the engine
/// as an invalid or missing key rather than as a forgery.
async fn verify(State(v): State<Verify>, req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    // Refused on its declared length before a byte is read: a sender
    // that declares too much never holds a connection open waiting.
    let declared = header(&parts.headers, "content-length").and_then(|n| n.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BODY) {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    }
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    let h = &parts.headers;
    let id = h.get("webhook-id").map_or(&b""[..], |v| v.as_bytes());
    let (Some(ts), Some(sigs)) = (
        header(h, "webhook-timestamp").and_then(|t| t.parse::<i64>().ok()),
        header(h, "webhook-signature"),
    ) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let now_secs = v.clock.now_ms() / 1000;
    if (now_secs - ts).abs() > TOLERANCE_SECS {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    // Several space-separated `v1,<sig>` entries may be sent (key rotation).
    let sent: Vec<&str> = sigs
        .split(' ')
        .filter_map(|s| s.strip_prefix("v1,"))
        .collect();
    let Some(sender) = v.senders.iter().find(|s| {
        let want = sign_bytes(&s.secret, id, ts, &body);
        sent.iter()
            .any(|got| constant_time_eq(got.as_bytes(), want.as_bytes()))
    }) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    parts.extensions.insert(Caller::new(&sender.name));
    next.run(Request::from_parts(parts, Body::from(body))).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The event this receiver handles.
#[derive(Deserialize)]
struct Event {
    r#type: String,
    data: OrderPaid,
}

#[derive(Deserialize)]
struct OrderPaid {
    order: String,
    amount: i64,
}

#[derive(Serialize)]
struct Invoice {
    id: i64,
    order: String,
    amount: i64,
}

/// Written as if every event came once: the invoice is inserted through
/// `tx`, so it commits with the stored answer or not at all.
async fn order_paid(
    tx: IdemTx<SqliteStore>,
    caller: Caller,
    Json(event): Json<Event>,
) -> Result<(StatusCode, Json<Invoice>), axum_idempotency::Error> {
    if event.r#type != "order.paid" {
        // Final and stored: the sender stops redelivering it.
        return Err(axum_idempotency::Error::MalformedBody(format!(
            "unhandled event type {:?}",
            event.r#type
        )));
    }
    let mut tx = tx.lock().await?;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO invoices (sender, order_id, amount) VALUES ($1, $2, $3) RETURNING id",
    )
    .bind(caller.as_str())
    .bind(&event.data.order)
    .bind(event.data.amount)
    .fetch_one(&mut **tx)
    .await?;
    Ok((
        StatusCode::CREATED,
        Json(Invoice {
            id,
            order: event.data.order,
            amount: event.data.amount,
        }),
    ))
}

#[derive(Deserialize)]
struct ByOrder {
    order: String,
}

#[derive(Serialize)]
struct Invoices {
    invoices: Vec<Invoice>,
}

/// The calling sender's invoices for one order: a sender sees its own
/// effects, never another's.
async fn invoices(
    State(pool): State<sqlx::SqlitePool>,
    caller: Caller,
    Query(q): Query<ByOrder>,
) -> Result<Json<Invoices>, axum_idempotency::Error> {
    let rows: Vec<(i64, String, i64)> = sqlx::query_as(
        "SELECT id, order_id, amount FROM invoices WHERE sender = $1 AND order_id = $2 ORDER BY id",
    )
    .bind(caller.as_str())
    .bind(&q.order)
    .fetch_all(&pool)
    .await?;
    Ok(Json(Invoices {
        invoices: rows
            .into_iter()
            .map(|(id, order, amount)| Invoice { id, order, amount })
            .collect(),
    }))
}

/// The receiver on `store` and `clock` for `senders`: migrates (the key
/// table beside `invoices`) and routes `POST /webhooks/orders` and
/// `GET /webhooks/invoices?order=...`, both signed.
pub async fn app(
    store: SqliteStore,
    clock: Arc<dyn Clock>,
    senders: Vec<Sender>,
) -> Result<Router, axum_idempotency::Error> {
    store.migrate().await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS invoices (id INTEGER PRIMARY KEY, sender TEXT NOT NULL, order_id TEXT NOT NULL, amount INTEGER NOT NULL)",
    )
    .execute(store.pool())
    .await?;
    let pool = store.pool().clone();
    // ANCHOR: keyed
    let engine = Engine::new(store, clock.clone(), EngineConfig::default());
    // The sender's event id is the key; `verify` names the sender as caller.
    let keyed = IdempotencyLayer::new(engine)
        .key_source(KeySource::Header(HeaderName::from_static("webhook-id")));
    Ok(Router::new()
        .route("/webhooks/orders", post(order_paid).layer(keyed))
        .route("/webhooks/invoices", get(invoices).with_state(pool))
        .layer(middleware::from_fn_with_state(
            Verify {
                senders: senders.into(),
                clock,
            },
            verify,
        )))
    // ANCHOR_END: keyed
}

/// A signed delivery of `body` as event `id` at `timestamp` (seconds), for
/// tests and for trying the receiver out.
pub fn delivery(secret: &[u8], id: &str, timestamp: i64, body: &str) -> Request<Body> {
    Request::post("/webhooks/orders")
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header(
            "webhook-signature",
            format!("v1,{}", sign(secret, id, timestamp, body.as_bytes())),
        )
        .body(Body::from(Bytes::from(body.to_owned())))
        .expect("a valid request")
}
