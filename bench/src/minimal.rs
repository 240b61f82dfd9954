//! The minimal app (issue 19): a small axum application built on
//! `axum-idempotency` the way its README and `examples/idempotent-notes`
//! wire it, served by `idem-bench serve-minimal -- ARGS` as a child process.
//!
//! It is what a new user writes, not the reference server: one pool from
//! [`Store::connect_with`] (a SQLite file with the recommended options, or
//! PostgreSQL), the key table migrated beside the app's `notes` table, an
//! authentication middleware that inserts a [`Caller`] from `x-user`, and
//! plain `axum::serve`. Routes, all `POST` with a JSON body
//! `{"text": "..."}`:
//!
//! | Route | Layer | Handler |
//! |---|---|---|
//! | `/idem/write` | yes | `tx.lock()`, one `INSERT` through the transaction |
//! | `/idem/none` | yes | writes nothing (never locks the transaction) |
//! | `/idem/slow` | yes | sleeps `--sleep-ms` *before* its first `tx.lock()`, then the same `INSERT` |
//! | `/plain/write` | no | the same `INSERT` on the pool (autocommit) |
//! | `/plain/none` | no | writes nothing |
//! | `/plain/slow` | no | sleeps, then the same `INSERT` on the pool |
//!
//! Every handler answers `201` with a small JSON body. With
//! `--stage-times` the process also records where a request's time goes
//! per tracing span ([`StageTimes`]) and serves the totals at
//! `GET /_bench/stages`: the engine's stage spans (`idem.observe`,
//! `idem.endpoint`, `idem.begin`, `idem.record`, as they land in the
//! library) and this app's own `minimal.request` (the whole request, from
//! the authentication middleware in) and `minimal.handler` (the handler).
//!
//! `--synchronous full` (SQLite only, issue 33) builds the same pool from
//! the library's public halves, [`SqliteStore::recommended_options`] and
//! [`SqliteStore::pool_options`], with `synchronous = FULL` (a flush per
//! commit) instead of the recommended `NORMAL`. `GET /_bench/settings`
//! answers the durability settings a pool connection actually has.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use axum_idempotency::clock::SystemClock;
use axum_idempotency::{
    Caller, Engine, EngineConfig, IdemTx, IdempotencyLayer, SqliteStore, Store, StoreOptions,
};
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use crate::{Error, Result};

/// `idem-bench serve-minimal` flags.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "serve-minimal")]
pub struct MinimalArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// `sqlite://PATH` or `postgres://...`.
    #[arg(long)]
    pub database_url: String,
    /// Pool size.
    #[arg(long, default_value_t = 10)]
    pub max_connections: u32,
    /// What `/idem/slow` and `/plain/slow` spend before their write, ms.
    #[arg(long, default_value_t = 200)]
    pub sleep_ms: u64,
    /// Record time per tracing span and serve it at `GET /_bench/stages`.
    #[arg(long)]
    pub stage_times: bool,
    /// SQLite's `synchronous` setting for every connection of the pool.
    #[arg(long, value_enum, default_value_t = Synchronous::Normal)]
    pub synchronous: Synchronous,
}

/// SQLite's `synchronous` pragma, as the minimal app may set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Synchronous {
    /// The library's recommended setting in WAL mode: a commit survives a
    /// crash of the process, the last ones may be lost on power loss.
    Normal,
    /// A flush of the WAL per commit: a commit survives power loss.
    Full,
}

