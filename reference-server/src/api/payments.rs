//! The example multi-step endpoint: `POST /v1/payments` charges a card at
//! an external payment processor (over HTTP, [`crate::processor`]; tests and
//! the demo run `idem-fake-processor` as that processor), which no database
//! rollback can undo.
//!
//! Its phases (`axum_idempotency::multistep` explains the machinery):
//!
//! | from | does | reaches |
//! |---|---|---|
//! | `started` | validates; inserts the payment row (status `pending`) with its outbound key, in the claim's transaction | `payment_created` |
//! | `payment_created` | records the intent (`charge_attempts + 1`, committed); calls `POST /charges` with the outbound key; writes the charge id | `charge_created`, or a final 402 on decline |
//! | `charge_created` | marks the payment `succeeded`, stages a receipt job, stores the 201 | `finished` |
//!
//! The outbound key is `idemkit-processor-{40 hex}`, the SHA-256 of
//! (caller, key, first-claim time, `processor`) (see
//! `Phase::foreign_key`): the same for every attempt of one request, and
//! different for different callers, keys, or a key reused after its replay
//! window. A crash between the call and its commit makes the resumed
//! request call again with the same key, and the processor answers with
//! the charge it already made.
//!
//! Processor unavailable (503, or unreachable): 503 `upstream_unavailable`
//! with `Retry-After`, not stored; the key stays at `payment_created` with
//! its lease ended, so a retry with the same key resumes there. A decline
//! is final: 402 `payment_declined`, stored and replayed.
//!
//! The failpoints it passes (with `--test-hooks`, besides the generic
//! `after=started`), in order ([`PAYMENT_FAILPOINTS`]):
//!
//! | failpoint | where |
//! |---|---|
//! | `before=payment_created` | phase 1's writes done, not committed |
//! | `after=payment_created` | phase 1 committed |
//! | `before=charge-call` | intent committed, processor not yet called |
//! | `after=charge-call` | processor answered, nothing of it committed |
//! | `before=charge_created` | charge id written, not committed |
//! | `after=charge_created` | phase 2 committed |
//! | `before=finished` | receipt job staged and response stored, not committed |
//! | `after=finished` | final response committed, not yet sent |
//!
//! A crash at `after=charge-call` or `before=charge_created` falls between
//! the foreign call and its commit: the resumed request calls the processor
//! once more with the same outbound key, and the processor deduplicates it.
//! Every other crash point is between phases and repeats no call.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use axum_idempotency::clock::Clock;
use axum_idempotency::failpoint::Position;
use axum_idempotency::jobs::Deliver;
use axum_idempotency::multistep::{MultiStep, Next, Phase, Points};
use axum_idempotency::store::{StagedJob, StagedJobs, is_mysql, sql};
use axum_idempotency::{RecoveryPoint, Store, with_conn, with_pool};
use serde::{Deserialize, Serialize};
use sqlx::Row;
use utoipa::ToSchema;

use super::auth::Principal;
use super::{AppState, page, to_rfc3339};
use crate::error::{Error, Result};
use crate::processor::{ChargeOutcome, ChargeRequest, Processor};

/// Every failpoint `POST /v1/payments` passes, in order (see the module docs).
pub const PAYMENT_FAILPOINTS: [&str; 8] = [
    "before=payment_created",
    "after=payment_created",
    "before=charge-call",
    "after=charge-call",
    "before=charge_created",
    "after=charge_created",
    "before=finished",
    "after=finished",
];

/// The staged-job kind of a payment receipt.
pub const RECEIPT_JOB: &str = "send_receipt";

/// Largest amount one payment may charge, in minor units.
pub const MAX_AMOUNT: i64 = 1_000_000_000_000;

/// A payment request.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewPayment {
    /// Minor units (cents), 1 to 10^12.
    pub amount: i64,
    /// ISO 4217 code, three ASCII letters.
    pub currency: String,
    /// Payment source, e.g. a card token.
    #[serde(default)]
    pub source: Option<String>,
    /// Free text, up to 140 characters.
    #[serde(default)]
    pub description: Option<String>,
}

