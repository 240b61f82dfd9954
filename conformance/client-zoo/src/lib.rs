#![doc = include_str!("../README.md")]

mod conforming;
#[cfg(test)]
mod script;
mod sdk;
#[cfg(test)]
mod tests;

use std::fmt;
use std::str::FromStr;

/// The path every zoo client posts to, under the base URL it is given.
pub const PATH: &str = "/payments";

/// The JSON body of the one state-changing call every zoo client makes.
pub const BODY: &str = r#"{"amount":1000}"#;

/// The reqwest client under every zoo client: the defaults, but never through a proxy from the
/// environment (`HTTP_PROXY`), because the kit's API is on 127.0.0.1 and the zoo is hermetic.
fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot build the client without proxies; using the default");
            reqwest::Client::new()
        })
}

/// The one error type of `idem-client-zoo`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A client name that is not in the zoo.
    #[error("unknown client {name:?}; the zoo has: {}", ZooClient::names())]
    UnknownClient {
        /// The name that was given.
        name: String,
    },
}

/// One client of the zoo: idem-client itself, or a small SDK with exactly one defect.
///
/// Each defective client differs from the contract in one flag of the shared hand-written
/// retry loop, so the kit should fail it on its own clause ([`ZooClient::defect`]) and on no
/// other clause in safety.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ZooClient {
    /// `idem-client`'s reqwest middleware with its default policy and automatic key.
    Conforming,
    /// Exponential backoff without jitter: 500 ms, 1 s, 2 s, ...
    NoJitter,
    /// Mints a new key for every attempt instead of once per operation.
    FreshKeyPerAttempt,
    /// Treats `400 Bad Request` as retryable.
    Retries400,
    /// Sleeps its own backoff and never reads `Retry-After`.
    IgnoresRetryAfter,
    /// Retries retryable answers until its 30 s deadline, with no attempt cap.
    NoAttemptCap,
    /// Gives every attempt a full 30 s and restarts its deadline per attempt.
    DeadlineResetPerAttempt,
    /// Resends without its key after a connection reset.
    ResendsKeylessAfterReset,
    /// Never sends `Idempotency-Key`, and retries anyway.
    NoKey,
}

impl ZooClient {
    /// Every client, conforming first, in the order of the crate's table.
    pub const ALL: [ZooClient; 9] = [
        ZooClient::Conforming,
        ZooClient::NoJitter,
        ZooClient::FreshKeyPerAttempt,
        ZooClient::Retries400,
        ZooClient::IgnoresRetryAfter,
        ZooClient::NoAttemptCap,
        ZooClient::DeadlineResetPerAttempt,
        ZooClient::ResendsKeylessAfterReset,
        ZooClient::NoKey,
    ];

    /// The kebab-case name the binary's `--client` takes and reports print.
    pub fn name(&self) -> &'static str {
        match self {
            ZooClient::Conforming => "conforming",
            ZooClient::NoJitter => "no-jitter",
            ZooClient::FreshKeyPerAttempt => "fresh-key-per-attempt",
            ZooClient::Retries400 => "retries-400",
            ZooClient::IgnoresRetryAfter => "ignores-retry-after",
            ZooClient::NoAttemptCap => "no-attempt-cap",
            ZooClient::DeadlineResetPerAttempt => "deadline-reset-per-attempt",
            ZooClient::ResendsKeylessAfterReset => "resends-keyless-after-reset",
            ZooClient::NoKey => "no-key",
        }
    }

    /// The client clause this client violates (`None` for the conforming one): what the kit
    /// must find.
    pub fn defect(&self) -> Option<&'static str> {
        match self {
            ZooClient::Conforming => None,
            ZooClient::NoJitter => Some("idem.client.no-unjittered-backoff"),
            ZooClient::FreshKeyPerAttempt => Some("idem.client.same-key"),
            ZooClient::Retries400 => Some("idem.client.allowlist"),
            ZooClient::IgnoresRetryAfter => Some("idem.client.retry-after"),
            ZooClient::NoAttemptCap => Some("idem.client.max-attempts"),
            ZooClient::DeadlineResetPerAttempt => Some("idem.client.deadline"),
            ZooClient::ResendsKeylessAfterReset | ZooClient::NoKey => {
                Some("idem.client.no-key-no-retry")
            }
        }
    }

    /// The hand-written SDK's flags for this client: the contract's, with this client's one
    /// defect flipped ([`ZooClient::Conforming`] gets the contract's own, though [`call`] runs
    /// idem-client for it).
    fn behaviour(self) -> sdk::Behaviour {
        let mut b = sdk::Behaviour::CONTRACT;
        match self {
            ZooClient::Conforming => {}
            ZooClient::NoJitter => b.jitter = false,
            ZooClient::FreshKeyPerAttempt => b.keys = sdk::Keys::PerAttempt,
            ZooClient::Retries400 => b.retry_400 = true,
            ZooClient::IgnoresRetryAfter => b.honour_retry_after = false,
            ZooClient::NoAttemptCap => b.attempt_cap = false,
            ZooClient::DeadlineResetPerAttempt => b.overall_deadline = false,
            ZooClient::ResendsKeylessAfterReset => b.key_survives_reset = false,
            ZooClient::NoKey => b.keys = sdk::Keys::Never,
        }
        b
    }

    fn names() -> String {
        Self::ALL.map(|c| c.name()).join(", ")
    }
}

impl fmt::Display for ZooClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ZooClient {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| Error::UnknownClient { name: s.to_owned() })
    }
}

/// Makes one state-changing call through `client`: a `POST` of [`BODY`] to
/// `{base_url}/payments`, with everything the client does to get an answer (keys, retries,
/// sleeps). True iff the final answer was a 2xx.
///
/// `seed` seeds the jitter (idem-client's, or the SDK's `StdRng`): the same seed draws the same
/// delays, so a run can be reproduced; keys are always random, because every call is a new
/// operation.
pub async fn call(client: ZooClient, base_url: &str, seed: u64) -> bool {
    let url = format!("{}{PATH}", base_url.trim_end_matches('/'));
    match client {
        ZooClient::Conforming => conforming::call(&url, seed).await,
        other => sdk::call(other.behaviour(), sdk::Timing::DEFAULT, &url, seed).await,
    }
}
