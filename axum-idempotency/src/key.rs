//! Identities: who a key belongs to, which record it names, and which claim
//! on it a write carries.
//!
//! Three types instead of loose strings, so a caller cannot be passed where
//! a key is expected and a write cannot forget its fencing generation:
//!
//! - [`Caller`]: the authenticated principal keys are scoped to, inserted by
//!   the application's authentication;
//! - [`KeyId`]: (caller, key), the identity of one record (clause
//!   `idem.scope.caller`);
//! - [`Fence`]: a [`KeyId`] at one fencing generation, carried by every
//!   write made under a claim (clause `idem.lease.fencing`).

use std::fmt;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use idem_spec::IdempotencyKey;

use crate::Error;

/// The authenticated caller: the first half of every key's scope.
///
/// Your authentication inserts it into the request extensions before the
/// idempotency layer runs. The same key sent by two callers names two
/// unrelated records. What counts as one caller is your choice: a user, an
/// API key, a tenant.
///
/// It is also an extractor (401 problem when missing).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Caller(String);

impl Caller {
    /// A caller named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }

    /// The caller's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Error> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or(Error::Unauthenticated)
    }
}

/// (caller, key): the identity of one idempotency record.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId {
    caller: Caller,
    key: IdempotencyKey,
}

impl KeyId {
    /// The record of `key` sent by `caller`.
    pub fn new(caller: Caller, key: IdempotencyKey) -> Self {
        Self { caller, key }
    }

    /// Rebuilds an identity read back from a store, where both halves were
    /// validated when they were written.
    pub(crate) fn from_stored(caller: String, key: &str) -> Result<Self, Error> {
        let key = IdempotencyKey::parse(key)
            .map_err(|e| Error::Internal(format!("stored key unreadable: {e}")))?;
        Ok(Self::new(Caller::new(caller), key))
    }

    /// The caller.
    pub fn caller(&self) -> &Caller {
        &self.caller
    }

    /// The key.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// This record at fencing generation `generation`.
    pub fn fence(&self, generation: i64) -> Fence {
        Fence {
            id: self.clone(),
            generation,
        }
    }
}

impl KeyId {
    /// How logs name this record: its `key_hash`, the first 16 hex digits
    /// of SHA-256 over the caller and the key, as on the request's span
    /// ([`crate::metrics::key_hash`]). Stable across retries; reveals
    /// neither the key nor the caller.
    pub fn key_hash(&self) -> String {
        crate::metrics::key_hash(self.caller.as_str(), self.key.as_str())
    }
}

// Debug and Display are what logs and error messages print, so neither
// shows the key (a client's idempotency key can carry an order number or
// worse, and logs travel further than the database): both print the
// record's `key_hash`. The key itself is `KeyId::key`.
impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({})", self.key_hash())
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key_hash())
    }
}

/// A claim on a record at one fencing generation.
///
/// Every write made under a claim carries one, and the store refuses it
/// ([`Error::Fenced`]) when the record's generation has moved on: another
/// worker took the key over, so this one may change nothing.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Fence {
    id: KeyId,
    generation: i64,
}

impl Fence {
    /// The record.
    pub fn id(&self) -> &KeyId {
        &self.id
    }

    /// The generation this claim holds (1 for a first claim, +1 on every
    /// re-claim or takeover).
    pub fn generation(&self) -> i64 {
        self.generation
    }
}

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.id, self.generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(caller: &str, key: &str) -> KeyId {
        KeyId::new(
            Caller::new(caller),
            IdempotencyKey::parse(key).expect("valid key"),
        )
    }

    #[test]
    fn the_same_key_of_two_callers_is_two_records() {
        assert_ne!(id("alice", "k"), id("bob", "k"));
        assert_eq!(id("alice", "k"), id("alice", "\"k\""), "quoted = bare");
    }

    #[test]
    fn fences_compare_by_generation_too() {
        let k = id("alice", "k");
        assert_eq!(k.fence(2), k.fence(2));
        assert_ne!(k.fence(2), k.fence(3));
        assert_eq!(k.fence(2).to_string(), format!("{}@2", k.key_hash()));
    }

    #[test]
    fn logs_name_a_record_by_its_hash_never_by_its_key() {
        let k = id("alice", "order-8412");
        let hash = crate::metrics::key_hash("alice", "order-8412");
        assert_eq!(k.to_string(), hash);
        assert_eq!(format!("{k:?}"), format!("KeyId({hash})"));
        let fence = format!("{:?} {}", k.fence(3), k.fence(3));
        assert!(
            !fence.contains("order-8412") && !fence.contains("alice"),
            "{fence}"
        );
        assert!(fence.contains(&hash), "{fence}");
        // The same record spelled quoted or bare has one hash.
        assert_eq!(id("alice", "\"order-8412\"").key_hash(), hash);
    }

    #[test]
    fn stored_identities_are_revalidated() {
        assert_eq!(
            KeyId::from_stored("alice".into(), "k").ok(),
            Some(id("alice", "k"))
        );
        assert!(KeyId::from_stored("alice".into(), "").is_err());
    }
}
