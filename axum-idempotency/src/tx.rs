//! [`IdemTx`]: the transaction a single-phase request's writes join, opened
//! when the handler first asks for it.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};
use tracing::Instrument;

use crate::error::Error;
use crate::store::KeyStore;

/// The transaction of the request's claim, which the endpoint's writes join.
///
/// Extract it in the handler and [`lock`](IdemTx::lock) it for the
/// transaction: a [`PgTx`] for [`PgStore`],
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
/// [`PgTx`]: crate::store::PgTx
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
            // On SQLite this is where a single-phase request waits for the
            // one writer: its claim latency.
            let tx = crate::metrics::timed(crate::metrics::Stage::Claim, store.begin())
                .instrument(tracing::trace_span!("idem.begin"))
                .await?;
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
