//! The generated OpenAPI document is a valid OpenAPI 3.1 document, and the
//! checker that says so catches the mistakes it claims to catch.
//!
//! CI also runs an established validator (openapi-spec-validator) on the
//! committed file; these tests keep `cargo test` honest without Python.

use idem_spec::generate::{openapi, openapi_defects};
use serde_json::{Value, json};

fn generated() -> Value {
    serde_json::to_value(openapi()).expect("serialise")
}

// clause: idem.key.endpoints-published, idem.window.published
#[test]
fn the_generated_document_has_no_structural_defects() {
    let defects = openapi_defects(&generated());
    assert!(defects.is_empty(), "{defects:#?}");
}

// clause: idem.key.endpoints-published, idem.errors.distinct
#[test]
fn the_template_operation_carries_all_four_contract_errors() {
    let doc = generated();
    let op = &doc["paths"]["/{idempotent-operation}"]["post"];
    let template = op["parameters"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["in"] == "path"))
        .expect("the template's path parameter");
    assert_eq!(template["name"], "idempotent-operation");
    assert_eq!(template["required"], true);
    let examples = |status: &str| -> Vec<String> {
        let ex = &op["responses"][status]["content"]["application/problem+json"]["examples"];
        ex.as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    assert_eq!(
        examples("400"),
        ["idempotency_key_invalid", "idempotency_key_missing"]
    );
    assert_eq!(
        examples("409"),
        ["idempotency_key_in_use", "idempotency_key_mismatch"]
    );
    for status in ["400", "409"] {
        let ex = &op["responses"][status]["content"]["application/problem+json"]["examples"];
        for (name, e) in ex.as_object().into_iter().flatten() {
            assert_eq!(e["value"]["code"], name.as_str(), "{status} {name}");
            assert_eq!(e["value"]["status"].to_string(), status);
        }
    }
    assert!(op["responses"]["409"]["headers"]["Retry-After"].is_object());
    assert!(
        doc["components"]["schemas"]["FailurePolicy"].is_object()
            && doc["components"]["schemas"]["InFlightBehaviour"].is_object()
    );
}

/// A small valid document to break in one place at a time.
fn minimal() -> Value {
    json!({
        "openapi": "3.1.0",
        "info": {"title": "t", "version": "1"},
        "paths": {
            "/v1/things/{id}": {
                "get": {
                    "operationId": "getThing",
                    "parameters": [
                        {"name": "id", "in": "path", "required": true, "schema": {"type": "string"}},
                        {"$ref": "#/components/parameters/Limit"}
                    ],
                    "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Thing"}}}}}
                }
            }
        },
        "components": {
            "schemas": {"Thing": {"type": "object"}},
            "parameters": {"Limit": {"name": "limit", "in": "query", "schema": {"type": "integer"}}}
        }
    })
}

#[test]
fn the_checker_accepts_a_valid_document_and_names_each_defect() {
    assert_eq!(openapi_defects(&minimal()), Vec::<String>::new());
    let op = "/paths/~1v1~1things~1{id}/get";
    type Breaker = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Breaker)> = vec![
        ("not 3.1", Box::new(|d| d["openapi"] = json!("3.0.3"))),
        (
            "points nowhere",
            Box::new(|d| {
                d["components"]["schemas"]
                    .as_object_mut()
                    .expect("schemas")
                    .remove("Thing");
            }),
        ),
        (
            "is not declared",
            Box::new(move |d| {
                d.pointer_mut(&format!("{op}/parameters"))
                    .and_then(Value::as_array_mut)
                    .expect("params")
                    .remove(0);
            }),
        ),
        (
            "must be required",
            Box::new(move |d| {
                d.pointer_mut(&format!("{op}/parameters/0/required"))
                    .map(|r| *r = json!(false))
                    .expect("required");
            }),
        ),
        (
            "the path has no {memo}",
            Box::new(move |d| {
                d.pointer_mut(&format!("{op}/parameters"))
                    .and_then(Value::as_array_mut)
                    .expect("params")
                    .push(json!({"name": "memo", "in": "path", "required": true, "schema": {"type": "string"}}));
            }),
        ),
        (
            "declared twice",
            Box::new(move |d| {
                d.pointer_mut(&format!("{op}/parameters"))
                    .and_then(Value::as_array_mut)
                    .expect("params")
                    .push(json!({"name": "limit", "in": "query", "schema": {"type": "integer"}}));
            }),
        ),
        (
            "exactly one of schema and content",
            Box::new(|d| {
                d["components"]["parameters"]["Limit"]
                    .as_object_mut()
                    .expect("limit")
                    .remove("schema");
            }),
        ),
        (
            "is not a status",
            Box::new(move |d| {
                d.pointer_mut(&format!("{op}/responses"))
                    .and_then(Value::as_object_mut)
                    .expect("responses")
                    .insert("20X".into(), json!({"description": "x"}));
            }),
        ),
        (
            "no responses",
            Box::new(move |d| {
                *d.pointer_mut(&format!("{op}/responses"))
                    .expect("responses") = json!({});
            }),
        ),
        (
            "mutually exclusive",
            Box::new(move |d| {
                let media = d
                    .pointer_mut(&format!("{op}/responses/200/content/application~1json"))
                    .and_then(Value::as_object_mut)
                    .expect("media");
                media.insert("example".into(), json!({}));
                media.insert("examples".into(), json!({"a": {"value": {}}}));
            }),
        ),
        (
            "is also used by",
            Box::new(|d| {
                d["paths"]["/v1/other"] = json!({"post": {"operationId": "getThing", "responses": {"204": {"description": "x"}}}});
            }),
        ),
    ];
    for (expect, break_it) in cases {
        let mut doc = minimal();
        break_it(&mut doc);
        let defects = openapi_defects(&doc);
        assert!(
            defects.len() == 1 && defects[0].contains(expect),
            "expected one defect containing {expect:?}, got {defects:#?}"
        );
    }
}
