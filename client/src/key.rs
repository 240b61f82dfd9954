//! Idempotency keys from the caller's side: one per logical operation, never one per attempt.
//!
//! The contract's guarantee only holds when every attempt of an operation carries the same key
//! (clause `idem.client.same-key`), and the key must survive a crash of the caller to be worth
//! anything: a process that restarts and mints a new key has started a new operation. So the
//! preferred key is one *derived* from the event that caused the work (`order-confirm-8412`),
//! which a restarted process derives again; the fallback is a random UUID minted once and
//! persisted by the caller before the first attempt (clause `idem.client.key-derivation`).
//!
//! How the API makes a fresh key per attempt impossible: the middleware resolves the key once,
//! before its loop, writes it into the one request it holds, and re-sends clones of that request.
//! Nothing the caller can pass (the hook sees an immutable event, never the request) runs
//! between attempts and could change it.

use idem_spec::IdempotencyKey;

use crate::Error;

/// Mints a random key (UUID v4, 36 characters) for one logical operation. Persist it before the
/// first attempt if the operation must survive a restart.
pub fn mint_key() -> IdempotencyKey {
    let id = uuid::Uuid::new_v4().hyphenated().to_string();
    match IdempotencyKey::parse(&id) {
        Ok(key) => key,
        // A hyphenated UUID is 36 characters of [0-9a-f-]: always a valid key. Not request
        // data, so this invariant cannot be broken by a caller or a server.
        Err(e) => unreachable!("a hyphenated UUID is a valid key: {e}"),
    }
}

/// Derives a key from the event that caused the operation: `{operation}-{event_id}`, e.g.
/// `derive_key("order-confirm", "8412")` is `order-confirm-8412`. Fails when the result is not a
/// valid key (spaces, non-ASCII, longer than 255 characters).
pub fn derive_key(
    operation: &str,
    event_id: impl std::fmt::Display,
) -> Result<IdempotencyKey, Error> {
    let raw = format!("{operation}-{event_id}");
    IdempotencyKey::parse(&raw).map_err(|source| Error::InvalidKey { key: raw, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    // clause: idem.client.key-derivation
    #[test]
    fn derived_keys_are_stable_and_validated() {
        let a = derive_key("order-confirm", 8412).expect("valid");
        let b = derive_key("order-confirm", "8412").expect("valid");
        assert_eq!(a.as_str(), "order-confirm-8412");
        assert_eq!(a, b);
        assert!(matches!(
            derive_key("order confirm", 1),
            Err(Error::InvalidKey { .. })
        ));
        assert!(derive_key(&"x".repeat(250), 123_456).is_err());
    }

    // clause: idem.client.key-derivation, idem.client.key-per-operation
    #[test]
    fn minted_keys_are_uuids_and_distinct() {
        let a = mint_key();
        let b = mint_key();
        assert_eq!(a.as_str().len(), 36);
        assert!(uuid::Uuid::parse_str(a.as_str()).is_ok());
        assert_ne!(a, b);
    }
}
