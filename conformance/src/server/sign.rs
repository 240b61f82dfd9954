//! Request signing for callers known by a signature rather than a header
//! (webhook senders): the kit signs each request as it leaves, so every
//! resend of one logical request carries a fresh timestamp and signature,
//! as a real sender's redelivery does.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use std::collections::BTreeMap;

use idem_spec::manifest::{Caller, Signing, SigningScheme};

/// The header Standard Webhooks carries the message id in.
const WEBHOOK_ID: &str = "webhook-id";
const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
const WEBHOOK_SIGNATURE: &str = "webhook-signature";

/// One caller's signing key, decoded once when the run starts.
#[derive(Clone)]
pub struct Signer {
    scheme: SigningScheme,
    key: Vec<u8>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is a secret: never in a log or a panic message.
        write!(f, "Signer({:?})", self.scheme)
    }
}

/// The signers of every caller that signs, by caller name; the error names
/// the caller whose secret is wrong. Manifest validation and the run's
/// client both use it, so a manifest that loads always has its signers.
pub fn signers(callers: &[Caller]) -> Result<BTreeMap<String, Signer>, String> {
    callers
        .iter()
        .filter_map(|c| c.signing.as_ref().map(|decl| (c, decl)))
        .map(|(c, decl)| {
            Signer::new(decl)
                .map(|s| (c.name.clone(), s))
                .map_err(|e| format!("caller {:?}: signing.secret: {e}", c.name))
        })
        .collect()
}

impl Signer {
    /// Decodes a manifest's declaration; the error says what is wrong with
    /// the secret without repeating it.
    pub fn new(decl: &Signing) -> Result<Self, String> {
        match decl.scheme {
            SigningScheme::StandardWebhooks => {
                let Some(b64) = decl.secret.strip_prefix("whsec_") else {
                    return Err(
                        "a standard-webhooks secret starts with \"whsec_\" followed by the base64 of the key"
                            .to_owned(),
                    );
                };
                let key = base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .map_err(|e| {
                        format!("the standard-webhooks secret after \"whsec_\" is not base64: {e}")
                    })?;
                if key.is_empty() {
                    return Err("the standard-webhooks secret is empty".to_owned());
                }
                Ok(Self {
                    scheme: decl.scheme,
                    key,
                })
            }
        }
    }

    /// Adds the scheme's headers to `headers` for `body` at `now_secs`,
    /// replacing any earlier signature. The message id signed is the
    /// request's own `webhook-id` (the key, when the key travels there),
    /// and empty when the request has none, so a keyless request stays
    /// keyless and the receiver, having checked the signature, can refuse
    /// it as a missing key.
    pub fn sign(&self, headers: &mut Vec<(String, Vec<u8>)>, body: &[u8], now_secs: u64) {
        match self.scheme {
            SigningScheme::StandardWebhooks => {
                headers.retain(|(n, _)| {
                    !n.eq_ignore_ascii_case(WEBHOOK_TIMESTAMP)
                        && !n.eq_ignore_ascii_case(WEBHOOK_SIGNATURE)
                });
                let id = headers
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(WEBHOOK_ID))
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default();
                let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&self.key)
                    .expect("HMAC takes a key of any length");
                mac.update(&id);
                mac.update(format!(".{now_secs}.").as_bytes());
                mac.update(body);
                let sig =
                    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
                headers.push((
                    WEBHOOK_TIMESTAMP.to_owned(),
                    now_secs.to_string().into_bytes(),
                ));
                headers.push((
                    WEBHOOK_SIGNATURE.to_owned(),
                    format!("v1,{sig}").into_bytes(),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decl(secret: &str) -> Signing {
        Signing {
            scheme: SigningScheme::StandardWebhooks,
            secret: secret.to_owned(),
        }
    }

    // The Standard Webhooks specification's own example: this id, timestamp,
    // payload and secret give this signature.
    #[test]
    fn signs_the_standard_webhooks_example() {
        let s = Signer::new(&decl("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")).expect("secret");
        let mut h = vec![(
            "webhook-id".to_owned(),
            b"msg_p5jXN8AQM9LWM0D4loKWxJek".to_vec(),
        )];
        s.sign(&mut h, br#"{"test": 2432232314}"#, 1614265330);
        let sig = h
            .iter()
            .find(|(n, _)| n == "webhook-signature")
            .expect("signed");
        assert_eq!(
            String::from_utf8_lossy(&sig.1),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn a_resign_replaces_the_signature_and_a_keyless_request_stays_keyless() {
        let s = Signer::new(&decl("whsec_c2VjcmV0")).expect("secret");
        let mut h = vec![("webhook-id".to_owned(), b"evt_1".to_vec())];
        s.sign(&mut h, b"{}", 100);
        let first = h.clone();
        s.sign(&mut h, b"{}", 200);
        let names: Vec<&str> = h.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["webhook-id", "webhook-timestamp", "webhook-signature"]
        );
        assert_eq!(h[1].1, b"200");
        assert_ne!(first[2].1, h[2].1, "a new timestamp, a new signature");
        let mut keyless = vec![];
        s.sign(&mut keyless, b"{}", 100);
        assert!(keyless.iter().all(|(n, _)| n != "webhook-id"));
        assert_eq!(keyless.len(), 2);
    }

    #[test]
    fn a_malformed_secret_is_refused_without_being_repeated() {
        for bad in ["c2VjcmV0", "whsec_***", "whsec_"] {
            let e = Signer::new(&decl(bad)).expect_err(bad);
            assert!(!e.contains("***") && e.contains("standard-webhooks"), "{e}");
        }
    }
}
