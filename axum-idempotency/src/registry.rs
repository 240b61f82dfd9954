//! This process's in-flight registry: the keys its requests are executing
//! right now, before any claim commits, and the wake-up source for
//! `Prefer: wait`.
//!
//! It is an optimisation, never the arbiter (two processes on one database
//! are arbitrated by the store). On SQLite it is also what answers an
//! in-process duplicate at once, without a statement.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use idem_spec::Fingerprint;
use tokio::sync::Notify;

use crate::key::KeyId;
use crate::request::Incoming;

/// Keys being executed by *this* process: the in-flight state before the
/// claim commits, and the wake-up source for `Prefer: wait`.
///
/// Why a `std::sync::Mutex`: it is held for a hash-map operation only,
/// never across an `.await`, so an async mutex would only add overhead.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    entries: Mutex<HashMap<KeyId, Arc<Entry>>>,
}

/// One key held by this process.
#[derive(Debug)]
pub(crate) struct Entry {
    /// The holder's fingerprint (a duplicate with another one is a mismatch).
    pub(crate) fingerprint: Fingerprint,
    notify: Notify,
    done: AtomicBool,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<KeyId, Arc<Entry>>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes the local slot unless another request of this process holds it.
    pub(crate) fn try_acquire(
        self: &Arc<Self>,
        incoming: &Incoming,
    ) -> std::result::Result<RegistryGuard, ()> {
        let mut map = self.lock();
        if map.contains_key(&incoming.id) {
            return Err(());
        }
        Ok(self.insert(&mut map, incoming))
    }

    /// Takes the local slot even if held: for takeovers of expired leases,
    /// which the store arbitrates.
    pub(crate) fn force_acquire(self: &Arc<Self>, incoming: &Incoming) -> RegistryGuard {
        let mut map = self.lock();
        self.insert(&mut map, incoming)
    }

    fn insert(
        self: &Arc<Self>,
        map: &mut HashMap<KeyId, Arc<Entry>>,
        incoming: &Incoming,
    ) -> RegistryGuard {
        let entry = Arc::new(Entry {
            fingerprint: incoming.fingerprint,
            notify: Notify::new(),
            done: AtomicBool::new(false),
        });
        map.insert(incoming.id.clone(), entry.clone());
        RegistryGuard {
            registry: self.clone(),
            id: incoming.id.clone(),
            entry,
        }
    }

    pub(crate) fn entry(&self, id: &KeyId) -> Option<Arc<Entry>> {
        self.lock().get(id).cloned()
    }
}

/// Releases a locally held key when the request settles, *or* when its
/// future is dropped (client gone, panic): waiters are always woken.
pub(crate) struct RegistryGuard {
    registry: Arc<Registry>,
    id: KeyId,
    entry: Arc<Entry>,
}

impl Drop for RegistryGuard {
    fn drop(&mut self) {
        let mut map = self.registry.lock();
        // Only our own entry: a takeover may have replaced it.
        if map
            .get(&self.id)
            .is_some_and(|e| Arc::ptr_eq(e, &self.entry))
        {
            map.remove(&self.id);
        }
        drop(map);
        self.entry.done.store(true, Ordering::Release);
        self.entry.notify.notify_waiters();
    }
}

/// Counts one waiting duplicate while it lives (decremented on every exit,
/// a dropped request included).
pub(crate) struct Gauge<'a>(&'a AtomicUsize);

impl<'a> Gauge<'a> {
    pub(crate) fn enter(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Entry {
    /// Waits until the holder settles (its guard is dropped) or `within`
    /// passes, whichever is first.
    pub(crate) async fn settled(&self, within: std::time::Duration) {
        // Register interest *before* checking `done`, so a holder that
        // finishes in between cannot slip its wake-up past us.
        let notified = self.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if !self.done.load(Ordering::Acquire) {
            let _ = tokio::time::timeout(within, notified).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use axum::body::Bytes;
    use idem_spec::IdempotencyKey;

    use crate::key::Caller;
    use crate::store::StoredRequest;

    fn incoming(key: &str, fp: &str) -> Incoming {
        Incoming {
            id: KeyId::new(Caller::new("ann"), IdempotencyKey::parse(key).expect("key")),
            fingerprint: Fingerprint::compute("POST", fp, None, b""),
            request: StoredRequest {
                method: "POST".into(),
                path: "/".into(),
                content_type: None,
                body: Bytes::new(),
            },
            wait: None,
            armed: Vec::new(),
            pulse: Arc::default(),
            caller_deadline: None,
        }
    }

    // clause: idem.inflight.prefer-wait
    #[tokio::test]
    async fn the_local_holder_is_exclusive_and_its_end_wakes_waiters() {
        let registry = Arc::new(Registry::default());
        let a = incoming("k", "a");
        let guard = registry.try_acquire(&a).expect("free");
        assert!(registry.try_acquire(&a).is_err(), "held");
        assert!(
            registry.try_acquire(&incoming("other", "a")).is_ok(),
            "per key"
        );
        let entry = registry.entry(&a.id).expect("entry");
        assert_eq!(entry.fingerprint, a.fingerprint);
        let waiter = {
            let entry = entry.clone();
            tokio::spawn(async move {
                entry.settled(Duration::from_secs(3600)).await;
            })
        };
        drop(guard);
        tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("woken")
            .expect("join");
        assert!(registry.entry(&a.id).is_none(), "released");
    }

    #[test]
    fn a_takeover_replaces_the_local_holder_and_the_old_guard_leaves_it_alone() {
        let registry = Arc::new(Registry::default());
        let a = incoming("k", "a");
        let stale = registry.try_acquire(&a).expect("free");
        let fresh = registry.force_acquire(&a);
        drop(stale);
        assert!(
            registry.entry(&a.id).is_some(),
            "the takeover's entry stays"
        );
        drop(fresh);
        assert!(registry.entry(&a.id).is_none());
    }
}
