//! The conformance kit's target manifest: what a vendor declares about its
//! API so the kit can check it against the contract, black-box, over HTTP.
//!
//! The manifest is TOML on disk; its JSON Schema is generated from these
//! types (`spec/generated/schemas/Manifest.schema.json`), so editors and CI
//! can validate a manifest without running the kit. Loading, template
//! expansion and validation with readable errors live in the kit
//! (`idem-conformance`); this module only defines the shape.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::policy::{FailurePolicyDecl, quoted_name};
use crate::problem::Profile;

/// A target manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Which API is under test.
    pub target: Target,
    /// The status and code table the target claims to follow.
    #[serde(default)]
    pub profile: ProfileDecl,
    /// Two or more identities; per-caller scoping needs at least two.
    pub callers: Vec<Caller>,
    /// The idempotent endpoints to exercise. The first is the main one.
    pub endpoints: Vec<Endpoint>,
    /// What the target says it does; cases check the declaration.
    #[serde(default)]
    pub policy: DeclaredPolicy,
    /// How the kit counts side effects.
    pub probe: EffectProbe,
    /// Optional test hooks; a case needing an undeclared hook is `unsupported`.
    #[serde(default)]
    pub hooks: Hooks,
    /// Safety limits the run never exceeds.
    #[serde(default)]
    pub limits: Limits,
    /// Cases the vendor waives, each with a reason.
    #[serde(default)]
    pub waivers: Vec<Waiver>,
    /// The grammar the target accepts for keys, when narrower than the
    /// contract's (1 to 255 visible ASCII characters): every key the kit
    /// sends to use, not to test, follows it.
    #[serde(default)]
    pub key: KeyDecl,
}

/// The key grammar a target accepts. The kit's keys stay unique per run in
/// any grammar: they are derived from the run ID and a counter.
#[derive(
    Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(deny_unknown_fields)]
pub struct KeyDecl {
    /// The key's form: `any` (the contract's grammar, default) or `uuid`
    /// (an RFC 9562 UUID in its hyphenated lowercase form, version 4).
    #[serde(default)]
    pub format: KeyFormat,
    /// The longest key accepted, in characters. Default: the contract's 255.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_len: Option<u16>,
    /// A prefix every key must start with (e.g. `idk_`). Not with `uuid`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prefix: String,
    /// The characters accepted after the prefix. Default: `visible` (the
    /// contract's visible ASCII).
    #[serde(default)]
    pub charset: KeyCharset,
    /// The request header the key travels in, when it is not
    /// `Idempotency-Key`: a webhook receiver's `webhook-id`, say. Every
    /// case sends its key there (the wrong-header case still sends one in
    /// `X-Idempotency-Key`, which must be ignored). Default: none (the
    /// contract's header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// A JSON pointer (RFC 6901) into the request body where the key
    /// travels instead of a header (Stripe's event `id`: `/id`): the kit
    /// writes every key there, and the cases that test the key header's
    /// own grammar are `unsupported`. Not with `header`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_pointer: Option<String>,
}

/// A key's form.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum KeyFormat {
    /// Any string the contract's grammar and the declared charset and length allow.
    #[default]
    Any,
    /// A UUID, hyphenated and lowercase (`3f2c...-4...`).
    Uuid,
}

/// Characters a key may use after its prefix.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum KeyCharset {
    /// Visible ASCII, 0x21 to 0x7E (the contract's).
    #[default]
    Visible,
    /// Letters, digits, `-` and `_`.
    AlnumDash,
    /// Letters and digits.
    Alnum,
    /// Lowercase hexadecimal digits.
    Hex,
}

/// The API under test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// A name for reports.
    pub name: String,
    /// Base URL every path is joined to, e.g. `https://sandbox.example.com`.
    pub base_url: String,
    /// Path (or URL) of the target's OpenAPI document, if it publishes one;
    /// the kit looks there for the published replay window and retention.
    #[serde(default)]
    pub openapi_url: Option<String>,
}

