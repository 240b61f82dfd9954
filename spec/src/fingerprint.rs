//! Request fingerprints: what "the same request" means (clause
//! `idem.fingerprint.inputs`).
//!
//! A fingerprint is SHA-256 over a framed encoding of the method, the path
//! with its query, and the body. A JSON body is first put into its RFC 8785
//! (JCS) canonical form, so two clients that serialise the same object with
//! different key order or whitespace still match; any other body is hashed
//! byte for byte. Headers are deliberately left out: they change between
//! retries (tracing IDs, dates) without changing what the client asked for.
//!
//! JCS writes every number as the IEEE 754 double nearest to it, so it is
//! only injective on I-JSON (RFC 7493) numbers: `9007199254740993` and
//! `9007199254740992` would both become `9007199254740992`, and a retry
//! with the other amount would be replayed instead of refused. A JSON body
//! holding any number that its double does not state exactly (an integer
//! past 2^53, more digits than a double keeps, a magnitude outside the
//! double range such as `1e400`) is therefore hashed as its bytes: never a
//! collision, at the price that only a byte-identical retry of such a body
//! matches (see [`numbers_are_exact_in_jcs`]).
//!
//! The framing (see [`Fingerprint::compute`]) is published with test vectors
//! (`spec/generated/fingerprint-vectors.json`) so other implementations can
//! check themselves against this one.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Version tag hashed first, so a future change of the framing can never
/// collide with today's fingerprints.
pub const FRAMING_VERSION: &str = "idemkit-fingerprint-v1";

/// How a body was interpreted when it was fingerprinted.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum BodyKind {
    /// A JSON media type whose body parsed as JSON: hashed in JCS form.
    Json,
    /// Anything else (including JSON that failed to parse): hashed as bytes.
    Bytes,
}