impl NewPayment {
    fn validate(&self) -> Result<()> {
        if !(1..=MAX_AMOUNT).contains(&self.amount) {
            return Err(Error::Validation(format!(
                "amount must be between 1 and {MAX_AMOUNT} minor units"
            )));
        }
        if self.currency.len() != 3 || !self.currency.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(Error::Validation(
                "currency must be a three-letter ISO 4217 code".into(),
            ));
        }
        for (name, v, max) in [
            ("source", &self.source, 64),
            ("description", &self.description, 140),
        ] {
            if let Some(v) = v
                && (v.chars().count() > max || v.chars().any(char::is_control))
            {
                return Err(Error::Validation(format!(
                    "{name} must be at most {max} characters with no control characters"
                )));
            }
        }
        Ok(())
    }
}

/// A payment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Payment {
    /// `pay_...`, derived from the request (stable across retries).
    pub id: String,
    /// The idempotency key that created it.
    pub idempotency_key: String,
    /// Minor units.
    pub amount: i64,
    /// Currency, lower-cased.
    pub currency: String,
    /// Payment source.
    pub source: Option<String>,
    /// Free text.
    pub description: Option<String>,
    /// `pending`, `charged`, `succeeded` or `declined`.
    pub status: String,
    /// The processor's charge id, once charged.
    pub charge_id: Option<String>,
    /// The processor's decline code, when declined.
    pub failure_code: Option<String>,
    /// Processor calls made for it (intents recorded).
    pub charge_attempts: i64,
    /// Fencing generation of the worker that last wrote it.
    pub generation: i64,
    /// When it was created (server clock), RFC 3339.
    pub created_at: String,
}

/// One page of the caller's payments, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PaymentList {
    /// How many of the caller's payments match the filters, across all
    /// pages. Read beside the page, not in one snapshot with it.
    pub count: usize,
    /// This page: at most `limit` payments, oldest first.
    pub payments: Vec<Payment>,
    /// Pass as `cursor` to get the payments after this page; `null` on the
    /// last page.
    pub next_cursor: Option<String>,
}

/// One receipt job delivered by the enqueuer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Receipt {
    /// The staged job's id.
    pub job_id: i64,
    /// The payment it is for.
    pub payment_id: String,
    /// Minor units.
    pub amount: i64,
    /// Currency.
    pub currency: String,
    /// When the enqueuer delivered it, RFC 3339.
    pub enqueued_at: String,
}

/// One page of the caller's delivered receipts.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReceiptList {
    /// How many receipts the caller has, across all pages.
    pub count: usize,
    /// This page: at most `limit` receipts, in job order.
    pub receipts: Vec<Receipt>,
    /// Pass as `cursor` to get the receipts after this page; `null` on the
    /// last page.
    pub next_cursor: Option<String>,
}

/// The `POST /v1/payments` endpoint: its phases and the processor client.
#[derive(Debug, Clone)]
pub struct Payments {
    processor: Processor,
}

impl Payments {
    /// Payments charged at `processor`.
    pub fn new(processor: Processor) -> Self {
        Self { processor }
    }
}

const SELECT_PAYMENTS: &str = "SELECT id, idempotency_key, amount, currency, source, description, \
     status, charge_id, failure_code, charge_attempts, generation, created_at FROM payments \
     WHERE owner = $1";

fn payment_id(p: &Phase<'_, Store>) -> String {
    format!("pay_{}", &p.derive("payment")[..24])
}