/// The wire dialect a target declares: one of the published profiles,
/// optionally with per-error overrides (a custom table), its replay marker
/// and how it answers a route or method it does not serve.
///
/// The kit judges behaviour (was the duplicate executed? was the mismatch
/// refused?) the same way whatever is declared here; the declaration only
/// tells it how to recognise each answer. Where the declared spelling is
/// not the contract's, the kit reports an `interop` finding, never a
/// `safety` or `semantics` one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfileDecl {
    /// The published profile the table starts from.
    #[serde(default)]
    pub base: Profile,
    /// Overrides keyed by contract error code (`idempotency_key_missing`,
    /// `idempotency_key_invalid`, `idempotency_key_mismatch`,
    /// `idempotency_key_in_use`).
    #[serde(default)]
    pub errors: BTreeMap<String, WireError>,
    /// The response header that marks a replay (with the value `true`), or
    /// `"none"` when replays are not marked. Default: the contract's
    /// `Idempotent-Replayed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_marker: Option<String>,
    /// The value of the replay marker header on a replay, compared without
    /// regard to case (e.g. `"1"`, `"yes"`), or `"{{key}}"` for a marker
    /// whose value is the request's idempotency key (any value then marks a
    /// replay). Default: `true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_marker_value: Option<String>,
    /// A JSON pointer (RFC 6901) to the error code in the target's error
    /// bodies, e.g. `/error/code` for `{"error": {"code": "..."}}`; the
    /// distinct-errors check reads codes there. Default: `/code`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_pointer: Option<String>,
    /// Statuses the target answers for a route or method it does not serve
    /// (the kit sends one in `mismatch.method`). Default: 404, 405 and 501.
    #[serde(default = "default_unsupported")]
    pub unsupported_statuses: Vec<u16>,
    /// Response headers the target never sends at all, e.g. `Retry-After`
    /// on its in-use refusal. The kit still reports the contract's clause
    /// where the contract asks for the header (an `interop` finding), but
    /// names the declaration instead of calling the header dropped. A
    /// header declared here cannot also be replayed or be the replay marker.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub absent_headers: Vec<String>,
    /// The response header that says when the key's replay window ends, as
    /// an HTTP-date (the contract's extension is `Idempotency-Key-Expires`),
    /// for a target that sends one. The kit then checks that a first
    /// execution, its replay and a mismatch carry one value, the declared
    /// replay window after the first answer's `Date`. Default: none (the
    /// `windows.expiry-header` case is unsupported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiry_header: Option<String>,
    /// The request header that carries the caller's remaining deadline in
    /// milliseconds, for a target that reads one (the contract's is
    /// `Request-Deadline-Ms`). The kit then checks that a request whose
    /// deadline is spent takes no effect and claims nothing. Default: none
    /// (the `deadline.spent` case is unsupported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_header: Option<String>,
}

impl ProfileDecl {
    /// Whether the target declares it never sends header `name` (any case).
    pub fn declares_absent(&self, name: &str) -> bool {
        self.absent_headers
            .iter()
            .any(|h| h.eq_ignore_ascii_case(name))
    }
}

impl Default for ProfileDecl {
    fn default() -> Self {
        Self {
            base: Profile::default(),
            errors: BTreeMap::new(),
            replay_marker: None,
            replay_marker_value: None,
            code_pointer: None,
            unsupported_statuses: default_unsupported(),
            absent_headers: Vec::new(),
            expiry_header: None,
            deadline_header: None,
        }
    }
}

fn default_unsupported() -> Vec<u16> {
    vec![404, 405, 501]
}

/// The `replay_marker` value that declares unmarked replays.
pub const NO_REPLAY_MARKER: &str = "none";

/// How a target spells one contract error on the wire: a status, and
/// optionally what identifies the error in the body. Every condition given
/// must hold; a status alone identifies the error by status only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WireError {
    /// HTTP status.
    pub status: u16,
    /// The body's `code` member (a problem document's, or any JSON
    /// object's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// A JSON pointer (RFC 6901) into the body, e.g. `/error/type`; with
    /// `value`, the string (or number, as text) found there must equal it;
    /// alone, something must be there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pointer: Option<String>,
    /// The value expected at `pointer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// A regular expression the body text must match, e.g.
    /// `"Idempotency-Key reused"` (Rust `regex` syntax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
}

