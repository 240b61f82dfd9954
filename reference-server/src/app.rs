//! Wiring: pool + store + clock + engine + routes, and serving them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::handler::Handler;
use axum::middleware::{self, Next};
use axum::routing::{MethodRouter, get, post, post_service};
use axum_idempotency::clock::{AdjustableClock, Clock, SystemClock};
use axum_idempotency::failpoint::Failpoints;
use axum_idempotency::multistep::MultiStepEndpoint;
use axum_idempotency::{Engine, IdempotencyLayer, Store};
use tokio::net::TcpListener;
use tower::Layer;

use crate::api::{AppState, accounts, auth, openapi, payments, test_hooks, transfers};
use crate::config::Cli;
use crate::error::{Error, Result, with_profile};
use crate::processor::Processor;

/// A built application: the router and the state behind it.
#[derive(Debug, Clone)]
pub struct App {
    /// Serve this (or drive it with `tower::ServiceExt::oneshot` in tests).
    pub router: Router,
    /// The shared state (store, clock, engine).
    pub state: AppState,
}

/// Opens the pool, runs the library's migrations and the server's own,
/// seeds the demo accounts of every caller and builds the router.
pub async fn build(cli: &Cli) -> Result<App> {
    // Before anything records: the process-wide Prometheus recorder.
    crate::ops::install();
    let tokens = cli.token_map()?;
    let flaws = cli.flaw_set();
    let config = flaws.engine_config(cli.engine_config()?);
    let store = Store::connect_with(&cli.database_url, &cli.store_options()).await?;
    // The key table first (axum-idempotency keeps its own migration
    // history), then this application's tables with sqlx's migrator.
    store.migrate().await?;
    match &store {
        Store::Sqlite(s) => sqlx::migrate!("./migrations/sqlite").run(s.pool()).await?,
        Store::Postgres(s) => {
            sqlx::migrate!("./migrations/postgres")
                .run(s.pool())
                .await?
        }
        Store::MySql(s) => sqlx::migrate!("./migrations/mysql").run(s.pool()).await?,
        _ => {
            return Err(Error::Config(
                "the reference server has no migrations for this store".into(),
            ));
        }
    }
    accounts::seed(&store, tokens.values().map(String::as_str)).await?;
    let (clock, test_clock): (Arc<dyn Clock>, Option<Arc<AdjustableClock>>) = if cli.test_hooks {
        let c = Arc::new(AdjustableClock::new());
        if cli.test_clock_offset_secs > 0 {
            c.advance(cli.test_clock_offset_secs);
        }
        (c.clone(), Some(c))
    } else {
        (Arc::new(SystemClock), None)
    };
    let mut engine = Engine::new(store.clone(), clock.clone(), config);
    // Failpoints are honoured only with --test-hooks: the opt-in.
    let failpoints = cli.test_hooks.then(|| {
        Arc::new(Failpoints::new(Duration::from_secs(
            cli.failpoint_max_pause_secs,
        )))
    });
    if let Some(f) = &failpoints {
        engine = engine.with_failpoints(f.clone());
    }
    let mut multistep = Vec::new();
    if let Some(url) = &cli.processor_url {
        let processor = Processor::new(url, Duration::from_secs(cli.processor_timeout_secs.max(1)))
            .map_err(|e| Error::Config(format!("processor HTTP client: {e}")))?;
        multistep.push(MultiStepEndpoint::new(
            engine.clone(),
            "POST",
            "/v1/payments",
            payments::Payments::new(processor),
        ));
    }
    let state = AppState {
        store,
        engine,
        clock,
        test_clock,
        failpoints,
        tokens: Arc::new(tokens),
        profile: cli.profile,
        policy: cli.published_policy(),
        multistep: Arc::new(multistep),
        flaws,
    };
    Ok(App {
        router: router(state.clone()),
        state,
    })
}

/// `POST handler`, made idempotent: the engine's layer, declaring
/// `replay_headers` besides Content-Type, Location and ETag (and, in a
/// `flaws` build, the route-level flaws around it). `state` is the
/// handler's state; `app` gives the engine.
pub fn idempotent<H, T, S, R>(
    app: &AppState,
    handler: H,
    state: S,
    replay_headers: &[&str],
) -> MethodRouter<R>
where
    H: Handler<T, S>,
    T: 'static,
    S: Clone + Send + Sync + 'static,
    R: Clone + Send + Sync + 'static,
{
    let mut layer = IdempotencyLayer::new(app.engine.clone());
    for h in replay_headers {
        layer = layer.replay_header(h);
    }
    let handler = handler.with_state(state);
    #[cfg(feature = "flaws")]
    {
        let names: Vec<axum::http::HeaderName> = replay_headers
            .iter()
            .filter_map(|h| axum::http::HeaderName::from_bytes(h.as_bytes()).ok())
            .collect();
        if let Some(flawed) =
            app.flaws
                .wrap_route(app, layer.layer(handler.clone()), handler.clone(), &names)
        {
            return post_service(flawed);
        }
    }
    post_service(layer.layer(handler))
}

