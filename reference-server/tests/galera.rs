//! The MySQL store on a multi-primary cluster: a three-node Galera cluster
//! of the test's own, two `idem-server` processes on two different nodes,
//! and the same keys sent through both at once.
//!
//! Row locks are local to a Galera node, so both nodes can claim one key
//! and run the transfer; certification at commit lets one through and
//! fails the other (error 1213), which the store turns into a replay of
//! the winner. What must hold, whatever the interleaving: one effect per
//! key, every answer the contract's (a first execution, a byte-identical
//! replay, or a retryable refusal), never a 500, and the same balances
//! seen through every node. The counts (executions, replays, refusals,
//! certification failures) are printed; the book's "When you outgrow one
//! database" quotes them.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_test_support::{ChildServer, Galera};

/// Starts `idem-server` on `db_url` and waits until `/healthz` answers.
async fn start(db_url: &str) -> ChildServer {
    let server = ChildServer::command(env!("CARGO_BIN_EXE_idem-server"))
        .args(["--listen", "127.0.0.1:0", "--database-url", db_url])
        // INFO: the engine's lines on lost races are counted below.
        .env("RUST_LOG", "info,sqlx=warn")
        .capture_stderr()
        .start()
        .await
        .expect("start idem-server");
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = client
            .get(format!("{}/healthz", server.base_url()))
            .send()
            .await
            && r.status() == 200
        {
            return server;
        }
        assert!(
            Instant::now() < deadline,
            "{} never became ready: {}",
            server.base_url(),
            server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One answer, reduced to what the checks need.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    replayed: bool,
    code: Option<String>,
    retry_after: bool,
    body: Vec<u8>,
}

async fn transfer(client: &reqwest::Client, base: &str, key: &str, amount: i64) -> Answer {
    let r = client
        .post(format!("{base}/v1/transfers"))
        .header("authorization", "Bearer demo-alice")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"from":"acc_alice_main","to":"acc_alice_savings","amount":{amount}}}"#
        ))
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    let replayed = r
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let retry_after = r.headers().contains_key("retry-after");
    let body = r.bytes().await.unwrap().to_vec();
    let code = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["code"].as_str().map(str::to_owned));
    Answer {
        status,
        replayed,
        code,
        retry_after,
        body,
    }
}

/// What a round's answers came to.
#[derive(Debug, Default)]
struct Tally {
    executed: usize,
    replayed: usize,
    in_use: usize,
    unavailable: usize,
    /// The problem codes of the 503s.
    unavailable_codes: BTreeMap<String, usize>,
}

impl Tally {
    /// Checks one answer is one the contract allows and counts it.
    fn add(&mut self, a: &Answer) {
        match (a.status, a.replayed) {
            (201, false) => self.executed += 1,
            (201, true) => self.replayed += 1,
            (409, false) => {
                assert_eq!(
                    a.code.as_deref(),
                    Some("idempotency_key_in_use"),
                    "a 409 is the in-flight refusal: {a:?}"
                );
                assert!(a.retry_after, "a refusal says when to retry: {a:?}");
                self.in_use += 1;
            }
            (503, false) => {
                assert!(a.retry_after, "a 503 says when to retry: {a:?}");
                self.unavailable += 1;
                *self
                    .unavailable_codes
                    .entry(a.code.clone().unwrap_or_default())
                    .or_default() += 1;
            }
            _ => panic!(
                "not an answer the contract allows here: {a:?} ({})",
                String::from_utf8_lossy(&a.body)
            ),
        }
    }
}

