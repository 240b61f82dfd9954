//! Keys in the target's own grammar (`[key]` in the manifest): a UUID, a
//! length limit, a prefix, a character set. Every key the kit sends to use
//! an endpoint (not to test the grammar itself) is minted here, unique per
//! run and per counter value in every grammar.

use idem_spec::manifest::{KeyCharset, KeyDecl, KeyFormat};
use sha2::{Digest, Sha256};

/// The contract's longest key.
pub const CONTRACT_MAX_LEN: usize = 255;

/// The shortest `max_len` with which a run's keys stay unique: the prefix
/// and 16 characters of hash.
pub fn min_len(decl: &KeyDecl) -> usize {
    decl.prefix.len() + 16
}

/// Key number `n` of run `run_id` in the declared grammar.
///
/// The contract's grammar keeps the readable `RUN-kN` form (a report reader
/// can tell keys apart); a narrower grammar gets a form derived from a
/// SHA-256 of the run and the counter, so uniqueness never depends on the
/// run ID's own characters.
pub fn mint(decl: &KeyDecl, run_id: &str, n: u64) -> String {
    let readable = format!("{}{run_id}-k{n}", decl.prefix);
    let max = usize::from(decl.max_len.unwrap_or(CONTRACT_MAX_LEN as u16));
    if decl.format == KeyFormat::Any
        && readable.len() <= max
        && readable[decl.prefix.len()..]
            .bytes()
            .all(|b| allowed(decl.charset, b))
    {
        return readable;
    }
    let digest = Sha256::digest(format!("{run_id}/{n}").as_bytes());
    match decl.format {
        KeyFormat::Uuid => uuid_v4(&digest),
        KeyFormat::Any => {
            let body: String = match decl.charset {
                // Hex is in every charset: letters and digits only.
                KeyCharset::Hex
                | KeyCharset::Alnum
                | KeyCharset::AlnumDash
                | KeyCharset::Visible => hex::encode(digest),
            };
            let room = max.saturating_sub(decl.prefix.len()).max(1);
            format!("{}{}", decl.prefix, &body[..room.min(body.len())])
        }
    }
}

/// Whether `key` follows the declared grammar.
pub fn conforms(decl: &KeyDecl, key: &str) -> bool {
    let max = usize::from(decl.max_len.unwrap_or(CONTRACT_MAX_LEN as u16));
    if key.is_empty() || key.len() > max {
        return false;
    }
    match decl.format {
        KeyFormat::Uuid => {
            uuid::Uuid::try_parse(key).is_ok_and(|u| u.hyphenated().to_string() == key)
        }
        KeyFormat::Any => key
            .strip_prefix(decl.prefix.as_str())
            .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| allowed(decl.charset, b))),
    }
}

/// The grammar, for reports and preflight messages.
pub fn describe(decl: &KeyDecl) -> String {
    let mut parts = vec![match decl.format {
        KeyFormat::Any => "any key".to_owned(),
        KeyFormat::Uuid => "a UUID".to_owned(),
    }];
    if !decl.prefix.is_empty() {
        parts.push(format!("prefix {:?}", decl.prefix));
    }
    if decl.charset != KeyCharset::Visible {
        parts.push(format!("charset {:?}", decl.charset));
    }
    if let Some(m) = decl.max_len {
        parts.push(format!("at most {m} characters"));
    }
    parts.join(", ")
}

/// What is wrong with a declaration, if anything.
pub fn invalid(decl: &KeyDecl) -> Option<String> {
    if decl.format == KeyFormat::Uuid && !decl.prefix.is_empty() {
        return Some("key.prefix cannot be combined with key.format = \"uuid\"".into());
    }
    if let Some(m) = decl.max_len {
        let m = usize::from(m);
        if m > CONTRACT_MAX_LEN {
            return Some(format!(
                "key.max_len = {m} is longer than the contract's {CONTRACT_MAX_LEN}"
            ));
        }
        let need = if decl.format == KeyFormat::Uuid {
            36
        } else {
            min_len(decl)
        };
        if m < need {
            return Some(format!(
                "key.max_len = {m} leaves no room for unique keys: the kit needs at least {need} characters"
            ));
        }
    }
    if !decl.prefix.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Some(format!("key.prefix {:?} is not visible ASCII", decl.prefix));
    }
    None
}

fn allowed(charset: KeyCharset, b: u8) -> bool {
    match charset {
        KeyCharset::Visible => (0x21..=0x7e).contains(&b),
        KeyCharset::AlnumDash => b.is_ascii_alphanumeric() || b == b'-' || b == b'_',
        KeyCharset::Alnum => b.is_ascii_alphanumeric(),
        KeyCharset::Hex => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
    }
}

fn uuid_v4(digest: &[u8]) -> String {
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_random_bytes(bytes)
        .into_uuid()
        .hyphenated()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn decl(format: KeyFormat, max_len: Option<u16>, prefix: &str, charset: KeyCharset) -> KeyDecl {
        KeyDecl {
            format,
            max_len,
            prefix: prefix.into(),
            charset,
            header: None,
            body_pointer: None,
        }
    }

    #[test]
    fn every_grammar_gets_unique_keys_that_follow_it() {
        let run = "idemconf-0123456789";
        let grammars = [
            KeyDecl::default(),
            decl(KeyFormat::Uuid, None, "", KeyCharset::Visible),
            decl(KeyFormat::Any, Some(20), "", KeyCharset::Visible),
            decl(KeyFormat::Any, None, "idk_", KeyCharset::Alnum),
            decl(KeyFormat::Any, Some(24), "k-", KeyCharset::Hex),
            decl(KeyFormat::Any, None, "", KeyCharset::AlnumDash),
        ];
        for g in &grammars {
            assert_eq!(invalid(g), None, "{g:?}");
            let keys: BTreeSet<String> = (0..2000).map(|n| mint(g, run, n)).collect();
            assert_eq!(keys.len(), 2000, "{g:?}: keys repeat");
            for k in &keys {
                assert!(conforms(g, k), "{g:?}: {k:?} breaks the grammar");
                assert!(
                    crate::server::keyform::conforms(&KeyDecl::default(), k),
                    "{k:?}: not a contract key"
                );
            }
        }
        // The contract's grammar keeps the readable form.
        assert_eq!(mint(&KeyDecl::default(), run, 7), "idemconf-0123456789-k7");
        // A UUID grammar gets version-4 UUIDs.
        let u = mint(&grammars[1], run, 1);
        assert_eq!(
            uuid::Uuid::parse_str(&u).map(|u| u.get_version_num()),
            Ok(4)
        );
    }

    #[test]
    fn declarations_that_cannot_work_are_refused() {
        assert!(invalid(&decl(KeyFormat::Uuid, None, "p_", KeyCharset::Visible)).is_some());
        assert!(invalid(&decl(KeyFormat::Any, Some(8), "", KeyCharset::Visible)).is_some());
        assert!(invalid(&decl(KeyFormat::Uuid, Some(30), "", KeyCharset::Visible)).is_some());
        assert!(invalid(&decl(KeyFormat::Any, Some(300), "", KeyCharset::Visible)).is_some());
        assert!(!conforms(
            &decl(KeyFormat::Uuid, None, "", KeyCharset::Visible),
            "idemconf-1-k1"
        ));
        assert!(!conforms(
            &decl(KeyFormat::Any, None, "idk_", KeyCharset::Alnum),
            "idk_a-b"
        ));
    }
}
