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
use axum_idempotency::store::{DbConn, sql};
use axum_idempotency::{IdemTx, Store, with_conn, with_pool};

use super::auth::Principal;
use super::{page, to_rfc3339};
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

/// One page of the caller's transfers, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TransferList {
    /// How many of the caller's transfers match the filter, across all
    /// pages (an effect probe for double execution). Read beside the page,
    /// not in one snapshot with it.
    pub count: usize,
    /// This page: at most `limit` transfers, oldest first.
    pub transfers: Vec<Transfer>,
    /// Pass as `cursor` to get the transfers after this page; `null` on
    /// the last page.
    pub next_cursor: Option<String>,
}

// One read takes both accounts' row locks and shows whether they exist,
// belong to the caller and can cover the amount, before anything is written:
// so a 404 or 422 leaves no write behind (the layer stores it as the final
// outcome). On PostgreSQL the rows are locked in id order (`ORDER BY id FOR
// UPDATE` locks as it returns sorted rows), so two opposite transfers (A→B and
// B→A) cannot deadlock. SQLite has one writer (`BEGIN IMMEDIATE` already holds
// the database's write lock), and has no `FOR UPDATE`.
const LOCK_SQLITE: &str =
    "SELECT id, balance FROM accounts WHERE owner = $1 AND id IN ($2, $3) ORDER BY id";
const LOCK_POSTGRES: &str =
    "SELECT id, balance FROM accounts WHERE owner = $1 AND id IN ($2, $3) ORDER BY id FOR UPDATE";
// Debit and credit in one statement, on the rows locked above. The guard
// `balance >= amount` on the debited row keeps an overdraft impossible even if
// the read above were ever wrong: then fewer than two rows change, and the
// handler answers 5xx, which rolls the whole transaction back.
// Each placeholder once and in order, so MySQL's `?` binds the same values
// (see `axum_idempotency::store::sql`): from, amount, amount, owner, from,
// to, from, amount.
const MOVE: &str = "UPDATE accounts \
     SET balance = CASE WHEN id = $1 THEN balance - $2 ELSE balance + $3 END \
     WHERE owner = $4 AND id IN ($5, $6) AND (id <> $7 OR balance >= $8)";
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
    let mut tx = tx.lock().await?;
    // MySQL takes the PostgreSQL statement: InnoDB locks the rows it returns
    // (READ COMMITTED, so no gap locks), in id order.
    let lock = match tx.conn() {
        DbConn::Sqlite(_) => LOCK_SQLITE,
        _ => LOCK_POSTGRES,
    };
    with_conn!(&mut *tx, c => {
        let rows = sqlx::query(&sql(&*c, lock))
            .bind(&caller.0)
            .bind(&req.from)
            .bind(&req.to)
            .fetch_all(&mut *c)
            .await?;
        let balance_of = |account: &str| -> Result<Option<i64>> {
            for row in &rows {
                if row.try_get::<String, _>("id")? == account {
                    return Ok(Some(row.try_get("balance")?));
                }
            }
            Ok(None)
        };
        let from_balance = balance_of(&req.from)?;
        for (account, found) in [(&req.from, from_balance.is_some()), (&req.to, balance_of(&req.to)?.is_some())] {
            if !found {
                // A 4xx before any write: stored as the final outcome.
                return Err(Error::NotFound(format!(
                    "account {account:?} does not exist or does not belong to you"
                )));
            }
        }
        if from_balance < Some(req.amount) {
            return Err(Error::Validation(format!(
                "insufficient funds in account {:?}",
                req.from
            )));
        }
        let moved = sqlx::query(&sql(&*c, MOVE))
            .bind(&req.from)
            .bind(req.amount)
            .bind(req.amount)
            .bind(&caller.0)
            .bind(&req.from)
            .bind(&req.to)
            .bind(&req.from)
            .bind(req.amount)
            .execute(&mut *c)
            .await?
            .rows_affected();
        if moved != 2 {
            // The rows are locked and were checked a moment ago; this is a
            // bug, so answer 5xx: the layer rolls back the debit with the claim.
            return Err(Error::Internal(format!("transfer changed {moved} account rows, not 2")));
        }
        sqlx::query(&sql(&*c, INSERT))
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

/// The tag of this list's cursors.
const CURSOR_TAG: &str = "transfers";

/// Query parameters of `GET /v1/transfers`: a filter and the page.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TransferQuery {
    /// Only transfers whose memo is exactly this: an effect probe for
    /// black-box testers, who put a run-unique marker in the memo and count
    /// how many transfers carry it (indexed).
    pub memo: Option<String>,
    /// Most transfers to answer, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// Lists the caller's transfers, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/transfers",
    tag = "transfers",
    params(TransferQuery),
    responses(
        (status = 200, description = "A page of the caller's transfers, oldest first, with the number matching the filter.", body = TransferList),
        (status = 422, description = "Unknown parameter, a limit out of range or a cursor of another list.", body = idem_spec::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn list_transfers(
    State(app): State<AppState>,
    caller: Principal,
    query: Result<axum::extract::Query<TransferQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<TransferList>> {
    let axum::extract::Query(query) =
        query.map_err(|e| Error::Validation(format!("invalid query: {}", e.body_text())))?;
    let limit = page::limit(query.limit)?;
    let after = query
        .cursor
        .as_deref()
        .map(|c| page::position(CURSOR_TAG, c))
        .transpose()?;
    let memo = query.memo.as_deref();
    let filters: &[&str] = if memo.is_some() { &["memo"] } else { &[] };
    let (count_sql, page_sql) =
        page::statements("transfers", SELECT_TRANSFERS, filters, after.is_some());
    let (count, rows) = with_pool!(&app.store, p => {
        let (count_text, page_text) = (sql(p, &count_sql), sql(p, &page_sql));
        let mut c = sqlx::query_scalar::<_, i64>(&count_text).bind(&caller.0);
        let mut q = sqlx::query(&page_text).bind(&caller.0);
        if let Some(m) = memo {
            c = c.bind(m);
            q = q.bind(m);
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
    let (transfers, next_cursor) = page::finish(CURSOR_TAG, rows, limit, |t| &t.id);
    Ok(Json(TransferList {
        count: usize::try_from(count).unwrap_or_default(),
        transfers,
        next_cursor,
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
    fetch_one(&app, &caller.0, &id)
        .await?
        .map(Json)
        .ok_or_else(|| Error::NotFound(format!("no transfer {id:?}")))
}

/// Reads one transfer by id, bound to its owner.
async fn fetch_one(app: &AppState, owner: &str, id: &str) -> Result<Option<Transfer>> {
    let select = format!("{SELECT_TRANSFERS} AND id = $2");
    with_pool!(&app.store, p => {
        let row = sqlx::query(&sql(p, &select)).bind(owner).bind(id).fetch_optional(p).await?;
        row.as_ref().map(decode).transpose()
    })
}

fn decode<R>(r: &R) -> Result<Transfer>
where
    R: Row,
    for<'a> &'a str: sqlx::ColumnIndex<R>,
    for<'a> String: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
    for<'a> i64: sqlx::Decode<'a, R::Database> + sqlx::Type<R::Database>,
{
    Ok(Transfer {
        id: r.try_get("id")?,
        from: r.try_get("from_account")?,
        to: r.try_get("to_account")?,
        amount: r.try_get("amount")?,
        memo: r.try_get("memo")?,
        created_at: to_rfc3339(r.try_get("created_at")?),
    })
}
