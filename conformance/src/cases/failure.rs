//! The failure-policy family: 4xx outcomes are final and replayed, 5xx
//! outcomes are never stored and release the key.

use super::{check_replay, preview};
use crate::case::{Case, Need, Rec};
use idem_spec::report::Verdict;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            id: "failure.4xx-final",
            title: "a 4xx outcome after the claim is stored and replayed",
            clauses: &[
                "idem.failure.final-outcomes",
                "idem.replay.verbatim",
                "idem.replay.marker",
            ],
            needs: &[Need::RejectedBody],
            permitted: |_| {
                vec![
                    "R1: a 4xx; R2: the same 4xx, byte for byte, with Idempotent-Replayed: true"
                        .into(),
                ]
            },
            run: |r| Box::pin(final_4xx(r)),
        },
        Case {
            id: "failure.5xx-not-stored",
            title: "a 5xx is not stored: the same key afterwards executes",
            clauses: &["idem.failure.5xx-not-stored", "idem.claim.transactional"],
            needs: &[Need::ServerError],
            permitted: |_| {
                vec!["R1 (fault injected): a 5xx and no effect; R2 (same key, no fault): a fresh 2xx, one effect".into()]
            },
            run: |r| Box::pin(not_stored_5xx(r)),
        },
    ]
}

async fn final_4xx(rec: &mut Rec) {
    let Some(template) = rec.ctx.endpoint().rejected_body.clone() else {
        return;
    };
    let key = rec.ctx.key();
    let a = rec.alias(&key);
    let marker = rec.ctx.marker();
    let body = crate::manifest::expand(&template, rec.ctx.caller(0), &marker, rec.ctx.amount());
    let req = rec.ctx.op(0, Some(&key), &body);
    let Some(r1) = rec
        .send(
            &format!("alice sends the declared rejected body with {a}"),
            &req,
        )
        .await
    else {
        return;
    };
    if !(400..500).contains(&r1.status) {
        rec.stop(
            Verdict::Inconclusive,
            format!(
                "endpoints[0].rejected_body did not produce a 4xx: {} {}",
                r1.status,
                preview(&r1.body)
            ),
        );
        return;
    }
    let Some(r2) = rec.send(&format!("alice resends it with {a}"), &req).await else {
        return;
    };
    rec.check(
        "idem.failure.final-outcomes",
        r2.same_outcome(&r1),
        format!("the {} is final: replayed", r1.status),
        r2.summary(),
    );
    check_replay(rec, &r1, &r2, "R2");
}

async fn not_stored_5xx(rec: &mut Rec) {
    let Some((header, value)) = rec.ctx.failpoint(|f| f.server_error.as_ref()) else {
        return;
    };
    let key = rec.ctx.key();
    let a = rec.alias(&key);
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(0, &marker);
    let req = rec.ctx.op(0, Some(&key), &body);
    let faulty = req.clone().header(&header, &value);
    let Some(r1) = rec
        .send(
            &format!("alice sends with {a} and {header}: {value}"),
            &faulty,
        )
        .await
    else {
        return;
    };
    if r1.status < 500 {
        rec.stop(
            Verdict::Inconclusive,
            format!(
                "the server_error failpoint did not produce a 5xx: {}",
                r1.summary()
            ),
        );
        return;
    }
    rec.check_effects(
        "idem.claim.transactional",
        0,
        &marker,
        &[&r1],
        0,
        "the failed attempt committed nothing",
    )
    .await;
    let Some(r2) = rec
        .send(&format!("alice retries with {a}, no fault"), &req)
        .await
    else {
        return;
    };
    rec.check(
        "idem.failure.5xx-not-stored",
        (200..300).contains(&r2.status) && !r2.replayed(),
        "a fresh execution: the 5xx was not stored and the key was released",
        r2.summary(),
    );
    rec.check_effects(
        "idem.failure.5xx-not-stored",
        0,
        &marker,
        &[&r1, &r2],
        1,
        "only the retry executed",
    )
    .await;
}
