//! The deadline family: a request whose caller's deadline is already
//! spent is not started. Runs where the manifest declares the header the
//! target reads the deadline from (`profile.deadline_header`).
//!
//! Work started for a caller that has given up is waste, and its outcome
//! still answers the caller's retry with the same key: a broken rule here
//! misleads no one about effects (`semantics`); a refusal in a status a
//! client would not retry is a spelling (`interop`).

use idem_conformance_core::clause;
use idem_conformance_core::verdict::Consequence;

use crate::server::case::{Aim, Case, Need, Rec, shared};
use crate::server::manifest::ManifestExt;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    vec![Case {
        id: "deadline.spent",
        title: "a request whose deadline is already spent takes no effect and claims nothing",
        clauses: &[clause!("idem.deadline.spent")],
        needs: &[Need::DEADLINE_HEADER],
        aim: Aim::Main,
        alone: shared,
        permitted: |m| {
            let h = m
                .profile
                .deadline_header
                .as_deref()
                .unwrap_or("(undeclared)");
            vec![format!(
                "R1 (a new operation, {h}: 0): a retryable refusal (5xx, 429 or 408; the contract's is 504 deadline_exceeded), no effect; R2 (the same request and key, no {h}): a fresh 2xx, not a replay, one effect"
            )]
        },
        run: |r| Box::pin(spent(r)),
    }]
}

/// Statuses a client retries: a refusal in one of them tells it to come
/// back, not that the operation failed for good.
fn retryable(status: u16) -> bool {
    status >= 500 || status == 408 || status == 429
}

async fn spent(rec: &mut Rec) {
    let Some(header) = rec.ctx.manifest.profile.deadline_header.clone() else {
        return;
    };
    let key = rec.ctx.key();
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(0, &marker);
    let req = rec.ctx.op(0, Some(&key), &marker, &body);
    let a = rec.alias(&key);
    let name = rec.ctx.name(0).to_owned();
    let Some(r1) = rec
        .send(
            &format!("{name} sends a new operation with {a} and {header}: 0"),
            &req.clone().header(&header, "0"),
        )
        .await
    else {
        return;
    };
    let executed = (200..300).contains(&r1.status);
    rec.check_as(
        clause!("idem.deadline.spent"),
        Consequence::Behaviour,
        !executed,
        format!("R1 ({header}: 0): not started"),
        r1.summary(),
    );
    if !executed {
        rec.check_as(
            clause!("idem.deadline.spent"),
            Consequence::Spelling,
            retryable(r1.status),
            "R1: refused with a status a client retries (5xx, 429 or 408)",
            r1.summary(),
        );
    }
    rec.check_effects_as(
        clause!("idem.deadline.spent"),
        Consequence::Behaviour,
        0,
        &marker,
        &[&r1],
        0,
        "a request whose caller had given up is not started",
    )
    .await;
    if rec.stopped.is_some() {
        return;
    }
    if executed {
        rec.headline(format!(
            "a request sent with {header}: 0 was executed: {}",
            r1.summary()
        ));
        // Its outcome is stored under the key: R2 would only replay it.
        return;
    }
    let Some(r2) = rec
        .send(&format!("{name} resends it with {a}, no {header}"), &req)
        .await
    else {
        return;
    };
    // A replay or an in-use refusal here means the spent request claimed
    // the key after all.
    rec.check_as(
        clause!("idem.deadline.spent"),
        Consequence::Behaviour,
        (200..300).contains(&r2.status) && rec.ctx.manifest.marked(&r2) != Some(true),
        "R2: a fresh execution (the spent request claimed nothing)",
        r2.summary(),
    );
    rec.check_effects_as(
        clause!("idem.deadline.spent"),
        Consequence::Behaviour,
        0,
        &marker,
        &[&r1, &r2],
        1,
        "the same request with time left executes as the first",
    )
    .await;
    rec.headline(format!(
        "after a refusal for a spent deadline, the same key answered {}",
        r2.summary()
    ));
}
