#![doc = include_str!("../README.md")]

mod config;
mod server;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use config::{Defect, Dialect, Quirk, ZooConfig};
pub use server::{Gate, MAX_BODY};

/// The `amount` that makes the handler fail with 500 after its claim,
/// committing nothing (a manifest's `server_error_body`).
pub const SERVER_ERROR_AMOUNT: i64 = 500;

/// Any `amount` below zero is refused with a final 422 after the claim,
/// stored and replayed (a manifest's `rejected_body`); this is one such value.
pub const REJECTED_AMOUNT: i64 = -1;

/// The status of the body-triggered rejection, in every dialect.
pub const REJECTED_STATUS: u16 = 422;

/// The callers the zoo knows: (name, `Authorization` header value).
pub const CALLERS: [(&str, &str); 2] = [("alice", "Bearer zoo-alice"), ("bob", "Bearer zoo-bob")];

/// The idempotent endpoint's path.
pub const ORDERS_PATH: &str = "/v1/orders";

/// The execution-count probe's path (add `?marker=M` or `?idempotency_key=K`).
pub const EXECUTIONS_PATH: &str = "/_zoo/executions";

/// The failpoint header a test manifest may declare (`hooks.failpoint`):
/// with the value [`PAUSE_VALUE`], a request is held in flight after its
/// claim until `POST` [`RELEASE_PATH`] (or [`GATE_LIMIT_SECS`]).
pub const FAILPOINT_HEADER: &str = "Zoo-Failpoint";

/// The failpoint value that holds a request in flight.
pub const PAUSE_VALUE: &str = "pause";

/// `POST` here releases every paused request.
pub const RELEASE_PATH: &str = "/_zoo/release";

/// The longest any held request waits before going on by itself.
pub const GATE_LIMIT_SECS: u64 = 30;

/// The one error type of `idem-zoo`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The listening socket could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why the operating system refused.
        source: std::io::Error,
    },
    /// A dialect or defect name that does not exist.
    #[error("unknown {what} {name:?}; known: {known}")]
    UnknownName {
        /// `dialect` or `defect`.
        what: &'static str,
        /// The name given.
        name: String,
        /// The names that exist, comma-separated.
        known: String,
    },
}

/// How long [`Zoo::shutdown`] lets in-flight requests finish before it
/// stops the server outright.
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(10);

/// A running zoo server. Dropping it asks the server to stop (in-flight
/// requests finish in the background); [`Zoo::shutdown`] also waits.
pub struct Zoo {
    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub base_url: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Zoo {
    /// Stops accepting requests, waits (bounded) for in-flight ones, and
    /// returns once the server task has ended.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(SHUTDOWN_LIMIT, &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
    }
}

impl Drop for Zoo {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The zoo's routes, for in-process use (e.g. `tower::ServiceExt::oneshot`).
pub fn router(config: ZooConfig) -> axum::Router {
    server::build(config, None)
}

/// The zoo's routes with a [`Gate`] that holds every handler run until the
/// test releases it.
pub fn router_with_gate(config: ZooConfig, gate: Gate) -> axum::Router {
    server::build(config, Some(gate))
}

/// Starts a zoo on `127.0.0.1` with a free port.
pub async fn spawn(config: ZooConfig) -> Result<Zoo, Error> {
    spawn_at(config, SocketAddr::from(([127, 0, 0, 1], 0))).await
}

/// Starts a zoo on `127.0.0.1` with a free port and a [`Gate`].
pub async fn spawn_with_gate(config: ZooConfig, gate: Gate) -> Result<Zoo, Error> {
    serve(
        router_with_gate(config, gate),
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .await
}

/// Starts a zoo listening on `addr` (port 0 picks a free one).
pub async fn spawn_at(config: ZooConfig, addr: SocketAddr) -> Result<Zoo, Error> {
    if config.quirk == Some(Quirk::ResetAfterServerError) {
        return serve_resetting(router(config), addr).await;
    }
    serve(router(config), addr).await
}

/// Serves HTTP/1 connections itself so that a connection that carried a 500
/// serves nothing more: the next request on it is read and the connection
/// closed without an answer (and the 500 said nothing about closing). This
/// is the `reset-after-server-error` quirk; a client that reuses the pooled
/// connection gets no response.
async fn serve_resetting(app: axum::Router, addr: SocketAddr) -> Result<Zoo, Error> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tower::ServiceExt;

    let bind = |source| Error::Bind { addr, source };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(bind)?;
    let local = listener.local_addr().map_err(bind)?;
    let (stop, mut stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = &mut stopped => break,
                a = listener.accept() => a,
            };
            let Ok((stream, _)) = accepted else { continue };
            let app = app.clone();
            tokio::spawn(async move {
                let spent = Arc::new(AtomicBool::new(false));
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let (app, spent) = (app.clone(), spent.clone());
                        async move {
                            if spent.load(Ordering::SeqCst) {
                                return Err(std::io::Error::other(
                                    "this connection served a 500: closed without an answer",
                                ));
                            }
                            let response = match app.oneshot(req.map(axum::body::Body::new)).await {
                                Ok(r) => r,
                                Err(never) => match never {},
                            };
                            if response.status().is_server_error() {
                                spent.store(true, Ordering::SeqCst);
                            }
                            Ok(response)
                        }
                    },
                );
                let io = hyper_util::rt::TokioIo::new(stream);
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await
                {
                    tracing::debug!("zoo connection ended: {e}");
                }
            });
        }
    });
    tracing::info!("zoo listening on http://{local} (connections close after a 500)");
    Ok(Zoo {
        base_url: format!("http://{local}"),
        stop: Some(stop),
        task: Some(task),
    })
}

async fn serve(app: axum::Router, addr: SocketAddr) -> Result<Zoo, Error> {
    let bind = |source| Error::Bind { addr, source };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(bind)?;
    let local = listener.local_addr().map_err(bind)?;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await;
        if let Err(e) = served {
            tracing::error!("zoo server on {local} failed: {e}");
        }
    });
    tracing::info!("zoo listening on http://{local}");
    Ok(Zoo {
        base_url: format!("http://{local}"),
        stop: Some(stop),
        task: Some(task),
    })
}
