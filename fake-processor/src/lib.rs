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
//! - [`ProcessorChild::spawn`] starts the binary as a child process and
//!   waits (bounded) for its port; [`ProcessorChild::kill`] is a `kill -9`.
//! - [`spawn_in_process`] serves the same app on a tokio task, for tests
//!   that do not need a separate process.
//! - [`ProcessorClient`] is a typed client: create charges, read the
//!   counts, switch faults on and off.
//! - [`binary`] finds (building it if needed) the binary to pass to
//!   [`ProcessorChild::spawn`] from another crate's tests.
//!
//! A crash-recovery test, in outline:
//!
//! ```no_run
//! # async fn gate() -> Result<(), idem_fake_processor::Error> {
//! use idem_fake_processor::{ProcessorChild, binary};
//!
//! let bin = tokio::task::spawn_blocking(binary).await.expect("join")?;
//! let processor = ProcessorChild::spawn(&bin, "/tmp/gate/processor.db").await?;
//! // Start the server under test with processor.base_url(), send a payment,
//! // crash the server, restart it, retry with the same key; then:
//! let state = processor.client().charges().await?;
//! assert_eq!(state.count, 1, "exactly one charge");
//! assert!(state.calls_for("outbound-key") <= 2, "at most one repeated call");
//! # Ok(()) }
//! ```

mod child;
mod client;
mod control;
mod error;
mod model;
mod server;
mod store;

pub use child::{BINARY_ENV, DEFAULT_START_TIMEOUT, ProcessorChild, binary, spawn_child};
pub use client::{ChargeOutcome, ProcessorClient};
pub use error::Error;
pub use model::{
    BEHAVIOR_HEADER, Behavior, Charge, ChargeList, ChargeRequest, ChargeStatus, ControlMode,
    ControlRequest, ControlState, DECLINE_CODE, Fault, MAX_DELAY_MS,
};
pub use server::{BoundServer, InProcessProcessor, Processor, READY_LINE_PREFIX, spawn_in_process};