/// One caller identity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Caller {
    /// A name for reports and for `{{...}}` lookups.
    pub name: String,
    /// Headers that authenticate this caller. Their values are secrets: the
    /// kit redacts them in every report and reproduction.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Values substituted for `{{name}}` in body templates when this caller
    /// sends (e.g. its own account ids).
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
    /// How this caller signs its requests, when a signature and not (only)
    /// a header names it: a webhook sender, say. The kit signs each request
    /// as it leaves, so a resend carries a fresh timestamp and signature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing: Option<Signing>,
}

/// A request-signing scheme and the caller's secret for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Signing {
    /// The scheme.
    pub scheme: SigningScheme,
    /// The shared secret as the scheme writes it (Standard Webhooks:
    /// `whsec_` and the base64 of the key bytes). Write `${NAME}` to take
    /// it from the environment; the kit never prints it.
    pub secret: String,
}

/// The signing schemes the kit can sign with.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum SigningScheme {
    /// [Standard Webhooks](https://www.standardwebhooks.com/): headers
    /// `webhook-id`, `webhook-timestamp` (Unix seconds) and
    /// `webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`.
    /// A request without `webhook-id` is signed with an empty id.
    StandardWebhooks,
}

/// An idempotent endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    /// A name for reports.
    pub name: String,
    /// HTTP method, e.g. `POST`.
    pub method: String,
    /// Path (and query) joined to the base URL.
    pub path: String,
    /// JSON body template. String values are templates: `{{marker}}` becomes
    /// a run-unique marker, `{{amount}}` (as the whole value) a fresh small
    /// integer, `{{uuid}}` a fresh UUID, `{{name}}` the caller's var `name`.
    pub body: serde_json::Value,
    /// Whether the endpoint requires a key (the kit then checks
    /// `idempotency_key_missing`).
    #[serde(default = "yes")]
    pub key_required: bool,
    /// A body the endpoint accepts syntactically but refuses with a final 4xx
    /// after claiming the key (e.g. an amount above the balance). Enables
    /// the 4xx-is-final case.
    #[serde(default)]
    pub rejected_body: Option<serde_json::Value>,
    /// Response headers the endpoint declares replayed, beyond
    /// Content-Type, Location and ETag.
    #[serde(default)]
    pub replayed_headers: Vec<String>,
    /// How the kit counts this endpoint's side effects when it differs from
    /// the manifest's `probe` (e.g. a second resource with its own
    /// listing). Cases sent to this endpoint use it.
    #[serde(default)]
    pub probe: Option<EffectProbe>,
    /// A body the endpoint answers with a 5xx after claiming the key,
    /// committing nothing (e.g. a value its handler fails on). Enables
    /// `failure.5xx-not-stored` without a failpoint hook.
    #[serde(default)]
    pub server_error_body: Option<serde_json::Value>,
    /// The values `{{amount}}` draws from. Amounts in `rejected_body` and
    /// `server_error_body` at the same place are excluded automatically.
    #[serde(default)]
    pub amounts: AmountRange,
    /// Extra request headers (templates like the body's: `{{marker}}`,
    /// `{{uuid}}`, caller vars), e.g. a reference header that carries the
    /// marker when the body has no free-text field.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// The integers `{{amount}}` is drawn from: `min..=max` without `exclude`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AmountRange {
    /// Smallest amount.
    #[serde(default = "default_amount_min")]
    pub min: i64,
    /// Largest amount.
    #[serde(default = "default_amount_max")]
    pub max: i64,
    /// Values never drawn (amounts the API treats specially).
    #[serde(default)]
    pub exclude: Vec<i64>,
}

impl Default for AmountRange {
    fn default() -> Self {
        Self {
            min: default_amount_min(),
            max: default_amount_max(),
            exclude: Vec::new(),
        }
    }
}

fn default_amount_min() -> i64 {
    1
}
fn default_amount_max() -> i64 {
    50
}

fn yes() -> bool {
    true
}

