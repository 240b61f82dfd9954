//! The store-outage page fires for every fault it is named for, on every
//! store: six idem-server processes, each on a store that then fails for
//! real (SQLite locked by another process, SQLite on a full disk, a
//! PostgreSQL cluster stopped, a PostgreSQL cluster made read-only, a
//! MariaDB server killed, a MariaDB server made read-only), are
//! scraped by a real Prometheus (Debian's `prometheus`) that evaluates the
//! shipped rules, `ops/prometheus/idem-alerts.yml`, every second. For each
//! fault, traffic runs until Prometheus reports `IdemStoreUnavailable`
//! pending for that server's instance (none is before the faults); every
//! answer meanwhile is a `503 upstream_unavailable` counted
//! `store_unavailable`, never
//! `server_error_released`. Then the fault is removed and the same process
//! answers `201` again, without a restart. And `IdemReaperFailing` fires
//! for two more servers whose reaper passes (every second) all fail, one on
//! a locked SQLite store, one on a stopped PostgreSQL cluster, and resolves
//! once the fault is removed.
//!
//! The rule's `for: 5m` is not waited out: pending is the state the rule's
//! expression being true puts an alert in, and firing follows from it by
//! time alone. Every wait is a poll with a deadline. Times are printed
//! (`--nocapture`).
#![allow(clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use idem_test_support::{ChildServer, MariaDb, PgCluster, TempDir, Tmpfs};
use sqlx::Connection;
use tokio::time::Instant;

/// Longest any one poll (or one fault's drive to pending) may take.
const GUARD: Duration = Duration::from_secs(45);

const ALERT: &str = "IdemStoreUnavailable";

const REAPER_ALERT: &str = "IdemReaperFailing";

const TEST: &str = "every_store_fault_puts_the_store_outage_alert_pending";

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap()
}

/// A Prometheus of the test's own scraping `targets` and evaluating the
/// shipped alert rules, both every second; killed on drop.
struct Prometheus(idem_test_support::Prometheus);

