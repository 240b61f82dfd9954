//! The CLI's offline commands and the harness's own verdicts, without any
//! server: `init` writes a template `list` accepts, `list` sends nothing,
//! undeclared hooks are unsupported (never pass), an unreachable target is
//! a harness error (exit 2), waivers are reported.

use std::sync::Arc;

use idem_conformance::cli as commands;
use idem_conformance::server::case::Ctx;
use idem_conformance::server::{manifest, runner};
use idem_spec::report::Verdict;

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("idem-conf-cli-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&d).expect("tmp dir");
    d.join(name)
}

#[test]
fn init_writes_a_template_that_list_plans_without_sending() {
    let p = tmp("target.toml");
    commands::init(&p).expect("init");
    assert!(commands::init(&p).is_err(), "init never overwrites");
    // The template points at 127.0.0.1:8080; nothing listens there in
    // tests, and list must not need it.
    let plan = commands::list(&p).expect("list");
    assert!(plan.contains("concurrency.gate"), "{plan}");
    assert!(plan.contains("unsupported: needs hooks.clock"), "{plan}");
    assert!(plan.contains("permits: "), "{plan}");
}

#[tokio::test]
async fn undeclared_hooks_make_cases_unsupported_not_passed() {
    let loaded = manifest::parse(manifest::TEMPLATE, "t").expect("template");
    let client = runner::client(&loaded).expect("client");
    let ctx = Arc::new(Ctx::new(
        loaded.manifest.clone(),
        client,
        runner::run_id(),
        1,
    ));
    for case in idem_conformance::server::cases::all()
        .iter()
        .filter(|c| c.missing_need(&loaded.manifest).is_some())
    {
        let r = runner::run_case(case, ctx.clone()).await;
        assert_eq!(r.verdict, Verdict::Unsupported, "{}", case.id);
        assert!(
            r.reason
                .as_deref()
                .is_some_and(|s| s.contains("not declared"))
        );
    }
    assert_eq!(
        ctx.client.requests_sent(),
        0,
        "unsupported cases send nothing"
    );
}

#[tokio::test]
async fn an_unreachable_target_fails_the_preflight_and_no_case_runs() {
    // Bind then drop a listener: the port is very likely closed now.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let text =
        manifest::TEMPLATE.replace("http://127.0.0.1:8080", &format!("http://127.0.0.1:{port}"));
    let loaded = manifest::parse(&text, "t").expect("manifest");
    let e = runner::run(
        &loaded,
        &runner::Options {
            seed: Some(3),
            only: Some("keys.*".into()),
            progress: false,
            artifacts_dir: Some(std::env::temp_dir()),
            strict: false,
        },
    )
    .await
    .expect_err("a harness error, not a report");
    let msg = e.to_string();
    assert!(matches!(e, idem_conformance::Error::Preflight(_)), "{msg}");
    assert!(
        msg.contains("target.base_url") && msg.contains(&port.to_string()),
        "one sentence naming what to fix: {msg}"
    );
    assert_eq!(msg.matches(". ").count(), 0, "one sentence: {msg}");
}

#[test]
fn the_books_example_manifest_and_the_init_template_both_list() {
    let book = demo_root().join("book/src/examples/manifest.toml");
    let plan = commands::list(&book).expect("the book's example manifest loads");
    assert!(plan.contains("concurrency.gate"), "{plan}");
    let p = tmp("init.toml");
    commands::init(&p).expect("init");
    let plan = commands::list(&p).expect("the init template loads");
    assert!(plan.contains("failure.4xx-final"), "{plan}");
    // The template's body fits the reference server's transfer schema
    // (which refuses unknown fields): memo carries the marker.
    let m = manifest::parse(manifest::TEMPLATE, "t")
        .expect("template")
        .manifest;
    let body = m.endpoints[0].body.as_object().expect("object body");
    let mut fields: Vec<&str> = body.keys().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(fields, ["amount", "from", "memo", "to"]);
}

fn demo_root() -> std::path::PathBuf {
    idem_conformance::server::demo::workspace_root()
}
