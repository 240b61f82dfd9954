//! The key store failing for real under a running server: a full
//! filesystem (a small tmpfs, filled and freed), SQLite locked by another
//! process, and a PostgreSQL cluster of the test's own stopped
//! (`pg_ctl stop -m immediate`) in the middle of a load and started again.
//!
//! What must hold every time (clause `idem.store.fail-closed`): requests are
//! answered fast with `503 upstream_unavailable` and `Retry-After`, never
//! held and never executed without their claim; readiness says so; the
//! first write after the store is back succeeds without a restart; and a
//! retry of every refused key executes it exactly once.
//!
//! Timing figures are printed (`--nocapture`), and only the generous bound
//! the contract promises is asserted: an answer within the store timeout
//! (twice: the read, then the claim) plus a margin.
#![allow(clippy::unwrap_used)]

mod support;

use std::io::Write;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_test_support::{ChildServer, MariaDb, PgCluster, TempDir, Tmpfs};
use sqlx::Connection;
use tokio::time::Instant;

/// The server's default `--store-timeout-ms`.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);

/// Slack for a loaded two-core machine on top of the contract's bound.
const MARGIN: Duration = Duration::from_secs(3);

/// The longest a request may take while the store is down: the lookup and
/// the claim may each wait one store timeout.
const ANSWER_BOUND: Duration = Duration::from_secs(2 * 2 + 3);

/// Longest any poll of these tests may take before the test fails.
const GUARD: Duration = Duration::from_secs(30);

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap()
}

#[derive(Debug, Clone)]
struct Shot {
    key: String,
    sent: Instant,
    took: Duration,
    /// `None`: no answer (the client's timeout or a refused connection).
    status: Option<u16>,
    code: Option<String>,
    retry_after: Option<String>,
}

impl Shot {
    fn answered_at(&self) -> Instant {
        self.sent + self.took
    }

    fn is_fail_fast_503(&self) -> bool {
        self.status == Some(503)
            && self.code.as_deref() == Some("upstream_unavailable")
            && self
                .retry_after
                .as_deref()
                .is_some_and(|v| v.parse::<u64>().is_ok_and(|s| s >= 1))
    }
}

/// A condition on the shots so far.
type Pred = Box<dyn Fn(&[Shot]) -> bool + Send>;

/// One `POST /v1/transfers` of 1 unit from alice's main account.
async fn shoot(client: &reqwest::Client, base: &str, key: &str) -> Shot {
    let sent = Instant::now();
    let r = support::alice_transfer(client, base, key).send().await;
    let took = sent.elapsed();
    match r {
        Ok(r) => {
            let status = r.status().as_u16();
            let retry_after = r
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body: serde_json::Value = r.json().await.unwrap_or(serde_json::Value::Null);
            Shot {
                key: key.to_owned(),
                sent,
                took,
                status: Some(status),
                code: body["code"].as_str().map(str::to_owned),
                retry_after,
            }
        }
        Err(_) => Shot {
            key: key.to_owned(),
            sent,
            took,
            status: None,
            code: None,
            retry_after: None,
        },
    }
}

async fn status_of(client: &reqwest::Client, url: &str) -> Option<u16> {
    client
        .get(url)
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16())
}