/// The original request's body, as a [`NewPayment`]: 415 unless it was sent
/// as JSON, 400 when broken, 422 when it does not fit. All final (4xx).
fn new_payment(p: &Phase<'_, Store>) -> Result<NewPayment> {
    let request = p.request();
    let ct = request.content_type.as_deref().unwrap_or_default();
    if !idem_spec::fingerprint::is_json_media_type(ct) {
        return Err(Error::UnsupportedMediaType(format!(
            "send the body as application/json (got {:?})",
            if ct.is_empty() { "no Content-Type" } else { ct }
        )));
    }
    super::json::parse(&request.body)
}

/// A payment's recovery points, named once: the phase table matches on
/// them, the phases commit them, and tests arm failpoints by their names
/// (`Idem-Failpoint: crash-after=charge_created`). The names are stored
/// with keys in flight: never rename one (see the multistep module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// Key claimed, nothing committed: the first phase inserts the payment.
    Started,
    /// The payment row is committed; the charge is next.
    PaymentCreated,
    /// The processor's charge is recorded; the final response is next.
    ChargeCreated,
}

impl Points for Point {
    const ALL: &'static [Self] = &[Self::Started, Self::PaymentCreated, Self::ChargeCreated];

    fn name(self) -> &'static str {
        match self {
            Self::Started => RecoveryPoint::STARTED,
            Self::PaymentCreated => "payment_created",
            Self::ChargeCreated => "charge_created",
        }
    }
}

/// The failpoint around the processor call (`Idem-Failpoint:
/// crash-before=charge-call` / `crash-after=charge-call`).
pub const CHARGE_CALL: &str = "charge-call";

impl MultiStep<Store> for Payments {
    type Error = Error;
    type Point = Point;

    async fn phase(&self, from: Point, p: &mut Phase<'_, Store>) -> Result<Next<Point>> {
        match from {
            Point::Started => insert_payment(p).await,
            Point::PaymentCreated => self.charge(p).await,
            Point::ChargeCreated => finish(p).await,
        }
    }
}

/// Phase 1, inside the claim's transaction: the payment row and, with it,
/// the outbound key the processor will see (the intent's first half).
async fn insert_payment(p: &mut Phase<'_, Store>) -> Result<Next<Point>> {
    let req = new_payment(p)?;
    req.validate()?;
    let id = payment_id(p);
    let outbound = p.foreign_key("processor")?;
    let (caller, key, generation, now) = (
        p.caller().as_str().to_owned(),
        p.key().as_str().to_owned(),
        p.generation(),
        p.now(),
    );
    let tx = p.tx().await?;
    with_conn!(tx, c => {
        sqlx::query(&sql(&*c,
            "INSERT INTO payments (id, owner, idempotency_key, amount, currency, source, \
             description, status, outbound_key, generation, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8, $9, $10, $11)",
        ))
        .bind(&id)
        .bind(&caller)
        .bind(&key)
        .bind(req.amount)
        .bind(req.currency.to_ascii_lowercase())
        .bind(&req.source)
        .bind(&req.description)
        .bind(outbound.as_str())
        .bind(generation)
        .bind(now)
        .bind(now)
        .execute(&mut *c)
        .await?;
    });
    Ok(Next::Commit(Point::PaymentCreated))
}

