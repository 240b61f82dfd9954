//! The derived artifacts in `spec/generated/`: one JSON Schema per public
//! type, the OpenAPI 3.1 document of the idempotency surface, the
//! fingerprint test vectors and the clause list.
//!
//! Everything here is a pure function from types (and the book's text) to
//! strings; the `idem-spec-gen` binary writes them and the crate's tests
//! regenerate them in memory and fail when the committed copies are stale,
//! the way `cargo sqlx prepare --check` guards sqlx's offline metadata.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde_json::Value;
use utoipa::openapi::{
    self, ComponentsBuilder, ContentBuilder, HttpMethod, InfoBuilder, OpenApiBuilder, PathItem,
    PathsBuilder, RefOr, Required, ResponseBuilder,
    example::ExampleBuilder,
    header::HeaderBuilder,
    path::{OperationBuilder, Parameter, ParameterBuilder, ParameterIn},
    schema::{ObjectBuilder, Type},
};

use crate::clauses::{self, Clause};
use crate::fingerprint::{self, FingerprintVector};
use crate::headers;
use crate::key::{HEADER_VALUE_PATTERN, MAX_HEADER_VALUE_LEN};
use crate::policy::{FailurePolicy, InFlightBehaviour, Policy};
use crate::problem::{ErrorCode, Problem, Profile};
use crate::{CONTRACT_VERSION, Error, Fingerprint, IdempotencyKey, KeyState, RecoveryPoint};

/// Renders every artifact, keyed by its path under `spec/generated/`.
/// `book_pages` are the book's Markdown files, `(path under src/, text)`, in
/// book order.
pub fn artifacts(book_pages: &[(String, String)]) -> Result<BTreeMap<String, String>, Error> {
    let mut out = BTreeMap::new();
    for (name, schema) in json_schemas() {
        out.insert(
            format!("schemas/{name}.schema.json"),
            pretty("schema", &schema)?,
        );
    }
    out.insert("openapi.json".to_owned(), pretty("openapi", &openapi())?);
    out.insert(
        "fingerprint-vectors.json".to_owned(),
        pretty("vectors", &fingerprint::vectors())?,
    );
    let clauses = clauses::parse_book(book_pages)?;
    clauses::check_class_table(&clauses)?;
    out.insert("clauses.json".to_owned(), pretty("clauses", &clauses)?);
    Ok(out)
}

fn pretty<T: serde::Serialize>(what: &str, value: &T) -> Result<String, Error> {
    serde_json::to_string_pretty(value)
        .map(|s| s + "\n")
        .map_err(|e| Error::Generate {
            what: what.to_owned(),
            message: e.to_string(),
        })
}

fn schema_of<T: JsonSchema>() -> schemars::Schema {
    schemars::SchemaGenerator::new(schemars::generate::SchemaSettings::draft2020_12())
        .into_root_schema_for::<T>()
}

/// One JSON Schema (draft 2020-12) per public type that crosses a wire or a file.
pub fn json_schemas() -> Vec<(&'static str, schemars::Schema)> {
    vec![
        ("IdempotencyKey", schema_of::<IdempotencyKey>()),
        ("Fingerprint", schema_of::<Fingerprint>()),
        ("FingerprintVector", schema_of::<FingerprintVector>()),
        ("Problem", schema_of::<Problem>()),
        ("ErrorCode", schema_of::<ErrorCode>()),
        ("Profile", schema_of::<Profile>()),
        ("KeyState", schema_of::<KeyState>()),
        ("RecoveryPoint", schema_of::<RecoveryPoint>()),
        ("Policy", schema_of::<Policy>()),
        ("Clause", schema_of::<Clause>()),
        ("Manifest", schema_of::<crate::manifest::Manifest>()),
        ("Report", schema_of::<crate::report::Report>()),
    ]
}

/// The `Idempotency-Key` request parameter, for servers to attach to each
/// idempotent operation of their own OpenAPI document.
pub fn idempotency_key_parameter() -> Parameter {
    ParameterBuilder::new()
        .name(headers::IDEMPOTENCY_KEY)
        .parameter_in(ParameterIn::Header)
        .required(Required::True)
        .description(Some(
            "One key per logical operation, reused on every retry. Bare (`abc`) or an RFC 8941 \
             sf-string (`\"abc\"`); after unquoting, 1 to 255 characters of visible ASCII. Scoped \
             to the authenticated caller.",
        ))
        .schema(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(MAX_HEADER_VALUE_LEN))
                .pattern(Some(HEADER_VALUE_PATTERN))
                .examples([serde_json::json!("order-confirm-8412")]),
        ))
        .build()
}

