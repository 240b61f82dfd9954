//! Errors on the wire: RFC 9457 problem details plus a stable `code`, and
//! the status each contract error gets under each profile.
//!
//! The contract names four idempotency errors (missing, invalid, mismatch,
//! in use). Providers agree on 409 for in-use and disagree on the rest, so a
//! [`Profile`] maps each [`ErrorCode`] to the status and code a given
//! provider family uses. The `reference` profile is ours; the others let the
//! reference server imitate, and the conformance kit check, APIs that chose
//! differently.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The media type of every error body (RFC 9457).
pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

/// Where problem `type` URIs point: the book's error page, one anchor per
/// code (`{base}#{code}`). Servers may publish their own copy of the book and
/// override this.
pub const DEFAULT_PROBLEM_TYPE_BASE: &str = "https://idemkit.dev/book/errors.html";

/// A stable, machine-readable error code.
///
/// The first four are the contract's own; the rest are the generic codes a
/// server implementing the contract needs so that *every* error it returns is
/// a problem document with a code.
#[derive(
    Debug,
    Clone,
    Copy,
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
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// An endpoint that requires a key got none.
    IdempotencyKeyMissing,
    /// The key header is malformed, empty, too long, or sent twice.
    IdempotencyKeyInvalid,
    /// The key was used before with a different request fingerprint.
    IdempotencyKeyMismatch,
    /// A request with this key is still being processed.
    IdempotencyKeyInUse,
    /// No or unknown credentials.
    Unauthenticated,
    /// The body is not valid for the declared media type (e.g. broken JSON).
    MalformedBody,
    /// The body's media type is not one the endpoint accepts.
    UnsupportedMediaType,
    /// The body is larger than the endpoint accepts.
    PayloadTooLarge,
    /// The body parsed but its values break the endpoint's rules.
    ValidationFailed,
    /// The addressed resource does not exist (for this caller).
    NotFound,
    /// The method is not allowed on this path.
    MethodNotAllowed,
    /// A payment was declined by the processor (final, replayed).
    PaymentDeclined,
    /// The caller sent too many requests.
    RateLimited,
    /// A foreign system the request depends on is unavailable; retry with the
    /// same key.
    UpstreamUnavailable,
    /// The server failed; nothing was stored and the key was released.
    InternalError,
    /// The caller's deadline (`Request-Deadline-Ms`) was spent before the
    /// request could start: nothing ran, and the key was not claimed.
    DeadlineExceeded,
}

impl ErrorCode {
    /// Every code, in declaration order.
    pub const ALL: [ErrorCode; 16] = [
        Self::IdempotencyKeyMissing,
        Self::IdempotencyKeyInvalid,
        Self::IdempotencyKeyMismatch,
        Self::IdempotencyKeyInUse,
        Self::Unauthenticated,
        Self::MalformedBody,
        Self::UnsupportedMediaType,
        Self::PayloadTooLarge,
        Self::ValidationFailed,
        Self::NotFound,
        Self::MethodNotAllowed,
        Self::PaymentDeclined,
        Self::RateLimited,
        Self::UpstreamUnavailable,
        Self::InternalError,
        Self::DeadlineExceeded,
    ];

