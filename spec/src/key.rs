//! The `Idempotency-Key` request header.
//!
//! "Parse, don't validate": an [`IdempotencyKey`] can only be obtained by
//! parsing header values, so holding one proves the key obeys the contract
//! (clause `idem.key.syntax`). Two syntaxes name the same key: the bare form
//! most clients send (`abc`) and the IETF draft's Structured-Field string
//! (`"abc"`, RFC 8941 §3.3.3, with `\"` and `\\` escapes).

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Error;

/// Longest key accepted, in characters, after unquoting.
pub const MAX_KEY_LEN: usize = 255;

/// Longest header value that can carry a valid key: a quoted key whose every
/// character is escaped (`"` + 2 × 255 + `"`).
pub const MAX_HEADER_VALUE_LEN: usize = 2 + 2 * MAX_KEY_LEN;

/// ECMA-262 pattern (for JSON Schema / OpenAPI) matching every header value
/// this parser accepts, before the length rule is applied.
pub const HEADER_VALUE_PATTERN: &str =
    r#"^(?:[\x21\x23-\x7E][\x21-\x7E]*|"(?:[\x21\x23-\x5B\x5D-\x7E]|\\["\\])+")$"#;

/// A validated idempotency key: 1–255 characters of visible ASCII.
///
/// Comparison is exact and case-sensitive. The quoted and bare spellings of
/// the same characters produce equal keys.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Parses one header value (bare or quoted). Leading and trailing spaces
    /// and tabs are optional whitespace in HTTP and are ignored.
    pub fn parse(value: &str) -> Result<Self, Error> {
        Self::parse_bytes(value.as_bytes())
    }

    /// Parses one header value given as raw bytes, as HTTP libraries expose
    /// it. Non-ASCII bytes are reported with their position.
    pub fn parse_bytes(value: &[u8]) -> Result<Self, Error> {
        let start = value
            .iter()
            .position(|b| !is_ows(*b))
            .unwrap_or(value.len());
        let end = value
            .iter()
            .rposition(|b| !is_ows(*b))
            .map_or(start, |i| i + 1);
        let trimmed = &value[start..end];
        if trimmed.is_empty() {
            return Err(Error::KeyEmpty);
        }
        let key = if trimmed[0] == b'"' {
            unquote(trimmed, start)?
        } else {
            bare(trimmed, start)?
        };
        if key.is_empty() {
            return Err(Error::KeyEmpty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(Error::KeyTooLong {
                len: key.len(),
                max: MAX_KEY_LEN,
            });
        }
        Ok(Self(key))
    }

    /// Parses the complete set of `Idempotency-Key` header fields of one
    /// request. Zero fields is [`Error::KeyMissing`]; more than one is
    /// [`Error::KeySeveralValues`], because a server cannot know which of two
    /// keys the client meant.
    pub fn from_header_values<'a, I>(values: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = &'a [u8]>,
    {
        let mut iter = values.into_iter();
        let Some(first) = iter.next() else {
            return Err(Error::KeyMissing);
        };
        let extra = iter.count();
        if extra > 0 {
            return Err(Error::KeySeveralValues { count: extra + 1 });
        }
        Self::parse_bytes(first)
    }

    /// The key's characters, unquoted.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key as an RFC 8941 sf-string (`"..."` with `"` and `\` escaped):
    /// the form the IETF draft asks clients to send.
    pub fn to_sf_string(&self) -> String {
        let mut out = String::with_capacity(self.0.len() + 2);
        out.push('"');
        for c in self.0.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        out
    }

    /// The bare form, or the quoted form when the bare form would be read
    /// back as a quoted string (a key starting with `"`).
    pub fn to_header_value(&self) -> String {
        if self.0.starts_with('"') {
            self.to_sf_string()
        } else {
            self.0.clone()
        }
    }
}

fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn is_visible(b: u8) -> bool {
    (0x21..=0x7E).contains(&b)
}

fn bare(value: &[u8], offset: usize) -> Result<String, Error> {
    if let Some(i) = value.iter().position(|b| !is_visible(*b)) {
        return Err(Error::KeyBadCharacter {
            position: offset + i,
            byte: value[i],
        });
    }
    Ok(value.iter().map(|b| char::from(*b)).collect())
}

