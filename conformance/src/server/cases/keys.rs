//! The key family: where the key is read, its syntax, invalid and missing
//! keys, and errors that must not consume a key.

use idem_conformance_core::clause;
use idem_conformance_core::verdict::Consequence;
use idem_spec::ErrorCode;
use idem_spec::report::Verdict;

use super::{check_refusal, check_replay, err, fresh};
use crate::server::case::{Aim, Case, Need, Rec, shared};
use crate::server::manifest::ManifestExt;

/// The cases of this family.
// Long on purpose: a table of case declarations (id, title, clauses,
// needs, permitted outcomes), one entry per case, as in the other families.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            id: "keys.boundary-lengths",
            title: "keys of 1 and 255 characters are accepted",
            clauses: &[clause!("idem.key.syntax")],
            needs: &[Need::KEY_IN_HEADER],
            aim: Aim::Main,
            alone: shared,
            permitted: |m| {
                vec![
                    "255 characters, bare and quoted with escapes: a fresh 2xx".into(),
                    format!(
                        "1 character (cannot carry the run prefix, so it may be in use from an earlier run): 2xx, a replay, or {}",
                        err(m, ErrorCode::IdempotencyKeyMismatch)
                    ),
                ]
            },
            run: |r| Box::pin(boundary_lengths(r)),
        },
        Case {
            id: "keys.quoted-and-bare",
            title: "the quoted sf-string and the bare form name the same key",
            clauses: &[
                clause!("idem.key.syntax"),
                clause!("idem.replay.verbatim"),
                clause!("idem.replay.marker"),
            ],
            needs: &[Need::KEY_IN_HEADER],
            aim: Aim::Main,
            alone: shared,
            permitted: |_| {
                vec!["the second spelling is the same key: not executed again (one side effect), answered with a verbatim replay".into()]
            },
            run: |r| Box::pin(quoted_and_bare(r)),
        },
        Case {
            id: "keys.invalid-rejected",
            title: "empty, too long, bad characters, bad quoting and repeated keys are rejected",
            clauses: &[
                clause!("idem.key.invalid"),
                clause!("idem.errors.problem-json"),
                clause!("idem.errors.profiles"),
            ],
            needs: &[Need::KEY_IN_HEADER],
            aim: Aim::Main,
            alone: shared,
            permitted: |m| {
                vec![format!(
                    "every variant: refused, {} as declared, and no side effect",
                    err(m, ErrorCode::IdempotencyKeyInvalid)
                )]
            },
            run: |r| Box::pin(invalid(r)),
        },
        Case {
            id: "keys.missing-rejected",
            title: "a request without a key is rejected and not executed",
            clauses: &[
                clause!("idem.key.required"),
                clause!("idem.errors.problem-json"),
                clause!("idem.errors.profiles"),
            ],
            needs: &[Need::KEY_REQUIRED],
            aim: Aim::Main,
            alone: shared,
            permitted: |m| {
                vec![format!(
                    "refused, {} as declared, and no side effect",
                    err(m, ErrorCode::IdempotencyKeyMissing)
                )]
            },
            run: |r| Box::pin(missing(r)),
        },
        Case {
            id: "keys.header-only",
            title: "a key anywhere but the Idempotency-Key header is not a key",
            clauses: &[clause!("idem.key.header"), clause!("idem.errors.profiles")],
            needs: &[Need::KEY_REQUIRED],
            aim: Aim::Main,
            alone: shared,
            permitted: |m| {
                vec![format!(
                    "key in another header or in the query: refused as keyless ({}) and no side effect",
                    err(m, ErrorCode::IdempotencyKeyMissing)
                )]
            },
            run: |r| Box::pin(header_only(r)),
        },
        Case {
            id: "keys.unclaimed",
            title: "an unauthenticated attempt does not consume the key",
            clauses: &[clause!("idem.failure.unclaimed")],
            needs: &[],
            aim: Aim::Main,
            alone: shared,
            permitted: |_| {
                vec!["unauthenticated: a 4xx, no effect; then authenticated with the same key: a fresh execution (not a replay)".into()]
            },
            run: |r| Box::pin(unclaimed(r)),
        },
        Case {
            id: "keys.published",
            title: "the OpenAPI document marks Idempotency-Key required on every declared endpoint",
            clauses: &[clause!("idem.key.endpoints-published")],
            needs: &[Need::KEY_IN_HEADER, Need::OPENAPI],
            aim: Aim::Main,
            alone: shared,
            permitted: |_| {
                vec!["each declared endpoint's operation lists an Idempotency-Key header parameter, required".into()]
            },
            run: |r| Box::pin(published(r)),
        },
        Case {
            id: "keys.errors-distinct",
            title: "missing, invalid and mismatch errors carry distinct codes",
            clauses: &[clause!("idem.errors.distinct")],
            needs: &[Need::KEY_IN_HEADER, Need::KEY_REQUIRED],
            aim: Aim::Main,
            alone: shared,
            permitted: |m| {
                vec![format!(
                    "four distinct codes: {}, {}, {}, {}",
                    err(m, ErrorCode::IdempotencyKeyMissing),
                    err(m, ErrorCode::IdempotencyKeyInvalid),
                    err(m, ErrorCode::IdempotencyKeyMismatch),
                    err(m, ErrorCode::IdempotencyKeyInUse)
                )]
            },
            run: |r| Box::pin(distinct(r)),
        },
    ]
}