/// Polls `url` until it answers `want` (bounded by [`GUARD`]).
async fn wait_status(client: &reqwest::Client, url: &str, want: u16) {
    let deadline = Instant::now() + GUARD;
    loop {
        if status_of(client, url).await == Some(want) {
            return;
        }
        assert!(Instant::now() < deadline, "{url} never answered {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn start_server(db_url: &str, extra: &[&str]) -> ChildServer {
    let server = ChildServer::command(env!("CARGO_BIN_EXE_idem-server"))
        .args(["--listen", "127.0.0.1:0", "--database-url", db_url])
        .args(["--max-connections", "4"])
        .args(extra)
        .env("RUST_LOG", "error")
        .start()
        .await
        .expect("start idem-server");
    wait_status(&http(), &format!("{}/readyz", server.base_url()), 200).await;
    server
}

/// Retries every key that did not get a 201 until it does (bounded), then
/// checks each key moved money exactly once: the transfer count and the
/// balance both equal the number of distinct keys.
async fn settle_and_count(client: &reqwest::Client, base: &str, shots: &[Shot]) {
    let mut keys: Vec<&str> = shots.iter().map(|s| s.key.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    for key in &keys {
        if shots.iter().any(|s| s.key == *key && s.status == Some(201)) {
            continue;
        }
        let deadline = Instant::now() + GUARD;
        loop {
            let s = shoot(client, base, key).await;
            if s.status == Some(201) {
                break;
            }
            assert!(Instant::now() < deadline, "{key} never succeeded: {s:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let n = i64::try_from(keys.len()).unwrap();
    let v: serde_json::Value = client
        .get(format!("{base}/v1/transfers?limit=1"))
        .header("authorization", "Bearer demo-alice")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["count"].as_i64(), Some(n), "one transfer per key");
    let v: serde_json::Value = client
        .get(format!("{base}/v1/accounts/acc_alice_main"))
        .header("authorization", "Bearer demo-alice")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        v["balance"].as_i64(),
        Some(100_000 - n),
        "each key moved money once"
    );
}

// clause: idem.store.fail-closed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_a_503_and_the_first_write_after_space_is_freed_succeeds() {
    let Some(fs) = Tmpfs::mount("3m", "a_full_disk_is_a_503") else {
        return;
    };
    let url = format!("sqlite://{}", fs.join("idem.db").display());
    let server = start_server(&url, &[]).await;
    let (client, base) = (http(), server.base_url().to_owned());
    let mut shots = Vec::new();
    for i in 0..3 {
        let s = shoot(&client, &base, &format!("before-{i}")).await;
        assert_eq!(s.status, Some(201), "{s:?}");
        shots.push(s);
    }
    // Fill the filesystem for real: write until the kernel says no.
    let filler = fs.join("filler");
    {
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 16 * 1024];
        let mut full = false;
        for _ in 0..1024 {
            if f.write_all(&chunk).and_then(|()| f.flush()).is_err() {
                full = true;
                break;
            }
        }
        assert!(full, "the tmpfs never filled up");
    }
    // Every write fails while the disk is full, fast and retryable; more
    // writes than the pool has connections, so every connection meets a
    // failed commit.
    for i in 0..8 {
        let s = shoot(&client, &base, &format!("full-{i}")).await;
        assert!(s.is_fail_fast_503(), "a write on a full disk: {s:?}");
        assert!(s.took < ANSWER_BOUND, "{s:?}");
        shots.push(s);
    }
    std::fs::remove_file(&filler).unwrap();
    // Space is back: the very next write succeeds, and so does every one
    // after it (a connection left inside a failed transaction would answer
    // 500 "non-zero transaction depth" here until a restart).
    for i in 0..16 {
        let s = shoot(&client, &base, &format!("after-{i}")).await;
        assert_eq!(
            s.status,
            Some(201),
            "write {i} after space was freed: {s:?}"
        );
        shots.push(s);
    }
    settle_and_count(&client, &base, &shots).await;
    drop(server);
}

// clause: idem.store.fail-closed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_locked_by_another_process_is_a_503_within_the_busy_bound() {
    let dir = TempDir::new("idem-lock");
    let url = format!("sqlite://{}", dir.join("idem.db").display());
    let server = start_server(&url, &[]).await;
    let (client, base) = (http(), server.base_url().to_owned());
    let first = shoot(&client, &base, "unlocked").await;
    assert_eq!(first.status, Some(201), "{first:?}");
    // This test process is "another process" to the server: it takes the
    // database's write lock and holds it.
    let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&url).unwrap();
    let mut other = sqlx::SqliteConnection::connect_with(&opts).await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut other)
        .await
        .unwrap();
    let locked = shoot(&client, &base, "locked").await;
    eprintln!(
        "SQLite locked by another process: answered {:?} in {:?}",
        locked.status, locked.took
    );
    assert!(locked.is_fail_fast_503(), "{locked:?}");
    assert!(
        locked.took < STORE_TIMEOUT + MARGIN,
        "answered within the busy bound: {locked:?}"
    );
    sqlx::query("ROLLBACK").execute(&mut other).await.unwrap();
    other.close().await.unwrap();
    // The lock is gone: the same key now executes, once.
    let retried = shoot(&client, &base, "locked").await;
    assert_eq!(retried.status, Some(201), "{retried:?}");
    settle_and_count(&client, &base, &[first, locked, retried]).await;
    drop(server);
}

