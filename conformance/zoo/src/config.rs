//! What a zoo instance speaks ([`Dialect`]) and which mistake it makes
//! ([`Defect`]), with the names used on the command line and in test tables.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::Error;

/// How one zoo instance behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZooConfig {
    /// The wire spelling of errors, the replay marker and unsupported routes.
    pub dialect: Dialect,
    /// The one deliberate mistake, or `None` for a correct implementation.
    pub defect: Option<Defect>,
    /// How long the handler works before answering, so that concurrent
    /// duplicates really overlap.
    pub delay: Duration,
    /// A correct but unusual behaviour a foreign library has (a replay
    /// marker whose value is not `true`, in-flight duplicates that wait,
    /// ...), or `None`. A manifest can declare each; see [`Quirk`].
    pub quirk: Option<Quirk>,
}

impl Default for ZooConfig {
    fn default() -> Self {
        Self {
            dialect: Dialect::Reference,
            defect: None,
            delay: Duration::ZERO,
            quirk: None,
        }
    }
}

/// A wire dialect: the same behaviour, spelled the way a foreign library
/// spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Dialect {
    /// The contract's reference profile: problem+json with `code`, 409 for
    /// mismatch and in-use, `Idempotent-Replayed: true`.
    Reference,
    /// Plain JSON errors, mismatch 422, marker `Idempotency-Replayed`,
    /// unsupported routes and methods 404.
    PlainJson422,
    /// Plain JSON errors, mismatch 417, no replay marker, unsupported
    /// method 405.
    PlainJson417,
    /// Plain JSON errors, mismatch 400, marker `Idempotent-Replayed`,
    /// unsupported routes and methods 501.
    PlainJson400,
}

impl Dialect {
    /// Every dialect, in declaration order.
    pub const ALL: [Dialect; 4] = [
        Self::Reference,
        Self::PlainJson422,
        Self::PlainJson417,
        Self::PlainJson400,
    ];

    /// The kebab-case name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reference => "reference",
            Self::PlainJson422 => "plain-json-422",
            Self::PlainJson417 => "plain-json-417",
            Self::PlainJson400 => "plain-json-400",
        }
    }

    /// The status of an idempotency-key mismatch.
    pub fn mismatch_status(self) -> u16 {
        match self {
            Self::Reference => 409,
            Self::PlainJson422 => 422,
            Self::PlainJson417 => 417,
            Self::PlainJson400 => 400,
        }
    }

    /// The replay marker header this dialect sends (always with the value
    /// `true`), or `None` when it marks replays not at all.
    pub fn replay_marker(self) -> Option<&'static str> {
        match self {
            Self::Reference | Self::PlainJson400 => Some(idem_spec::headers::IDEMPOTENT_REPLAYED),
            Self::PlainJson422 => Some("Idempotency-Replayed"),
            Self::PlainJson417 => None,
        }
    }

    /// The status for a path the zoo does not serve.
    pub fn unknown_route_status(self) -> u16 {
        match self {
            Self::PlainJson400 => 501,
            _ => 404,
        }
    }

    /// The status for a method a served path does not support.
    pub fn unsupported_method_status(self) -> u16 {
        match self {
            Self::Reference | Self::PlainJson417 => 405,
            Self::PlainJson422 => 404,
            Self::PlainJson400 => 501,
        }
    }

    /// Whether errors are problem+json documents with a `code` member.
    pub fn is_problem_json(self) -> bool {
        self == Self::Reference
    }
}

/// One deliberate idempotency mistake. Each is a small, explicit alternative
/// code path in the handler; see the crate docs for the clause each breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Defect {
    /// Check-then-insert with the delay in between: concurrent duplicates
    /// all execute.
    RaceDoubleExecution,
    /// Keys are not scoped by caller: another caller's key replays its
    /// response.
    GlobalKeySpace,
    /// No fingerprint check: a different body with a used key gets the first
    /// response.
    SilentMismatchReplay,
    /// A 5xx outcome is stored and replayed.
    ServerErrorStored,
    /// A 4xx outcome is not stored: the retry executes again.
    ClientErrorReexecuted,
    /// After completion every retry is answered "in progress" (409) instead
    /// of replayed.
    BrokenReplayAfterCompletion,
    /// Replays omit Location, ETag and the replay marker.
    ReplayHeadersDropped,
    /// The quoted (`"abc"`) and bare (`abc`) spellings are two keys.
    QuotedKeyDistinct,
    /// The in-flight lock is keyed by the key alone, not (caller, key), and
    /// left to expire (2 s) rather than deleted: while one caller's request
    /// runs, and for a while after, another caller's request with the same
    /// key is refused as in use (stored outcomes are scoped right).
    InFlightLockGlobal,
    /// Another caller's request with a used key is executed, and then
    /// answered with the first caller's stored response.
    LeakAfterExecution,
    /// Keys are not scoped by caller, and a response served to another
    /// caller is re-serialised with its JSON members in another order.
    LeakReorderedJson,
    /// A 5xx is not stored, but the key stays taken: every retry with it is
    /// refused with a 422.
    ServerErrorLocksKey,
    /// `Idempotency-Key-Expires` promises a window six days longer than
    /// the one declared.
    ExpiryHeaderLate,
    /// `Request-Deadline-Ms: 0` is ignored: a request whose caller has
    /// given up is executed.
    DeadlineIgnored,
}

