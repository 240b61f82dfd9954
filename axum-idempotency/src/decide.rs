//! The decision: what to do with a request, given what is known about its
//! key. Pure: no database, no clock, no I/O; every clause it implements has
//! a row in the table of tests below.
//!
//! The engine's loop ([`crate::engine`]) observes the key (one read of the
//! store, one look at this process's in-flight registry), asks [`decide`],
//! and carries the answer out; after a claim that lost a race it observes
//! again and asks again.
//!
//! ```text
//!  stored record                      held elsewhere?   decision
//!  ─────────────────────────────────  ───────────────   ──────────────────────────
//!  complete, inside its window        -                 replay (same fingerprint)
//!  in flight, live lease              -                 wait or 409 in use
//!  in flight, progressed, lease over  -                 resume (multi-step route)
//!  in flight, progressed, retention over                409 in use (the reaper decides)
//!  absent, past window, or            held here         wait or 409 in use
//!    abandoned at `started`           held elsewhere    wait or 409 in use
//!                                     no                claim
//!  any record, other fingerprint      -                 409 mismatch
//! ```

use idem_spec::{Fingerprint, KeyState, RecoveryPoint};

use crate::clock::Millis;
use crate::store::{KeyRecord, StoredResponse};

/// What is known about a key when deciding.
#[derive(Debug, Clone, Copy, Default)]
pub struct Seen<'a> {
    /// Its committed record, if any.
    pub stored: Option<&'a KeyRecord>,
    /// Whether a request is executing it without a committed record yet.
    pub held: Held<'a>,
}

/// An execution of the key that the store's record does not show yet (its
/// claim has not committed).
#[derive(Debug, Clone, Copy, Default)]
pub enum Held<'a> {
    /// None known.
    #[default]
    No,
    /// By a request in this process, with this fingerprint.
    Here(&'a Fingerprint),
    /// By another transaction (the store answered "busy"); its fingerprint
    /// is unknown until it commits.
    Elsewhere,
}

/// The request, as far as the decision cares.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// Its fingerprint.
    pub fingerprint: &'a Fingerprint,
    /// Whether it may still wait for an in-flight original (`Prefer: wait`
    /// sent and its deadline not passed).
    pub may_wait: bool,
    /// Whether its route runs phases ([`crate::multistep`]) and so can
    /// resume a key at its last recovery point.
    pub resumable: bool,
}

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision<'a> {
    /// Answer with the stored response (clause `idem.replay.verbatim`).
    Replay(&'a StoredResponse),
    /// Answer with an error, touching nothing.
    Reject(Reject),
    /// Wait for the original to settle, then observe again.
    Wait,
    /// Claim the key and execute.
    Claim,
    /// Take the key over at its last recovery point and run the rest.
    Resume,
}

/// Why a request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// The key was first used with another request: 409
    /// `idempotency_key_mismatch` (clause `idem.fingerprint.mismatch`).
    Mismatch,
    /// The key is in flight and the client does not wait: 409
    /// `idempotency_key_in_use` (clause `idem.inflight.conflict`).
    InUse,
}