async fn boundary_lengths(rec: &mut Rec) {
    let pad = |base: String, fill: &str| {
        let mut k = base;
        while k.len() < 255 {
            k.push_str(fill);
        }
        k.truncate(255);
        k
    };
    // 255 characters, bare; and 255 characters (after unquoting) in the
    // quoted form, with escapes, so the header value itself is longer.
    let bare = pad(rec.ctx.key(), "x");
    let quoted_key = pad(rec.ctx.key() + "-", "\\\"");
    let quoted = format!(
        "\"{}\"",
        quoted_key.replace('\\', "\\\\").replace('"', "\\\"")
    );
    let name = rec.ctx.name(0).to_owned();
    for (what, value, bare_form) in [
        ("a 255-character key, bare", bare.clone(), bare),
        (
            "a 255-character key, quoted with escapes",
            quoted,
            quoted_key,
        ),
    ] {
        let marker = rec.ctx.marker();
        let body = rec.ctx.body(0, &marker);
        let kh = rec.ctx.key_header().to_owned();
        let req = rec.ctx.op(0, None, &marker, &body).header(&kh, &value);
        rec.ctx.remember_key(&marker, &bare_form);
        let Some(r) = rec.send(&format!("{name} sends {what}"), &req).await else {
            return;
        };
        rec.check(
            clause!("idem.key.syntax"),
            rec.ctx.dialect().executed(&r, None),
            format!("{what} is accepted: a fresh 2xx"),
            r.summary(),
        );
    }
    // One letter or digit chosen from the run id (fresh each run, not the
    // seed, which a user repeats): it cannot carry the run prefix, so an
    // earlier run may have used it, and any answer that shows the key was
    // accepted as a key passes. Letters and digits only, so no target
    // refuses it for its characters.
    const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let pick = rec.ctx.run_id.bytes().fold(0usize, |h, b| {
        h.wrapping_mul(31).wrapping_add(usize::from(b))
    });
    let k = char::from(ALNUM[pick % ALNUM.len()]).to_string();
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(0, &marker);
    let req = rec.ctx.op(0, Some(&k), &marker, &body);
    if let Some(r) = rec
        .send(
            &format!("{name} sends with the 1-character key {k:?}"),
            &req,
        )
        .await
    {
        let ok = (200..300).contains(&r.status)
            || rec.ctx.dialect().is(&r, ErrorCode::IdempotencyKeyMismatch)
            || rec.ctx.dialect().is(&r, ErrorCode::IdempotencyKeyInUse);
        rec.check(
            clause!("idem.key.syntax"),
            ok,
            "a 1-character key is accepted: a 2xx, or the declared mismatch if an earlier run used it",
            r.summary(),
        );
    }
}

