//! The numbers and choices a server publishes: replay window, retention,
//! lease length, in-flight behaviour and failure policy.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Default replay window: 24 hours (clause `idem.window.replay`).
pub const DEFAULT_REPLAY_WINDOW_SECS: u64 = 24 * 60 * 60;
/// Default retention: 72 hours (clause `idem.window.retention`).
pub const DEFAULT_RETENTION_SECS: u64 = 72 * 60 * 60;
/// Default lease on an in-flight key. A live request renews it (a
/// heartbeat every third of it, clause `idem.lease.heartbeat`), so it need
/// not outlast a slow foreign call; short, so a crashed holder's key is
/// taken over well inside a client's default 30 s deadline.
pub const DEFAULT_LEASE_SECS: u64 = 10;
/// Default `Retry-After` on a 409 `idempotency_key_in_use`, in seconds.
pub const DEFAULT_IN_USE_RETRY_AFTER_SECS: u64 = 1;
/// Default longest hold for `Prefer: wait=N`, in seconds.
pub const DEFAULT_MAX_WAIT_SECS: u64 = 10;

/// What a server does with a duplicate that arrives while the original is
/// still in flight.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum InFlightBehaviour {
    /// Answer 409 `idempotency_key_in_use` with `Retry-After` at once.
    Conflict {
        /// Seconds advertised in `Retry-After`.
        retry_after_secs: u64,
    },
    /// Answer 409 at once, unless the client sent `Prefer: wait=N`; then hold
    /// the duplicate up to `min(N, max_wait_secs)` and replay the outcome.
    ConflictOrWait {
        /// Seconds advertised in `Retry-After`.
        retry_after_secs: u64,
        /// The server's upper bound on any wait.
        max_wait_secs: u64,
    },
}

/// Which outcomes are final (stored and replayed) and which are not.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicy {
    /// The contract's policy: 2xx and 4xx are final; 5xx is never stored and
    /// releases the key (clauses `idem.failure.final-outcomes`,
    /// `idem.failure.5xx-not-stored`).
    #[default]
    FinalUnlessServerError,
    /// Every outcome stored, 5xx included (Stripe API v1). Not conforming;
    /// listed so the conformance kit can describe what it observed.
    StoreEverything,
    /// Only 2xx stored. Not conforming: a 4xx retried with the same key can
    /// succeed later with a different meaning.
    SuccessOnly,
}

impl FailurePolicy {
    /// Whether a response with this status is stored under the policy.
    pub fn stores(self, status: u16) -> bool {
        match self {
            Self::FinalUnlessServerError => (200..500).contains(&status),
            Self::StoreEverything => true,
            Self::SuccessOnly => (200..300).contains(&status),
        }
    }
}

/// A server's published idempotency policy.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
pub struct Policy {
    /// How long a completed key is replayed, in seconds.
    pub replay_window_secs: u64,
    /// How long a key record is kept (for recovery and forensics), in
    /// seconds. Never shorter than the replay window.
    pub retention_secs: u64,
    /// Lease on an in-flight key, in seconds; an expired lease may be taken over.
    pub lease_secs: u64,
    /// Duplicates while in flight.
    pub in_flight: InFlightBehaviour,
    /// Which outcomes are stored.
    pub failure_policy: FailurePolicy,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            replay_window_secs: DEFAULT_REPLAY_WINDOW_SECS,
            retention_secs: DEFAULT_RETENTION_SECS,
            lease_secs: DEFAULT_LEASE_SECS,
            in_flight: InFlightBehaviour::ConflictOrWait {
                retry_after_secs: DEFAULT_IN_USE_RETRY_AFTER_SECS,
                max_wait_secs: DEFAULT_MAX_WAIT_SECS,
            },
            failure_policy: FailurePolicy::FinalUnlessServerError,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // clause: idem.failure.final-outcomes, idem.failure.5xx-not-stored
    #[test]
    fn reference_policy_stores_2xx_and_4xx_only() {
        let p = FailurePolicy::default();
        assert!(p.stores(201) && p.stores(402) && p.stores(409));
        assert!(!p.stores(500) && !p.stores(503));
        assert!(FailurePolicy::StoreEverything.stores(500));
        assert!(!FailurePolicy::SuccessOnly.stores(402));
    }

    // clause: idem.window.replay, idem.window.retention
    #[test]
    fn defaults_are_the_published_numbers() {
        let p = Policy::default();
        assert_eq!(p.replay_window_secs, 86_400);
        assert_eq!(p.retention_secs, 259_200);
        assert!(p.retention_secs >= p.replay_window_secs);
    }
}
