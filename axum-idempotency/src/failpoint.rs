//! Failpoints: make a multi-step request crash or stall at a named point,
//! so crash recovery can be tested against the real binary.
//!
//! They are honoured only when the application opts in with
//! [`Engine::with_failpoints`](crate::Engine::with_failpoints) (the
//! reference server does so under `--test-hooks`). Without it the
//! `Idem-Failpoint` header is ignored entirely (not even parsed), so a
//! client of a production service can never trigger one. With it, a request
//! may carry
//!
//! ```text
//! Idem-Failpoint: crash-after=charge_created
//! Idem-Failpoint: pause-before=finished, crash-after=charge-call
//! ```
//!
//! Each item is `ACTION-POSITION=NAME`:
//!
//! - `crash` calls [`std::process::abort`]: no destructors, no flushing, no
//!   graceful shutdown; whatever was not committed is lost, like a `kill -9`.
//! - `pause` stalls the request until `POST /_test/failpoints/release` (or
//!   `--failpoint-max-pause-secs`, a bound so a forgotten pause cannot wedge
//!   a test run); `GET /_test/failpoints` lists the requests paused now.
//! - `error` answers a retryable 500 instead of running the endpoint. It
//!   exists only as `error-after=started`: the key is claimed, nothing of the
//!   endpoint has run, and the 500 rolls the claim back, so a retry with the
//!   same key executes afresh (clause idem.failure.5xx-not-stored). This is
//!   how the conformance kit provokes a server error black-box.
//!
//! Every idempotent endpoint passes these generic points:
//!
//! | failpoint | where |
//! |---|---|
//! | `after=started` | key claimed (not committed), endpoint not yet run; `pause` here holds the key in flight, `error` answers 500 |
//! | `before=finished` | final response stored with the endpoint's writes, not committed (a request armed here records and commits in two steps, so the moment exists; others may send both at once) |
//! | `after=finished` | final response committed, not yet sent; `crash` here is a crash after commit |
//!
//! A multi-step endpoint also passes `before=P` and `after=P` for every
//! recovery point `P` it commits, and whatever names its phases pass to
//! [`Phase::failpoint`](crate::multistep::Phase::failpoint) (e.g. around a
//! foreign call).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use crate::error::{Error, Result};

/// The request header that arms failpoints (with `--test-hooks` only).
pub const FAILPOINT_HEADER: &str = "idem-failpoint";

/// The generic point every idempotent endpoint passes once its key is
/// claimed and before the endpoint runs: the recovery point `started`,
/// named once, in the spec.
pub const STARTED: &str = idem_spec::RecoveryPoint::STARTED;

/// The generic point around the commit of a final response: the recovery
/// point `finished`.
pub const FINISHED: &str = idem_spec::RecoveryPoint::FINISHED;

/// What an armed failpoint does when reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Abort the process on the spot.
    Crash,
    /// Stall until released (or the bound passes).
    Pause,
    /// Answer a retryable 500 instead of running the endpoint
    /// (`error-after=started` only).
    Error,
}

/// Whether a failpoint sits just before or just after its named step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    /// Before the step (for a recovery point: writes done, commit not yet).
    Before,
    /// After the step (for a recovery point: committed).
    After,
}

impl Position {
    fn as_str(self) -> &'static str {
        match self {
            Self::Before => "before",
            Self::After => "after",
        }
    }
}

/// One armed failpoint, parsed from the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failpoint {
    /// Crash or pause.
    pub action: Action,
    /// Before or after `name`.
    pub position: Position,
    /// A recovery point (`payment_created`) or an endpoint step (`charge-call`).
    pub name: String,
}

/// Parses an `Idem-Failpoint` value: comma-separated `ACTION-POSITION=NAME`.
pub fn parse(value: &str) -> Result<Vec<Failpoint>> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let bad = || {
            Error::Failpoint(format!(
                "Idem-Failpoint item {item:?}: expected ACTION-POSITION=NAME with ACTION crash, \
                 pause or error and POSITION before or after, e.g. crash-after=charge_created \
                 (error only as error-after=started)"
            ))
        };
        let (head, name) = item.split_once('=').ok_or_else(bad)?;
        let (action, position) = head.split_once('-').ok_or_else(bad)?;
        let action = match action {
            "crash" => Action::Crash,
            "pause" => Action::Pause,
            "error" => Action::Error,
            _ => return Err(bad()),
        };
        let position = match position {
            "before" => Position::Before,
            "after" => Position::After,
            _ => return Err(bad()),
        };
        if name.is_empty()
            || (action == Action::Error && (position, name) != (Position::After, STARTED))
        {
            return Err(bad());
        }
        out.push(Failpoint {
            action,
            position,
            name: name.to_owned(),
        });
    }
    Ok(out)
}

