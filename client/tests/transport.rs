//! Transport failures against a real socket: a raw TCP server on 127.0.0.1:0 reads each request
//! completely, then closes the connection, resets it (SO_LINGER 0), holds it open without
//! answering, or answers, as scripted. The request reached the server in every case, so the
//! client may retry only what is safe to repeat: an idempotent method, or a request with a key.
//! Sleeps between attempts are on a `ManualClock`; attempt timeouts are real, and short.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_client::{
    AttemptError, Error, ManualClock, RetryMiddleware, RetryPolicy, RetryReport, StopReason,
};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server does with one connection, after reading its request.
#[derive(Debug, Clone, Copy)]
enum Act {
    /// Close cleanly (FIN) without answering: "connection closed before message completed".
    Close,
    /// Reset (RST, SO_LINGER 0) without answering: "connection reset by peer".
    Reset,
    /// Answer nothing and keep the connection open until the client gives up.
    Hang,
    /// Answer with this status and a small JSON body.
    Respond(u16),
}

/// Every request the server read: its method and `Idempotency-Key`.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// Starts the server; connection `i` gets `script[i]`, later ones `Respond(200)`.
async fn serve(script: Vec<Act>) -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen: Seen = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        let mut script = script.into_iter();
        // Ends with the test's runtime.
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let act = script.next().unwrap_or(Act::Respond(200));
            let log = log.clone();
            tokio::spawn(async move { handle(stream, act, log).await });
        }
    });
    (format!("http://{addr}"), seen)
}

