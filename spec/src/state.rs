//! The three states of a key and the recovery points of multi-step requests.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Error;

/// Where a key stands (clause `idem.state.three-states`).
///
/// There is no fourth "seen" state: a server that only remembers whether it
/// has seen a key cannot tell a duplicate that must wait (in flight) from one
/// that must be answered from storage (complete).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum KeyState {
    /// Never claimed, or past its replay window: the next request executes.
    Absent,
    /// Claimed by a request that has not finished: duplicates get 409
    /// `idempotency_key_in_use` (or wait, with `Prefer: wait`).
    InFlight,
    /// Finished with a final (2xx or 4xx) response: duplicates get it replayed.
    Complete,
}

/// A named point a multi-step request has durably reached.
///
/// `started` and `finished` are fixed; endpoints name the points between
/// (e.g. `payment_created`, `charge_created`). Names are lower-case
/// snake_case so they are safe in logs, SQL and URLs.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
    utoipa::ToSchema,
)]
#[serde(try_from = "String", into = "String")]
#[schema(value_type = String)]
pub struct RecoveryPoint(String);

impl RecoveryPoint {
    /// Name of the point every claimed key starts at.
    pub const STARTED: &'static str = "started";
    /// Name of the point at which the response is stored.
    pub const FINISHED: &'static str = "finished";

    /// Validates a recovery point name.
    pub fn new(name: impl Into<String>) -> Result<Self, Error> {
        let name = name.into();
        let ok = !name.is_empty()
            && name.len() <= 64
            && name.as_bytes()[0].is_ascii_lowercase()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if ok {
            Ok(Self(name))
        } else {
            Err(Error::RecoveryPointInvalid { name })
        }
    }

    /// The point a freshly claimed key is at.
    pub fn started() -> Self {
        Self(Self::STARTED.to_owned())
    }

    /// The point at which the final response has been stored.
    pub fn finished() -> Self {
        Self(Self::FINISHED.to_owned())
    }

    /// True for [`RecoveryPoint::finished`].
    pub fn is_finished(&self) -> bool {
        self.0 == Self::FINISHED
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for RecoveryPoint {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        Self::new(s)
    }
}

impl From<RecoveryPoint> for String {
    fn from(p: RecoveryPoint) -> String {
        p.0
    }
}

impl std::fmt::Display for RecoveryPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_point_names_are_checked() {
        assert!(RecoveryPoint::new("charge_created").is_ok());
        assert!(RecoveryPoint::new("Charge").is_err());
        assert!(RecoveryPoint::new("").is_err());
        assert!(RecoveryPoint::new("9lives").is_err());
        assert!(serde_json::from_str::<RecoveryPoint>("\"bad name\"").is_err());
        assert!(RecoveryPoint::finished().is_finished());
    }
}
