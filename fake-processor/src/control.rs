//! The period set through `/_control`: which behaviour applies to the next
//! calls, and when it runs out.

use std::sync::Mutex;

use std::time::{Duration, Instant};

use crate::model::{Behavior, ControlRequest, ControlState};

/// One active period. It ends at `until` or when `calls_left` reaches zero.
#[derive(Debug, Clone, Copy)]
struct Period {
    behavior: Behavior,
    until: Option<Instant>,
    calls_left: Option<u64>,
}

impl Period {
    fn expired(&self, now: Instant) -> bool {
        self.until.is_some_and(|u| now >= u) || self.calls_left == Some(0)
    }
}

/// The processor's fault schedule. A std mutex suffices: it is never held
/// across an await.
#[derive(Debug, Default)]
pub(crate) struct Control {
    period: Mutex<Option<Period>>,
}

impl Control {
    /// Starts a period, replacing any previous one.
    pub(crate) fn set(&self, req: &ControlRequest, behavior: Behavior) -> ControlState {
        self.set_at(req, behavior, Instant::now())
    }

    fn set_at(&self, req: &ControlRequest, behavior: Behavior, now: Instant) -> ControlState {
        let period = Period {
            behavior,
            until: req.for_secs.map(|s| now + Duration::from_secs(s)),
            calls_left: req.for_calls,
        };
        let mut guard = self.lock();
        *guard = Some(period);
        state_of(guard.as_ref(), now)
    }

    /// Ends any period.
    pub(crate) fn reset(&self) -> ControlState {
        let mut guard = self.lock();
        *guard = None;
        state_of(None, Instant::now())
    }

    /// The current period, for `GET /_control`.
    pub(crate) fn state(&self) -> ControlState {
        self.state_at(Instant::now())
    }

    fn state_at(&self, now: Instant) -> ControlState {
        let mut guard = self.lock();
        if guard.is_some_and(|p| p.expired(now)) {
            *guard = None;
        }
        state_of(guard.as_ref(), now)
    }

    /// The behaviour for one call that carried no header, consuming one call
    /// of a counted period.
    pub(crate) fn take(&self) -> Behavior {
        self.take_at(Instant::now())
    }

    /// [`Control::take`] at a given instant; tests pass their own clock.
    fn take_at(&self, now: Instant) -> Behavior {
        let mut guard = self.lock();
        let Some(period) = guard.as_mut() else {
            return Behavior::NORMAL;
        };
        if period.expired(now) {
            *guard = None;
            return Behavior::NORMAL;
        }
        if let Some(left) = period.calls_left.as_mut() {
            *left -= 1;
        }
        period.behavior
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Period>> {
        // A panic while holding this lock cannot leave the Option half
        // written, so a poisoned lock is still safe to use.
        self.period
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn state_of(period: Option<&Period>, now: Instant) -> ControlState {
    match period {
        None => ControlState {
            active: false,
            fault: None,
            delay_ms: 0,
            remaining_calls: None,
            remaining_ms: None,
        },
        Some(p) => ControlState {
            active: true,
            fault: p.behavior.fault,
            delay_ms: p.behavior.delay_ms,
            remaining_calls: p.calls_left,
            remaining_ms: p.until.map(|u| {
                u64::try_from(u.saturating_duration_since(now).as_millis()).unwrap_or(u64::MAX)
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ControlMode;

    #[test]
    fn counted_period_runs_out() {
        let c = Control::default();
        let req = ControlRequest::new(ControlMode::Decline).for_calls(2);
        c.set(&req, Behavior::DECLINE);
        assert_eq!(c.take(), Behavior::DECLINE);
        assert_eq!(c.state().remaining_calls, Some(1));
        assert_eq!(c.take(), Behavior::DECLINE);
        assert_eq!(c.take(), Behavior::NORMAL);
        assert!(!c.state().active);
    }

    #[test]
    fn timed_period_runs_out_on_the_test_clock() {
        let c = Control::default();
        let t0 = Instant::now();
        let req = ControlRequest::new(ControlMode::Unavailable).for_secs(5);
        c.set_at(&req, Behavior::UNAVAILABLE, t0);
        assert_eq!(c.take_at(t0), Behavior::UNAVAILABLE);
        let later = t0 + Duration::from_secs(4);
        assert_eq!(c.state_at(later).remaining_ms, Some(1000));
        assert_eq!(c.take_at(later), Behavior::UNAVAILABLE);
        assert_eq!(c.take_at(t0 + Duration::from_secs(5)), Behavior::NORMAL);
        assert!(!c.state_at(t0 + Duration::from_secs(5)).active);
    }

    #[test]
    fn reset_ends_an_open_period() {
        let c = Control::default();
        c.set(
            &ControlRequest::new(ControlMode::Unavailable),
            Behavior::UNAVAILABLE,
        );
        assert_eq!(c.take(), Behavior::UNAVAILABLE);
        assert_eq!(c.take(), Behavior::UNAVAILABLE);
        assert!(!c.reset().active);
        assert_eq!(c.take(), Behavior::NORMAL);
    }
}
