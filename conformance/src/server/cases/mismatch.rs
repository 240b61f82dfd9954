//! The fingerprint family: the same key with a different body, path or
//! method is a mismatch, never a replay and never an execution.
//!
//! What each outcome costs decides its class: a different request answered
//! with the first one's stored response is `safety` (the caller believes
//! its new request happened); one executed as a new request is `semantics`
//! (the mismatch was not detected, but each request ran once); a refusal in
//! another spelling is `interop`.

use idem_conformance_core::clause;
use idem_conformance_core::verdict::Consequence;
use idem_spec::ErrorCode;

use super::{check_spelling, err, fresh};
use crate::server::case::{Aim, Case, Rec, shared};
use crate::server::http::Response;
use crate::server::manifest::ManifestExt;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            id: "mismatch.body",
            title: "the same key with a different body is a mismatch",
            clauses: &[
                clause!("idem.fingerprint.mismatch"),
                clause!("idem.fingerprint.inputs"),
                clause!("idem.errors.problem-json"),
                clause!("idem.errors.profiles"),
            ],
            needs: &[],
            aim: Aim::Main,
            alone: shared,
            permitted: |m| {
                vec![format!(
                    "refused ({} as declared): no replay of R1, no second effect",
                    err(m, ErrorCode::IdempotencyKeyMismatch)
                )]
            },
            run: |r| Box::pin(body(r)),
        },
        Case {
            id: "mismatch.path",
            title: "the same key on a different path (query) is a mismatch",
            clauses: &[
                clause!("idem.fingerprint.inputs"),
                clause!("idem.fingerprint.mismatch"),
            ],
            needs: &[],
            aim: Aim::Main,
            alone: shared,
            permitted: |m| {
                vec![format!(
                    "refused ({} as declared): no replay of R1, no second effect",
                    err(m, ErrorCode::IdempotencyKeyMismatch)
                )]
            },
            run: |r| Box::pin(path(r)),
        },
        Case {
            id: "mismatch.method",
            title: "the same key with a different method is never a replay",
            clauses: &[
                clause!("idem.fingerprint.inputs"),
                clause!("idem.fingerprint.mismatch"),
            ],
            needs: &[],
            aim: Aim::Main,
            alone: shared,
            permitted: |m| {
                vec![format!(
                    "{}, or a status the target declares for an unsupported method ({:?}); never a replay",
                    err(m, ErrorCode::IdempotencyKeyMismatch),
                    m.profile.unsupported_statuses
                )]
            },
            run: |r| Box::pin(method(r)),
        },
    ]
}

/// How a request that differs from R1 under R1's key was answered.
enum Answer {
    /// R1's stored response (or a marked replay): another request's outcome.
    Replayed,
    /// A fresh 2xx: executed as a new request.
    Executed,
    /// A 4xx.
    Refused,
    /// Anything else (a 5xx, a 3xx).
    Other,
}

fn answer(rec: &Rec, first: &Response, r: &Response) -> Answer {
    if r.same_outcome(first) || rec.ctx.manifest.marked(r) == Some(true) || r.replayed() {
        Answer::Replayed
    } else if (200..300).contains(&r.status) {
        Answer::Executed
    } else if (400..500).contains(&r.status) {
        Answer::Refused
    } else {
        Answer::Other
    }
}

/// The behavioural checks every mismatch variant shares, under
/// `idem.fingerprint.mismatch`: never R1's outcome (safety), refused at
/// all (semantics). Returns the answer's kind.
fn judge(rec: &mut Rec, first: &Response, r: &Response, what: &str) -> Answer {
    let a = answer(rec, first, r);
    rec.check(
        clause!("idem.fingerprint.mismatch"),
        !matches!(a, Answer::Replayed),
        format!("{what}: not answered with R1's stored response"),
        r.summary(),
    );
    rec.headline(format!(
        "{what} under a used key got the first request's stored response: {} (R1 was {}){}",
        r.summary(),
        first.summary(),
        rec.ctx.dialect().ids_beside(r, first, "R1's")
    ));
    if !matches!(a, Answer::Replayed) {
        rec.check_as(
            clause!("idem.fingerprint.mismatch"),
            Consequence::Behaviour,
            matches!(a, Answer::Refused),
            format!("{what}: refused with a 4xx, not executed"),
            r.summary(),
        );
    }
    a
}

