//! Idempotency keys never reach the logs in clear, at any level.
//!
//! A key is the client's name for an operation, and clients put order
//! numbers, invoice ids or worse in it; logs are copied to more places, and
//! kept longer, than the key table. So every log line that names a record
//! names it by its `key_hash` (the first 16 hex digits of SHA-256 over
//! caller and key, as on the `idem.request` span), never by the key.
//!
//! The test runs the real `idem-server` binary with `RUST_LOG=trace` (every
//! target, the dependencies' included), on SQLite and on PostgreSQL, and
//! sends every kind of request that makes the engine log about a key, each
//! with a key of its own that carries one planted marker: a first
//! execution, a replay, a mismatch, a stored 422, a quoted key, an invalid
//! key, a duplicate in flight (at once and held by `Prefer: wait`), a 500
//! that releases its key, a multi-step payment slow enough for its lease
//! heartbeat to run, a payment crashed mid-way and finished by the
//! completer after a restart, and one crashed and deleted unfinished by the
//! reaper. Then it searches everything the server wrote to stderr for the
//! marker, in clear and hex-encoded (the form a key takes inside a SQL
//! text), and finds neither; and it checks that the log is the one it
//! should be: at TRACE, with the hashes of the planted keys on the lines
//! that name them, so a server that logged nothing would fail too.
//!
//! Cost: about 10 s per store (two restarts, a slow processor call).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use axum_idempotency::metrics::key_hash;
use idem_fake_processor::{ControlMode, ControlRequest, spawn_in_process};
use idem_test_support::db::{Backend, TestDb};
use idem_test_support::{ChildServer, TempDir};

/// Bound on every wait of this test.
const GUARD: Duration = Duration::from_secs(30);

/// One test's requests: its server, its planted marker, a client.
struct Run {
    server: ChildServer,
    marker: String,
    http: reqwest::Client,
    /// The stderr of the server's earlier lives (before each restart).
    earlier: String,
}

impl Run {
    /// The planted key of the request path `path`.
    fn key(&self, path: &str) -> String {
        format!("{}-{path}", self.marker)
    }

    async fn post(
        &self,
        route: &str,
        key: Option<&str>,
        body: &str,
        extra: &[(&str, &str)],
    ) -> reqwest::Response {
        let mut req = self
            .http
            .post(format!("{}{route}", self.server.base_url()))
            .header("authorization", "Bearer demo-alice")
            .header("content-type", "application/json")
            .timeout(GUARD)
            .body(body.to_owned());
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        for (name, value) in extra {
            req = req.header(*name, *value);
        }
        req.send().await.unwrap()
    }