impl Defect {
    /// Every defect, in declaration order.
    pub const ALL: [Defect; 14] = [
        Self::RaceDoubleExecution,
        Self::GlobalKeySpace,
        Self::SilentMismatchReplay,
        Self::ServerErrorStored,
        Self::ClientErrorReexecuted,
        Self::BrokenReplayAfterCompletion,
        Self::ReplayHeadersDropped,
        Self::QuotedKeyDistinct,
        Self::InFlightLockGlobal,
        Self::LeakAfterExecution,
        Self::LeakReorderedJson,
        Self::ServerErrorLocksKey,
        Self::ExpiryHeaderLate,
        Self::DeadlineIgnored,
    ];

    /// The kebab-case name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RaceDoubleExecution => "race-double-execution",
            Self::GlobalKeySpace => "global-key-space",
            Self::SilentMismatchReplay => "silent-mismatch-replay",
            Self::ServerErrorStored => "server-error-stored",
            Self::ClientErrorReexecuted => "client-error-reexecuted",
            Self::BrokenReplayAfterCompletion => "broken-replay-after-completion",
            Self::ReplayHeadersDropped => "replay-headers-dropped",
            Self::QuotedKeyDistinct => "quoted-key-distinct",
            Self::InFlightLockGlobal => "in-flight-lock-global",
            Self::LeakAfterExecution => "leak-after-execution",
            Self::LeakReorderedJson => "leak-reordered-json",
            Self::ServerErrorLocksKey => "server-error-locks-key",
            Self::ExpiryHeaderLate => "expiry-header-late",
            Self::DeadlineIgnored => "deadline-ignored",
        }
    }

    /// The class of the failure the defect causes: what the kit must call
    /// it. A defect the kit can only see as a spelling (the quoted and bare
    /// spellings of one key) is `interop`; one that leaves nothing false
    /// believed about effects (a replay that is not the stored response, a
    /// stored 5xx, a final 4xx executed again) `semantics`.
    pub fn class(self) -> idem_spec::clauses::Class {
        use idem_spec::clauses::Class;
        match self {
            Self::RaceDoubleExecution
            | Self::GlobalKeySpace
            | Self::SilentMismatchReplay
            | Self::LeakAfterExecution
            | Self::LeakReorderedJson => Class::Safety,
            // The severity rule: a stored 5xx replayed tells the retry the
            // truth (it failed), and a final 4xx executed again fails again:
            // neither makes a client believe something false about effects.
            Self::ServerErrorStored
            | Self::ClientErrorReexecuted
            | Self::BrokenReplayAfterCompletion
            | Self::ReplayHeadersDropped
            | Self::InFlightLockGlobal
            | Self::ServerErrorLocksKey
            | Self::ExpiryHeaderLate
            | Self::DeadlineIgnored => Class::Semantics,
            Self::QuotedKeyDistinct => Class::Interop,
        }
    }

    /// The contract clause (id in `spec/generated/clauses.json`) this defect
    /// breaks first and foremost.
    pub fn clause(self) -> &'static str {
        match self {
            Self::RaceDoubleExecution => "idem.concurrency.single-effect",
            Self::GlobalKeySpace => "idem.scope.caller",
            Self::SilentMismatchReplay => "idem.fingerprint.mismatch",
            Self::ServerErrorStored => "idem.failure.5xx-not-stored",
            Self::ClientErrorReexecuted => "idem.failure.final-outcomes",
            Self::BrokenReplayAfterCompletion => "idem.replay.verbatim",
            Self::ReplayHeadersDropped => "idem.replay.verbatim",
            Self::QuotedKeyDistinct => "idem.key.syntax",
            Self::InFlightLockGlobal | Self::LeakAfterExecution | Self::LeakReorderedJson => {
                "idem.scope.caller"
            }
            Self::ServerErrorLocksKey => "idem.failure.5xx-not-stored",
            Self::ExpiryHeaderLate => "idem.window.expiry-header",
            Self::DeadlineIgnored => "idem.deadline.spent",
        }
    }
}

