//! # idem-conformance: check any HTTP API against the idempotency contract
//!
//! The kit speaks HTTP only (reqwest) and never links a server's code, so
//! it judges any vendor's API the same way it judges the reference server.
//! A run reads a target [`server::manifest`], checks it against the target
//! ([`server::runner::preflight`]: no case runs on a manifest that does not
//! fit), executes every [`server::cases`] case (each citing the clauses it
//! checks), runs a generated [`server::model`]-checked property phase, and renders one
//! [`idem_spec::report::Report`] to the console, JSON, JUnit XML and a
//! self-contained HTML page.
//!
//! ## Behaviour, spelling and the result
//!
//! Every check carries a class ([`idem_spec::clauses::Class`]) given by
//! the severity rule of the verdict core ([`verdict`]): `safety` when what
//! it saw can make a correct client believe something false about effects
//! (a second effect, another request's answer, one caller's data shown to
//! another), else `semantics`, or `interop` for a spelling. Cases judge
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
//! ([`server::case::focus`]). `hooks.failpoint.release_url` lets the kit end a
//! pause as soon as it has seen what it needs. The restart is a shell
//! command (`hooks.restart`) for third parties; the [`server::demo`] owns its
//! server, so it restarts it in process ([`server::case::Restarter`]: the same
//! binary, database and port, the test clock where the run left it).
//!
//! ## Layout
//!
//! The kit is three crates. This one is the server check and the CLI:
//!
//! - [`server`]: the server check: [`server::manifest`] (loading,
//!   validation, the `init` template), [`server::http`] (the rate- and
//!   budget-limited client), [`server::probe`] (effect counts),
//!   [`server::case`] (what every case shares), [`server::cases`] (one module
//!   per clause family), [`server::model`] (the contract model and generated
//!   sequences), [`server::proxy`] (the response-dropping proxy),
//!   [`server::runner`] (preflight, plan, report), [`server::openapi`]
//!   (seeding from an OpenAPI document) and [`server::demo`] (the
//!   zero-configuration run against the reference server).
//! - [`cli`]: the subcommands (`demo`, `run`, `list`, `init`, `replay`, `client`);
//!   [`output`]: where their reports go.
//! - [`verdict`] (crate `idem-conformance-core`): clause IDs, the severity
//!   rule, waivers, the summary and the report writers, shared by both checks.
//! - [`client`] (crate `idem-conformance-client`): the client check.

pub mod cli;
mod error;
pub mod output;
pub mod server;

pub use error::Error;
/// The client check (crate `idem-conformance-client`), re-exported.
pub use idem_conformance_client as client;
/// The verdict core (crate `idem-conformance-core`), re-exported.
pub use idem_conformance_core as verdict;
pub use idem_conformance_core::{
    EXIT_CONFORMS, EXIT_DEVIATES, EXIT_HARNESS, EXIT_UNSAFE, KIT_VERSION, clause,
};
