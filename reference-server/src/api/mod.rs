//! The HTTP surface: the example bank, the OpenAPI document, health, and
//! the test hooks.

pub mod accounts;
pub mod auth;
pub mod json;
pub mod openapi;
pub mod test_hooks;
pub mod transfers;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::clock::{AdjustableClock, Clock};
use crate::engine::Engine;
use crate::store::Store;

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
    /// Bearer token → caller.
    pub tokens: Arc<BTreeMap<String, String>>,
    /// The profile errors are rendered in.
    pub profile: idem_spec::Profile,
}