    async fn transfer(&self, key: &str, amount: i64, extra: &[(&str, &str)]) -> u16 {
        let body =
            format!(r#"{{"from":"acc_alice_main","to":"acc_alice_savings","amount":{amount}}}"#);
        self.post("/v1/transfers", Some(key), &body, extra)
            .await
            .status()
            .as_u16()
    }

    async fn payment(&self, key: &str) -> u16 {
        let body = r#"{"amount":2500,"currency":"eur","source":"tok_visa"}"#;
        self.post("/v1/payments", Some(key), body, &[])
            .await
            .status()
            .as_u16()
    }

    async fn hook(&self, path: &str, body: &str) -> serde_json::Value {
        let resp = self
            .http
            .post(format!("{}{path}", self.server.base_url()))
            .header("content-type", "application/json")
            .timeout(GUARD)
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{path}: {}", resp.status());
        resp.json().await.unwrap()
    }

    /// Crashes the server through a failpoint in a payment, keeps what it
    /// logged, and starts it again on the same database.
    async fn crash_payment_and_restart(&mut self, key: &str) {
        let http = self.http.clone();
        let url = format!("{}/v1/payments", self.server.base_url());
        let key = key.to_owned();
        // The request never gets an answer: the process aborts.
        let sent = tokio::spawn(async move {
            http.post(url)
                .header("authorization", "Bearer demo-alice")
                .header("content-type", "application/json")
                .header("idempotency-key", key)
                .header("idem-failpoint", "crash-after=payment_created")
                .timeout(GUARD)
                .body(r#"{"amount":2500,"currency":"eur","source":"tok_visa"}"#)
                .send()
                .await
        });
        assert!(
            self.server.wait_exit(GUARD).await.is_some(),
            "the crash failpoint did not end the server"
        );
        assert!(sent.await.unwrap().is_err(), "a crashed server answered");
        // What it wrote before aborting, read to the end of its stderr.
        let log = self
            .server
            .stderr_containing("FAILPOINT: aborting the process", GUARD)
            .await;
        assert!(log.contains("FAILPOINT: aborting the process"), "{log}");
        self.earlier.push_str(&log);
        self.server.restart().await.unwrap();
    }

    fn log(&self) -> String {
        format!("{}{}", self.earlier, self.server.stderr())
    }
}

async fn no_key_in_clear_at_trace(backend: Backend, name: &str) {
    let Some(db) = TestDb::new(backend, name).await else {
        return;
    };
    let dir = TempDir::new(name);
    let processor = spawn_in_process(dir.join("processor.db")).await.unwrap();
    let server = ChildServer::command(env!("CARGO_BIN_EXE_idem-server"))
        .args(["--listen", "127.0.0.1:0", "--database-url", &db.url])
        .args(["--processor-url", processor.base_url(), "--test-hooks"])
        // A short lease, so a slow charge runs the heartbeat. The
        // background completer's first pass is an hour after start, so
        // only the test hook finishes the first crashed payment, and the
        // second is left unfinished for the reaper.
        .args(["--lease-secs", "2", "--completer-interval-ms", "3600000"])
        .env("RUST_LOG", "trace")
        .env("NO_COLOR", "1")
        .capture_stderr()
        .start()
        .await
        .unwrap();
    let marker = format!("planted{}", uuid::Uuid::new_v4().simple());
    let mut run = Run {
        server,
        marker,
        http: reqwest::Client::new(),
        earlier: String::new(),
    };

    // Single-phase: first execution, replay, mismatch, a stored 422 and its
    // replay, a quoted key, an invalid key.
    let first = run.key("first");
    assert_eq!(run.transfer(&first, 5, &[]).await, 201);
    assert_eq!(run.transfer(&first, 5, &[]).await, 201);
    assert_eq!(run.transfer(&first, 6, &[]).await, 409);
    let refused = run.key("refused");
    assert_eq!(run.transfer(&refused, 900_000_000, &[]).await, 422);
    assert_eq!(run.transfer(&refused, 900_000_000, &[]).await, 422);
    let quoted = run.key("quoted");
    assert_eq!(run.transfer(&format!("\"{quoted}\""), 5, &[]).await, 201);
    assert_eq!(run.transfer(&quoted, 5, &[]).await, 201);
    let invalid = format!("{} invalid", run.marker);
    assert_eq!(run.transfer(&invalid, 5, &[]).await, 400);

    // In flight: the first holds its key at a failpoint; a duplicate gets
    // 409 at once, another is held by Prefer: wait until its time runs out.
    let held = run.key("held");
    let holder = {
        let (http, url, key) = (
            run.http.clone(),
            format!("{}/v1/transfers", run.server.base_url()),
            held.clone(),
        );
        tokio::spawn(async move {
            http.post(url)
                .header("authorization", "Bearer demo-alice")
                .header("content-type", "application/json")
                .header("idempotency-key", key)
                .header("idem-failpoint", "pause-after=started")
                .timeout(GUARD)
                .body(r#"{"from":"acc_alice_main","to":"acc_alice_savings","amount":5}"#)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    let paused = async {
        loop {
            let list = run
                .http
                .get(format!("{}/_test/failpoints", run.server.base_url()))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            if list.contains("after=started") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(GUARD, paused).await.unwrap();
    assert_eq!(run.transfer(&held, 5, &[]).await, 409);
    assert_eq!(run.transfer(&held, 5, &[("prefer", "wait=1")]).await, 409);
    run.hook("/_test/failpoints/release", "").await;
    assert_eq!(holder.await.unwrap(), 201);

    // A 500 that releases its key, then the retry that executes.
    let failed = run.key("failed");
    assert_eq!(
        run.transfer(&failed, 5, &[("idem-failpoint", "error-after=started")])
            .await,
        500
    );
    assert_eq!(run.transfer(&failed, 5, &[]).await, 201);

    // Multi-step: a charge slower than a third of the 2 s lease, so the
    // heartbeat renews it (a TRACE line) while the processor call runs.
    processor
        .client()
        .set_control(
            &ControlRequest::new(ControlMode::Normal)
                .slow_ms(1_500)
                .for_calls(1),
        )
        .await
        .unwrap();
    let paid = run.key("paid");
    assert_eq!(run.payment(&paid).await, 201);
    assert_eq!(run.payment(&paid).await, 201);

    // A payment crashed after its first phase, finished by the completer
    // once its lease has run out.
    let completed = run.key("completed");
    run.crash_payment_and_restart(&completed).await;
    run.hook("/_test/clock", r#"{"advance_secs":60}"#).await;
    let report = run.hook("/_test/complete", "").await;
    assert_eq!(report["finished"], 1, "{report}");
    assert_eq!(run.payment(&completed).await, 201);

    // A payment crashed the same way and left unfinished until the reaper
    // deletes it past retention (72 h).
    let reaped = run.key("reaped");
    run.crash_payment_and_restart(&reaped).await;
    // (The background reaper's pass at start-up may run after the clock
    // moved and be the one that deletes it; either pass logs the lines.)
    run.hook("/_test/clock", r#"{"advance_secs":300000}"#).await;
    run.hook("/_test/reap", "").await;
    let log = run
        .server
        .stderr_containing("reaper deleted unfinished requests", GUARD)
        .await;
    assert!(log.contains("reaper deleted unfinished requests"), "{log}");

    let log = run.log();
    // Nowhere the key itself: not in clear, not hex-encoded (as inside a
    // SQL text).
    let hex_marker = hex::encode(&run.marker);
    let leaks: Vec<&str> = log
        .lines()
        .filter(|l| {
            let lower = l.to_ascii_lowercase();
            lower.contains(&run.marker) || lower.contains(&hex_marker)
        })
        .collect();
    assert!(
        leaks.is_empty(),
        "{} log lines carry a planted idempotency key in clear:\n{}",
        leaks.len(),
        leaks
            .iter()
            .take(20)
            .copied()
            .collect::<Vec<_>>()
            .join("\n")
    );
    // And the log is the one this test means: at TRACE, with the planted
    // keys' hashes where the engine names them.
    assert!(
        log.contains(" TRACE "),
        "no TRACE line: RUST_LOG was not applied"
    );
    for (path, line) in [
        (&first, "claimed; executing"),
        (&first, "replay"),
        (&held, "in flight: 409"),
        (&failed, "server error: not stored; key released"),
        (&paid, "lease renewed"),
        (&completed, "completer: finished"),
        (
            &reaped,
            "reaper deleted an unfinished request past retention",
        ),
    ] {
        let hash = key_hash("alice", path);
        assert!(
            log.lines().any(|l| l.contains(line) && l.contains(&hash)),
            "no {line:?} line names {path}'s key_hash {hash}"
        );
    }
    let quoted_hash = key_hash("alice", &quoted);
    assert!(
        log.contains(&format!("key_hash={quoted_hash}")),
        "the quoted key is hashed as the key it names"
    );
}

#[tokio::test]
async fn no_log_line_carries_an_idempotency_key_on_sqlite() {
    no_key_in_clear_at_trace(Backend::Sqlite, "logs-sqlite").await;
}

#[tokio::test]
async fn no_log_line_carries_an_idempotency_key_on_postgres() {
    no_key_in_clear_at_trace(Backend::Postgres, "logs-postgres").await;
}
