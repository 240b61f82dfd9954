//! A typed client for the processor, for tests (and for the reference
//! server's payment phase, if it wants one).

use std::time::Duration;

use idem_spec::headers::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, RETRY_AFTER};
use idem_spec::{IdempotencyKey, Problem};
use reqwest::StatusCode;

use crate::Error;
use crate::model::{
    BEHAVIOR_HEADER, Behavior, Charge, ChargeList, ChargeRequest, ControlRequest, ControlState,
};

/// How the processor answered one `POST /charges`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChargeOutcome {
    /// 201: this call created the charge.
    Created(Charge),
    /// 200 with `Idempotent-Replayed: true`: the key already had this charge.
    Replayed(Charge),
    /// 402: the charge is declined (a stored, final outcome).
    Declined {
        /// The declined charge record.
        charge: Charge,
        /// Whether this answer was a replay of an earlier decline.
        replayed: bool,
    },
    /// 503: nothing was recorded; retry with the same key after `retry_after`.
    Unavailable {
        /// The `Retry-After` delay, when it was given in seconds.
        retry_after: Option<Duration>,
    },
    /// Any other answer carrying a problem document (400, 409, 422, ...).
    Rejected {
        /// The HTTP status.
        status: u16,
        /// The problem document.
        problem: Problem,
    },
}

impl ChargeOutcome {
    /// The charge, for the outcomes that carry one.
    pub fn charge(&self) -> Option<&Charge> {
        match self {
            Self::Created(c) | Self::Replayed(c) | Self::Declined { charge: c, .. } => Some(c),
            Self::Unavailable { .. } | Self::Rejected { .. } => None,
        }
    }
}

/// A client for one processor instance.
#[derive(Debug, Clone)]
pub struct ProcessorClient {
    http: reqwest::Client,
    base_url: String,
}

impl ProcessorClient {
    /// A client for the processor at `base_url` (`http://127.0.0.1:PORT`),
    /// with a 90 s request timeout: above the longest `slow` delay, so a
    /// wedged processor fails a test instead of hanging it.
    pub fn new(base_url: impl Into<String>) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(90))
            .build()
            .unwrap_or_default();
        Self::with_http(http, base_url)
    }

    /// A client reusing an existing `reqwest::Client` (its timeouts apply).
    pub fn with_http(http: reqwest::Client, base_url: impl Into<String>) -> Self {
        let base_url = base_url.into().trim_end_matches('/').to_owned();
        Self { http, base_url }
    }

    /// The processor's base URL.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// `POST /charges` with `key`, and `behavior` as a `Processor-Behavior`
    /// header when given (`None` leaves the choice to the control period).
    pub async fn create_charge(
        &self,
        key: &IdempotencyKey,
        request: &ChargeRequest,
        behavior: Option<Behavior>,
    ) -> Result<ChargeOutcome, Error> {
        let mut builder = self
            .http
            .post(format!("{}/charges", self.base_url))
            .header(IDEMPOTENCY_KEY, key.to_header_value())
            .json(request);
        if let Some(b) = behavior {
            builder = builder.header(BEHAVIOR_HEADER, b.to_header_value());
        }
        let response = builder.send().await?;
        let status = response.status();
        let replayed = response
            .headers()
            .get(IDEMPOTENT_REPLAYED)
            .is_some_and(|v| v.as_bytes() == b"true");
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        Ok(match status {
            StatusCode::CREATED => ChargeOutcome::Created(response.json().await?),
            StatusCode::OK => ChargeOutcome::Replayed(response.json().await?),
            StatusCode::PAYMENT_REQUIRED => ChargeOutcome::Declined {
                charge: response.json().await?,
                replayed,
            },
            StatusCode::SERVICE_UNAVAILABLE => ChargeOutcome::Unavailable { retry_after },
            other => {
                let text = response.text().await?;
                match serde_json::from_str::<Problem>(&text) {
                    Ok(problem) => ChargeOutcome::Rejected {
                        status: other.as_u16(),
                        problem,
                    },
                    Err(_) => {
                        return Err(Error::UnexpectedStatus {
                            what: "POST /charges",
                            status: other.as_u16(),
                            body: text,
                        });
                    }
                }
            }
        })
    }

    /// `GET /charges`: every charge and the per-key call counts.
    pub async fn charges(&self) -> Result<ChargeList, Error> {
        let response = self
            .http
            .get(format!("{}/charges", self.base_url))
            .send()
            .await?;
        expect_ok(response, "GET /charges")
            .await?
            .json()
            .await
            .map_err(Error::from)
    }

    /// `GET /charges/{id}`; `None` on 404.
    pub async fn charge(&self, id: &str) -> Result<Option<Charge>, Error> {
        let response = self
            .http
            .get(format!("{}/charges/{id}", self.base_url))
            .send()
            .await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        Ok(Some(
            expect_ok(response, "GET /charges/{id}")
                .await?
                .json()
                .await?,
        ))
    }

    /// `POST /_control`: starts a period.
    pub async fn set_control(&self, request: &ControlRequest) -> Result<ControlState, Error> {
        let response = self
            .http
            .post(format!("{}/_control", self.base_url))
            .json(request)
            .send()
            .await?;
        expect_ok(response, "POST /_control")
            .await?
            .json()
            .await
            .map_err(Error::from)
    }

    /// `GET /_control`: the current period.
    pub async fn control(&self) -> Result<ControlState, Error> {
        let response = self
            .http
            .get(format!("{}/_control", self.base_url))
            .send()
            .await?;
        expect_ok(response, "GET /_control")
            .await?
            .json()
            .await
            .map_err(Error::from)
    }

    /// `DELETE /_control`: back to normal.
    pub async fn reset_control(&self) -> Result<ControlState, Error> {
        let response = self
            .http
            .delete(format!("{}/_control", self.base_url))
            .send()
            .await?;
        expect_ok(response, "DELETE /_control")
            .await?
            .json()
            .await
            .map_err(Error::from)
    }

    /// `GET /health`: `Ok` when the processor and its database answer.
    pub async fn health(&self) -> Result<(), Error> {
        let response = self
            .http
            .get(format!("{}/health", self.base_url))
            .send()
            .await?;
        expect_ok(response, "GET /health").await.map(drop)
    }
}

async fn expect_ok(
    response: reqwest::Response,
    what: &'static str,
) -> Result<reqwest::Response, Error> {
    if response.status() == StatusCode::OK {
        return Ok(response);
    }
    let status = response.status().as_u16();
    let body = response.text().await.unwrap_or_default();
    Err(Error::UnexpectedStatus { what, status, body })
}
