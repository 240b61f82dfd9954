//! A scripted, in-memory [`KeyStore`] double for the engine's unit tests:
//! each observation, claim and final write answers what the test scripted,
//! in order, and every call is logged. It drives the race branches of the
//! engine's loop (a final write lost to a concurrent winner, a key busy
//! elsewhere, a winner gone again) deterministically, which a real store
//! can only show by timing. An unscripted call fails the request loudly.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use idem_spec::Fingerprint;

use super::{
    AbandonedKey, ClaimOutcome, ClaimRequest, Claimed, FencedWrite, KeyRecord, KeyStore, Observed,
    Orphans, ReapBatch, SingleTx, StoredResponse, TakenOver,
};
use crate::clock::Millis;
use crate::error::{Error, Result};
use crate::key::{Fence, KeyId};

/// A transaction of the double: a number, logged when it begins and ends.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ScriptTx(pub(crate) u32);

/// What one observation answers.
#[derive(Debug, Clone, Default)]
pub(crate) struct Seen {
    pub(crate) record: Option<KeyRecord>,
    pub(crate) busy: bool,
    /// Whether the observation leaves a transaction open holding the key's
    /// lock (as PostgreSQL's does for a claimable key).
    pub(crate) open: bool,
}

/// How `begin_single` answers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Single {
    Open,
    Deferred,
    Busy,
}

/// How `claim` (the multi-step claim) answers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Claim {
    Claimed,
    Busy,
    Taken,
}

/// The script and the log.
#[derive(Debug, Default)]
pub(crate) struct Script {
    /// Answers of `observe` and `lookup`, in order.
    pub(crate) seen: VecDeque<Seen>,
    /// Answers of `begin_single` (default: deferred, like SQLite).
    pub(crate) single: VecDeque<Single>,
    /// Answers of `record_final`: the generation, or `None` (lost).
    pub(crate) finals: VecDeque<Option<i64>>,
    /// Answers of `claim`.
    pub(crate) claims: VecDeque<Claim>,
    /// Every call, in order: `observe`, `begin #n`, `commit #n`, ...
    pub(crate) log: Vec<String>,
    next_tx: u32,
}

/// The double. Clones share one script.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scripted(Arc<Mutex<Script>>);

impl Scripted {
    /// The script, to set up answers or read the log.
    pub(crate) fn script(&self) -> MutexGuard<'_, Script> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Logs `what` (tests log their handler's steps here too, to check
    /// the order of events).
    pub(crate) fn note(&self, what: impl Into<String>) {
        self.script().log.push(what.into());
    }

    fn open_tx(&self) -> ScriptTx {
        let mut s = self.script();
        s.next_tx += 1;
        let n = s.next_tx;
        s.log.push(format!("begin #{n}"));
        ScriptTx(n)
    }

    fn unscripted(what: &str) -> Error {
        Error::Internal(format!("the scripted store has no answer for {what}"))
    }
}

impl KeyStore for Scripted {
    type Tx = ScriptTx;

    async fn begin(&self) -> Result<ScriptTx> {
        Ok(self.open_tx())
    }

    async fn commit(&self, tx: ScriptTx) -> Result<()> {
        self.note(format!("commit #{}", tx.0));
        Ok(())
    }

    async fn rollback(&self, tx: ScriptTx) -> Result<()> {
        self.note(format!("rollback #{}", tx.0));
        Ok(())
    }

    async fn lookup(&self, _id: &KeyId) -> Result<Option<KeyRecord>> {
        self.note("lookup");
        let seen = self.script().seen.pop_front();
        seen.map(|s| s.record)
            .ok_or_else(|| Self::unscripted("lookup"))
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome<ScriptTx>> {
        self.note("claim");
        let answer = self.script().claims.pop_front();
        match answer.ok_or_else(|| Self::unscripted("claim"))? {
            Claim::Claimed => Ok(ClaimOutcome::Claimed(Claimed {
                tx: self.open_tx(),
                fence: req.id.fence(1),
            })),
            Claim::Busy => Ok(ClaimOutcome::Busy),
            Claim::Taken => Ok(ClaimOutcome::Taken),
        }
    }

    async fn observe(&self, _id: &KeyId, _now: Millis) -> Result<Observed<ScriptTx>> {
        self.note("observe");
        let seen = self.script().seen.pop_front();
        let seen = seen.ok_or_else(|| Self::unscripted("observe"))?;
        Ok(Observed {
            record: seen.record,
            busy: seen.busy,
            tx: seen.open.then(|| self.open_tx()),
        })
    }

    async fn begin_single(&self, _req: &ClaimRequest<'_>) -> Result<SingleTx<ScriptTx>> {
        self.note("begin_single");
        let answer = self.script().single.pop_front().unwrap_or(Single::Deferred);
        Ok(match answer {
            Single::Open => SingleTx::Open(self.open_tx()),
            Single::Deferred => SingleTx::Deferred,
            Single::Busy => SingleTx::Busy,
        })
    }

    async fn record_final(
        &self,
        tx: &mut ScriptTx,
        _req: &ClaimRequest<'_>,
        _response: &StoredResponse,
        _now: Millis,
    ) -> Result<Option<i64>> {
        self.note(format!("record_final #{}", tx.0));
        let answer = self.script().finals.pop_front();
        answer.ok_or_else(|| Self::unscripted("record_final"))
    }

    async fn write_fenced(
        &self,
        tx: &mut ScriptTx,
        _fence: &Fence,
        _write: FencedWrite<'_>,
        _now: Millis,
    ) -> Result<()> {
        self.note(format!("write_fenced #{}", tx.0));
        Ok(())
    }

    async fn take_over(
        &self,
        _id: &KeyId,
        _fingerprint: &Fingerprint,
        _now: Millis,
        _lease_expires_at: Millis,
    ) -> Result<Option<TakenOver>> {
        Err(Self::unscripted("take_over"))
    }

    async fn renew_lease(
        &self,
        _fence: &Fence,
        _now: Millis,
        _lease_expires_at: Millis,
    ) -> Result<bool> {
        Ok(true)
    }

    async fn release_lease(&self, fence: &Fence, _now: Millis) -> Result<bool> {
        self.note(format!("release_lease {fence}"));
        Ok(true)
    }

    async fn abandoned(&self, _now: Millis, _limit: i64) -> Result<Vec<AbandonedKey>> {
        Err(Self::unscripted("abandoned"))
    }

    async fn reap(&self, _now: Millis, _limit: i64) -> Result<ReapBatch> {
        Err(Self::unscripted("reap"))
    }

    async fn orphans(&self, _now: Millis) -> Result<Orphans> {
        Err(Self::unscripted("orphans"))
    }

    async fn oldest_expired(&self, _now: Millis) -> Result<Option<Millis>> {
        Err(Self::unscripted("oldest_expired"))
    }
}