impl Payments {
    /// Phase 2: record the intent, call the processor (no transaction
    /// open), record its answer.
    async fn charge(&self, p: &mut Phase<'_, Store>) -> Result<Next<Point>> {
        let req = new_payment(p)?;
        let id = payment_id(p);
        let outbound = p.foreign_key("processor")?;
        let (generation, now) = (p.generation(), p.now());
        let tx = p.tx().await?;
        with_conn!(tx, c => {
            sqlx::query(&sql(&*c,
                "UPDATE payments SET charge_attempts = charge_attempts + 1, generation = $1, \
                 updated_at = $2 WHERE id = $3",
            ))
            .bind(generation)
            .bind(now)
            .bind(&id)
            .execute(&mut *c)
            .await?;
        });
        p.commit_intent().await?;
        p.failpoint(Position::Before, CHARGE_CALL).await;
        let charge = ChargeRequest {
            amount: req.amount,
            currency: req.currency.to_ascii_lowercase(),
            source: req.source.clone(),
            description: Some(format!("idemkit payment {id}")),
        };
        // Bounded by the caller's deadline too: a call nobody waits for
        // is cut, and the retry resumes here (idem.deadline.bound).
        let outcome = self
            .processor
            .charge(&outbound, &charge, p.deadline())
            .await;
        p.failpoint(Position::After, CHARGE_CALL).await;
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(payment = %id, error = %e, "processor unreachable");
                return Err(Error::UpstreamUnavailable {
                    detail: "the payment processor could not be reached; retry with the same \
                             Idempotency-Key: the payment resumes where it stopped"
                        .into(),
                    retry_after_secs: 1,
                });
            }
        };
        let (generation, now) = (p.generation(), p.now());
        match outcome {
            ChargeOutcome::Charged(charge) => {
                let tx = p.tx().await?;
                with_conn!(tx, c => {
                    sqlx::query(&sql(&*c,
                        "UPDATE payments SET status = 'charged', charge_id = $1, generation = $2, \
                         updated_at = $3 WHERE id = $4",
                    ))
                    .bind(&charge.id)
                    .bind(generation)
                    .bind(now)
                    .bind(&id)
                    .execute(&mut *c)
                    .await?;
                });
                Ok(Next::Commit(Point::ChargeCreated))
            }
            ChargeOutcome::Declined(charge) => {
                let code = charge.failure_code.clone().unwrap_or_default();
                let tx = p.tx().await?;
                with_conn!(tx, c => {
                    sqlx::query(&sql(&*c,
                        "UPDATE payments SET status = 'declined', charge_id = $1, \
                         failure_code = $2, generation = $3, updated_at = $4 WHERE id = $5",
                    ))
                    .bind(&charge.id)
                    .bind(&code)
                    .bind(generation)
                    .bind(now)
                    .bind(&id)
                    .execute(&mut *c)
                    .await?;
                });
                // A final 4xx: stored with these writes and replayed.
                Err(Error::PaymentDeclined(format!(
                    "the processor declined payment {id} ({code}); use a new Idempotency-Key \
                     for a new attempt"
                )))
            }
            ChargeOutcome::Unavailable { retry_after } => Err(Error::UpstreamUnavailable {
                detail: "the payment processor is unavailable; retry with the same \
                         Idempotency-Key: the payment resumes where it stopped"
                    .into(),
                retry_after_secs: retry_after.map_or(1, |d| d.as_secs().max(1)),
            }),
            // The processor failed on its side: transient, like a 503.
            ChargeOutcome::Failed { status, code } if status >= 500 => {
                tracing::warn!(payment = %id, status, code = ?code, "processor error");
                Err(Error::UpstreamUnavailable {
                    detail: "the payment processor failed; retry with the same Idempotency-Key: \
                             the payment resumes where it stopped"
                        .into(),
                    retry_after_secs: 1,
                })
            }
            // Our request was refused: a bug here, not the client's fault.
            ChargeOutcome::Failed { status, code } => Err(Error::Internal(format!(
                "the processor rejected payment {id} with {status}: {code:?}"
            ))),
        }
    }
}

