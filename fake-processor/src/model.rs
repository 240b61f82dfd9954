//! The processor's wire types: charges, the charge list with its call
//! counts, and the fault-injection vocabulary shared by the header and the
//! control endpoint.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::Error;

/// Request header selecting a [`Behavior`] for one `POST /charges`.
pub const BEHAVIOR_HEADER: &str = "Processor-Behavior";

/// Longest delay `slow` accepts, in milliseconds; keeps every test bounded.
pub const MAX_DELAY_MS: u64 = 60_000;

/// The `failure_code` of a declined charge.
pub const DECLINE_CODE: &str = "card_declined";

/// What a client asks to be charged. Unknown fields are refused, so a typo
/// in a test is an error rather than a silently different request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChargeRequest {
    /// Amount in minor units (cents); must be positive.
    pub amount: i64,
    /// ISO 4217 code, three ASCII letters (any case).
    pub currency: String,
    /// Payment source, e.g. a card token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Free text shown on the charge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// Whether the charge moved money.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChargeStatus {
    /// The charge went through (answered 201, then 200 on replay).
    Succeeded,
    /// The charge was declined: a final outcome, answered 402 every time.
    Declined,
}

impl ChargeStatus {
    /// The spelling stored in the database and sent on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Declined => "declined",
        }
    }
}

/// One charge record, as stored and as returned by every charge endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// Processor-assigned id, `ch_` followed by 32 hex digits.
    pub id: String,
    /// The processor-side idempotency key that created it.
    pub idempotency_key: String,
    /// Amount in minor units.
    pub amount: i64,
    /// Currency, as sent.
    pub currency: String,
    /// Payment source, as sent.
    pub source: Option<String>,
    /// Description, as sent.
    pub description: Option<String>,
    /// Outcome of the charge.
    pub status: ChargeStatus,
    /// Why it was declined ([`DECLINE_CODE`]); `None` when it succeeded.
    pub failure_code: Option<String>,
    /// When the processor created it (microsecond precision, so a replay
    /// read back from the database is identical to the first answer).
    pub created_at: DateTime<Utc>,
}

/// The answer of `GET /charges`: everything a test needs to assert "exactly
/// one charge" and "at most one repeated call".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargeList {
    /// Number of charge records (succeeded and declined).
    pub count: u64,
    /// The records, oldest first.
    pub charges: Vec<Charge>,
    /// `POST /charges` calls received per key, every outcome included.
    pub calls_per_key: BTreeMap<String, u64>,
}

impl ChargeList {
    /// Calls received with `key` (0 if never seen).
    pub fn calls_for(&self, key: &str) -> u64 {
        self.calls_per_key.get(key).copied().unwrap_or(0)
    }

    /// Calls received over all keys.
    pub fn total_calls(&self) -> u64 {
        self.calls_per_key.values().sum()
    }

    /// The charge created with `key`, if any.
    pub fn charge_for(&self, key: &str) -> Option<&Charge> {
        self.charges.iter().find(|c| c.idempotency_key == key)
    }

    /// Number of charges with the given status.
    pub fn count_with(&self, status: ChargeStatus) -> usize {
        self.charges.iter().filter(|c| c.status == status).count()
    }
}

/// A fault the processor can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// Create the charge as declined: a stored, final 402. A key that
    /// already has a charge replays it instead, as any repeat does.
    Decline,
    /// Answer 503 with `Retry-After`, storing nothing but the call count,
    /// even for a key that already has a charge: the processor is down.
    Unavailable,
}

/// How the processor treats one `POST /charges`: an optional fault plus a
/// delay before the answer is sent.
///
/// The delay is applied *after* the charge is recorded, so `slow` models the
/// dangerous case of a caller that times out on a charge that did happen.
///
/// Header syntax (`Processor-Behavior`): comma-separated tokens `normal`,
/// `decline`, `unavailable`, `slow=MS`; e.g. `decline, slow=200`. `normal`
/// alone overrides a period set through `/_control`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Behavior {
    /// The fault to inject, if any.
    pub fault: Option<Fault>,
    /// Milliseconds to wait before answering (at most [`MAX_DELAY_MS`]).
    pub delay_ms: u64,
}

impl Behavior {
    /// No fault, no delay.
    pub const NORMAL: Self = Self {
        fault: None,
        delay_ms: 0,
    };
    /// Decline the charge.
    pub const DECLINE: Self = Self {
        fault: Some(Fault::Decline),
        delay_ms: 0,
    };
    /// Answer 503.
    pub const UNAVAILABLE: Self = Self {
        fault: Some(Fault::Unavailable),
        delay_ms: 0,
    };

    /// Succeed, but only after `delay_ms` milliseconds.
    pub fn slow(delay_ms: u64) -> Self {
        Self {
            fault: None,
            delay_ms,
        }
    }

    /// The same behaviour with a delay.
    pub fn with_delay_ms(self, delay_ms: u64) -> Self {
        Self { delay_ms, ..self }
    }

    /// Parses a `Processor-Behavior` header value.
    pub fn parse_header(value: &str) -> Result<Self, Error> {
        let mut out = Self::NORMAL;
        let mut seen_any = false;
        for token in value.split(',').map(str::trim) {
            seen_any = true;
            let fault = match token.to_ascii_lowercase().as_str() {
                "normal" => None,
                "decline" => Some(Fault::Decline),
                "unavailable" => Some(Fault::Unavailable),
                t => {
                    let Some(ms) = t.strip_prefix("slow=") else {
                        return Err(Error::InvalidBehavior(format!(
                            "unknown token {token:?}; expected normal, decline, unavailable or slow=MS"
                        )));
                    };
                    out.delay_ms = parse_delay(ms)?;
                    continue;
                }
            };
            if out.fault.is_some() && fault.is_some() && out.fault != fault {
                return Err(Error::InvalidBehavior(format!(
                    "{value:?} asks for two different faults"
                )));
            }
            out.fault = out.fault.or(fault);
        }
        if !seen_any {
            return Err(Error::InvalidBehavior("empty value".into()));
        }
        Ok(out)
    }

