//! Serving HTTP/1.1 with connection-level limits: how long a client may
//! take to send a request head, how long to send its body, how long a
//! keep-alive connection may sit idle, and how many connections are open
//! at once.
//!
//! `axum::serve` has none of these: a client that opens a socket and sends
//! nothing, or sends one header byte every few seconds, holds a task, a
//! buffer and a file descriptor forever, and enough of them (about a
//! thousand, under the usual open-file limit of 1024) stop the server
//! accepting anyone. This module drives each connection with hyper's
//! HTTP/1 server and a watchdog that applies [`Limits`]:
//!
//! - **header read** (default 10 s): a new connection must deliver a
//!   complete request head within this time of being accepted, and on a
//!   keep-alive connection a head must be complete within this time of its
//!   first byte. Otherwise the connection is closed without an answer
//!   (the request never reached the application, so there is nobody to
//!   answer for; Go's `ReadHeaderTimeout` does the same).
//! - **body read** (default 30 s): from the moment the head is read, the
//!   whole body must arrive within this time. Otherwise reading the body
//!   fails, the endpoint answers 400 `malformed_body` saying so, before
//!   any key is claimed (the body is read before the claim), and the
//!   connection is closed after that answer.
//! - **idle** (default 60 s): a connection with no request in progress and
//!   no bytes moving either way for this long is closed. This also bounds
//!   a client that stops reading its response.
//! - **connection cap** (default: three quarters of the open-file limit,
//!   at most 10,000; see [`default_max_connections`]): at the cap the
//!   server stops accepting, so new clients wait in the kernel's listen
//!   backlog (their connect succeeds, their request waits), and it closes
//!   every connection that has been quiet for a second with no request in
//!   progress (idle keep-alive ones, and ones that never sent a byte) to
//!   make room, the way Apache's event MPM sheds keep-alive connections
//!   when busy. A server at its cap thus keeps answering new clients as
//!   soon as old ones fall quiet, and at the latest when a slow client hits
//!   its header timeout.
//!
//! A request carrying both `Content-Length` and `Transfer-Encoding` is
//! refused with 400 `malformed_body` and the connection closed (RFC 9112
//! §6.1; such a message is the shape of request smuggling). hyper alone
//! would frame it by `Transfer-Encoding` and close the connection after
//! answering; a passive reader of the framing (`serve/framing.rs`) lets
//! the service see the conflict and refuse it.
//!
//! What hyper answers itself, before a request reaches the application,
//! has an empty body rather than a problem document, because hyper offers
//! no hook to shape it: 400 for a request line or header it cannot parse,
//! 431 for a head over about 64 KiB ([`MAX_HEAD_BYTES`]; hyper checks
//! between reads, so a head that arrives in one read may be somewhat
//! longer) or with more than 100 headers. Everything the application
//! answers is problem+json.

mod framing;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, Request, Response, header};
use axum::response::IntoResponse;
use http_body::Body as _;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

use crate::error::Error;
use framing::{Event, Framing};

/// Longest request head hyper buffers (431 above); it is also the most a
/// connection's read buffer grows to.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// How long a connection must be quiet before the server closes it to make
/// room when at its connection cap.
pub const RECLAIM_QUIET: Duration = Duration::from_secs(1);

/// How long a shutdown waits for requests in progress before it drops them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// The connection-level limits (see the module docs for what each bounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Accept (or a head's first byte) to complete head.
    pub header_read: Duration,
    /// Complete head to complete body.
    pub body_read: Duration,
    /// No request in progress and no bytes moving.
    pub idle: Duration,
    /// Connections open at once.
    pub max_connections: usize,
}

/// The connection cap when none is configured: three quarters of the
/// soft open-file limit (the rest is kept for the database pool, the
/// processor client, the logs), at least 16 and at most 10,000.
pub fn default_max_connections() -> usize {
    let files = open_file_limit().unwrap_or(1024);
    let cap = files.saturating_sub((files / 4).max(64));
    usize::try_from(cap.clamp(16, 10_000)).unwrap_or(10_000)
}