/// Phase 3: mark the payment succeeded, stage the receipt job, and answer
/// 201; the driver stores the response in the same transaction.
async fn finish(p: &mut Phase<'_, Store>) -> Result<Next<Point>> {
    let id = payment_id(p);
    let (caller, generation, now) = (p.caller().as_str().to_owned(), p.generation(), p.now());
    let store = p.store().clone();
    let tx = p.tx().await?;
    let payment = with_conn!(tx, c => {
        sqlx::query(&sql(&*c,
            "UPDATE payments SET status = 'succeeded', generation = $1, updated_at = $2 \
             WHERE id = $3",
        ))
        .bind(generation)
        .bind(now)
        .bind(&id)
        .execute(&mut *c)
        .await?;
        let row = sqlx::query(&sql(&*c, &format!("{SELECT_PAYMENTS} AND id = $2")))
            .bind(&caller)
            .bind(&id)
            .fetch_one(&mut *c)
            .await?;
        decode(&row)?
    });
    // Staged in the transaction that finishes the payment: the receipt
    // exists only if the payment's final commit does.
    let receipt = serde_json::json!({
        "payment_id": payment.id,
        "owner": caller,
        "amount": payment.amount,
        "currency": payment.currency,
    });
    store
        .stage(tx, RECEIPT_JOB, &receipt.to_string(), now)
        .await?;
    let mut response = (StatusCode::CREATED, Json(&payment)).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/payments/{}", payment.id)) {
        response.headers_mut().insert(header::LOCATION, v);
    }
    Ok(Next::Finish(response))
}

fn decode<R>(r: &R) -> Result<Payment>
where
    R: Row,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> i64: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    Ok(Payment {
        id: r.try_get("id")?,
        idempotency_key: r.try_get("idempotency_key")?,
        amount: r.try_get("amount")?,
        currency: r.try_get("currency")?,
        source: r.try_get("source")?,
        description: r.try_get("description")?,
        status: r.try_get("status")?,
        charge_id: r.try_get("charge_id")?,
        failure_code: r.try_get("failure_code")?,
        charge_attempts: r.try_get("charge_attempts")?,
        generation: r.try_get("generation")?,
        created_at: to_rfc3339(r.try_get("created_at")?),
    })
}