/// Retries `key` through each base in turn until it is answered 201 (at
/// most 40 attempts, 50 ms apart: what a client does with a retryable
/// refusal), and returns every answer seen.
async fn settle(client: &reqwest::Client, bases: &[String], key: &str, amount: i64) -> Vec<Answer> {
    let mut seen = Vec::new();
    for attempt in 0..40 {
        let a = transfer(client, &bases[attempt % bases.len()], key, amount).await;
        let done = a.status == 201;
        seen.push(a);
        if done {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{key} was never answered 201 in 40 attempts: {seen:?}");
}

/// (main, savings) of demo-alice and her transfer count, read through `base`.
async fn state(client: &reqwest::Client, base: &str) -> (i64, i64, u64) {
    let get = |path: &str| {
        client
            .get(format!("{base}{path}"))
            .header("authorization", "Bearer demo-alice")
            .send()
    };
    let accounts: serde_json::Value = get("/v1/accounts").await.unwrap().json().await.unwrap();
    let balance = |id: &str| {
        accounts["accounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["id"] == id)
            .unwrap()["balance"]
            .as_i64()
            .unwrap()
    };
    let transfers: serde_json::Value = get("/v1/transfers").await.unwrap().json().await.unwrap();
    (
        balance("acc_alice_main"),
        balance("acc_alice_savings"),
        transfers["count"].as_u64().unwrap(),
    )
}

/// The certification conflicts the cluster has counted so far: commits
/// refused by certification, and local transactions aborted by an applied
/// write set (both how two nodes' claims of one key meet).
fn conflicts(cluster: &Galera) -> u64 {
    cluster.status_sum("wsrep_local_cert_failures") + cluster.status_sum("wsrep_local_bf_aborts")
}

/// Sends every `(key, amount)` `copies` times at once, spread round-robin
/// over `bases`, then settles each key; checks each key executed exactly
/// once with byte-identical replays. Returns the first volley's tally.
async fn volley(
    client: &reqwest::Client,
    bases: &[String],
    keys: &[(String, i64)],
    copies: usize,
) -> Tally {
    let n = keys.len() * copies;
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let mut set = tokio::task::JoinSet::new();
    for (i, (key, amount)) in keys
        .iter()
        .flat_map(|k| std::iter::repeat_n(k, copies))
        .enumerate()
    {
        let (client, barrier) = (client.clone(), barrier.clone());
        let (base, key, amount) = (bases[i % bases.len()].clone(), key.clone(), *amount);
        set.spawn(async move {
            barrier.wait().await;
            (key.clone(), transfer(&client, &base, &key, amount).await)
        });
    }
    let mut tally = Tally::default();
    let mut by_key: BTreeMap<String, Vec<Answer>> = BTreeMap::new();
    while let Some(joined) = set.join_next().await {
        let (key, a) = joined.unwrap();
        tally.add(&a);
        by_key.entry(key).or_default().push(a);
    }
    for (key, amount) in keys {
        let answers = by_key.entry(key.clone()).or_default();
        answers.extend(settle(client, bases, key, *amount).await);
        for a in answers.iter() {
            Tally::default().add(a);
        }
        let firsts: Vec<&Answer> = answers
            .iter()
            .filter(|a| a.status == 201 && !a.replayed)
            .collect();
        assert_eq!(firsts.len(), 1, "{key}: exactly one execution: {answers:?}");
        for a in answers.iter().filter(|a| a.status == 201) {
            assert_eq!(a.body, firsts[0].body, "{key}: replays are byte-identical");
        }
    }
    tally
}

async fn two_servers(cluster: &Galera) -> (ChildServer, ChildServer) {
    // One after the other: the second finds the schema migrated.
    let a = start(&cluster.url(0)).await;
    let b = start(&cluster.url(1)).await;
    (a, b)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(128)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

// clause: idem.concurrency.single-effect, idem.claim.atomic
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_keys_through_two_galera_nodes_at_once_execute_once_each() {
    let Some(cluster) = tokio::task::spawn_blocking(|| Galera::start("galera_same_keys", 3))
        .await
        .unwrap()
    else {
        return;
    };
    let (a, b) = two_servers(&cluster).await;
    let bases = [a.base_url().to_owned(), b.base_url().to_owned()];
    let client = client();
    let before = conflicts(&cluster);
    let (mut keys_sent, mut total) = (0u64, 0i64);
    // Rounds until the cluster has seen its nodes' claims of one key meet
    // (at least one certification conflict), at most 5: a run that never
    // made two nodes race would prove nothing.
    let mut rounds = 0;
    while rounds < 5 {
        rounds += 1;
        let keys: Vec<(String, i64)> = (1..=24)
            .map(|i| (format!("galera-r{rounds}-k{i}"), i64::from(i)))
            .collect();
        let started = Instant::now();
        let tally = volley(&client, &bases, &keys, 4).await;
        keys_sent += keys.len() as u64;
        total += keys.iter().map(|(_, amount)| amount).sum::<i64>();
        let seen = conflicts(&cluster) - before;
        eprintln!(
            "round {rounds}: 24 keys x 4 copies over 2 nodes in {:?}: {tally:?}; \
             certification conflicts so far {seen}",
            started.elapsed()
        );
        if seen > 0 {
            break;
        }
    }
    assert!(
        conflicts(&cluster) > before,
        "no two nodes ever raced for one key in {rounds} rounds: the test proved nothing"
    );
    // One effect per key, seen the same through both nodes.
    for base in &bases {
        assert_eq!(
            state(&client, base).await,
            (100_000 - total, 100_000 + total, keys_sent),
            "balances and transfer count through {base}"
        );
    }
    // How the endpoint failures (a transfer's statement aborted by another
    // node's write set) were answered: from this key's winner on the other
    // node, or, when the conflict was with another key's transfer on the
    // same account rows, with the retryable 503.
    let count = |needle: &str| -> usize {
        [&a, &b]
            .iter()
            .map(|s| s.stderr().matches(needle).count())
            .sum()
    };
    eprintln!(
        "endpoint failures answered from a peer's winner: {}; answered 503, no winner: {}",
        count("answering from the winner"),
        count("server error: not stored; key released")
    );
    for server in [&a, &b] {
        assert!(!server.stderr().contains("panicked"), "{}", server.stderr());
    }
}

// clause: idem.concurrency.single-effect
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_keys_on_one_account_through_two_galera_nodes_lose_no_update() {
    let Some(cluster) = tokio::task::spawn_blocking(|| Galera::start("galera_one_account", 3))
        .await
        .unwrap()
    else {
        return;
    };
    let (a, b) = two_servers(&cluster).await;
    let bases = [a.base_url().to_owned(), b.base_url().to_owned()];
    let client = client();
    let before = conflicts(&cluster);
    // Every transfer moves money between the same two rows: through two
    // nodes, commits conflict on the account rows, not on a key.
    let keys: Vec<(String, i64)> = (1..=48)
        .map(|i| (format!("galera-acct-k{i}"), i64::from(i)))
        .collect();
    let started = Instant::now();
    let tally = volley(&client, &bases, &keys, 1).await;
    // No two requests share a key, so none may be refused as "in use": a
    // commit lost to another key's transaction is the store's retryable 503.
    assert_eq!(tally.in_use, 0, "{tally:?}");
    let total: i64 = keys.iter().map(|(_, amount)| amount).sum();
    eprintln!(
        "48 keys on one account over 2 nodes in {:?}: {tally:?}; certification conflicts {}",
        started.elapsed(),
        conflicts(&cluster) - before
    );
    for base in &bases {
        assert_eq!(
            state(&client, base).await,
            (100_000 - total, 100_000 + total, 48),
            "balances and transfer count through {base}"
        );
    }
}
