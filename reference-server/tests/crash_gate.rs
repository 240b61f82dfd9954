//! The crash-recovery gate: the fake processor and `idem-server` run as
//! child processes; for every failpoint of `POST /v1/payments` a payment
//! is sent with `Idem-Failpoint: crash-<failpoint>`, the server aborts
//! there, is restarted on the same database, and then either
//!
//! - the client retries with the same key (variant `retry`), or
//! - nobody does, and the completer must finish the payment (variant
//!   `completer`; the test only moves the server clock past the lease and
//!   polls the payment's state with a bounded deadline).
//!
//! A third variant (`past_window`) crashes at every point that leaves
//! committed progress and moves the clock past the replay window before
//! the retry: the key must still be resumed, never replaced by a new
//! payment (clause `idem.window.progress`).
//!
//! Every run must end with a 201, exactly one charge at the processor, no
//! repeated processor call when the crash fell between phases, and at most
//! one (deduplicated by the processor's key) when it fell between the call
//! and its commit. On SQLite and on PostgreSQL.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use idem_fake_processor::ProcessorClient;
use idem_server::api::payments::PAYMENT_FAILPOINTS;
use idem_test_support::{ChildServer, TempDir, cargo_bin};
use support::{Backend, TestDb, both};

/// Names a prebuilt `idem-fake-processor` binary (else cargo builds it).
const PROCESSOR_BIN_ENV: &str = "IDEM_FAKE_PROCESSOR_BIN";

const BODY: &str = r#"{"amount":4200,"currency":"eur","source":"tok_gate"}"#;
const LEASE_SECS: u64 = 5;

/// Failpoints between the processor call and the commit that records it.
const BETWEEN_CALL_AND_COMMIT: [&str; 2] = ["after=charge-call", "before=charge_created"];

async fn start_server(db_url: &str, processor: &str, completer_ms: u64) -> ChildServer {
    ChildServer::command(env!("CARGO_BIN_EXE_idem-server"))
        .args(["--listen", "127.0.0.1:0", "--database-url", db_url])
        .args(["--test-hooks", "--processor-url", processor])
        .args(["--lease-secs", &LEASE_SECS.to_string()])
        .args(["--completer-interval-ms", &completer_ms.to_string()])
        .args(["--max-connections", "4"])
        .env("RUST_LOG", "error")
        .start()
        .await
        .expect("start idem-server")
}

