//! The minimal app's load cells (issues 19 and 33): one row or nothing,
//! with the layer (`/idem/*`, fresh keys) and without it (`/plain/*`).
//! The app itself is [`crate::minimal`].

use std::sync::Arc;

use bytes::Bytes;

use super::headers::{key, user};
use crate::config::Scenario;
use crate::load::{MakeReq, Req};

/// The minimal app's body: `{"text": id}` (ids are plain ASCII, unique
/// per request, so the effects can be counted by text).
pub fn note(id: &str) -> Bytes {
    Bytes::from(format!(r#"{{"text":"{id}"}}"#))
}

/// The route of a minimal-app scenario and whether it has the layer.
fn route(scenario: Scenario) -> (&'static str, bool) {
    match scenario {
        Scenario::MinWrite | Scenario::MinWriteFull => ("/idem/write", true),
        Scenario::MinNone => ("/idem/none", true),
        Scenario::MinWritePlain | Scenario::MinWritePlainFull => ("/plain/write", false),
        _ => ("/plain/none", false),
    }
}

/// A minimal-app cell: worker `w` is user `u{w % callers}`; with the layer
/// every request has a fresh key.
pub fn cell(scenario: Scenario, callers: usize, tag: u64) -> MakeReq {
    let (path, layer) = route(scenario);
    Arc::new(move |w, n| {
        let id = format!("m{tag}-{w}-{n}");
        let mut headers = vec![user(&format!("u{}", w % callers))];
        if layer {
            headers.push(key(&id));
        }
        Req {
            path,
            headers,
            body: note(&id),
        }
    })
}
