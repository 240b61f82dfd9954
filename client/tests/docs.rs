//! What the crate's documentation shows is what the crate does:
//!
//! - the middleware example (`examples/middleware.rs`) is compiled into this test and run
//!   against a local server that fails its first attempt; the crate README carries the same
//!   code, checked here to be a verbatim copy of the example's anchored region (the book
//!   includes that region directly);
//! - every idem-client claim of the comparison table (`docs/comparison.md`, in the crate docs
//!   and the book) names a test, and each named test exists.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;

#[allow(dead_code)]
#[path = "../examples/middleware.rs"]
mod example;

/// Every request the server got: key, authorization, body.
type Seen = Arc<Mutex<Vec<(Option<String>, Option<String>, String)>>>;

async fn transfers(
    State(seen): State<Seen>,
    headers: HeaderMap,
    body: String,
) -> impl IntoResponse {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let mut seen = seen.lock().expect("lock");
    seen.push((header("idempotency-key"), header("authorization"), body));
    if seen.len() == 1 {
        // A gateway in front of the API gave up on the first attempt.
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "upstream timed out".to_owned(),
        )
    } else {
        (
            StatusCode::CREATED,
            r#"{"id":"tr_1","from":"acc_alice_main","to":"acc_alice_savings","amount":100}"#
                .to_owned(),
        )
    }
}

async fn serve() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route("/v1/transfers", post(transfers))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(listener, app).await.expect("server runs");
    });
    (format!("http://{addr}"), seen)
}

// clause: idem.client.same-key, idem.client.key-derivation, idem.client.allowlist
#[tokio::test]
async fn the_middleware_example_pays_once_with_its_derived_key() {
    let (base, seen) = serve().await;
    // The example's own client, system clock and all: the retry waits its real jitter (under
    // 500 ms); nothing here depends on how long.
    let (status, report) = example::pay_invoice(&example::client(), &base, 8412)
        .await
        .expect("201 after one retry");
    assert_eq!(status, 201);
    assert_eq!(report.attempts, 2);
    assert_eq!(report.stopped, None);
    assert_eq!(report.delays.len(), 1);
    assert_eq!(
        report.key.as_ref().map(|k| k.as_str()),
        Some("transfer-invoice-8412")
    );
    assert!(!report.key_minted);
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 2);
    for (key, auth, body) in &seen {
        assert_eq!(key.as_deref(), Some("transfer-invoice-8412"));
        assert_eq!(auth.as_deref(), Some("Bearer demo-alice"));
        let v: serde_json::Value = serde_json::from_str(body).expect("JSON body");
        assert_eq!(v["amount"], 100);
    }
}

fn read(rel: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The lines between `// ANCHOR: name` and `// ANCHOR_END: name`, as mdBook includes them.
fn anchored(text: &str, name: &str) -> String {
    let start = format!("// ANCHOR: {name}");
    let end = format!("// ANCHOR_END: {name}");
    let lines: Vec<&str> = text
        .lines()
        .skip_while(|l| l.trim() != start)
        .skip(1)
        .take_while(|l| l.trim() != end)
        .collect();
    assert!(!lines.is_empty(), "anchor {name} not found");
    lines.join("\n") + "\n"
}

/// The body of the first ```rust code block after `marker` in a Markdown text.
fn code_block_after(md: &str, marker: &str) -> String {
    let rest = &md[md
        .find(marker)
        .unwrap_or_else(|| panic!("{marker:?} not found"))..];
    let open = rest.find("```rust\n").expect("a rust block") + "```rust\n".len();
    let close = rest[open..].find("\n```").expect("the block closes");
    rest[open..open + close].to_owned() + "\n"
}

#[test]
fn the_readme_shows_the_example_verbatim() {
    let example = anchored(&read("examples/middleware.rs"), "middleware");
    let readme = read("README.md");
    assert_eq!(
        code_block_after(
            &readme,
            "<!-- example: examples/middleware.rs#middleware -->"
        ),
        example,
        "client/README.md has drifted from examples/middleware.rs; copy the anchored region"
    );
}

#[test]
fn the_book_includes_the_example_region() {
    let book = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../book/src/client.md"),
    )
    .expect("client.md");
    assert!(book.contains("{{#include ../../client/examples/middleware.rs:middleware}}"));
}

#[test]
fn every_test_the_comparison_table_names_exists() {
    let table = read("docs/comparison.md");
    let rows: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("| "))
        .skip(1)
        .collect();
    assert!(rows.len() >= 9, "{} rows", rows.len());
    let mut named = 0;
    for row in &rows {
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        let ours = cells.get(1).copied().unwrap_or_default();
        // `tests/<file>.rs`: `name`, `name`…
        let Some(at) = ours.find("(`tests/") else {
            panic!("the idem-client cell names no test: {row}")
        };
        let cite = &ours[at + 2..ours.rfind(')').unwrap_or(ours.len())];
        // Several files are separated by `; `.
        for part in cite.split("; `") {
            let part = part.trim_start_matches('`');
            let (file, names) = part.split_once("`: ").expect("`tests/file.rs`: `name`");
            let source = read(file);
            for name in names.split(", ") {
                let name = name.trim_matches('`');
                assert!(
                    source.contains(&format!("fn {name}(")),
                    "{file} has no test {name} (cited in docs/comparison.md)"
                );
                named += 1;
            }
        }
    }
    assert!(named >= rows.len());
}

#[test]
fn the_crate_docs_and_the_book_show_the_comparison_table() {
    assert!(read("src/lib.rs").contains("include_str!(\"../docs/comparison.md\")"));
    let book = read("../book/src/client.md");
    assert!(book.contains("{{#include ../../client/docs/comparison.md}}"));
}
