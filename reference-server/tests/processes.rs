//! The built binary as a child process: the announcement line, readiness,
//! and the concurrency gate (64 identical requests, one key) against one
//! process on SQLite, one on PostgreSQL, and two processes sharing one
//! PostgreSQL database.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use idem_test_support::ChildServer;
use support::{Backend, TestDb};

/// Starts `idem-server` on `db_url` with `extra` flags and waits until
/// `/healthz` answers.
async fn start(db_url: &str, extra: &[&str]) -> ChildServer {
    let server = ChildServer::command(env!("CARGO_BIN_EXE_idem-server"))
        .args(["--listen", "127.0.0.1:0", "--database-url", db_url])
        .args(extra)
        .capture_stderr()
        .start()
        .await
        .expect("start idem-server");
    wait_ready(server.base_url()).await;
    server
}

/// Polls /healthz with a bounded deadline.
async fn wait_ready(base: &str) {
    let client = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = client.get(format!("{base}/healthz")).send().await
            && r.status() == 200
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{base} never became ready"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[derive(Debug)]
struct Answer {
    status: u16,
    replayed: bool,
    code: Option<String>,
    body: Vec<u8>,
}

async fn transfer(client: &reqwest::Client, base: &str, key: &str, body: &str) -> Answer {
    let r = client
        .post(format!("{base}/v1/transfers"))
        .header("authorization", "Bearer demo-alice")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    let replayed = r
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let body = r.bytes().await.unwrap().to_vec();
    let code = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["code"].as_str().map(str::to_owned));
    Answer {
        status,
        replayed,
        code,
        body,
    }
}

/// Fires 64 identical requests with one key, released together, spread
/// round-robin over `bases`, and checks the single-effect gate.
async fn gate(bases: &[String]) {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();
    let body = r#"{"from":"acc_alice_main","to":"acc_alice_savings","amount":321}"#;
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..64 {
        let (client, barrier) = (client.clone(), barrier.clone());
        let base = bases[i % bases.len()].clone();
        set.spawn(async move {
            barrier.wait().await;
            transfer(&client, &base, "gate-key", body).await
        });
    }
    let mut answers = Vec::new();
    while let Some(a) = set.join_next().await {
        answers.push(a.unwrap());
    }
    let first: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == 201 && !a.replayed)
        .collect();
    assert_eq!(first.len(), 1, "exactly one execution: {answers:?}");
    let (mut replays, mut in_use) = (0, 0);
    for a in &answers {
        match a.status {
            201 if a.replayed => {
                assert_eq!(a.body, first[0].body, "replays are byte-identical");
                replays += 1;
            }
            201 => {}
            409 => {
                assert_eq!(a.code.as_deref(), Some("idempotency_key_in_use"));
                in_use += 1;
            }
            other => panic!("unexpected answer {other}: {a:?}"),
        }
    }
    eprintln!(
        "gate over {} process(es): 1 execution, {replays} replays, {in_use} in-use",
        bases.len()
    );
    // The effect, seen from every process.
    for base in bases {
        let accounts: serde_json::Value = client
            .get(format!("{base}/v1/accounts"))
            .header("authorization", "Bearer demo-alice")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let balances: Vec<i64> = accounts["accounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["balance"].as_i64().unwrap())
            .collect();
        assert_eq!(balances, vec![99_679, 100_321]);
        let transfers: serde_json::Value = client
            .get(format!("{base}/v1/transfers"))
            .header("authorization", "Bearer demo-alice")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(transfers["count"], 1);
    }
}

// clause: idem.concurrency.single-effect, idem.claim.atomic
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_one_process_on_sqlite() {
    let db = TestDb::new(Backend::Sqlite, "proc-sqlite").await.unwrap();
    let server = start(&db.url, &[]).await;
    gate(&[server.base_url().to_owned()]).await;
    // Test hooks are off unless asked for.
    let r = reqwest::Client::new()
        .post(format!("{}/_test/clock", server.base_url()))
        .header("content-type", "application/json")
        .body(r#"{"advance_secs":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    drop(server);
}

// clause: idem.concurrency.single-effect, idem.claim.atomic
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_one_process_on_postgres() {
    let Some(db) = TestDb::new(Backend::Postgres, "proc-postgres").await else {
        return;
    };
    let server = start(&db.url, &[]).await;
    gate(&[server.base_url().to_owned()]).await;
    drop(server);
}

// clause: idem.concurrency.single-effect, idem.claim.atomic, idem.inflight.conflict
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_two_processes_sharing_one_postgres_database() {
    let Some(db) = TestDb::new(Backend::Postgres, "proc-two").await else {
        return;
    };
    // Both start at once: migrations are serialised by sqlx's advisory lock.
    let (a, b) = tokio::join!(start(&db.url, &[]), start(&db.url, &[]));
    assert_ne!(a.base_url(), b.base_url());
    gate(&[a.base_url().to_owned(), b.base_url().to_owned()]).await;
    drop((a, b));
}

// clause: idem.concurrency.single-effect, idem.claim.atomic
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gate_two_processes_sharing_one_sqlite_file() {
    // Not a deployment we recommend (one writer for both), but it must stay
    // correct: the second process's claim waits for SQLite's write lock and
    // then finds the key complete.
    let db = TestDb::new(Backend::Sqlite, "proc-two-sqlite")
        .await
        .unwrap();
    let a = start(&db.url, &[]).await;
    let b = start(&db.url, &[]).await;
    gate(&[a.base_url().to_owned(), b.base_url().to_owned()]).await;
    drop((a, b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_hooks_are_announced_loudly_and_move_the_clock() {
    let db = TestDb::new(Backend::Sqlite, "proc-hooks").await.unwrap();
    let server = start(&db.url, &["--test-hooks"]).await;
    assert!(
        server.stderr().contains("TEST HOOKS ARE ON"),
        "stderr: {}",
        server.stderr()
    );
    let client = reqwest::Client::new();
    let r = client
        .post(format!("{}/_test/clock", server.base_url()))
        .header("content-type", "application/json")
        .body(r#"{"advance_secs":90000}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["offset_secs"], 90_000);
}

#[test]
fn help_documents_the_flags_child_process_users_need() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem-server"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--listen",
        "--database-url",
        "--profile",
        "--token",
        "--tokens-file",
        "--replay-window-secs",
        "--retention-secs",
        "--test-hooks",
        "listening on http://ADDR",
    ] {
        assert!(help.contains(flag), "--help should mention {flag}:\n{help}");
    }
}