async fn quoted_and_bare(rec: &mut Rec) {
    // A plain key (letters, digits, '-'): every target accepts it bare, so
    // the case judges only what it is about, that the quoted spelling
    // names the same key. (Escapes inside quotes are keys.boundary-lengths'
    // business; a bare key holding '"' or '\' is refused by many targets,
    // which would leave this case undecided.)
    let key = rec.ctx.key();
    let quoted = format!("\"{key}\"");
    let Some((req, first, marker)) = fresh(rec, 0, &key).await else {
        return;
    };
    let kh = rec.ctx.key_header().to_owned();
    let req2 = req.clone().without_header(&kh).header(&kh, &quoted);
    let a = rec.alias(&key);
    let Some(again) = rec
        .send(
            &format!("the same request, {a} in the quoted form {quoted}"),
            &req2,
        )
        .await
    else {
        return;
    };
    // The key's identity is the clause here: a second spelling executed
    // again means the target sees two keys. How the repeat is answered is
    // the replay's business, judged only when it was not executed.
    let executed = rec.ctx.dialect().executed(&again, Some(&first));
    rec.check(
        clause!("idem.key.syntax"),
        !executed,
        "the quoted form names the same key: not executed again",
        again.summary(),
    );
    if !executed {
        check_replay(rec, &first, &again, "the quoted spelling");
    }
    rec.check_effects(
        clause!("idem.key.syntax"),
        0,
        &marker,
        &[&first, &again],
        1,
        "one operation sent in two spellings of its key",
    )
    .await;
    rec.check_executions(
        clause!("idem.key.syntax"),
        &marker,
        1,
        "one operation sent in two spellings of its key",
    )
    .await;
}

async fn invalid(rec: &mut Rec) {
    let base = rec.ctx.key();
    let variants: Vec<(&str, Vec<Vec<u8>>)> = vec![
        ("an empty value", vec![b"".to_vec()]),
        (
            "256 characters",
            vec![format!("{base}{}", "x".repeat(256 - base.len().min(255))).into_bytes()],
        ),
        ("a space inside", vec![format!("{base} x").into_bytes()]),
        ("a tab inside", vec![format!("{base}\tx").into_bytes()]),
        ("non-ASCII bytes", vec![format!("{base}é").into_bytes()]),
        (
            "an unterminated quote",
            vec![format!("\"{base}").into_bytes()],
        ),
        ("a bad escape", vec![format!("\"{base}\\n\"").into_bytes()]),
        (
            "characters after the closing quote",
            vec![format!("\"{base}\"x").into_bytes()],
        ),
        ("an empty quoted string", vec![b"\"\"".to_vec()]),
        (
            "two Idempotency-Key fields",
            vec![
                format!("{base}-a").into_bytes(),
                format!("{base}-b").into_bytes(),
            ],
        ),
    ];
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(0, &marker);
    let name = rec.ctx.name(0).to_owned();
    let mut seen = Vec::new();
    let kh = rec.ctx.key_header().to_owned();
    for (what, values) in variants {
        let mut req = rec.ctx.op(0, None, &marker, &body);
        for v in values {
            req.headers.push((kh.clone(), v));
        }
        if let Some(r) = rec
            .send(&format!("{name} sends a key with {what}"), &req)
            .await
        {
            check_refusal(
                rec,
                clause!("idem.key.invalid"),
                Consequence::Spelling,
                &r,
                ErrorCode::IdempotencyKeyInvalid,
                what,
            );
            seen.push(r);
        } else {
            return;
        }
    }
    let refs: Vec<&_> = seen.iter().collect();
    rec.check_effects(
        clause!("idem.key.invalid"),
        0,
        &marker,
        &refs,
        0,
        "rejected requests are not executed",
    )
    .await;
}

async fn missing(rec: &mut Rec) {
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(0, &marker);
    let req = rec.ctx.op(0, None, &marker, &body);
    let name = rec.ctx.name(0).to_owned();
    let kh = rec.ctx.key_header().to_owned();
    if let Some(r) = rec
        .send(&format!("{name} sends without an {kh}"), &req)
        .await
    {
        check_refusal(
            rec,
            clause!("idem.key.required"),
            Consequence::Behaviour,
            &r,
            ErrorCode::IdempotencyKeyMissing,
            "no key",
        );
        rec.check_effects(
            clause!("idem.key.required"),
            0,
            &marker,
            &[&r],
            0,
            "a rejected request is not executed",
        )
        .await;
    }
}