    /// The reference spelling of the code (`snake_case`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::IdempotencyKeyMissing => "idempotency_key_missing",
            Self::IdempotencyKeyInvalid => "idempotency_key_invalid",
            Self::IdempotencyKeyMismatch => "idempotency_key_mismatch",
            Self::IdempotencyKeyInUse => "idempotency_key_in_use",
            Self::Unauthenticated => "unauthenticated",
            Self::MalformedBody => "malformed_body",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::PayloadTooLarge => "payload_too_large",
            Self::ValidationFailed => "validation_failed",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::PaymentDeclined => "payment_declined",
            Self::RateLimited => "rate_limited",
            Self::UpstreamUnavailable => "upstream_unavailable",
            Self::InternalError => "internal_error",
            Self::DeadlineExceeded => "deadline_exceeded",
        }
    }

    /// Parses the reference spelling.
    pub fn from_code(code: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == code)
    }

    /// A short, fixed human title (the problem `title`).
    pub fn title(self) -> &'static str {
        match self {
            Self::IdempotencyKeyMissing => "Idempotency-Key header required",
            Self::IdempotencyKeyInvalid => "Idempotency-Key header invalid",
            Self::IdempotencyKeyMismatch => "Idempotency-Key reused with a different request",
            Self::IdempotencyKeyInUse => "A request with this Idempotency-Key is in progress",
            Self::Unauthenticated => "Authentication required",
            Self::MalformedBody => "Malformed request body",
            Self::UnsupportedMediaType => "Unsupported media type",
            Self::PayloadTooLarge => "Request body too large",
            Self::ValidationFailed => "Request failed validation",
            Self::NotFound => "Not found",
            Self::MethodNotAllowed => "Method not allowed",
            Self::PaymentDeclined => "Payment declined",
            Self::RateLimited => "Too many requests",
            Self::UpstreamUnavailable => "Upstream service unavailable",
            Self::InternalError => "Internal server error",
            Self::DeadlineExceeded => "The caller's deadline has passed",
        }
    }

    /// Whether the same request, with the same key, may succeed if retried.
    /// This is the `retryable` member of the problem document.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            Self::IdempotencyKeyInUse
                | Self::RateLimited
                | Self::UpstreamUnavailable
                | Self::InternalError
                | Self::DeadlineExceeded
        )
    }

    /// The HTTP status of this code under `profile`.
    pub fn status(self, profile: Profile) -> u16 {
        self.wire(profile).0
    }

    /// The `code` member of the problem document under `profile`.
    pub fn wire_code(self, profile: Profile) -> &'static str {
        self.wire(profile).1
    }

    /// Status and wire code under a profile. Only the idempotency errors
    /// differ between profiles; the generic codes are the same everywhere.
    fn wire(self, profile: Profile) -> (u16, &'static str) {
        use Profile::*;
        match (self, profile) {
            (Self::IdempotencyKeyMismatch, IetfDraft) => (422, self.as_str()),
            (Self::IdempotencyKeyMismatch, Stripe) => (400, "idempotency_error"),
            (Self::IdempotencyKeyMismatch, Resend) => (409, "invalid_idempotent_request"),
            (Self::IdempotencyKeyInUse, Resend) => (409, "concurrent_idempotent_requests"),
            (Self::IdempotencyKeyInvalid, Resend) => (400, "invalid_idempotency_key"),
            _ => (self.reference_status(), self.as_str()),
        }
    }

    fn reference_status(self) -> u16 {
        match self {
            Self::IdempotencyKeyMissing | Self::IdempotencyKeyInvalid | Self::MalformedBody => 400,
            Self::IdempotencyKeyMismatch | Self::IdempotencyKeyInUse => 409,
            Self::Unauthenticated => 401,
            Self::PaymentDeclined => 402,
            Self::NotFound => 404,
            Self::MethodNotAllowed => 405,
            Self::PayloadTooLarge => 413,
            Self::UnsupportedMediaType => 415,
            Self::ValidationFailed => 422,
            Self::RateLimited => 429,
            Self::InternalError => 500,
            Self::UpstreamUnavailable => 503,
            Self::DeadlineExceeded => 504,
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A family of status codes and error codes for the same contract states.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Default,
    Serialize,
    Deserialize,
    JsonSchema,
    utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// idemkit's own: 400 missing/invalid, 409 mismatch, 409 in use.
    #[default]
    Reference,
    /// draft-ietf-httpapi-idempotency-key-header: 400 missing, 422 mismatch, 409 in flight.
    IetfDraft,
    /// Stripe: 400 `idempotency_error` on mismatch, 409 `idempotency_key_in_use`.
    Stripe,
    /// Resend: 409 `invalid_idempotent_request`, 409 `concurrent_idempotent_requests`.
    Resend,
}

impl Profile {
    /// Every profile.
    pub const ALL: [Profile; 4] = [Self::Reference, Self::IetfDraft, Self::Stripe, Self::Resend];

    /// The kebab-case name used on command lines and in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reference => "reference",
            Self::IetfDraft => "ietf-draft",
            Self::Stripe => "stripe",
            Self::Resend => "resend",
        }
    }

    /// Parses the kebab-case name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == name)
    }
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An RFC 9457 problem document with idemkit's two extension members.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
pub struct Problem {
    /// A URI into the book's error page identifying the problem type.
    #[serde(rename = "type")]
    pub type_uri: String,
    /// Short, fixed summary of the problem type.
    pub title: String,
    /// The HTTP status code, repeated for convenience.
    pub status: u16,
    /// What went wrong with this request, for a human.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// A URI reference identifying this occurrence (e.g. the request path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Machine-readable code (see [`ErrorCode`]; other profiles use their own spellings).
    pub code: String,
    /// Whether retrying the same request with the same key may succeed.
    pub retryable: bool,
}