/// The soft `RLIMIT_NOFILE` of this process, where there is one.
pub fn open_file_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        rustix::process::getrlimit(rustix::process::Resource::Nofile).current
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Serves `router` on `listener` under `limits` until `shutdown`
/// completes; then stops accepting, lets requests in progress finish (at
/// most [`SHUTDOWN_GRACE`]) and returns.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        // hyper's own header timer starts when it begins waiting for a
        // head, so on a keep-alive connection it also counts idle time: it
        // is only a backstop here, behind the watchdog's two limits.
        .header_read_timeout(limits.idle + limits.header_read)
        .max_header_size(MAX_HEAD_BYTES)
        .max_buf_size(MAX_HEAD_BYTES);
    let http = Arc::new(http);
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    // True while the server waits for a free slot: quiet connections close.
    let (at_cap, _) = watch::channel(false);
    let (stop, _) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                // At the cap: quiet connections make room; new ones wait.
                set(&at_cap, true);
                crate::ops::cap_reached();
                tracing::debug!(
                    max_connections = limits.max_connections,
                    "at the connection cap: new connections wait in the listen backlog"
                );
                let permit = tokio::select! {
                    p = permits.clone().acquire_owned() => p,
                    () = &mut shutdown => break,
                };
                set(&at_cap, false);
                match permit {
                    Ok(p) => p,
                    Err(_) => break,
                }
            }
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    accept_error(&e, &at_cap).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Small answers leave at once rather than after a delayed ACK.
        let _ = stream.set_nodelay(true);
        let conn = Conn {
            http: http.clone(),
            router: router.clone(),
            limits,
            at_cap: at_cap.subscribe(),
            stop: stop.subscribe(),
        };
        crate::ops::connection_opened();
        tokio::spawn(async move {
            let reason = conn.run(stream).await;
            crate::ops::connection_closed(reason);
            tracing::trace!(%peer, reason, "connection closed");
            drop(permit);
        });
    }
    drop(listener);
    let _ = stop.send(true);
    // Every connection holds a permit until it is closed.
    let all = u32::try_from(limits.max_connections.max(1)).unwrap_or(u32::MAX);
    if tokio::time::timeout(SHUTDOWN_GRACE, permits.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!(
            grace_secs = SHUTDOWN_GRACE.as_secs(),
            "requests still in progress at shutdown were dropped"
        );
    }
    Ok(())
}

/// An accept that failed: out of file descriptors counts as being at the
/// cap (quiet connections make room) for a short pause, never a busy loop
/// or an exit.
async fn accept_error(e: &io::Error, at_cap: &watch::Sender<bool>) {
    // ENFILE, EMFILE.
    let out_of_files = matches!(e.raw_os_error(), Some(23 | 24));
    if matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    crate::ops::accept_error(out_of_files);
    tracing::warn!(error = %e, "accept failed; retrying shortly");
    if out_of_files {
        set(at_cap, true);
    }
    tokio::time::sleep(if out_of_files {
        RECLAIM_QUIET * 2
    } else {
        Duration::from_millis(500)
    })
    .await;
    set(at_cap, false);
}

/// Sets the cap state, waking the connections only when it changes.
fn set(at_cap: &watch::Sender<bool>, value: bool) {
    at_cap.send_if_modified(|v| std::mem::replace(v, value) != value);
}

/// One accepted connection and what it needs.
struct Conn {
    http: Arc<hyper::server::conn::http1::Builder>,
    router: Router,
    limits: Limits,
    at_cap: watch::Receiver<bool>,
    stop: watch::Receiver<bool>,
}

impl Conn {
    /// Serves the connection to its end and says why it ended (the
    /// `reason` label of `idem_server_connections_closed_total`).
    async fn run(mut self, stream: TcpStream) -> &'static str {
        let tracker = Arc::new(Tracker::new(Instant::now()));
        let io = TokioIo::new(Watched {
            inner: stream,
            tracker: tracker.clone(),
        });
        let service = ConnService {
            router: self.router.clone(),
            tracker: tracker.clone(),
            body_read: self.limits.body_read,
        };
        let mut conn = self.http.serve_connection(io, service);
        let mut at_cap_open = true;
        let mut stopping = false;
        loop {
            let at_cap = *self.at_cap.borrow_and_update();
            let (wake, _) = tracker.check(Instant::now(), &self.limits, at_cap);
            tokio::select! {
                r = &mut conn => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "connection ended with an error");
                        return "error";
                    }
                    return if stopping { "shutdown" } else { "client" };
                }
                () = tokio::time::sleep_until(wake) => {
                    let at_cap = *self.at_cap.borrow();
                    if let (_, Some(reason)) = tracker.check(Instant::now(), &self.limits, at_cap) {
                        tracing::debug!(reason, "closing connection");
                        return closed_label(reason);
                    }
                }
                // A change of the cap state changes the deadlines.
                r = self.at_cap.changed(), if at_cap_open => if r.is_err() {
                    at_cap_open = false;
                },
                r = self.stop.changed(), if !stopping => {
                    stopping = true;
                    if r.is_ok() {
                        // Idle connections close now; one in a request
                        // closes after its answer.
                        std::pin::Pin::new(&mut conn).graceful_shutdown();
                    }
                }
            }
        }
    }
}