/// `Request-Deadline-Ms` request header: what is left of the caller's
/// deadline (clauses `idem.client.deadline-header`, `idem.deadline.spent`).
pub fn request_deadline_parameter() -> Parameter {
    ParameterBuilder::new()
        .name(headers::REQUEST_DEADLINE_MS)
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(
            "What is left of the caller's overall deadline, in whole milliseconds, when the              attempt is sent. 0 (spent): the request is not started and is answered 504              deadline_exceeded, its key left unclaimed; a stored outcome is still replayed. The              server bounds its work and outbound calls by it.",
        ))
        .schema(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[0-9]{1,9}$"))
                .examples([serde_json::json!("2500")]),
        ))
        .build()
}

/// `Idempotent-Replayed` response header.
pub fn replayed_header() -> openapi::Header {
    HeaderBuilder::new()
        .schema(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(["true"])),
        )
        .description(Some(
            "Present, with the value `true`, on every replayed response.",
        ))
        .build()
}

/// `Idempotency-Key-Expires` response header.
pub fn expires_header() -> openapi::Header {
    HeaderBuilder::new()
        .schema(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .examples(["Sun, 06 Dec 2026 09:14:07 GMT"]),
        )
        .description(Some(
            "The end of this key's replay window, an HTTP-date (RFC 9110 IMF-fixdate): \
             until then a retry with the key is answered from its stored outcome; \
             afterwards it executes as a new request. On every answer the key governs: \
             a first execution whose outcome was stored, a replay, an in-flight refusal \
             (once the key's claim is committed) and a mismatch. Absent on answers \
             given before the key was looked at (no credentials, a missing or invalid \
             key) and on a 5xx, which leaves the key absent. An extension of this \
             contract: no draft defines it.",
        ))
        .build()
}

/// `Retry-After` response header.
pub fn retry_after_header() -> openapi::Header {
    HeaderBuilder::new()
        .schema(
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(0)),
        )
        .description(Some("Seconds to wait before retrying with the same key."))
        .build()
}

/// The problem response for `code` under `profile`, with an example body.
pub fn problem_response(code: ErrorCode, profile: Profile) -> openapi::Response {
    let example = Problem::new(code, profile, example_detail(code));
    let mut b = ResponseBuilder::new()
        .description(format!("{} (`{}`).", code.title(), code.wire_code(profile)))
        .content(
            crate::problem::PROBLEM_CONTENT_TYPE,
            ContentBuilder::new()
                .schema(Some(RefOr::Ref(openapi::Ref::from_schema_name("Problem"))))
                .example(serde_json::to_value(&example).ok())
                .build(),
        );
    if code == ErrorCode::IdempotencyKeyInUse {
        b = b.header(headers::RETRY_AFTER, retry_after_header());
    }
    if matches!(
        code,
        ErrorCode::IdempotencyKeyInUse | ErrorCode::IdempotencyKeyMismatch
    ) {
        b = b.header(headers::IDEMPOTENCY_KEY_EXPIRES, expires_header());
    }
    b.build()
}

/// The four contract errors (missing, invalid, mismatch, in use).
pub const CONTRACT_ERRORS: [ErrorCode; 4] = [
    ErrorCode::IdempotencyKeyMissing,
    ErrorCode::IdempotencyKeyInvalid,
    ErrorCode::IdempotencyKeyMismatch,
    ErrorCode::IdempotencyKeyInUse,
];

/// The responses `codes` take under `profile`, one per status, for an
/// idempotent operation to carry (clause `idem.key.endpoints-published`).
///
/// OpenAPI allows one response per status, and two contract errors share a
/// status in every profile (400 missing and invalid, 409 mismatch and in
/// use in the reference profile), so a shared status gets one response
/// that names every code in its description and carries one named example
/// per code (named by its wire code; a code alone at its status is named
/// too), and the `Retry-After` header when any of them sends it.
pub fn contract_responses(
    profile: Profile,
    codes: &[ErrorCode],
) -> Vec<(String, openapi::Response)> {
    let mut by_status: BTreeMap<u16, Vec<ErrorCode>> = BTreeMap::new();
    for &code in codes {
        by_status
            .entry(code.status(profile))
            .or_default()
            .push(code);
    }
    by_status
        .into_iter()
        .map(|(status, codes)| {
            let mut response = problem_response(codes[0], profile);
            for &code in &codes[1..] {
                merge_response(&mut response, problem_response(code, profile));
            }
            // Named examples even for a code alone at its status, so every
            // contract error's example is found the same way.
            response.content.values_mut().for_each(name_single_example);
            (status.to_string(), response)
        })
        .collect()
}

