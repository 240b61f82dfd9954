//! The payment scenarios of issue 13: `payments` (multi-step, through the
//! fake processor) on idem-server, and `processor`, the fake processor's
//! own `POST /charges`, the rate a payment cannot exceed.

use std::sync::Arc;

use bytes::Bytes;

use super::headers::{auth, key};
use crate::load::{MakeReq, Req};

const CHARGE: &str = r#"{"amount":1250,"currency":"usd","source":"tok_visa"}"#;

/// `payments`: `POST /v1/payments`, fresh keys.
pub fn payments(callers: usize, tag: u64) -> MakeReq {
    Arc::new(move |w, n| Req {
        path: "/v1/payments",
        headers: vec![auth(w % callers), key(&format!("p{tag}-{w}-{n}"))],
        body: Bytes::from_static(CHARGE.as_bytes()),
    })
}

/// `processor`: `POST /charges` on the fake processor, fresh keys.
pub fn processor(tag: u64) -> MakeReq {
    Arc::new(move |w, n| Req {
        path: "/charges",
        headers: vec![key(&format!("x{tag}-{w}-{n}"))],
        body: Bytes::from_static(CHARGE.as_bytes()),
    })
}
