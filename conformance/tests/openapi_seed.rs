//! `init --from-openapi`: a manifest seeded from an OpenAPI 3.x document,
//! on the reference server's own document (and then used against the
//! server) and on a foreign document with another auth scheme, `$ref`s,
//! path parameters and examples.

mod support;

use std::path::PathBuf;

use idem_conformance::server::manifest;
use idem_conformance::server::openapi::{self, FILL_ME};
use idem_spec::manifest::EffectProbe;
use idem_spec::report::Verdict;
use serde_json::json;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[test]
fn a_foreign_document_seeds_endpoints_callers_and_a_probe() {
    let text = std::fs::read_to_string(fixture("foreign-openapi.json")).expect("fixture");
    let seeded = openapi::seed(&text, "foreign-openapi.json").expect("seeds");
    let m = &seeded.manifest;
    assert_eq!(m.target.base_url, "https://sandbox.acme.example/api");
    // Only the two operations declaring the key header (any case, via a
    // $ref parameter); /v1/ping declares none.
    let names: Vec<&str> = m.endpoints.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["createCharge", "createRefund"]);
    let charge = &m.endpoints[0];
    assert_eq!(charge.path, "/v1/customers/{{customer_id}}/charges");
    assert!(!charge.key_required, "the document says required: false");
    assert_eq!(
        charge.body,
        json!({
            "amount": "{{amount}}",
            "currency": "usd",
            "source": "{{source}}",
            "statement_descriptor": "{{marker}}"
        }),
        "the schema: amount drawn, the enum's first value, a required string as a caller var, the listing's filter carries the marker"
    );
    assert_eq!(
        m.probe,
        EffectProbe::List {
            url: "/v1/customers/{customer_id}/charges?statement_descriptor={{marker}}".into(),
            items_pointer: "/data".into(),
            match_pointer: "/statement_descriptor".into(),
            match_on: Default::default(),
            caller: None,
        }
    );
    // The example, nulls dropped (TOML has none); the marker has no field.
    assert_eq!(
        m.endpoints[1].body,
        json!({"charge": "ch_123", "amount": "{{amount}}"})
    );
    for (i, c) in m.callers.iter().enumerate() {
        let key = c.headers.get("X-Acme-Key").expect("the apiKey header");
        assert!(key.starts_with(FILL_ME), "{key}");
        assert_eq!(
            c.vars.keys().collect::<Vec<_>>(),
            ["customer_id", "source"],
            "caller {i}"
        );
    }
    assert_ne!(m.callers[0].headers, m.callers[1].headers);
    assert!(
        seeded
            .notes
            .iter()
            .any(|n| n.contains("createRefund") && n.contains("marker")),
        "{:?}",
        seeded.notes
    );
    // What `init --from-openapi` writes loads as a manifest.
    let toml = openapi::render(&seeded, "foreign-openapi.json").expect("render");
    assert!(toml.contains("# TODO:"), "{toml}");
    let back = manifest::parse(&toml, "seeded").expect("the seeded manifest loads");
    assert_eq!(&back.manifest, m);
}

#[test]
fn the_contracts_generic_document_seeds_its_one_operation() {
    let text = std::fs::read_to_string(
        idem_conformance::server::demo::workspace_root().join("spec/generated/openapi.json"),
    )
    .expect("spec/generated/openapi.json");
    let seeded = openapi::seed(&text, "openapi.json").expect("seeds");
    let e = &seeded.manifest.endpoints;
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].path, "/{{idempotent-operation}}");
    assert!(e[0].key_required);
    let toml = openapi::render(&seeded, "openapi.json").expect("render");
    manifest::parse(&toml, "seeded").expect("loads");
}