impl Problem {
    /// Builds the problem for `code` under `profile`, with the default type
    /// URI base.
    pub fn new(code: ErrorCode, profile: Profile, detail: impl Into<String>) -> Self {
        Self::with_base(code, profile, DEFAULT_PROBLEM_TYPE_BASE, detail)
    }

    /// Builds the problem with a chosen type-URI base (`{base}#{code}`).
    pub fn with_base(
        code: ErrorCode,
        profile: Profile,
        base: &str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            type_uri: format!("{base}#{}", code.as_str()),
            title: code.title().to_owned(),
            status: code.status(profile),
            detail: Some(detail.into()),
            instance: None,
            code: code.wire_code(profile).to_owned(),
            retryable: code.retryable(),
        }
    }

    /// Sets `instance`.
    pub fn with_instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = Some(instance.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // clause: idem.errors.profiles
    #[test]
    fn profiles_follow_the_published_table() {
        use ErrorCode::*;
        use Profile::*;
        let row = |c: ErrorCode| Profile::ALL.map(|p| (c.status(p), c.wire_code(p)));
        assert_eq!(
            row(IdempotencyKeyMissing).map(|r| r.0),
            [400, 400, 400, 400]
        );
        assert_eq!(
            row(IdempotencyKeyMismatch).map(|r| r.0),
            [409, 422, 400, 409]
        );
        assert_eq!(row(IdempotencyKeyInUse).map(|r| r.0), [409, 409, 409, 409]);
        assert_eq!(
            IdempotencyKeyMismatch.wire_code(Stripe),
            "idempotency_error"
        );
        assert_eq!(
            IdempotencyKeyMismatch.wire_code(Resend),
            "invalid_idempotent_request"
        );
        assert_eq!(
            IdempotencyKeyInUse.wire_code(Resend),
            "concurrent_idempotent_requests"
        );
        assert_eq!(
            IdempotencyKeyInUse.wire_code(Stripe),
            "idempotency_key_in_use"
        );
        assert_eq!(
            IdempotencyKeyInUse.wire_code(Reference),
            "idempotency_key_in_use"
        );
    }

    // clause: idem.errors.problem-json
    #[test]
    fn problem_serialises_with_rfc9457_members() {
        let p = Problem::new(
            ErrorCode::IdempotencyKeyInUse,
            Profile::Reference,
            "try again",
        )
        .with_instance("/v1/transfers");
        let v = serde_json::to_value(&p).expect("serialise");
        assert_eq!(
            v["type"],
            "https://idemkit.dev/book/errors.html#idempotency_key_in_use"
        );
        assert_eq!(v["status"], 409);
        assert_eq!(v["code"], "idempotency_key_in_use");
        assert_eq!(v["retryable"], true);
        assert_eq!(v["instance"], "/v1/transfers");
    }

    #[test]
    fn codes_round_trip() {
        for c in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_code(c.as_str()), Some(c));
            let json = serde_json::to_string(&c).expect("serialise");
            assert_eq!(json, format!("\"{}\"", c.as_str()));
        }
        for p in Profile::ALL {
            assert_eq!(Profile::from_name(p.as_str()), Some(p));
        }
    }
}
