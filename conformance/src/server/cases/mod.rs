//! Every case, grouped by clause family: one module per family, each
//! exporting `cases()` with the same small shape ([`crate::server::case::Case`]).

use idem_conformance_core::clause;
use idem_conformance_core::verdict::Consequence;
use idem_spec::ErrorCode;
use idem_spec::headers::IDEMPOTENT_REPLAYED;
use idem_spec::manifest::Manifest;
use idem_spec::problem::PROBLEM_CONTENT_TYPE;
use serde_json::Value;

use crate::server::case::{Case, Rec};
use crate::server::http::Response;
use crate::server::manifest::ManifestExt;

pub mod concurrency;
pub mod deadline;
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
    v.extend(deadline::cases());
    v.push(crate::server::model::case());
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

/// Checks a refusal the contract requires: `r` must be refused (a 4xx)
/// under `clause` (its failure recorded with `seen`, the consequence the
/// case knows of), and, when it is, spelled as the target declares `code`
/// (`idem.errors.profiles`) in a well-formed problem document
/// (`idem.errors.problem-json`). Both spelling checks are interop: a
/// refusal in another dialect is still a refusal. Returns whether `r` was
/// refused.
pub fn check_refusal(
    rec: &mut Rec,
    clause: idem_conformance_core::clause::ClauseId,
    seen: Consequence,
    r: &Response,
    code: ErrorCode,
    what: &str,
) -> bool {
    let want = rec.ctx.dialect().spelled(code);
    let refused = (400..500).contains(&r.status);
    let observed = format!("{what}: {}", r.summary());
    rec.check_as(
        clause,
        seen,
        refused,
        format!("{what}: refused with a 4xx ({want} as declared)"),
        observed.clone(),
    );
    if refused {
        check_spelling(rec, r, code, what);
    }
    refused
}

/// The interop checks of an answer that is the contract error `code`:
/// spelled as declared, and a problem document.
pub fn check_spelling(rec: &mut Rec, r: &Response, code: ErrorCode, what: &str) {
    let m = &rec.ctx.manifest;
    let ok = m.matches(r, code);
    let want = m.spelled(code);
    let profile = m.profile_name();
    rec.check(
        clause!("idem.errors.profiles"),
        ok,
        format!("{what}: {want} (profile {profile})"),
        format!("{what}: {}", r.summary()),
    );
    let shape = problem_shape(r);
    rec.check(
        clause!("idem.errors.problem-json"),
        shape.is_ok(),
        "application/problem+json with type, title, status, detail, code, retryable",
        shape
            .err()
            .unwrap_or_else(|| "a well-formed problem document".into()),
    );
}

/// Sends a fresh operation of `caller` with `key`; returns the request, the
/// response and the marker. The first execution must be a 2xx; anything
/// else stops the case as inconclusive (the target could not even perform
/// a fresh operation, so nothing else can be judged). A first execution
/// must not carry the replay marker (`idem.replay.marker`).
pub async fn fresh(
    rec: &mut Rec,
    caller: usize,
    key: &str,
) -> Option<(crate::server::http::Request, Response, String)> {
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(caller, &marker);
    let req = rec.ctx.op(caller, Some(key), &marker, &body);
    let alias = rec.alias(key);
    let name = rec.ctx.name(caller).to_owned();
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
    check_unmarked(rec, &r, "first execution");
    Some((req, r, marker))
}

/// `idem.replay.marker`: a first execution carries no replay marker.
pub fn check_unmarked(rec: &mut Rec, r: &Response, what: &str) {
    let declared = rec.ctx.manifest.marked(r) == Some(true);
    rec.check(
        clause!("idem.replay.marker"),
        !r.replayed() && !declared,
        format!("{what} without {IDEMPOTENT_REPLAYED}"),
        format!("{what}: {}", r.summary()),
    );
}

/// `idem.replay.marker`: a replay carries `Idempotent-Replayed: true`. The
/// observation names the target's declared marker when it has another.
pub fn check_marked(rec: &mut Rec, r: &Response, what: &str) {
    let observed = match rec.ctx.manifest.marker_header() {
        _ if r.replayed() => r.summary(),
        None => format!("{}; the manifest declares unmarked replays", r.summary()),
        Some(h) if !h.eq_ignore_ascii_case(IDEMPOTENT_REPLAYED) => format!(
            "{}; the manifest declares the marker {h} instead ({})",
            r.summary(),
            if rec.ctx.manifest.marked(r) == Some(true) {
                "present"
            } else {
                "absent too"
            }
        ),
        Some(_) => r.summary(),
    };
    rec.check(
        clause!("idem.replay.marker"),
        r.replayed(),
        format!("{what}: {IDEMPOTENT_REPLAYED}: true"),
        observed,
    );
}

/// Checks `again` is a verbatim replay of `first`: same status and body
/// bytes, same Content-Type/Location/ETag and declared headers
/// (`idem.replay.verbatim`), and the replay marker (`idem.replay.marker`).
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
        clause!("idem.replay.verbatim"),
        diffs.is_empty(),
        format!("{what}: the stored status, body and headers, byte for byte"),
        if diffs.is_empty() {
            "identical".to_owned()
        } else {
            format!("{}: {}", again.summary(), diffs.join("; "))
        },
    );
    check_marked(rec, again, what);
}

/// `idem.inflight.retry-after`: in-flight refusals carry `Retry-After`.
/// A target that declares it never sends the header
/// (`profile.absent_headers`) still deviates from the contract (the
/// clause's own class, interop), and the observation says it is declared;
/// a declared-absent header that is sent contradicts the declaration, which
/// the report notes.
pub fn check_retry_after(rec: &mut Rec, expected: &str, present: bool, observed: String) {
    let declared = rec.ctx.manifest.profile.declares_absent("Retry-After");
    let observed = match (declared, present) {
        (true, false) => format!("{observed}; the manifest declares Retry-After never sent"),
        (true, true) => {
            rec.note(
                "profile.absent_headers declares Retry-After never sent, but an in-flight refusal carried it: the declaration is wrong",
            );
            observed
        }
        _ => observed,
    };
    rec.check(
        clause!("idem.inflight.retry-after"),
        present,
        expected.to_owned(),
        observed,
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

/// Permitted-outcome helper: "the contract error as the target declares it".
pub fn err(m: &Manifest, code: ErrorCode) -> String {
    m.spelled(code)
}
