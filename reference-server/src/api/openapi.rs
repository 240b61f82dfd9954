//! `GET /openapi.json`: the example API's document, generated from the same
//! types the handlers use (utoipa), merged with the idempotency surface
//! published by the spec crate (the key parameter, the replay marker, the
//! contract's problem responses, and the windows under `x-idempotency`).

use idem_spec::generate::{idempotency_key_parameter, problem_response, replayed_header};
use idem_spec::headers::{IDEMPOTENT_REPLAYED, REPLAYED_HEADERS};
use idem_spec::{ErrorCode, Policy, Problem, Profile};
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, Response};

use super::{accounts, transfers};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "idemkit reference server",
        description = "An example bank whose POST /v1/transfers keeps the Idempotency-Key contract."
    ),
    paths(
        transfers::create_transfer,
        transfers::list_transfers,
        transfers::get_transfer,
        accounts::list_accounts,
        accounts::get_account
    ),
    components(schemas(
        transfers::NewTransfer,
        transfers::Transfer,
        transfers::TransferList,
        accounts::Account,
        accounts::AccountList,
        Problem
    ))
)]
struct ApiDoc;

/// Paths whose POST requires an Idempotency-Key.
pub const IDEMPOTENT_POSTS: [&str; 1] = ["/v1/transfers"];

/// Builds the document for a server answering in `profile` with `policy`.
pub fn document(profile: Profile, policy: &Policy) -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    doc.info.description = Some(format!(
        "An example bank whose POST /v1/transfers keeps the Idempotency-Key contract \
         (profile `{profile}`). Replay window {} s; retention {} s; a key reused after its window \
         is a new request. Keys are scoped to the authenticated caller.",
        policy.replay_window_secs, policy.retention_secs
    ));
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "bearer",
        SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
    );
    for path in IDEMPOTENT_POSTS {
        let Some(op) = doc
            .paths
            .paths
            .get_mut(path)
            .and_then(|item| item.post.as_mut())
        else {
            continue;
        };
        op.parameters
            .get_or_insert_with(Vec::new)
            .push(idempotency_key_parameter());
        for (status, response) in op.responses.responses.iter_mut() {
            if status.starts_with('2')
                && let RefOr::T(r) = response
            {
                r.headers
                    .insert(IDEMPOTENT_REPLAYED.to_owned(), replayed_header());
            }
        }
        // Two contract errors can share a status (400 missing/invalid, 409
        // mismatch/in use in the reference profile); OpenAPI has one response
        // per status, so a shared status lists both codes in its description.
        let codes = [
            ErrorCode::IdempotencyKeyMissing,
            ErrorCode::IdempotencyKeyInvalid,
            ErrorCode::IdempotencyKeyMismatch,
            ErrorCode::IdempotencyKeyInUse,
            ErrorCode::Unauthenticated,
        ];
        for code in codes {
            let status = code.status(profile).to_string();
            let fresh: Response = problem_response(code, profile);
            match op.responses.responses.get_mut(&status) {
                Some(RefOr::T(existing)) => {
                    existing.description =
                        format!("{} Or: {}", existing.description, fresh.description);
                    for (k, v) in fresh.headers {
                        existing.headers.entry(k).or_insert(v);
                    }
                }
                Some(RefOr::Ref(_)) => {}
                None => {
                    op.responses.responses.insert(status, RefOr::T(fresh));
                }
            }
        }
    }
    let ext = serde_json::json!({
        "contract_version": idem_spec::CONTRACT_VERSION,
        "profile": profile,
        "policy": policy,
        "replayed_headers": REPLAYED_HEADERS,
        "idempotent_operations": IDEMPOTENT_POSTS.iter().map(|p| format!("POST {p}")).collect::<Vec<_>>(),
    });
    let mut extensions = doc.extensions.take().unwrap_or_default();
    extensions.merge(
        utoipa::openapi::extensions::ExtensionsBuilder::new()
            .add("x-idempotency", ext)
            .build(),
    );
    doc.extensions = Some(extensions);
    doc
}
