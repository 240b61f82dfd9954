//! Every load scenario's requests, one module per family: [`transfers`]
//! (first, replay, baseline), [`payments`] (payments, processor),
//! [`minimal`] (the minimal app's cells); and the passes that are not
//! load cells: [`concurrent`] (the timed concurrency scenario),
//! [`stages`] (where the minimal app's time goes), [`memory`] (server
//! memory at many connections). [`requests`] maps a [`Scenario`] to its
//! requests.

pub mod concurrent;
pub mod headers;
pub mod memory;
pub mod minimal;
pub mod payments;
pub mod stages;
pub mod transfers;

use crate::config::Scenario;
use crate::load::{Expect, MakeReq};

/// The request maker and expectation of `scenario`; `tag` makes this
/// cell's keys unique in the session.
pub fn requests(
    scenario: Scenario,
    callers: usize,
    replay_keys: usize,
    tag: u64,
) -> (MakeReq, Expect) {
    let fresh = Expect {
        status: 201,
        replayed: Some(false),
    };
    let make = match scenario {
        Scenario::Baseline | Scenario::BaselineFull => transfers::baseline(callers),
        Scenario::First | Scenario::FirstFull => transfers::first(callers, tag),
        Scenario::Replay => return transfers::replay(callers, replay_keys),
        Scenario::Payments => payments::payments(callers, tag),
        Scenario::Processor => payments::processor(tag),
        Scenario::MinWrite
        | Scenario::MinNone
        | Scenario::MinWritePlain
        | Scenario::MinNonePlain
        | Scenario::MinWriteFull
        | Scenario::MinWritePlainFull => minimal::cell(scenario, callers, tag),
    };
    (make, fresh)
}