/// Charges a payment at the processor, as phases with recovery points.
///
/// Without `--processor-url` it answers 503 `upstream_unavailable` saying
/// so, before any key is read.
#[utoipa::path(
    post,
    path = "/v1/payments",
    tag = "payments",
    request_body(content = NewPayment, content_type = "application/json"),
    responses(
        (status = 201, description = "Payment charged (or its replay).", body = Payment,
         headers(("Location" = String, description = "The new payment"))),
        (status = 402, description = "Declined by the processor: final, stored and replayed.", body = idem_spec::Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over the size limit.", body = idem_spec::Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not application/json.", body = idem_spec::Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid amount, currency or field.", body = idem_spec::Problem, content_type = "application/problem+json"),
        (status = 503, description = "Processor unavailable (Retry-After; not stored; retry with the same key to resume), or no processor configured.", body = idem_spec::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn create_payment(
    State(app): State<AppState>,
    req: axum::extract::Request,
) -> axum::response::Response {
    match app
        .multistep
        .iter()
        .find(|e| e.matches("POST", "/v1/payments"))
    {
        Some(endpoint) => endpoint.handle(req).await,
        None => Error::NotConfigured(
            "payments are not configured on this server: start idem-server with \
             --processor-url http://HOST:PORT (e.g. an idem-fake-processor)"
                .into(),
        )
        .into_response(),
    }
}

/// The tag of the payment list's cursors.
const PAYMENTS_CURSOR: &str = "payments";

/// The tag of the receipt list's cursors.
const RECEIPTS_CURSOR: &str = "receipts";

/// Query parameters of `GET /v1/payments`: filters (both may be given) and
/// the page.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PaymentQuery {
    /// Only the payment this key created (indexed).
    pub idempotency_key: Option<String>,
    /// Only payments whose description is exactly this, e.g. a conformance
    /// run's marker (indexed).
    pub description: Option<String>,
    /// Most payments to answer, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// Query parameters of `GET /v1/receipts`: the page.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ReceiptQuery {
    /// Most receipts to answer, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

type QueryResult<T> =
    std::result::Result<axum::extract::Query<T>, axum::extract::rejection::QueryRejection>;

fn query<T>(q: QueryResult<T>) -> Result<T> {
    q.map(|axum::extract::Query(q)| q)
        .map_err(|e| Error::Validation(format!("invalid query: {}", e.body_text())))
}

/// Lists the caller's payments, a page at a time (`?idempotency_key=K`
/// narrows to one key, `?description=D` to one description).
#[utoipa::path(
    get,
    path = "/v1/payments",
    tag = "payments",
    params(PaymentQuery),
    responses(
        (status = 200, description = "A page of the caller's payments, oldest first, with the number matching the filters.", body = PaymentList),
        (status = 422, description = "Unknown parameter, a limit out of range or a cursor of another list.", body = idem_spec::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_payments(
    State(app): State<AppState>,
    caller: Principal,
    q: QueryResult<PaymentQuery>,
) -> Result<Json<PaymentList>> {
    let q = query(q)?;
    let limit = page::limit(q.limit)?;
    let after = q
        .cursor
        .as_deref()
        .map(|c| page::position(PAYMENTS_CURSOR, c))
        .transpose()?;
    // The column names are fixed here, never taken from the query string.
    let filters: Vec<(&str, &str)> = [
        ("idempotency_key", q.idempotency_key.as_deref()),
        ("description", q.description.as_deref()),
    ]
    .into_iter()
    .filter_map(|(column, v)| v.map(|v| (column, v)))
    .collect();
    let columns: Vec<&str> = filters.iter().map(|(column, _)| *column).collect();
    let (count_sql, page_sql) =
        page::statements("payments", SELECT_PAYMENTS, &columns, after.is_some());
    let (count, rows) = with_pool!(&app.store, p => {
        let (count_text, page_text) = (sql(p, &count_sql), sql(p, &page_sql));
        let mut c = sqlx::query_scalar::<_, i64>(&count_text).bind(&caller.0);
        let mut q = sqlx::query(&page_text).bind(&caller.0);
        for (_, v) in &filters {
            c = c.bind(*v);
            q = q.bind(*v);
        }
        if let Some(a) = &after {
            q = q.bind(a.created_at).bind(a.created_at).bind(&a.id);
        }
        let count = c.fetch_one(p).await?;
        let rows = q.bind(i64::from(limit) + 1).fetch_all(p).await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            out.push((decode(r)?, r.try_get::<i64, _>("created_at")?));
        }
        (count, out)
    });
    let (payments, next_cursor) = page::finish(PAYMENTS_CURSOR, rows, limit, |p| &p.id);
    Ok(Json(PaymentList {
        count: usize::try_from(count).unwrap_or_default(),
        payments,
        next_cursor,
    }))
}

/// Reads one of the caller's payments.
#[utoipa::path(
    get,
    path = "/v1/payments/{id}",
    tag = "payments",
    params(("id" = String, Path, description = "Payment id")),
    responses(
        (status = 200, description = "The payment.", body = Payment),
        (status = 404, description = "No such payment for this caller.", body = idem_spec::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_payment(
    State(app): State<AppState>,
    caller: Principal,
    Path(id): Path<String>,
) -> Result<Json<Payment>> {
    let select = format!("{SELECT_PAYMENTS} AND id = $2");
    let payment = with_pool!(&app.store, p => {
        let row = sqlx::query(&sql(p, &select)).bind(&caller.0).bind(&id).fetch_optional(p).await?;
        row.as_ref().map(decode).transpose()?
    });
    payment
        .map(Json)
        .ok_or_else(|| Error::NotFound(format!("no payment {id:?}")))
}

/// Lists the receipt jobs the enqueuer delivered for the caller, a page at
/// a time, in job order.
#[utoipa::path(
    get,
    path = "/v1/receipts",
    tag = "payments",
    params(ReceiptQuery),
    responses(
        (status = 200, description = "A page of delivered receipts, with how many there are.", body = ReceiptList),
        (status = 422, description = "Unknown parameter, a limit out of range or a cursor of another list.", body = idem_spec::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_receipts(
    State(app): State<AppState>,
    caller: Principal,
    q: QueryResult<ReceiptQuery>,
) -> Result<Json<ReceiptList>> {
    let q = query(q)?;
    let limit = page::limit(q.limit)?;
    let after = q
        .cursor
        .as_deref()
        .map(|c| page::number_position(RECEIPTS_CURSOR, c))
        .transpose()?;
    let page_sql = format!(
        "SELECT job_id, payment_id, amount, currency, enqueued_at FROM receipts \
         WHERE owner = $1{} ORDER BY job_id LIMIT ${}",
        if after.is_some() {
            " AND job_id > $2"
        } else {
            ""
        },
        if after.is_some() { 3 } else { 2 }
    );
    let (count, receipts) = with_pool!(&app.store, p => {
        let count = sqlx::query_scalar::<_, i64>(&sql(p, "SELECT COUNT(*) FROM receipts WHERE owner = $1"))
            .bind(&caller.0)
            .fetch_one(p)
            .await?;
        let page_text = sql(p, &page_sql);
        let mut q = sqlx::query(&page_text).bind(&caller.0);
        if let Some(job) = after {
            q = q.bind(job);
        }
        let rows = q.bind(i64::from(limit) + 1).fetch_all(p).await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            out.push(Receipt {
                job_id: r.try_get("job_id")?,
                payment_id: r.try_get("payment_id")?,
                amount: r.try_get("amount")?,
                currency: r.try_get("currency")?,
                enqueued_at: to_rfc3339(r.try_get("enqueued_at")?),
            });
        }
        (count, out)
    });
    let (receipts, more) = page::split(receipts, limit);
    let next_cursor = more
        .then(|| receipts.last())
        .flatten()
        .map(|r| page::number_cursor(RECEIPTS_CURSOR, r.job_id));
    Ok(Json(ReceiptList {
        count: usize::try_from(count).unwrap_or_default(),
        receipts,
        next_cursor,
    }))
}

#[derive(serde::Deserialize)]
struct ReceiptPayload {
    payment_id: String,
    owner: String,
    amount: i64,
    currency: String,
}

/// Delivers staged receipt jobs into the `receipts` table (the observable
/// "queue" of this example, `GET /v1/receipts`). It is in the same database,
/// so a delivery commits with the deletion of its staged row; keyed by the
/// job id, it would also absorb a redelivery from a real queue.
#[derive(Debug, Clone)]
pub struct Receipts {
    clock: std::sync::Arc<dyn Clock>,
}

impl Receipts {
    /// Delivers with times from `clock`.
    pub fn new(clock: std::sync::Arc<dyn Clock>) -> Self {
        Self { clock }
    }
}

// ANCHOR: deliver
impl Deliver<Store> for Receipts {
    async fn deliver(
        &self,
        job: &StagedJob,
        tx: &mut axum_idempotency::store::DbTx,
    ) -> axum_idempotency::Result<bool> {
        if job.kind != RECEIPT_JOB {
            return Ok(false);
        }
        let p: ReceiptPayload = serde_json::from_str(&job.payload).map_err(|e| {
            axum_idempotency::Error::Internal(format!("staged job {} unreadable: {e}", job.id))
        })?;
        with_conn!(tx, c => {
            // A redelivered job is absorbed by the primary key.
            let insert = if is_mysql(&*c) {
                "INSERT INTO receipts (job_id, payment_id, owner, amount, currency, enqueued_at) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON DUPLICATE KEY UPDATE job_id = job_id"
            } else {
                "INSERT INTO receipts (job_id, payment_id, owner, amount, currency, enqueued_at) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (job_id) DO NOTHING"
            };
            sqlx::query(&sql(&*c, insert))
            .bind(job.id)
            .bind(&p.payment_id)
            .bind(&p.owner)
            .bind(p.amount)
            .bind(&p.currency)
            .bind(self.clock.now_ms())
            .execute(&mut *c)
            .await?;
        });
        Ok(true)
    }
}
// ANCHOR_END: deliver