/// In-flight behaviour as declared in a manifest.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum InFlightMode {
    /// 409 `idempotency_key_in_use` at once.
    Conflict,
    /// 409 at once, or hold and replay when the client sends `Prefer: wait=N`.
    #[default]
    ConflictOrWait,
    /// An in-flight duplicate is always held until the first request
    /// finishes, then answered with its replay (never refused as in use).
    AlwaysWait,
    /// The target keeps no in-flight state: a duplicate of a running
    /// request is serialised behind it (or refused in some other way), and
    /// the kit only checks that it is not executed.
    None,
    /// A duplicate is held until the first request finishes and answered
    /// with its replay, except the loser of a race for the claim, which is
    /// refused at once as in use (a library that waits on the stored row but
    /// cannot wait on a claim another transaction has not committed yet).
    WaitOrConflictOnRace,
}

/// In-flight behaviour as a manifest declares it: one of the named modes,
/// or a table of what each situation gets, for a library whose answer
/// depends on the situation:
///
/// ```toml
/// in_flight = { running = "wait", prefer_wait = "wait", claim_race = "conflict" }
/// ```
///
/// is the named `wait_or_conflict_on_race`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(untagged)]
pub enum InFlightDecl {
    /// A named mode.
    Mode(InFlightMode),
    /// Situation by situation.
    Table(InFlightTable),
}

impl Default for InFlightDecl {
    fn default() -> Self {
        Self::Mode(InFlightMode::default())
    }
}

impl From<InFlightMode> for InFlightDecl {
    fn from(m: InFlightMode) -> Self {
        Self::Mode(m)
    }
}

/// What a duplicate of a running request gets, situation by situation.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(deny_unknown_fields)]
pub struct InFlightTable {
    /// A duplicate sent while the original runs, with no `Prefer: wait`.
    pub running: InFlightAnswer,
    /// The same with `Prefer: wait=N`.
    pub prefer_wait: InFlightAnswer,
    /// The loser of a race for the claim itself (both sent at once).
    pub claim_race: InFlightAnswer,
}

/// One in-flight answer.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum InFlightAnswer {
    /// Refused at once as in use (409 `idempotency_key_in_use`).
    Conflict,
    /// Held until the original finishes, then answered with its replay.
    Wait,
}

impl InFlightDecl {
    /// The declaration as a table (a mode without in-flight state, `none`,
    /// has none: its duplicates are serialised, so only "not executed" is
    /// judged).
    pub fn table(self) -> Option<InFlightTable> {
        use InFlightAnswer::{Conflict, Wait};
        let t = |running, prefer_wait, claim_race| {
            Some(InFlightTable {
                running,
                prefer_wait,
                claim_race,
            })
        };
        match self {
            Self::Table(t) => Some(t),
            Self::Mode(InFlightMode::Conflict) => t(Conflict, Conflict, Conflict),
            Self::Mode(InFlightMode::ConflictOrWait) => t(Conflict, Wait, Conflict),
            Self::Mode(InFlightMode::AlwaysWait) => t(Wait, Wait, Wait),
            Self::Mode(InFlightMode::WaitOrConflictOnRace) => t(Wait, Wait, Conflict),
            Self::Mode(InFlightMode::None) => None,
        }
    }

    /// Whether a duplicate of a running request (no `Prefer`) may be
    /// answered other than by a refusal: held, or serialised.
    pub fn never_refuses_running(self) -> bool {
        self.table()
            .is_none_or(|t| t.running == InFlightAnswer::Wait)
    }

    /// Whether `Prefer: wait=N` holds the duplicate and replays.
    pub fn waits_when_asked(self) -> bool {
        self.table()
            .is_some_and(|t| t.prefer_wait == InFlightAnswer::Wait)
    }

    /// The declaration as a manifest spells it, for notes.
    pub fn describe(self) -> String {
        match self {
            Self::Mode(m) => quoted_name(&m),
            Self::Table(t) => format!(
                "{{ running = {}, prefer_wait = {}, claim_race = {} }}",
                quoted_name(&t.running),
                quoted_name(&t.prefer_wait),
                quoted_name(&t.claim_race)
            ),
        }
    }
}