/// The idempotent routes' templates, as the engine labels their metrics
/// (registered at zero at start-up, [`crate::ops::install`]).
pub const IDEMPOTENT_ROUTES: &[&str] = &["/v1/transfers", "/v1/payments"];

/// The routes. `POST /v1/transfers` and `POST /v1/payments` are idempotent;
/// reads are not.
pub fn router(state: AppState) -> Router {
    let api = Router::new()
        // ANCHOR: router
        // Single-phase: the engine's layer on the POST route.
        .route(
            "/v1/transfers",
            idempotent(&state, transfers::create_transfer, state.clone(), &[]),
        )
        // Multi-step: the endpoint drives its own key (no layer).
        .route("/v1/payments", post(payments::create_payment))
        // ANCHOR_END: router
        .route("/v1/transfers", get(transfers::list_transfers))
        .route("/v1/transfers/{id}", get(transfers::get_transfer))
        .route("/v1/payments", get(payments::list_payments))
        .route("/v1/payments/{id}", get(payments::get_payment))
        .route("/v1/receipts", get(payments::list_receipts))
        .route("/v1/accounts", get(accounts::list_accounts))
        .route("/v1/accounts/{id}", get(accounts::get_account));
    let api = with_auth(api, &state);
    let doc = Arc::new(openapi::document(state.profile, &state.policy));
    let mut app = Router::new()
        .merge(api)
        // Liveness: the process serves. It stays 200 while the store is
        // down, so an orchestrator does not restart a process that would
        // recover by itself.
        .route(
            "/healthz",
            get(|| async { axum::Json(serde_json::json!({"status": "ok"})) }),
        )
        // Readiness: the store accepts a write (503 upstream_unavailable
        // with Retry-After within the store timeout otherwise: down, full,
        // read-only), so a load balancer sends traffic elsewhere.
        .route("/readyz", get(crate::ops::readyz))
        // Prometheus text (crate::ops): no keys, callers or bodies in it,
        // but keep it off the public internet like any admin endpoint.
        .route("/metrics", get(crate::ops::metrics_text))
        .route(
            "/openapi.json",
            get(move || {
                let doc = doc.clone();
                async move { axum::Json(doc.as_ref().clone()) }
            }),
        );
    if state.test_clock.is_some() {
        app = app
            .route("/_test/clock", post(test_hooks::advance_clock))
            .route("/_test/reap", post(test_hooks::reap))
            .route("/_test/complete", post(test_hooks::complete))
            .route("/_test/enqueue", post(test_hooks::enqueue))
            .route("/_test/failpoints", get(test_hooks::failpoints))
            .route("/_test/failpoints/release", post(test_hooks::release));
    }
    let profile = state.profile;
    #[cfg(feature = "flaws")]
    let app = if state.flaws.on(crate::flaws::Flaw::ReplayDropsHeaders) {
        app.layer(middleware::from_fn(crate::flaws::edge::drop_replay_headers))
    } else {
        app
    };
    app.fallback(|| async { Error::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { Error::MethodNotAllowed })
        .with_state(state)
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            with_profile(profile, async move { next.run(req).await })
        }))
}

/// Puts bearer authentication in front of every route of `routes` (and, in
/// a `flaws` build with `global-keys`, the scope-flattening middleware
/// right after it).
pub fn with_auth<S: Clone + Send + Sync + 'static>(
    routes: Router<S>,
    state: &AppState,
) -> Router<S> {
    #[cfg(feature = "flaws")]
    let routes = if state.flaws.on(crate::flaws::Flaw::GlobalKeys) {
        routes.route_layer(middleware::from_fn(crate::flaws::edge::global_scope))
    } else {
        routes
    };
    routes.route_layer(middleware::from_fn_with_state(
        state.clone(),
        auth::require_bearer,
    ))
}

