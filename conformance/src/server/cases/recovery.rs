//! The recovery family: crashes and takeovers. These need the target's
//! cooperation (failpoint and restart hooks); without them each case is
//! reported unsupported, never passed.

use idem_conformance_core::clause;
use std::time::Duration;

use idem_spec::report::Verdict;

use super::inflight::ATTEMPTS;
use crate::server::case::{Aim, Case, HOLD, Need, Rec, alone};
use crate::server::http::{Request, Response};

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            id: "recovery.crash-restart",
            title: "a crash after commit, then a restart: the retry gets the committed outcome, one effect",
            clauses: &[
                clause!("idem.claim.transactional"),
                clause!("idem.multistep.phases"),
                clause!("idem.multistep.resume"),
                clause!("idem.multistep.foreign-key"),
            ],
            needs: &[Need::CRASH_RESTART],
            aim: Aim::Recovery,
            alone,
            permitted: |_| {
                vec![
                    "R1: no answer (crashed); after restart R2 with the same key: 2xx (replayed or resumed); exactly one effect".into(),
                    "with hooks.foreign_probe: R3 crashes between the foreign call and its commit; after restart its retry: 2xx and exactly one foreign effect".into(),
                ]
            },
            run: |r| Box::pin(crash_restart(r)),
        },
        Case {
            id: "recovery.lease-takeover",
            title: "a request paused past its lease is taken over, and the paused writer cannot commit",
            clauses: &[
                clause!("idem.lease.takeover"),
                clause!("idem.lease.fencing"),
            ],
            needs: &[Need::LEASE_PAUSE],
            aim: Aim::Recovery,
            alone,
            permitted: |_| {
                vec!["after the lease: the retry takes over (2xx) and the paused original commits nothing; exactly one effect".into()]
            },
            run: |r| Box::pin(takeover(r)),
        },
    ]
}

async fn crash_restart(rec: &mut Rec) {
    let Some((header, value)) = rec.ctx.failpoint(|f| f.crash_after_commit.as_ref()) else {
        return;
    };
    let Some((r2, marker, _)) = crash_then_retry(rec, &header, &value, None).await else {
        return;
    };
    rec.check(
        clause!("idem.multistep.resume"),
        (200..300).contains(&r2.status),
        "the committed outcome (2xx)",
        r2.summary(),
    );
    let n = rec
        .check_effects(
            clause!("idem.claim.transactional"),
            0,
            &marker,
            &[&r2],
            1,
            "a crash after commit, a restart and a retry with the key",
        )
        .await;
    if n.is_some_and(|n| n > 1) {
        // What was seen is a repeat; from outside its cause is one of two.
        rec.note(
            "the retry executed the committed operation again: either the crash split the key's state from the business writes (idem.claim.transactional), or the key was dropped or replaced long before its replay window ended",
        );
    }
    if rec.stopped.is_some() {
        return;
    }
    // The foreign half: only the foreign system can tell whether the
    // resumed request called it again under a new key. Without a probe
    // into it, the multi-step clauses stay unchecked (inconclusive).
    let foreign = rec.ctx.failpoint(|f| f.crash_after_foreign_call.as_ref());
    let Some((header, value)) = foreign.filter(|_| rec.ctx.manifest.hooks.foreign_probe.is_some())
    else {
        rec.note(
            "no hooks.foreign_probe with failpoint.crash_after_foreign_call: the foreign system is not observed",
        );
        return;
    };
    let Some((r3, marker, _)) = crash_then_retry(rec, &header, &value, None).await else {
        return;
    };
    rec.check(
        clause!("idem.multistep.resume"),
        (200..300).contains(&r3.status),
        "the resumed outcome (2xx) after a crash between the foreign call and its commit",
        r3.summary(),
    );
    let n = match rec.ctx.foreign_effects(&marker).await {
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            rec.probe_failed(match e {
                crate::server::probe::ProbeError::Failed(s) => {
                    crate::server::probe::ProbeError::Failed(format!("foreign probe: {s}"))
                }
                other => other,
            });
            return;
        }
        None => return,
    };
    rec.note(format!(
        "the foreign probe counted {n} effect(s) for marker {marker:?}"
    ));
    if n != 1 {
        rec.note(format!(
            "so: the resumed request repeated (or lost) the foreign call; the foreign system holds {n} effect(s) where one is allowed"
        ));
    }
    rec.check(
        clause!("idem.multistep.foreign-key"),
        n == 1,
        "exactly 1 foreign effect: the repeated call reuses the derived key",
        format!("{n} foreign effect(s)"),
    );
    rec.check(
        clause!("idem.multistep.phases"),
        n == 1 && (200..300).contains(&r3.status),
        "the retry resumes from the committed phase: 2xx and exactly 1 foreign effect",
        format!("{}; {n} foreign effect(s)", r3.summary()),
    );
}

