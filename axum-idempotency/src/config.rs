//! [`EngineConfig`]: the engine's tunables, and [`FingerprintPolicy`]:
//! what counts as the same request under one key.
//!
//! Kept apart from the engine so the pieces that read a request
//! ([`crate::request`]) and the engine's loop depend on the settings, not on
//! each other.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_spec::policy::{self, FailurePolicy};
use idem_spec::{Fingerprint, Policy, Profile};

use crate::clock::Millis;

/// Decides what counts as "the same request" under one key (clause
/// `idem.fingerprint.inputs`).
///
/// The default, [`ContractFingerprint`], is the contract's: SHA-256 over
/// method, path with query and the canonical (RFC 8785) JSON body. Replace it
/// only to *narrow* what a request is, e.g. to leave out a field your clients
/// fill with the time of each attempt.
pub trait FingerprintPolicy: Send + Sync + fmt::Debug + 'static {
    /// The fingerprint of one request.
    fn fingerprint(
        &self,
        method: &str,
        path_and_query: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Fingerprint;
}

/// The contract's fingerprint ([`Fingerprint::compute`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct ContractFingerprint;

impl FingerprintPolicy for ContractFingerprint {
    fn fingerprint(
        &self,
        method: &str,
        path_and_query: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Fingerprint {
        Fingerprint::compute(method, path_and_query, content_type, body)
    }
}

/// The default [`EngineConfig::completer_grace`]: long enough for a client
/// that slept the advertised `Retry-After` (rounded up to whole seconds,
/// plus a network round trip) to arrive first.
pub const DEFAULT_COMPLETER_GRACE: Duration = Duration::from_secs(3);

/// Tunables of the engine. [`Default`] gives the published reference policy.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// How long a completed key is replayed (from its first request).
    pub replay_window: Duration,
    /// How long a record is kept before the reaper deletes it.
    pub retention: Duration,
    /// The lease an in-flight key holds.
    pub lease: Duration,
    /// `Retry-After` on 409 `idempotency_key_in_use`.
    pub retry_after_secs: u64,
    /// How long after an in-flight key's lease ends the background
    /// completer ([`crate::jobs::run_completer`]) leaves it to the client's
    /// own retry. A 409 for a key held by a dead process advertises the
    /// lease's end in `Retry-After`, so a client that honours it arrives
    /// before the completer and resumes the request itself, instead of
    /// meeting a 409 again because the completer took the key a moment
    /// earlier. The completer still finishes keys whose client never comes
    /// back.
    pub completer_grace: Duration,
    /// The server's bound on `Prefer: wait=N`.
    pub max_wait: Duration,
    /// While waiting on a key held by *another process*, how often the store
    /// is read again (same-process waits are woken by a notification).
    pub wait_poll_interval: Duration,
    /// Largest request body accepted on idempotent endpoints (413 above).
    pub max_body_bytes: usize,
    /// Largest response body an endpoint may produce (it is stored for
    /// replay; 1 MiB by default). A final response over it cannot be
    /// stored, so it is not sent either: the endpoint's writes roll back
    /// and the client gets `500 internal_error` whose detail names this
    /// setting, logged at WARN, and the key is free again
    /// ([`Error::ResponseTooLarge`](crate::Error::ResponseTooLarge)). A 500
    /// rather than 507: the contract's code for "the server failed, nothing
    /// stored, retry with the key", which every client already handles, and
    /// the cause is the server's configuration, not the request. Raise it,
    /// or answer with a reference to the result (its `Location`).
    pub max_response_bytes: usize,
    /// The status and error codes the engine's own answers use.
    pub profile: Profile,
    /// Which outcomes are final (stored and replayed). Only the default,
    /// [`FailurePolicy::FinalUnlessServerError`], keeps the contract.
    pub failure_policy: FailurePolicy,
    /// What counts as the same request.
    pub fingerprint: Arc<dyn FingerprintPolicy>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        let p = Policy::default();
        Self {
            replay_window: Duration::from_secs(p.replay_window_secs),
            retention: Duration::from_secs(p.retention_secs),
            lease: Duration::from_secs(p.lease_secs),
            retry_after_secs: policy::DEFAULT_IN_USE_RETRY_AFTER_SECS,
            completer_grace: DEFAULT_COMPLETER_GRACE,
            max_wait: Duration::from_secs(policy::DEFAULT_MAX_WAIT_SECS),
            wait_poll_interval: Duration::from_millis(50),
            max_body_bytes: 64 * 1024,
            max_response_bytes: 1024 * 1024,
            profile: Profile::Reference,
            failure_policy: FailurePolicy::FinalUnlessServerError,
            fingerprint: Arc::new(ContractFingerprint),
        }
    }
}

impl EngineConfig {
    /// The published policy these settings amount to.
    pub fn policy(&self) -> Policy {
        Policy {
            replay_window_secs: self.replay_window.as_secs(),
            retention_secs: self.retention.as_secs(),
            lease_secs: self.lease.as_secs(),
            in_flight: idem_spec::policy::InFlightBehaviour::ConflictOrWait {
                retry_after_secs: self.retry_after_secs,
                max_wait_secs: self.max_wait.as_secs(),
            },
            failure_policy: self.failure_policy,
        }
    }
}

pub(crate) fn ms(d: Duration) -> Millis {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_config_publishes_the_reference_policy_and_5xx_is_not_final() {
        assert_eq!(EngineConfig::default().policy(), Policy::default());
        let p = EngineConfig::default().failure_policy;
        assert!(p.stores(201) && p.stores(422) && !p.stores(500) && !p.stores(503));
    }
}