/// A database a test can crash and bring back under a running server.
trait Outage: Send + Sync + 'static {
    fn url(&self) -> String;
    fn stop_immediate(&self);
    fn start_again(&self);
    fn name(&self) -> &'static str;
}

impl Outage for PgCluster {
    fn url(&self) -> String {
        PgCluster::url(self)
    }
    fn stop_immediate(&self) {
        PgCluster::stop_immediate(self);
    }
    fn start_again(&self) {
        PgCluster::start_again(self);
    }
    fn name(&self) -> &'static str {
        "PostgreSQL"
    }
}

impl Outage for MariaDb {
    fn url(&self) -> String {
        MariaDb::url(self)
    }
    fn stop_immediate(&self) {
        MariaDb::stop_immediate(self);
    }
    fn start_again(&self) {
        MariaDb::start_again(self);
    }
    fn name(&self) -> &'static str {
        "MariaDB"
    }
}

// clause: idem.store.fail-closed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_mid_load_fails_fast_and_the_first_write_after_it_returns_succeeds() {
    let Some(cluster) = tokio::task::spawn_blocking(|| PgCluster::start("postgres_stopped"))
        .await
        .unwrap()
    else {
        return;
    };
    stopped_mid_load(Arc::new(cluster)).await;
}

// clause: idem.store.fail-closed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_stopped_mid_load_fails_fast_and_the_first_write_after_it_returns_succeeds() {
    let Some(db) = tokio::task::spawn_blocking(|| MariaDb::start("mariadb_stopped"))
        .await
        .unwrap()
    else {
        return;
    };
    stopped_mid_load(Arc::new(db)).await;
}

// clause: idem.store.fail-closed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_mariadb_is_a_503_and_writes_resume_when_it_is_writable() {
    let Some(db) = tokio::task::spawn_blocking(|| MariaDb::start("mariadb_read_only"))
        .await
        .unwrap()
    else {
        return;
    };
    let server = start_server(&db.url(), &[]).await;
    let (client, base) = (http(), server.base_url().to_owned());
    let before = shoot(&client, &base, "ro-before").await;
    assert_eq!(before.status, Some(201), "{before:?}");
    db.root_sql("SET GLOBAL read_only = 1");
    let during = shoot(&client, &base, "ro-during").await;
    assert!(during.is_fail_fast_503(), "{during:?}");
    assert!(during.took < ANSWER_BOUND, "{during:?}");
    // Readiness writes a row, so a read-only store is not ready.
    wait_status(&client, &format!("{base}/readyz"), 503).await;
    // A replay is a read: still served.
    let replay = shoot(&client, &base, "ro-before").await;
    assert_eq!(replay.status, Some(201), "{replay:?}");
    db.root_sql("SET GLOBAL read_only = 0");
    let after = shoot(&client, &base, "ro-during").await;
    assert_eq!(
        after.status,
        Some(201),
        "the same key, once writable: {after:?}"
    );
    wait_status(&client, &format!("{base}/readyz"), 200).await;
    settle_and_count(&client, &base, &[before, during, after]).await;
    drop(server);
}

