//! The built-in response-dropping proxy: the "committed, but the client
//! never heard" case, without any cooperation from the target.
//!
//! The proxy accepts HTTP/1.1 requests on 127.0.0.1, forwards each to the
//! target in full, reads the target's complete response (so the target has
//! finished and committed), then closes the client's connection without
//! answering. The kit sees a broken connection, exactly like a client whose
//! response was lost on the way back, and retries with the same key.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::Error;

/// What the proxy forwarded and what it threw away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// Method and path the client sent.
    pub request_line: String,
    /// The target's status, which the client never saw (None: the target
    /// did not answer either).
    pub status: Option<u16>,
}

/// A running proxy; dropping it stops it.
#[derive(Debug)]
pub struct DropProxy {
    /// Base URL clients use instead of the target's.
    pub base_url: String,
    rx: mpsc::Receiver<Dropped>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DropProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DropProxy {
    /// Starts a proxy in front of `target_base_url`.
    pub async fn start(target_base_url: &str, timeout: Duration) -> Result<Self, Error> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| Error::Http(format!("proxy bind: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::Http(format!("proxy addr: {e}")))?;
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| Error::Http(e.to_string()))?;
        let target = target_base_url.trim_end_matches('/').to_owned();
        let (tx, rx) = mpsc::channel(16);
        let task = tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let Some((head, body)) = read_request(&mut sock, timeout).await else {
                    continue;
                };
                let dropped = forward(&client, &target, &head, body).await;
                // Close without writing a byte: the response is lost.
                let _ = sock.shutdown().await;
                drop(sock);
                if tx.send(dropped).await.is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            base_url: format!("http://{addr}"),
            rx,
            task,
        })
    }

    /// The next dropped exchange, waiting at most `timeout`.
    pub async fn next_dropped(&mut self, timeout: Duration) -> Option<Dropped> {
        tokio::time::timeout(timeout, self.rx.recv()).await.ok()?
    }
}

async fn read_request(
    sock: &mut tokio::net::TcpStream,
    timeout: Duration,
) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + timeout;
    // Bounded by the deadline and by a 1 MiB cap.
    loop {
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let len = content_length(&head);
            let mut body = buf[end + 4..].to_vec();
            while body.len() < len {
                let n = tokio::time::timeout_at(deadline, sock.read(&mut chunk))
                    .await
                    .ok()?
                    .ok()?;
                if n == 0 {
                    return None;
                }
                body.extend_from_slice(&chunk[..n]);
            }
            body.truncate(len);
            return Some((head, body));
        }
        if buf.len() > 1 << 20 {
            return None;
        }
        let n = tokio::time::timeout_at(deadline, sock.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn content_length(head: &str) -> usize {
    head.lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .find(|(n, _)| n.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

async fn forward(client: &reqwest::Client, target: &str, head: &str, body: Vec<u8>) -> Dropped {
    let mut lines = head.lines();
    let request_line = lines.next().unwrap_or_default().to_owned();
    let mut parts = request_line.split_whitespace();
    let (Some(method), Some(path)) = (parts.next(), parts.next()) else {
        return Dropped {
            request_line,
            status: None,
        };
    };
    let Ok(method) = reqwest::Method::from_bytes(method.as_bytes()) else {
        return Dropped {
            request_line,
            status: None,
        };
    };
    let mut req = client.request(method, format!("{target}{path}"));
    for (name, value) in lines.filter_map(|l| l.split_once(':')) {
        let name = name.trim();
        // Hop-by-hop and framing headers are the proxy's own business.
        if ["host", "content-length", "connection", "transfer-encoding"]
            .iter()
            .any(|h| name.eq_ignore_ascii_case(h))
        {
            continue;
        }
        req = req.header(name, value.trim());
    }
    let status = match req.body(body).send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            // Read the whole body so the target has finished its response.
            let _ = resp.bytes().await;
            Some(status)
        }
        Err(_) => None,
    };
    Dropped {
        request_line,
        status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A one-route HTTP/1.1 responder on raw tokio sockets that counts the
    /// requests it served.
    async fn counting_target() -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let served = Arc::new(AtomicUsize::new(0));
        let s2 = served.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let s3 = s2.clone();
                tokio::spawn(async move {
                    if read_request(&mut sock, Duration::from_secs(5))
                        .await
                        .is_some()
                    {
                        s3.fetch_add(1, Ordering::SeqCst);
                        let _ = sock
                            .write_all(b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                            .await;
                    }
                });
            }
        });
        (format!("http://{addr}"), served)
    }

    #[tokio::test]
    async fn the_target_answers_but_the_client_never_hears() {
        let (target, served) = counting_target().await;
        let mut proxy = DropProxy::start(&target, Duration::from_secs(5))
            .await
            .expect("proxy");
        let resp = reqwest::Client::new()
            .post(format!("{}/v1/transfers?x=1", proxy.base_url))
            .header("Idempotency-Key", "k1")
            .body("{\"a\":1}")
            .send()
            .await;
        assert!(resp.is_err(), "the client must see no response: {resp:?}");
        let d = proxy
            .next_dropped(Duration::from_secs(5))
            .await
            .expect("dropped");
        assert_eq!(d.status, Some(201));
        assert!(
            d.request_line.starts_with("POST /v1/transfers?x=1"),
            "{d:?}"
        );
        assert_eq!(served.load(Ordering::SeqCst), 1, "forwarded exactly once");
    }
}