/// The pool: `Store::connect_with` as the README says, or with
/// `--synchronous full` the same two halves it applies, FULL instead of
/// NORMAL (the library offers no option for it, only these halves).
async fn connect(args: &MinimalArgs) -> Result<Store> {
    let options = StoreOptions::default().max_connections(args.max_connections);
    let url = &args.database_url;
    let setup = |e: axum_idempotency::Error| Error::Setup(format!("connecting to {url}: {e}"));
    if args.synchronous == Synchronous::Normal {
        return Store::connect_with(url, &options).await.map_err(setup);
    }
    if !url.starts_with("sqlite:") {
        return Err(Error::Setup(format!(
            "--synchronous full is a SQLite setting, not for {url}"
        )));
    }
    let connect = SqliteStore::recommended_options(url)
        .map_err(setup)?
        .synchronous(sqlx::sqlite::SqliteSynchronous::Full)
        .busy_timeout(options.acquire_timeout);
    let pool = SqliteStore::pool_options(options.acquire_timeout)
        .max_connections(options.max_connections.max(1))
        .connect_with(connect)
        .await?;
    Ok(Store::Sqlite(SqliteStore::new(pool)))
}

/// The durability settings of one pool connection, as a line of the report
/// (SQLite: `journal_mode` and `synchronous`, read back, not assumed).
async fn settings(store: &Store) -> std::result::Result<String, axum_idempotency::Error> {
    let Store::Sqlite(s) = store else {
        return Ok(format!("{}: read from the server", store.backend()));
    };
    let mut c = s.pool().acquire().await?;
    let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *c)
        .await?;
    let level: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *c)
        .await?;
    let name = match level {
        0 => "OFF",
        1 => "NORMAL",
        2 => "FULL",
        3 => "EXTRA",
        _ => "unknown",
    };
    Ok(format!("journal_mode = {journal}, synchronous = {name}"))
}

#[derive(Clone)]
struct App {
    store: Store,
    sleep: Duration,
}

#[derive(Deserialize)]
struct NewNote {
    text: String,
}

#[derive(Serialize)]
struct Note {
    id: i64,
    text: String,
}

type Answer = std::result::Result<(StatusCode, Json<Note>), axum_idempotency::Error>;

async fn insert_in(
    tx: &IdemTx<Store>,
    caller: &Caller,
    text: &str,
) -> Result<i64, axum_idempotency::Error> {
    let mut tx = tx.lock().await?;
    let id: i64 = axum_idempotency::with_conn!(&mut *tx, c => {
        if axum_idempotency::store::is_mysql(&*c) {
            // No RETURNING: the id of the connection's last insert.
            sqlx::query("INSERT INTO notes (owner, text) VALUES (?, ?)")
                .bind(caller.as_str())
                .bind(text)
                .execute(&mut *c)
                .await?;
            sqlx::query_scalar("SELECT CAST(LAST_INSERT_ID() AS SIGNED)")
                .fetch_one(&mut *c)
                .await?
        } else {
            sqlx::query_scalar("INSERT INTO notes (owner, text) VALUES ($1, $2) RETURNING id")
                .bind(caller.as_str())
                .bind(text)
                .fetch_one(&mut *c)
                .await?
        }
    });
    Ok(id)
}

async fn insert_plain(
    store: &Store,
    caller: &Caller,
    text: &str,
) -> Result<i64, axum_idempotency::Error> {
    let id: i64 = axum_idempotency::with_pool!(store, p => {
        if axum_idempotency::store::is_mysql(p) {
            // LAST_INSERT_ID() is per connection: both on one.
            let mut c = p.acquire().await?;
            sqlx::query("INSERT INTO notes (owner, text) VALUES (?, ?)")
                .bind(caller.as_str())
                .bind(text)
                .execute(&mut *c)
                .await?;
            sqlx::query_scalar("SELECT CAST(LAST_INSERT_ID() AS SIGNED)")
                .fetch_one(&mut *c)
                .await?
        } else {
            sqlx::query_scalar("INSERT INTO notes (owner, text) VALUES ($1, $2) RETURNING id")
                .bind(caller.as_str())
                .bind(text)
                .fetch_one(p)
                .await?
        }
    });
    Ok(id)
}

fn created(id: i64, text: String) -> Answer {
    Ok((StatusCode::CREATED, Json(Note { id, text })))
}

