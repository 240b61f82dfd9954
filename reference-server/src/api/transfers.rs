//! The example single-phase endpoint: `POST /v1/transfers` moves money
//! between two accounts of the caller, in the same database as the keys.
//!
//! A duplicate executed twice would visibly move the amount twice, which is
//! what makes this endpoint a good witness for the contract: the balances
//! and the transfer list show whether a retry was collapsed.
//!
//! Note what the handler does *not* contain: no key, no fingerprint, no 409,
//! no replay. It runs only for a request that holds its key, and writes
//! through the [`IdemTx`] so its writes commit with the stored response.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sqlx::Row;
use utoipa::ToSchema;

use super::AppState;
use super::json::ApiJson;
use axum_idempotency::{IdemTx, Store, with_conn, with_pool};

use super::auth::Principal;
use super::to_rfc3339;
use crate::error::{Error, Result};

/// Largest amount one transfer may move, in minor units.
pub const MAX_AMOUNT: i64 = 1_000_000_000_000;

/// A transfer request.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTransfer {
    /// Account to debit (must be the caller's).
    pub from: String,
    /// Account to credit (must be the caller's).
    pub to: String,
    /// Minor units (cents), 1 to 10^12.
    pub amount: i64,
    /// Free text, up to 140 characters.
    #[serde(default)]
    pub memo: Option<String>,
}

impl NewTransfer {
    fn validate(&self) -> Result<()> {
        if !(1..=MAX_AMOUNT).contains(&self.amount) {
            return Err(Error::Validation(format!(
                "amount must be between 1 and {MAX_AMOUNT} minor units"
            )));
        }
        for (name, id) in [("from", &self.from), ("to", &self.to)] {
            if id.is_empty() || id.len() > 64 {
                return Err(Error::Validation(format!(
                    "{name} must be an account id of 1 to 64 characters"
                )));
            }
        }
        if self.from == self.to {
            return Err(Error::Validation(
                "from and to must be different accounts".into(),
            ));
        }
        if let Some(memo) = &self.memo
            && (memo.chars().count() > 140 || memo.chars().any(char::is_control))
        {
            return Err(Error::Validation(
                "memo must be at most 140 characters with no control characters".into(),
            ));
        }
        Ok(())
    }
}

/// A transfer that happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Transfer {
    /// `tr_...`
    pub id: String,
    /// Debited account.
    pub from: String,
    /// Credited account.
    pub to: String,
    /// Minor units moved.
    pub amount: i64,
    /// Free text.
    pub memo: Option<String>,
    /// When it happened (server clock), RFC 3339.
    pub created_at: String,
}

/// The caller's transfers, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TransferList {
    /// Number of transfers (a probe for double execution).
    pub count: usize,
    /// The transfers.
    pub transfers: Vec<Transfer>,
}

// Touching a row (a no-op UPDATE) both checks that it exists and belongs to
// the caller, and takes its row lock. Touching the two accounts in id order
// means two opposite transfers (A→B and B→A) lock in the same order and
// cannot deadlock on PostgreSQL. (SQLite has one writer, so it never does.)
const TOUCH: &str = "UPDATE accounts SET balance = balance WHERE id = $1 AND owner = $2";
// The guard `balance >= $1` makes an overdraft impossible even if another
// transaction moved money since we looked: the row lock orders them.
const DEBIT: &str =
    "UPDATE accounts SET balance = balance - $1 WHERE id = $2 AND owner = $3 AND balance >= $1";
const CREDIT: &str = "UPDATE accounts SET balance = balance + $1 WHERE id = $2 AND owner = $3";
const INSERT: &str = "INSERT INTO transfers \
     (id, owner, from_account, to_account, amount, memo, created_at, idempotency_key) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

