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
use utoipa::openapi::{
    self, ComponentsBuilder, ContentBuilder, HttpMethod, InfoBuilder, OpenApiBuilder, PathItem,
    PathsBuilder, RefOr, Required, ResponseBuilder,
    header::HeaderBuilder,
    path::{OperationBuilder, Parameter, ParameterBuilder, ParameterIn},
    schema::{ObjectBuilder, Type},
};

use crate::clauses::{self, Clause};
use crate::fingerprint::{self, FingerprintVector};
use crate::headers;
use crate::key::{HEADER_VALUE_PATTERN, MAX_HEADER_VALUE_LEN};
use crate::policy::{self, Policy};
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
    b.build()
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

/// The OpenAPI 3.1 document of the idempotency surface (reference profile):
/// the key parameter, the replay and retry headers, a problem response per
/// contract error, the shared schemas, and the published windows under
/// `x-idempotency`.
pub fn openapi() -> openapi::OpenApi {
    let policy = Policy::default();
    let idem_codes = [
        ErrorCode::IdempotencyKeyMissing,
        ErrorCode::IdempotencyKeyInvalid,
        ErrorCode::IdempotencyKeyMismatch,
        ErrorCode::IdempotencyKeyInUse,
    ];
    let mut components = ComponentsBuilder::new()
        .schema_from::<Problem>()
        .schema_from::<ErrorCode>()
        .schema_from::<Policy>()
        .schema_from::<KeyState>()
        .schema_from::<IdempotencyKey>();
    for code in idem_codes {
        components = components.response(
            response_name(code),
            problem_response(code, Profile::Reference),
        );
    }
    components = components.response(
        "IdempotentReplay",
        ResponseBuilder::new()
            .description(
                "A replay: the stored status, body and declared headers of the first response.",
            )
            .header(headers::IDEMPOTENT_REPLAYED, replayed_header())
            .build(),
    );

    let mut op = OperationBuilder::new()
        .operation_id(Some("idempotentOperation"))
        .summary(Some("Any operation the server declares idempotent"))
        .description(Some(
            "A template: every state-changing operation that takes an Idempotency-Key answers \
             with these responses in addition to its own.",
        ))
        .parameter(idempotency_key_parameter())
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
                .build(),
        );
    for code in idem_codes {
        let status = code.status(Profile::Reference).to_string();
        // Two contract errors share 400 and two share 409; OpenAPI allows one
        // response per status, so the operation references the first and the
        // components carry all four.
        if code == ErrorCode::IdempotencyKeyMissing || code == ErrorCode::IdempotencyKeyInUse {
            op = op.response(
                status,
                RefOr::Ref(openapi::Ref::from_response_name(response_name(code))),
            );
        }
    }

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
            "/{idempotent-operation}",
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
                    "default_lease_secs": policy::DEFAULT_LEASE_SECS,
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
