//! The scope family: keys belong to (caller, key); two callers never
//! interact.

use idem_spec::ErrorCode;

use super::fresh;
use crate::case::{Case, Rec, is_error};

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    vec![Case {
        id: "scope.other-caller",
        title: "the same key from another caller executes independently and never replays the first caller's response",
        clauses: &["idem.scope.caller"],
        needs: &[],
        permitted: |_| {
            vec![
                "bob's request with alice's key: a fresh execution of bob's operation (2xx, no marker), one effect each".into(),
                "bob sending alice's exact bytes with her key: anything but alice's response or a key conflict".into(),
            ]
        },
        run: |r| Box::pin(other_caller(r)),
    }]
}

async fn other_caller(rec: &mut Rec) {
    let key = rec.ctx.key();
    let Some((alice_req, alice_first, alice_marker)) = fresh(rec, 0, &key).await else {
        return;
    };
    let a = rec.alias(&key);
    // Bob, same key, his own operation.
    let bob_marker = rec.ctx.marker();
    let bob_body = rec.ctx.body(1, &bob_marker);
    let bob_req = rec.ctx.op(1, Some(&key), &bob_body);
    let Some(b1) = rec
        .send(&format!("bob sends his own operation with {a}"), &bob_req)
        .await
    else {
        return;
    };
    let m = &rec.ctx.manifest;
    let conflict = is_error(m, &b1, ErrorCode::IdempotencyKeyMismatch)
        || is_error(m, &b1, ErrorCode::IdempotencyKeyInUse);
    rec.check(
        "idem.scope.caller",
        (200..300).contains(&b1.status) && !conflict,
        "a fresh execution of bob's operation",
        b1.summary(),
    );
    rec.check(
        "idem.scope.caller",
        b1.body != alice_first.body,
        "never alice's stored response",
        if b1.body == alice_first.body {
            "alice's response body".to_owned()
        } else {
            "a different body".to_owned()
        },
    );
    rec.check_effects(
        "idem.scope.caller",
        1,
        &bob_marker,
        &[&b1],
        1,
        "bob's operation executes once",
    )
    .await;
    rec.check_effects(
        "idem.scope.caller",
        0,
        &alice_marker,
        &[&alice_first],
        1,
        "alice's operation executed once",
    )
    .await;
    // Alice again: still her own stored response, not bob's.
    let Some(a2) = rec
        .send(&format!("alice resends R1 with {a}"), &alice_req)
        .await
    else {
        return;
    };
    rec.check(
        "idem.scope.caller",
        a2.same_outcome(&alice_first),
        "alice's own stored response",
        a2.summary(),
    );
    rec.check(
        "idem.replay.marker",
        a2.replayed(),
        "Idempotent-Replayed: true",
        a2.summary(),
    );
    // Bob sends alice's exact bytes (his credentials) with a second key that
    // alice has used: whatever bob's answer is, it is not alice's.
    let key2 = rec.ctx.key();
    let Some((alice2_req, alice2_first, _)) = fresh(rec, 0, &key2).await else {
        return;
    };
    let a2k = rec.alias(&key2);
    let mut bob_copy = alice2_req.clone();
    let alice_auth: Vec<String> = rec
        .ctx
        .caller(0)
        .headers
        .keys()
        .map(|k| k.to_ascii_lowercase())
        .collect();
    bob_copy
        .headers
        .retain(|(n, _)| !alice_auth.contains(&n.to_ascii_lowercase()));
    bob_copy.headers.extend(rec.ctx.auth(1));
    let Some(b2) = rec
        .send(
            &format!("bob sends alice's exact request with {a2k}"),
            &bob_copy,
        )
        .await
    else {
        return;
    };
    let m = &rec.ctx.manifest;
    let leaked = b2.same_outcome(&alice2_first);
    let conflict = is_error(m, &b2, ErrorCode::IdempotencyKeyMismatch)
        || is_error(m, &b2, ErrorCode::IdempotencyKeyInUse);
    rec.check(
        "idem.scope.caller",
        !leaked && !conflict,
        "bob's own answer: not a replay of alice's, not a key conflict",
        b2.summary(),
    );
}
