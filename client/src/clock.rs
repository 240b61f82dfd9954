//! Time as a dependency: the middleware reads the clock and sleeps through this trait, so tests
//! can run a whole retry schedule instantly and assert the exact sleeps that were requested.
//!
//! Why not `tokio::time::pause`? A paused tokio clock auto-advances whenever the runtime is idle,
//! and a test talking to a real socket is idle while it waits for bytes, so per-attempt timeouts
//! would fire early. A clock that only moves when the code under test sleeps keeps socket I/O
//! on real time and the schedule on virtual time.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

/// A boxed sleep future.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Monotonic time, wall time (for `Retry-After` dates) and sleeping.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Monotonic now; deadlines are measured on this.
    fn now(&self) -> Instant;
    /// Wall-clock now; only used to turn an HTTP-date `Retry-After` into a delay.
    fn wall(&self) -> SystemTime;
    /// Sleeps for `duration`.
    fn sleep(&self, duration: Duration) -> Sleep;
}

/// The real clock: `std` time and `tokio::time::sleep`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn wall(&self) -> SystemTime {
        SystemTime::now()
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// A virtual clock that moves only when something sleeps on it (or [`ManualClock::advance`] is
/// called), and records every sleep. Clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    origin: Instant,
    wall_origin: SystemTime,
    inner: Arc<Mutex<ManualInner>>,
}

#[derive(Debug, Default)]
struct ManualInner {
    offset: Duration,
    sleeps: Vec<Duration>,
}

impl ManualClock {
    /// A clock starting now, whose wall time starts at `wall_origin`.
    pub fn new(wall_origin: SystemTime) -> Self {
        Self {
            origin: Instant::now(),
            wall_origin,
            inner: Arc::new(Mutex::new(ManualInner::default())),
        }
    }

    /// Moves time forward without recording a sleep.
    pub fn advance(&self, by: Duration) {
        self.lock().offset += by;
    }

    /// Every sleep requested so far, in order.
    pub fn sleeps(&self) -> Vec<Duration> {
        self.lock().sleeps.clone()
    }

    /// Virtual time elapsed since creation.
    pub fn elapsed(&self) -> Duration {
        self.lock().offset
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ManualInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.origin + self.lock().offset
    }

    fn wall(&self) -> SystemTime {
        self.wall_origin + self.lock().offset
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        let mut inner = self.lock();
        inner.offset += duration;
        inner.sleeps.push(duration);
        Box::pin(std::future::ready(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn manual_clock_moves_only_when_asked() {
        let c = ManualClock::default();
        let t0 = c.now();
        let w0 = c.wall();
        c.sleep(Duration::from_millis(250)).await;
        c.advance(Duration::from_secs(1));
        assert_eq!(c.now() - t0, Duration::from_millis(1250));
        assert_eq!(
            c.wall().duration_since(w0).expect("forward"),
            Duration::from_millis(1250)
        );
        assert_eq!(c.sleeps(), [Duration::from_millis(250)]);
    }
}