async fn handle(mut stream: TcpStream, act: Act, seen: Seen) {
    let Some((method, key)) = read_request(&mut stream).await else {
        return;
    };
    seen.lock().expect("lock").push((method, key));
    match act {
        Act::Close => {
            let _ = stream.shutdown().await;
        }
        Act::Reset => {
            // SO_LINGER 0: dropping the socket sends RST instead of FIN.
            let _ = stream.set_zero_linger();
        }
        Act::Hang => {
            // Bounded by the client: it closes the connection when its timeout fires.
            let mut sink = [0u8; 64];
            while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
        }
        Act::Respond(status) => {
            let body = r#"{"id":"ord_1"}"#;
            let head = format!(
                "HTTP/1.1 {status} Scripted\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
    }
}

/// Reads one whole request (head and `content-length` body), so that closing afterwards is a
/// clean FIN: unread bytes would make the kernel send RST instead. At most 64 KiB.
async fn read_request(stream: &mut TcpStream) -> Option<(String, Option<String>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 64 * 1024 {
            return None;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    let length: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length.min(64 * 1024) {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let method = head.split(' ').next().unwrap_or_default().to_owned();
    Some((method, header("idempotency-key")))
}

fn client_with(http: reqwest::Client, mw: RetryMiddleware) -> ClientWithMiddleware {
    ClientBuilder::new(http).with(mw).build()
}

fn client(mw: RetryMiddleware) -> ClientWithMiddleware {
    client_with(
        reqwest::Client::new(),
        mw.with_clock(ManualClock::default()),
    )
}

fn report(resp: &reqwest::Response) -> RetryReport {
    resp.extensions()
        .get::<RetryReport>()
        .cloned()
        .expect("the middleware attaches a report")
}

fn gave_up(err: reqwest_middleware::Error) -> Error {
    match err {
        reqwest_middleware::Error::Middleware(e) => match e.downcast::<Error>() {
            Ok(e) => e,
            Err(other) => panic!("expected an idem-client error, got {other:?}"),
        },
        other => panic!("expected a middleware error, got {other:?}"),
    }
}

// clause: idem.client.allowlist, idem.client.same-key
#[tokio::test]
async fn a_keyed_post_is_retried_after_a_reset_and_a_close_with_its_one_key() {
    let (base, seen) = serve(vec![Act::Reset, Act::Close, Act::Respond(201)]).await;
    let resp = client(RetryMiddleware::default())
        .post(format!("{base}/orders"))
        .body(r#"{"sku":"A-1"}"#)
        .send()
        .await
        .expect("201 on the third attempt");
    assert_eq!(resp.status().as_u16(), 201);
    let r = report(&resp);
    assert_eq!(r.attempts, 3);
    let key = r.key.expect("a POST gets a key").to_string();
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen, vec![("POST".to_owned(), Some(key)); 3]);
}

// clause: idem.client.allowlist
#[tokio::test]
async fn idempotent_methods_are_retried_after_a_reset_or_a_close_without_a_key() {
    for (method, act) in [
        (reqwest::Method::GET, Act::Close),
        (reqwest::Method::GET, Act::Reset),
        (reqwest::Method::PUT, Act::Reset),
        (reqwest::Method::DELETE, Act::Close),
    ] {
        let (base, seen) = serve(vec![act, Act::Respond(200)]).await;
        let resp = client(RetryMiddleware::default())
            .request(method.clone(), format!("{base}/orders/1"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{method} after {act:?}: {e:?}"));
        assert_eq!(resp.status().as_u16(), 200, "{method} after {act:?}");
        assert_eq!(report(&resp).attempts, 2, "{method} after {act:?}");
        assert_eq!(report(&resp).key, None);
        assert_eq!(seen.lock().expect("lock").len(), 2);
    }
}

// clause: idem.client.no-key-no-retry
#[tokio::test]
async fn a_post_without_a_key_is_not_retried_after_the_server_read_it() {
    for act in [Act::Close, Act::Reset] {
        let (base, seen) = serve(vec![act, Act::Respond(201)]).await;
        let err = client(RetryMiddleware::default().auto_keys(false))
            .post(format!("{base}/orders"))
            .body("{}")
            .send()
            .await
            .expect_err("one attempt, no response");
        let e = gave_up(err);
        match &e {
            Error::GaveUp {
                reason,
                attempts,
                key,
                source,
            } => {
                assert_eq!(*reason, StopReason::NonIdempotentWithoutKey, "{act:?}");
                assert_eq!(*attempts, 1);
                assert_eq!(*key, None);
                // The server did read it: a retry could have made a second order.
                assert!(source.reqwest().is_some(), "{source:?}");
            }
            other => panic!("{act:?}: expected GaveUp, got {other:?}"),
        }
        assert_eq!(seen.lock().expect("lock").len(), 1, "{act:?}");
    }
}

// clause: idem.client.allowlist, idem.client.max-attempts
#[tokio::test]
async fn when_every_attempt_is_reset_the_error_carries_the_key_to_store() {
    let (base, seen) = serve(vec![Act::Reset; 3]).await;
    let err = client(RetryMiddleware::default())
        .post(format!("{base}/orders"))
        .body("{}")
        .send()
        .await
        .expect_err("three resets");
    let e = gave_up(err);
    assert!(
        matches!(
            &e,
            Error::GaveUp {
                reason: StopReason::AttemptsExhausted { attempts: 3 },
                attempts: 3,
                ..
            }
        ),
        "{e:?}"
    );
    let key = e.key().expect("the minted key").to_string();
    assert_eq!(e.attempts(), Some(3));
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|(_, k)| k.as_deref() == Some(key.as_str())));
}

/// Generous: an attempt here lasts about 300 ms; without the fix one lasted the whole deadline.
const HANG_GUARD: Duration = Duration::from_secs(20);

// clause: idem.client.deadline
#[tokio::test]
async fn a_shorter_client_timeout_is_not_overridden_by_the_deadline() {
    let (base, seen) = serve(vec![Act::Hang; 3]).await;
    // The client's own timeout is 300 ms; the operation's deadline (30 s, on a virtual clock
    // that does not move while an attempt waits) and attempt timeout (10 s) are far longer.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .expect("client");
    let client = client_with(
        http,
        RetryMiddleware::default().with_clock(ManualClock::default()),
    );
    let call = client.get(format!("{base}/orders/1")).send();
    let err = tokio::time::timeout(HANG_GUARD, call)
        .await
        .expect("each attempt ends at the client's 300 ms, not at the deadline")
        .expect_err("every attempt hangs");
    let e = gave_up(err);
    match &e {
        Error::GaveUp { reason, source, .. } => {
            assert_eq!(*reason, StopReason::AttemptsExhausted { attempts: 3 });
            // reqwest's own timeout fired, not the middleware's.
            assert!(
                matches!(source, AttemptError::Transport(t) if t.is_timeout()),
                "{source:?}"
            );
        }
        other => panic!("expected GaveUp, got {other:?}"),
    }
    assert_eq!(seen.lock().expect("lock").len(), 3);
}

// clause: idem.client.deadline
#[tokio::test]
async fn the_attempt_timeout_ends_an_attempt_that_hangs() {
    let (base, seen) = serve(vec![Act::Hang, Act::Respond(200)]).await;
    let policy = RetryPolicy {
        attempt_timeout: Duration::from_millis(200),
        ..RetryPolicy::default()
    };
    // No client timeout at all: only the middleware's attempt timeout can end the first attempt.
    let call = client(RetryMiddleware::new(policy))
        .get(format!("{base}/orders/1"))
        .send();
    let resp = tokio::time::timeout(HANG_GUARD, call)
        .await
        .expect("the 200 ms attempt timeout fires")
        .expect("200 on the second attempt");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(report(&resp).attempts, 2);
    assert_eq!(seen.lock().expect("lock").len(), 2);

    // Every attempt hangs: the error says the attempt timeout fired, and which.
    let (base, _seen) = serve(vec![Act::Hang; 3]).await;
    let policy = RetryPolicy {
        attempt_timeout: Duration::from_millis(200),
        ..RetryPolicy::default()
    };
    let call = client(RetryMiddleware::new(policy))
        .get(format!("{base}/orders/1"))
        .send();
    let err = tokio::time::timeout(HANG_GUARD, call)
        .await
        .expect("bounded")
        .expect_err("every attempt hangs");
    let e = gave_up(err);
    assert!(
        matches!(
            &e,
            Error::GaveUp {
                reason: StopReason::AttemptsExhausted { attempts: 3 },
                source: AttemptError::TimedOut(t),
                ..
            } if *t == Duration::from_millis(200)
        ),
        "{e:?}"
    );
}
