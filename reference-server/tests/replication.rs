//! A PostgreSQL primary and a streaming standby (initdb + pg_basebackup on
//! loopback ports), keyed load through two server processes, the primary
//! killed with SIGKILL, the standby promoted: what a client sees.
//!
//! The servers reach the database through a TCP relay standing in for what
//! follows the primary in production (a virtual IP, a DNS name moved by the
//! failover tooling, a proxy): sqlx 0.8 connects to one host per URL and has
//! no `target_session_attrs`, so the store cannot pick the primary itself.
//! When the standby is promoted the relay points at it, and the servers find
//! it without a restart.
//!
//! Counted: acknowledged first executions (a 201 that is not a replay) whose
//! transfer is missing on the new primary, and keys with more than one
//! transfer on it (a second effect). Synchronous replication must lose none
//! and double none; asynchronous must double none, and its lost count is
//! printed (the window the book describes).
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::time::Duration;

use idem_test_support::{ChildServer, PgCluster};
use sqlx::Connection;
use tokio::time::Instant;

/// Longest any wait of this test may take.
const GUARD: Duration = Duration::from_secs(30);

/// A relay on 127.0.0.1 to whichever port `target` holds.
async fn relay(target: Arc<AtomicU16>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let to = target.load(Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    port
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// One answer to a keyed transfer.
#[derive(Debug, Clone)]
struct Answer {
    key: String,
    status: Option<u16>,
    replayed: bool,
    id: Option<String>,
    at: Instant,
}

async fn transfer(client: &reqwest::Client, base: &str, key: &str) -> Answer {
    let r = support::alice_transfer(client, base, key).send().await;
    let at = Instant::now();
    match r {
        Ok(r) => {
            let status = r.status().as_u16();
            let replayed = r.headers().contains_key("idempotent-replayed");
            let body: serde_json::Value = r.json().await.unwrap_or_default();
            Answer {
                key: key.to_owned(),
                status: Some(status),
                replayed,
                id: body["id"].as_str().map(str::to_owned),
                at,
            }
        }
        Err(_) => Answer {
            key: key.to_owned(),
            status: None,
            replayed: false,
            id: None,
            at,
        },
    }
}

async fn ready(client: &reqwest::Client, base: &str) -> Option<u16> {
    client
        .get(format!("{base}/readyz"))
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16())
}

async fn wait_ready(client: &reqwest::Client, base: &str, want: u16) -> Duration {
    let start = Instant::now();
    loop {
        if ready(client, base).await == Some(want) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < GUARD,
            "{base}/readyz never answered {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What one failover came to.
#[derive(Debug)]
struct Failover {
    acknowledged_before_kill: usize,
    lost_acknowledged: usize,
    doubled_keys: usize,
    unavailable_for: Duration,
}

async fn failover(synchronous: bool, test: &str) -> Option<Failover> {
    let primary = tokio::task::spawn_blocking({
        let test = test.to_owned();
        move || PgCluster::start(&test)
    })
    .await
    .unwrap()?;
    let primary = Arc::new(primary);
    let standby = {
        let p = primary.clone();
        Arc::new(
            tokio::task::spawn_blocking(move || PgCluster::standby_of(&p))
                .await
                .unwrap(),
        )
    };
    let mut admin = sqlx::PgConnection::connect(&primary.url()).await.unwrap();
    if synchronous {
        sqlx::query("ALTER SYSTEM SET synchronous_standby_names = '*'")
            .execute(&mut admin)
            .await
            .unwrap();
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&mut admin)
            .await
            .unwrap();
    }
    // The standby streams (and, synchronous, is the sync standby) before
    // any load.
    let want = if synchronous { "sync" } else { "async" };
    let start = Instant::now();
    loop {
        let state: Option<String> =
            sqlx::query_scalar("SELECT sync_state FROM pg_stat_replication LIMIT 1")
                .fetch_optional(&mut admin)
                .await
                .unwrap();
        if state.as_deref() == Some(want) {
            break;
        }
        assert!(
            start.elapsed() < GUARD,
            "standby never became {want}: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    admin.close().await.ok();

    let target = Arc::new(AtomicU16::new(primary.port()));
    let relay_port = relay(target.clone()).await;
    let url = format!("postgres://postgres@127.0.0.1:{relay_port}/postgres");
    let mut servers = Vec::new();
    for _ in 0..2 {
        servers.push(
            ChildServer::command(env!("CARGO_BIN_EXE_idem-server"))
                .args(["--listen", "127.0.0.1:0", "--database-url", &url])
                .args(["--max-connections", "4", "--store-timeout-ms", "1000"])
                .env("RUST_LOG", "error")
                .start()
                .await
                .expect("start idem-server"),
        );
    }
    let bases: Vec<String> = servers.iter().map(|s| s.base_url().to_owned()).collect();
    let client = http();
    for b in &bases {
        wait_ready(&client, b, 200).await;
    }

    // Keyed load: every key sent to both servers at once.
    let answers = Arc::new(std::sync::Mutex::new(Vec::<Answer>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..3 {
        let (client, bases, answers, stop) =
            (client.clone(), bases.clone(), answers.clone(), stop.clone());
        workers.spawn(async move {
            for i in 0..10_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let key = format!("w{w}-{i}");
                let (a, b) = tokio::join!(
                    transfer(&client, &bases[0], &key),
                    transfer(&client, &bases[1], &key)
                );
                answers.lock().unwrap().extend([a, b]);
            }
        });
    }
    // Load for a while, then the crash.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let killed_at = Instant::now();
    {
        let p = primary.clone();
        tokio::task::spawn_blocking(move || p.kill()).await.unwrap();
    }
    // Readiness tells the truth: both servers are unready while there is
    // no primary to write to.
    for b in &bases {
        wait_ready(&client, b, 503).await;
    }
    {
        let s = standby.clone();
        tokio::task::spawn_blocking(move || s.promote())
            .await
            .unwrap();
    }
    target.store(standby.port(), Ordering::SeqCst);
    for b in &bases {
        wait_ready(&client, b, 200).await;
    }
    let first_success_after = loop {
        let a = transfer(
            &client,
            &bases[0],
            &format!("probe-{}", killed_at.elapsed().as_nanos()),
        )
        .await;
        if a.status == Some(201) {
            break a.at - killed_at;
        }
        assert!(
            killed_at.elapsed() < GUARD,
            "no success after the promotion: {a:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    stop.store(true, Ordering::SeqCst);
    while let Some(r) = workers.join_next().await {
        r.unwrap();
    }
    let answers = answers.lock().unwrap().clone();
    for a in &answers {
        assert_ne!(a.status, Some(500), "never a 500: {a:?}");
    }

    // Every key retried until it has its 201 (the client's side of the
    // contract: a 503 or no answer is retried with the same key).
    let mut keys: Vec<&str> = answers.iter().map(|a| a.key.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    for key in &keys {
        let start = Instant::now();
        loop {
            let a = transfer(&client, &bases[0], key).await;
            if a.status == Some(201) {
                break;
            }
            assert!(start.elapsed() < GUARD, "{key} never succeeded: {a:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // Count on the new primary.
    let mut db = sqlx::PgConnection::connect(&standby.url()).await.unwrap();
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT id, idempotency_key FROM transfers WHERE idempotency_key NOT LIKE 'probe-%'",
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    db.close().await.ok();
    let mut per_key: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, key) in &rows {
        *per_key.entry(key.as_str()).or_default() += 1;
    }
    let ids: std::collections::BTreeSet<&str> = rows.iter().map(|(id, _)| id.as_str()).collect();
    let acknowledged: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.status == Some(201) && !a.replayed && a.at < killed_at)
        .collect();
    let lost = acknowledged
        .iter()
        .filter(|a| a.id.as_deref().is_some_and(|id| !ids.contains(id)))
        .count();
    let doubled = per_key.values().filter(|n| **n > 1).count();
    for key in &keys {
        assert_eq!(
            per_key.get(key),
            Some(&1),
            "{key}: one transfer on the new primary"
        );
    }
    drop(servers);
    Some(Failover {
        acknowledged_before_kill: acknowledged.len(),
        lost_acknowledged: lost,
        doubled_keys: doubled,
        unavailable_for: first_success_after,
    })
}

// clause: idem.store.fail-closed, idem.concurrency.single-effect
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_standby_promoted_loses_no_acknowledged_execution() {
    let Some(f) = failover(true, "replication_synchronous").await else {
        return;
    };
    eprintln!("synchronous failover: {f:?}");
    assert!(f.unavailable_for < GUARD, "{f:?}");
    assert!(f.acknowledged_before_kill > 0, "{f:?}");
    assert_eq!(f.lost_acknowledged, 0, "{f:?}");
    assert_eq!(f.doubled_keys, 0, "{f:?}");
}

// clause: idem.store.fail-closed, idem.concurrency.single-effect
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_standby_promoted_doubles_nothing_and_its_loss_window_is_measured() {
    let Some(f) = failover(false, "replication_asynchronous").await else {
        return;
    };
    eprintln!("asynchronous failover: {f:?}");
    assert!(f.unavailable_for < GUARD, "{f:?}");
    assert!(f.acknowledged_before_kill > 0, "{f:?}");
    assert_eq!(f.doubled_keys, 0, "{f:?}");
}