/// Binds `cli.listen`, prints the machine-readable `listening on` line and
/// the curl examples, starts the background jobs (reaper, completer,
/// enqueuer), and serves until Ctrl-C.
pub async fn serve(cli: Cli) -> Result<()> {
    let app = build(&cli).await?;
    if cli.test_hooks {
        tracing::warn!(
            "TEST HOOKS ARE ON: /_test/* routes move the server clock, delete keys and run jobs \
             without authentication, and the Idem-Failpoint header can abort this process. \
             Never run this in production."
        );
    }
    if !app.state.flaws.list().is_empty() {
        tracing::warn!(flaws = ?app.state.flaws.list(), "DELIBERATE FLAWS ARE ON: this server breaks the contract on purpose");
    }
    let limits = cli.connection_limits();
    tracing::info!(
        header_read_timeout_secs = limits.header_read.as_secs(),
        body_read_timeout_secs = limits.body_read.as_secs(),
        idle_timeout_secs = limits.idle.as_secs(),
        max_client_connections = limits.max_connections,
        open_file_limit = crate::serve::open_file_limit(),
        "connection limits"
    );
    let listener = TcpListener::bind(&cli.listen).await?;
    let addr = listener.local_addr()?;
    announce(addr, &cli, &app.state);
    let s = &app.state;
    let reaper = tokio::spawn(axum_idempotency::reaper::run(
        s.store.clone(),
        s.clock.clone(),
        Duration::from_secs(cli.reaper_interval_secs),
    ));
    let completer = tokio::spawn(axum_idempotency::jobs::run_completer(
        s.store.clone(),
        s.clock.clone(),
        s.multistep.clone(),
        Duration::from_millis(cli.completer_interval_ms),
    ));
    let upkeep = tokio::spawn(crate::ops::upkeep());
    let enqueuer = tokio::spawn(axum_idempotency::jobs::run_enqueuer(
        s.store.clone(),
        payments::Receipts::new(s.clock.clone()),
        Duration::from_millis(cli.enqueuer_interval_ms),
    ));
    tracing::info!(
        reaper_interval_secs = cli.reaper_interval_secs,
        completer_interval_ms = cli.completer_interval_ms,
        enqueuer_interval_ms = cli.enqueuer_interval_ms,
        processor = cli
            .processor_url
            .as_deref()
            .unwrap_or("(none: /v1/payments answers 503)"),
        "background jobs started"
    );
    let result = crate::serve::serve(listener, app.router, limits, shutdown_signal()).await;
    reaper.abort();
    completer.abort();
    enqueuer.abort();
    upkeep.abort();
    app.state.store.close().await;
    result.map_err(Error::Io)
}
/// Ctrl-C, or SIGTERM (what `systemctl stop`, `docker stop` and
/// Kubernetes send): stop accepting and let requests in progress finish.
async fn shutdown_signal() {
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
    tracing::info!("shutting down: no new connections; requests in progress may finish");
}

fn announce(addr: SocketAddr, cli: &Cli, state: &AppState) {
    use std::io::Write;
    let base = format!("http://{addr}");
    let mut out = std::io::stdout().lock();
    // The first line is the contract with child-process users: keep its shape.
    let _ = writeln!(out, "listening on {base}");
    let tokens: Vec<_> = state.tokens.iter().collect();
    // Demo tokens are public by design; configured ones are secrets and are
    // never printed.
    let demo = tokens.len() == crate::config::DEMO_TOKENS.len()
        && crate::config::DEMO_TOKENS
            .iter()
            .all(|(t, c)| state.tokens.get(*t).map(String::as_str) == Some(*c));
    let _ = writeln!(
        out,
        "idem-server: {} store ({}), profile {}, replay window {} s, retention {} s",
        state.store.backend(),
        redact(&cli.database_url),
        cli.profile,
        cli.replay_window_secs,
        cli.retention_secs
    );
    for (token, caller) in &tokens {
        let shown = if demo {
            token.as_str()
        } else {
            "<token from your configuration>"
        };
        let _ = writeln!(out, "  caller {caller}: Authorization: Bearer {shown}");
    }
    if let Some((token, caller)) = tokens.first() {
        let token = if demo { token.as_str() } else { "$TOKEN" };
        let _ = writeln!(
            out,
            "\nTry it (run the POST twice: the second answer is a replay, and the balance moves once):\n\
             \n  curl -s {base}/v1/accounts -H 'Authorization: Bearer {token}'\
             \n  curl -si {base}/v1/transfers -H 'Authorization: Bearer {token}' \\\
             \n       -H 'Idempotency-Key: demo-1' -H 'Content-Type: application/json' \\\
             \n       -d '{{\"from\":\"acc_{caller}_main\",\"to\":\"acc_{caller}_savings\",\"amount\":500}}'\
             \n  curl -s {base}/v1/transfers -H 'Authorization: Bearer {token}'\
             \n  curl -s {base}/openapi.json\n"
        );
        if cli.processor_url.is_some() {
            let _ = writeln!(
                out,
                "A multi-step payment through the processor (also safe to run twice):\n\
                 \n  curl -si {base}/v1/payments -H 'Authorization: Bearer {token}' \\\
                 \n       -H 'Idempotency-Key: pay-1' -H 'Content-Type: application/json' \\\
                 \n       -d '{{\"amount\":1250,\"currency\":\"usd\",\"source\":\"tok_visa\"}}'\n"
            );
        }
    }
    let _ = out.flush();
}

fn redact(url: &str) -> String {
    // postgres://user:password@host → postgres://user:***@host
    match (url.find("://"), url.find('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}
