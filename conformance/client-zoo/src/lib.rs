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

/// The JSON body of the one state-changing call every zoo client makes (`key-in-body` adds
/// its key to it as `"idempotency_key"`).
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

/// One client of the zoo: idem-client itself, or a small SDK with exactly one defect (or, for
/// a few, none: a quirk the kit must not mistake for one).
///
/// Each SDK client differs from the contract in one flag of the shared hand-written retry
/// loop (`no-deadline-short-hang` also in one number that is no defect by itself), so the kit
/// should fail it on its own clause ([`ZooClient::defect`]), in its own class
/// ([`ZooClient::severity`]), and on no other clause in safety.
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
    /// Retries a final 409 (a mismatch, a conflict) with the same key, as the Stripe SDKs do.
    Retries409,
    /// Honours every `Retry-After` in full, 60 s included, and has no overall deadline.
    LongHintNoDeadline,
    /// No overall deadline; 3 attempts of 11 s against a hanging server end just under the
    /// kit's kill bound.
    NoDeadlineShortHang,
    /// Resends at once, with no sleep, after a lost connection.
    ZeroBackoffAfterReset,
    /// Jitter over 75 to 100 % of the exponential ceiling: jitter all the same.
    NarrowJitter,
    /// Gets its 2xx and then fails the call: its result type needs an `id` the body lacks.
    ExitsOneAfterSuccess,
    /// Its key is a field of the JSON body, `idempotency_key`, not a header.
    KeyInBody,
    /// No key; resends a tracing id, `x-ms-client-request-id`, as if it were one.
    TracingIdOnly,
    /// The conforming client with a 2 s start-up before anything else.
    SlowStart,
    /// Counts neither lost connections nor timeouts against its attempt cap or send ceiling.
    ResetsUncounted,
}

/// How bad a zoo client's defect is, by the contract's severity rule: the class the kit must
/// give its finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Severity {
    /// A behaviour that can make a correct server believe something false about effects: a
    /// second effect of one operation (a key-less state-changing request resent after it may
    /// have been sent, a fresh key per attempt).
    Safety,
    /// Anything else that breaks the contract: a final 4xx retried with the same key, an
    /// ignored hint, a missing deadline, backoff without jitter, ...
    Semantics,
}

/// The clients that run idem-client rather than the hand-written SDK loop of `src/sdk.rs`.
const IDEM_CLIENT_ONES: [ZooClient; 2] = [ZooClient::Conforming, ZooClient::SlowStart];

/// How long `slow-start` takes to start, before its first request.
pub const SLOW_START: std::time::Duration = std::time::Duration::from_secs(2);