async fn header_only(rec: &mut Rec) {
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(0, &marker);
    let key = rec.ctx.key();
    let a = rec.alias(&key);
    let name = rec.ctx.name(0).to_owned();
    let other = rec
        .ctx
        .op(0, None, &marker, &body)
        .header("X-Idempotency-Key", &key);
    let mut in_query = rec.ctx.op(0, None, &marker, &body);
    let sep = if in_query.url.contains('?') { '&' } else { '?' };
    in_query.url = format!("{}{sep}idempotency_key={key}", in_query.url);
    // A key-matched probe finds these by the key they carry elsewhere.
    rec.ctx.remember_key(&marker, &key);
    let mut seen = Vec::new();
    for (what, req) in [
        (format!("{name} sends {a} in X-Idempotency-Key"), other),
        (format!("{name} sends {a} as ?idempotency_key="), in_query),
    ] {
        let Some(r) = rec.send(&what, &req).await else {
            return;
        };
        check_refusal(
            rec,
            clause!("idem.key.header"),
            Consequence::Spelling,
            &r,
            ErrorCode::IdempotencyKeyMissing,
            "a key outside Idempotency-Key is no key",
        );
        seen.push(r);
    }
    let refs: Vec<&_> = seen.iter().collect();
    rec.check_effects(
        clause!("idem.key.header"),
        0,
        &marker,
        &refs,
        0,
        "neither request carried a key",
    )
    .await;
}

async fn unclaimed(rec: &mut Rec) {
    let key = rec.ctx.key();
    let a = rec.alias(&key);
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(0, &marker);
    let authed = rec.ctx.op(0, Some(&key), &marker, &body);
    let mut anon = authed.clone();
    let secret: Vec<String> = rec
        .ctx
        .caller(0)
        .headers
        .keys()
        .map(|k| k.to_ascii_lowercase())
        .collect();
    anon.headers
        .retain(|(n, _)| !secret.contains(&n.to_ascii_lowercase()));
    anon.signed_by = None;
    let Some(r1) = rec
        .send(
            &format!("the request with {a} but without credentials"),
            &anon,
        )
        .await
    else {
        return;
    };
    if !(400..500).contains(&r1.status) {
        rec.stop(
            Verdict::Inconclusive,
            format!("the target accepted an unauthenticated request ({}); the case needs credentials to matter", r1.summary()),
        );
        return;
    }
    let Some(r2) = rec
        .send(
            &format!("the same request with {a}, authenticated"),
            &authed,
        )
        .await
    else {
        return;
    };
    rec.check(
        clause!("idem.failure.unclaimed"),
        rec.ctx.dialect().executed(&r2, None),
        "a fresh execution: the rejected attempt did not consume the key",
        r2.summary(),
    );
    rec.check_effects(
        clause!("idem.failure.unclaimed"),
        0,
        &marker,
        &[&r1, &r2],
        1,
        "only the authenticated attempt executes",
    )
    .await;
}

