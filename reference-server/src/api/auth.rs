//! Bearer-token authentication: turns `Authorization: Bearer TOKEN` into a
//! [`Principal`] (who the request acts for: the handlers check ownership
//! with it) and an `axum_idempotency::Caller` (who its idempotency keys
//! belong to, clause `idem.scope.caller`).
//!
//! They are the same name here. They are two types because they are two
//! decisions: an application may scope keys per tenant while it checks
//! ownership per user, and a deliberately flawed build (`global-keys`)
//! changes only the scope.
//!
//! It runs *before* the idempotency layer, so an unauthenticated request is
//! rejected without touching any key (clause `idem.failure.unclaimed`).

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum_idempotency::Caller;

use super::AppState;
use crate::error::Error;

/// The authenticated caller's name, for ownership checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Principal {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Error> {
        parts
            .extensions
            .get::<Principal>()
            .cloned()
            .ok_or(Error::Unauthenticated("send Authorization: Bearer <token>"))
    }
}

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
    req.extensions_mut().insert(Principal(caller.clone()));
    req.extensions_mut().insert(Caller::new(caller.clone()));
    next.run(req).await
}
