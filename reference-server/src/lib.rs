//! # idem-server: the idemkit reference server
//!
//! An axum + tokio service implementing the reference profile of the
//! Idempotency-Key contract on SQLite (default) or PostgreSQL, and the
//! template a team forks for its own endpoints.
//!
//! - [`layer`]: [`IdempotencyLayer`], the one thing an endpoint adopts
//!   (its docs are the guide for adding an endpoint).
//! - [`engine`]: claim, replay, wait, settle.
//! - [`store`]: the [`KeyStore`](store::KeyStore) trait and the SQLite /
//!   PostgreSQL store.
//! - [`api`]: the example bank (`POST /v1/transfers`, accounts, transfers),
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
//! `--max-body-bytes`, `--max-connections`, `--test-hooks`, and with the
//! `flaws` feature `--flaw NAME` (see [`flaws::Flaw`]).
//!
//! ## The HTTP surface
//!
//! | Route | Auth | What |
//! |---|---|---|
//! | `POST /v1/transfers` | bearer | idempotent; `{"from","to","amount","memo"?}` → 201 |
//! | `GET /v1/transfers[?memo=M]` | bearer | the caller's transfers and their `count` |
//! | `GET /v1/transfers/{id}`, `GET /v1/accounts[/{id}]` | bearer | reads |
//! | `GET /healthz` | none | 200 when serving |
//! | `GET /openapi.json` | none | the document, with `x-idempotency` |
//! | `POST /_test/clock` `{"advance_secs":N}`, `POST /_test/reap` | none | only with `--test-hooks` |
//!
//! Every demo caller `C` owns `acc_C_main` and `acc_C_savings`, seeded with
//! 100000 minor units each at first start.

pub mod api;
pub mod app;
pub mod clock;
pub mod config;
pub mod engine;
mod error;
pub mod flaws;
pub mod layer;
pub mod reaper;
pub mod store;

pub use error::{Error, Result, current_profile, with_profile};
pub use layer::{Caller, IdemTx, IdempotencyLayer};