/// The process-wide failpoint state: who is paused, and the release signal.
#[derive(Debug)]
pub struct Failpoints {
    max_pause: Duration,
    paused: Mutex<BTreeMap<u64, String>>,
    next_id: AtomicU64,
    release: watch::Sender<u64>,
}

impl Failpoints {
    /// A registry whose pauses last at most `max_pause`.
    pub fn new(max_pause: Duration) -> Self {
        Self {
            max_pause,
            paused: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            release: watch::Sender::new(0),
        }
    }

    /// Fires every failpoint of `armed` that matches (`position`, `name`).
    pub async fn hit(&self, armed: &[Failpoint], position: Position, name: &str) {
        for fp in armed
            .iter()
            .filter(|f| f.position == position && f.name == name)
        {
            let label = format!("{}={name}", position.as_str());
            match fp.action {
                Action::Crash => {
                    tracing::error!(failpoint = %label, "FAILPOINT: aborting the process");
                    std::process::abort();
                }
                Action::Pause => self.pause(&label).await,
                // Answered by the caller through `injects_error`.
                Action::Error => {}
            }
        }
    }

    /// Whether `armed` asks for an injected 500 (`error-after=started`).
    pub fn injects_error(armed: &[Failpoint]) -> bool {
        armed.iter().any(|f| f.action == Action::Error)
    }

    async fn pause(&self, label: &str) {
        // A fresh receiver has seen the current value: only a later
        // release wakes it.
        let mut rx = self.release.subscribe();
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        self.lock().insert(id, label.to_owned());
        tracing::warn!(failpoint = %label, "FAILPOINT: request paused");
        let released = tokio::time::timeout(self.max_pause, rx.changed()).await;
        self.lock().remove(&id);
        match released {
            Ok(_) => tracing::warn!(failpoint = %label, "FAILPOINT: request released"),
            Err(_) => tracing::warn!(failpoint = %label, "FAILPOINT: pause bound reached"),
        }
    }

    /// The failpoints requests are paused at right now (one entry each).
    pub fn paused(&self) -> Vec<String> {
        self.lock().values().cloned().collect()
    }

    /// Releases every paused request; returns how many were paused.
    pub fn release_all(&self) -> usize {
        let n = self.lock().len();
        self.release.send_modify(|v| *v = v.wrapping_add(1));
        n
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, String>> {
        self.paused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_parse_and_typos_are_refused() {
        let fps =
            parse("crash-after=charge_created, pause-before=charge-call, error-after=started")
                .expect("parse");
        assert_eq!(
            fps,
            vec![
                Failpoint {
                    action: Action::Crash,
                    position: Position::After,
                    name: "charge_created".into()
                },
                Failpoint {
                    action: Action::Pause,
                    position: Position::Before,
                    name: "charge-call".into()
                },
                Failpoint {
                    action: Action::Error,
                    position: Position::After,
                    name: STARTED.into()
                },
            ]
        );
        assert!(Failpoints::injects_error(&fps));
        assert!(!Failpoints::injects_error(&fps[..2]));
        for bad in [
            "crash=x",
            "explode-after=x",
            "crash-during=x",
            "crash-after=",
            "x",
            "error-before=started",
            "error-after=charge_created",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[tokio::test]
    async fn a_pause_holds_until_released() {
        let fps = std::sync::Arc::new(Failpoints::new(Duration::from_secs(30)));
        let armed = parse("pause-after=x").expect("parse");
        let f = fps.clone();
        let task = tokio::spawn(async move { f.hit(&armed, Position::After, "x").await });
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while fps.paused().is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "never paused");
            tokio::task::yield_now().await;
        }
        assert_eq!(fps.paused(), vec!["after=x".to_owned()]);
        assert!(!task.is_finished());
        assert_eq!(fps.release_all(), 1);
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("released")
            .expect("join");
        assert!(fps.paused().is_empty());
    }
}