/// Folds `extra` into `existing`, two answers that share one status: the
/// descriptions are joined, missing headers added, and each media type's
/// examples become named examples side by side (a single `example` is
/// renamed after the problem `code` it shows, else `example`), so neither
/// answer's example is lost and the media type never carries both
/// `example` and `examples` (which OpenAPI forbids).
pub fn merge_response(existing: &mut openapi::Response, extra: openapi::Response) {
    existing.description = format!("{} Or: {}", existing.description, extra.description);
    for (name, header) in extra.headers {
        existing.headers.entry(name).or_insert(header);
    }
    for (media, content) in extra.content {
        match existing.content.get_mut(&media) {
            None => {
                existing.content.insert(media, content);
            }
            Some(into) => {
                name_single_example(into);
                let mut content = content;
                name_single_example(&mut content);
                for (name, example) in content.examples {
                    into.examples.entry(name).or_insert(example);
                }
                if into.schema.is_none() {
                    into.schema = content.schema;
                }
            }
        }
    }
}

/// Moves a media type's single `example` into its named `examples`.
fn name_single_example(content: &mut openapi::Content) {
    if let Some(value) = content.example.take() {
        let name = value
            .get("code")
            .and_then(Value::as_str)
            .unwrap_or("example")
            .to_owned();
        content
            .examples
            .entry(name)
            .or_insert_with(|| RefOr::T(ExampleBuilder::new().value(Some(value)).build()));
    }
}

fn example_detail(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::IdempotencyKeyMissing => {
            "POST /v1/transfers requires an Idempotency-Key header."
        }
        ErrorCode::IdempotencyKeyInvalid => {
            "Idempotency-Key is 300 characters long; the maximum is 255"
        }
        ErrorCode::IdempotencyKeyMismatch => {
            "This key was first used with a different request body."
        }
        ErrorCode::IdempotencyKeyInUse => {
            "The first request with this key is still running; retry later."
        }
        _ => "See the error page for this code.",
    }
}

/// The path parameter of the template operation, `/{idempotent-operation}`.
pub const TEMPLATE_PATH_PARAMETER: &str = "idempotent-operation";