async fn idem_write(tx: IdemTx<Store>, caller: Caller, Json(new): Json<NewNote>) -> Answer {
    async {
        let id = insert_in(&tx, &caller, &new.text).await?;
        created(id, new.text)
    }
    .instrument(tracing::info_span!("minimal.handler"))
    .await
}

async fn idem_slow(
    State(app): State<App>,
    tx: IdemTx<Store>,
    caller: Caller,
    Json(new): Json<NewNote>,
) -> Answer {
    async {
        // The work before the first write (a call to another service, a
        // computation): it must hold nothing another key needs.
        tokio::time::sleep(app.sleep).await;
        let id = insert_in(&tx, &caller, &new.text).await?;
        created(id, new.text)
    }
    .instrument(tracing::info_span!("minimal.handler"))
    .await
}

async fn none(Json(new): Json<NewNote>) -> Answer {
    async { created(0, new.text) }
        .instrument(tracing::info_span!("minimal.handler"))
        .await
}

async fn plain_write(State(app): State<App>, caller: Caller, Json(new): Json<NewNote>) -> Answer {
    async {
        let id = insert_plain(&app.store, &caller, &new.text).await?;
        created(id, new.text)
    }
    .instrument(tracing::info_span!("minimal.handler"))
    .await
}

async fn plain_slow(State(app): State<App>, caller: Caller, Json(new): Json<NewNote>) -> Answer {
    async {
        tokio::time::sleep(app.sleep).await;
        let id = insert_plain(&app.store, &caller, &new.text).await?;
        created(id, new.text)
    }
    .instrument(tracing::info_span!("minimal.handler"))
    .await
}

/// Stand-in authentication, as in the example: `x-user` names the caller.
/// It is the outermost layer, so `minimal.request` spans the whole request.
async fn auth(mut req: Request, next: Next) -> Response {
    let span = tracing::info_span!("minimal.request");
    match req.headers().get("x-user").and_then(|v| v.to_str().ok()) {
        Some(user) => {
            let caller = Caller::new(user);
            req.extensions_mut().insert(caller);
            next.run(req).instrument(span).await
        }
        None => StatusCode::UNAUTHORIZED.into_response(),
    }
}

/// Opens the pool, migrates (the key table beside `notes`) and builds the
/// routes. `stages` adds `GET /_bench/stages`.
pub async fn app(args: &MinimalArgs, stages: Option<StageTimes>) -> Result<(Router, Store)> {
    let store = connect(args).await?;
    store
        .migrate()
        .await
        .map_err(|e| Error::Setup(format!("migrating: {e}")))?;
    let ddl = match store.backend() {
        "postgres" => {
            "CREATE TABLE IF NOT EXISTS notes (id BIGSERIAL PRIMARY KEY, owner TEXT NOT NULL, text TEXT NOT NULL)"
        }
        "mysql" => {
            "CREATE TABLE IF NOT EXISTS notes (id BIGINT AUTO_INCREMENT PRIMARY KEY, owner TEXT NOT NULL, text TEXT NOT NULL)"
        }
        _ => {
            "CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, text TEXT NOT NULL)"
        }
    };
    axum_idempotency::with_pool!(&store, p => {
        sqlx::query(ddl).execute(p).await?;
    });
    let engine = Engine::new(
        store.clone(),
        Arc::new(SystemClock),
        EngineConfig::default(),
    );
    let layer = || IdempotencyLayer::new(engine.clone());
    let state = App {
        store: store.clone(),
        sleep: Duration::from_millis(args.sleep_ms),
    };
    let mut router = Router::new()
        .route("/idem/write", post(idem_write).layer(layer()))
        .route("/idem/none", post(none).layer(layer()))
        .route("/idem/slow", post(idem_slow).layer(layer()))
        .route("/plain/write", post(plain_write))
        .route("/plain/none", post(none))
        .route("/plain/slow", post(plain_slow))
        .layer(middleware::from_fn(auth))
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/_bench/settings",
            get(|State(app): State<App>| async move {
                settings(&app.store)
                    .await
                    .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
            }),
        )
        .with_state(state);
    if let Some(stages) = stages {
        router = router.route(
            "/_bench/stages",
            get(move || {
                let s = stages.clone();
                async move { Json(s.totals()) }
            }),
        );
    }
    Ok((router, store))
}