/// Sends a fresh operation to the recovery endpoint with the crash
/// failpoint `header: value`, restarts the target, moves its clock by
/// `advance_secs` when given, and retries with the same key (past the
/// crashed request's lease when a clock hook allows). Returns the retry's
/// answer and the operation's marker; `None` when the case stopped or no
/// restart is available.
pub(super) async fn crash_then_retry(
    rec: &mut Rec,
    header: &str,
    value: &str,
    advance_secs: Option<u64>,
) -> Option<(Response, String, crate::server::http::Request)> {
    let restarter = rec.ctx.restarter.clone();
    let cmd = rec
        .ctx
        .manifest
        .hooks
        .restart
        .as_ref()
        .map(|h| h.command.clone());
    if restarter.is_none() && cmd.is_none() {
        return None;
    }
    let key = rec.ctx.key();
    let a = rec.alias(&key);
    let name = rec.ctx.name(0).to_owned();
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(0, &marker);
    let req = rec.ctx.op(0, Some(&key), &marker, &body);
    let crash = req.clone().header(header, value);
    let label = rec.next_label();
    rec.reproduction
        .push(format!("# {label}\n{}", rec.ctx.client.curl(&crash)));
    let r1 = rec.ctx.client.send(&crash).await;
    rec.note(format!(
        "{label}: {name} sends with {a} and {header}: {value} → {}",
        match &r1 {
            Ok(r) => r.summary(),
            Err(f) => format!("no response ({f})"),
        }
    ));
    // The demo owns its server and restarts it in process; anyone else
    // declares a shell command.
    let restarted = match (restarter, cmd) {
        (Some(r), _) => {
            rec.note("the harness restarts the target (same binary, database and port)");
            (r.0)(rec.ctx.clock_advanced_secs()).await
        }
        (None, Some(cmd)) => {
            rec.note(format!("the restart hook runs: {cmd}"));
            let status = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(&cmd)
                .status()
                .await;
            match status {
                Ok(s) if s.success() => Ok(()),
                other => Err(format!("restart hook failed: {other:?}")),
            }
        }
        (None, None) => return None,
    };
    if let Err(e) = restarted {
        rec.stop(Verdict::Error, e);
        return None;
    }
    if !wait_ready(rec).await {
        rec.stop(
            Verdict::Error,
            "the target did not answer after the restart",
        );
        return None;
    }
    if let Some(secs) = advance_secs {
        if let Err(e) = rec.ctx.advance_clock(secs).await {
            rec.stop(Verdict::Error, e);
            return None;
        }
        rec.note(format!("the target's clock is advanced by {secs} s"));
    }
    let mut r2 = rec.send(&format!("{name} retries with {a}"), &req).await?;
    // The crashed request's lease may still run after the restart: with a
    // clock hook, move past it and retry once (bounded).
    if r2.status == 409 && rec.ctx.manifest.hooks.clock.is_some() {
        let lease = idem_spec::policy::DEFAULT_LEASE_SECS * 2;
        if let Err(e) = rec.ctx.advance_clock(lease).await {
            rec.stop(Verdict::Error, e);
            return None;
        }
        rec.note(format!(
            "the key is still leased to the crashed request; the target's clock is advanced by {lease} s"
        ));
        r2 = rec
            .send(&format!("{name} retries with {a} after the lease"), &req)
            .await?;
    }
    Some((r2, marker, req))
}