/// Policies the target declares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeclaredPolicy {
    /// Replay window, seconds.
    #[serde(default = "default_window")]
    pub replay_window_secs: u64,
    /// In-flight behaviour: a named mode, or a table saying what each
    /// situation gets (see [`InFlightDecl`]).
    #[serde(default)]
    pub in_flight: InFlightDecl,
    /// Which outcomes are stored: `"final_unless_server_error"` (the
    /// contract's, default), `"store_everything"`, `"success_only"`, or a
    /// table of status classes and statuses, e.g. `{ "400" = "not_stored" }`
    /// (store what the contract stores, but not a 400). The cases judge the
    /// contract's policy whatever is declared, and say where the target
    /// does what it declares.
    #[serde(default)]
    pub failure_policy: FailurePolicyDecl,
    /// What the request fingerprint covers, when it is not the contract's
    /// method, path with query, and body.
    #[serde(default)]
    pub fingerprint: FingerprintDecl,
    /// Whose keys are kept apart: per caller (the contract's), one key
    /// space for everyone, or per caller with unauthenticated requests left
    /// unprotected. The scope case judges the contract's rule whatever is
    /// declared (one caller's answer reaching another is unsafe, declared
    /// or not) and names the declaration beside its finding.
    #[serde(default)]
    pub scope: ScopeDecl,
}

/// Whose keys a target keeps apart.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ScopeDecl {
    /// A key belongs to one caller (the contract's `idem.scope.caller`).
    #[default]
    PerCaller,
    /// One key space for every caller: another caller's request with a used
    /// key is refused, or worse.
    Global,
    /// Per caller for authenticated requests; a request without credentials
    /// is not protected at all (its duplicates execute). Every manifest
    /// caller then needs credentials, since the kit can only judge what the
    /// target protects.
    PerCallerAnonymousUnprotected,
}

impl ScopeDecl {
    /// The declaration as a manifest spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PerCaller => "per_caller",
            Self::Global => "global",
            Self::PerCallerAnonymousUnprotected => "per_caller_anonymous_unprotected",
        }
    }
}

/// What a target's request fingerprint covers. The contract's covers the
/// method, the path with its query, and the body; a target that leaves a
/// part out declares it so the kit reports the declared difference as an
/// `interop` finding instead of judging a replay across it unsafe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FingerprintDecl {
    /// Whether the query string is part of the fingerprint. Default: true.
    #[serde(default = "yes")]
    pub query: bool,
    /// Whether the method and path are part of it. Default: true.
    #[serde(default = "yes")]
    pub path: bool,
    /// Whether the body is part of it. Default: true.
    #[serde(default = "yes")]
    pub body: bool,
    /// Request headers that are part of it (`["*"]`: every header), which
    /// the contract leaves out: a true retry whose only change is an
    /// incidental header (`traceparent`) is then refused, and the kit
    /// reports that as the declared difference. Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<String>,
}

impl FingerprintDecl {
    /// Whether a change of header `name` (any case) changes the fingerprint.
    pub fn covers_header(&self, name: &str) -> bool {
        self.headers
            .iter()
            .any(|h| h == "*" || h.eq_ignore_ascii_case(name))
    }

    /// Whether the target keeps no fingerprint at all.
    pub fn is_none(&self) -> bool {
        !self.query && !self.path && !self.body && self.headers.is_empty()
    }
}

impl Default for FingerprintDecl {
    fn default() -> Self {
        Self {
            query: true,
            path: true,
            body: true,
            headers: Vec::new(),
        }
    }
}

fn default_window() -> u64 {
    crate::policy::DEFAULT_REPLAY_WINDOW_SECS
}

impl Default for DeclaredPolicy {
    fn default() -> Self {
        Self {
            replay_window_secs: default_window(),
            in_flight: InFlightDecl::default(),
            failure_policy: FailurePolicyDecl::default(),
            fingerprint: FingerprintDecl::default(),
            scope: ScopeDecl::default(),
        }
    }
}