/// `idem-bench serve-minimal ARGS`: serves the minimal app until Ctrl-C,
/// printing `listening on http://ADDR` first.
pub async fn serve(args: MinimalArgs, stages: Option<StageTimes>) -> Result<()> {
    let (router, store) = app(&args, stages).await?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| Error::Setup(format!("bind {}: {e}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::Setup(e.to_string()))?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening on http://{addr}");
        let _ = out.flush();
    }
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| Error::Setup(format!("serving: {e}")))?;
    store.close().await;
    Ok(())
}

/// Time spent in one span name, summed over every span of that name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StageTotal {
    /// Spans closed.
    pub count: u64,
    /// From creation to close (includes waiting: a queue, a lock, I/O), ns.
    pub wall_ns: u64,
    /// While entered, i.e. polled on a thread (roughly: CPU), ns.
    pub busy_ns: u64,
}

/// A `tracing_subscriber::Layer` summing time per span name, for the span
/// names starting with `idem.` or `minimal.` (pair it with
/// [`StageTimes::filter`]). Cheap enough for a benchmark pass of its own:
/// two clock reads per poll of a stage and one map update per span.
#[derive(Debug, Clone, Default)]
pub struct StageTimes {
    totals: Arc<Mutex<BTreeMap<&'static str, StageTotal>>>,
}

/// Per span: when it was created, when it was last entered, busy so far.
struct Timing {
    created: Instant,
    entered: Option<Instant>,
    busy: Duration,
}

/// Whether a span name is one [`StageTimes`] records.
pub fn is_stage(name: &str) -> bool {
    name.starts_with("idem.") || name.starts_with("minimal.")
}

impl StageTimes {
    /// The totals so far.
    pub fn totals(&self) -> BTreeMap<String, StageTotal> {
        self.totals
            .lock()
            .map(|m| m.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect())
            .unwrap_or_default()
    }

    /// The per-layer filter that enables exactly the stage spans, at any
    /// level, whatever the log filter says.
    pub fn filter<S>() -> impl tracing_subscriber::layer::Filter<S> {
        tracing_subscriber::filter::filter_fn(|m| m.is_span() && is_stage(m.name()))
    }
}

impl<S> tracing_subscriber::Layer<S> for StageTimes
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, _: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Timing {
                created: Instant::now(),
                entered: None,
                busy: Duration::ZERO,
            });
        }
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(t) = span.extensions_mut().get_mut::<Timing>()
        {
            t.entered = Some(Instant::now());
        }
    }

    fn on_exit(&self, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(t) = span.extensions_mut().get_mut::<Timing>()
            && let Some(at) = t.entered.take()
        {
            t.busy += at.elapsed();
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let name = span.name();
        let Some(t) = span.extensions_mut().remove::<Timing>() else {
            return;
        };
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        if let Ok(mut m) = self.totals.lock() {
            let e = m.entry(name).or_default();
            e.count += 1;
            e.wall_ns += ns(t.created.elapsed());
            e.busy_ns += ns(t.busy);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn stage_times_sum_per_name_and_skip_other_spans() {
        let stages = StageTimes::default();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::Layer::with_filter(stages.clone(), StageTimes::filter()),
        );
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..3 {
                let s = tracing::debug_span!("idem.observe");
                let _g = s.enter();
                std::thread::sleep(Duration::from_millis(2));
            }
            let _other = tracing::info_span!("sqlx.query").entered();
        });
        let t = stages.totals();
        assert_eq!(t.keys().collect::<Vec<_>>(), ["idem.observe"]);
        let o = t["idem.observe"];
        assert_eq!(o.count, 3);
        assert!(o.busy_ns >= 6_000_000 && o.wall_ns >= o.busy_ns, "{o:?}");
    }
}