/// Decides what to do with `ask` at `now`, given `seen`.
pub fn decide<'a>(seen: &Seen<'a>, ask: &Ask<'_>, now: Millis) -> Decision<'a> {
    let in_flight = if ask.may_wait {
        Decision::Wait
    } else {
        Decision::Reject(Reject::InUse)
    };
    let mismatch = |fingerprint: &Fingerprint| fingerprint != ask.fingerprint;
    if let Some(rec) = seen.stored {
        match rec.state {
            KeyState::Complete if rec.replayable(now) => {
                if mismatch(&rec.fingerprint) {
                    return Decision::Reject(Reject::Mismatch);
                }
                if let Some(response) = &rec.response {
                    return Decision::Replay(response);
                }
                // A complete record without a response cannot be written by
                // this library; treat it as in flight rather than guess.
                return in_flight;
            }
            KeyState::InFlight => {
                let progressed = rec.recovery_point.as_str() != RecoveryPoint::STARTED;
                let lease_live = rec.lease_expires_at.is_some_and(|t| now < t);
                // Someone's request while its lease lasts; and a request with
                // committed progress is never replaced by a new one, whatever
                // its window (clause idem.window.progress).
                if lease_live || progressed {
                    if mismatch(&rec.fingerprint) {
                        return Decision::Reject(Reject::Mismatch);
                    }
                    // Between phases with its lease over: a retry takes it
                    // over and resumes (clause idem.lease.takeover), past its
                    // replay window too, until its retention ends.
                    if progressed && !lease_live && ask.resumable && now < rec.expires_at {
                        return Decision::Resume;
                    }
                    return in_flight;
                }
                // In flight at `started` with its lease over: the owner died
                // before anything durable; the claim statement may take it.
            }
            // Complete and past its window: a brand-new request (clause
            // idem.window.expiry).
            KeyState::Complete | KeyState::Absent => {}
        }
    }
    match seen.held {
        Held::Here(fingerprint) if mismatch(fingerprint) => Decision::Reject(Reject::Mismatch),
        Held::Here(_) | Held::Elsewhere => in_flight,
        Held::No => Decision::Claim,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Millis = 1_000_000;
    const LEASE: Millis = 60_000;
    const WINDOW: Millis = 86_400_000;
    const RETENTION: Millis = 3 * WINDOW;

    fn fp(s: &str) -> Fingerprint {
        Fingerprint::compute("POST", s, None, b"")
    }

    fn response() -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: Vec::new(),
            body: b"{}".to_vec(),
        }
    }

    /// A record claimed at `T` with fingerprint `f`.
    fn record(state: KeyState, point: &str, f: &str, lease_until: Option<Millis>) -> KeyRecord {
        KeyRecord {
            fingerprint: fp(f),
            state,
            recovery_point: RecoveryPoint::new(point).expect("point"),
            generation: 1,
            lease_expires_at: lease_until,
            created_at: T,
            replay_until: T + WINDOW,
            expires_at: T + RETENTION,
            response: (state == KeyState::Complete).then(response),
        }
    }

    fn complete(f: &str) -> KeyRecord {
        record(KeyState::Complete, "finished", f, None)
    }

    fn in_flight(point: &str, f: &str) -> KeyRecord {
        record(KeyState::InFlight, point, f, Some(T + LEASE))
    }

    /// Decides for a request with fingerprint "a" at `now`.
    fn run(
        stored: Option<&KeyRecord>,
        held: Held<'_>,
        now: Millis,
        wait: bool,
        multi: bool,
    ) -> Decision<'static> {
        let a = fp("a");
        let seen = Seen { stored, held };
        let ask = Ask {
            fingerprint: &a,
            may_wait: wait,
            resumable: multi,
        };
        // The replayed response is checked separately; map it to a marker.
        match decide(&seen, &ask, now) {
            Decision::Replay(r) => {
                assert_eq!(r, &response());
                Decision::Replay(&REPLAYED)
            }
            Decision::Reject(r) => Decision::Reject(r),
            Decision::Wait => Decision::Wait,
            Decision::Claim => Decision::Claim,
            Decision::Resume => Decision::Resume,
        }
    }

    static REPLAYED: StoredResponse = StoredResponse {
        status: 201,
        headers: Vec::new(),
        body: Vec::new(),
    };

    use Decision::{Claim, Reject as R, Replay, Resume, Wait};
    use Reject::{InUse, Mismatch};

    // clause: idem.state.three-states
    #[test]
    fn an_absent_key_is_claimed() {
        assert_eq!(run(None, Held::No, T, false, false), Claim);
        assert_eq!(run(None, Held::No, T, true, true), Claim);
    }

    // clause: idem.replay.verbatim, idem.window.replay
    #[test]
    fn a_complete_key_inside_its_window_is_replayed() {
        let rec = complete("a");
        assert_eq!(
            run(Some(&rec), Held::No, T, false, false),
            Replay(&REPLAYED)
        );
        assert_eq!(
            run(Some(&rec), Held::No, T + WINDOW - 1, false, true),
            Replay(&REPLAYED)
        );
        // Even while a local holder exists (a stale registry entry).
        let b = fp("b");
        assert_eq!(
            run(Some(&rec), Held::Here(&b), T, false, false),
            Replay(&REPLAYED)
        );
    }

    // clause: idem.fingerprint.mismatch
    #[test]
    fn another_request_under_the_key_is_a_mismatch_in_every_state() {
        let b = fp("b");
        assert_eq!(
            run(Some(&complete("b")), Held::No, T, false, false),
            R(Mismatch)
        );
        assert_eq!(
            run(Some(&in_flight("started", "b")), Held::No, T, true, false),
            R(Mismatch)
        );
        assert_eq!(
            run(
                Some(&in_flight("charge_created", "b")),
                Held::No,
                T + LEASE,
                false,
                true
            ),
            R(Mismatch)
        );
        assert_eq!(run(None, Held::Here(&b), T, true, false), R(Mismatch));
    }

    // clause: idem.window.expiry
    #[test]
    fn a_complete_key_past_its_window_is_a_new_request() {
        assert_eq!(
            run(Some(&complete("a")), Held::No, T + WINDOW, false, false),
            Claim
        );
        assert_eq!(
            run(Some(&complete("b")), Held::No, T + WINDOW, false, false),
            Claim,
            "even another request"
        );
        assert_eq!(
            run(
                Some(&complete("a")),
                Held::Elsewhere,
                T + WINDOW,
                false,
                false
            ),
            R(InUse)
        );
    }

    // clause: idem.inflight.conflict, idem.inflight.prefer-wait
    #[test]
    fn an_in_flight_key_is_409_or_a_wait() {
        let rec = in_flight("started", "a");
        assert_eq!(run(Some(&rec), Held::No, T, false, false), R(InUse));
        assert_eq!(run(Some(&rec), Held::No, T, true, false), Wait);
        let a = fp("a");
        assert_eq!(run(None, Held::Here(&a), T, false, false), R(InUse));
        assert_eq!(run(None, Held::Here(&a), T, true, false), Wait);
        assert_eq!(run(None, Held::Elsewhere, T, false, false), R(InUse));
        assert_eq!(run(None, Held::Elsewhere, T, true, false), Wait);
    }

    // clause: idem.lease.takeover
    #[test]
    fn an_expired_lease_at_started_may_be_claimed_again() {
        let rec = in_flight("started", "a");
        assert_eq!(
            run(Some(&rec), Held::No, T + LEASE - 1, false, false),
            R(InUse)
        );
        assert_eq!(run(Some(&rec), Held::No, T + LEASE, false, false), Claim);
        // A different request may claim it too: nothing durable was done.
        let other = in_flight("started", "b");
        assert_eq!(run(Some(&other), Held::No, T + LEASE, false, false), Claim);
    }

    // clause: idem.lease.takeover, idem.multistep.resume
    #[test]
    fn an_expired_lease_past_started_is_resumed_on_a_multi_step_route() {
        let rec = in_flight("charge_created", "a");
        assert_eq!(
            run(Some(&rec), Held::No, T + LEASE - 1, false, true),
            R(InUse)
        );
        assert_eq!(run(Some(&rec), Held::No, T + LEASE, false, true), Resume);
        assert_eq!(
            run(Some(&rec), Held::No, T + LEASE, true, true),
            Resume,
            "no wait needed"
        );
        // A single-phase route cannot resume phases it does not have.
        assert_eq!(run(Some(&rec), Held::No, T + LEASE, false, false), R(InUse));
    }

    // clause: idem.window.progress
    #[test]
    fn committed_progress_is_resumed_past_the_window_never_replaced() {
        let rec = in_flight("charge_created", "a");
        assert_eq!(
            run(Some(&rec), Held::No, T + WINDOW + 1, false, true),
            Resume
        );
        assert_eq!(
            run(Some(&rec), Held::No, T + RETENTION - 1, false, true),
            Resume
        );
        // Past retention it is the reaper's: still never replaced.
        assert_eq!(
            run(Some(&rec), Held::No, T + RETENTION, false, true),
            R(InUse)
        );
        let live = record(
            KeyState::InFlight,
            "charge_created",
            "a",
            Some(T + 2 * WINDOW),
        );
        assert_eq!(
            run(Some(&live), Held::No, T + WINDOW + 1, false, true),
            R(InUse)
        );
    }
}