async fn distinct(rec: &mut Rec) {
    let mut codes: Vec<(&str, Option<String>)> = Vec::new();
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(0, &marker);
    let name = rec.ctx.name(0).to_owned();
    let req = rec.ctx.op(0, None, &marker, &body);
    let Some(missing) = rec.send(&format!("{name} sends without a key"), &req).await else {
        return;
    };
    // Invalid for its space, and carrying the run prefix: should a target
    // accept it, it is never met again by a later run.
    let bad = format!("{} x", rec.ctx.key());
    let req = rec.ctx.op(0, Some(&bad), &marker, &body);
    let Some(invalid) = rec
        .send(&format!("{name} sends a key with a space in it"), &req)
        .await
    else {
        return;
    };
    let key = rec.ctx.key();
    let Some((req, _, marker)) = fresh(rec, 0, &key).await else {
        return;
    };
    let mut changed = rec.ctx.body(0, &marker);
    if rec.ctx.rebody(&req, &changed).body == req.body {
        changed = serde_json::json!({ "conformance_changed": true });
    }
    let req2 = rec.ctx.rebody(&req, &changed);
    let a = rec.alias(&key);
    let Some(mismatch) = rec
        .send(&format!("{name} reuses {a} with another body"), &req2)
        .await
    else {
        return;
    };
    // Only refusals can be compared: an error that was not provoked at all
    // is its own case's finding.
    let unprovoked: Vec<String> = [
        ("missing", &missing),
        ("invalid", &invalid),
        ("mismatch", &mismatch),
    ]
    .iter()
    .filter(|(_, r)| !(400..500).contains(&r.status))
    .map(|(w, r)| format!("{w}: {}", r.summary()))
    .collect();
    if !unprovoked.is_empty() {
        rec.stop(
            Verdict::Inconclusive,
            format!(
                "not every error could be provoked: {}",
                unprovoked.join(", ")
            ),
        );
        return;
    }
    let m = rec.ctx.manifest.clone();
    codes.push(("missing", m.code_of(&missing)));
    codes.push(("invalid", m.code_of(&invalid)));
    codes.push(("mismatch", m.code_of(&mismatch)));
    // The in-use code as declared: a `code`, or the value the declaration
    // expects where the target's codes are (`profile.code_pointer`).
    let in_use = m.wire(ErrorCode::IdempotencyKeyInUse);
    let code_pointer = m.profile.code_pointer.as_deref().unwrap_or("/code");
    let declared = in_use.code.clone().or_else(|| {
        (in_use.pointer.as_deref() == Some(code_pointer))
            .then(|| in_use.value.clone())
            .flatten()
    });
    codes.push(("in use (declared)", declared));
    let observed: Vec<String> = codes
        .iter()
        .map(|(w, c)| format!("{w}={}", c.as_deref().unwrap_or("<no code>")))
        .collect();
    let present: Vec<&String> = codes.iter().filter_map(|(_, c)| c.as_ref()).collect();
    let mut uniq = present.clone();
    uniq.sort();
    uniq.dedup();
    rec.check(
        clause!("idem.errors.distinct"),
        present.len() == codes.len() && uniq.len() == present.len(),
        "four distinct code members",
        observed.join(", "),
    );
}

async fn published(rec: &mut Rec) {
    let Some(path) = rec.ctx.manifest.target.openapi_url.clone() else {
        return;
    };
    let req = crate::server::http::Request {
        method: "GET".into(),
        url: rec.ctx.url(&path),
        headers: rec.ctx.auth(0),
        body: None,
        state_changing: false,
        signed_by: rec.ctx.signer(0),
    };
    let Some(r) = rec.send(&format!("GET {path}"), &req).await else {
        return;
    };
    let Some(doc) = r.json() else {
        rec.stop(
            Verdict::Inconclusive,
            format!("target.openapi_url did not answer JSON ({})", r.summary()),
        );
        return;
    };
    let kh = rec.ctx.key_header().to_owned();
    for e in rec.ctx.manifest.endpoints.clone() {
        // The document's path template may name parameters the manifest
        // filled in; compare the literal path, then fall back to the
        // endpoint's path with its query dropped.
        let bare = e.path.split('?').next().unwrap_or(&e.path).to_owned();
        let op = doc
            .get("paths")
            .and_then(|p| p.get(&bare))
            .and_then(|item| item.get(e.method.to_ascii_lowercase()));
        let declared = op
            .and_then(|o| o.get("parameters"))
            .and_then(serde_json::Value::as_array)
            .is_some_and(|ps| {
                ps.iter().any(|p| {
                    p.get("name")
                        .and_then(serde_json::Value::as_str)
                        .is_some_and(|n| n.eq_ignore_ascii_case(&kh))
                        && p.get("in").and_then(serde_json::Value::as_str) == Some("header")
                        && p.get("required").and_then(serde_json::Value::as_bool) == Some(true)
                })
            });
        rec.check(
            clause!("idem.key.endpoints-published"),
            declared,
            format!(
                "{} {bare}: a required Idempotency-Key header parameter",
                e.method
            ),
            if op.is_none() {
                format!("{} {bare} is not in the document", e.method)
            } else if declared {
                "declared, required".to_owned()
            } else {
                "the operation does not declare it as a required header".to_owned()
            },
        );
    }
}
