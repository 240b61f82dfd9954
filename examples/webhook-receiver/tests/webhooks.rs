//! The receiver's promise: one invoice per event, however often and however
//! concurrently it is delivered; a delivery repeated within the replay
//! window gets the stored answer; an unsigned, mis-signed or stale
//! delivery never reaches the key table.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum_idempotency::SqliteStore;
use axum_idempotency::clock::{AdjustableClock, Clock};
use example_webhook_receiver::{Sender, app, delivery};
use tower::ServiceExt;

const SECRET: &[u8] = b"test-secret";
const EVENT: &str = r#"{"type":"order.paid","data":{"order":"ord_77","amount":1200}}"#;

struct Receiver {
    router: axum::Router,
    clock: Arc<AdjustableClock>,
    pool: sqlx::SqlitePool,
    path: PathBuf,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.path.display()));
        }
    }
}

async fn receiver(name: &str) -> Receiver {
    let path = std::env::temp_dir().join(format!("webhooks-{}-{name}.db", std::process::id()));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let store = SqliteStore::open(&path).await.unwrap();
    let pool = store.pool().clone();
    let clock = Arc::new(AdjustableClock::new());
    let sender = Sender {
        name: "billing".into(),
        secret: SECRET.to_vec(),
    };
    let router = app(store, clock.clone(), vec![sender]).await.unwrap();
    Receiver {
        router,
        clock,
        pool,
        path,
    }
}

impl Receiver {
    fn now_secs(&self) -> i64 {
        self.clock.now_ms() / 1000
    }

    async fn invoices(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM invoices")
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }
}

async fn send(router: &axum::Router, req: Request<Body>) -> (StatusCode, bool, Vec<u8>) {
    let r = router.clone().oneshot(req).await.unwrap();
    let replayed = r.headers().get("idempotent-replayed").is_some();
    let status = r.status();
    let body = axum::body::to_bytes(r.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, replayed, body.to_vec())
}

// clause: idem.concurrency.single-effect, idem.replay.verbatim, idem.window.replay
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_deliveries_make_one_invoice_and_a_redelivery_is_replayed() {
    let r = receiver("concurrent").await;
    let now = r.now_secs();
    let (a, b) = tokio::join!(
        send(&r.router, delivery(SECRET, "msg_1", now, EVENT)),
        send(&r.router, delivery(SECRET, "msg_1", now, EVENT)),
    );
    for (status, _, body) in [&a, &b] {
        assert!(
            *status == StatusCode::CREATED || *status == StatusCode::CONFLICT,
            "{status}: {}",
            String::from_utf8_lossy(body)
        );
    }
    assert_eq!(r.invoices().await, 1, "one event, one invoice");
    let first = [&a, &b]
        .into_iter()
        .find(|(s, replayed, _)| *s == StatusCode::CREATED && !replayed)
        .expect("one delivery executed")
        .clone();

    // The sender redelivers a day later (inside the 24 h window), signed
    // afresh: the stored answer, byte for byte, and still one invoice.
    r.clock.advance(23 * 3600);
    let later = send(&r.router, delivery(SECRET, "msg_1", r.now_secs(), EVENT)).await;
    assert_eq!(later.0, StatusCode::CREATED);
    assert!(later.1, "a replay");
    assert_eq!(later.2, first.2, "the stored answer");
    assert_eq!(r.invoices().await, 1);

    // Another event is another invoice.
    let other = send(&r.router, delivery(SECRET, "msg_2", r.now_secs(), EVENT)).await;
    assert_eq!(other.0, StatusCode::CREATED);
    assert!(!other.1);
    assert_eq!(r.invoices().await, 2);
}

// clause: idem.fingerprint.mismatch
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_id_with_another_payload_is_a_mismatch() {
    let r = receiver("mismatch").await;
    let now = r.now_secs();
    let (s, _, _) = send(&r.router, delivery(SECRET, "msg_9", now, EVENT)).await;
    assert_eq!(s, StatusCode::CREATED);
    let changed = EVENT.replace("1200", "1300");
    let (s, replayed, body) = send(&r.router, delivery(SECRET, "msg_9", now, &changed)).await;
    assert_eq!(
        s,
        StatusCode::CONFLICT,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert!(!replayed);
    assert!(String::from_utf8_lossy(&body).contains("idempotency_key_mismatch"));
    assert_eq!(r.invoices().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsigned_missigned_and_stale_deliveries_are_refused_before_the_key() {
    let r = receiver("refused").await;
    let now = r.now_secs();
    let wrong = send(&r.router, delivery(b"not-the-secret", "msg_5", now, EVENT)).await;
    assert_eq!(wrong.0, StatusCode::UNAUTHORIZED);
    let stale = send(&r.router, delivery(SECRET, "msg_5", now - 10 * 60, EVENT)).await;
    assert_eq!(stale.0, StatusCode::UNAUTHORIZED);
    let mut unsigned = delivery(SECRET, "msg_5", now, EVENT);
    unsigned.headers_mut().remove("webhook-signature");
    assert_eq!(send(&r.router, unsigned).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(r.invoices().await, 0);
    // The key was never claimed: the genuine delivery is the first.
    let ok = send(&r.router, delivery(SECRET, "msg_5", now, EVENT)).await;
    assert_eq!(ok.0, StatusCode::CREATED);
    assert!(!ok.1);
    assert_eq!(r.invoices().await, 1);
}
