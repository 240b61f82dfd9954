//! Drift checks: the committed `spec/generated/` files, the clause list and
//! every clause citation in the workspace must agree with their sources.

mod support;

use std::collections::BTreeSet;

use idem_spec::clauses;

fn book() -> Vec<(String, String)> {
    support::read_book(&support::workspace_root().join("book/src")).expect("read book/src")
}

#[test]
fn generated_files_are_up_to_date() {
    let fresh = idem_spec::generate::artifacts(&book()).expect("generate");
    let stale = support::stale_files(&support::workspace_root().join("spec/generated"), &fresh);
    assert!(
        stale.is_empty(),
        "spec/generated is stale: {stale:?}\nrun `cargo run -p idem-spec --bin idem-spec-gen` and commit the result"
    );
}

#[test]
fn compiled_clause_list_matches_the_book() {
    let from_book = clauses::parse_book(&book()).expect("book clauses parse");
    assert_eq!(from_book.as_slice(), clauses::all());
    assert!(!from_book.is_empty());
}

#[test]
fn every_citation_names_an_existing_clause() {
    let known: BTreeSet<&str> = clauses::all().iter().map(|c| c.id.as_str()).collect();
    let citations =
        support::workspace_citations(&support::workspace_root()).expect("scan workspace");
    let unknown: Vec<String> = citations
        .iter()
        .filter(|c| !known.contains(c.id.as_str()))
        .map(|c| format!("{} cites unknown clause {}", c.location, c.id))
        .collect();
    assert!(unknown.is_empty(), "{}", unknown.join("\n"));
    // The scan is not vacuous: this very crate cites clauses.
    assert!(
        citations
            .iter()
            .any(|c| c.location.starts_with("spec/src/key.rs"))
    );
}

#[test]
fn openapi_describes_the_key_header_and_replay_headers() {
    let doc = serde_json::to_value(idem_spec::generate::openapi()).expect("serialise");
    assert_eq!(doc["openapi"], "3.1.0");
    let op = &doc["paths"]["/{idempotent-operation}"]["post"];
    let key = op["parameters"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "Idempotency-Key"))
        .expect("Idempotency-Key parameter");
    assert_eq!(key["in"], "header");
    assert_eq!(key["required"], true);
    assert_eq!(key["schema"]["maxLength"], 512);
    assert!(
        key["schema"]["pattern"]
            .as_str()
            .is_some_and(|p| p.starts_with('^'))
    );
    let responses = &doc["components"]["responses"];
    for name in [
        "IdempotencyKeyMissing",
        "IdempotencyKeyInvalid",
        "IdempotencyKeyMismatch",
        "IdempotencyKeyInUse",
    ] {
        assert!(responses[name].is_object(), "missing response {name}");
    }
    assert!(responses["IdempotencyKeyInUse"]["headers"]["Retry-After"].is_object());
    assert!(responses["IdempotentReplay"]["headers"]["Idempotent-Replayed"].is_object());
    assert_eq!(doc["x-idempotency"]["policy"]["replay_window_secs"], 86_400);
}
