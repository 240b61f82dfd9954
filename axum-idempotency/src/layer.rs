//! [`IdempotencyLayer`]: make an axum endpoint idempotent with `.layer(...)`,
//! and [`IdemTx`], the transaction its writes join.
//!
//! The guide (what you write, what you never write, what a 5xx does) is
//! the [crate documentation](crate).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{HeaderName, Request, Response};
use tracing::Instrument;

use crate::engine::Engine;
use crate::request::KeySource;
use crate::store::KeyStore;

pub use crate::tx::IdemTx;

/// A tower [`Layer`](tower::Layer) that makes the wrapped endpoint
/// idempotent. See the [crate docs](crate) for the guide.
#[derive(Debug, Clone)]
pub struct IdempotencyLayer<K: KeyStore> {
    engine: Engine<K>,
    replay_headers: Arc<Vec<HeaderName>>,
    key_source: Option<KeySource>,
}

impl<K: KeyStore> IdempotencyLayer<K> {
    /// A layer running `engine`.
    pub fn new(engine: Engine<K>) -> Self {
        Self {
            engine,
            replay_headers: Arc::new(Vec::new()),
            key_source: None,
        }
    }

    /// Reads the idempotency key from `source` instead of the
    /// `Idempotency-Key` header: a webhook receiver keys on the sender's
    /// event id (`KeySource::Header(HeaderName::from_static("webhook-id"))`,
    /// or `KeySource::BodyPointer("/id".into())`). Scoping (the
    /// [`Caller`](crate::Caller) the route's authentication set) and the
    /// fingerprint apply as to any key.
    pub fn key_source(mut self, source: KeySource) -> Self {
        self.key_source = Some(source);
        self
    }

    /// Declares a per-response header (`Date`, `Set-Cookie`) that replays
    /// should reproduce all the same. Every other header the endpoint sets
    /// is replayed without this; hop-by-hop headers and `Content-Length`
    /// never are (see [`stored_response`](crate::store::stored_response)).
    /// Invalid names are ignored.
    pub fn replay_header(mut self, name: &str) -> Self {
        if let Ok(name) = HeaderName::from_bytes(name.as_bytes()) {
            Arc::make_mut(&mut self.replay_headers).push(name);
        }
        self
    }
}

impl<S, K: KeyStore> tower::Layer<S> for IdempotencyLayer<K> {
    type Service = IdempotencyService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            engine: self.engine.clone(),
            replay_headers: self.replay_headers.clone(),
            key_source: self.key_source.clone(),
        }
    }
}

/// The [`Service`](tower::Service) built by [`IdempotencyLayer`].
#[derive(Debug, Clone)]
pub struct IdempotencyService<S, K: KeyStore> {
    inner: S,
    engine: Engine<K>,
    replay_headers: Arc<Vec<HeaderName>>,
    key_source: Option<KeySource>,
}

impl<S, K> tower::Service<Request<Body>> for IdempotencyService<S, K>
where
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    K: KeyStore,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Readiness of the inner service is awaited inside the future, on
        // the clone that will actually serve the request.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<Body>) -> Self::Future {
        // The engine reads the key where the layer was told it travels.
        if let Some(source) = &self.key_source {
            req.extensions_mut().insert(source.clone());
        }
        let inner = self.inner.clone();
        let engine = self.engine.clone();
        let headers = self.replay_headers.clone();
        // The route template (never the raw path, which may carry ids):
        // axum's router puts it in the extensions before the route runs.
        let route = req
            .extensions()
            .get::<axum::extract::MatchedPath>()
            .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
        let span = crate::metrics::request_span(&route, req.headers(), req.extensions().get());
        Box::pin(async move {
            let started = std::time::Instant::now();
            let response = engine
                .handle(req, inner, &headers)
                .instrument(span.clone())
                .await;
            crate::metrics::finish(&span, &route, started, &response);
            Ok(response)
        })
    }
}