/// The metric label of a watchdog's reason to close.
fn closed_label(reason: &str) -> &'static str {
    match reason {
        "header read timeout" => "header_timeout",
        "idle timeout" => "idle_timeout",
        _ => "reclaimed_at_cap",
    }
}

/// What the watchdog knows about one connection.
///
/// The socket and the service only record what happens (a lock and a few
/// stores per read, write and request); they never wake the watchdog. It
/// wakes at its next deadline and at least every header timeout, which is
/// often enough to see a head that started and still cut it on time.
struct Tracker {
    state: Mutex<State>,
}

struct State {
    framing: Framing,
    accepted: Instant,
    last_io: Instant,
    head_started: Option<Instant>,
    handler_ended: Option<Instant>,
    handlers: usize,
    /// Complete heads seen.
    heads: u64,
    /// One entry per complete head not yet served: did it carry both
    /// framing headers?
    conflicts: std::collections::VecDeque<bool>,
}

impl Tracker {
    fn new(now: Instant) -> Self {
        Self {
            state: Mutex::new(State {
                framing: Framing::default(),
                accepted: now,
                last_io: now,
                head_started: None,
                handler_ended: None,
                handlers: 0,
                heads: 0,
                conflicts: std::collections::VecDeque::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Held for bookkeeping only, never across an await; a panic while
        // holding it leaves the data usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self, bytes: &[u8]) {
        let now = Instant::now();
        let mut s = self.lock();
        s.last_io = now;
        let State {
            framing,
            head_started,
            heads,
            conflicts,
            ..
        } = &mut *s;
        framing.feed(bytes, |e| match e {
            Event::HeadStarted => *head_started = Some(now),
            Event::HeadComplete { conflicting } => {
                *head_started = None;
                *heads += 1;
                conflicts.push_back(conflicting);
            }
        });
    }

    fn wrote(&self) {
        self.lock().last_io = Instant::now();
    }

    /// A head was served: is it one with both framing headers?
    fn begin_request(&self) -> bool {
        let mut s = self.lock();
        s.handlers += 1;
        s.conflicts.pop_front().unwrap_or(false)
    }

    fn end_request(&self) {
        let now = Instant::now();
        let mut s = self.lock();
        s.handlers = s.handlers.saturating_sub(1);
        s.handler_ended = Some(now);
        s.last_io = now;
    }

    /// When to look again, and whether a limit is already exceeded; at the
    /// connection cap, being quiet for [`RECLAIM_QUIET`] with nothing in
    /// progress is one too.
    fn check(
        &self,
        now: Instant,
        limits: &Limits,
        at_cap: bool,
    ) -> (Instant, Option<&'static str>) {
        let s = self.lock();
        // Look again within a header timeout whatever happens: a head that
        // starts meanwhile is then seen before its deadline.
        let mut wake = now + limits.header_read.min(limits.idle);
        if s.handlers > 0 {
            // The body deadline and the handler's own bounds apply.
            return (wake, None);
        }
        let head_bytes = s.framing.head_bytes();
        // The head being waited for: a connection's first from accept, a
        // later one from its first byte; never counting time the previous
        // request spent in its handler (a pipelined head waits for it).
        let head_from = if s.heads == 0 {
            Some(s.accepted)
        } else if head_bytes > 0 {
            s.head_started
        } else {
            None
        };
        let head_from = head_from.map(|t| s.handler_ended.map_or(t, |e| t.max(e)));
        if let Some(t) = head_from {
            let deadline = t + limits.header_read;
            if now >= deadline {
                return (now, Some("header read timeout"));
            }
            wake = wake.min(deadline);
        }
        if head_bytes == 0 {
            let deadline = s.last_io + limits.idle;
            if now >= deadline {
                return (now, Some("idle timeout"));
            }
            wake = wake.min(deadline);
            if at_cap {
                let deadline = s.last_io + RECLAIM_QUIET;
                if now >= deadline {
                    return (now, Some("quiet at the connection cap: making room"));
                }
                wake = wake.min(deadline);
            }
        }
        (wake, None)
    }
}

/// The connection's socket, reporting every byte moved to its [`Tracker`].
struct Watched {
    inner: TcpStream,
    tracker: Arc<Tracker>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r
            && buf.filled().len() > before
        {
            self.tracker.read(&buf.filled()[before..]);
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r
            && n > 0
        {
            self.tracker.wrote();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r
            && n > 0
        {
            self.tracker.wrote();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The router, as hyper's service for one connection: counts handlers for
/// the watchdog, refuses ambiguous framing, and puts the body deadline on
/// each request body.
#[derive(Clone)]
struct ConnService {
    router: Router,
    tracker: Arc<Tracker>,
    body_read: Duration,
}

/// Ends a request for the watchdog when dropped (also when the handler's
/// future is dropped unfinished).
struct InRequest(Arc<Tracker>);

impl Drop for InRequest {
    fn drop(&mut self) {
        self.0.end_request();
    }
}

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Self::Error>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let conflicting = self.tracker.begin_request();
        let guard = InRequest(self.tracker.clone());
        if conflicting {
            let mut resp = Error::MalformedBody(
                "the request carries both Content-Length and Transfer-Encoding, which frame its \
                 body differently (RFC 9112, section 6.1): send one of them"
                    .into(),
            )
            .into_response();
            close(&mut resp);
            return Box::pin(async move {
                drop(guard);
                Ok(resp)
            });
        }
        let fired = Arc::new(AtomicBool::new(false));
        let limit = self.body_read;
        let req = req.map(|body| {
            if body.is_end_stream() {
                // No body (most reads): nothing to time.
                Body::new(body)
            } else {
                Body::new(DeadlineBody {
                    inner: body,
                    sleep: Box::pin(tokio::time::sleep(limit)),
                    limit,
                    fired: fired.clone(),
                })
            }
        });
        let router = self.router.clone();
        Box::pin(async move {
            let Ok(mut resp) = router.oneshot(req).await;
            if fired.load(Ordering::Relaxed) {
                // The rest of the body may still be on its way: this
                // connection's framing is lost.
                close(&mut resp);
            }
            drop(guard);
            Ok(resp)
        })
    }
}

fn close(resp: &mut Response<Body>) {
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
}

/// A request body that fails once its deadline has passed.
struct DeadlineBody {
    inner: Incoming,
    sleep: Pin<Box<Sleep>>,
    limit: Duration,
    fired: Arc<AtomicBool>,
}

/// The body did not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0} s of its head (--body-read-timeout-secs)")]
struct BodyTimeout(u64);

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            self.fired.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err(BodyTimeout(self.limit.as_secs()).into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            header_read: Duration::from_secs(10),
            body_read: Duration::from_secs(30),
            idle: Duration::from_secs(60),
            max_connections: 100,
        }
    }

    #[test]
    fn the_watchdog_times_heads_idleness_and_not_handlers() {
        let t0 = Instant::now();
        let l = limits();
        let s = |secs| t0 + Duration::from_secs(secs);
        let t = Tracker::new(t0);
        // A new connection that sends nothing: cut at the header timeout.
        assert_eq!(t.check(s(9), &l, false).1, None);
        assert_eq!(t.check(s(10), &l, false).1, Some("header read timeout"));
        assert_eq!(t.check(s(1), &l, false).0, s(10), "wakes at the deadline");

        let t = Tracker::new(t0);
        t.read(b"GET / HTTP/1.1\r\n\r\n");
        assert!(!t.begin_request());
        // A handler may run past every connection limit.
        assert_eq!(t.check(s(100), &l, false).1, None);
        t.end_request();
        // Then the connection is idle: 60 s of quiet, not 10.
        let ended = Instant::now();
        assert_eq!(t.check(ended + Duration::from_secs(59), &l, false).1, None);
        assert_eq!(
            t.check(ended + Duration::from_secs(60), &l, false).1,
            Some("idle timeout")
        );
        // At the cap, a second of quiet is enough to be closed.
        assert!(t.check(ended + RECLAIM_QUIET, &l, true).1.is_some());
        assert_eq!(t.check(ended, &l, true).1, None);
        let wake = t.check(ended, &l, true).0;
        assert!(
            wake > ended && wake <= ended + RECLAIM_QUIET,
            "wakes to close it"
        );
        // A head that started is held to the header timeout from its first byte.
        t.read(b"GET / HT");
        let first = Instant::now();
        assert_eq!(
            t.check(first + Duration::from_secs(5), &l, true).1,
            None,
            "a head in progress is not closed to make room"
        );
        assert_eq!(t.check(first + Duration::from_secs(9), &l, false).1, None);
        assert_eq!(
            t.check(first + Duration::from_secs(10), &l, false).1,
            Some("header read timeout")
        );
    }

    #[test]
    fn both_framing_headers_reach_the_service_as_a_conflict() {
        let t = Tracker::new(Instant::now());
        t.read(b"GET / HTTP/1.1\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 1\r\n");
        t.read(b"Transfer-Encoding: chunked\r\n\r\n");
        assert!(!t.begin_request(), "the first request is fine");
        t.end_request();
        assert!(t.begin_request(), "the second carries both");
    }

    #[test]
    fn the_default_cap_leaves_room_under_the_open_file_limit() {
        let cap = default_max_connections() as u64;
        if let Some(files) = open_file_limit() {
            assert!(cap < files || cap == 16, "{cap} under {files}");
        }
        assert!((16..=10_000).contains(&cap));
    }
}