/// Moves `amount` from one of the caller's accounts to another.
#[utoipa::path(
    post,
    path = "/v1/transfers",
    tag = "transfers",
    request_body(content = NewTransfer, content_type = "application/json"),
    responses(
        (status = 201, description = "Transfer made (or its replay).", body = Transfer,
         headers(("Location" = String, description = "The new transfer"),
                 ("ETag" = String, description = "Version tag of the transfer"))),
        (status = 404, description = "An account does not exist or is not the caller's.", body = idem_spec::Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over the size limit.", body = idem_spec::Problem, content_type = "application/problem+json"),
        (status = 415, description = "Body is not application/json.", body = idem_spec::Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid amount, unknown field, same account, or insufficient funds.", body = idem_spec::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
// ANCHOR: handler
pub async fn create_transfer(
    State(app): State<AppState>,
    tx: IdemTx<Store>,
    caller: Principal,
    headers: axum::http::HeaderMap,
    ApiJson(req): ApiJson<NewTransfer>,
) -> Result<Response> {
    req.validate()?;
    let id = format!("tr_{}", uuid::Uuid::new_v4().simple());
    let now = app.clock.now_ms();
    // For forensics only; the layer already validated it.
    let key = headers
        .get(idem_spec::headers::IDEMPOTENCY_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let (first, second) = if req.from <= req.to {
        (&req.from, &req.to)
    } else {
        (&req.to, &req.from)
    };
    let mut tx = tx.lock().await?;
    with_conn!(&mut *tx, c => {
        for account in [first, second] {
            let found = sqlx::query(TOUCH)
                .bind(account)
                .bind(&caller.0)
                .execute(&mut *c)
                .await?
                .rows_affected();
            if found == 0 {
                // A 4xx before any real write: stored as the final outcome.
                return Err(Error::NotFound(format!(
                    "account {account:?} does not exist or does not belong to you"
                )));
            }
        }
        let debited = sqlx::query(DEBIT)
            .bind(req.amount)
            .bind(&req.from)
            .bind(&caller.0)
            .execute(&mut *c)
            .await?
            .rows_affected();
        if debited == 0 {
            return Err(Error::Validation(format!(
                "insufficient funds in account {:?}",
                req.from
            )));
        }
        let credited = sqlx::query(CREDIT)
            .bind(req.amount)
            .bind(&req.to)
            .bind(&caller.0)
            .execute(&mut *c)
            .await?
            .rows_affected();
        if credited != 1 {
            // We touched it a moment ago under its row lock; this is a bug,
            // so answer 5xx: the layer rolls back the debit with the claim.
            return Err(Error::Internal("credit touched no row".into()));
        }
        sqlx::query(INSERT)
            .bind(&id)
            .bind(&caller.0)
            .bind(&req.from)
            .bind(&req.to)
            .bind(req.amount)
            .bind(&req.memo)
            .bind(now)
            .bind(&key)
            .execute(&mut *c)
            .await?;
    });
    drop(tx);
    let transfer = Transfer {
        id: id.clone(),
        from: req.from,
        to: req.to,
        amount: req.amount,
        memo: req.memo,
        created_at: to_rfc3339(now),
    };
    let mut response = (StatusCode::CREATED, Json(transfer)).into_response();
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/transfers/{id}")) {
        h.insert(header::LOCATION, v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("\"{id}\"")) {
        h.insert(header::ETAG, v);
    }
    Ok(response)
}
// ANCHOR_END: handler

const SELECT_TRANSFERS: &str = "SELECT id, from_account, to_account, amount, memo, created_at \
     FROM transfers WHERE owner = $1";

/// Filters for `GET /v1/transfers`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct TransferFilter {
    /// Only transfers whose memo is exactly this: an effect probe for
    /// black-box testers, who put a run-unique marker in the memo and count
    /// how many transfers carry it.
    pub memo: Option<String>,
}

/// Lists the caller's transfers.
#[utoipa::path(
    get,
    path = "/v1/transfers",
    tag = "transfers",
    params(TransferFilter),
    responses((status = 200, description = "The caller's transfers, oldest first.", body = TransferList)),
    security(("bearer" = []))
)]
pub async fn list_transfers(
    State(app): State<AppState>,
    caller: Principal,
    filter: Result<axum::extract::Query<TransferFilter>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<TransferList>> {
    let axum::extract::Query(filter) =
        filter.map_err(|e| Error::Validation(format!("invalid query: {}", e.body_text())))?;
    let transfers = match &filter.memo {
        Some(memo) => {
            let sql = format!("{SELECT_TRANSFERS} AND memo = $2 ORDER BY created_at, id");
            fetch(&app, &sql, &caller.0, Some(memo)).await?
        }
        None => {
            let sql = format!("{SELECT_TRANSFERS} ORDER BY created_at, id");
            fetch(&app, &sql, &caller.0, None).await?
        }
    };
    Ok(Json(TransferList {
        count: transfers.len(),
        transfers,
    }))
}

/// Reads one of the caller's transfers.
#[utoipa::path(
    get,
    path = "/v1/transfers/{id}",
    tag = "transfers",
    params(("id" = String, Path, description = "Transfer id")),
    responses(
        (status = 200, description = "The transfer.", body = Transfer),
        (status = 404, description = "No such transfer for this caller.", body = idem_spec::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_transfer(
    State(app): State<AppState>,
    caller: Principal,
    Path(id): Path<String>,
) -> Result<Json<Transfer>> {
    let sql = format!("{SELECT_TRANSFERS} AND id = $2");
    fetch(&app, &sql, &caller.0, Some(&id))
        .await?
        .into_iter()
        .next()
        .map(Json)
        .ok_or_else(|| Error::NotFound(format!("no transfer {id:?}")))
}

/// Runs a transfer query bound to the owner and, when given, one more value.
async fn fetch(
    app: &AppState,
    sql: &str,
    owner: &str,
    second: Option<&str>,
) -> Result<Vec<Transfer>> {
    with_pool!(&app.store, p => {
        let mut q = sqlx::query(sql).bind(owner);
        if let Some(v) = second {
            q = q.bind(v);
        }
        let rows = q.fetch_all(p).await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            out.push(Transfer {
                id: r.try_get("id")?,
                from: r.try_get("from_account")?,
                to: r.try_get("to_account")?,
                amount: r.try_get("amount")?,
                memo: r.try_get("memo")?,
                created_at: to_rfc3339(r.try_get("created_at")?),
            });
        }
        Ok(out)
    })
}
