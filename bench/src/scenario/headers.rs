//! The request headers every scenario builds from: bearer token, key,
//! `x-user`. Invalid values cannot occur (ASCII ids); they fall back to a
//! value the server rejects, so a bug shows as errors, not as a panic.

use hyper::header::{HeaderName, HeaderValue};

/// `Authorization: Bearer bench-token-{caller}` (idem-server, baseline).
pub fn auth(caller: usize) -> (HeaderName, HeaderValue) {
    (
        hyper::header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer bench-token-{caller}"))
            .unwrap_or(HeaderValue::from_static("Bearer none")),
    )
}

/// `Idempotency-Key: {k}`.
pub fn key(k: &str) -> (HeaderName, HeaderValue) {
    (
        HeaderName::from_static("idempotency-key"),
        HeaderValue::from_str(k).unwrap_or(HeaderValue::from_static("bad")),
    )
}

/// `x-user: {name}` (the minimal app's stand-in authentication).
pub fn user(name: &str) -> (HeaderName, HeaderValue) {
    (
        HeaderName::from_static("x-user"),
        HeaderValue::from_str(name).unwrap_or(HeaderValue::from_static("bad")),
    )
}
