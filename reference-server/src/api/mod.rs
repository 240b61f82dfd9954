//! The HTTP surface: the example bank (transfers, and payments through an
//! external processor), the OpenAPI document, health, and the test hooks.

pub mod accounts;
pub mod auth;
pub mod json;
pub mod openapi;
pub mod payments;
pub mod test_hooks;
pub mod transfers;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum_idempotency::clock::{AdjustableClock, Clock};
use axum_idempotency::failpoint::Failpoints;
use axum_idempotency::multistep::MultiStepEndpoint;
use axum_idempotency::{Engine, Store};

/// What every handler can reach.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The store (for reads outside idempotent requests).
    pub store: Store,
    /// The engine behind the idempotency layer.
    pub engine: Engine<Store>,
    /// The clock every time comes from.
    pub clock: Arc<dyn Clock>,
    /// The same clock, when it can be moved (`--test-hooks` only).
    pub test_clock: Option<Arc<AdjustableClock>>,
    /// The failpoint registry (`--test-hooks` only).
    pub failpoints: Option<Arc<Failpoints>>,
    /// Bearer token → caller.
    pub tokens: Arc<BTreeMap<String, String>>,
    /// The profile errors are rendered in.
    pub profile: idem_spec::Profile,
    /// The policy the server publishes (OpenAPI, the book's windows).
    pub policy: idem_spec::Policy,
    /// The multi-step endpoints (`POST /v1/payments` when a processor is
    /// configured), for routing and for the completer.
    pub multistep: Arc<Vec<MultiStepEndpoint<Store>>>,
    /// The deliberate flaws switched on (none without the `flaws` feature).
    pub flaws: crate::flaws::Flaws,
}

/// Renders milliseconds as an RFC 3339 UTC timestamp (for JSON bodies).
pub fn to_rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_rendering_is_utc_with_millis() {
        assert_eq!(super::to_rfc3339(0), "1970-01-01T00:00:00.000Z");
    }
}