/// How the kit observes side effects. Read-only by construction: the kit
/// only ever sends GET to a probe.
///
/// Effects are matched by the run-unique marker the body carries, or by
/// the idempotency key: a `count` URL with `{{key}}` in it, or a `list`
/// probe with `match_on = "key"`. A key-matched probe cannot count a
/// request sent without a key; those checks end inconclusive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "snake_case", tag = "kind", deny_unknown_fields)]
pub enum EffectProbe {
    /// A URL (with `{{marker}}` or `{{key}}` substituted) whose JSON answer
    /// holds a number at `count_pointer` (RFC 6901), or an array there whose
    /// length counts.
    Count {
        /// Path (or absolute URL) to GET.
        url: String,
        /// JSON pointer to the count or array; empty for the whole document.
        #[serde(default)]
        count_pointer: String,
        /// Which caller's headers the probe sends (default: the first).
        #[serde(default)]
        caller: Option<String>,
    },
    /// A listing URL; the kit counts items whose `match_pointer` value
    /// equals the run-unique marker.
    List {
        /// Path (or absolute URL) to GET.
        url: String,
        /// JSON pointer to the array of items; empty for the whole document.
        #[serde(default)]
        items_pointer: String,
        /// JSON pointer, inside an item, to the field holding the marker
        /// (or the key, with `match_on = "key"`).
        match_pointer: String,
        /// What the field at `match_pointer` holds.
        #[serde(default)]
        match_on: MatchOn,
        /// Which caller's headers the probe sends (default: the first).
        #[serde(default)]
        caller: Option<String>,
    },
    /// No count endpoint: the JSON pointer of the created resource's id in a
    /// 2xx body. Distinct ids for one key reveal a double execution.
    ResourceId {
        /// JSON pointer to the id in the success body, e.g. `/id`.
        id_pointer: String,
    },
}

/// What a listing's items are matched on.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum MatchOn {
    /// The run-unique marker the request body carried.
    #[default]
    Marker,
    /// The idempotency key the request carried (unquoted).
    Key,
}

/// Optional hooks.
#[derive(
    Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(deny_unknown_fields)]
pub struct Hooks {
    /// Advances the target's clock (replay-window cases).
    #[serde(default)]
    pub clock: Option<ClockHook>,
    /// A request header that injects faults.
    #[serde(default)]
    pub failpoint: Option<FailpointHook>,
    /// A command that restarts the target (crash-recovery cases).
    #[serde(default)]
    pub restart: Option<RestartHook>,
    /// Counts, for a run-unique marker, the effects the recovery endpoint
    /// caused in a foreign system it calls (e.g. charges at a payment
    /// processor), read-only. With `failpoint.crash_after_foreign_call` and
    /// a restart, the kit checks that a crash between the foreign call and
    /// its commit leaves exactly one foreign effect after the retry. The
    /// probe sends no caller headers unless it names a `caller`.
    #[serde(default)]
    pub foreign_probe: Option<EffectProbe>,
    /// Counts handler runs (whatever their outcome) for a marker or key,
    /// read-only. Effects alone cannot see a rejected request executed
    /// again (its answer is byte-identical and it creates nothing); with
    /// this probe the kit can, so a re-executed 4xx and a replayed 5xx are
    /// told apart from correct behaviour without failpoints.
    #[serde(default)]
    pub execution_probe: Option<EffectProbe>,
}

/// The clock hook: `POST url` with `{"advance_secs": N}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClockHook {
    /// Path (or absolute URL) of the clock endpoint.
    pub url: String,
}

/// The failpoint hook: a request header and the values that trigger faults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailpointHook {
    /// Header name, e.g. `Idem-Failpoint`.
    pub header: String,
    /// Value that makes the request fail with a 5xx after claiming its key,
    /// leaving nothing committed.
    #[serde(default)]
    pub server_error: Option<String>,
    /// Value that makes the process abort after the business writes commit
    /// and before the response is sent (used with the restart hook).
    #[serde(default)]
    pub crash_after_commit: Option<String>,
    /// Value that makes the process abort after the recovery endpoint's
    /// foreign call returned and before its result commits (used with the
    /// restart hook and `hooks.foreign_probe`).
    #[serde(default)]
    pub crash_after_foreign_call: Option<String>,
    /// Value that holds the request in flight until the hook's release (or
    /// the lease expires); enables the deterministic in-flight case.
    #[serde(default)]
    pub pause: Option<String>,
    /// Path (or absolute URL) the kit POSTs to release every paused
    /// request once a case has seen what it needs; without it the kit waits
    /// for the target to end the pause by itself.
    #[serde(default)]
    pub release_url: Option<String>,
    /// Value that holds a request after it committed durable progress
    /// (e.g. between the phases of a multi-step endpoint), so its lease can
    /// run out while it is held; enables the lease-takeover case.
    #[serde(default)]
    pub lease_pause: Option<String>,
    /// Name of the endpoint (from `endpoints`) the recovery cases
    /// (`crash_after_commit` with the restart hook, `lease_pause`) send to,
    /// e.g. a multi-step endpoint with recovery points. Default: the first
    /// endpoint, which the other failpoint cases always use.
    #[serde(default)]
    pub recovery_endpoint: Option<String>,
}

