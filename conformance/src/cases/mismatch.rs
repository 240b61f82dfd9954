//! The fingerprint family: the same key with a different body, path or
//! method is a mismatch, never a replay and never an execution.

use idem_spec::ErrorCode;

use super::{check_error, err, fresh};
use crate::case::{Case, Rec, is_error};

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            id: "mismatch.body",
            title: "the same key with a different body is a mismatch",
            clauses: &[
                "idem.fingerprint.mismatch",
                "idem.fingerprint.inputs",
                "idem.errors.problem-json",
                "idem.errors.profiles",
            ],
            needs: &[],
            permitted: |m| {
                vec![format!(
                    "{}, no replay, no second effect",
                    err(m, ErrorCode::IdempotencyKeyMismatch)
                )]
            },
            run: |r| Box::pin(body(r)),
        },
        Case {
            id: "mismatch.path",
            title: "the same key on a different path (query) is a mismatch",
            clauses: &["idem.fingerprint.inputs", "idem.fingerprint.mismatch"],
            needs: &[],
            permitted: |m| {
                vec![format!(
                    "{}, no replay, no second effect",
                    err(m, ErrorCode::IdempotencyKeyMismatch)
                )]
            },
            run: |r| Box::pin(path(r)),
        },
        Case {
            id: "mismatch.method",
            title: "the same key with a different method is never a replay",
            clauses: &["idem.fingerprint.inputs"],
            needs: &[],
            permitted: |m| {
                vec![format!(
                    "{}, or 404/405 when the method is not routed; never a replay",
                    err(m, ErrorCode::IdempotencyKeyMismatch)
                )]
            },
            run: |r| Box::pin(method(r)),
        },
    ]
}

async fn body(rec: &mut Rec) {
    let key = rec.ctx.key();
    let Some((req, first, marker)) = fresh(rec, 0, &key).await else {
        return;
    };
    // Same marker (so the probe sees both), another amount.
    let mut changed = rec.ctx.body(0, &marker);
    let original: serde_json::Value = req
        .body
        .as_deref()
        .and_then(|b| serde_json::from_slice(b).ok())
        .unwrap_or_default();
    for _ in 0..5 {
        if changed != original {
            break;
        }
        changed = rec.ctx.body(0, &marker);
    }
    let a = rec.alias(&key);
    let req2 = req.clone().json_body(&changed);
    let Some(r2) = rec
        .send(&format!("alice reuses {a} with a different amount"), &req2)
        .await
    else {
        return;
    };
    check_error(
        rec,
        "idem.fingerprint.mismatch",
        &r2,
        ErrorCode::IdempotencyKeyMismatch,
        "different body",
    );
    rec.check(
        "idem.fingerprint.inputs",
        !r2.replayed() && !r2.same_outcome(&first),
        "a different body is a different request: not R1's response",
        r2.summary(),
    );
    rec.check_effects(
        "idem.fingerprint.mismatch",
        0,
        &marker,
        &[&first, &r2],
        1,
        "the mismatched request is not executed",
    )
    .await;
}

async fn path(rec: &mut Rec) {
    let key = rec.ctx.key();
    let Some((req, first, marker)) = fresh(rec, 0, &key).await else {
        return;
    };
    let mut req2 = req.clone();
    let sep = if req2.url.contains('?') { '&' } else { '?' };
    req2.url = format!("{}{sep}conformance=1", req2.url);
    let a = rec.alias(&key);
    let Some(r2) = rec
        .send(
            &format!("alice sends R1's body with {a} to the path plus ?conformance=1"),
            &req2,
        )
        .await
    else {
        return;
    };
    let ok = is_error(&rec.ctx.manifest, &r2, ErrorCode::IdempotencyKeyMismatch);
    rec.check(
        "idem.fingerprint.inputs",
        ok,
        format!(
            "{}: the query is part of the fingerprint",
            err(&rec.ctx.manifest, ErrorCode::IdempotencyKeyMismatch)
        ),
        r2.summary(),
    );
    rec.check(
        "idem.fingerprint.mismatch",
        !r2.replayed(),
        "never a replay of R1",
        r2.summary(),
    );
    rec.check_effects(
        "idem.fingerprint.mismatch",
        0,
        &marker,
        &[&first, &r2],
        1,
        "the other path is not executed under the key",
    )
    .await;
}

async fn method(rec: &mut Rec) {
    let key = rec.ctx.key();
    let Some((req, first, marker)) = fresh(rec, 0, &key).await else {
        return;
    };
    let mut req2 = req.clone();
    req2.method = if req.method.eq_ignore_ascii_case("PUT") {
        "PATCH".into()
    } else {
        "PUT".into()
    };
    let a = rec.alias(&key);
    let Some(r2) = rec
        .send(
            &format!("alice sends R1 with {a} as {}", req2.method),
            &req2,
        )
        .await
    else {
        return;
    };
    let ok = !r2.replayed()
        && (is_error(&rec.ctx.manifest, &r2, ErrorCode::IdempotencyKeyMismatch)
            || r2.status == 404
            || r2.status == 405);
    rec.check(
        "idem.fingerprint.inputs",
        ok,
        format!(
            "{} or 404/405; never a replay",
            err(&rec.ctx.manifest, ErrorCode::IdempotencyKeyMismatch)
        ),
        r2.summary(),
    );
    rec.check_effects(
        "idem.fingerprint.inputs",
        0,
        &marker,
        &[&first, &r2],
        1,
        "the other method does not execute R1's operation again",
    )
    .await;
}
