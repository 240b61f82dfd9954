//! The example's promise: two processes of the app on one database behave
//! as one. A duplicate sent to the second while the first runs the request
//! gets `409 idempotency_key_in_use`; once the first has answered, the
//! duplicate gets the replay; the database holds one order.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use idem_test_support::{Backend, ChildServer, TestDb};
use sqlx::Connection;

async fn start(url: &str) -> ChildServer {
    ChildServer::command(env!("CARGO_BIN_EXE_example-two-processes-postgres"))
        .env("DATABASE_URL", url)
        .capture_stderr()
        .start()
        .await
        .unwrap()
}

async fn post(
    client: &reqwest::Client,
    server: &ChildServer,
    key: &str,
) -> (u16, Option<String>, serde_json::Value) {
    let resp = client
        .post(format!("{}/orders", server.base_url()))
        .header("x-user", "ann")
        .header("idempotency-key", key)
        .json(&serde_json::json!({ "item": "book" }))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let replayed = resp
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, replayed, resp.json().await.unwrap())
}

// clause: idem.inflight.conflict, idem.concurrency.single-effect, idem.replay.marker
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_sent_to_the_second_process_while_the_first_runs_is_in_flight() {
    let Some(db) = TestDb::new(Backend::Postgres, "two-processes").await else {
        return; // skipped, loudly, by TestDb
    };
    let first = start(&db.url).await;
    let second = start(&db.url).await;
    let client = reqwest::Client::new();

    // Keep the first request in flight without touching the app: the test
    // holds a lock on `orders`, so the handler's INSERT waits for it (inside
    // its transaction, holding the key) until the test lets go.
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let mut gate = holder.begin().await.unwrap();
    sqlx::query("LOCK TABLE orders IN EXCLUSIVE MODE")
        .execute(&mut *gate)
        .await
        .unwrap();
    let original = {
        let client = client.clone();
        let base = first.base_url().to_owned();
        tokio::spawn(async move {
            let resp = client
                .post(format!("{base}/orders"))
                .header("x-user", "ann")
                .header("idempotency-key", "order-1")
                .json(&serde_json::json!({ "item": "book" }))
                .timeout(Duration::from_secs(20))
                .send()
                .await
                .unwrap();
            (
                resp.status().as_u16(),
                resp.json::<serde_json::Value>().await.unwrap(),
            )
        })
    };
    // Until the first process's INSERT is waiting on the test's lock (bounded).
    let mut watcher = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(4);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks WHERE relation = 'orders'::regclass AND NOT granted",
        )
        .fetch_one(&mut watcher)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first request never reached its write"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (status, replayed, problem) = post(&client, &second, "order-1").await;
    assert_eq!(
        (status, replayed, problem["code"].as_str()),
        (409, None, Some("idempotency_key_in_use")),
        "the second process sees the first's request in flight: {problem}"
    );

    gate.commit().await.unwrap();
    let (status, order) = original.await.unwrap();
    assert_eq!(status, 201, "{order}");
    let (status, replayed, again) = post(&client, &second, "order-1").await;
    assert_eq!(
        (status, replayed.as_deref(), &again),
        (201, Some("true"), &order),
        "the second process replays the first's answer"
    );
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&mut watcher)
        .await
        .unwrap();
    assert_eq!(orders, 1, "one effect");
    drop((first, second));
}