/// The restart hook: a shell command the kit runs, then waits for the base
/// URL to answer again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestartHook {
    /// The command, run with `sh -c`.
    pub command: String,
}

/// Safety limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// The most state-changing requests (potential side effects) one run may send.
    #[serde(default = "default_max_effects")]
    pub max_side_effects: u64,
    /// Requests per second, sustained.
    #[serde(default = "default_rps")]
    pub requests_per_second: u32,
    /// Requests released together by the concurrency gate.
    #[serde(default = "default_concurrency")]
    pub concurrency: u32,
    /// Per-request timeout, milliseconds; a timeout is inconclusive.
    #[serde(default = "default_timeout_ms")]
    pub request_timeout_ms: u64,
    /// How many generated operation sequences the property phase runs (0 disables it).
    #[serde(default = "default_sequences")]
    pub property_sequences: u32,
    /// How many cases run at once. Cases that hold requests in flight,
    /// restart the target or move its clock always run alone, after the
    /// others.
    #[serde(default = "default_parallel")]
    pub parallel_cases: u32,
    /// How long an effect count below what a check expects is read again
    /// (every 100 ms) before it stands, for listings that lag their writes;
    /// milliseconds, 0 for a probe that reads its own writes at once.
    #[serde(default = "default_settle")]
    pub probe_settle_ms: u64,
}

/// Measured on the conformance kit's zoo (`tests/zoo.rs` asserts it): a
/// run in which every case fails and re-runs sends about 640 state-changing
/// requests; the default leaves room for the cases that need hooks and for
/// a longer shrink of a generated counterexample.
fn default_max_effects() -> u64 {
    1500
}
fn default_rps() -> u32 {
    50
}
fn default_concurrency() -> u32 {
    32
}
fn default_timeout_ms() -> u64 {
    10_000
}
fn default_sequences() -> u32 {
    8
}
fn default_parallel() -> u32 {
    4
}
fn default_settle() -> u64 {
    2_000
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_side_effects: default_max_effects(),
            requests_per_second: default_rps(),
            concurrency: default_concurrency(),
            request_timeout_ms: default_timeout_ms(),
            property_sequences: default_sequences(),
            parallel_cases: default_parallel(),
            probe_settle_ms: default_settle(),
        }
    }
}

/// A reviewed exception: the named cases are run and reported, but their
/// failures do not fail the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Waiver {
    /// Case ID or glob (`*` matches any run of characters), e.g. `windows.*`.
    pub case: String,
    /// Why; required and non-empty.
    pub reason: String,
    /// A link to the ticket or decision.
    #[serde(default)]
    pub link: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a note quotes of an in-flight declaration parses back to it.
    #[test]
    fn an_in_flight_declaration_is_described_as_it_parses() {
        #[derive(Deserialize)]
        struct P {
            in_flight: InFlightDecl,
        }
        for decl in [
            InFlightDecl::Mode(InFlightMode::WaitOrConflictOnRace),
            InFlightDecl::Table(InFlightTable {
                running: InFlightAnswer::Wait,
                prefer_wait: InFlightAnswer::Wait,
                claim_race: InFlightAnswer::Conflict,
            }),
        ] {
            let text = format!("in_flight = {}", decl.describe());
            let back: P = toml::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(back.in_flight, decl, "{text}");
        }
        assert_eq!(
            InFlightDecl::from(InFlightMode::ConflictOrWait).describe(),
            r#""conflict_or_wait""#
        );
    }
}
