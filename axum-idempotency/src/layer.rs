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
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderName, Request, Response};
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};

use crate::engine::Engine;
use crate::error::Error;
use crate::store::KeyStore;

/// The transaction of the request's claim, which the endpoint's writes join.
///
/// Extract it in the handler and [`lock`](IdemTx::lock) it for the
/// transaction: a `sqlx::Transaction<'static, Postgres>` for [`PgStore`],
/// a [`SqliteTx`] for [`SqliteStore`] (both deref to the connection: run
/// queries on `&mut **tx`), a [`DbTx`] for [`Store`] (use
/// [`with_conn!`](crate::with_conn)). Never commit it yourself: the engine
/// commits your writes with the stored response, or rolls both back.
///
/// **Call `lock` where you first write, not earlier.** On SQLite the
/// transaction is opened by the first `lock` (`BEGIN IMMEDIATE`, SQLite's
/// one writer) and held until the engine commits it with the stored
/// response: work the handler does before its first `lock` (a call to
/// another service, a computation) runs concurrently with every other
/// request, while work done between `lock` and the end of the handler
/// holds the writer, and every other first execution of the application
/// waits for it (bounded by the store timeout, then `503`). On PostgreSQL
/// the transaction is already open (it holds the key's advisory lock, so
/// other processes see the key in flight) and holds one pool connection
/// for the request's whole life. An endpoint whose write must come before
/// slow work is a [`MultiStep`](crate::multistep::MultiStep): each phase
/// commits on its own.
///
/// [`PgStore`]: crate::PgStore
/// [`SqliteStore`]: crate::SqliteStore
/// [`SqliteTx`]: crate::store::SqliteTx
/// [`Store`]: crate::Store
/// [`DbTx`]: crate::store::DbTx
pub struct IdemTx<K: KeyStore>(Arc<Mutex<Slot<K>>>);

/// Where the request's transaction stands.
enum Slot<K: KeyStore> {
    /// Not opened yet: the first [`IdemTx::lock`] opens it on this store.
    Deferred(K),
    /// Open: the endpoint's writes go here.
    Open(K::Tx),
    /// Handed back to the engine (or never to be opened again).
    Settled,
}

/// What the engine finds in an [`IdemTx`] once the endpoint has returned.
pub(crate) enum Finished<Tx> {
    /// The transaction the endpoint wrote in.
    Open(Tx),
    /// The endpoint never asked for a transaction: it wrote nothing.
    Unopened,
    /// Taken already (the endpoint kept or consumed it).
    Gone,
}

impl<K: KeyStore> Clone for IdemTx<K> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<K: KeyStore> std::fmt::Debug for IdemTx<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdemTx")
    }
}

impl<K: KeyStore> IdemTx<K> {
    /// Wraps an open `tx` for a handler. The engine does this for every
    /// claimed request on a store that opens the claim's transaction up
    /// front; code that runs a handler some other way (a test, a
    /// deliberately naive wrapper) may too.
    pub fn new(tx: K::Tx) -> Self {
        Self(Arc::new(Mutex::new(Slot::Open(tx))))
    }

    /// A transaction opened on `store` by the first [`lock`](IdemTx::lock).
    pub(crate) fn deferred(store: K) -> Self {
        Self(Arc::new(Mutex::new(Slot::Deferred(store))))
    }

    /// Exclusive access to the transaction for the duration of the guard,
    /// opening it first if this is the request's first `lock` (see the
    /// type's docs for what that holds). Fails with the store's error (a
    /// `503` when it is unavailable or its writer is busy past the store
    /// timeout) when it cannot be opened.
    pub async fn lock(&self) -> Result<MappedMutexGuard<'_, K::Tx>, Error> {
        let mut slot = self.0.lock().await;
        if let Slot::Deferred(store) = &*slot {
            let tx = store.begin().await?;
            *slot = Slot::Open(tx);
        }
        MutexGuard::try_map(slot, |s| match s {
            Slot::Open(tx) => Some(tx),
            Slot::Deferred(_) | Slot::Settled => None,
        })
        .map_err(|_| Error::Internal("the idempotency transaction was already settled".into()))
    }

    /// Takes the transaction back if it is open (the engine does this when
    /// the handler returns); `None` if it was never opened or was taken
    /// already. Either way no later [`lock`](IdemTx::lock) opens one.
    pub async fn take(&self) -> Option<K::Tx> {
        match self.finish().await {
            Finished::Open(tx) => Some(tx),
            Finished::Unopened | Finished::Gone => None,
        }
    }

    /// Takes the transaction back, saying whether it was ever opened.
    pub(crate) async fn finish(&self) -> Finished<K::Tx> {
        match std::mem::replace(&mut *self.0.lock().await, Slot::Settled) {
            Slot::Open(tx) => Finished::Open(tx),
            Slot::Deferred(_) => Finished::Unopened,
            Slot::Settled => Finished::Gone,
        }
    }
}

impl<S: Send + Sync, K: KeyStore> FromRequestParts<S> for IdemTx<K> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Error> {
        parts.extensions.get::<IdemTx<K>>().cloned().ok_or_else(|| {
            Error::Internal(
                "this handler takes an IdemTx but its route has no IdempotencyLayer (or a layer on another store type)".into(),
            )
        })
    }
}

/// A tower [`Layer`](tower::Layer) that makes the wrapped endpoint
/// idempotent. See the [crate docs](crate) for the guide.
#[derive(Debug, Clone)]
pub struct IdempotencyLayer<K: KeyStore> {
    engine: Engine<K>,
    replay_headers: Arc<Vec<HeaderName>>,
}

impl<K: KeyStore> IdempotencyLayer<K> {
    /// A layer running `engine`.
    pub fn new(engine: Engine<K>) -> Self {
        Self {
            engine,
            replay_headers: Arc::new(Vec::new()),
        }
    }

    /// Declares one more response header that replays reproduce, besides
    /// Content-Type, Location and ETag. Invalid names are ignored.
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
        }
    }
}

/// The [`Service`](tower::Service) built by [`IdempotencyLayer`].
#[derive(Debug, Clone)]
pub struct IdempotencyService<S, K: KeyStore> {
    inner: S,
    engine: Engine<K>,
    replay_headers: Arc<Vec<HeaderName>>,
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

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let engine = self.engine.clone();
        let headers = self.replay_headers.clone();
        Box::pin(async move { Ok(engine.handle(req, inner, &headers).await) })
    }
}
