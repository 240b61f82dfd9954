//! `GET /v1/accounts`: the caller's accounts and balances, and the demo
//! accounts seeded for every configured caller.

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use sqlx::Row;
use utoipa::ToSchema;

use super::AppState;
use axum_idempotency::{Store, with_pool};

use super::auth::Principal;
use crate::error::{Error, Result};

/// Balance every seeded account starts with, in minor units.
pub const SEED_BALANCE: i64 = 100_000;

/// One account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Account {
    /// `acc_{caller}_{name}`
    pub id: String,
    /// Human name.
    pub name: String,
    /// Minor units.
    pub balance: i64,
}

/// The caller's accounts.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AccountList {
    /// Accounts ordered by id.
    pub accounts: Vec<Account>,
}

/// Creates `acc_{caller}_main` and `acc_{caller}_savings` for each caller,
/// unless they exist (so restarts never reset balances).
pub async fn seed(store: &Store, callers: impl IntoIterator<Item = &str>) -> Result<()> {
    for caller in callers {
        for name in ["main", "savings"] {
            with_pool!(store, p => {
                // An insert that leaves an existing row alone: MySQL spells it
                // ON DUPLICATE KEY UPDATE (INSERT IGNORE would also swallow
                // other errors).
                let insert = if axum_idempotency::store::is_mysql(p) {
                    "INSERT INTO accounts (id, owner, name, balance) VALUES ($1, $2, $3, $4) \
                     ON DUPLICATE KEY UPDATE id = id"
                } else {
                    "INSERT INTO accounts (id, owner, name, balance) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (id) DO NOTHING"
                };
                sqlx::query(&axum_idempotency::store::sql(p, insert))
                .bind(format!("acc_{caller}_{name}"))
                .bind(caller)
                .bind(name)
                .bind(SEED_BALANCE)
                .execute(p)
                .await?;
            });
        }
    }
    Ok(())
}

async fn fetch(app: &AppState, owner: &str, id: Option<&str>) -> Result<Vec<Account>> {
    let sql = if id.is_some() {
        "SELECT id, name, balance FROM accounts WHERE owner = $1 AND id = $2"
    } else {
        "SELECT id, name, balance FROM accounts WHERE owner = $1 ORDER BY id"
    };
    with_pool!(&app.store, p => {
        let text = axum_idempotency::store::sql(p, sql);
        let mut q = sqlx::query(&text).bind(owner);
        if let Some(id) = id {
            q = q.bind(id);
        }
        let rows = q.fetch_all(p).await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            out.push(Account {
                id: r.try_get("id")?,
                name: r.try_get("name")?,
                balance: r.try_get("balance")?,
            });
        }
        Ok(out)
    })
}

/// Lists the caller's accounts, unpaged: the list is bounded by design (two
/// seeded accounts per caller, and no endpoint creates more). A fork that
/// lets callers open accounts pages this list as `GET /v1/transfers` does.
#[utoipa::path(
    get,
    path = "/v1/accounts",
    tag = "accounts",
    responses((status = 200, description = "The caller's accounts.", body = AccountList)),
    security(("bearer" = []))
)]
pub async fn list_accounts(
    State(app): State<AppState>,
    caller: Principal,
) -> Result<Json<AccountList>> {
    Ok(Json(AccountList {
        accounts: fetch(&app, &caller.0, None).await?,
    }))
}

/// Reads one of the caller's accounts.
#[utoipa::path(
    get,
    path = "/v1/accounts/{id}",
    tag = "accounts",
    params(("id" = String, Path, description = "Account id")),
    responses(
        (status = 200, description = "The account.", body = Account),
        (status = 404, description = "No such account for this caller.", body = idem_spec::Problem, content_type = "application/problem+json"),
    ),
    security(("bearer" = []))
)]
pub async fn get_account(
    State(app): State<AppState>,
    caller: Principal,
    Path(id): Path<String>,
) -> Result<Json<Account>> {
    fetch(&app, &caller.0, Some(&id))
        .await?
        .into_iter()
        .next()
        .map(Json)
        .ok_or_else(|| Error::NotFound(format!("no account {id:?}")))
}