/// The OpenAPI 3.1 document of the idempotency surface (reference profile):
/// the key parameter, the replay and retry headers, a problem response per
/// contract error, the shared schemas, and the published windows under
/// `x-idempotency`.
pub fn openapi() -> openapi::OpenApi {
    let policy = Policy::default();
    // Policy's members refer to FailurePolicy and InFlightBehaviour: every
    // schema a $ref names is in the document.
    let mut components = ComponentsBuilder::new()
        .schema_from::<Problem>()
        .schema_from::<ErrorCode>()
        .schema_from::<Policy>()
        .schema_from::<FailurePolicy>()
        .schema_from::<InFlightBehaviour>()
        .schema_from::<KeyState>()
        .schema_from::<IdempotencyKey>();
    for code in CONTRACT_ERRORS {
        components = components.response(
            response_name(code),
            problem_response(code, Profile::Reference),
        );
    }
    components = components.response(
        response_name(ErrorCode::DeadlineExceeded),
        problem_response(ErrorCode::DeadlineExceeded, Profile::Reference),
    );
    components = components.response(
        "IdempotentReplay",
        ResponseBuilder::new()
            .description(
                "A replay: the stored status, body and declared headers of the first response.",
            )
            .header(headers::IDEMPOTENT_REPLAYED, replayed_header())
            .header(headers::IDEMPOTENCY_KEY_EXPIRES, expires_header())
            .build(),
    );

    let mut op = OperationBuilder::new()
        .operation_id(Some("idempotentOperation"))
        .summary(Some("Any operation the server declares idempotent"))
        .description(Some(
            "A template: every state-changing operation that takes an Idempotency-Key answers \
             with these responses in addition to its own.",
        ))
        .parameter(
            ParameterBuilder::new()
                .name(TEMPLATE_PATH_PARAMETER)
                .parameter_in(ParameterIn::Path)
                .required(Required::True)
                .description(Some(
                    "Stands for the path of each operation a server declares idempotent; this \
                     template is not an endpoint.",
                ))
                .schema(Some(ObjectBuilder::new().schema_type(Type::String))),
        )
        .parameter(idempotency_key_parameter())
        .parameter(request_deadline_parameter())
        .parameter(
            ParameterBuilder::new()
                .name(headers::PREFER)
                .parameter_in(ParameterIn::Header)
                .required(Required::False)
                .description(Some("`wait=N`: hold a duplicate up to N seconds (bounded by the server) and replay."))
                .schema(Some(ObjectBuilder::new().schema_type(Type::String).pattern(Some("wait=[0-9]+")))),
        )
        .response(
            "2XX",
            ResponseBuilder::new()
                .description("The first execution, or a replay of it (then with Idempotent-Replayed: true).")
                .header(headers::IDEMPOTENT_REPLAYED, replayed_header())
                .header(headers::IDEMPOTENCY_KEY_EXPIRES, expires_header())
                .build(),
        );
    // All four errors, one response per status (two share 400, two 409);
    // the components carry each one alone as well, for servers to reuse.
    for (status, response) in contract_responses(Profile::Reference, &CONTRACT_ERRORS) {
        op = op.response(status, response);
    }
    op = op.response(
        ErrorCode::DeadlineExceeded
            .status(Profile::Reference)
            .to_string(),
        problem_response(ErrorCode::DeadlineExceeded, Profile::Reference),
    );

    let mut doc = OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("idemkit idempotency surface")
                .version(CONTRACT_VERSION)
                .description(Some(format!(
                    "The Idempotency-Key contract, reference profile. Replay window {} s (24 h); \
                     retention {} s (72 h); a key reused after its window is a new request.",
                    policy.replay_window_secs, policy.retention_secs
                ))),
        )
        .paths(PathsBuilder::new().path(
            format!("/{{{TEMPLATE_PATH_PARAMETER}}}"),
            PathItem::new(HttpMethod::Post, op.build()),
        ))
        .components(Some(components.build()))
        .build();
    doc.extensions = Some(
        openapi::extensions::ExtensionsBuilder::new()
            .add(
                "x-idempotency",
                serde_json::json!({
                    "contract_version": CONTRACT_VERSION,
                    "policy": policy,
                    "replayed_headers": headers::REPLAYED_HEADERS,
                }),
            )
            .build(),
    );
    doc
}

