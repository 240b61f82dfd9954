//! Every case, grouped by clause family: one module per family, each
//! exporting `cases()` with the same small shape ([`crate::case::Case`]).

use idem_spec::ErrorCode;
use idem_spec::headers::IDEMPOTENCY_KEY;
use idem_spec::manifest::Manifest;
use idem_spec::problem::PROBLEM_CONTENT_TYPE;
use serde_json::Value;

use crate::case::{Case, Rec, is_error, wire_desc};
use crate::http::Response;

pub mod concurrency;
pub mod failure;
pub mod inflight;
pub mod keys;
pub mod lost_response;
pub mod mismatch;
pub mod recovery;
pub mod replay;
pub mod scoping;
pub mod windows;

/// Every case, in run order. Cases that advance the target's clock or
/// restart it come last, so they cannot disturb the others.
pub fn all() -> Vec<Case> {
    let mut v = Vec::new();
    v.extend(keys::cases());
    v.extend(replay::cases());
    v.extend(mismatch::cases());
    v.extend(scoping::cases());
    v.extend(failure::cases());
    v.extend(inflight::cases());
    v.extend(concurrency::cases());
    v.extend(lost_response::cases());
    v.push(crate::model::case());
    v.extend(windows::cases());
    v.extend(recovery::cases());
    v
}

/// Whether `r` is an RFC 9457 problem document with the contract's members
/// and a status matching the HTTP status. Returns a description of what is
/// missing when it is not.
pub fn problem_shape(r: &Response) -> Result<(), String> {
    let ct = r.header("content-type").unwrap_or("");
    if !ct.starts_with(PROBLEM_CONTENT_TYPE) {
        return Err(format!("Content-Type {ct:?}, not {PROBLEM_CONTENT_TYPE}"));
    }
    let Some(doc) = r.json() else {
        return Err("body is not JSON".into());
    };
    let mut missing = Vec::new();
    for m in ["type", "title", "detail", "code"] {
        if !doc.get(m).is_some_and(Value::is_string) {
            missing.push(m);
        }
    }
    if doc.get("status").and_then(Value::as_u64) != Some(u64::from(r.status)) {
        missing.push("status (equal to the HTTP status)");
    }
    if !doc.get("retryable").is_some_and(Value::is_boolean) {
        missing.push("retryable");
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("problem document lacks {}", missing.join(", ")))
    }
}

/// Checks that `r` is the contract error `code` under the declared profile
/// (against `clause` and `idem.errors.profiles`) and a well-formed problem
/// document (`idem.errors.problem-json`).
pub fn check_error(rec: &mut Rec, clause: &'static str, r: &Response, code: ErrorCode, what: &str) {
    let ctx = rec.ctx.clone();
    let m = &ctx.manifest;
    let want = wire_desc(m, code);
    let ok = is_error(m, r, code);
    let observed = format!("{what}: {}", r.summary());
    rec.check(clause, ok, format!("{what}: {want}"), observed.clone());
    // The profile check is about the spelling only when the right family of
    // answer came back (a 4xx): a 2xx is already a failure of `clause`.
    if (400..500).contains(&r.status) {
        rec.check(
            "idem.errors.profiles",
            ok,
            format!("{what}: {want} (profile {})", m.profile.base),
            observed,
        );
        let shape = problem_shape(r);
        rec.check(
            "idem.errors.problem-json",
            shape.is_ok(),
            "application/problem+json with type, title, status, detail, code, retryable",
            shape
                .err()
                .unwrap_or_else(|| "a well-formed problem document".into()),
        );
    }
}

/// Sends a fresh operation of `caller` with `key`; returns the request, the
/// response and the marker. The first execution must be a 2xx without the
/// replay marker; anything else stops the case as inconclusive (the target
/// could not even perform a fresh operation, so nothing else can be judged).
pub async fn fresh(
    rec: &mut Rec,
    caller: usize,
    key: &str,
) -> Option<(crate::http::Request, Response, String)> {
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(caller, &marker);
    let req = rec.ctx.op(caller, Some(key), &body);
    let alias = rec.alias(key);
    let name = rec.ctx.caller(caller).name.clone();
    let r = rec
        .send(&format!("{name} sends a new operation with {alias}"), &req)
        .await?;
    if !(200..300).contains(&r.status) {
        rec.stop(
            idem_spec::report::Verdict::Inconclusive,
            format!(
                "a fresh operation did not succeed ({}), so the case cannot judge replays; check the manifest's body template and callers",
                r.summary()
            ),
        );
        return None;
    }
    rec.check(
        "idem.replay.marker",
        !r.replayed(),
        "a first execution without Idempotent-Replayed",
        format!("first execution: {}", r.summary()),
    );
    Some((req, r, marker))
}

/// Checks `again` is a verbatim replay of `first`: same status and body
/// bytes, same Content-Type/Location/ETag and declared headers, and the
/// replay marker.
pub fn check_replay(rec: &mut Rec, first: &Response, again: &Response, what: &str) {
    let mut diffs = Vec::new();
    if first.status != again.status {
        diffs.push(format!("status {} vs {}", first.status, again.status));
    }
    if first.body != again.body {
        diffs.push(format!(
            "body {} vs {}",
            preview(&first.body),
            preview(&again.body)
        ));
    }
    let mut names: Vec<String> = idem_spec::headers::REPLAYED_HEADERS
        .iter()
        .map(|h| h.to_string())
        .collect();
    names.extend(rec.ctx.endpoint().replayed_headers.iter().cloned());
    for h in &names {
        if let Some(v) = first.header(h)
            && again.header(h) != Some(v)
        {
            diffs.push(format!("{h} {v:?} vs {:?}", again.header(h)));
        }
    }
    rec.check(
        "idem.replay.verbatim",
        diffs.is_empty(),
        format!("{what}: the stored status, body and headers, byte for byte"),
        if diffs.is_empty() {
            "identical".to_owned()
        } else {
            diffs.join("; ")
        },
    );
    rec.check(
        "idem.replay.marker",
        again.replayed(),
        format!("{what}: Idempotent-Replayed: true"),
        again.summary(),
    );
}

/// A short, printable preview of a body.
pub fn preview(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    if s.len() > 120 {
        format!(
            "{:?}…",
            &s[..s.char_indices().nth(120).map_or(s.len(), |(i, _)| i)]
        )
    } else {
        format!("{s:?}")
    }
}

/// Permitted-outcome helper: "the contract error under this profile".
pub fn err(m: &Manifest, code: ErrorCode) -> String {
    wire_desc(m, code)
}

/// The key header name, re-exported for the case modules.
pub const KEY: &str = IDEMPOTENCY_KEY;
