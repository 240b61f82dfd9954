//! Property tests of the key parser and the fingerprint.

use idem_spec::{Error, Fingerprint, IdempotencyKey};
use proptest::prelude::*;

fn valid_key() -> impl Strategy<Value = String> {
    proptest::collection::vec(0x21u8..=0x7E, 1..=255)
        .prop_filter("bare form may not start with a quote", |v| v[0] != b'"')
        .prop_map(|v| v.into_iter().map(char::from).collect())
}

fn published_pattern() -> regex::Regex {
    regex::Regex::new(idem_spec::key::HEADER_VALUE_PATTERN).expect("pattern compiles")
}

proptest! {
    // The OpenAPI pattern is what other tools validate headers against; it
    // must accept exactly what the parser accepts (length is a separate
    // maxLength rule, and surrounding whitespace is stripped by HTTP).
    // clause: idem.key.syntax
    #[test]
    fn published_pattern_agrees_with_the_parser(
        v in proptest::collection::vec(
            prop_oneof![
                4 => b'a'..=b'z',
                2 => 0x21u8..=0x7E,
                1 => Just(b' '),
                1 => Just(b'"'),
                1 => Just(b'\\'),
                1 => Just(b'\t'),
                1 => 0u8..0x20,
            ],
            1..12,
        )
    ) {
        let s: String = v.into_iter().map(char::from).collect();
        prop_assume!(s == s.trim_matches([' ', '\t']));
        let parsed = IdempotencyKey::parse(&s);
        prop_assert_eq!(published_pattern().is_match(&s), parsed.is_ok(), "value {:?} parser says {:?}", s, parsed);
    }

    // clause: idem.key.syntax
    #[test]
    fn accepted_keys_obey_the_rules_and_survive_quoting(k in valid_key()) {
        let key = IdempotencyKey::parse(&k).expect("valid key parses");
        prop_assert!(!key.as_str().is_empty() && key.as_str().len() <= 255);
        prop_assert!(key.as_str().bytes().all(|b| (0x21..=0x7E).contains(&b)));
        let quoted = IdempotencyKey::parse(&key.to_sf_string()).expect("quoted form parses");
        prop_assert_eq!(&quoted, &key);
        let back = IdempotencyKey::parse(&key.to_header_value()).expect("header form parses");
        prop_assert_eq!(&back, &key);
        let padded = IdempotencyKey::parse(&format!(" \t{k} ")).expect("OWS ignored");
        prop_assert_eq!(&padded, &key);
    }

    // clause: idem.key.syntax
    #[test]
    fn any_visible_key_quotes_and_unquotes(v in proptest::collection::vec(0x21u8..=0x7E, 1..=255)) {
        let s: String = v.into_iter().map(char::from).collect();
        // Build the quoted form by hand and check the parser reads it back.
        let quoted = format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
        let key = IdempotencyKey::parse(&quoted).expect("quoted key parses");
        prop_assert_eq!(key.as_str(), s.as_str());
    }

    // clause: idem.key.invalid
    #[test]
    fn too_long_keys_report_their_length(n in 256usize..600) {
        let k = "k".repeat(n);
        prop_assert_eq!(IdempotencyKey::parse(&k), Err(Error::KeyTooLong { len: n, max: 255 }));
    }

    // clause: idem.key.invalid
    #[test]
    fn a_bad_byte_is_reported_at_its_position(
        prefix in "[a-z]{1,50}",
        bad in prop_oneof![0u8..0x09, 0x0Au8..0x20, Just(0x7Fu8), 0x80u8..=0xFF],
        suffix in "[a-z]{1,50}",
    ) {
        let mut v = prefix.clone().into_bytes();
        v.push(bad);
        v.extend(suffix.bytes());
        prop_assert_eq!(
            IdempotencyKey::parse_bytes(&v),
            Err(Error::KeyBadCharacter { position: prefix.len(), byte: bad })
        );
    }

    // clause: idem.key.invalid
    #[test]
    fn inner_whitespace_is_rejected_even_when_quoted(a in "[a-z]{1,20}", b in "[a-z]{1,20}") {
        let v = format!("\"{a} {b}\"");
        prop_assert_eq!(
            IdempotencyKey::parse(&v),
            Err(Error::KeyBadCharacter { position: 1 + a.len(), byte: b' ' })
        );
    }

    // clause: idem.key.invalid
    #[test]
    fn several_header_values_are_rejected(values in proptest::collection::vec("[a-z]{1,10}", 2..5)) {
        let n = values.len();
        let r = IdempotencyKey::from_header_values(values.iter().map(|s| s.as_bytes()));
        prop_assert_eq!(r, Err(Error::KeySeveralValues { count: n }));
    }

    // Integers a double states exactly (|n| <= 2^53, I-JSON's range): a body
    // with a larger one is hashed as bytes, because JCS would round it (see
    // different_numbers_never_share_a_fingerprint).
    // clause: idem.fingerprint.canonical-json
    #[test]
    fn fingerprint_ignores_key_order_and_whitespace(
        entries in proptest::collection::btree_map("[a-z]{1,8}", -(1i64 << 53)..=(1i64 << 53), 1..8),
        ws in "[ \n\t]{0,3}",
    ) {
        let forward: Vec<String> = entries.iter().map(|(k, v)| format!("\"{k}\":{ws}{v}")).collect();
        let backward: Vec<String> = entries.iter().rev().map(|(k, v)| format!("{ws}\"{k}\" : {v}")).collect();
        let a = format!("{{{}}}", forward.join(","));
        let b = format!("{ws}{{{}}}{ws}", backward.join(&format!(",{ws}")));
        let ct = Some("application/json");
        prop_assert_eq!(
            Fingerprint::compute("POST", "/v1/x", ct, a.as_bytes()),
            Fingerprint::compute("POST", "/v1/x", ct, b.as_bytes())
        );
    }

    // clause: idem.fingerprint.inputs
    #[test]
    fn fingerprint_changes_with_method_path_or_any_value(
        entries in proptest::collection::btree_map("[a-z]{1,8}", any::<i32>(), 1..8),
        pick in any::<prop::sample::Index>(),
    ) {
        let ct = Some("application/json");
        let body = serde_json::to_vec(&entries).expect("serialise");
        let base = Fingerprint::compute("POST", "/v1/x", ct, &body);
        prop_assert_ne!(base, Fingerprint::compute("PUT", "/v1/x", ct, &body));
        prop_assert_ne!(base, Fingerprint::compute("POST", "/v1/y", ct, &body));
        prop_assert_ne!(base, Fingerprint::compute("POST", "/v1/x?a=1", ct, &body));
        let mut changed = entries.clone();
        let key = pick.get(&entries.keys().cloned().collect::<Vec<_>>()).clone();
        changed.entry(key).and_modify(|v| *v = v.wrapping_add(1));
        let body2 = serde_json::to_vec(&changed).expect("serialise");
        prop_assert_ne!(base, Fingerprint::compute("POST", "/v1/x", ct, &body2));
    }
}

