//! # idem-fake-processor: a fake external payment processor
//!
//! The foreign, non-rollbackable system that the reference server's
//! multi-step payments call (issue 4). It runs as **its own process** with
//! **its own durable state** (a SQLite file in WAL mode), so it outlives a
//! crashed `idem-server` and a crash-recovery test can ask it afterwards how
//! many charges exist and how many calls each key caused.
//!
//! It behaves like a real processor's idempotent API:
//!
//! - `POST /charges` requires an `Idempotency-Key`. The first request with a
//!   key creates the charge (201, or a final 402 when declined); a repeat
//!   with the same body returns the stored charge (200, or the same 402) with
//!   `Idempotent-Replayed: true` and creates nothing; a repeat with another
//!   body is a 409. The claim is one `INSERT ... ON CONFLICT DO NOTHING`.
//! - Every call is counted per key, replays and failures included.
//! - `GET /charges` lists and counts charges with the per-key call counts;
//!   `GET /charges/{id}` reads one; `GET /health` answers readiness probes.
//! - Faults on demand: a `Processor-Behavior` request header
//!   (`decline`, `unavailable`, `slow=MS`, `normal`, comma-separated) for one
//!   request, or `POST /_control` for a period (`for_secs` / `for_calls`),
//!   `DELETE /_control` to reset. See [`Behavior`] and [`ControlRequest`].
//!
//! ## Running it
//!
//! ```sh
//! cargo run -p idem-fake-processor -- --listen 127.0.0.1:0 --db /tmp/processor.db
//! ```
//!
//! It prints one line, `listening on http://127.0.0.1:PORT`, to stdout, so a
//! parent process can learn the port; logs go to stderr (`RUST_LOG`).
//!
//! ## From other crates' tests
//!
//! - [`spawn_in_process`] serves the app on a tokio task, for tests that do
//!   not need a separate process.
//! - As a child process (for tests that kill it): start the binary with
//!   `idem_test_support::ChildServer` (`--listen 127.0.0.1:0 --db PATH`; the
//!   ready line is [`READY_LINE_PREFIX`]), built from another crate's tests
//!   with `idem_test_support::cargo_bin`.
//! - [`ProcessorClient`] is a typed client for tests: create charges, read
//!   the counts, switch faults on and off.
//!
//! It is a test double: the workspace's production builds never link it
//! (the reference server talks to a processor over HTTP with its own
//! client, and depends on this crate only for its tests).

mod client;
mod control;
mod error;
mod model;
mod server;
mod store;

pub use client::{ChargeOutcome, ProcessorClient};
pub use error::Error;
pub use model::{
    BEHAVIOR_HEADER, Behavior, Charge, ChargeList, ChargeRequest, ChargeStatus, ControlMode,
    ControlRequest, ControlState, DECLINE_CODE, Fault, MAX_DELAY_MS,
};
pub use server::{BoundServer, InProcessProcessor, Processor, READY_LINE_PREFIX, spawn_in_process};