    /// The header value that [`Behavior::parse_header`] reads back as `self`.
    pub fn to_header_value(&self) -> String {
        let fault = match self.fault {
            None => "normal",
            Some(Fault::Decline) => "decline",
            Some(Fault::Unavailable) => "unavailable",
        };
        if self.delay_ms == 0 {
            fault.to_owned()
        } else {
            format!("{fault}, slow={}", self.delay_ms)
        }
    }
}

fn parse_delay(ms: &str) -> Result<u64, Error> {
    let ms: u64 = ms
        .trim()
        .parse()
        .map_err(|_| Error::InvalidBehavior(format!("slow={ms:?} is not a whole number of ms")))?;
    if ms > MAX_DELAY_MS {
        return Err(Error::InvalidBehavior(format!(
            "slow={ms} exceeds the maximum of {MAX_DELAY_MS} ms"
        )));
    }
    Ok(ms)
}

impl FromStr for Behavior {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::parse_header(s)
    }
}

impl fmt::Display for Behavior {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_header_value())
    }
}

/// The `mode` of a control request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlMode {
    /// Behave normally (useful with `slow_ms` only, or to end a period).
    Normal,
    /// Decline every new charge.
    Decline,
    /// Answer 503 to every call.
    Unavailable,
    /// Delay every answer by `slow_ms`.
    Slow,
}

/// Body of `POST /_control`: a behaviour for a period.
///
/// The period ends after `for_secs` seconds or `for_calls` calls to
/// `POST /charges`, whichever comes first; with neither it lasts until
/// `DELETE /_control`. Calls that carry their own `Processor-Behavior`
/// header neither follow nor consume the period. The period lives in
/// memory: a restarted processor behaves normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlRequest {
    /// What to do.
    pub mode: ControlMode,
    /// Delay per answer; required with `slow`, allowed with any mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_ms: Option<u64>,
    /// Length of the period in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_secs: Option<u64>,
    /// Length of the period in calls to `POST /charges`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_calls: Option<u64>,
}

impl ControlRequest {
    /// A period of `mode` with no end, no delay.
    pub fn new(mode: ControlMode) -> Self {
        Self {
            mode,
            slow_ms: None,
            for_secs: None,
            for_calls: None,
        }
    }

    /// Ends the period after `calls` calls.
    pub fn for_calls(self, calls: u64) -> Self {
        Self {
            for_calls: Some(calls),
            ..self
        }
    }

    /// Ends the period after `secs` seconds.
    pub fn for_secs(self, secs: u64) -> Self {
        Self {
            for_secs: Some(secs),
            ..self
        }
    }

    /// Sets the per-answer delay.
    pub fn slow_ms(self, ms: u64) -> Self {
        Self {
            slow_ms: Some(ms),
            ..self
        }
    }

    /// The behaviour the period applies, after validation.
    pub fn behavior(&self) -> Result<Behavior, Error> {
        let delay_ms = match (self.mode, self.slow_ms) {
            (ControlMode::Slow, None) => {
                return Err(Error::InvalidBehavior("mode slow needs slow_ms".into()));
            }
            (_, Some(ms)) => parse_delay(&ms.to_string())?,
            (_, None) => 0,
        };
        let fault = match self.mode {
            ControlMode::Normal | ControlMode::Slow => None,
            ControlMode::Decline => Some(Fault::Decline),
            ControlMode::Unavailable => Some(Fault::Unavailable),
        };
        Ok(Behavior { fault, delay_ms })
    }
}

/// The current period, as `GET`, `POST` and `DELETE /_control` report it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlState {
    /// Whether a period is in force.
    pub active: bool,
    /// The period's fault, if any.
    pub fault: Option<Fault>,
    /// The period's delay per answer.
    pub delay_ms: u64,
    /// Calls left before the period ends, when it is counted in calls.
    pub remaining_calls: Option<u64>,
    /// Milliseconds left before the period ends, when it is timed.
    pub remaining_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_rejects_nonsense() {
        for b in [
            Behavior::NORMAL,
            Behavior::DECLINE,
            Behavior::UNAVAILABLE,
            Behavior::slow(250),
            Behavior::DECLINE.with_delay_ms(5),
        ] {
            assert_eq!(Behavior::parse_header(&b.to_header_value()).ok(), Some(b));
        }
        assert_eq!(
            Behavior::parse_header(" Slow=10 , decline").ok(),
            Some(Behavior::DECLINE.with_delay_ms(10))
        );
        for bad in [
            "",
            "explode",
            "slow=",
            "slow=-1",
            "slow=60001",
            "decline,unavailable",
        ] {
            assert!(Behavior::parse_header(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn control_request_validates_slow() {
        assert!(ControlRequest::new(ControlMode::Slow).behavior().is_err());
        assert_eq!(
            ControlRequest::new(ControlMode::Slow)
                .slow_ms(30)
                .behavior()
                .ok(),
            Some(Behavior::slow(30))
        );
        assert_eq!(
            ControlRequest::new(ControlMode::Unavailable)
                .behavior()
                .ok(),
            Some(Behavior::UNAVAILABLE)
        );
    }
}