proptest! {
    // Two JSON bodies that state different numbers are different requests,
    // whatever the numbers: large integers (past 2^53, where a double
    // rounds), and decimals with more digits than a double keeps.
    // clause: idem.fingerprint.inputs
    #[test]
    fn different_numbers_never_share_a_fingerprint(
        a in -(1i128 << 70)..(1i128 << 70),
        delta in 1i128..4,
        scale in 0u32..30,
    ) {
        // Neighbours: where a double has no room for both, JCS would give
        // them one form.
        let b = a + delta;
        let body = |n: i128| {
            let digits = n.unsigned_abs().to_string();
            let sign = if n < 0 { "-" } else { "" };
            let scale = scale as usize;
            let text = if scale == 0 {
                digits
            } else {
                let padded = format!("{digits:0>width$}", width = scale + 1);
                let (int, frac) = padded.split_at(padded.len() - scale);
                format!("{int}.{frac}")
            };
            format!(r#"{{"amount":{sign}{text}}}"#)
        };
        let (x, y) = (body(a), body(b));
        let fx = Fingerprint::compute("POST", "/v1/transfers", Some("application/json"), x.as_bytes());
        let fy = Fingerprint::compute("POST", "/v1/transfers", Some("application/json"), y.as_bytes());
        prop_assert_ne!(fx, fy, "{} and {} collide", x, y);
    }
}
