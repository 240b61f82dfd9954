//! # idem-server: the idemkit reference server
//!
//! An application built on [`axum_idempotency`]: an example bank whose
//! `POST /v1/transfers` (one transaction) and `POST /v1/payments`
//! (multi-step, through an external payment processor) keep the
//! Idempotency-Key contract, on SQLite (default), PostgreSQL or MySQL/MariaDB. It is the
//! template a team copies: the engine is the library, and what is here is
//! what every application writes for itself.
//!
//! - [`api`]: the example endpoints (transfers, accounts, payments,
//!   receipts), bearer authentication, `GET /openapi.json`, and the
//!   `--test-hooks` routes;
//! - [`processor`]: this server's HTTP client of the payment processor;
//! - [`config`]: the command line; [`app`]: wiring; [`serve`]: HTTP/1.1
//!   with header, body and idle timeouts and a connection cap;
//! - [`Error`]: the one error type and its problem+json rendering;
//! - [`flaws`]: deliberately broken variants (the `flaws` feature only),
//!   kept at the edge of the engine.
//!
//! ## Running it
//!
//! `cargo run -p idem-server` serves `http://127.0.0.1:8080` on `./idem.db`
//! with two demo callers (tokens `demo-alice` and `demo-bob`). The first
//! line on stdout is machine-readable: `listening on http://ADDR`; with
//! `--listen 127.0.0.1:0` the OS picks the port and that line tells it.
//! Flags (`--help` lists them all): `--listen`, `--database-url`,
//! `--profile`, `--token TOKEN=CALLER` (visible in `ps`: prefer
//! `--tokens-file` or the `IDEM_TOKENS` environment variable), `--tokens-file`,
//! the connection limits `--header-read-timeout-secs` (10),
//! `--body-read-timeout-secs` (30), `--idle-timeout-secs` (60) and
//! `--max-client-connections` (see [`serve`]),
//! `--write-openapi PATH`,
//! the store bounds `--store-timeout-ms` (2000: longest wait for a
//! database connection or SQLite's write lock, past which a request is
//! answered 503 `upstream_unavailable` with `Retry-After`) and
//! `--statement-timeout-ms` (5000, PostgreSQL), `--sqlite-synchronous
//! normal|full` (how SQLite flushes a commit; `full` survives a power
//! loss),
//! `--replay-window-secs`, `--retention-secs`, `--lease-secs` (10; a live
//! multi-step request renews its lease every third of it),
//! `--retry-after-secs`, `--max-wait-secs`, `--reaper-interval-secs`,
//! `--enqueuer-interval-ms`, `--completer-interval-ms`, `--processor-url`,
//! `--processor-timeout-secs`, `--failpoint-max-pause-secs`,
//! `--max-body-bytes`, `--max-connections`, `--test-hooks`, and with the
//! `flaws` feature `--flaw NAME` (see [`flaws::Flaw`]).
//!
//! A database created by an `idem-server` from before the engine became a
//! library (`axum-idempotency`) has a different migration history: start
//! on a fresh database file or schema.
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
//! | `GET /v1/transfers[?memo=M]` | bearer | a page of the caller's transfers (`limit`, `cursor`; [`api::page`]) and the `count` matching |
//! | `GET /v1/transfers/{id}`, `GET /v1/accounts[/{id}]` | bearer | reads |
//! | `POST /v1/payments` | bearer | idempotent, multi-step; `{"amount","currency","source"?,"description"?}` → 201, 402 declined, 503 processor unavailable |
//! | `GET /v1/payments[?idempotency_key=K][&description=D]`, `GET /v1/payments/{id}` | bearer | payments (a page at a time) and their `status` |
//! | `GET /v1/receipts` | bearer | receipt jobs the enqueuer delivered (a page at a time) |
//! | `GET /healthz` | none | liveness: 200 while the process serves, store outage or not |
//! | `GET /readyz` | none | readiness: 200 when the store answers, 503 `upstream_unavailable` with `Retry-After` when it does not |
//! | `GET /openapi.json` | none | the document, with `x-idempotency` |
//! | `POST /_test/clock` `{"advance_secs":N}`, `POST /_test/reap`, `POST /_test/complete`, `POST /_test/enqueue` | none | only with `--test-hooks` |
//! | `GET /_test/failpoints`, `POST /_test/failpoints/release` | none | only with `--test-hooks` |
//!
//! With `--test-hooks`, the `Idem-Failpoint` request header crashes or
//! pauses a request at a named point (`axum_idempotency::failpoint`; the
//! payment's own points are listed in [`api::payments`]).
//!
//! Every demo caller `C` owns `acc_C_main` and `acc_C_savings`, seeded with
//! 100000 minor units each at first start.

pub mod api;
pub mod app;
pub mod config;
mod error;
pub mod flaws;
pub mod ops;
pub mod processor;
pub mod serve;

pub use error::{Error, Result, current_profile, with_profile};
