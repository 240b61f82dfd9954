//! Issue 22: default `idem-client` clients recover from a server crash within their deadline.
//!
//! N clients, each built with the one-line default setup (`RetryMiddleware::default()`, a key
//! minted per payment), POST `/v1/payments` while the processor is slow. 0.5 s into their
//! processor calls the server is killed with SIGKILL, and a supervisor restarts it on the same
//! port and database after a gap (0.2 s, then 2 s). The clients' own attempts were in flight:
//! nobody starts a fresh client after the restart. At least 95 % of them must get their 201,
//! each payment charged once at the processor.
//!
//! Where each part lives: the client does not spend its attempt cap on refused connections
//! (the restart) nor on `409 idempotency_key_in_use` (the dead holder's lease), paying its
//! budget instead, within its 30 s deadline (`idem_client::policy`); the server answers that
//! 409 with a `Retry-After` at which the client's retry can take the key over itself.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use idem_client::{RetryMiddleware, RetryReport};
use idem_fake_processor::{ControlMode, ControlRequest, spawn_in_process};
use idem_test_support::{ChildServer, TempDir};
use tokio::time::Instant;

/// Clients per case.
const CLIENTS: usize = 20;

/// Longest any poll of these tests may take before the test fails.
const GUARD: Duration = Duration::from_secs(60);

/// What one client ended with: the status (or the error), its report, its source.
#[derive(Debug)]
struct Ended {
    source: String,
    status: Result<u16, String>,
    report: Option<RetryReport>,
}

async fn crash_and_restart(gap: Duration, label: &str) {
    let dir = TempDir::new(&format!("idem-client-crash-{label}"));
    let processor = spawn_in_process(dir.join("processor.db")).await.unwrap();
    let db_url = format!("sqlite://{}", dir.join("idem.db").display());
    // The server's defaults: lease, completer, Retry-After.
    let mut server = ChildServer::command(env!("CARGO_BIN_EXE_idem-server"))
        .args(["--listen", "127.0.0.1:0", "--database-url", &db_url])
        .args(["--processor-url", processor.base_url()])
        .env("RUST_LOG", "error")
        .start()
        .await
        .expect("start idem-server");
    // Every client's first processor call hangs far longer than the test.
    processor
        .client()
        .set_control(
            &ControlRequest::new(ControlMode::Slow)
                .slow_ms(20_000)
                .for_calls(CLIENTS as u64),
        )
        .await
        .unwrap();
    let url = format!("{}/v1/payments", server.base_url());
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let url = url.clone();
        let source = format!("tok_crash_{label}_{i}");
        clients.push(tokio::spawn(async move {
            // The one-line default setup.
            let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
                .with(RetryMiddleware::default())
                .build();
            let body = format!(r#"{{"amount":4200,"currency":"eur","source":"{source}"}}"#);
            let sent = client
                .post(url)
                .header("authorization", "Bearer demo-alice")
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await;
            match sent {
                Ok(resp) => Ended {
                    source,
                    status: Ok(resp.status().as_u16()),
                    report: resp.extensions().get::<RetryReport>().cloned(),
                },
                Err(e) => Ended {
                    source,
                    status: Err(format!("{e:#}")),
                    report: None,
                },
            }
        }));
    }
    // Every client's first attempt is inside its processor call.
    let deadline = Instant::now() + GUARD;
    while processor.client().charges().await.unwrap().total_calls() < CLIENTS as u64 {
        assert!(
            Instant::now() < deadline,
            "the processor was not called by every client"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // 0.5 s into the calls, the crash; the restart gap is the scenario, not a synchronisation.
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.kill().await.unwrap();
    let killed_at = Instant::now();
    tokio::time::sleep(gap).await;
    server.restart().await.expect("restart idem-server");
    let restarted_after = killed_at.elapsed();

    let mut ended = Vec::new();
    for c in clients {
        // Bounded: each client stops within its 30 s deadline (plus its last attempt's
        // bounded timeout).
        ended.push(
            tokio::time::timeout(GUARD, c)
                .await
                .expect("a client ends within its deadline")
                .unwrap(),
        );
    }
    let took = killed_at.elapsed();
    let ok: Vec<&Ended> = ended.iter().filter(|e| e.status == Ok(201)).collect();
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for e in &ended {
        let what = match (&e.status, &e.report) {
            (Ok(s), Some(r)) => format!(
                "{s} stopped={:?}",
                r.stopped.as_ref().map(|s| s.to_string())
            ),
            (Ok(s), None) => format!("{s}"),
            (Err(err), _) => format!("error: {err}"),
        };
        *outcomes.entry(what).or_default() += 1;
    }
    let attempts: Vec<u32> = ended
        .iter()
        .filter_map(|e| e.report.as_ref().map(|r| r.attempts))
        .collect();
    eprintln!(
        "gap {gap:?} (server answering {restarted_after:?} after the kill): {} of {CLIENTS} got 201 \
         in {took:?}; outcomes {outcomes:#?}; requests sent per client {attempts:?}",
        ok.len()
    );

    // Safety first, whatever the liveness: no source charged twice, and every 201 charged.
    let charges = processor.client().charges().await.unwrap();
    let mut per_source: BTreeMap<String, usize> = BTreeMap::new();
    for c in &charges.charges {
        *per_source
            .entry(c.source.clone().unwrap_or_default())
            .or_default() += 1;
    }
    for (source, n) in &per_source {
        assert_eq!(*n, 1, "{source} charged {n} times");
    }
    for e in &ok {
        assert_eq!(per_source.get(&e.source), Some(&1), "{} got 201", e.source);
    }
    // Liveness: at least 95 % of the default clients got their 201.
    assert!(
        ok.len() * 100 >= CLIENTS * 95,
        "{} of {CLIENTS} default clients got 201 after a kill -9 and a restart {gap:?} later: \
         {outcomes:#?}",
        ok.len()
    );
}

// clause: idem.lease.takeover, idem.client.max-attempts, idem.client.retry-after
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_clients_recover_from_a_kill_and_a_restart_200_ms_later() {
    crash_and_restart(Duration::from_millis(200), "200ms").await;
}

// clause: idem.lease.takeover, idem.client.max-attempts, idem.client.retry-after
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_clients_recover_from_a_kill_and_a_restart_2_s_later() {
    crash_and_restart(Duration::from_secs(2), "2s").await;
}
