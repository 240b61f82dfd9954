//! The effect probe: how many side effects a run-unique marker caused.
//!
//! "Exactly one side effect" is measured, not inferred from response bodies
//! (bar item 2 of the anchors): a read-only GET to a count or listing URL,
//! or, when the target has none, the distinct created-resource ids among the
//! responses the kit received.

use std::collections::BTreeSet;

use idem_spec::manifest::{EffectProbe, MatchOn};
use serde_json::Value;

use crate::server::http::{Client, Request, Response};

/// The operation a probe is asked about: its run-unique marker and the
/// idempotency keys it was sent with (unquoted).
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// The marker the operation's body (or headers, or path) carried.
    pub marker: &'a str,
    /// The keys the operation was sent with.
    pub keys: &'a [String],
}

/// Why a probe produced no count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeError {
    /// The probe matches effects by key, and the operation carried none:
    /// nothing can be counted (the check is inconclusive, not an error).
    NoKey,
    /// The probe could not be read: a harness problem.
    Failed(String),
}

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoKey => f.write_str(
                "the probe matches effects by idempotency key and this operation carried none",
            ),
            Self::Failed(s) => f.write_str(s),
        }
    }
}

/// Whether the probe matches effects by idempotency key.
pub fn by_key(probe: &EffectProbe) -> bool {
    match probe {
        EffectProbe::Count { url, .. } => url.contains("{{key}}"),
        EffectProbe::List { url, match_on, .. } => {
            *match_on == MatchOn::Key || url.contains("{{key}}")
        }
        EffectProbe::ResourceId { .. } => false,
    }
}

/// Counts effects for `subject`. `seen` are the responses the kit got for
/// that logical operation (used by the resource-id probe). `headers` are
/// those of the probe's caller, and `signed_by` names it when it signs.
pub async fn effects(
    probe: &EffectProbe,
    client: &Client,
    base_url: &str,
    headers: &[(String, Vec<u8>)],
    signed_by: Option<String>,
    subject: Subject<'_>,
    seen: &[&Response],
) -> Result<u64, ProbeError> {
    let keyed = by_key(probe);
    if keyed && subject.keys.is_empty() {
        return Err(ProbeError::NoKey);
    }
    // One URL per key when the URL names the key, else one URL.
    let urls = |url: &str| -> Vec<String> {
        let url = url.replace("{{marker}}", subject.marker);
        if url.contains("{{key}}") {
            subject
                .keys
                .iter()
                .map(|k| url.replace("{{key}}", &url_escape(k)))
                .collect()
        } else {
            vec![url]
        }
    };
    match probe {
        EffectProbe::ResourceId { id_pointer } => Ok(distinct_ids(id_pointer, seen)),
        EffectProbe::Count {
            url, count_pointer, ..
        } => {
            let mut total = 0;
            for u in urls(url) {
                let doc = get(client, base_url, &u, headers, signed_by.clone()).await?;
                let at = doc.pointer(count_pointer).ok_or_else(|| {
                    ProbeError::Failed(format!("probe GET {u}: no value at {count_pointer:?}"))
                })?;
                total += match at {
                    Value::Number(n) => n.as_u64().ok_or_else(|| {
                        ProbeError::Failed(format!(
                            "probe GET {u}: count {n} is not a non-negative integer"
                        ))
                    })?,
                    Value::Array(a) => a.len() as u64,
                    other => {
                        return Err(ProbeError::Failed(format!(
                            "probe GET {u}: expected a number or array at {count_pointer:?}, got {other}"
                        )));
                    }
                };
            }
            Ok(total)
        }
        EffectProbe::List {
            url,
            items_pointer,
            match_pointer,
            match_on,
            ..
        } => {
            let wanted: Vec<&str> = match match_on {
                MatchOn::Marker => vec![subject.marker],
                MatchOn::Key => subject.keys.iter().map(String::as_str).collect(),
            };
            // Items are deduplicated across the per-key pages by their
            // whole value, so one effect listed under two URLs counts once.
            let mut items = BTreeSet::new();
            for u in urls(url) {
                let doc = get(client, base_url, &u, headers, signed_by.clone()).await?;
                let list = doc
                    .pointer(items_pointer)
                    .and_then(Value::as_array)
                    .ok_or_else(|| {
                        ProbeError::Failed(format!("probe GET {u}: no array at {items_pointer:?}"))
                    })?;
                for i in list {
                    if i.pointer(match_pointer)
                        .and_then(Value::as_str)
                        .is_some_and(|v| wanted.contains(&v))
                    {
                        items.insert(i.to_string());
                    }
                }
            }
            Ok(items.len() as u64)
        }
    }
}

