//! Bearer-token authentication: turns `Authorization: Bearer TOKEN` into a
//! [`Caller`], the first half of every key's scope.
//!
//! It runs *before* the idempotency layer, so an unauthenticated request is
//! rejected without touching any key (clause `idem.failure.unclaimed`).

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::error::Error;
use crate::layer::Caller;

/// axum middleware: 401 problem unless the request carries a known token.
pub async fn require_bearer(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let mut values = req.headers().get_all(header::AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Error::Unauthenticated("send exactly one Authorization: Bearer <token> header")
            .into_response();
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let Some(caller) = token.and_then(|t| state.tokens.get(t)) else {
        return Error::Unauthenticated("unknown or malformed bearer token").into_response();
    };
    req.extensions_mut().insert(Caller(caller.clone()));
    next.run(req).await
}
