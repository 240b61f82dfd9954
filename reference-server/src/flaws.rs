//! Deliberate flaws, for proving that the conformance kit can fail.
//!
//! Each [`Flaw`] is a small, clearly marked deviation from the contract
//! that real servers have shipped. They exist only in builds with the
//! `flaws` cargo feature, switched on one at a time with `--flaw NAME`;
//! in a normal build [`Flaws::on`] is a constant `false` and the flawed
//! branches compile away. Search the code for `FLAW(` to see every site.

use std::fmt;

/// One deliberate deviation from the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
#[non_exhaustive]
pub enum Flaw {
    /// Read the key, and if it is absent execute and store the response at
    /// the end: two concurrent duplicates both pass the check and both
    /// execute. Breaks `idem.claim.atomic`, `idem.concurrency.single-effect`.
    CheckThenInsert,
    /// Replay a stored response whatever the new request's fingerprint.
    /// Breaks `idem.fingerprint.mismatch`.
    NoFingerprintCheck,
    /// Scope keys globally instead of per caller: one caller's key replays
    /// another caller's response. Breaks `idem.scope.caller`.
    GlobalKeys,
    /// A duplicate that arrives while its key is in flight executes too.
    /// Breaks `idem.inflight.conflict`.
    NoInFlightState,
    /// Store 5xx responses and replay them. Breaks `idem.failure.5xx-not-stored`.
    #[value(name = "store-5xx")]
    Store5xx,
    /// Replays omit `Idempotent-Replayed`, `Location` and `ETag`. Breaks
    /// `idem.replay.marker`, `idem.replay.verbatim`.
    ReplayDropsHeaders,
    /// Keys stop replaying after 60 seconds instead of the published window.
    /// Breaks `idem.window.replay`.
    KeysExpireEarly,
}

impl Flaw {
    /// The `--flaw` spelling.
    pub fn name(self) -> &'static str {
        match self {
            Self::CheckThenInsert => "check-then-insert",
            Self::NoFingerprintCheck => "no-fingerprint-check",
            Self::GlobalKeys => "global-keys",
            Self::NoInFlightState => "no-in-flight-state",
            Self::Store5xx => "store-5xx",
            Self::ReplayDropsHeaders => "replay-drops-headers",
            Self::KeysExpireEarly => "keys-expire-early",
        }
    }
}

impl fmt::Display for Flaw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The set of flaws switched on (always empty without the `flaws` feature).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flaws(Vec<Flaw>);

impl Flaws {
    /// No flaws: the conforming server.
    pub fn none() -> Self {
        Self::default()
    }

    /// The given flaws. Without the `flaws` feature the list is ignored.
    pub fn from_list(list: Vec<Flaw>) -> Self {
        if cfg!(feature = "flaws") {
            Self(list)
        } else {
            Self::default()
        }
    }

    /// Whether `flaw` is switched on.
    #[inline]
    pub fn on(&self, flaw: Flaw) -> bool {
        cfg!(feature = "flaws") && self.0.contains(&flaw)
    }

    /// The flaws switched on.
    pub fn list(&self) -> &[Flaw] {
        &self.0
    }
}
