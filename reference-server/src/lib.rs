//! # idem-server: the idemkit reference server
//!
//! An axum + tokio service implementing the reference profile of the
//! Idempotency-Key contract on SQLite (default) or PostgreSQL, and the
//! template a team forks for its own endpoints.
//!
//! - [`layer`]: [`IdempotencyLayer`], the one thing a single-phase endpoint
//!   adopts (its docs are the guide for adding an endpoint).
//! - [`multistep`]: [`MultiStep`](multistep::MultiStep) and
//!   [`MultiStepEndpoint`](multistep::MultiStepEndpoint), for endpoints that
//!   call a foreign system: atomic phases, recovery points, fenced commits,
//!   resume (its docs are the guide, with `POST /v1/payments` as example).
//! - [`engine`]: claim, replay, wait, settle, take over expired leases.
//! - [`store`]: the [`KeyStore`](store::KeyStore) trait and the SQLite /
//!   PostgreSQL store; [`store::phases`]: phase commits, takeover, release.
//! - [`jobs`]: the completer and the enqueuer; [`reaper`]: retention.
//! - [`failpoint`]: `Idem-Failpoint: crash-after=...` (test hooks only).
//! - [`api`]: the example bank (`POST /v1/transfers`, accounts, transfers),
//!   payments (`POST /v1/payments` through an external processor, receipts),
//!   `GET /openapi.json`, and the `--test-hooks` routes.
//! - [`config`]: the command line, [`app`]: wiring and serving.
//!
//! ## Running it
//!
//! `cargo run -p idem-server` serves `http://127.0.0.1:8080` on `./idem.db`
//! with two demo callers (tokens `demo-alice` and `demo-bob`). The first
//! line on stdout is machine-readable: `listening on http://ADDR`; with
//! `--listen 127.0.0.1:0` the OS picks the port and that line tells it.
//! Flags (`--help` lists them all): `--listen`, `--database-url`,
//! `--profile`, `--token TOKEN=CALLER`, `--tokens-file`,
//! `--replay-window-secs`, `--retention-secs`, `--lease-secs`,
//! `--retry-after-secs`, `--max-wait-secs`, `--reaper-interval-secs`,
//! `--enqueuer-interval-ms`, `--completer-interval-ms`, `--processor-url`,
//! `--processor-timeout-secs`, `--failpoint-max-pause-secs`,
//! `--max-body-bytes`, `--max-connections`, `--test-hooks`, and with the
//! `flaws` feature `--flaw NAME` (see [`flaws::Flaw`]).
//!
//! Payments need a processor:
//!
//! ```sh
//! cargo run -p idem-fake-processor -- --listen 127.0.0.1:9090 --db processor.db &
//! cargo run -p idem-server -- --processor-url http://127.0.0.1:9090
//! ```
//!
//! Without `--processor-url`, `POST /v1/payments` answers 503
//! `upstream_unavailable` saying so, and touches no key.
//!
//! ## The HTTP surface
//!
//! | Route | Auth | What |
//! |---|---|---|
//! | `POST /v1/transfers` | bearer | idempotent; `{"from","to","amount","memo"?}` → 201 |
//! | `GET /v1/transfers[?memo=M]` | bearer | the caller's transfers and their `count` |
//! | `GET /v1/transfers/{id}`, `GET /v1/accounts[/{id}]` | bearer | reads |
//! | `POST /v1/payments` | bearer | idempotent, multi-step; `{"amount","currency","source"?,"description"?}` → 201, 402 declined, 503 processor unavailable |
//! | `GET /v1/payments[?idempotency_key=K]`, `GET /v1/payments/{id}` | bearer | payments and their `status` |
//! | `GET /v1/receipts` | bearer | receipt jobs the enqueuer delivered |
//! | `GET /healthz` | none | 200 when serving |
//! | `GET /openapi.json` | none | the document, with `x-idempotency` |
//! | `POST /_test/clock` `{"advance_secs":N}`, `POST /_test/reap`, `POST /_test/complete`, `POST /_test/enqueue` | none | only with `--test-hooks` |
//! | `GET /_test/failpoints`, `POST /_test/failpoints/release` | none | only with `--test-hooks` |
//!
//! With `--test-hooks`, the `Idem-Failpoint` request header crashes or
//! pauses a multi-step request at a named point (see [`failpoint`]).
//!
//! Every demo caller `C` owns `acc_C_main` and `acc_C_savings`, seeded with
//! 100000 minor units each at first start.

pub mod api;
pub mod app;
pub mod clock;
pub mod config;
pub mod engine;
mod error;
pub mod failpoint;
pub mod flaws;
pub mod jobs;
pub mod layer;
pub mod multistep;
pub mod reaper;
pub mod store;

pub use error::{Error, Result, current_profile, with_profile};
pub use layer::{Caller, IdemTx, IdempotencyLayer};
