//! `GET /openapi.json`: the example API's document, generated from the same
//! types the handlers use (utoipa), merged with the idempotency surface
//! published by the spec crate (the key parameter, the replay marker, the
//! contract's problem responses, and the windows under `x-idempotency`).

use idem_spec::generate::{
    CONTRACT_ERRORS, contract_responses, expires_header, idempotency_key_parameter, merge_response,
    problem_response, replayed_header, request_deadline_parameter,
};
use idem_spec::headers::{IDEMPOTENCY_KEY_EXPIRES, IDEMPOTENT_REPLAYED, REPLAYED_HEADERS};
use idem_spec::{ErrorCode, Policy, Problem, Profile};
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{RefOr, Response};

use super::{accounts, payments, transfers};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "idemkit reference server",
        description = "An example bank whose POST /v1/transfers and POST /v1/payments keep the Idempotency-Key contract."
    ),
    paths(
        transfers::create_transfer,
        transfers::list_transfers,
        transfers::get_transfer,
        accounts::list_accounts,
        accounts::get_account,
        payments::create_payment,
        payments::list_payments,
        payments::get_payment,
        payments::list_receipts
    ),
    components(schemas(
        transfers::NewTransfer,
        transfers::Transfer,
        transfers::TransferList,
        accounts::Account,
        accounts::AccountList,
        payments::NewPayment,
        payments::Payment,
        payments::PaymentList,
        payments::Receipt,
        payments::ReceiptList,
        Problem
    ))
)]
struct ApiDoc;

/// Paths whose POST requires an Idempotency-Key.
pub const IDEMPOTENT_POSTS: [&str; 2] = ["/v1/transfers", "/v1/payments"];

/// Of those, the multi-step ones (phases with recovery points).
pub const MULTI_STEP_POSTS: [&str; 1] = ["/v1/payments"];

/// Builds the document for a server answering in `profile` with `policy`.
pub fn document(profile: Profile, policy: &Policy) -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    doc.info.description = Some(format!(
        "An example bank whose POST /v1/transfers (one transaction) and POST /v1/payments \
         (multi-step, through an external processor) keep the Idempotency-Key contract \
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
        let params = op.parameters.get_or_insert_with(Vec::new);
        params.push(idempotency_key_parameter());
        params.push(request_deadline_parameter());
        for (status, response) in op.responses.responses.iter_mut() {
            if status.starts_with('2')
                && let RefOr::T(r) = response
            {
                r.headers
                    .insert(IDEMPOTENT_REPLAYED.to_owned(), replayed_header());
            }
        }
        // All four contract errors, in this profile's statuses: two codes
        // that share a status (400 missing/invalid, 409 mismatch/in use in
        // the reference profile) share one response with an example each,
        // and a status the operation already answers (422 under
        // ietf-draft) gains the contract's code beside its own.
        let unauthenticated: Response = problem_response(ErrorCode::Unauthenticated, profile);
        let spent: Response = problem_response(ErrorCode::DeadlineExceeded, profile);
        let extra = contract_responses(profile, &CONTRACT_ERRORS)
            .into_iter()
            .chain([
                (
                    ErrorCode::Unauthenticated.status(profile).to_string(),
                    unauthenticated,
                ),
                (
                    ErrorCode::DeadlineExceeded.status(profile).to_string(),
                    spent,
                ),
            ]);
        for (status, fresh) in extra {
            match op.responses.responses.get_mut(&status) {
                Some(RefOr::T(existing)) => merge_response(existing, fresh),
                Some(RefOr::Ref(_)) => {}
                None => {
                    op.responses.responses.insert(status, RefOr::T(fresh));
                }
            }
        }
        // The key's window end on every answer the key governs: stored
        // outcomes (2xx, final 4xx), replays, in-flight and mismatch; not
        // on the refusals made before the key is looked at.
        let before_the_key: Vec<String> = [
            ErrorCode::Unauthenticated,
            ErrorCode::IdempotencyKeyMissing,
            ErrorCode::IdempotencyKeyInvalid,
        ]
        .iter()
        .map(|c| c.status(profile).to_string())
        .collect();
        for (status, response) in op.responses.responses.iter_mut() {
            if (status.starts_with('2') || status.starts_with('4'))
                && !before_the_key.contains(status)
                && let RefOr::T(r) = response
            {
                r.headers
                    .insert(IDEMPOTENCY_KEY_EXPIRES.to_owned(), expires_header());
            }
        }
    }
    let ext = serde_json::json!({
        "contract_version": idem_spec::CONTRACT_VERSION,
        "profile": profile,
        "policy": policy,
        "replayed_headers": REPLAYED_HEADERS,
        "idempotent_operations": IDEMPOTENT_POSTS.iter().map(|p| format!("POST {p}")).collect::<Vec<_>>(),
        "multi_step_operations": MULTI_STEP_POSTS.iter().map(|p| format!("POST {p}")).collect::<Vec<_>>(),
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

/// Writes the document `cli` would serve at `/openapi.json` to `path`
/// (`-`: stdout), pretty-printed: `idem-server --write-openapi PATH`,
/// which CI feeds to an OpenAPI validator.
pub fn write(cli: &crate::config::Cli, path: &std::path::Path) -> crate::Result<()> {
    let doc = document(cli.profile, &cli.published_policy());
    let text = serde_json::to_string_pretty(&doc)
        .map_err(|e| crate::Error::Internal(format!("OpenAPI document: {e}")))?
        + "\n";
    if path.as_os_str() == "-" {
        use std::io::Write;
        std::io::stdout().lock().write_all(text.as_bytes())?;
    } else {
        std::fs::write(path, text)?;
    }
    Ok(())
}
