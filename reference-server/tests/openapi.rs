//! The OpenAPI document the server serves (`GET /openapi.json`, and
//! `--write-openapi` for CI's validator) is valid OpenAPI 3.1 in every
//! profile and publishes the whole idempotency surface.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use support::{Backend, app, both, db, send};

// clause: idem.key.endpoints-published, idem.window.published
async fn the_served_openapi_document_is_valid_in_every_profile(b: Backend) {
    let db = db!(b, "openapi-valid");
    for profile in ["reference", "ietf-draft", "stripe", "resend"] {
        let app = app(&db, &["--profile", profile]).await;
        let resp = send(
            &app.router,
            Request::get("/openapi.json").body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!(resp.status, StatusCode::OK);
        let doc = resp.json();
        let defects = idem_spec::generate::openapi_defects(&doc);
        assert!(defects.is_empty(), "{profile}: {defects:#?}");
        // memo and the page are query parameters of the list.
        let params = doc["paths"]["/v1/transfers"]["get"]["parameters"]
            .as_array()
            .unwrap();
        for name in ["memo", "limit", "cursor"] {
            assert!(
                params
                    .iter()
                    .any(|p| p["name"] == name && p["in"] == "query"),
                "{profile}: {name}"
            );
        }
        // All four contract errors, one example each, on both idempotent
        // operations, in this profile's codes.
        for path in ["/v1/transfers", "/v1/payments"] {
            let responses = &doc["paths"][path]["post"]["responses"];
            let mut codes = BTreeSet::new();
            for (status, r) in responses.as_object().unwrap() {
                let ex = &r["content"]["application/problem+json"]["examples"];
                for (name, e) in ex.as_object().into_iter().flatten() {
                    assert_eq!(
                        e["value"]["status"].to_string(),
                        *status,
                        "{profile} {name}"
                    );
                    codes.insert(name.clone());
                }
            }
            let p: idem_spec::Profile = idem_spec::Profile::from_name(profile).unwrap();
            for code in idem_spec::generate::CONTRACT_ERRORS {
                assert!(
                    codes.contains(code.wire_code(p)),
                    "{profile} {path}: {code:?} missing from {codes:?}"
                );
            }
        }
        app.state.store.close().await;
    }
}
both!(the_served_openapi_document_is_valid_in_every_profile);

#[tokio::test]
async fn write_openapi_writes_the_served_document_and_serves_nothing() {
    let dir = idem_test_support::TempDir::new("idem-openapi");
    let out = dir.join("openapi.json");
    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem-server"))
        .args(["--profile", "stripe", "--replay-window-secs", "600"])
        .arg("--write-openapi")
        .arg(&out)
        .status()
        .await
        .unwrap();
    assert!(status.success());
    let written: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let cli = idem_server::config::Cli::from_args([
        "idem-server",
        "--profile",
        "stripe",
        "--replay-window-secs",
        "600",
    ])
    .unwrap();
    let served = serde_json::to_value(idem_server::api::openapi::document(
        cli.profile,
        &cli.published_policy(),
    ))
    .unwrap();
    assert_eq!(written, served);
    assert_eq!(
        written["x-idempotency"]["policy"]["replay_window_secs"],
        600
    );
}
