//! Response bodies, for the middleware: reading a small problem document without losing the
//! body, and holding the body handed back to the deadline of the attempt that produced it.
//!
//! Both rebuild the `reqwest::Response` around a wrapping body. Status, version, headers,
//! extensions and URL are carried over, so the caller sees the response the server sent.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use reqwest::header::CONTENT_TYPE;
use reqwest::{Response, ResponseBuilderExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The largest body read to find a problem's `code` and `retryable`. Problem documents are
/// tiny; a body larger than this is not one, and it is handed on unread.
pub(crate) const MAX_PROBLEM_BODY: usize = 64 * 1024;

/// The members of a problem document the policy reads.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ProblemFacts {
    pub(crate) code: Option<String>,
    pub(crate) retryable: Option<bool>,
}

/// Reads `resp`'s body, if it is JSON and at most [`MAX_PROBLEM_BODY`] bytes, for its `code` and
/// `retryable` members, and hands back an equivalent response whose body replays every byte
/// read (followed by the unread rest, or by the read error, if any), and whether that body is
/// now entirely in memory.
pub(crate) async fn read_problem(resp: Response) -> (ProblemFacts, Response, bool) {
    let is_json = resp
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.contains("json"));
    let too_big = resp
        .content_length()
        .is_some_and(|n| n > MAX_PROBLEM_BODY as u64);
    if !is_json || too_big {
        return (ProblemFacts::default(), resp, false);
    }
    let url = resp.url().clone();
    let (parts, mut body) = http::Response::<reqwest::Body>::from(resp).into_parts();
    let mut frames = VecDeque::new();
    let mut data = Vec::new();
    // Bounded: stops at the end of the body, at an error, or past the size cap.
    let rest = loop {
        match std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            None => break Rest::Done,
            Some(Err(e)) => break Rest::Failed(Some(e.into())),
            Some(Ok(frame)) => {
                if let Some(chunk) = frame.data_ref() {
                    data.extend_from_slice(chunk);
                }
                frames.push_back(frame);
                if data.len() > MAX_PROBLEM_BODY {
                    break Rest::Body(body);
                }
            }
        }
    };
    let complete = matches!(rest, Rest::Done);
    let facts = if complete {
        parse_problem(&data)
    } else {
        ProblemFacts::default()
    };
    let replay = Replay { frames, rest };
    (
        facts,
        rebuild(parts, url, reqwest::Body::wrap(replay)),
        complete,
    )
}

fn parse_problem(body: &[u8]) -> ProblemFacts {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return ProblemFacts::default();
    };
    ProblemFacts {
        code: value
            .get("code")
            .and_then(|c| c.as_str())
            .map(str::to_owned),
        retryable: value.get("retryable").and_then(serde_json::Value::as_bool),
    }
}

/// Makes reading `resp`'s body fail with a timeout once `deadline` passes, like reqwest's own
/// per-request timeout (which also covers the body). `timeout` is only used in the message.
pub(crate) fn with_deadline(
    resp: Response,
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> Response {
    let url = resp.url().clone();
    let (parts, body) = http::Response::<reqwest::Body>::from(resp).into_parts();
    if body.is_end_stream() {
        return rebuild(parts, url, body);
    }
    let bounded = DeadlineBody {
        inner: body,
        sleep: Box::pin(tokio::time::sleep_until(deadline)),
        timeout,
    };
    rebuild(parts, url, reqwest::Body::wrap(bounded))
}

fn rebuild(parts: http::response::Parts, url: reqwest::Url, body: reqwest::Body) -> Response {
    let mut builder = http::Response::builder()
        .status(parts.status)
        .version(parts.version)
        .url(url);
    if let Some(headers) = builder.headers_mut() {
        *headers = parts.headers;
    }
    if let Some(extensions) = builder.extensions_mut() {
        extensions.extend(parts.extensions);
    }
    match builder.body(body) {
        Ok(r) => Response::from(r),
        // The parts came from a valid response, so this cannot fail; stay panic-free anyway.
        Err(_) => Response::from(http::Response::new(reqwest::Body::from(Vec::<u8>::new()))),
    }
}

enum Rest {
    /// The body continues here.
    Body(reqwest::Body),
    /// Reading failed; the error is handed on once, after the bytes read before it.
    Failed(Option<BoxError>),
    /// The body ended.
    Done,
}

/// The frames already read, then the rest of the original body.
struct Replay {
    frames: VecDeque<Frame<Bytes>>,
    rest: Rest,
}

impl HttpBody for Replay {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(frame) = this.frames.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        match &mut this.rest {
            Rest::Body(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(Into::into))),
            Rest::Failed(e) => Poll::Ready(e.take().map(Err)),
            Rest::Done => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
            && match &self.rest {
                Rest::Body(b) => b.is_end_stream(),
                Rest::Failed(e) => e.is_none(),
                Rest::Done => true,
            }
    }

    fn size_hint(&self) -> SizeHint {
        let read: u64 = self
            .frames
            .iter()
            .filter_map(Frame::data_ref)
            .map(|d| d.len() as u64)
            .sum();
        match &self.rest {
            Rest::Body(b) => {
                let rest = b.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(read.saturating_add(rest.lower()));
                if let Some(upper) = rest.upper() {
                    hint.set_upper(read.saturating_add(upper));
                }
                hint
            }
            Rest::Failed(_) => SizeHint::with_exact(read),
            Rest::Done => SizeHint::with_exact(read),
        }
    }
}

/// A body that fails with [`std::io::ErrorKind::TimedOut`] once its deadline passes.
struct DeadlineBody {
    inner: reqwest::Body,
    sleep: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.sleep.as_mut().poll(cx).is_ready() {
            let e = std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the response body was not read within the attempt's {:?}",
                    this.timeout
                ),
            );
            return Poll::Ready(Some(Err(e.into())));
        }
        Pin::new(&mut this.inner)
            .poll_frame(cx)
            .map(|f| f.map(|r| r.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
