//! The effect probe: how many side effects a run-unique marker caused.
//!
//! "Exactly one side effect" is measured, not inferred from response bodies
//! (bar item 2 of the anchors): a read-only GET to a count or listing URL,
//! or, when the target has none, the distinct created-resource ids among the
//! responses the kit received.

use std::collections::BTreeSet;

use idem_spec::manifest::EffectProbe;
use serde_json::Value;

use crate::http::{Client, Request, Response};

/// Counts effects for `marker`. `seen` are the responses the kit got for
/// that logical operation (used by the resource-id probe). The caller's
/// headers are those of the probe's caller.
pub async fn effects(
    probe: &EffectProbe,
    client: &Client,
    base_url: &str,
    headers: &[(String, Vec<u8>)],
    marker: &str,
    seen: &[&Response],
) -> Result<u64, String> {
    match probe {
        EffectProbe::ResourceId { id_pointer } => Ok(distinct_ids(id_pointer, seen)),
        EffectProbe::Count {
            url, count_pointer, ..
        } => {
            let doc = get(
                client,
                base_url,
                &url.replace("{{marker}}", marker),
                headers,
            )
            .await?;
            let at = doc
                .pointer(count_pointer)
                .ok_or_else(|| format!("probe: no value at {count_pointer:?}"))?;
            match at {
                Value::Number(n) => n
                    .as_u64()
                    .ok_or_else(|| format!("probe: count {n} is not a non-negative integer")),
                Value::Array(a) => Ok(a.len() as u64),
                other => Err(format!("probe: expected a number or array, got {other}")),
            }
        }
        EffectProbe::List {
            url,
            items_pointer,
            match_pointer,
            ..
        } => {
            let doc = get(
                client,
                base_url,
                &url.replace("{{marker}}", marker),
                headers,
            )
            .await?;
            let items = doc
                .pointer(items_pointer)
                .and_then(Value::as_array)
                .ok_or_else(|| format!("probe: no array at {items_pointer:?}"))?;
            Ok(count_matching(items, match_pointer, marker))
        }
    }
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
) -> Result<Value, String> {
    let req = Request {
        method: "GET".into(),
        url: join(base_url, path),
        headers: headers.to_vec(),
        body: None,
        state_changing: false,
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
    fn resource_ids_count_distinct_successes() {
        let a = resp(201, r#"{"id":"t1"}"#);
        let b = resp(201, r#"{"id":"t1"}"#);
        let c = resp(201, r#"{"id":"t2"}"#);
        let e = resp(409, r#"{"code":"idempotency_key_in_use"}"#);
        assert_eq!(distinct_ids("/id", &[&a, &b, &e]), 1);
        assert_eq!(distinct_ids("/id", &[&a, &b, &c]), 2);
    }
}