fn response_name(code: ErrorCode) -> String {
    code.as_str()
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// What is wrong with an OpenAPI 3.1 document, as one sentence per defect
/// (empty when none is found).
///
/// Not a full validator (CI runs one on the generated and the served
/// documents): the structural mistakes a generated document is prone to,
/// checked without leaving `cargo test`. A local `$ref` that points
/// nowhere; a path template whose `{name}` no required `in: path`
/// parameter declares, or a path parameter missing from its template; a
/// parameter declared twice, in an unknown location, or without exactly
/// one of `schema` and `content`; an operation with no responses or a
/// response key that is not a status; a media type carrying both
/// `example` and `examples`; a repeated `operationId`.
pub fn openapi_defects(doc: &Value) -> Vec<String> {
    let mut out = Vec::new();
    match doc.get("openapi").and_then(Value::as_str) {
        Some(v) if v.starts_with("3.1.") => {}
        other => out.push(format!("`openapi` is {other:?}, not 3.1.x")),
    }
    for member in ["title", "version"] {
        if doc
            .pointer(&format!("/info/{member}"))
            .and_then(Value::as_str)
            .is_none()
        {
            out.push(format!("info.{member} is missing"));
        }
    }
    let mut refs = Vec::new();
    collect_refs(doc, "", &mut refs);
    for (at, target) in refs {
        if let Some(pointer) = target.strip_prefix('#')
            && doc.pointer(pointer).is_none()
        {
            out.push(format!("{at}: $ref {target:?} points nowhere"));
        }
    }
    let mut operation_ids = BTreeMap::<String, String>::new();
    let paths = doc.get("paths").and_then(Value::as_object);
    for (path, item) in paths.into_iter().flatten() {
        if !path.starts_with('/') {
            out.push(format!("path {path:?} does not start with /"));
        }
        let template = template_names(path);
        let shared = declared_parameters(doc, item, path, &mut out);
        for method in [
            "get", "put", "post", "delete", "options", "head", "patch", "trace",
        ] {
            let Some(op) = item.get(method) else { continue };
            let at = format!("{} {path}", method.to_uppercase());
            let own = declared_parameters(doc, op, &at, &mut out);
            // Operation-level parameters override path-level ones.
            let mut all = shared.clone();
            all.extend(own);
            for name in &template {
                match all.get(&(name.clone(), "path".to_owned())) {
                    Some(true) => {}
                    Some(false) => out.push(format!(
                        "{at}: path parameter {name:?} must be required: true"
                    )),
                    None => out.push(format!("{at}: path parameter {{{name}}} is not declared")),
                }
            }
            for (name, location) in all.keys() {
                if location == "path" && !template.contains(name) {
                    out.push(format!(
                        "{at}: parameter {name:?} is declared in: path but the path has no {{{name}}}"
                    ));
                }
            }
            if let Some(id) = op.get("operationId").and_then(Value::as_str)
                && let Some(first) = operation_ids.insert(id.to_owned(), at.clone())
            {
                out.push(format!("{at}: operationId {id:?} is also used by {first}"));
            }
            match op.get("responses").and_then(Value::as_object) {
                Some(r) if !r.is_empty() => {
                    for status in r.keys() {
                        if !is_response_key(status) {
                            out.push(format!("{at}: response key {status:?} is not a status"));
                        }
                    }
                }
                _ => out.push(format!("{at}: no responses")),
            }
        }
    }
    collect_media_defects(doc, "", &mut out);
    out
}

/// Every `$ref` string in `v`, with the JSON pointer where it sits.
fn collect_refs(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let here = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                if k == "$ref"
                    && let Some(target) = child.as_str()
                {
                    out.push((at.to_owned(), target.to_owned()));
                } else {
                    collect_refs(child, &here, out);
                }
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                collect_refs(child, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// Media type objects (`content` maps) that carry both `example` and `examples`.
fn collect_media_defects(v: &Value, at: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::Object(content)) = m.get("content") {
                for (media, mt) in content {
                    if mt.get("example").is_some() && mt.get("examples").is_some() {
                        out.push(format!(
                            "{at}/content/{media}: both example and examples (mutually exclusive)"
                        ));
                    }
                }
            }
            for (k, child) in m {
                collect_media_defects(child, &format!("{at}/{k}"), out);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                collect_media_defects(child, &format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// The `{name}`s of a path template.
fn template_names(path: &str) -> Vec<String> {
    path.split('{')
        .skip(1)
        .filter_map(|rest| rest.split_once('}').map(|(name, _)| name.to_owned()))
        .collect()
}

/// The parameters `holder` (a path item or an operation) declares, as
/// `(name, in) → required`, with `$ref`s followed; defects go to `out`.
fn declared_parameters(
    doc: &Value,
    holder: &Value,
    at: &str,
    out: &mut Vec<String>,
) -> BTreeMap<(String, String), bool> {
    let mut seen = BTreeMap::new();
    let list = holder.get("parameters").and_then(Value::as_array);
    for p in list.into_iter().flatten() {
        let p = match p.get("$ref").and_then(Value::as_str) {
            Some(r) => match r.strip_prefix('#').and_then(|ptr| doc.pointer(ptr)) {
                Some(target) => target,
                // Reported with the other dangling $refs.
                None => continue,
            },
            None => p,
        };
        let name = p.get("name").and_then(Value::as_str).unwrap_or_default();
        let location = p.get("in").and_then(Value::as_str).unwrap_or_default();
        if name.is_empty() {
            out.push(format!("{at}: a parameter has no name"));
            continue;
        }
        if !matches!(location, "query" | "header" | "path" | "cookie") {
            out.push(format!("{at}: parameter {name:?} has in: {location:?}"));
        }
        if p.get("schema").is_some() == p.get("content").is_some() {
            out.push(format!(
                "{at}: parameter {name:?} needs exactly one of schema and content"
            ));
        }
        let required = p.get("required").and_then(Value::as_bool).unwrap_or(false);
        let key = (name.to_owned(), location.to_owned());
        if seen.insert(key, required).is_some() {
            out.push(format!(
                "{at}: parameter {name:?} (in: {location}) is declared twice"
            ));
        }
    }
    seen
}

/// `default`, `1XX`..`5XX`, or a status code 100..=599.
fn is_response_key(k: &str) -> bool {
    if k == "default" {
        return true;
    }
    let b = k.as_bytes();
    b.len() == 3
        && (b'1'..=b'5').contains(&b[0])
        && (b[1..] == *b"XX" || (b[1].is_ascii_digit() && b[2].is_ascii_digit()))
}
