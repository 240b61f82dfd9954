//! The key family: where the key is read, its syntax, invalid and missing
//! keys, and errors that must not consume a key.

use idem_spec::ErrorCode;
use idem_spec::report::Verdict;

use super::{KEY, check_error, err, fresh};
use crate::case::{Case, Need, Rec, is_error};

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            id: "keys.boundary-lengths",
            title: "keys of 1 and 255 characters are accepted",
            clauses: &["idem.key.syntax"],
            needs: &[],
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
                "idem.key.syntax",
                "idem.replay.marker",
                "idem.replay.no-reexecution",
            ],
            needs: &[],
            permitted: |_| {
                vec!["the second spelling gets a verbatim replay; one side effect".into()]
            },
            run: |r| Box::pin(quoted_and_bare(r)),
        },
        Case {
            id: "keys.invalid-rejected",
            title: "empty, too long, bad characters, bad quoting and repeated keys are rejected",
            clauses: &[
                "idem.key.invalid",
                "idem.errors.problem-json",
                "idem.errors.profiles",
            ],
            needs: &[],
            permitted: |m| {
                vec![format!(
                    "every variant: {} and no side effect",
                    err(m, ErrorCode::IdempotencyKeyInvalid)
                )]
            },
            run: |r| Box::pin(invalid(r)),
        },
        Case {
            id: "keys.missing-rejected",
            title: "a request without a key is rejected and not executed",
            clauses: &[
                "idem.key.required",
                "idem.errors.problem-json",
                "idem.errors.profiles",
            ],
            needs: &[Need::KeyRequired],
            permitted: |m| {
                vec![format!(
                    "{} and no side effect",
                    err(m, ErrorCode::IdempotencyKeyMissing)
                )]
            },
            run: |r| Box::pin(missing(r)),
        },
        Case {
            id: "keys.header-only",
            title: "a key anywhere but the Idempotency-Key header is not a key",
            clauses: &["idem.key.header"],
            needs: &[Need::KeyRequired],
            permitted: |m| {
                vec![format!(
                    "key in another header or in the query: {} and no side effect",
                    err(m, ErrorCode::IdempotencyKeyMissing)
                )]
            },
            run: |r| Box::pin(header_only(r)),
        },
        Case {
            id: "keys.unclaimed",
            title: "an unauthenticated attempt does not consume the key",
            clauses: &["idem.failure.unclaimed"],
            needs: &[],
            permitted: |_| {
                vec!["unauthenticated: a 4xx, no effect; then authenticated with the same key: a fresh execution (not a replay)".into()]
            },
            run: |r| Box::pin(unclaimed(r)),
        },
        Case {
            id: "keys.errors-distinct",
            title: "missing, invalid and mismatch errors carry distinct codes",
            clauses: &["idem.errors.distinct"],
            needs: &[Need::KeyRequired],
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
    for (what, value) in [
        ("a 255-character key, bare", bare),
        ("a 255-character key, quoted with escapes", quoted),
    ] {
        let marker = rec.ctx.marker();
        let body = rec.ctx.body(0, &marker);
        let req = rec.ctx.op(0, Some(&value), &body);
        let Some(r) = rec.send(&format!("alice sends {what}"), &req).await else {
            return;
        };
        rec.check(
            "idem.key.syntax",
            (200..300).contains(&r.status) && !r.replayed(),
            format!("{what} is accepted: a fresh 2xx"),
            r.summary(),
        );
    }
    // One visible character chosen from the seed; it cannot carry the run
    // prefix, so an earlier run may have used it: any answer that shows the
    // key was accepted as a key passes.
    let c = char::from(b'!' + (rec.ctx.seed % 94) as u8);
    let k = if c == '"' {
        "#".to_owned()
    } else {
        c.to_string()
    };
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(0, &marker);
    let req = rec.ctx.op(0, Some(&k), &body);
    if let Some(r) = rec
        .send(&format!("alice sends with the 1-character key {k:?}"), &req)
        .await
    {
        let m = &rec.ctx.manifest;
        let ok =
            (200..300).contains(&r.status) || is_error(m, &r, ErrorCode::IdempotencyKeyMismatch);
        rec.check(
            "idem.key.syntax",
            ok,
            "a 1-character key is accepted",
            r.summary(),
        );
    }
}

