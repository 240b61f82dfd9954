//! The scope family: keys belong to (caller, key); two callers never
//! interact.
//!
//! One caller's stored response reaching the other is the `safety` failure
//! of `idem.scope.caller`; the other caller refused or blocked because the
//! first used the key, without seeing its response, is the `semantics`
//! failure of the same clause. A broken replay of a caller's own request is
//! the replay's finding, not scope's.

use idem_conformance_core::clause;
use idem_conformance_core::verdict::Consequence;
use idem_spec::ErrorCode;
use idem_spec::manifest::ScopeDecl;

use super::{check_replay, fresh};
use crate::server::case::{Aim, Case, Rec, shared};
use crate::server::http::Response;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    vec![Case {
        id: "scope.other-caller",
        title: "the same key from another caller executes independently and never replays the first caller's response",
        clauses: &[
            clause!("idem.scope.caller"),
            clause!("idem.replay.verbatim"),
        ],
        needs: &[],
        aim: Aim::Main,
        alone: shared,
        permitted: |m| {
            let (a, b) = (&m.callers[0].name, &m.callers[1].name);
            vec![
                format!(
                    "{b}'s request with {a}'s key: a fresh execution of {b}'s operation (2xx, no marker), one effect each"
                ),
                format!(
                    "{b} sending {a}'s exact bytes with that key: anything but {a}'s response or a key conflict"
                ),
            ]
        },
        run: |r| Box::pin(other_caller(r)),
    }]
}

/// [`crate::server::case::Ctx::is_leak`], stopping the case when the probe cannot
/// tell: `Some(None)` no leak, `Some(Some(proof))` a leak and what proves it.
async fn leaked(
    rec: &mut Rec,
    caller: usize,
    marker: &str,
    before: u64,
    r: &Response,
    other: (&Response, &str),
) -> Option<Option<String>> {
    match rec
        .ctx
        .is_leak(caller, marker, before, r, other.0, Some(other.1))
        .await
    {
        Ok(l) => Some(l),
        Err(e) => {
            rec.probe_failed(e);
            None
        }
    }
}

async fn other_caller(rec: &mut Rec) {
    let (alice, bob) = (rec.ctx.name(0).to_owned(), rec.ctx.name(1).to_owned());
    let scope = rec.ctx.manifest.policy.scope;
    if scope != ScopeDecl::PerCaller {
        // The declaration explains a finding; it never excuses one: a
        // cross-caller answer is unsafe however the target scopes keys.
        rec.note(format!(
            "the manifest declares scope = \"{}\": the contract keeps keys per caller, and the case checks the contract (another caller's answer is unsafe whatever is declared; a refusal of {bob}'s own request is semantics)",
            scope.as_str()
        ));
    }
    let key = rec.ctx.key();
    let Some((alice_req, alice_first, alice_marker)) = fresh(rec, 0, &key).await else {
        return;
    };
    let a = rec.alias(&key);
    let Some((b1, bob_marker)) =
        bob_own_operation(rec, &key, &a, &alice_first, &alice_marker).await
    else {
        return;
    };
    // Alice again: her own stored response, never bob's.
    let Some(a2) = rec
        .send(&format!("{alice} resends R1 with {a}"), &alice_req)
        .await
    else {
        return;
    };
    // Her operation executed already: bob's bytes, where they differ from
    // hers, are his.
    let leak = (200..300).contains(&a2.status)
        && a2.same_payload(&b1)
        && !b1.same_payload(&alice_first)
        && String::from_utf8_lossy(&a2.body).contains(bob_marker.as_str());
    rec.check(
        clause!("idem.scope.caller"),
        !leak,
        format!("never {bob}'s response"),
        a2.summary(),
    );
    rec.headline(format!(
        "{alice}'s retry got {bob}'s response: it carries {bob}'s marker {bob_marker:?}{}",
        rec.ctx.dialect().ids_side_by_side(&a2, &alice_first)
    ));
    if !leak {
        check_replay(rec, &alice_first, &a2, &format!("{alice}'s own replay"));
    }
    bob_sends_alices_request(rec).await;
}