impl ZooClient {
    /// Every client, conforming first, in the order of the crate's table.
    pub const ALL: [ZooClient; 19] = [
        ZooClient::Conforming,
        ZooClient::NoJitter,
        ZooClient::FreshKeyPerAttempt,
        ZooClient::Retries400,
        ZooClient::IgnoresRetryAfter,
        ZooClient::NoAttemptCap,
        ZooClient::DeadlineResetPerAttempt,
        ZooClient::ResendsKeylessAfterReset,
        ZooClient::NoKey,
        ZooClient::Retries409,
        ZooClient::LongHintNoDeadline,
        ZooClient::NoDeadlineShortHang,
        ZooClient::ZeroBackoffAfterReset,
        ZooClient::NarrowJitter,
        ZooClient::ExitsOneAfterSuccess,
        ZooClient::KeyInBody,
        ZooClient::TracingIdOnly,
        ZooClient::SlowStart,
        ZooClient::ResetsUncounted,
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
            ZooClient::Retries409 => "retries-409",
            ZooClient::LongHintNoDeadline => "long-hint-no-deadline",
            ZooClient::NoDeadlineShortHang => "no-deadline-short-hang",
            ZooClient::ZeroBackoffAfterReset => "zero-backoff-after-reset",
            ZooClient::NarrowJitter => "narrow-jitter",
            ZooClient::ExitsOneAfterSuccess => "exits-1-after-success",
            ZooClient::KeyInBody => "key-in-body",
            ZooClient::TracingIdOnly => "tracing-id-only",
            ZooClient::SlowStart => "slow-start",
            ZooClient::ResetsUncounted => "resets-uncounted",
        }
    }

    /// The client clause this client violates (`None` when it violates none): what the kit
    /// must find.
    pub fn defect(&self) -> Option<&'static str> {
        match self {
            ZooClient::Conforming
            | ZooClient::NarrowJitter
            | ZooClient::KeyInBody
            | ZooClient::SlowStart => None,
            // Its defect is the command's exit code disagreeing with the answer it got.
            ZooClient::ExitsOneAfterSuccess => Some("idem.client.outcome"),
            ZooClient::NoJitter => Some("idem.client.no-unjittered-backoff"),
            ZooClient::FreshKeyPerAttempt => Some("idem.client.same-key"),
            ZooClient::Retries400 | ZooClient::Retries409 => Some("idem.client.allowlist"),
            ZooClient::IgnoresRetryAfter => Some("idem.client.retry-after"),
            // Bounded by its deadline alone: the count MUST of the contract.
            ZooClient::NoAttemptCap => Some("idem.client.attempt-cap"),
            // Its ceiling of 10 sends holds; only the 3 attempts miss what it does not count.
            ZooClient::ResetsUncounted => Some("idem.client.max-attempts"),
            ZooClient::DeadlineResetPerAttempt
            | ZooClient::LongHintNoDeadline
            | ZooClient::NoDeadlineShortHang => Some("idem.client.deadline"),
            // It does not wait a random delay between retries: it does not wait at all (the
            // clause's draw from [0, c] lands at zero by chance, never every time).
            ZooClient::ZeroBackoffAfterReset => Some("idem.client.backoff-jitter"),
            ZooClient::ResendsKeylessAfterReset | ZooClient::NoKey | ZooClient::TracingIdOnly => {
                Some("idem.client.no-key-no-retry")
            }
        }
    }

    /// The class the kit must give this client's finding (`None`: the kit must let it
    /// conform). Safety is a second effect of one operation made possible; every other
    /// defect, a same-key retry of a final 4xx included, is semantics.
    pub fn severity(&self) -> Option<Severity> {
        match self {
            ZooClient::Conforming
            | ZooClient::NarrowJitter
            | ZooClient::KeyInBody
            | ZooClient::SlowStart => None,
            ZooClient::FreshKeyPerAttempt
            | ZooClient::ResendsKeylessAfterReset
            | ZooClient::NoKey
            | ZooClient::TracingIdOnly => Some(Severity::Safety),
            ZooClient::NoJitter
            | ZooClient::Retries400
            | ZooClient::IgnoresRetryAfter
            | ZooClient::NoAttemptCap
            | ZooClient::DeadlineResetPerAttempt
            | ZooClient::Retries409
            | ZooClient::LongHintNoDeadline
            | ZooClient::NoDeadlineShortHang
            | ZooClient::ZeroBackoffAfterReset
            | ZooClient::ExitsOneAfterSuccess
            | ZooClient::ResetsUncounted => Some(Severity::Semantics),
        }
    }

    /// The extra arguments the kit's `client` subcommand needs to judge this client as the
    /// table says: where `key-in-body`'s key travels. Every other client takes the kit's
    /// defaults; `exits-1-after-success` must keep the default success body (`{}`), which
    /// its SDK cannot parse.
    pub fn kit_args(&self) -> &'static [&'static str] {
        match self {
            ZooClient::KeyInBody => &["--key-pointer", "/idempotency_key"],
            _ => &[],
        }
    }

    /// The hand-written SDK's flags for this client: the contract's, with this client's one
    /// defect flipped (the idem-client ones get the contract's own, though [`call`] runs
    /// idem-client for them).
    fn behaviour(self) -> sdk::Behaviour {
        let mut b = sdk::Behaviour::CONTRACT;
        match self {
            ZooClient::Conforming | ZooClient::SlowStart => {}
            ZooClient::NoJitter => b.jitter = sdk::Jitter::None,
            ZooClient::FreshKeyPerAttempt => b.keys = sdk::Keys::PerAttempt,
            ZooClient::Retries400 => b.retry_400 = true,
            ZooClient::IgnoresRetryAfter => b.honour_retry_after = false,
            ZooClient::NoAttemptCap => b.attempt_cap = false,
            ZooClient::DeadlineResetPerAttempt => b.deadline = sdk::Deadline::PerAttempt,
            ZooClient::ResendsKeylessAfterReset => b.key_survives_reset = false,
            ZooClient::NoKey => b.keys = sdk::Keys::Never,
            ZooClient::Retries409 => b.retry_final_409 = true,
            ZooClient::LongHintNoDeadline | ZooClient::NoDeadlineShortHang => {
                b.deadline = sdk::Deadline::None;
            }
            ZooClient::ZeroBackoffAfterReset => b.backoff_after_reset = false,
            ZooClient::NarrowJitter => b.jitter = sdk::Jitter::Narrow,
            ZooClient::ExitsOneAfterSuccess => b.success_needs_id = true,
            ZooClient::KeyInBody => b.keys = sdk::Keys::InBody,
            ZooClient::TracingIdOnly => b.keys = sdk::Keys::TracingId,
            ZooClient::ResetsUncounted => b.count_transport_failures = false,
        }
        b
    }

    /// The hand-written SDK's numbers for this client: the contract's defaults, except
    /// `no-attempt-cap`'s 2 s backoff cap and `no-deadline-short-hang`'s 11 s attempt timeout.
    /// A 2 s cap is no defect by itself (several SDKs cap their backoff lower); with no bound
    /// on the count it makes the client send at least 21 requests before its 30 s deadline,
    /// so its unbounded count shows (the kit stops it past 15). Under the 20 s cap the same
    /// client would send about 8, which no black box can tell from a bound of 8.
    ///
    /// `no-deadline-short-hang`'s attempt timeout: That number is no defect by itself;
    /// with no overall deadline it makes the hang scenario take 3 × 11 s plus its two jittered
    /// backoffs (at most 0.5 s and 1 s): 33 to 34.5 s from the first attempt, past the 30 s
    /// deadline by more than the kit's tolerance (1 s or 5 %: 1.5 s), yet under its kill bound
    /// (the deadline plus a grace of at least 5 s: 35 s or later).
    fn timing(self) -> sdk::Timing {
        match self {
            ZooClient::NoAttemptCap => sdk::Timing {
                cap: std::time::Duration::from_secs(2),
                ..sdk::Timing::DEFAULT
            },
            ZooClient::NoDeadlineShortHang => sdk::Timing {
                attempt_timeout: std::time::Duration::from_secs(11),
                ..sdk::Timing::DEFAULT
            },
            _ => sdk::Timing::DEFAULT,
        }
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
///
/// `slow-start` first waits [`SLOW_START`], as an SDK that loads its configuration before
/// anything else would.
pub async fn call(client: ZooClient, base_url: &str, seed: u64) -> bool {
    let url = format!("{}{PATH}", base_url.trim_end_matches('/'));
    if client == ZooClient::SlowStart {
        tokio::time::sleep(SLOW_START).await;
    }
    if IDEM_CLIENT_ONES.contains(&client) {
        conforming::call(&url, seed).await
    } else {
        sdk::call(client.behaviour(), client.timing(), &url, seed).await
    }
}