/// A SHA-256 request fingerprint, shown as 64 lower-case hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Fingerprints one request.
    ///
    /// `content_type` decides how the body is read: a JSON media type
    /// (`application/json` or any `+json` suffix, parameters ignored) whose
    /// body parses is canonicalised with RFC 8785; everything else is hashed
    /// as raw bytes. The hashed input is:
    ///
    /// ```text
    /// idemkit-fingerprint-v1 LF METHOD LF path-and-query LF json|bytes LF body
    /// ```
    ///
    /// The method is upper-cased. HTTP forbids LF in the method and the
    /// request target, so the framing is unambiguous.
    pub fn compute(
        method: &str,
        path_and_query: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Self {
        let (kind, canonical) = canonical_body(content_type, body);
        let mut h = Sha256::new();
        h.update(FRAMING_VERSION.as_bytes());
        h.update(b"\n");
        h.update(method.to_ascii_uppercase().as_bytes());
        h.update(b"\n");
        h.update(path_and_query.as_bytes());
        h.update(b"\n");
        h.update(match kind {
            BodyKind::Json => b"json".as_slice(),
            BodyKind::Bytes => b"bytes".as_slice(),
        });
        h.update(b"\n");
        h.update(&canonical);
        Self(h.finalize().into())
    }

    /// The digest as lower-case hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses 64 hex digits (as stored by a key store).
    pub fn from_hex(s: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Self(out))
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// Returns how the body is read and the bytes that get hashed.
pub fn canonical_body(content_type: Option<&str>, body: &[u8]) -> (BodyKind, Vec<u8>) {
    if content_type.is_some_and(is_json_media_type)
        && let Ok(value) = serde_json::from_slice::<serde_json::Value>(body)
        && numbers_are_exact_in_jcs(body)
        && let Ok(canonical) = serde_json_canonicalizer::to_vec(&value)
    {
        return (BodyKind::Json, canonical);
    }
    (BodyKind::Bytes, body.to_vec())
}

/// Whether JCS writes every number of the JSON text `json` with exactly
/// the value the text states, so that canonicalising loses nothing.
///
/// JCS (RFC 8785 section 3.2.2.3) serialises a number as the shortest
/// decimal that round-trips its nearest double. That decimal equals the
/// written value for `100`, `1.0E2`, `0.1` or `-0` (which is `0`), but not
/// for `9007199254740993` (JCS: `9007199254740992`),
/// `0.1000000000000000000001` (JCS: `0.1`) or `1e400` (no double at all).
/// `json` must already have parsed as JSON: the scan only has to find the
/// number tokens outside strings.
pub fn numbers_are_exact_in_jcs(json: &[u8]) -> bool {
    let mut i = 0;
    let mut in_string = false;
    while i < json.len() {
        let b = json[i];
        if in_string {
            match b {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        if b == b'"' {
            in_string = true;
            i += 1;
            continue;
        }
        if b == b'-' || b.is_ascii_digit() {
            let start = i;
            while i < json.len()
                && matches!(json[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
            {
                i += 1;
            }
            let Ok(token) = std::str::from_utf8(&json[start..i]) else {
                return false;
            };
            if !number_survives_jcs(token) {
                return false;
            }
            continue;
        }
        i += 1;
    }
    true
}

/// Whether the nearest double of `token`, written as its shortest
/// round-tripping decimal (what JCS prints, up to layout), has the very
/// value `token` states.
fn number_survives_jcs(token: &str) -> bool {
    let Ok(double) = token.parse::<f64>() else {
        return false;
    };
    // Rust's `{:e}` prints the shortest digits that round-trip, as
    // ECMAScript's Number::toString does.
    double.is_finite() && exact_decimal(token) == exact_decimal(&format!("{double:e}"))
}

/// The value of a JSON number (or of Rust's `{:e}` output) as significant
/// digits and a power of ten, with no leading or trailing zero digit, so
/// that two texts have the same value exactly when their results are
/// equal. Zero, of either sign, is `("", 0)`; `None` for malformed text.
fn exact_decimal(text: &str) -> Option<(bool, String, i64)> {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], rest[at + 1..].parse::<i64>().ok()?),
        None => (rest, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = format!("{int}{frac}");
    let frac_len = i64::try_from(frac.len()).ok()?;
    let trimmed_end = digits.trim_end_matches('0');
    let trailing = i64::try_from(digits.len() - trimmed_end.len()).ok()?;
    let significant = trimmed_end.trim_start_matches('0');
    if significant.is_empty() {
        return Some((false, String::new(), 0));
    }
    let power = exponent.checked_sub(frac_len)?.checked_add(trailing)?;
    Some((negative, significant.to_owned(), power))
}

/// True for `application/json` and any `type/subtype+json`, case-insensitive,
/// parameters ignored.
pub fn is_json_media_type(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || (essence.contains('/') && essence.ends_with("+json"))
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

impl Serialize for Fingerprint {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for Fingerprint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::from_hex(&s).ok_or_else(|| serde::de::Error::custom("expected 64 hex digits"))
    }
}

impl JsonSchema for Fingerprint {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Fingerprint".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "SHA-256 request fingerprint as 64 lower-case hex digits.",
            "type": "string",
            "pattern": "^[0-9a-f]{64}$"
        })
    }
}

/// One published test vector: inputs and the expected digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
pub struct FingerprintVector {
    /// What the vector demonstrates.
    pub description: String,
    /// Request method as sent.
    pub method: String,
    /// Path with query, as sent.
    pub path_and_query: String,
    /// `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// The body as UTF-8 text (every vector body is text, to stay readable).
    pub body: String,
    /// How the body was read.
    pub body_kind: BodyKind,
    /// The exact bytes hashed after the framing header, as UTF-8 text.
    pub canonical_body: String,
    /// Expected fingerprint, lower-case hex.
    pub sha256: String,
}

/// The published fingerprint test vectors, computed by this implementation.
/// Pairs of vectors that must agree (or differ) are checked by the tests.
pub fn vectors() -> Vec<FingerprintVector> {
    let cases: [(&str, &str, &str, Option<&str>, &str); 16] = [
        (
            "JSON body, compact",
            "POST",
            "/v1/transfers",
            Some("application/json"),
            r#"{"amount":100,"from":"acc_1","to":"acc_2"}"#,
        ),
        (
            "Same JSON body, other key order and whitespace: same digest",
            "POST",
            "/v1/transfers",
            Some("application/json; charset=utf-8"),
            "{ \"to\": \"acc_2\",\n  \"from\": \"acc_1\", \"amount\": 100 }",
        ),
        (
            "One value changed: different digest",
            "POST",
            "/v1/transfers",
            Some("application/json"),
            r#"{"amount":101,"from":"acc_1","to":"acc_2"}"#,
        ),
        (
            "Other path: different digest",
            "POST",
            "/v1/payments",
            Some("application/json"),
            r#"{"amount":100,"from":"acc_1","to":"acc_2"}"#,
        ),
        (
            "Method is upper-cased",
            "patch",
            "/v1/transfers/t_1",
            Some("application/json"),
            r#"{"memo":"rent"}"#,
        ),
        (
            "Query string is part of the path",
            "POST",
            "/v1/transfers?dry_run=true",
            Some("application/json"),
            r#"{"amount":100,"from":"acc_1","to":"acc_2"}"#,
        ),
        (
            "JCS number and string forms",
            "POST",
            "/v1/things",
            Some("application/problem+json"),
            r#"{"n":1.0E2,"s":"\u00e9\u20ac","z":[3,2,1]}"#,
        ),
        (
            "Non-JSON body hashed as bytes",
            "POST",
            "/v1/upload",
            Some("text/plain"),
            "amount=100&to=acc_2",
        ),
        (
            "JSON media type but invalid JSON: bytes",
            "POST",
            "/v1/transfers",
            Some("application/json"),
            "{not json",
        ),
        ("Empty body, no content type", "POST", "/v1/ping", None, ""),
        (
            "2^53, the last integer a double holds exactly: JCS",
            "POST",
            "/v1/transfers",
            Some("application/json"),
            r#"{"amount": 9007199254740992}"#,
        ),
        (
            "2^53 + 1: JCS would round it to 2^53, so the body is hashed as bytes and differs from the vector above",
            "POST",
            "/v1/transfers",
            Some("application/json"),
            r#"{"amount": 9007199254740993}"#,
        ),
        (
            "More decimal digits than a double keeps: bytes, not JCS's 0.1",
            "POST",
            "/v1/transfers",
            Some("application/json"),
            r#"{"rate": 0.1000000000000000000001}"#,
        ),
        (
            "-0 is the number 0: JCS writes 0",
            "POST",
            "/v1/transfers",
            Some("application/json"),
            r#"{"amount": -0}"#,
        ),
        (
            "0: the same digest as -0",
            "POST",
            "/v1/transfers",
            Some("application/json"),
            r#"{"amount":0}"#,
        ),
        (
            "1e400 has no double: bytes",
            "POST",
            "/v1/transfers",
            Some("application/json"),
            r#"{"amount": 1e400}"#,
        ),
    ];
    cases
        .iter()
        .map(|(description, method, path, ct, body)| {
            let (kind, canonical) = canonical_body(*ct, body.as_bytes());
            FingerprintVector {
                description: (*description).to_owned(),
                method: (*method).to_owned(),
                path_and_query: (*path).to_owned(),
                content_type: ct.map(str::to_owned),
                body: (*body).to_owned(),
                body_kind: kind,
                canonical_body: String::from_utf8_lossy(&canonical).into_owned(),
                sha256: Fingerprint::compute(method, path, *ct, body.as_bytes()).to_hex(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // clause: idem.fingerprint.inputs
    #[test]
    fn published_vectors_agree_and_differ_where_they_say() {
        let v = vectors();
        assert_eq!(
            v[0].sha256, v[1].sha256,
            "key order and whitespace must not matter"
        );
        assert_ne!(
            v[0].sha256, v[2].sha256,
            "a changed value must change the digest"
        );
        assert_ne!(v[0].sha256, v[3].sha256, "the path is an input");
        assert_ne!(v[0].sha256, v[5].sha256, "the query is an input");
        assert_eq!(
            v[6].canonical_body,
            "{\"n\":100,\"s\":\"é€\",\"z\":[3,2,1]}"
        );
        assert_eq!(v[8].body_kind, BodyKind::Bytes);
        assert_eq!(v[10].body_kind, BodyKind::Json);
        assert_eq!(v[10].canonical_body, r#"{"amount":9007199254740992}"#);
        assert_eq!(v[11].body_kind, BodyKind::Bytes);
        assert_ne!(v[10].sha256, v[11].sha256, "2^53 + 1 is not 2^53");
        assert_eq!(v[12].body_kind, BodyKind::Bytes);
        assert_eq!(v[13].canonical_body, r#"{"amount":0}"#);
        assert_eq!(v[13].sha256, v[14].sha256, "-0 is 0");
        assert_eq!(v[15].body_kind, BodyKind::Bytes);
    }

    // clause: idem.fingerprint.inputs
    #[test]
    fn numbers_jcs_states_exactly_are_recognised() {
        for exact in [
            "0",
            "-0",
            "100",
            "1.0E2",
            "0.1",
            "-1.5",
            "1e21",
            "5e-324",
            "123456789012",
            "9007199254740992",
            "-9007199254740992",
            "1.7976931348623157e308",
            "0.30000000000000004",
        ] {
            assert!(number_survives_jcs(exact), "{exact} survives JCS");
        }
        for lossy in [
            "9007199254740993",
            "18446744073709551617",
            "0.1000000000000000000001",
            "1e400",
            "-1e400",
            "1e-400",
            "3.14159265358979323846264338327950288",
        ] {
            assert!(!number_survives_jcs(lossy), "{lossy} does not survive JCS");
        }
        // Digits inside strings are not numbers.
        assert!(numbers_are_exact_in_jcs(
            br#"{"id":"9007199254740993","n":1}"#
        ));
        assert!(numbers_are_exact_in_jcs(br#"{"s":"a\"9007199254740993"}"#));
        assert!(!numbers_are_exact_in_jcs(
            br#"{"s":"a\\","n":9007199254740993}"#
        ));
    }

    #[test]
    fn exact_decimal_normalises_layout_only() {
        assert_eq!(exact_decimal("1.0E2"), exact_decimal("100"));
        assert_eq!(exact_decimal("100"), Some((false, "1".into(), 2)));
        assert_eq!(exact_decimal("-0.00"), Some((false, String::new(), 0)));
        assert_eq!(exact_decimal("0.0012e3"), exact_decimal("1.2"));
        assert_ne!(exact_decimal("1.2"), exact_decimal("-1.2"));
        assert_eq!(exact_decimal("1.x"), None);
    }

    #[test]
    fn known_digest_of_empty_request_is_stable() {
        // Independent computation of the framing for an empty body, so the
        // framing itself is pinned and not only self-consistent.
        let mut h = Sha256::new();
        h.update(b"idemkit-fingerprint-v1\nPOST\n/v1/ping\nbytes\n");
        let expected = hex::encode(h.finalize());
        assert_eq!(
            Fingerprint::compute("post", "/v1/ping", None, b"").to_hex(),
            expected
        );
    }

    #[test]
    fn json_media_types() {
        assert!(is_json_media_type("application/json"));
        assert!(is_json_media_type("Application/JSON; charset=utf-8"));
        assert!(is_json_media_type("application/merge-patch+json"));
        assert!(!is_json_media_type("text/plain"));
        assert!(!is_json_media_type("+json"));
    }
}
