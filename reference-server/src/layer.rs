//! `IdempotencyLayer`: make an axum endpoint idempotent with `.layer(...)`.
//!
//! # Adding an idempotent endpoint (the guide)
//!
//! 1. Write the handler as if duplicates did not exist. Take an [`IdemTx`]
//!    argument and do **every** database write of the endpoint through it.
//!    Do not commit: the layer commits your writes and the stored response
//!    in one transaction, or rolls both back.
//! 2. Return your outcome. 2xx and 4xx responses are final: they are stored
//!    and replayed byte for byte (status, body, `Content-Type`, `Location`,
//!    `ETag`, and any header you declare with
//!    [`IdempotencyLayer::replay_header`]). A 5xx is never stored: your
//!    writes are rolled back with the claim and the client may retry with the
//!    same key. So return a 4xx for anything the client must change, and let
//!    transient failures (`?` on a database error) become a 500.
//! 3. Put the layer on the route's *method* router, so only the
//!    state-changing method requires a key:
//!    `post(handler).layer(idempotency.clone())`.
//! 4. Put an authentication layer outside it that inserts a [`Caller`]
//!    extension: keys are scoped to the caller. Without a `Caller` the layer
//!    answers 401.
//!
//! What you never write: reading the `Idempotency-Key` header, checking the
//! fingerprint, answering 409, waiting for `Prefer: wait`, replaying,
//! setting `Idempotent-Replayed`. The layer does all of it before and after
//! your handler runs; your handler only ever runs for a request that holds
//! the key.
//!
//! Side effects outside the database (emails, calls to other services)
//! cannot join the transaction: if the endpoint has any, it is a multi-step
//! endpoint and needs recovery points, not this single-phase pattern.
//!
//! ```
//! use axum::{Json, Router, http::StatusCode, routing::post};
//! use idem_server::{Caller, Error, IdemTx, IdempotencyLayer, with_conn};
//! use idem_server::engine::{Engine, EngineConfig};
//! use idem_server::store::Store;
//! use std::sync::Arc;
//!
//! /// Credits a caller's account. Duplicates never reach this function.
//! async fn add_credit(
//!     tx: IdemTx,
//!     caller: Caller,
//!     Json(amount): Json<i64>,
//! ) -> Result<(StatusCode, Json<i64>), Error> {
//!     if amount <= 0 {
//!         // A 4xx is final: stored and replayed like a success.
//!         return Err(Error::Validation("amount must be positive".into()));
//!     }
//!     let mut tx = tx.lock().await?;
//!     let rows = with_conn!(&mut *tx, c => {
//!         sqlx::query("UPDATE accounts SET balance = balance + $1 WHERE owner = $2")
//!             .bind(amount)
//!             .bind(&caller.0)
//!             .execute(&mut *c)
//!             .await?
//!             .rows_affected()
//!     });
//!     Ok((StatusCode::CREATED, Json(i64::try_from(rows).unwrap_or(0))))
//! }
//!
//! # async fn build() -> Result<(), Error> {
//! let store = Store::connect("sqlite::memory:", 1).await?; // migrates too
//! let engine = Engine::new(store, Arc::new(idem_server::clock::SystemClock), EngineConfig::default());
//! let idempotency = IdempotencyLayer::new(engine).replay_header("x-credit-id");
//! let app: Router = Router::new().route("/v1/credits", post(add_credit).layer(idempotency));
//! // ...then add your authentication layer (inserting `Caller`) outside it.
//! # let _ = app; Ok(()) }
//! # tokio::runtime::Runtime::new().map_err(Error::Io).and_then(|rt| rt.block_on(build())).map_err(|e| e.to_string()).unwrap();
//! ```

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
use crate::store::{DbTx, KeyStore};

/// The authenticated caller: the first half of every key's scope.
///
/// Your authentication layer inserts it into the request extensions; it is
/// also an extractor for handlers (401 when missing).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Error> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or(Error::Unauthenticated("send Authorization: Bearer <token>"))
    }
}

/// The transaction of the request's claim, which the endpoint's writes join.
///
/// Extract it in the handler and call [`lock`](IdemTx::lock) to get the
/// transaction; run SQL on it with [`with_conn!`](crate::with_conn). Never
/// commit it yourself.
pub struct IdemTx<T = DbTx>(Arc<Mutex<Option<T>>>);

impl<T> Clone for IdemTx<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> std::fmt::Debug for IdemTx<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdemTx")
    }
}

impl<T: Send + 'static> IdemTx<T> {
    pub(crate) fn new(tx: T) -> Self {
        Self(Arc::new(Mutex::new(Some(tx))))
    }

    /// Exclusive access to the transaction for the duration of the guard.
    pub async fn lock(&self) -> Result<MappedMutexGuard<'_, T>, Error> {
        MutexGuard::try_map(self.0.lock().await, Option::as_mut)
            .map_err(|_| Error::Internal("the idempotency transaction was already settled".into()))
    }

    /// Takes the transaction back (the engine does this when the handler
    /// returns).
    pub(crate) async fn take(&self) -> Option<T> {
        self.0.lock().await.take()
    }
}

impl<S: Send + Sync, T: Send + 'static> FromRequestParts<S> for IdemTx<T> {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Error> {
        parts.extensions.get::<IdemTx<T>>().cloned().ok_or_else(|| {
            Error::Internal(
                "this handler takes an IdemTx but its route has no IdempotencyLayer".into(),
            )
        })
    }
}

/// A tower [`Layer`](tower::Layer) that makes the wrapped endpoint
/// idempotent. See the [module docs](self) for the guide.
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
