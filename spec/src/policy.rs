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

/// Which outcomes a target stores, as a manifest declares it: one of the
/// named policies, or a table from a status class (`"4xx"`) or a single
/// status (`"400"`) to `stored` or `not_stored`. In a table the single
/// status wins over its class, and a class the table leaves out keeps the
/// contract's rule (2xx and 4xx stored, 5xx not), so `{ "400" =
/// "not_stored" }` reads "everything the contract stores, but 400".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(untagged)]
pub enum FailurePolicyDecl {
    /// A named policy.
    Named(FailurePolicy),
    /// Status classes and statuses, each stored or not.
    Table(std::collections::BTreeMap<String, Storage>),
}

/// Whether a table's statuses are stored.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Storage {
    /// Stored and replayed for the window.
    Stored,
    /// Never stored: a retry with the key executes again.
    NotStored,
}

impl Default for FailurePolicyDecl {
    fn default() -> Self {
        Self::Named(FailurePolicy::default())
    }
}

impl FailurePolicyDecl {
    /// Whether a response with this status is stored under the declaration.
    pub fn stores(&self, status: u16) -> bool {
        match self {
            Self::Named(p) => p.stores(status),
            Self::Table(t) => {
                let class = format!("{}xx", status / 100);
                t.get(&status.to_string())
                    .or_else(|| t.get(&class))
                    .map_or_else(
                        || FailurePolicy::default().stores(status),
                        |s| *s == Storage::Stored,
                    )
            }
        }
    }

    /// Whether it stores exactly what the contract stores.
    pub fn is_contract(&self) -> bool {
        (200..600).all(|s| self.stores(s) == FailurePolicy::default().stores(s))
    }

    /// Checks a table's entries: each a class `2xx` to `5xx` or a status
    /// 200 to 599. Returns the first entry that is neither.
    pub fn invalid_entry(&self) -> Option<&str> {
        let Self::Table(t) = self else {
            return None;
        };
        t.keys().map(String::as_str).find(|k| {
            let class = matches!(*k, "2xx" | "3xx" | "4xx" | "5xx");
            let status = k.len() == 3 && k.parse::<u16>().is_ok_and(|n| (200..600).contains(&n));
            !class && !status
        })
    }

    /// The declaration in a manifest's own words, for notes.
    pub fn describe(&self) -> String {
        match self {
            Self::Named(p) => quoted_name(p),
            Self::Table(t) => {
                let parts: Vec<String> = t
                    .iter()
                    .map(|(k, v)| format!("{k:?} = {}", quoted_name(v)))
                    .collect();
                format!("{{ {} }}", parts.join(", "))
            }
        }
    }
}

/// A unit variant as a manifest spells it, quoted (`"success_only"`): its
/// serde name, so a note can never disagree with what parses.
pub(crate) fn quoted_name<T: Serialize>(v: &T) -> String {
    let name = serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    format!("\"{name}\"")
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

    #[test]
    fn a_declared_table_overrides_the_contract_status_by_status() {
        let t: FailurePolicyDecl =
            serde_json::from_str(r#"{"400": "not_stored", "5xx": "stored"}"#).unwrap();
        assert!(t.stores(201) && t.stores(422) && t.stores(503));
        assert!(!t.stores(400), "the single status wins over its class");
        assert!(!t.is_contract());
        assert_eq!(t.invalid_entry(), None);
        let named: FailurePolicyDecl = serde_json::from_str(r#""success_only""#).unwrap();
        assert_eq!(named, FailurePolicyDecl::Named(FailurePolicy::SuccessOnly));
        assert!(!named.stores(422));
        assert!(FailurePolicyDecl::default().is_contract());
        let same: FailurePolicyDecl = serde_json::from_str(r#"{"2xx": "stored"}"#).unwrap();
        assert!(same.is_contract(), "an entry that repeats the contract");
        let bad: FailurePolicyDecl = serde_json::from_str(r#"{"4XX": "stored"}"#).unwrap();
        assert_eq!(bad.invalid_entry(), Some("4XX"));
        let bad: FailurePolicyDecl = serde_json::from_str(r#"{"600": "stored"}"#).unwrap();
        assert_eq!(bad.invalid_entry(), Some("600"));
        assert_eq!(
            t.describe(),
            r#"{ "400" = "not_stored", "5xx" = "stored" }"#
        );
        assert_eq!(named.describe(), r#""success_only""#);
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
