//! The fault-injecting HTTP/1 server: one per run, on 127.0.0.1:0, answering
//! any method and path with the scenario's script and recording every
//! attempt. It speaks HTTP/1.1 over raw tokio sockets, because the faults
//! are below what a server framework lets a handler do: a reset before the
//! request is read (the bytes are only peeked, for the record), a reset
//! after it was read (SO_LINGER 0, then close: an RST, not a FIN), and an
//! answer that never comes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::record::{Answer, Attempt};
use super::scenario::{Hint, IN_FLIGHT_CODE, MISMATCH_CODE, Scenario, Step};

/// The largest request head the server reads.
const MAX_HEAD: usize = 64 * 1024;
/// The largest body it reads.
const MAX_BODY: usize = 8 * 1024 * 1024;
/// How much of a body the record keeps.
const RECORDED_BODY: usize = 4 * 1024;

/// What one run's server needs to know.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The scenario whose script it follows.
    pub scenario: Scenario,
    /// The run's start: every recorded time is measured from it.
    pub start: Instant,
    /// The client's overall deadline (for hints placed past it).
    pub deadline: Duration,
    /// The JSON a success answers with.
    pub success_body: Arc<str>,
}

struct Inner {
    attempts: Vec<Attempt>,
    next_step: usize,
    conns: u32,
}

struct State {
    setup: Setup,
    inner: Mutex<Inner>,
    count: watch::Sender<usize>,
}

impl State {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn rel(&self) -> Duration {
        self.setup.start.elapsed()
    }

    fn peek_step(&self) -> Step {
        let i = self.lock().next_step;
        self.setup.scenario.step(i)
    }

    fn take_step(&self) -> Step {
        let mut g = self.lock();
        let s = self.setup.scenario.step(g.next_step);
        g.next_step += 1;
        s
    }

    fn push(&self, a: Attempt) -> usize {
        let n = {
            let mut g = self.lock();
            g.attempts.push(a);
            g.attempts.len()
        };
        self.count.send_replace(n);
        n - 1
    }

    fn update(&self, i: usize, f: impl FnOnce(&mut Attempt)) {
        if let Some(a) = self.lock().attempts.get_mut(i) {
            f(a);
        }
        // Wake the runner: an update can end a run (a held attempt closed).
        self.count.send_modify(|_| {});
    }
}

/// A running fault server. Dropping it stops it and every connection.
pub struct FaultServer {
    base_url: String,
    state: Arc<State>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        self.task.abort();
    }
}