/// Bob sends his own operation with the key alice used: a fresh execution
/// of his, never alice's stored response, one effect each. Returns his
/// answer and marker, `None` when the case stopped.
async fn bob_own_operation(
    rec: &mut Rec,
    key: &str,
    a: &str,
    alice_first: &Response,
    alice_marker: &str,
) -> Option<(Response, String)> {
    let (alice, bob) = (rec.ctx.name(0).to_owned(), rec.ctx.name(1).to_owned());
    // Bob, same key, his own operation.
    let bob_marker = rec.ctx.marker();
    let bob_body = rec.ctx.body(1, &bob_marker);
    let bob_req = rec.ctx.op(1, Some(key), &bob_marker, &bob_body);
    let b1 = rec
        .send(&format!("{bob} sends its own operation with {a}"), &bob_req)
        .await?;
    let proof = leaked(rec, 1, &bob_marker, 0, &b1, (alice_first, alice_marker)).await?;
    let leak = proof.is_some();
    rec.check(
        clause!("idem.scope.caller"),
        !leak,
        format!("never {alice}'s stored response"),
        match &proof {
            Some(p) => format!("{}: {alice}'s response ({p})", b1.summary()),
            None => b1.summary(),
        },
    );
    rec.headline(format!(
        "{bob}, sending {alice}'s key with his own operation, got {alice}'s stored response: {}",
        proof.as_deref().unwrap_or("")
    ));
    if !leak {
        rec.check_as(
            clause!("idem.scope.caller"),
            Consequence::Behaviour,
            rec.ctx.dialect().executed(&b1, Some(alice_first)),
            format!(
                "a fresh execution of {bob}'s operation: {alice}'s key does not block or refuse it"
            ),
            b1.summary(),
        );
    }
    rec.check_effects_as(
        clause!("idem.scope.caller"),
        Consequence::Behaviour,
        1,
        &bob_marker,
        &[&b1],
        1,
        &format!("{bob}'s operation executes once"),
    )
    .await;
    rec.check_effects_as(
        clause!("idem.scope.caller"),
        Consequence::Behaviour,
        0,
        alice_marker,
        &[alice_first],
        1,
        &format!("{alice}'s operation executed once"),
    )
    .await;
    Some((b1, bob_marker))
}

/// Bob sends alice's exact bytes (his credentials) with a second key alice
/// has used: whatever his answer is, it is not hers, and not a key
/// conflict caused by her.
async fn bob_sends_alices_request(rec: &mut Rec) {
    let (alice, bob) = (rec.ctx.name(0).to_owned(), rec.ctx.name(1).to_owned());
    // Bob sends alice's exact bytes (his credentials) with a second key that
    // alice has used: whatever bob's answer is, it is not alice's.
    let key2 = rec.ctx.key();
    let Some((alice2_req, alice2_first, alice2_marker)) = fresh(rec, 0, &key2).await else {
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
    bob_copy.signed_by = rec.ctx.signer(1);
    // What the probe shows for the marker before bob sends, as bob sees it:
    // his own execution moves it; a replay of alice's response does not.
    rec.ctx.remember_key(&alice2_marker, &key2);
    let before = match rec.ctx.effects(1, &alice2_marker, &[&alice2_first]).await {
        Ok(n) => n,
        Err(e) => {
            rec.probe_failed(e);
            return;
        }
    };
    let Some(b2) = rec
        .send(
            &format!("{bob} sends {alice}'s exact request with {a2k}"),
            &bob_copy,
        )
        .await
    else {
        return;
    };
    // Bob's copy carries alice's marker, so only the probe (or a resource
    // id) can prove a leak here.
    let Some(proof) = leaked(
        rec,
        1,
        &alice2_marker,
        before,
        &b2,
        (&alice2_first, &alice2_marker),
    )
    .await
    else {
        return;
    };
    let leak = proof.is_some();
    rec.check(
        clause!("idem.scope.caller"),
        !leak,
        format!("{bob}'s own answer: not a replay of {alice}'s"),
        match &proof {
            Some(p) => format!("{}: {alice}'s response ({p})", b2.summary()),
            None => b2.summary(),
        },
    );
    rec.headline(format!(
        "{bob}, sending {alice}'s exact request with that key, got the stored response: {}",
        proof.as_deref().unwrap_or("")
    ));
    if !leak {
        // Bob may be refused for his own reasons (the accounts in alice's
        // body are not his); only a key conflict is the key's doing.
        let conflict = rec.ctx.dialect().is(&b2, ErrorCode::IdempotencyKeyMismatch)
            || rec.ctx.dialect().is(&b2, ErrorCode::IdempotencyKeyInUse);
        rec.check_as(
            clause!("idem.scope.caller"),
            Consequence::Behaviour,
            !conflict,
            format!("{bob}'s own answer, not a key conflict caused by {alice}"),
            b2.summary(),
        );
    }
}