/// A correct behaviour in an unusual spelling or shape, as foreign
/// libraries have them. None breaks the contract's behaviour; each needs
/// the manifest to say it (see [`Quirk::declaration`]), and with that the
/// kit must find no `safety` or `semantics` failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Quirk {
    /// After answering a 500 the server drops the connection without
    /// saying `Connection: close`: the next request on it gets no answer.
    ResetAfterServerError,
    /// Errors are `{"error": {"code": "...", "message": "..."}}`: the code
    /// is nested (plain dialects; the reference dialect keeps problem+json).
    NestedErrorCode,
    /// The replay marker's value is `1`, not `true`.
    MarkerValueOne,
    /// An in-flight duplicate is held until the first request finishes and
    /// then answered with its replay, whatever `Prefer` says.
    AlwaysWait,
    /// No in-flight record at all: requests with one key are serialised on
    /// a lock, and the record is written when the first completes.
    NoInFlightState,
    /// Keys must be UUIDs: any other key is refused with 400
    /// `INVALID_UUID_FORMAT` (as several Django libraries and payment APIs
    /// do).
    UuidKeys,
    /// The replay marker's value is the request's key, not `true`.
    MarkerIsKey,
    /// The fingerprint covers the `traceparent` header too, so a retry
    /// with a new trace context is refused as a mismatch.
    FingerprintsTraceparent,
    /// The in-use refusal carries no `Retry-After` (the library never
    /// sends the header at all).
    NoRetryAfter,
    /// The key travels in `webhook-id`, as a webhook receiver reads the
    /// sender's event id; `Idempotency-Key` is ignored.
    KeyInWebhookId,
    /// The key is the event's id in the body, at `/event_id` (as Stripe's
    /// events carry theirs); no header is read.
    KeyInBody,
}

impl Quirk {
    /// Every quirk, in declaration order.
    pub const ALL: [Quirk; 11] = [
        Self::ResetAfterServerError,
        Self::NestedErrorCode,
        Self::MarkerValueOne,
        Self::AlwaysWait,
        Self::NoInFlightState,
        Self::UuidKeys,
        Self::MarkerIsKey,
        Self::FingerprintsTraceparent,
        Self::NoRetryAfter,
        Self::KeyInWebhookId,
        Self::KeyInBody,
    ];

    /// The kebab-case name used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ResetAfterServerError => "reset-after-server-error",
            Self::NestedErrorCode => "nested-error-code",
            Self::MarkerValueOne => "marker-value-one",
            Self::AlwaysWait => "always-wait",
            Self::NoInFlightState => "no-in-flight-state",
            Self::UuidKeys => "uuid-keys",
            Self::MarkerIsKey => "marker-is-key",
            Self::FingerprintsTraceparent => "fingerprints-traceparent",
            Self::NoRetryAfter => "no-retry-after",
            Self::KeyInWebhookId => "key-in-webhook-id",
            Self::KeyInBody => "key-in-body",
        }
    }

    /// What a manifest declares for this quirk, as TOML lines (for docs and
    /// tests; the kit's zoo tests apply the same).
    pub fn declaration(self) -> &'static str {
        match self {
            Self::ResetAfterServerError => "(nothing: the kit opens a new connection after a 5xx)",
            Self::NestedErrorCode => {
                "[profile] code_pointer = \"/error/code\" (and errors by pointer = \"/error/code\", value = ...)"
            }
            Self::MarkerValueOne => "[profile] replay_marker_value = \"1\"",
            Self::AlwaysWait => "[policy] in_flight = \"always_wait\"",
            Self::NoInFlightState => "[policy] in_flight = \"none\"",
            Self::UuidKeys => "[key] format = \"uuid\"",
            Self::MarkerIsKey => "[profile] replay_marker_value = \"{{key}}\"",
            Self::FingerprintsTraceparent => "[policy.fingerprint] headers = [\"traceparent\"]",
            Self::NoRetryAfter => "[profile] absent_headers = [\"Retry-After\"]",
            Self::KeyInWebhookId => "[key] header = \"webhook-id\"",
            Self::KeyInBody => "[key] body_pointer = \"/event_id\"",
        }
    }
}

macro_rules! name_impls {
    ($ty:ident, $what:literal) => {
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = Error;

            fn from_str(s: &str) -> Result<Self, Error> {
                Self::ALL
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| Error::UnknownName {
                        what: $what,
                        name: s.to_owned(),
                        known: Self::ALL.map(|v| v.as_str()).join(", "),
                    })
            }
        }
    };
}

name_impls!(Dialect, "dialect");
name_impls!(Defect, "defect");
name_impls!(Quirk, "quirk");
