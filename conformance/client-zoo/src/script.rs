//! A scripted HTTP/1.1 server on 127.0.0.1 for the crate's tests: it answers the n-th request
//! with the n-th step of its script (201 once the script runs out) and records what each
//! request carried. Raw TCP rather than axum, because one step closes the connection under a
//! request it has read, which a handler cannot do.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// What the server does with one request.
#[derive(Debug, Clone)]
pub(crate) enum Step {
    /// Answers with this status, these extra headers and this body, then closes.
    Answer(u16, Vec<(&'static str, String)>, String),
    /// Closes the connection without answering (the client sees it lost).
    Close,
    /// Never answers (holds the connection for a minute at most).
    Hang,
}

impl Step {
    /// A bodiless answer with one `Retry-After`.
    pub(crate) fn retry_after(status: u16, value: &str) -> Step {
        Step::Answer(
            status,
            vec![("retry-after", value.to_owned())],
            String::new(),
        )
    }
}

/// One request as it arrived.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    /// When its head was read.
    pub(crate) at: Instant,
    /// Its method and path.
    pub(crate) line: String,
    /// Its `Idempotency-Key`, if any.
    pub(crate) key: Option<String>,
    /// Every header, its name in lower case, in arrival order.
    pub(crate) headers: Vec<(String, String)>,
    /// Its body.
    pub(crate) body: String,
}

impl Seen {
    /// The value of the first header called `name` (lower case), if any.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A running scripted server; dropping it stops it and every connection it holds.
pub(crate) struct Server {
    /// `http://127.0.0.1:PORT`.
    pub(crate) base_url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Server {
    /// Starts a server that plays `script`.
    pub(crate) async fn start(script: Vec<Step>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base_url = format!("http://{}", listener.local_addr().expect("addr"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            // Bounded by the test: the task is aborted when the server is dropped.
            while let Ok((stream, _)) = listener.accept().await {
                let (script, recorded) = (script.clone(), Arc::clone(&recorded));
                connections.spawn(serve(stream, script, recorded));
            }
        });
        Server {
            base_url,
            seen,
            task,
        }
    }

    /// Every request so far, in arrival order.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one request from `stream`, records it and plays the step its number selects.
async fn serve(mut stream: TcpStream, script: Vec<Step>, seen: Arc<Mutex<Vec<Seen>>>) {
    let Some(request) = read_request(&mut stream).await else {
        return;
    };
    let step = {
        let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
        let step = script.get(seen.len()).cloned();
        seen.push(request);
        step.unwrap_or_else(|| Step::Answer(201, Vec::new(), r#"{"id":"pay_1"}"#.to_owned()))
    };
    match step {
        Step::Answer(status, headers, body) => {
            let mut head = format!(
                "HTTP/1.1 {status} Scripted\r\ncontent-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            if !body.is_empty() {
                head.push_str("content-type: application/json\r\n");
            }
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("\r\n");
            head.push_str(&body);
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
        Step::Close => drop(stream),
        Step::Hang => tokio::time::sleep(Duration::from_secs(60)).await,
    }
}

/// Reads a request head and its `content-length` body (at most 64 KiB in all).
async fn read_request(stream: &mut TcpStream) -> Option<Seen> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    // Bounded by the 64 KiB limit.
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
    let at = Instant::now();
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let line = lines.next()?.rsplit_once(' ')?.0.to_owned();
    let (mut key, mut length, mut headers) = (None, 0usize, Vec::new());
    for header in lines {
        if let Some((name, value)) = header.split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("idempotency-key") {
                key = Some(value.to_owned());
            } else if name.eq_ignore_ascii_case("content-length") {
                length = value.parse().ok()?;
            }
            headers.push((name.to_ascii_lowercase(), value.to_owned()));
        }
    }
    // Bounded by the body's declared length (and the limit).
    while buf.len() < head_end + length && buf.len() <= 64 * 1024 {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8_lossy(buf.get(head_end..head_end + length)?).into_owned();
    Some(Seen {
        at,
        line,
        key,
        headers,
        body,
    })
}
