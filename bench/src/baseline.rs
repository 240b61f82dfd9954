//! The baseline server: `POST /v1/transfers` with the same handler, the
//! same authentication and the same business writes in one transaction,
//! but no idempotency layer. It exists only in this crate (`idem-bench
//! serve-baseline`), so no build of `idem-server` has a route without the
//! layer.
//!
//! What it keeps, so that the difference is the layer and nothing else:
//! `idem-server`'s own flags, pool, migrations, seeded accounts, serving
//! code (timeouts, connection cap), bearer authentication, trace layer,
//! profile middleware and logging setup; and the handler runs in one write
//! transaction from the store (on SQLite: the writer gate and `BEGIN
//! IMMEDIATE`), which commits unless the answer is a 5xx, as the layer's
//! would. What it drops: the key lookup, the claim, the stored response,
//! the fingerprint and the body buffering, which is the layer's cost.

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum_idempotency::store::KeyStore;
use axum_idempotency::{IdemTx, Store};
use idem_server::api::{AppState, transfers};

use crate::{Error, Result};

/// The baseline's routes: `POST /v1/transfers` (no layer) and `/healthz`.
pub fn router(state: AppState) -> Router {
    let api = Router::new().route(
        "/v1/transfers",
        post(transfers::create_transfer).route_layer(middleware::from_fn_with_state(
            state.store.clone(),
            one_transaction,
        )),
    );
    let api = idem_server::app::with_auth(api, &state);
    let profile = state.profile;
    Router::new()
        .merge(api)
        .route(
            "/healthz",
            get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
        )
        .with_state(state)
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            idem_server::with_profile(profile, async move { next.run(req).await })
        }))
}

/// Runs the handler inside one store transaction, handed to it as the
/// `IdemTx` it extracts, and commits it (rolls it back on a 5xx).
async fn one_transaction(State(store): State<Store>, mut req: Request, next: Next) -> Response {
    let tx = match store.begin().await {
        Ok(tx) => tx,
        Err(e) => return fail(&e.to_string()),
    };
    let slot = IdemTx::<Store>::new(tx);
    req.extensions_mut().insert(slot.clone());
    let response = next.run(req).await;
    if let Some(tx) = slot.take().await {
        let settled = if response.status().is_server_error() {
            store.rollback(tx).await
        } else {
            store.commit(tx).await
        };
        if let Err(e) = settled {
            return fail(&e.to_string());
        }
    }
    response
}

fn fail(why: &str) -> Response {
    tracing::error!(error = why, "baseline transaction failed");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        "baseline transaction failed",
    )
        .into_response()
}

/// `idem-bench serve-baseline ARGS`: parses `ARGS` as `idem-server` flags,
/// builds the application as `idem-server` does, and serves the baseline
/// routes until Ctrl-C or SIGTERM. Prints the same `listening on` line.
pub async fn serve(args: Vec<String>) -> Result<()> {
    use clap::Parser;
    let cli = idem_server::config::Cli::try_parse_from(
        std::iter::once("idem-server".to_owned()).chain(args),
    )
    .map_err(|e| Error::Setup(e.to_string()))?;
    let app = idem_server::app::build(&cli).await?;
    let listener = tokio::net::TcpListener::bind(&cli.listen)
        .await
        .map_err(|e| Error::Setup(format!("bind {}: {e}", cli.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::Setup(e.to_string()))?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening on http://{addr}");
        let _ = out.flush();
    }
    let router = router(app.state.clone());
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    idem_server::serve::serve(listener, router, cli.connection_limits(), shutdown)
        .await
        .map_err(|e| Error::Setup(format!("serving: {e}")))?;
    app.state.store.close().await;
    Ok(())
}
