//! # axum-idempotency: `Idempotency-Key` for axum, on your own sqlx pool
//!
//! Add one layer to a route and a retried `POST` has one effect: the first
//! request with a key executes, a duplicate gets the stored answer replayed
//! byte for byte (`Idempotent-Replayed: true`), a duplicate that arrives
//! while the original still runs gets `409` (or waits, with
//! `Prefer: wait=N`), and the same key on a different request is a `409`
//! mismatch, never a silent replay. The key table lives in *your* database,
//! next to your tables, and the claim, your writes and the stored response
//! commit in *one* transaction: there is no moment at which one happened and
//! the other did not. This is the reference implementation of the idemkit
//! contract (the book's clauses are cited throughout as `idem.*`).
//!
//! ## What you write
//!
//! ```
//! use axum::{Json, Router, http::StatusCode, routing::post};
//! use axum_idempotency::{Caller, Engine, EngineConfig, IdemTx, IdempotencyLayer, SqliteStore};
//! use axum_idempotency::clock::SystemClock;
//! use std::sync::Arc;
//!
//! /// Credits the caller's account. Duplicates never reach this function.
//! async fn add_credit(
//!     tx: IdemTx<SqliteStore>,
//!     caller: Caller,
//!     Json(amount): Json<i64>,
//! ) -> Result<(StatusCode, Json<i64>), axum_idempotency::Error> {
//!     let mut tx = tx.lock().await?;
//!     sqlx::query("INSERT INTO credits (owner, amount) VALUES ($1, $2)")
//!         .bind(caller.as_str())
//!         .bind(amount)
//!         .execute(&mut **tx)
//!         .await?;
//!     Ok((StatusCode::CREATED, Json(amount)))
//! }
//!
//! # async fn build() -> Result<Router, Box<dyn std::error::Error>> {
//! let pool = sqlx::SqlitePool::connect("sqlite::memory:").await?; // your pool
//! let store = SqliteStore::new(pool.clone());
//! store.migrate().await?; // the key table, next to yours
//! sqlx::query("CREATE TABLE credits (owner TEXT, amount BIGINT)").execute(&pool).await?;
//!
//! let engine = Engine::new(store, Arc::new(SystemClock), EngineConfig::default());
//! let app = Router::new()
//!     .route("/credits", post(add_credit).layer(IdempotencyLayer::new(engine)));
//! // ...and, outside it, your authentication, inserting a `Caller`.
//! # Ok(app) }
//! # tokio::runtime::Runtime::new()?.block_on(build()).map(|_| ()).map_err(|e| e.to_string())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! 1. **A store on your pool**: [`SqliteStore`] on a `SqlitePool`
//!    ([`SqliteStore::open`] opens a file with the tested settings),
//!    [`PgStore`] on a `PgPool` (many processes on one database), or
//!    [`Store`] to choose at run time. Run its [`migrate`](SqliteStore::migrate)
//!    at start, beside your own migrations ([`migrate`] says why it does not
//!    share sqlx's history table).
//! 2. **The handler, written as if duplicates did not exist.** Take an
//!    [`IdemTx`] and do *every* database write of the endpoint through it.
//!    Do not commit: the engine commits your writes and the stored response
//!    together, or rolls both back.
//! 3. **The layer on the route's method router** (`post(handler).layer(..)`),
//!    so only the state-changing method requires a key. A replay carries
//!    every header your handler set except hop-by-hop ones,
//!    `Content-Length` (recomputed) and the per-response `Date` and
//!    `Set-Cookie`; declare those two with
//!    [`IdempotencyLayer::replay_header`] if a replay must carry them (see
//!    [`stored_response`](store::stored_response)).
//! 4. **Authentication outside it** that inserts a [`Caller`] extension:
//!    keys are scoped to the caller (clause `idem.scope.caller`). Without a
//!    `Caller` the layer answers 401.
//!
//! ## What you never write
//!
//! Reading the `Idempotency-Key` header, checking the fingerprint, answering
//! 409, waiting for `Prefer: wait`, replaying, setting
//! `Idempotent-Replayed`, locking rows to stop two duplicates: the engine
//! does all of it before and after your handler, and your handler only ever
//! runs for a request that holds the key.
//!
//! ## What your status codes mean
//!
//! - **2xx and 4xx are final**: stored and replayed for the replay window
//!   (24 h by default; [`EngineConfig`]). So answer a 4xx for anything the
//!   client must change.
//! - **A 5xx is never stored**: your writes roll back with the claim, the key
//!   is free again, and the client may retry with the same key (clause
//!   `idem.failure.5xx-not-stored`). So let transient failures (`?` on a
//!   database error) become a 500.
//! - Rejections before the claim (no key, a malformed key, a body over the
//!   limit) touch nothing: the key is not consumed.
//!
//! ## When the endpoint calls another system
//!
//! A charge at a payment processor cannot join your transaction. Such an
//! endpoint is a [`multistep::MultiStep`]: atomic phases with a recovery
//! point committed after each, an outbound key derived from the caller's,
//! leases with fencing, and the [completer](jobs) that finishes requests
//! whose client went away. The [reaper] deletes keys past retention (72 h):
//! spawn [`reaper::run`] once at start, or the key table only grows.
//!
//! ## Cargo features
//!
//! `sqlite` ([`SqliteStore`]) and `postgres` ([`PgStore`]), both on by
//! default, and `mysql` (`MySqlStore`, MySQL 8.0+ and MariaDB 10.6+), off
//! by default; an application on one database turns the others off
//! (`default-features = false, features = ["mysql"]`) and does not compile
//! their sqlx drivers. [`Store`], which chooses at run time from the URL,
//! has a variant for each store that is on.
//!
//! Every store checks at start ([`Store::migrate`]) that its claim really
//! excludes on the database it got, and refuses to run
//! ([`Error::ClaimUnsafe`]) when it does not. Adding a store is one module
//! and one line: see the `store` module's seam (`store/seam.rs`, "Adding a
//! store").
//!
//! ## What a request holds while your handler runs
//!
//! - **SQLite**: nothing until the handler's first
//!   [`IdemTx::lock`]; from then until the engine commits, SQLite's one
//!   writer (every other write of the application waits for it, at most
//!   the store timeout, then `503`). So lock where you first write, after
//!   any slow work (a call to another service, a computation).
//! - **PostgreSQL**: one pooled connection and the key's advisory lock for
//!   the request's whole life (that lock is what tells other processes the
//!   key is in flight), so size the pool for the requests you run at once.
//! - **MySQL / MariaDB**: one pooled connection and the key's uncommitted
//!   in-flight row (its row lock tells other processes the key is in
//!   flight), inserted before the handler runs; the pool runs READ
//!   COMMITTED with a 1 s lock wait (`MySqlStore::SESSION_SQL`).
//! - An endpoint whose write must come *before* slow work is a
//!   [`multistep::MultiStep`]: each phase commits on its own.
//! ## Operating it
//!
//! The engine emits through the [`metrics`](::metrics) facade (install any
//! exporter; without one the calls cost nothing) and runs each request in
//! an `idem.request` tracing span carrying a hash of the key, never the
//! key. The metrics ([`metrics`] has units, labels and meaning):
//!
//! - `idem_requests_total{route,outcome}` and
//!   `idem_request_duration_seconds{route,outcome}`: requests by
//!   [`Outcome`](metrics::Outcome) (`executed`, `replayed`, `in_flight`,
//!   `mismatch`, `key_missing`, `key_invalid`, `store_unavailable`,
//!   `server_error_released`, `fenced`, `rejected`);
//! - `idem_store_operation_duration_seconds{operation}` (observe, lookup,
//!   claim, record_final, write_fenced, take_over) and
//!   `idem_store_errors_total{kind}`;
//! - `idem_fence_lost_total` (the duplicate side-effect alarm, zero by
//!   design) and `idem_takeovers_total`;
//! - `idem_completer_resumptions_total{result}`,
//!   `idem_completer_passes_total{result}`, `idem_orphaned_keys` and
//!   `idem_orphaned_key_oldest_age_seconds` (the orphaned-key measurement,
//!   taken by the completer's loop after each pass);
//! - `idem_reaper_deleted_total`, `idem_reaper_unfinished_deleted_total`,
//!   `idem_reaper_passes_total{result}` and
//!   `idem_reaper_expired_oldest_age_seconds` (taken by the reaper's loop).
//!
//! Call [`metrics::describe`] once after installing the exporter, and
//! [`metrics::describe_route`] for each idempotent route template, so
//! every counter an alert takes a rate of is exported at zero before its
//! first increment. The
//! `otel` feature (off by default) re-exports `tracing-opentelemetry` for
//! turning the spans into OpenTelemetry spans.
//!
//! ## Layout
//!
//! The engine's modules form a chain, each using only those before it:
//! [`decide`] (pure) → `request` (reading a request) → `registry` (this
//! process's in-flight keys) → [`engine`] (the observe / decide / act loop
//! and the `Route` trait its two routes implement) → `settle` (storing a
//! final response, releasing a key) → `single` (the
//! [`IdempotencyLayer`]'s route) and [`multistep`] (phases) → [`layer`].
//!
//! - [`layer`]: [`IdempotencyLayer`] and [`IdemTx`];
//! - [`engine`]: [`Engine`] and its loop; [`decide`]: the pure decision it
//!   asks on every turn;
//! - [`store`]: the [`KeyStore`](store::KeyStore) trait and the SQLite /
//!   PostgreSQL stores; [`migrate`]: their tables;
//! - [`multistep`]: phases, recovery points, fencing;
//! - [`jobs`]: completer and enqueuer; [`reaper`]: retention;
//! - [`key`]: [`Caller`], [`KeyId`], [`Fence`]; [`clock`]: where time comes
//!   from; [`failpoint`]: crash/pause/fail hooks for tests, off unless the
//!   application opts in ([`Engine::with_failpoints`]);
//! - [`error`]: [`Error`], and how it becomes problem+json;
//! - [`metrics`]: the metrics and the per-request span (the list is below).

pub mod clock;
mod config;
pub mod decide;
pub mod engine;
pub mod error;
pub mod failpoint;
pub mod jobs;
pub mod key;
pub mod layer;
pub mod metrics;
pub mod migrate;
pub mod multistep;
pub mod reaper;
mod registry;
mod request;
mod settle;
mod single;
pub mod store;
mod tx;

pub use engine::{Engine, EngineConfig};
pub use error::{Error, Result, StoreFault};
pub use idem_spec::{Fingerprint, IdempotencyKey, RecoveryPoint};
pub use key::{Caller, Fence, KeyId};
pub use layer::{IdemTx, IdempotencyLayer, IdempotencyService};
pub use request::{KeySource, RequestDeadline};
#[cfg(feature = "mysql")]
pub use store::MySqlStore;
#[cfg(feature = "postgres")]
pub use store::PgStore;
#[cfg(feature = "sqlite")]
pub use store::SqliteStore;
pub use store::Store;
pub use store::{SqliteSync, StoreOptions};