#[test]
fn the_cli_writes_the_seeded_manifest_and_refuses_to_overwrite() {
    use clap::Parser;
    let out = std::env::temp_dir().join(format!("idem-seeded-{}.toml", std::process::id()));
    let _ = std::fs::remove_file(&out);
    let args = |p: &PathBuf| {
        idem_conformance::cli::Cli::parse_from([
            "idem-conformance".to_owned(),
            "init".into(),
            p.display().to_string(),
            "--from-openapi".into(),
            fixture("foreign-openapi.json").display().to_string(),
        ])
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    assert_eq!(rt.block_on(idem_conformance::cli::execute(args(&out))), 0);
    manifest::load(&out).expect("loads");
    assert_eq!(
        rt.block_on(idem_conformance::cli::execute(args(&out))),
        idem_conformance::EXIT_HARNESS,
        "never overwrites"
    );
    let _ = std::fs::remove_file(&out);
}

// The reference server's own document, as `idem-server --write-openapi`
// writes it: seeded, the placeholders filled with the demo's callers, and
// run against the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_servers_own_document_seeds_a_manifest_that_runs() {
    let Some(bin) = support::unflawed_server_bin() else {
        return;
    };
    let doc = std::env::temp_dir().join(format!("idem-ref-openapi-{}.json", std::process::id()));
    let status = std::process::Command::new(&bin)
        .arg("--write-openapi")
        .arg(&doc)
        .status()
        .expect("idem-server --write-openapi");
    assert!(status.success());
    let text = std::fs::read_to_string(&doc).expect("the document");
    let _ = std::fs::remove_file(&doc);
    let seeded = openapi::seed(&text, "idem-server --write-openapi").expect("seeds");
    let m = &seeded.manifest;
    let transfers = m
        .endpoints
        .iter()
        .find(|e| e.path == "/v1/transfers")
        .expect("POST /v1/transfers declares the key");
    assert_eq!(transfers.method, "POST");
    assert_eq!(transfers.body["memo"], "{{marker}}");
    assert_eq!(transfers.body["amount"], "{{amount}}");
    assert!(m.endpoints.iter().any(|e| e.path == "/v1/payments"));
    assert!(
        m.callers[0].headers["Authorization"].starts_with(&format!("Bearer {FILL_ME}")),
        "the bearer scheme"
    );

    // Fill in what the document cannot know: the demo's credentials and
    // accounts, and the server's address.
    let (stack, demo) = support::start(&bin, &[]).await;
    let mut filled = seeded.manifest.clone();
    filled.target.base_url = demo.manifest.target.base_url.clone();
    for (c, d) in filled.callers.iter_mut().zip(&demo.manifest.callers) {
        c.headers = d.headers.clone();
        for (k, v) in c.vars.iter_mut() {
            if let Some(x) = d.vars.get(k) {
                *v = x.clone();
            }
        }
    }
    filled.endpoints.retain(|e| e.path == "/v1/transfers");
    // The failure bodies are placeholders no document can fill: a run with
    // them is refused by the preflight, naming the field.
    let placeholder =
        manifest::parse(&toml::to_string(&filled).expect("toml"), "seeded").expect("loads");
    let e = idem_conformance::server::runner::run_with(
        &placeholder,
        &idem_conformance::server::runner::Options {
            seed: Some(3),
            only: Some("replay.verbatim".into()),
            ..Default::default()
        },
        Some(stack.restarter()),
    )
    .await
    .expect_err("placeholders refused");
    assert!(
        e.to_string().contains("FILL_ME") && e.to_string().contains("rejected_body"),
        "{e}"
    );
    // Filled in (here: the lines deleted, leaving those cases unsupported).
    for e in &mut filled.endpoints {
        e.rejected_body = None;
        e.server_error_body = None;
    }
    let toml = toml::to_string(&filled).expect("toml");
    let loaded = manifest::parse(&toml, "seeded").expect("loads");
    let r = support::run_only(&stack, &loaded, 3, Some("replay.verbatim")).await;
    drop(stack);
    assert_eq!(r.cases[0].verdict, Verdict::Pass, "{}", support::show(&r));
}

/// `init --from-openapi URL`: a YAML document served over HTTP (as a
/// FastAPI service serves its own), whose operations the middleware keys
/// without declaring the header, named with `--keyed`.
#[tokio::test]
async fn a_yaml_document_served_over_http_seeds_the_keyed_operations() {
    let yaml = "openapi: 3.1.0\ninfo: {title: Shop}\nservers: [{url: 'http://127.0.0.1:9'}]\npaths:\n  /orders:\n    post:\n      operationId: create_order\n      requestBody:\n        content:\n          application/json:\n            example: {amount: 5, note: hello}\n";
    let app = axum::Router::new().route(
        "/openapi.yaml",
        axum::routing::get(move || async move { yaml }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!(
        "http://{}/openapi.yaml",
        listener.local_addr().expect("addr")
    );
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let text = idem_conformance::cli::read_document(&url)
        .await
        .expect("fetched");
    let dir = std::env::temp_dir().join(format!("idem-seed-url-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let out = dir.join("shop.toml");
    let _ = std::fs::remove_file(&out);
    assert!(
        idem_conformance::cli::init_from_openapi_text(&out, &text, &url, &[]).is_err(),
        "nothing declares the header"
    );
    idem_conformance::cli::init_from_openapi_text(&out, &text, &url, &["create_order".into()])
        .expect("seeded");
    let loaded = manifest::load(&out).expect("the written manifest loads");
    assert_eq!(loaded.manifest.endpoints[0].path, "/orders");
    assert_eq!(loaded.manifest.target.base_url, "http://127.0.0.1:9");
    // A document that is not there is a clear error, not a panic.
    let e = idem_conformance::cli::read_document(&url.replace("openapi.yaml", "nope"))
        .await
        .expect_err("404");
    assert!(e.to_string().contains("404"), "{e}");
    server.abort();
    let _ = std::fs::remove_dir_all(&dir);
}
