//! The conformance kit audits the receiver as a webhook sender would reach
//! it: through `kit.toml` as committed (keys in `webhook-id`, two senders
//! known by their signatures), over HTTP, with every request signed by the
//! kit as it leaves. The receiver must conform, and the run must not be
//! vacuous: the concurrency gate, replay and scoping cases ran and passed.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use axum_idempotency::SqliteStore;
use axum_idempotency::clock::SystemClock;
use example_webhook_receiver::{DEMO_BILLING, DEMO_SHOP, Sender, app};
use idem_conformance::server::manifest::parse_with_env;
use idem_conformance::server::runner::{self, Options};
use idem_spec::report::Verdict;

// clause: idem.concurrency.single-effect, idem.replay.verbatim, idem.scope.caller, idem.fingerprint.mismatch
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_kit_finds_the_receiver_conforming() {
    let path = std::env::temp_dir().join(format!("webhooks-kit-{}.db", std::process::id()));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let store = SqliteStore::open(&path).await.unwrap();
    let senders = vec![
        Sender::from_whsec("billing", DEMO_BILLING).unwrap(),
        Sender::from_whsec("shop", DEMO_SHOP).unwrap(),
    ];
    let router = app(store, Arc::new(SystemClock), senders).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, router).await });

    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/kit.toml")).unwrap();
    let env = |name: &str| match name {
        "BILLING_WEBHOOK_SECRET" => Some(DEMO_BILLING.to_owned()),
        "SHOP_WEBHOOK_SECRET" => Some(DEMO_SHOP.to_owned()),
        _ => None,
    };
    let mut loaded = parse_with_env(&text, "kit.toml", &env).unwrap();
    // The committed file names the port `main.rs` serves on; this
    // receiver listens on a free one (as `--base-url` does on the CLI).
    loaded.manifest.target.base_url = format!("http://{addr}");
    let report = runner::run(
        &loaded,
        &Options {
            seed: Some(11),
            only: None,
            progress: false,
            artifacts_dir: Some(std::env::temp_dir()),
            strict: false,
        },
    )
    .await
    .unwrap();
    let shown = idem_conformance::verdict::report::console::render(&report);
    let bad = report.unsettled_cases();
    assert!(bad.is_empty(), "{bad:?}\n{shown}");
    assert_eq!(report.summary.exit_code, 0, "{shown}");
    for id in [
        "concurrency.gate",
        "replay.verbatim",
        "scope.other-caller",
        "mismatch.body",
        "keys.unclaimed",
        "keys.missing-rejected",
        "keys.invalid-rejected",
        "failure.before-claim",
        "deadline.spent",
        "windows.expiry-header",
    ] {
        let c = report.cases.iter().find(|c| c.id == id).expect(id);
        assert_eq!(c.verdict, Verdict::Pass, "{id}\n{shown}");
    }
    server.abort();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}