impl FaultServer {
    /// Binds 127.0.0.1:0 and starts serving the scenario.
    pub async fn start(setup: Setup) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (count, _) = watch::channel(0usize);
        let state = Arc::new(State {
            setup,
            inner: Mutex::new(Inner {
                attempts: Vec::new(),
                next_step: 0,
                conns: 0,
            }),
            count,
        });
        let (stop, stopped) = watch::channel(false);
        let st = state.clone();
        let task = tokio::spawn(async move {
            let mut stopped_accept = stopped.clone();
            loop {
                let accepted = tokio::select! {
                    _ = stopped_accept.changed() => break,
                    a = listener.accept() => a,
                };
                let Ok((stream, _)) = accepted else { continue };
                let _ = stream.set_nodelay(true);
                let id = {
                    let mut g = st.lock();
                    g.conns += 1;
                    g.conns
                };
                let (st, mut stopped) = (st.clone(), stopped.clone());
                tokio::spawn(async move {
                    tokio::select! {
                        _ = stopped.changed() => {}
                        () = serve(stream, st, id) => {}
                    }
                });
            }
        });
        Ok(Self {
            base_url: format!("http://{addr}"),
            state,
            stop,
            task,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Every attempt so far.
    pub fn attempts(&self) -> Vec<Attempt> {
        self.state.lock().attempts.clone()
    }

    /// Changes whenever an attempt is recorded or updated.
    pub fn watch(&self) -> watch::Receiver<usize> {
        self.state.count.subscribe()
    }
}

struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    close: bool,
}

/// One connection: requests in turn, each answered by the next step.
async fn serve(mut stream: TcpStream, st: Arc<State>, conn: u32) {
    if st.peek_step() == Step::ResetBeforeRead {
        st.take_step();
        // Wait for the request's first bytes, so the reset happens after
        // the client sent it but before the server read it.
        let _ = tokio::time::timeout(Duration::from_secs(2), stream.readable()).await;
        let at = st.rel();
        let mut peek = vec![0u8; 16 * 1024];
        let n = stream.peek(&mut peek).await.unwrap_or(0);
        let (method, path, headers) =
            parse_head(&peek[..n]).unwrap_or_else(|| ("?".to_owned(), "?".to_owned(), Vec::new()));
        // Recorded before the reset: a client that gives up on it at once
        // must not finish before its attempt is on the record.
        st.push(Attempt {
            at,
            conn,
            method,
            path,
            headers,
            body: String::new(),
            answer: Answer::ResetBeforeRead,
            answered: Some(st.rel()),
            client_gave_up: None,
            not_before: None,
        });
        let _ = stream.set_zero_linger();
        drop(stream);
        return;
    }
    let mut buf = Vec::new();
    loop {
        let req = match read_request(&mut stream, &mut buf).await {
            Ok(Some(r)) => r,
            Ok(None) | Err(_) => return,
        };
        let at = st.rel();
        let step = st.take_step();
        let mut attempt = Attempt {
            at,
            conn,
            method: req.method.clone(),
            path: req.path.clone(),
            headers: req.headers.clone(),
            body: String::from_utf8_lossy(&req.body[..req.body.len().min(RECORDED_BODY)])
                .into_owned(),
            answer: Answer::Held,
            answered: None,
            client_gave_up: None,
            not_before: None,
        };
        match step {
            Step::ResetBeforeRead | Step::ResetAfterRead => {
                // Every answer is recorded before it is given, so a client
                // that finishes on it finds its attempt on the record.
                attempt.answer = Answer::ResetAfterRead;
                attempt.answered = Some(st.rel());
                st.push(attempt);
                let _ = stream.set_zero_linger();
                drop(stream);
                return;
            }
            Step::Hold => {
                let i = st.push(attempt);
                // Read until the client gives up (closes); anything it
                // sends meanwhile is ignored.
                let mut sink = [0u8; 4096];
                loop {
                    match stream.read(&mut sink).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                let gave_up = st.rel();
                st.update(i, |a| a.client_gave_up = Some(gave_up));
                return;
            }
            Step::Success => {
                let code = if req.method.eq_ignore_ascii_case("POST") {
                    201
                } else {
                    200
                };
                let body = st.setup.success_body.to_string();
                attempt.answer = Answer::Success { code };
                attempt.answered = Some(st.rel());
                st.push(attempt);
                let wrote =
                    write_response(&mut stream, code, "application/json", None, &body).await;
                if wrote.is_err() {
                    return;
                }
            }
            Step::Status {
                code,
                hint,
                problem,
            } => {
                let (retry_after, not_before) = match hint {
                    None => (None, None),
                    Some(h) => {
                        let (v, wait) = hint_value(h, st.setup.deadline);
                        (Some(v), Some(st.rel() + wait))
                    }
                };
                let body = problem_body(code, problem);
                attempt.answer = Answer::Status {
                    code,
                    retry_after: retry_after.clone(),
                    problem,
                };
                attempt.answered = Some(st.rel());
                attempt.not_before = not_before;
                st.push(attempt);
                let wrote = write_response(
                    &mut stream,
                    code,
                    "application/problem+json",
                    retry_after.as_deref(),
                    &body,
                )
                .await;
                if wrote.is_err() {
                    return;
                }
            }
        }
        if req.close {
            return;
        }
    }
}

/// The `Retry-After` value for a hint and the least wait it asks for.
fn hint_value(h: Hint, deadline: Duration) -> (String, Duration) {
    match h {
        Hint::Seconds(s) => (s.to_string(), Duration::from_secs(s)),
        Hint::PastDeadline(extra) => {
            let s = deadline.as_secs() + extra;
            (s.to_string(), Duration::from_secs(s))
        }
        Hint::DateIn(s) => {
            let now = SystemTime::now();
            let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
            let whole = Duration::from_secs(since.as_secs() + 1 + s);
            let at = UNIX_EPOCH + whole;
            (httpdate::fmt_http_date(at), whole.saturating_sub(since))
        }
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        408 => "Request Timeout",
        409 => "Conflict",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

/// An RFC 9457 problem document; the contract's `code` and `retryable`
/// members when the scenario names a code.
fn problem_body(code: u16, problem: Option<&'static str>) -> String {
    let mut doc = serde_json::json!({
        "type": "about:blank",
        "title": reason(code),
        "status": code,
        "detail": "answered by idem-conformance's client check",
    });
    if let Some(p) = problem {
        doc["type"] = serde_json::json!(format!("https://idemkit.dev/book/errors.html#{p}"));
        doc["code"] = serde_json::json!(p);
        doc["retryable"] = serde_json::json!(p == IN_FLIGHT_CODE);
        if p == MISMATCH_CODE {
            doc["detail"] = serde_json::json!("this key was used for a different request");
        }
    }
    doc.to_string()
}

async fn write_response(
    s: &mut TcpStream,
    code: u16,
    content_type: &str,
    retry_after: Option<&str>,
    body: &str,
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n",
        reason(code),
        body.len()
    );
    if let Some(r) = retry_after {
        head.push_str(&format!("Retry-After: {r}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await?;
    s.write_all(body.as_bytes()).await?;
    s.flush().await
}

fn find(buf: &[u8], pat: &[u8]) -> Option<usize> {
    buf.windows(pat.len()).position(|w| w == pat)
}

/// A request head's method, target and headers.
type Head = (String, String, Vec<(String, String)>);

/// Method, target and headers of a request head (which may lack its end,
/// when only peeked).
fn parse_head(buf: &[u8]) -> Option<Head> {
    let end = find(buf, b"\r\n\r\n").unwrap_or(buf.len());
    let text = String::from_utf8_lossy(&buf[..end]);
    let mut lines = text.split("\r\n");
    let mut first = lines.next()?.split_whitespace();
    let method = first.next()?.to_owned();
    let path = first.next().unwrap_or("?").to_owned();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Some((method, path, headers))
}

/// Reads more bytes into `buf`; false at the end of the stream.
async fn fill(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<bool> {
    let mut tmp = [0u8; 8192];
    let n = s.read(&mut tmp).await?;
    buf.extend_from_slice(&tmp[..n]);
    Ok(n > 0)
}

/// Reads one request (Content-Length or chunked body; answers
/// `Expect: 100-continue`). `None` when the client closed first.
async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Option<Request>> {
    let end = loop {
        if let Some(e) = find(buf, b"\r\n\r\n") {
            break e;
        }
        if buf.len() > MAX_HEAD || !fill(s, buf).await? {
            return Ok(None);
        }
    };
    let Some((method, path, headers)) = parse_head(&buf[..end]) else {
        return Ok(None);
    };
    buf.drain(..end + 4);
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.to_ascii_lowercase())
    };
    let close = header("connection").is_some_and(|v| v.contains("close"));
    if header("expect").is_some_and(|v| v.contains("100-continue")) {
        s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
    }
    let mut body = Vec::new();
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            let line_end = loop {
                if let Some(e) = find(buf, b"\r\n") {
                    break e;
                }
                if !fill(s, buf).await? {
                    return Ok(None);
                }
            };
            let size_text = String::from_utf8_lossy(&buf[..line_end]).into_owned();
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .unwrap_or(0);
            buf.drain(..line_end + 2);
            if size == 0 {
                // Trailers, up to the empty line.
                loop {
                    if let Some(e) = find(buf, b"\r\n") {
                        buf.drain(..e + 2);
                        if e == 0 {
                            break;
                        }
                        continue;
                    }
                    if !fill(s, buf).await? {
                        break;
                    }
                }
                break;
            }
            while buf.len() < size + 2 {
                if body.len() + buf.len() > MAX_BODY || !fill(s, buf).await? {
                    return Ok(None);
                }
            }
            body.extend_from_slice(&buf[..size]);
            buf.drain(..size + 2);
        }
    } else {
        let n = header("content-length")
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0)
            .min(MAX_BODY);
        while buf.len() < n {
            if !fill(s, buf).await? {
                return Ok(None);
            }
        }
        body = buf.drain(..n).collect();
    }
    Ok(Some(Request {
        method,
        path,
        headers,
        body,
        close,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::all;

    async fn start(id: &str) -> FaultServer {
        let scenario = all(2)
            .into_iter()
            .find(|s| s.id == id)
            .unwrap_or_else(|| panic!("scenario {id}"));
        FaultServer::start(Setup {
            scenario,
            start: Instant::now(),
            deadline: Duration::from_secs(30),
            success_body: Arc::from(r#"{"id":"p_1"}"#),
        })
        .await
        .expect("server starts")
    }

    async fn connect(s: &FaultServer) -> TcpStream {
        TcpStream::connect(s.base_url().trim_start_matches("http://"))
            .await
            .expect("connects")
    }

    /// Reads until the peer closes or resets; the error kind, if any.
    async fn drain(c: &mut TcpStream) -> (Vec<u8>, Option<std::io::ErrorKind>) {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf)).await {
                Ok(Ok(0)) => return (out, None),
                Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
                Ok(Err(e)) => return (out, Some(e.kind())),
                Err(_) => return (out, Some(std::io::ErrorKind::TimedOut)),
            }
            if find(&out, b"\r\n\r\n").is_some() && out.ends_with(b"}") {
                return (out, None);
            }
        }
    }

    #[tokio::test]
    async fn a_chunked_post_is_recorded_whole_and_the_script_advances() {
        let s = start("retry.502").await;
        let mut c = connect(&s).await;
        c.write_all(
            b"POST /payments HTTP/1.1\r\nHost: x\r\nidempotency-key: k-1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n2\r\n1}\r\n0\r\n\r\n",
        )
        .await
        .expect("write");
        let (first, _) = drain(&mut c).await;
        assert!(first.starts_with(b"HTTP/1.1 502 "), "{first:?}");
        // The same connection, the next step: the success body.
        c.write_all(b"POST /payments HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            .await
            .expect("write");
        let (second, _) = drain(&mut c).await;
        let text = String::from_utf8_lossy(&second);
        assert!(text.starts_with("HTTP/1.1 201 "), "{text}");
        assert!(text.ends_with(r#"{"id":"p_1"}"#), "{text}");
        let a = s.attempts();
        assert_eq!(a.len(), 2);
        assert_eq!(a[0].body, r#"{"a":1}"#);
        assert_eq!(
            crate::record::KeySource::default().key(&a[0]).as_deref(),
            Some("k-1")
        );
        assert_eq!((a[0].conn, a[1].conn), (1, 1));
        assert_eq!(a[1].answer, Answer::Success { code: 201 });
    }

    #[tokio::test]
    async fn a_reset_after_reading_is_an_rst_with_the_request_recorded() {
        let s = start("retry.reset-after-read").await;
        let mut c = connect(&s).await;
        c.write_all(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
            .await
            .expect("write");
        let (got, err) = drain(&mut c).await;
        assert!(got.is_empty(), "no answer: {got:?}");
        assert_eq!(err, Some(std::io::ErrorKind::ConnectionReset));
        let a = s.attempts();
        assert_eq!(a.len(), 1);
        assert_eq!((a[0].method.as_str(), a[0].path.as_str()), ("POST", "/x"));
        assert_eq!(a[0].answer, Answer::ResetAfterRead);
    }

    #[tokio::test]
    async fn a_held_attempt_records_when_the_client_gave_up() {
        let s = start("limits.hang").await;
        let mut changes = s.watch();
        let mut c = connect(&s).await;
        c.write_all(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            .await
            .expect("write");
        // Wait (bounded) until the server has recorded the attempt.
        for _ in 0..50 {
            if !s.attempts().is_empty() {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), changes.changed()).await;
        }
        assert_eq!(s.attempts()[0].answer, Answer::Held);
        assert_eq!(s.attempts()[0].client_gave_up, None);
        drop(c);
        for _ in 0..50 {
            if s.attempts()[0].client_gave_up.is_some() {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), changes.changed()).await;
        }
        assert!(s.attempts()[0].client_gave_up.is_some());
    }

    #[test]
    fn hints_are_spelt_as_the_contract_allows() {
        let (v, wait) = hint_value(Hint::Seconds(2), Duration::from_secs(30));
        assert_eq!((v.as_str(), wait), ("2", Duration::from_secs(2)));
        let (v, wait) = hint_value(Hint::PastDeadline(30), Duration::from_secs(30));
        assert_eq!((v.as_str(), wait), ("60", Duration::from_secs(60)));
        let (v, wait) = hint_value(Hint::DateIn(3), Duration::from_secs(30));
        assert!(httpdate::parse_http_date(&v).is_ok(), "{v}");
        assert!(
            wait > Duration::from_secs(3) && wait <= Duration::from_secs(4),
            "{wait:?}"
        );
    }
}
