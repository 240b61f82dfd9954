//! `/readyz` tells the truth about writes: with the real fault, a full
//! filesystem under the SQLite store, and PostgreSQL switched read-only,
//! readiness answers 503 while writes fail (reads still work, so a plain
//! `SELECT 1` would have said "ready"), and 200 again once writes succeed,
//! without a restart. Liveness (`/healthz`) stays 200 throughout.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::time::Duration;

use idem_test_support::{ChildServer, PgCluster, Tmpfs};
use sqlx::Connection;
use tokio::time::Instant;

/// Longest any poll of these tests may take before the test fails.
const GUARD: Duration = Duration::from_secs(30);

const TRANSFER: &str = r#"{"from":"acc_alice_main","to":"acc_alice_savings","amount":1}"#;

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap()
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
        let got = status_of(client, url).await;
        if got == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{url} never answered {want} (last {got:?})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn transfer(client: &reqwest::Client, base: &str, key: &str) -> u16 {
    client
        .post(format!("{base}/v1/transfers"))
        .header("authorization", "Bearer demo-alice")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(TRANSFER)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn read_works(client: &reqwest::Client, base: &str) -> bool {
    client
        .get(format!("{base}/v1/accounts/acc_alice_main"))
        .header("authorization", "Bearer demo-alice")
        .send()
        .await
        .is_ok_and(|r| r.status().as_u16() == 200)
}

async fn start(fs: &Tmpfs) -> ChildServer {
    let url = format!("sqlite://{}", fs.join("idem.db").display());
    let server = ChildServer::command(env!("CARGO_BIN_EXE_idem-server"))
        .args(["--listen", "127.0.0.1:0", "--database-url", &url])
        .env("RUST_LOG", "error")
        .start()
        .await
        .expect("start idem-server");
    wait_status(&http(), &format!("{}/readyz", server.base_url()), 200).await;
    server
}

// clause: idem.store.fail-closed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_is_503_while_the_disk_is_full_and_200_once_space_is_freed() {
    let Some(fs) = Tmpfs::mount("3m", "readiness_full_disk") else {
        return;
    };
    let server = start(&fs).await;
    let (client, base) = (http(), server.base_url().to_owned());
    let ready = format!("{base}/readyz");
    assert_eq!(transfer(&client, &base, "before").await, 201);
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
    assert_eq!(transfer(&client, &base, "full-1").await, 503, "writes fail");
    wait_status(&client, &ready, 503).await;
    assert!(read_works(&client, &base).await, "reads still work");
    assert_eq!(
        status_of(&client, &format!("{base}/healthz")).await,
        Some(200)
    );
    std::fs::remove_file(&filler).unwrap();
    wait_status(&client, &ready, 200).await;
    assert_eq!(
        transfer(&client, &base, "after-1").await,
        201,
        "writes work"
    );
    drop(server);
}

// clause: idem.store.fail-closed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_is_503_while_postgres_is_read_only_and_200_once_writable() {
    // A PostgreSQL of the test's own, switched read-only the way an
    // operator (or a failover to a standby) does it: every transaction is
    // read-only from the reload on, on every open connection.
    let Some(cluster) = tokio::task::spawn_blocking(|| PgCluster::start("readiness_read_only"))
        .await
        .unwrap()
    else {
        return;
    };
    let server = ChildServer::command(env!("CARGO_BIN_EXE_idem-server"))
        .args(["--listen", "127.0.0.1:0", "--database-url", &cluster.url()])
        .env("RUST_LOG", "error")
        .start()
        .await
        .expect("start idem-server");
    let (client, base) = (http(), server.base_url().to_owned());
    let ready = format!("{base}/readyz");
    wait_status(&client, &ready, 200).await;

    assert_eq!(transfer(&client, &base, "before").await, 201);
    let mut admin = sqlx::PgConnection::connect(&cluster.url()).await.unwrap();
    let set_read_only = async |admin: &mut sqlx::PgConnection, on: bool| {
        let value = if on { "on" } else { "off" };
        sqlx::query(&format!(
            "ALTER SYSTEM SET default_transaction_read_only = {value}"
        ))
        .execute(&mut *admin)
        .await
        .unwrap();
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&mut *admin)
            .await
            .unwrap();
    };
    set_read_only(&mut admin, true).await;
    wait_status(&client, &ready, 503).await;
    assert_eq!(transfer(&client, &base, "ro-1").await, 503, "writes fail");
    assert!(read_works(&client, &base).await, "reads still work");
    set_read_only(&mut admin, false).await;
    wait_status(&client, &ready, 200).await;
    assert_eq!(
        transfer(&client, &base, "after-1").await,
        201,
        "writes work"
    );
    drop(server);
}