async fn wait_ready(rec: &mut Rec) -> bool {
    let url = rec.ctx.url("/");
    let client = reqwest::Client::new();
    // Bounded readiness poll: any HTTP answer means it is back.
    for _ in 0..100 {
        if client
            .get(&url)
            .timeout(Duration::from_millis(500))
            .send()
            .await
            .is_ok()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

async fn takeover(rec: &mut Rec) {
    let Some((header, value)) = rec.ctx.failpoint(|f| f.lease_pause.as_ref()) else {
        return;
    };
    let name = rec.ctx.name(0).to_owned();
    for attempt in 1..=ATTEMPTS {
        let key = rec.ctx.key();
        let a = rec.alias(&key);
        let marker = rec.ctx.marker();
        let body = rec.ctx.body(0, &marker);
        let req = rec.ctx.op(0, Some(&key), &marker, &body);
        let held = req.clone().header(&header, &value);
        let label = rec.next_label();
        rec.reproduction
            .push(format!("# {label}\n{}", rec.ctx.client.curl(&held)));
        let client = rec.ctx.client.clone();
        let original = tokio::spawn(async move { client.send(&held).await });
        // A lease pause holds the request after it committed progress, so
        // the effect probe sees it once it is held: wait for that before
        // sending the duplicate (bounded), or the duplicate could arrive
        // first and be the original itself.
        let deadline = tokio::time::Instant::now() + HOLD;
        while tokio::time::Instant::now() < deadline
            && !rec.ctx.effects(0, &marker, &[]).await.is_ok_and(|n| n >= 1)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let Some((in_flight, overtaken)) = probe_in_flight(rec, &req, &name, &a, &label).await
        else {
            return;
        };
        if !in_flight {
            let _ = rec.ctx.finish_held(original).await;
            if overtaken && attempt < ATTEMPTS {
                tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
                // The probe reached the target first and executed; the
                // held request was the duplicate. Start over.
                rec.note(format!(
                    "the probe reached the target before {label}; starting over with a fresh key"
                ));
                continue;
            }
            rec.stop(
                Verdict::Inconclusive,
                "never observed the held request in flight",
            );
            return;
        }
        let Some(r2) = retry_past_lease(rec, &req, &name, &a).await else {
            return;
        };
        rec.check(
            clause!("idem.lease.takeover"),
            (200..300).contains(&r2.status),
            "the retry takes the key over and completes",
            r2.summary(),
        );
        // The held original may now try to commit: fencing must refuse it.
        let first = match rec.ctx.finish_held(original).await {
            Some(sent) => rec.record(&label, &format!("the held original with {a}"), sent),
            None => None,
        };
        let seen: Vec<&Response> = first.iter().chain(std::iter::once(&r2)).collect();
        rec.check_effects(
            clause!("idem.lease.fencing"),
            0,
            &marker,
            &seen,
            1,
            "the paused writer's commit is rejected",
        )
        .await;
        return;
    }
}

/// Sends the same request while the original is held until the target
/// shows it in flight (a 409), at most 40 times. `None` when the case
/// stopped; else whether it was seen in flight, and whether a probe was
/// executed instead (it reached the target first: the held request was
/// the duplicate).
async fn probe_in_flight(
    rec: &mut Rec,
    req: &Request,
    name: &str,
    a: &str,
    label: &str,
) -> Option<(bool, bool)> {
    for _ in 0..40 {
        let r = rec
            .send(&format!("{name} probes {a} while {label} is held"), req)
            .await?;
        if r.status == 409 {
            return Some((true, false));
        }
        if (200..300).contains(&r.status) {
            return Some((false, !r.replayed()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Some((false, false))
}

/// Moves the target's clock past the lease and retries; the 409 may have
/// come before the held request committed its progress (and started its
/// lease), so the lease can start after a clock move: move again while the
/// answer is 409 (at most three times; the held request stays held, so its
/// lease must run out). `None` when the case stopped.
async fn retry_past_lease(rec: &mut Rec, req: &Request, name: &str, a: &str) -> Option<Response> {
    let lease = idem_spec::policy::DEFAULT_LEASE_SECS * 2;
    let mut r2 = None;
    for _ in 0..3 {
        if let Err(e) = rec.ctx.advance_clock(lease).await {
            rec.stop(Verdict::Error, e);
            return None;
        }
        rec.note(format!(
            "the target's clock is advanced by {lease} s, past the lease"
        ));
        let r = rec
            .send(
                &format!("{name} retries with {a} after the lease expired"),
                req,
            )
            .await?;
        let again = r.status == 409;
        r2 = Some(r);
        if !again {
            break;
        }
    }
    r2
}