/// Percent-encodes what a key may contain that a query value may not.
fn url_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Items whose `match_pointer` value is the string `marker`.
pub fn count_matching(items: &[Value], match_pointer: &str, marker: &str) -> u64 {
    items
        .iter()
        .filter(|i| i.pointer(match_pointer).and_then(Value::as_str) == Some(marker))
        .count() as u64
}

/// Distinct ids at `pointer` among 2xx responses.
pub fn distinct_ids(pointer: &str, seen: &[&Response]) -> u64 {
    seen.iter()
        .filter(|r| (200..300).contains(&r.status))
        .filter_map(|r| r.json()?.pointer(pointer).map(Value::to_string))
        .collect::<BTreeSet<_>>()
        .len() as u64
}

/// Joins a path (or passes an absolute URL through) to the base URL.
pub fn join(base_url: &str, path: &str) -> String {
    if path.starts_with("http://") || path.starts_with("https://") {
        path.to_owned()
    } else {
        format!("{}{}", base_url.trim_end_matches('/'), path)
    }
}

async fn get(
    client: &Client,
    base_url: &str,
    path: &str,
    headers: &[(String, Vec<u8>)],
    signed_by: Option<String>,
) -> Result<Value, ProbeError> {
    get_text(client, base_url, path, headers, signed_by)
        .await
        .map_err(ProbeError::Failed)
}

async fn get_text(
    client: &Client,
    base_url: &str,
    path: &str,
    headers: &[(String, Vec<u8>)],
    signed_by: Option<String>,
) -> Result<Value, String> {
    let req = Request {
        method: "GET".into(),
        url: join(base_url, path),
        headers: headers.to_vec(),
        body: None,
        state_changing: false,
        signed_by,
    };
    let resp = client
        .send(&req)
        .await
        .map_err(|f| format!("probe GET {path}: {f}"))?;
    if resp.status != 200 {
        return Err(format!("probe GET {path}: status {}", resp.status));
    }
    resp.json()
        .ok_or_else(|| format!("probe GET {path}: body is not JSON"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(status: u16, body: &str) -> Response {
        Response {
            status,
            headers: vec![],
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn list_probe_counts_only_the_marker() {
        let items: Vec<Value> = serde_json::from_str(
            r#"[{"reference":"m1"},{"reference":"m2"},{"reference":"m1"},{"x":1}]"#,
        )
        .expect("json");
        assert_eq!(count_matching(&items, "/reference", "m1"), 2);
        assert_eq!(count_matching(&items, "/reference", "m3"), 0);
    }

    #[test]
    fn keys_are_escaped_for_query_strings() {
        assert_eq!(url_escape("run-1\"q\\ x"), "run-1%22q%5C%20x");
    }

    #[test]
    fn key_matched_probes_are_recognised() {
        let list = |match_on| EffectProbe::List {
            url: "/v1/orders".into(),
            items_pointer: "/items".into(),
            match_pointer: "/idempotency_key".into(),
            match_on,
            caller: None,
        };
        assert!(by_key(&list(MatchOn::Key)));
        assert!(!by_key(&list(MatchOn::Marker)));
        let count = |url: &str| EffectProbe::Count {
            url: url.into(),
            count_pointer: "/count".into(),
            caller: None,
        };
        assert!(by_key(&count("/x?idempotency_key={{key}}")));
        assert!(!by_key(&count("/x?marker={{marker}}")));
    }

    #[test]
    fn resource_ids_count_distinct_successes() {
        let a = resp(201, r#"{"id":"t1"}"#);
        let b = resp(201, r#"{"id":"t1"}"#);
        let c = resp(201, r#"{"id":"t2"}"#);
        let e = resp(409, r#"{"code":"idempotency_key_in_use"}"#);
        assert_eq!(distinct_ids("/id", &[&a, &b, &e]), 1);
        assert_eq!(distinct_ids("/id", &[&a, &b, &c]), 2);
    }
}
