//! The payment processor's API, as `POST /v1/payments` uses it: one call,
//! `POST {base}/charges`, with our outbound `Idempotency-Key`.
//!
//! This is the server's own HTTP client of the processor's wire format, the
//! way a real service writes a client for its provider's API. The test
//! double it is run against in tests and the demo (`idem-fake-processor`)
//! is never linked into this binary.
//!
//! | processor answers | means | we do |
//! |---|---|---|
//! | 201 or 200 `Idempotent-Replayed: true` | the charge exists (now, or from an earlier attempt with this key) | record it, go on |
//! | 402 | declined: a final outcome at the processor | store our 402 |
//! | 503, a timeout, a refused connection | nothing recorded there | 503, retry resumes |
//! | another 5xx | the processor failed | 503, retry resumes |
//! | another 4xx | it refused our request: a bug here | 500 |

use std::time::Duration;

use axum_idempotency::RequestDeadline;
use idem_spec::IdempotencyKey;
use idem_spec::headers::{IDEMPOTENCY_KEY, RETRY_AFTER};
use reqwest::StatusCode;
use serde::{Deserialize, Serialize};

/// The body of `POST /charges`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChargeRequest {
    /// Minor units.
    pub amount: i64,
    /// ISO 4217, lower case.
    pub currency: String,
    /// Payment source, e.g. a card token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Shown on the charge.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// What we read of a charge.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Charge {
    /// The processor's id.
    pub id: String,
    /// Why it was declined, when it was.
    #[serde(default)]
    pub failure_code: Option<String>,
}

/// How the processor answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargeOutcome {
    /// The charge exists and succeeded.
    Charged(Charge),
    /// The charge exists and was declined.
    Declined(Charge),
    /// Nothing was recorded; try again after this long (if it said).
    Unavailable {
        /// Its `Retry-After`, in seconds.
        retry_after: Option<Duration>,
    },
    /// Any other answer.
    Failed {
        /// The HTTP status.
        status: u16,
        /// The `code` of its problem document, if it sent one.
        code: Option<String>,
    },
}

/// A client of one processor.
#[derive(Debug, Clone)]
pub struct Processor {
    http: reqwest::Client,
    base_url: String,
    timeout: Duration,
}

impl Processor {
    /// A client of the processor at `base_url`; every call gives up after
    /// `timeout` (keep it below the lease, or a slow call outlives the
    /// key's lease and the completer takes the key over mid-call).
    pub fn new(base_url: &str, timeout: Duration) -> Result<Self, reqwest::Error> {
        Ok(Self {
            http: reqwest::Client::builder().timeout(timeout).build()?,
            base_url: base_url.trim_end_matches('/').to_owned(),
            timeout,
        })
    }

    // ANCHOR: deadline
    /// The timeout of one call: the client's own, or what is left of the
    /// caller's deadline when that is less (clause `idem.deadline.bound`).
    pub fn timeout_for(&self, deadline: Option<RequestDeadline>) -> Duration {
        deadline.map_or(self.timeout, |d| d.bound(self.timeout))
    }
    // ANCHOR_END: deadline

    /// `POST /charges` under `key`, given up after
    /// [`timeout_for`](Self::timeout_for) `deadline`. `Err` is a transport
    /// failure (refused, timed out, unreadable answer): the charge may or
    /// may not exist, and the same call with the same key finds out.
    pub async fn charge(
        &self,
        key: &IdempotencyKey,
        request: &ChargeRequest,
        deadline: Option<RequestDeadline>,
    ) -> Result<ChargeOutcome, reqwest::Error> {
        let response = self
            .http
            .post(format!("{}/charges", self.base_url))
            .timeout(self.timeout_for(deadline))
            .header(IDEMPOTENCY_KEY, key.to_header_value())
            .json(request)
            .send()
            .await?;
        let status = response.status();
        Ok(match status {
            StatusCode::CREATED | StatusCode::OK => ChargeOutcome::Charged(response.json().await?),
            StatusCode::PAYMENT_REQUIRED => ChargeOutcome::Declined(response.json().await?),
            StatusCode::SERVICE_UNAVAILABLE => ChargeOutcome::Unavailable {
                retry_after: response
                    .headers()
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs),
            },
            other => ChargeOutcome::Failed {
                status: other.as_u16(),
                code: response
                    .json::<serde_json::Value>()
                    .await
                    .ok()
                    .and_then(|v| v["code"].as_str().map(str::to_owned)),
            },
        })
    }
}