fn unquote(value: &[u8], offset: usize) -> Result<String, Error> {
    let mut out = String::with_capacity(value.len());
    let mut i = 1;
    while i < value.len() {
        let b = value[i];
        match b {
            b'\\' => {
                match value.get(i + 1) {
                    Some(b'"') | Some(b'\\') => out.push(char::from(value[i + 1])),
                    Some(_) => {
                        return Err(Error::KeyBadEscape {
                            position: offset + i,
                        });
                    }
                    None => return Err(Error::KeyUnterminatedQuote),
                }
                i += 2;
            }
            b'"' => {
                if i + 1 < value.len() {
                    return Err(Error::KeyTrailingCharacters {
                        position: offset + i + 1,
                    });
                }
                return Ok(out);
            }
            _ if is_visible(b) => {
                out.push(char::from(b));
                i += 1;
            }
            _ => {
                return Err(Error::KeyBadCharacter {
                    position: offset + i,
                    byte: b,
                });
            }
        }
    }
    Err(Error::KeyUnterminatedQuote)
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({:?})", self.0)
    }
}

impl std::str::FromStr for IdempotencyKey {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::parse(s)
    }
}

impl Serialize for IdempotencyKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for IdempotencyKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        // Stored keys are unquoted; re-parse the bare form so a file can never
        // smuggle in a key the header parser would refuse.
        if raw.starts_with('"') {
            return Err(serde::de::Error::custom(
                "stored idempotency keys are unquoted; a key may not start with '\"' here",
            ));
        }
        Self::parse(&raw).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for IdempotencyKey {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "IdempotencyKey".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "An idempotency key after unquoting: 1 to 255 characters of visible ASCII (0x21-0x7E).",
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_KEY_LEN,
            "pattern": "^[\\x21-\\x7E]{1,255}$"
        })
    }
}

impl utoipa::PartialSchema for IdempotencyKey {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "An idempotency key after unquoting: 1 to 255 characters of visible ASCII (0x21-0x7E).",
            ))
            .min_length(Some(1))
            .max_length(Some(MAX_KEY_LEN))
            .pattern(Some("^[\\x21-\\x7E]{1,255}$"))
            .into()
    }
}

impl utoipa::ToSchema for IdempotencyKey {}

#[cfg(test)]
mod tests {
    use super::*;

    // clause: idem.key.syntax
    #[test]
    fn quoted_and_bare_name_the_same_key() {
        let bare = IdempotencyKey::parse("order-42").expect("bare");
        let quoted = IdempotencyKey::parse("\"order-42\"").expect("quoted");
        assert_eq!(bare, quoted);
        let escaped = IdempotencyKey::parse(r#""a\"b\\c""#).expect("escaped");
        assert_eq!(escaped.as_str(), r#"a"b\c"#);
        assert_eq!(escaped.to_sf_string(), r#""a\"b\\c""#);
    }

    // clause: idem.key.syntax
    #[test]
    fn each_rejection_names_its_reason() {
        use Error::*;
        assert_eq!(IdempotencyKey::parse(""), Err(KeyEmpty));
        assert_eq!(IdempotencyKey::parse("  "), Err(KeyEmpty));
        assert_eq!(IdempotencyKey::parse("\"\""), Err(KeyEmpty));
        assert_eq!(
            IdempotencyKey::parse(&"a".repeat(256)),
            Err(KeyTooLong { len: 256, max: 255 })
        );
        assert_eq!(
            IdempotencyKey::parse("ab c"),
            Err(KeyBadCharacter {
                position: 2,
                byte: b' '
            })
        );
        assert_eq!(
            IdempotencyKey::parse_bytes(b"ab\xC3\xA9"),
            Err(KeyBadCharacter {
                position: 2,
                byte: 0xC3
            })
        );
        assert_eq!(IdempotencyKey::parse("\"abc"), Err(KeyUnterminatedQuote));
        assert_eq!(
            IdempotencyKey::parse(r#""ab\n""#),
            Err(KeyBadEscape { position: 3 })
        );
        assert_eq!(
            IdempotencyKey::parse(r#""ab"c"#),
            Err(KeyTrailingCharacters { position: 4 })
        );
        assert_eq!(
            IdempotencyKey::from_header_values([b"a".as_slice(), b"b".as_slice()]),
            Err(KeySeveralValues { count: 2 })
        );
        assert_eq!(IdempotencyKey::from_header_values([]), Err(KeyMissing));
    }

    #[test]
    fn boundaries_are_inclusive() {
        assert!(IdempotencyKey::parse("x").is_ok());
        assert!(IdempotencyKey::parse(&"x".repeat(255)).is_ok());
        let quoted_max = format!("\"{}\"", "\\\"".repeat(255));
        assert_eq!(quoted_max.len(), MAX_HEADER_VALUE_LEN);
        assert_eq!(
            IdempotencyKey::parse(&quoted_max).map(|k| k.as_str().len()),
            Ok(255)
        );
    }

    #[test]
    fn serde_refuses_invalid_stored_keys() {
        assert!(serde_json::from_str::<IdempotencyKey>("\"ok-key\"").is_ok());
        assert!(serde_json::from_str::<IdempotencyKey>("\"bad key\"").is_err());
    }
}