/// Waits (bounded) for the aborted child and checks it died abnormally.
async fn expect_crashed(server: &mut ChildServer) {
    let status = server
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the server should have aborted");
    assert!(!status.success(), "exit status {status}");
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

async fn pay(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    failpoint: Option<&str>,
) -> reqwest::Result<reqwest::Response> {
    let mut b = http
        .post(format!("{base}/v1/payments"))
        .header("authorization", "Bearer demo-alice")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(BODY);
    if let Some(f) = failpoint {
        b = b.header("idem-failpoint", format!("crash-{f}"));
    }
    b.send().await
}

async fn payment_by_key(
    http: &reqwest::Client,
    base: &str,
    key: &str,
) -> Option<serde_json::Value> {
    let v: serde_json::Value = http
        .get(format!("{base}/v1/payments?idempotency_key={key}"))
        .header("authorization", "Bearer demo-alice")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["payments"].as_array().unwrap().first().cloned()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    Retry,
    Completer,
    /// Retry after the replay window has ended.
    PastWindow,
}

/// One hour past the reference replay window (24 h).
const PAST_WINDOW_SECS: u64 = 24 * 3600 + 3600;

/// Payments recorded under `key` (every one, not just the first).
async fn payments_by_key(http: &reqwest::Client, base: &str, key: &str) -> usize {
    let v: serde_json::Value = http
        .get(format!("{base}/v1/payments?idempotency_key={key}"))
        .header("authorization", "Bearer demo-alice")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["payments"].as_array().unwrap().len()
}

async fn gate(backend: Backend, variant: Variant) {
    let name = format!("gate_{variant:?}").to_lowercase();
    let Some(db) = TestDb::new(backend, &name).await else {
        return;
    };
    let bin = tokio::task::spawn_blocking(|| {
        cargo_bin(
            "idem-fake-processor",
            "idem-fake-processor",
            PROCESSOR_BIN_ENV,
        )
    })
    .await
    .unwrap()
    .expect("build idem-fake-processor");
    let dir = TempDir::new("idem-gate-proc");
    let processor_db = dir.join("processor.db");
    let processor = ChildServer::command(&bin)
        .args(["--listen", "127.0.0.1:0", "--db"])
        .arg(&processor_db)
        .start()
        .await
        .unwrap();
    let pc = ProcessorClient::new(processor.base_url());
    let http = client();
    // The retry variant keeps the completer out of the way; the completer
    // variant runs it every 100 ms.
    let completer_ms = match variant {
        Variant::Retry | Variant::PastWindow => 3_600_000,
        Variant::Completer => 100,
    };
    for (i, fp) in PAYMENT_FAILPOINTS.iter().enumerate() {
        // Past the window only a key with committed progress is still the
        // old request; one that committed nothing, or completed, is free
        // for a new one (idem.window.expiry).
        if variant == Variant::PastWindow
            && matches!(*fp, "before=payment_created" | "after=finished")
        {
            continue;
        }
        let key = format!("gate-{i}");
        let before = pc.charges().await.unwrap();

        let mut server = start_server(&db.url, processor.base_url(), completer_ms).await;
        let crashed = pay(&http, server.base_url(), &key, Some(fp)).await;
        assert!(
            crashed.is_err(),
            "{fp}: the server answered instead of aborting"
        );
        expect_crashed(&mut server).await;

        let server = start_server(&db.url, processor.base_url(), completer_ms).await;
        // The dead server's lease is still running on the new server's
        // clock: move past it (and past the replay window in that variant).
        let advance = match variant {
            Variant::PastWindow => PAST_WINDOW_SECS,
            Variant::Retry | Variant::Completer => LEASE_SECS + 1,
        };
        let r = http
            .post(format!("{}/_test/clock", server.base_url()))
            .json(&serde_json::json!({"advance_secs": advance}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);

        if variant == Variant::Completer && *fp != "before=payment_created" {
            // Nothing but the completer touches the key now.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            loop {
                let p = payment_by_key(&http, server.base_url(), &key).await;
                if p.as_ref().is_some_and(|p| p["status"] == "succeeded") {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{fp}: the completer did not finish the payment; it is {p:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        if *fp == "before=payment_created" {
            // Nothing was committed: no payment exists, nothing to complete.
            assert!(
                payment_by_key(&http, server.base_url(), &key)
                    .await
                    .is_none()
            );
        }

        // Every run ends with a 201 for the client.
        let r = pay(&http, server.base_url(), &key, None).await.unwrap();
        assert_eq!(r.status(), 201, "{fp}: {:?}", r.text().await);
        let replayed = r
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        let body: serde_json::Value = r.json().await.unwrap();
        let finished_before_retry = *fp == "after=finished"
            || (variant == Variant::Completer && *fp != "before=payment_created");
        assert_eq!(replayed, finished_before_retry, "{fp}: replayed?");
        assert_eq!(body["status"], "succeeded");
        assert_eq!(
            payments_by_key(&http, server.base_url(), &key).await,
            1,
            "{fp}: exactly one payment for the key"
        );
        if variant == Variant::PastWindow {
            // Finished after its window, the key is replayed from now on,
            // not executed again.
            let again = pay(&http, server.base_url(), &key, None).await.unwrap();
            assert_eq!(again.status(), 201, "{fp}");
            assert_eq!(
                again
                    .headers()
                    .get("idempotent-replayed")
                    .map(|v| v.as_bytes()),
                Some(&b"true"[..]),
                "{fp}: the finished key is replayed"
            );
        }

        let after = pc.charges().await.unwrap();
        assert_eq!(after.count, before.count + 1, "{fp}: exactly one charge");
        let charge = after
            .charges
            .iter()
            .find(|c| Some(c.id.as_str()) == body["charge_id"].as_str())
            .unwrap_or_else(|| panic!("{fp}: the payment's charge is not at the processor"));
        let calls = after.calls_for(&charge.idempotency_key);
        if BETWEEN_CALL_AND_COMMIT.contains(fp) {
            assert!(
                (1..=2).contains(&calls),
                "{fp}: at most one repeated call, got {calls}"
            );
        } else {
            assert_eq!(calls, 1, "{fp}: a crash between phases repeats no call");
        }
        assert_eq!(
            after.total_calls(),
            before.total_calls() + calls,
            "{fp}: no call under any other key"
        );
        drop(server);
    }
    drop(processor);
}

// clause: idem.multistep.resume, idem.multistep.foreign-key, idem.multistep.phases
async fn crash_then_retry(backend: Backend) {
    gate(backend, Variant::Retry).await;
}
both!(crash_then_retry);

// clause: idem.completer.drives, idem.lease.takeover
async fn crash_then_completer(backend: Backend) {
    gate(backend, Variant::Completer).await;
}
both!(crash_then_completer);

// clause: idem.window.progress, idem.multistep.foreign-key
async fn crash_then_retry_past_the_window(backend: Backend) {
    gate(backend, Variant::PastWindow).await;
}
both!(crash_then_retry_past_the_window);
