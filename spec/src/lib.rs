//! # idem-spec: the idemkit contract as Rust types
//!
//! This crate is the single source of truth other crates (and other
//! people's code) depend on. It does no I/O; its generator binary,
//! `idem-spec-gen`, writes the derived artifacts in `spec/generated/`.
//!
//! ## Layout
//!
//! - [`key`]: the `Idempotency-Key` header, parsed into [`IdempotencyKey`].
//! - [`fingerprint`]: what "the same request" means ([`Fingerprint`]).
//! - [`problem`]: RFC 9457 errors, [`ErrorCode`]s and their status per [`Profile`].
//! - [`state`]: the three [`KeyState`]s and multi-step [`RecoveryPoint`]s.
//! - [`policy`]: replay window, retention, lease, in-flight and failure [`Policy`].
//! - [`headers`]: header names and the `Prefer: wait` parser.
//! - [`clauses`]: the normative clauses, derived from the book.
//! - [`manifest`]: the conformance kit's target manifest.
//! - [`report`]: the conformance kit's report data model.
//! - [`generate`]: the JSON Schemas, OpenAPI document and test vectors.
//!
//! Every type that crosses a wire or a file derives `Serialize`,
//! `Deserialize`, `schemars::JsonSchema` and `utoipa::ToSchema`, so the
//! published schemas can never disagree with the code.

pub mod clauses;
mod error;
pub mod fingerprint;
pub mod generate;
pub mod headers;
pub mod key;
pub mod manifest;
pub mod policy;
pub mod problem;
pub mod report;
pub mod state;

pub use error::Error;
pub use fingerprint::Fingerprint;
pub use key::IdempotencyKey;
pub use policy::Policy;
pub use problem::{ErrorCode, Problem, Profile};
pub use state::{KeyState, RecoveryPoint};

/// The contract version every artifact and report records.
pub const CONTRACT_VERSION: &str = "1.0.0";