impl Prometheus {
    async fn start(binary: &Path, targets: &[String]) -> Self {
        let rules = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../ops/prometheus/idem-alerts.yml")
            .canonicalize()
            .unwrap();
        let list = targets
            .iter()
            .map(|t| format!("'{t}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - '{}'\n\
             scrape_configs:\n  - job_name: idem\n    scrape_timeout: 900ms\n    \
             static_configs:\n      - targets: [{list}]\n",
            rules.display()
        );
        let p = Self(idem_test_support::Prometheus::start(binary, &config, GUARD).await);
        // The shipped rules loaded: every alert of the file is known.
        let v = p.0.get("/api/v1/rules").await;
        let names: Vec<String> = v["data"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().iter())
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect();
        assert!(names.iter().any(|n| n == ALERT), "rules loaded: {names:?}");
        p
    }

    /// The state (`pending`, `firing`) of `alert` for `instance`, if active.
    async fn alert_state(&self, alert: &str, instance: &str) -> Option<String> {
        let v = self.0.get("/api/v1/alerts").await;
        v["data"]["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["labels"]["alertname"] == alert && a["labels"]["instance"] == instance)
            .map(|a| a["state"].as_str().unwrap().to_owned())
    }

    /// The sum of `query` (0 when it has no series).
    async fn sum(&self, query: &str) -> f64 {
        self.0.query(query).await.iter().map(|(_, v)| v).sum()
    }

    /// Polls until every target has been scraped up.
    async fn wait_up(&self, n: usize) {
        let deadline = Instant::now() + GUARD;
        loop {
            if self.sum("up{job=\"idem\"}").await >= n as f64 {
                return;
            }
            assert!(Instant::now() < deadline, "targets never up");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// One `POST /v1/transfers`: (status, problem code).
async fn transfer(client: &reqwest::Client, base: &str, key: &str) -> (Option<u16>, String) {
    let r = support::alice_transfer(client, base, key).send().await;
    match r {
        Ok(r) => {
            let status = r.status().as_u16();
            let v: serde_json::Value = r.json().await.unwrap_or(serde_json::Value::Null);
            (Some(status), v["code"].as_str().unwrap_or("").to_owned())
        }
        Err(_) => (None, String::new()),
    }
}

async fn start_server(db_url: &str, extra: &[&str]) -> ChildServer {
    let server = ChildServer::command(env!("CARGO_BIN_EXE_idem-server"))
        .args(["--listen", "127.0.0.1:0", "--database-url", db_url])
        .args(["--max-connections", "4", "--store-timeout-ms", "500"])
        .args(extra)
        .env("RUST_LOG", "error")
        .start()
        .await
        .expect("start idem-server");
    let client = http();
    for i in 0..3 {
        let (s, _) = transfer(&client, server.base_url(), &format!("before-{i}")).await;
        assert_eq!(s, Some(201), "a write before the fault");
    }
    server
}

/// Polls `server`'s own `/metrics` until at least `n` reaper passes failed.
async fn wait_failed_passes(server: &ChildServer, n: f64) {
    let client = http();
    let deadline = Instant::now() + GUARD;
    loop {
        let text = client
            .get(format!("{}/metrics", server.base_url()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let failed = text
            .lines()
            .find(|l| l.starts_with("idem_reaper_passes_total{result=\"error\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        if failed >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the reaper's passes never failed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What one fault's run measured.
#[derive(Debug)]
struct Run {
    name: &'static str,
    to_pending: Duration,
    refused: usize,
    to_recovered: Duration,
}

/// Drives traffic at `server` (whose store `fault` has just broken) until
/// the alert is pending for its instance; every answer must be a 503
/// `upstream_unavailable`. Then `heal` removes the fault and the same
/// process must answer 201 again.
async fn drive(
    prom: &Prometheus,
    name: &'static str,
    server: &ChildServer,
    heal: impl std::future::Future<Output = ()>,
) -> Run {
    let (client, base) = (http(), server.base_url().to_owned());
    let instance = server.addr().to_string();
    let faulted = Instant::now();
    let mut refused = 0;
    let mut i = 0u32;
    let state = loop {
        i += 1;
        let (status, code) = transfer(&client, &base, &format!("{name}-fault-{i}")).await;
        assert_eq!(
            (status, code.as_str()),
            (Some(503), "upstream_unavailable"),
            "{name}: a write while the store is broken"
        );
        refused += 1;
        if let Some(s) = prom.alert_state(ALERT, &instance).await {
            break s;
        }
        assert!(
            faulted.elapsed() < GUARD,
            "{name}: {ALERT} never went pending after {refused} refused writes"
        );
    };
    let to_pending = faulted.elapsed();
    assert!(state == "pending" || state == "firing", "{name}: {state}");
    // Counted as the store's unavailability, not as a server error.
    let of = |outcome: &str| {
        format!("idem_requests_total{{instance=\"{instance}\",outcome=\"{outcome}\"}}")
    };
    // At least the refusal that made the ratio cross: the series is
    // exported at zero from start-up, so the first one already counts.
    assert!(prom.sum(&of("store_unavailable")).await >= 1.0, "{name}");
    assert_eq!(
        prom.sum(&of("server_error_released")).await,
        0.0,
        "{name}: store faults counted as server errors"
    );
    heal.await;
    let healed = Instant::now();
    loop {
        let (s, _) = transfer(&client, &base, &format!("{name}-after")).await;
        if s == Some(201) {
            break;
        }
        assert!(
            healed.elapsed() < GUARD,
            "{name}: never answered 201 after the fault was removed: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let to_recovered = healed.elapsed();
    for j in 0..3 {
        let (s, _) = transfer(&client, &base, &format!("{name}-after-{j}")).await;
        assert_eq!(s, Some(201), "{name}: write {j} after recovery");
    }
    Run {
        name,
        to_pending,
        refused,
        to_recovered,
    }
}

async fn pg_admin(cluster: &PgCluster) -> sqlx::PgConnection {
    let mut c = sqlx::PgConnection::connect(&cluster.url()).await.unwrap();
    // This session stays writable whatever the cluster's default becomes.
    sqlx::query("SET default_transaction_read_only = off")
        .execute(&mut c)
        .await
        .unwrap();
    c
}

async fn set_read_only(admin: &mut sqlx::PgConnection, on: bool) {
    let set = if on {
        "ALTER SYSTEM SET default_transaction_read_only = on"
    } else {
        "ALTER SYSTEM RESET default_transaction_read_only"
    };
    sqlx::query(set).execute(&mut *admin).await.unwrap();
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&mut *admin)
        .await
        .unwrap();
}

// clause: idem.store.fail-closed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_fault_puts_the_store_outage_alert_pending() {
    let Some(binary) = idem_test_support::Prometheus::binary(TEST) else {
        return;
    };
    let Some(fs) = Tmpfs::mount("3m", TEST) else {
        return;
    };
    let Some(pg_stopped) = PgCluster::start(TEST) else {
        return;
    };
    let pg_read_only = PgCluster::start(TEST).unwrap();
    let pg_reaper = PgCluster::start(TEST).unwrap();
    let Some(my_stopped) = MariaDb::start(TEST) else {
        return;
    };
    let my_read_only = MariaDb::start(TEST).unwrap();
    let started = Instant::now();
    let dir = TempDir::new("idem-alerts");
    let locked_url = format!("sqlite://{}", dir.join("idem.db").display());
    let full_url = format!("sqlite://{}", fs.join("idem.db").display());
    let locked = start_server(&locked_url, &[]).await;
    let full = start_server(&full_url, &[]).await;
    let stopped = start_server(&pg_stopped.url(), &[]).await;
    let read_only = start_server(&pg_read_only.url(), &[]).await;
    let my_killed = start_server(&my_stopped.url(), &[]).await;
    let my_ro = start_server(&my_read_only.url(), &[]).await;
    // (e) The reaper's passes on a locked SQLite store, every second. The
    // lock is taken before Prometheus first scrapes this server, so the
    // Prometheus sees only failing passes: what one that has watched 30
    // minutes of the fault sees in the rule's window.
    let reaper_url = format!("sqlite://{}", dir.join("reaper.db").display());
    let reaper = start_server(&reaper_url, &["--reaper-interval-secs", "1"]).await;
    let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&reaper_url).unwrap();
    let mut reaper_lock = sqlx::SqliteConnection::connect_with(&opts).await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut reaper_lock)
        .await
        .unwrap();
    wait_failed_passes(&reaper, 2.0).await;
    // (h) The reaper's passes on a stopped PostgreSQL cluster, stopped
    // likewise before the first scrape.
    let pg_reaper_server = start_server(&pg_reaper.url(), &["--reaper-interval-secs", "1"]).await;
    pg_reaper.stop_immediate();
    wait_failed_passes(&pg_reaper_server, 2.0).await;
    let servers = [
        &locked,
        &full,
        &stopped,
        &read_only,
        &my_killed,
        &my_ro,
        &reaper,
        &pg_reaper_server,
    ];
    let targets: Vec<String> = servers.iter().map(|s| s.addr().to_string()).collect();
    let prom = Prometheus::start(&binary, &targets).await;
    prom.wait_up(targets.len()).await;
    for t in &targets {
        assert_eq!(
            prom.alert_state(ALERT, t).await,
            None,
            "{t} before any fault"
        );
    }

    // (a) SQLite locked: this test process is another process to the
    // server; it takes the database's write lock and holds it.
    let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&locked_url).unwrap();
    let mut holder = sqlx::SqliteConnection::connect_with(&opts).await.unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut holder)
        .await
        .unwrap();
    let a = drive(&prom, "sqlite-locked", &locked, async {
        sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();
    });

    // (b) SQLite on a full disk: the tmpfs filled for real.
    let filler = fs.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 16 * 1024];
        let full = (0..1024).any(|_| f.write_all(&chunk).and_then(|()| f.flush()).is_err());
        assert!(full, "the tmpfs never filled up");
    }
    let b = drive(&prom, "sqlite-disk-full", &full, async {
        std::fs::remove_file(&filler).unwrap();
    });

    // (c) PostgreSQL stopped like a crash.
    pg_stopped.stop_immediate();
    let c = drive(&prom, "postgres-stopped", &stopped, async {
        pg_stopped.start_again();
    });

    // (d) PostgreSQL read-only (what a standby, or an operator fencing a
    // primary, makes it): every session's transactions refuse writes.
    let mut admin = pg_admin(&pg_read_only).await;
    set_read_only(&mut admin, true).await;
    let mut admin2 = pg_admin(&pg_read_only).await;
    let d = drive(&prom, "postgres-read-only", &read_only, async move {
        set_read_only(&mut admin2, false).await;
    });

    // (f) MariaDB killed like a crash (SIGKILL): every connection is cut.
    my_stopped.stop_immediate();
    let f = drive(&prom, "mariadb-killed", &my_killed, async {
        my_stopped.start_again();
    });

    // (g) MariaDB read-only: the application's user has no SUPER, so
    // `read_only` refuses its writes.
    my_read_only.root_sql("SET GLOBAL read_only = 1");
    let g = drive(&prom, "mariadb-read-only", &my_ro, async {
        my_read_only.root_sql("SET GLOBAL read_only = 0");
    });

    let e = reaper_fails_then_resolves(&prom, "sqlite-locked", &reaper, async {
        sqlx::query("ROLLBACK")
            .execute(&mut reaper_lock)
            .await
            .unwrap();
    });
    let h = reaper_fails_then_resolves(&prom, "postgres-stopped", &pg_reaper_server, async {
        pg_reaper.start_again();
    });
    let runs = {
        let (a, b, c, d, f, g, (), ()) = tokio::join!(a, b, c, d, f, g, e, h);
        [a, b, c, d, f, g]
    };
    for r in &runs {
        eprintln!(
            "{}: {ALERT} pending after {:?} ({} refused writes); 201 again {:?} after the fault was removed",
            r.name, r.to_pending, r.refused, r.to_recovered
        );
    }
    eprintln!("total {:?}", started.elapsed());
    drop(admin);
    drop(prom);
}

/// Waits until Prometheus fires [`REAPER_ALERT`] for `server` (whose
/// reaper's passes have failed since before the first scrape), then runs
/// `heal` and waits until the alert resolves: the next pass succeeds in
/// the same process.
async fn reaper_fails_then_resolves(
    prom: &Prometheus,
    name: &str,
    server: &ChildServer,
    heal: impl std::future::Future<Output = ()>,
) {
    {
        let instance = server.addr().to_string();
        let failing = Instant::now();
        let state = loop {
            if let Some(s) = prom.alert_state(REAPER_ALERT, &instance).await {
                break s;
            }
            assert!(
                failing.elapsed() < GUARD,
                "{name}: {REAPER_ALERT} never fired"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        // No `for`: the rule fires as soon as its expression holds.
        assert_eq!(state, "firing", "{name}");
        let to_firing = failing.elapsed();
        heal.await;
        // The next pass succeeds and the alert resolves, same process.
        let healed = Instant::now();
        while prom.alert_state(REAPER_ALERT, &instance).await.is_some() {
            assert!(
                healed.elapsed() < GUARD,
                "{name}: {REAPER_ALERT} never resolved"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        eprintln!(
            "{name} reaper: {REAPER_ALERT} firing {to_firing:?} into the drive; \
             resolved {:?} after the fault was removed",
            healed.elapsed()
        );
    }
}
