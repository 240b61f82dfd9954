//! The attempt timeout bounds the wait for a response's head (time to first byte), not the
//! reading of its body: the one-line setup streams a large, slow response to the end, and a
//! body limit is there for a caller who asks for one.

use std::time::{Duration, Instant};

use idem_client::{RetryMiddleware, RetryPolicy};
use reqwest_middleware::ClientBuilder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CHUNK: usize = 256 * 1024;
const CHUNKS: usize = 16;
const GAP: Duration = Duration::from_millis(80);

/// A server that answers its first connection with a 4 MiB body trickled in 16 chunks, 80 ms
/// apart (about 1.2 s in all), after an immediate head.
async fn slow_large_body() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        // Read the request head (bounded: at most 64 KiB).
        let mut buf = vec![0u8; 64 * 1024];
        let mut read = 0;
        while !buf[..read].windows(4).any(|w| w == b"\r\n\r\n") && read < buf.len() {
            match stream.read(&mut buf[read..]).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read += n,
            }
        }
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: {}\r\n\r\n",
            CHUNK * CHUNKS
        );
        if stream.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let chunk = vec![b'x'; CHUNK];
        for _ in 0..CHUNKS {
            // The slowness is the behaviour under test, not a synchronisation.
            tokio::time::sleep(GAP).await;
            if stream.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = stream.flush().await;
    });
    format!("http://{addr}/download")
}

fn short_ttfb(body_timeout: Option<Duration>) -> RetryPolicy {
    RetryPolicy {
        // Far shorter than the body takes: only the head must arrive within it.
        attempt_timeout: Duration::from_millis(300),
        body_timeout,
        ..RetryPolicy::default()
    }
}

// clause: idem.client.deadline
#[tokio::test]
async fn a_large_slow_body_streams_past_the_attempt_timeout() {
    let url = slow_large_body().await;
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(short_ttfb(None)))
        .build();
    let started = Instant::now();
    let resp = client.get(&url).send().await.expect("head in time");
    assert_eq!(resp.status().as_u16(), 200);
    let body = resp
        .bytes()
        .await
        .expect("the whole body, however long it takes");
    assert_eq!(body.len(), CHUNK * CHUNKS);
    assert!(
        started.elapsed() > Duration::from_millis(300),
        "the body outlasted the attempt timeout ({:?})",
        started.elapsed()
    );
}

// clause: idem.client.deadline
#[tokio::test]
async fn a_body_timeout_when_set_cuts_the_body() {
    let url = slow_large_body().await;
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(short_ttfb(Some(
            Duration::from_millis(300),
        ))))
        .build();
    let resp = client.get(&url).send().await.expect("head in time");
    let err = resp.bytes().await.expect_err("the body takes over 1 s");
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    let mut timed_out = false;
    while let Some(e) = source {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            timed_out = true;
        }
        source = e.source();
    }
    assert!(timed_out || err.is_timeout(), "{err:?}");
}

#[test]
fn the_default_policy_sets_no_body_timeout() {
    let p = RetryPolicy::default();
    assert_eq!(p.body_timeout, None);
    assert_eq!(p.attempt_timeout, Duration::from_secs(10));
}