async fn body(rec: &mut Rec) {
    let key = rec.ctx.key();
    let Some((req, first, marker)) = fresh(rec, 0, &key).await else {
        return;
    };
    // Same marker (so the probe sees both), another amount.
    let req2 = rec.ctx.redrawn(&req, 0, &marker);
    let a = rec.alias(&key);
    let name = rec.ctx.name(0).to_owned();
    let Some(r2) = rec
        .send(&format!("{name} reuses {a} with a different amount"), &req2)
        .await
    else {
        return;
    };
    let kind = judge(rec, &first, &r2, "a different body");
    if matches!(kind, Answer::Refused) {
        check_spelling(
            rec,
            &r2,
            ErrorCode::IdempotencyKeyMismatch,
            "different body",
        );
    }
    rec.check(
        clause!("idem.fingerprint.inputs"),
        !matches!(kind, Answer::Replayed),
        "a different body is a different request",
        r2.summary(),
    );
    rec.check_effects_as(
        clause!("idem.fingerprint.mismatch"),
        Consequence::Behaviour,
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
    let name = rec.ctx.name(0).to_owned();
    let Some(r2) = rec
        .send(
            &format!("{name} sends R1's body with {a} to the path plus ?conformance=1"),
            &req2,
        )
        .await
    else {
        return;
    };
    if !rec.ctx.manifest.policy.fingerprint.query {
        // Declared: the query is not part of the fingerprint, so to the
        // target R2 is R1 again. A replay is the declared behaviour, a
        // spelling of what a request is (interop), never a leak of another
        // request's outcome.
        let kind = answer(rec, &first, &r2);
        rec.note("policy.fingerprint.query = false: the manifest declares the query outside the fingerprint");
        rec.check_as(
            clause!("idem.fingerprint.inputs"),
            Consequence::Spelling,
            matches!(kind, Answer::Refused),
            "the query is part of the fingerprint: a refused mismatch (the manifest declares it is not)",
            r2.summary(),
        );
        rec.check_effects_as(
            clause!("idem.fingerprint.mismatch"),
            Consequence::Behaviour,
            0,
            &marker,
            &[&first, &r2],
            1,
            "the same operation with another query is not executed again",
        )
        .await;
        return;
    }
    let kind = judge(rec, &first, &r2, "another path");
    rec.check(
        clause!("idem.fingerprint.inputs"),
        matches!(kind, Answer::Refused),
        "the query is part of the fingerprint: a refused mismatch",
        r2.summary(),
    );
    if matches!(kind, Answer::Refused) {
        check_spelling(rec, &r2, ErrorCode::IdempotencyKeyMismatch, "another path");
    }
    rec.check_effects_as(
        clause!("idem.fingerprint.mismatch"),
        Consequence::Behaviour,
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
    let name = rec.ctx.name(0).to_owned();
    let Some(r2) = rec
        .send(
            &format!("{name} sends R1 with {a} as {}", req2.method),
            &req2,
        )
        .await
    else {
        return;
    };
    let kind = answer(rec, &first, &r2);
    rec.check(
        clause!("idem.fingerprint.mismatch"),
        !matches!(kind, Answer::Replayed),
        "another method: not answered with R1's stored response",
        r2.summary(),
    );
    rec.headline(format!(
        "another method ({}) under a used key got the first request's stored response: {} (R1 was {}){}",
        req2.method,
        r2.summary(),
        first.summary(),
        rec.ctx.dialect().ids_beside(&r2, &first, "R1's")
    ));
    let m = rec.ctx.manifest.clone();
    let unsupported = m.unsupported(r2.status);
    rec.check(
        clause!("idem.fingerprint.inputs"),
        matches!(kind, Answer::Refused | Answer::Other)
            && (unsupported || (400..500).contains(&r2.status)),
        "another method is another request: refused",
        r2.summary(),
    );
    if matches!(kind, Answer::Refused) && !unsupported {
        check_spelling(
            rec,
            &r2,
            ErrorCode::IdempotencyKeyMismatch,
            "another method",
        );
    }
    rec.check_effects(
        clause!("idem.fingerprint.inputs"),
        0,
        &marker,
        &[&first, &r2],
        1,
        "the other method does not execute R1's operation again",
    )
    .await;
}
