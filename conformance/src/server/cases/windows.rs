//! The window family: replayed for the whole published window, a new
//! request after it, and the window's end said on the answers. The cases
//! that move the target's clock need the clock hook and run last.

use std::time::{Duration, Instant, SystemTime};

use super::recovery::crash_then_retry;
use super::{check_marked, check_replay, fresh};
use crate::server::case::{Aim, Case, Need, Rec, alone, shared};
use crate::server::http::Response;
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
            id: "windows.expiry-header",
            title: "the first execution, its replay and a mismatch say when the key's window ends",
            clauses: &[clause!("idem.window.expiry-header")],
            needs: &[Need::EXPIRY_HEADER],
            aim: Aim::Main,
            alone: shared,
            permitted: |m| {
                let h = m.profile.expiry_header.as_deref().unwrap_or("(undeclared)");
                vec![
                    format!(
                        "R1 (first execution), R2 (its replay) and R3 (a mismatch) carry {h}: one HTTP-date, {} s (the declared window) after R1's Date, within R1's round trip and {} s of rounding",
                        m.policy.replay_window_secs,
                        ROUNDING.as_secs()
                    ),
                    "in-flight refusals are not checked here (they need a request held in flight)"
                        .into(),
                ]
            },
            run: |r| Box::pin(expiry_header(r)),
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

/// Slack for whole-second HTTP-dates (the value and `Date` each truncated)
/// and a server that stamps the window at its commit, not at its claim.
const ROUNDING: Duration = Duration::from_secs(3);

/// The declared expiry header's value on `r`, parsed; a missing or
/// unreadable one is recorded as a failed check.
fn expiry_of(rec: &mut Rec, header: &str, r: &Response, what: &str) -> Option<SystemTime> {
    let raw = r.header(header);
    let parsed = raw.and_then(|v| httpdate::parse_http_date(v.trim()).ok());
    // Absent or unreadable, the header misleads no one: the published
    // window is still there to go by.
    rec.check_as(
        clause!("idem.window.expiry-header"),
        Consequence::Spelling,
        parsed.is_some(),
        format!("{what}: {header}: <HTTP-date>"),
        match raw {
            None => format!("{what}: no {header} ({})", r.summary()),
            Some(v) => format!("{what}: {header}: {v:?}, not an HTTP-date"),
        },
    );
    parsed
}

fn secs_between(a: SystemTime, b: SystemTime) -> f64 {
    match a.duration_since(b) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

async fn expiry_header(rec: &mut Rec) {
    let Some(header) = rec.ctx.manifest.profile.expiry_header.clone() else {
        return;
    };
    let window = rec.ctx.manifest.policy.replay_window_secs;
    let key = rec.ctx.key();
    let sent = Instant::now();
    let Some((req, first, marker)) = fresh(rec, 0, &key).await else {
        return;
    };
    let round_trip = sent.elapsed();
    let Some(end) = expiry_of(rec, &header, &first, "R1") else {
        return;
    };
    // The server's own clock, as its answer states it: a client computes
    // the window left as the header minus `Date`, so that is what must
    // come out right, whatever the kit's clock says.
    match first
        .header("date")
        .and_then(|d| httpdate::parse_http_date(d.trim()).ok())
    {
        Some(date) => {
            let left = secs_between(end, date);
            let slack = (round_trip + ROUNDING).as_secs_f64();
            // A window said longer than the one kept can lead a client to
            // retry where its retry executes again; never safety, because
            // the published window is the number clients are told to trust.
            rec.check(
                clause!("idem.window.expiry-header"),
                (left - window as f64).abs() <= slack,
                format!(
                    "R1: {header} minus Date = {window} s (the declared window), within {slack:.1} s"
                ),
                format!("R1: {header} minus Date = {left:.0} s"),
            );
            rec.headline(format!(
                "the first answer said its key's window lasts {left:.0} s; {window} s declared"
            ));
        }
        None => rec.note(format!(
            "R1 has no Date header: the window {header} states is not compared with the declared one (the kit's clock need not agree with the server's)"
        )),
    }
    let a = rec.alias(&key);
    let name = rec.ctx.name(0).to_owned();
    let Some(r2) = rec.send(&format!("{name} resends R1 with {a}"), &req).await else {
        return;
    };
    if r2.same_outcome(&first)
        && let Some(again) = expiry_of(rec, &header, &r2, "R2 (replay)")
    {
        rec.check(
            clause!("idem.window.expiry-header"),
            secs_between(again, end).abs() <= 1.0,
            format!("R2 (replay): the same {header} as R1"),
            format!("R2: {header} {:+.0} s from R1's", secs_between(again, end)),
        );
    } else if !r2.same_outcome(&first) {
        rec.note("R2 is not a replay of R1; the replay cases judge that");
    }
    // Same marker, another amount: a different request under the key.
    let req3 = rec.ctx.redrawn(&req, 0, &marker);
    if req3.body == req.body {
        rec.note("no second body could be drawn; the mismatch answer is not checked");
        return;
    }
    let Some(r3) = rec
        .send(&format!("{name} reuses {a} with a different amount"), &req3)
        .await
    else {
        return;
    };
    if !(400..500).contains(&r3.status) {
        rec.note("R3 was not refused; the mismatch cases judge that");
        return;
    }
    if let Some(at) = expiry_of(rec, &header, &r3, "R3 (mismatch)") {
        rec.check(
            clause!("idem.window.expiry-header"),
            secs_between(at, end).abs() <= 1.0,
            format!("R3 (mismatch): the same {header} as R1"),
            format!("R3: {header} {:+.0} s from R1's", secs_between(at, end)),
        );
    }
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
    let key = rec.ctx.key_of(&req);
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
        signed_by: rec.ctx.signer(0),
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
