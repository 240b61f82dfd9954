//! Where time comes from.
//!
//! The engine never calls `SystemTime::now()` directly: replay windows,
//! retention and leases are all measured with a [`Clock`]. Production uses
//! [`SystemClock`]; tests (and the reference server's `--test-hooks`) run on
//! an [`AdjustableClock`] they move forward, so a test of a 24-hour window
//! takes milliseconds instead of a day.
//!
//! Time is kept as integer milliseconds since the Unix epoch because that is
//! what the store persists: one integer column type on both SQLite and
//! PostgreSQL, compared with plain `<=`, with no time-zone or precision
//! surprises between drivers.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// A source of the current time.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time in milliseconds since the Unix epoch.
    fn now_ms(&self) -> Millis;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        system_now_ms()
    }
}

fn system_now_ms() -> Millis {
    // A clock before 1970 is a broken machine; treat it as the epoch rather
    // than panicking on a request path.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The wall clock plus an offset that only ever grows.
///
/// Moving time backwards would let a stored response come back to life after
/// its window was observed to expire, which no real clock does; so the only
/// operation is [`advance`](AdjustableClock::advance).
#[derive(Debug, Default)]
pub struct AdjustableClock {
    offset_ms: AtomicI64,
}

impl AdjustableClock {
    /// A clock that starts at the wall-clock time.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `secs` seconds and returns the new time.
    pub fn advance(&self, secs: u64) -> Millis {
        let delta = i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX);
        let prev = self.offset_ms.fetch_add(delta, Ordering::SeqCst);
        system_now_ms().saturating_add(prev.saturating_add(delta))
    }

    /// How far this clock is ahead of the wall clock, in milliseconds.
    pub fn offset_ms(&self) -> Millis {
        self.offset_ms.load(Ordering::SeqCst)
    }
}

impl Clock for AdjustableClock {
    fn now_ms(&self) -> Millis {
        system_now_ms().saturating_add(self.offset_ms())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjustable_clock_moves_forward_by_the_asked_amount() {
        let c = AdjustableClock::new();
        let before = c.now_ms();
        c.advance(86_400);
        let after = c.now_ms();
        assert!(after - before >= 86_400_000, "advanced {}", after - before);
        assert!(after - before < 86_400_000 + 60_000);
        assert_eq!(c.offset_ms(), 86_400_000);
    }
}
