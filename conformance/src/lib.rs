//! # idem-conformance: check any HTTP API against the idempotency contract
//!
//! The kit speaks HTTP only (reqwest) and never links a server's code, so
//! it judges any vendor's API the same way it judges the reference server.
//! A run reads a target [`manifest`], checks it against the target
//! ([`runner::preflight`]: no case runs on a manifest that does not fit),
//! executes every [`cases`] case (each citing the clauses it checks), runs
//! a generated [`model`]-checked property phase, and renders one
//! [`idem_spec::report::Report`] to the console, JSON, JUnit XML and a
//! self-contained HTML page.
//!
//! ## Behaviour, spelling and the result
//!
//! Every check carries a class ([`idem_spec::clauses::Class`]): `safety`
//! (a second effect, a leak, another request's outcome, a stored 5xx, a
//! final outcome executed again), `semantics` or `interop`. Cases judge
//! behaviour under the behavioural clause and the spelling of each answer,
//! recognised through the manifest's declared dialect, under the interop
//! clauses, so another dialect is never mistaken for unsafe behaviour. The
//! run is UNSAFE ([`EXIT_UNSAFE`]), a HARNESS ERROR ([`EXIT_HARNESS`]),
//! DEVIATES ([`EXIT_DEVIATES`]) or CONFORMS ([`EXIT_CONFORMS`]).
//!
//! ## Failpoint and restart hooks
//!
//! Some cases need the target's cooperation: `failure.5xx-not-stored`
//! (`hooks.failpoint.server_error`, or a body-triggered 5xx,
//! `endpoints[].server_error_body`), `inflight.conflict`
//! (`hooks.failpoint.pause`), `recovery.lease-takeover`
//! (`hooks.failpoint.lease_pause` and the clock hook),
//! `recovery.crash-restart` (`hooks.failpoint.crash_after_commit` and a
//! restart) and `windows.progress` (the foreign-call crash, a restart and
//! the clock). `hooks.execution_probe`, a count of handler runs, lets the
//! kit see a final 4xx or a stored 5xx executed again. The first two go to
//! the first endpoint; the recovery cases go
//! to `hooks.failpoint.recovery_endpoint` when it names one (a multi-step
//! endpoint, whose committed recovery points give a lease something to
//! expire), with that endpoint's own `probe` if it declares one
//! ([`case::focus`]). `hooks.failpoint.release_url` lets the kit end a
//! pause as soon as it has seen what it needs. The restart is a shell
//! command (`hooks.restart`) for third parties; the [`demo`] owns its
//! server, so it restarts it in process ([`case::Restarter`]: the same
//! binary, database and port, the test clock where the run left it).
//!
//! ## Layout
//!
//! - [`manifest`]: loading, validation, templates, the `init` template.
//! - [`http`]: the rate- and budget-limited client, exchanges, curl rendering.
//! - [`probe`]: the effect probe (how many side effects a marker caused).
//! - [`case`]: the shape every case shares and the check/verdict helpers.
//! - [`cases`]: the cases, one module per clause family.
//! - [`model`]: the contract model and the generated operation sequences.
//! - [`proxy`]: the built-in proxy that drops responses.
//! - [`runner`]: runs a plan, enforces safety limits, builds the report.
//! - [`waivers`]: waiver matching and staleness.
//! - [`report`]: console, JSON, JUnit and HTML renderers.
//! - [`demo`]: the zero-configuration run against the reference server.
//! - [`client`]: the client check (`client --run`): a fault server, scenarios and
//!   verdicts over any SDK's retries.
//! - [`commands`]: the CLI's subcommands (`demo`, `run`, `list`, `init`, `replay`, `client`).

pub mod case;
pub mod cases;
pub mod clause;
pub mod client;
pub mod commands;
pub mod demo;
mod error;
pub mod http;
pub mod manifest;
pub mod model;
pub mod openapi;
pub mod probe;
pub mod proxy;
pub mod report;
pub mod runner;
pub mod waivers;

pub use error::Error;

/// The kit's version, recorded in every report.
pub const KIT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Exit code when no MUST clause failed: CONFORMS.
pub const EXIT_CONFORMS: i32 = 0;
/// Exit code when a MUST clause of class `safety` failed (unwaived):
/// UNSAFE. Also `replay`'s "still fails".
pub const EXIT_UNSAFE: i32 = 1;
/// Exit code for harness errors (bad manifest, failed preflight,
/// unreachable target, budget spent, a case that errored) when nothing
/// unsafe was found.
pub const EXIT_HARNESS: i32 = 2;
/// Exit code when only `semantics` or `interop` MUST clauses failed:
/// DEVIATES.
pub const EXIT_DEVIATES: i32 = 3;
