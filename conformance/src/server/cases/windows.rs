//! The window family: replayed for the whole published window, a new
//! request after it. Needs the clock hook; these cases run last because they
//! move the target's clock.

use super::recovery::crash_then_retry;
use super::{check_marked, check_replay, fresh};
use crate::server::case::{Aim, Case, Need, Rec, alone, shared};
use idem_conformance_core::clause;
use idem_conformance_core::verdict::Consequence;

use idem_spec::report::Verdict;

/// Seconds of margin on each side of the window edge.
pub const MARGIN_SECS: u64 = 60;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            id: "windows.published",
            title: "the OpenAPI document publishes the replay window and retention",
            clauses: &[
                clause!("idem.window.published"),
                clause!("idem.window.retention"),
            ],
            needs: &[Need::OPENAPI],
            aim: Aim::Main,
            alone: shared,
            permitted: |m| {
                vec![format!(
                    "x-idempotency.policy.replay_window_secs = {} (as declared) and retention_secs >= it",
                    m.policy.replay_window_secs
                )]
            },
            run: |r| Box::pin(published(r)),
        },
        Case {
            id: "windows.replay-within",
            title: "a duplicate just inside the replay window is replayed",
            clauses: &[
                clause!("idem.window.replay"),
                clause!("idem.replay.verbatim"),
            ],
            needs: &[Need::CLOCK],
            aim: Aim::Main,
            alone,
            permitted: |m| {
                vec![format!(
                    "after {} s (window {} s): a verbatim replay",
                    m.policy.replay_window_secs.saturating_sub(MARGIN_SECS),
                    m.policy.replay_window_secs
                )]
            },
            run: |r| Box::pin(within(r)),
        },
        Case {
            id: "windows.expiry",
            title: "a key reused after the replay window is a brand-new request",
            clauses: &[clause!("idem.window.expiry")],
            needs: &[Need::CLOCK],
            aim: Aim::Main,
            alone,
            permitted: |m| {
                vec![format!(
                    "after {} s: a fresh execution (second effect), then replays of the new outcome",
                    m.policy.replay_window_secs + MARGIN_SECS
                )]
            },
            run: |r| Box::pin(expiry(r)),
        },
        Case {
            id: "windows.progress",
            title: "a request with committed progress is resumed after the replay window, never replaced",
            clauses: &[clause!("idem.window.progress")],
            needs: &[Need::FOREIGN_CRASH, Need::CLOCK],
            aim: Aim::Recovery,
            alone,
            permitted: |m| {
                vec![format!(
                    "R1 crashes between the foreign call and its commit; after a restart and {} s: R2 with the same key resumes it (2xx), one effect, one foreign effect; R3 replays R2",
                    m.policy.replay_window_secs + MARGIN_SECS
                )]
            },
            run: |r| Box::pin(progress(r)),
        },
    ]
}

async fn progress(rec: &mut Rec) {
    let Some((header, value)) = rec.ctx.failpoint(|f| f.crash_after_foreign_call.as_ref()) else {
        return;
    };
    let secs = rec.ctx.manifest.policy.replay_window_secs + MARGIN_SECS;
    let Some((r2, marker, req)) = crash_then_retry(rec, &header, &value, Some(secs)).await else {
        return;
    };
    rec.check_as(
        clause!("idem.window.progress"),
        Consequence::Behaviour,
        (200..300).contains(&r2.status),
        "the request with committed progress is resumed and completes (2xx)",
        r2.summary(),
    );
    rec.check_effects(
        clause!("idem.window.progress"),
        0,
        &marker,
        &[&r2],
        1,
        "past the window the key still names the crashed request: no second one",
    )
    .await;
    if rec.stopped.is_some() {
        return;
    }
    if rec.ctx.manifest.hooks.foreign_probe.is_some() {
        match rec.ctx.foreign_effects(&marker).await {
            Some(Ok(n)) => {
                rec.note(format!(
                    "the foreign probe counted {n} effect(s) for marker {marker:?}"
                ));
                rec.check(
                    clause!("idem.window.progress"),
                    n == 1,
                    "exactly 1 foreign effect: the resumed request did not start over",
                    format!("{n} foreign effect(s)"),
                );
                rec.headline(format!(
                    "a request resumed past its window repeated its foreign call: {n} foreign effect(s), 1 allowed"
                ));
            }
            Some(Err(e)) => {
                rec.probe_failed(e);
                return;
            }
            None => {}
        }
    }
    let key = req
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("idempotency-key"))
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default();
    let a = rec.alias(&key);
    let name = rec.ctx.name(0).to_owned();
    let Some(r3) = rec.send(&format!("{name} resends R2 with {a}"), &req).await else {
        return;
    };
    // A fresh execution here replaced the finished request (safety); any
    // other answer that is not R2's is a broken replay (semantics).
    rec.check(
        clause!("idem.window.progress"),
        !rec.ctx.dialect().executed(&r3, Some(&r2)),
        "once finished, the key is not replaced by a new request",
        r3.summary(),
    );
    rec.headline(format!(
        "a finished request with committed progress was executed again past its window: R2 {}, R3 {}{}",
        r2.summary(),
        r3.summary(),
        rec.ctx.dialect().ids_beside(&r3, &r2, "R2's")
    ));
    check_replay(rec, &r2, &r3, "R3");
}