/// Keyed load through one server while `db` is killed and brought back:
/// every answer in the outage is a 201 committed before it or a fail-fast
/// 503 with Retry-After, the first write after the database returns
/// succeeds without restarting the server, and every key moved money once.
async fn stopped_mid_load(cluster: Arc<dyn Outage>) {
    let server = start_server(&cluster.url(), &[]).await;
    let (client, base) = (http(), server.base_url().to_owned());
    let shots = Arc::new(Mutex::new(Vec::<Shot>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..4 {
        let (client, base, shots, stop) =
            (client.clone(), base.clone(), shots.clone(), stop.clone());
        workers.spawn(async move {
            for i in 0..5_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let s = shoot(&client, &base, &format!("w{w}-{i}")).await;
                shots.lock().unwrap().push(s);
                // Pacing, not synchronisation: a steady trickle of writes.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }
    let snapshot = || shots.lock().unwrap().clone();
    let wait_for = |what: &'static str, pred: Pred| async move {
        let deadline = Instant::now() + GUARD;
        loop {
            if pred(&snapshot()) {
                return;
            }
            assert!(Instant::now() < deadline, "never saw {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    wait_for(
        "20 successes before the outage",
        Box::new(|s| s.iter().filter(|s| s.status == Some(201)).count() >= 20),
    )
    .await;

    let stopped_at = Instant::now();
    {
        let c = cluster.clone();
        tokio::task::spawn_blocking(move || c.stop_immediate())
            .await
            .unwrap();
    }
    wait_for(
        "eight 503s after the stop",
        Box::new(move |s| {
            s.iter()
                .filter(|s| s.sent >= stopped_at && s.status == Some(503))
                .count()
                >= 8
        }),
    )
    .await;
    // Readiness follows the store; liveness does not.
    wait_status(&client, &format!("{base}/readyz"), 503).await;
    assert_eq!(
        status_of(&client, &format!("{base}/healthz")).await,
        Some(200)
    );

    let started_at = Instant::now();
    {
        let c = cluster.clone();
        tokio::task::spawn_blocking(move || c.start_again())
            .await
            .unwrap();
    }
    let up_at = Instant::now();
    wait_for(
        "a success after the store returned",
        Box::new(move |s| {
            s.iter()
                .any(|s| s.status == Some(201) && s.answered_at() > up_at)
        }),
    )
    .await;
    wait_status(&client, &format!("{base}/readyz"), 200).await;
    stop.store(true, Ordering::SeqCst);
    while let Some(r) = workers.join_next().await {
        r.unwrap();
    }
    let shots = snapshot();

    // Every answer came, and fast; in the outage each was a 201 (committed
    // before the stop) or a fail-fast 503.
    for s in &shots {
        assert!(s.status.is_some(), "no answer: {s:?}");
        assert!(s.took < ANSWER_BOUND, "held too long: {s:?}");
        if s.sent >= stopped_at && s.answered_at() <= started_at {
            assert!(
                s.status == Some(201) || s.is_fail_fast_503(),
                "during the outage: {s:?}"
            );
        }
    }
    let first_503 = shots
        .iter()
        .filter(|s| s.sent >= stopped_at && s.status == Some(503))
        .map(|s| s.answered_at() - stopped_at)
        .min()
        .unwrap();
    let slowest_503 = shots
        .iter()
        .filter(|s| s.status == Some(503))
        .map(|s| s.took)
        .max()
        .unwrap();
    let first_success = shots
        .iter()
        .filter(|s| s.status == Some(201) && s.answered_at() > up_at)
        .map(|s| s.answered_at() - up_at)
        .min()
        .unwrap();
    assert!(
        first_success < STORE_TIMEOUT + MARGIN,
        "first success {first_success:?} after the store returned"
    );
    eprintln!(
        "{} outage: {} requests, {} answered 503; first 503 {first_503:?} after the stop, \
         slowest 503 took {slowest_503:?}; the restart took {:?}; first success {first_success:?} \
         after the store accepted connections",
        cluster.name(),
        shots.len(),
        shots.iter().filter(|s| s.status == Some(503)).count(),
        up_at - started_at,
    );
    settle_and_count(&client, &base, &shots).await;
    drop(server);
}