async fn quoted_and_bare(rec: &mut Rec) {
    // A key with both escapable characters: quoted it is "<k>\"q\\", bare <k>"q\.
    let key = format!("{}\"q\\", rec.ctx.key());
    let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
    let Some((req, first, marker)) = fresh(rec, 0, &key).await else {
        return;
    };
    let req2 = req.clone().without_header(KEY).header(KEY, &quoted);
    let a = rec.alias(&key);
    if let Some(again) = rec
        .send(
            &format!("the same request, {a} in the quoted form {quoted}"),
            &req2,
        )
        .await
    {
        rec.check(
            "idem.key.syntax",
            again.same_outcome(&first),
            "the quoted form names the same key: a replay of R1",
            again.summary(),
        );
        rec.check(
            "idem.replay.marker",
            again.replayed(),
            "Idempotent-Replayed: true",
            again.summary(),
        );
        rec.check_effects(
            "idem.replay.no-reexecution",
            0,
            &marker,
            &[&first, &again],
            1,
            "one operation sent in two spellings",
        )
        .await;
    }
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
    let mut seen = Vec::new();
    for (what, values) in variants {
        let mut req = rec.ctx.op(0, None, &body);
        for v in values {
            req.headers.push((KEY.to_owned(), v));
        }
        if let Some(r) = rec
            .send(&format!("alice sends a key with {what}"), &req)
            .await
        {
            check_error(
                rec,
                "idem.key.invalid",
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
        "idem.key.invalid",
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
    let req = rec.ctx.op(0, None, &body);
    if let Some(r) = rec
        .send("alice sends without an Idempotency-Key", &req)
        .await
    {
        check_error(
            rec,
            "idem.key.required",
            &r,
            ErrorCode::IdempotencyKeyMissing,
            "no key",
        );
        rec.check_effects(
            "idem.key.required",
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
    let other = rec.ctx.op(0, None, &body).header("X-Idempotency-Key", &key);
    let mut in_query = rec.ctx.op(0, None, &body);
    let sep = if in_query.url.contains('?') { '&' } else { '?' };
    in_query.url = format!("{}{sep}idempotency_key={key}", in_query.url);
    let mut seen = Vec::new();
    for (what, req) in [
        (format!("alice sends {a} in X-Idempotency-Key"), other),
        (format!("alice sends {a} as ?idempotency_key="), in_query),
    ] {
        let Some(r) = rec.send(&what, &req).await else {
            return;
        };
        let ok = is_error(&rec.ctx.manifest, &r, ErrorCode::IdempotencyKeyMissing);
        let want = err(&rec.ctx.manifest, ErrorCode::IdempotencyKeyMissing);
        rec.check(
            "idem.key.header",
            ok,
            format!("{want}: the key is read from Idempotency-Key only"),
            r.summary(),
        );
        seen.push(r);
    }
    let refs: Vec<&_> = seen.iter().collect();
    rec.check_effects(
        "idem.key.header",
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
    let authed = rec.ctx.op(0, Some(&key), &body);
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
        "idem.failure.unclaimed",
        (200..300).contains(&r2.status) && !r2.replayed(),
        "a fresh execution: the rejected attempt did not consume the key",
        r2.summary(),
    );
    rec.check_effects(
        "idem.failure.unclaimed",
        0,
        &marker,
        &[&r1, &r2],
        1,
        "only the authenticated attempt executes",
    )
    .await;
}

async fn distinct(rec: &mut Rec) {
    let m = rec.ctx.manifest.clone();
    let mut codes: Vec<(String, Option<String>)> = Vec::new();
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(0, &marker);
    let Some(r) = rec
        .send("alice sends without a key", &rec.ctx.op(0, None, &body))
        .await
    else {
        return;
    };
    codes.push(("missing".into(), r.code()));
    let Some(r) = rec
        .send("alice sends an empty key", &rec.ctx.op(0, Some(""), &body))
        .await
    else {
        return;
    };
    codes.push(("invalid".into(), r.code()));
    let key = rec.ctx.key();
    let Some((req, _, _)) = fresh(rec, 0, &key).await else {
        return;
    };
    let mut changed = rec.ctx.body(0, &rec.ctx.marker());
    if changed == body {
        changed = serde_json::json!({ "conformance_changed": true });
    }
    let req2 = req.clone().json_body(&changed);
    let a = rec.alias(&key);
    let Some(r) = rec
        .send(&format!("alice reuses {a} with another body"), &req2)
        .await
    else {
        return;
    };
    codes.push(("mismatch".into(), r.code()));
    codes.push((
        "in use (declared)".into(),
        Some(m.wire(ErrorCode::IdempotencyKeyInUse).code.clone()),
    ));
    let observed: Vec<String> = codes
        .iter()
        .map(|(w, c)| format!("{w}={}", c.as_deref().unwrap_or("<none>")))
        .collect();
    // A missing code means the error was not provoked at all; the cases of
    // that error's own clause report it. Only compare the codes that exist.
    let present: Vec<&String> = codes.iter().filter_map(|(_, c)| c.as_ref()).collect();
    if present.len() < codes.len() {
        rec.stop(
            Verdict::Inconclusive,
            format!("not every error could be provoked: {}", observed.join(", ")),
        );
    }
    let mut uniq = present.clone();
    uniq.sort();
    uniq.dedup();
    rec.check(
        "idem.errors.distinct",
        uniq.len() == present.len(),
        "four distinct codes",
        observed.join(", "),
    );
}

use crate::manifest::ManifestExt;