async fn within(rec: &mut Rec) {
    let key = rec.ctx.key();
    let Some((req, first, _)) = fresh(rec, 0, &key).await else {
        return;
    };
    let secs = rec
        .ctx
        .manifest
        .policy
        .replay_window_secs
        .saturating_sub(MARGIN_SECS);
    if let Err(e) = rec.ctx.advance_clock(secs).await {
        rec.stop(Verdict::Error, e);
        return;
    }
    rec.note(format!("the target's clock is advanced by {secs} s"));
    let a = rec.alias(&key);
    let name = rec.ctx.name(0).to_owned();
    let Some(r2) = rec.send(&format!("{name} resends R1 with {a}"), &req).await else {
        return;
    };
    rec.check(
        clause!("idem.window.replay"),
        r2.same_outcome(&first),
        "inside the window: a replay",
        r2.summary(),
    );
    if r2.same_outcome(&first) {
        check_replay(rec, &first, &r2, "inside the window");
    }
}

async fn expiry(rec: &mut Rec) {
    let key = rec.ctx.key();
    let Some((req, first, marker)) = fresh(rec, 0, &key).await else {
        return;
    };
    let secs = rec.ctx.manifest.policy.replay_window_secs + MARGIN_SECS;
    if let Err(e) = rec.ctx.advance_clock(secs).await {
        rec.stop(Verdict::Error, e);
        return;
    }
    rec.note(format!("the target's clock is advanced by {secs} s"));
    let a = rec.alias(&key);
    let name = rec.ctx.name(0).to_owned();
    let Some(r2) = rec
        .send(
            &format!("{name} resends R1 with {a} after the window"),
            &req,
        )
        .await
    else {
        return;
    };
    rec.check(
        clause!("idem.window.expiry"),
        rec.ctx.dialect().executed(&r2, Some(&first)),
        "a fresh execution",
        r2.summary(),
    );
    rec.check_effects(
        clause!("idem.window.expiry"),
        0,
        &marker,
        &[&first, &r2],
        2,
        "the expired key executed again",
    )
    .await;
    let Some(r3) = rec
        .send(&format!("{name} resends again with {a}"), &req)
        .await
    else {
        return;
    };
    rec.check(
        clause!("idem.window.expiry"),
        r3.same_outcome(&r2),
        "the new outcome is stored under the key: a replay of R2",
        r3.summary(),
    );
    check_marked(rec, &r3, "R3");
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
    };
    let Some(r) = rec.send(&format!("GET {path}"), &req).await else {
        return;
    };
    let doc = r.json().unwrap_or_default();
    let policy = doc.pointer("/x-idempotency/policy");
    let window = policy
        .and_then(|p| p.get("replay_window_secs"))
        .and_then(serde_json::Value::as_u64);
    let retention = policy
        .and_then(|p| p.get("retention_secs"))
        .and_then(serde_json::Value::as_u64);
    let declared = rec.ctx.manifest.policy.replay_window_secs;
    rec.check(
        clause!("idem.window.published"),
        window == Some(declared),
        format!("x-idempotency.policy.replay_window_secs = {declared}"),
        format!("replay_window_secs = {window:?}"),
    );
    // The clause is about keeping records; what a black box sees is only
    // whether the period is published, a spelling.
    rec.check_as(
        clause!("idem.window.retention"),
        Consequence::Spelling,
        retention.is_some_and(|t| t >= declared),
        format!("a published retention_secs of at least the window ({declared} s)"),
        format!("retention_secs = {retention:?}"),
    );
}
