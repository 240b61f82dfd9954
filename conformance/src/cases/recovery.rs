//! The recovery family: crashes and takeovers. These need the target's
//! cooperation (failpoint and restart hooks); without them each case is
//! reported unsupported, never passed.

use std::time::Duration;

use idem_spec::report::Verdict;

use crate::case::{Case, HOLD, Need, Rec};
use crate::http::Response;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            id: "recovery.crash-restart",
            title: "a crash after commit, then a restart: the retry gets the committed outcome, one effect",
            clauses: &[
                "idem.claim.transactional",
                "idem.multistep.phases",
                "idem.multistep.resume",
                "idem.multistep.foreign-key",
            ],
            needs: &[Need::CrashRestart],
            permitted: |_| {
                vec!["R1: no answer (crashed); after restart R2 with the same key: 2xx (replayed or resumed); exactly one effect".into()]
            },
            run: |r| Box::pin(crash_restart(r)),
        },
        Case {
            id: "recovery.lease-takeover",
            title: "a request paused past its lease is taken over, and the paused writer cannot commit",
            clauses: &["idem.lease.takeover", "idem.lease.fencing"],
            needs: &[Need::Pause, Need::Clock],
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
    let Some(cmd) = rec
        .ctx
        .manifest
        .hooks
        .restart
        .as_ref()
        .map(|h| h.command.clone())
    else {
        return;
    };
    let key = rec.ctx.key();
    let a = rec.alias(&key);
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(0, &marker);
    let req = rec.ctx.op(0, Some(&key), &body);
    let crash = req.clone().header(&header, &value);
    let label = rec.next_label();
    rec.reproduction
        .push(format!("# {label}\n{}", rec.ctx.client.curl(&crash)));
    let r1 = rec.ctx.client.send(&crash).await;
    rec.note(format!(
        "{label}: alice sends with {a} and {header}: {value} → {}",
        match &r1 {
            Ok(r) => r.summary(),
            Err(f) => format!("no response ({f})"),
        }
    ));
    rec.note(format!("the restart hook runs: {cmd}"));
    let status = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&cmd)
        .status()
        .await;
    if !status.as_ref().is_ok_and(|s| s.success()) {
        rec.stop(Verdict::Error, format!("restart hook failed: {status:?}"));
        return;
    }
    if !wait_ready(rec).await {
        rec.stop(
            Verdict::Error,
            "the target did not answer after the restart",
        );
        return;
    }
    let Some(r2) = rec.send(&format!("alice retries with {a}"), &req).await else {
        return;
    };
    rec.check(
        "idem.multistep.resume",
        (200..300).contains(&r2.status),
        "the committed outcome (2xx)",
        r2.summary(),
    );
    rec.check_effects(
        "idem.claim.transactional",
        0,
        &marker,
        &[&r2],
        1,
        "a crash cannot split or repeat the operation",
    )
    .await;
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
    let Some((header, value)) = rec.ctx.failpoint(|f| f.pause.as_ref()) else {
        return;
    };
    let key = rec.ctx.key();
    let a = rec.alias(&key);
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(0, &marker);
    let req = rec.ctx.op(0, Some(&key), &body);
    let held = req.clone().header(&header, &value);
    let label = rec.next_label();
    let client = rec.ctx.client.clone();
    let original = tokio::spawn(async move { client.send(&held).await });
    // Wait until the original is visibly in flight (bounded).
    let mut in_flight = false;
    for _ in 0..40 {
        let Some(r) = rec
            .send(&format!("alice probes {a} while {label} is held"), &req)
            .await
        else {
            return;
        };
        if r.status == 409 {
            in_flight = true;
            break;
        }
        if (200..300).contains(&r.status) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !in_flight {
        rec.stop(
            Verdict::Inconclusive,
            "never observed the held request in flight",
        );
        return;
    }
    let lease = idem_spec::policy::DEFAULT_LEASE_SECS * 2;
    if let Err(e) = rec.ctx.advance_clock(lease).await {
        rec.stop(Verdict::Error, e);
        return;
    }
    rec.note(format!(
        "the target's clock is advanced by {lease} s, past the lease"
    ));
    let Some(r2) = rec
        .send(
            &format!("alice retries with {a} after the lease expired"),
            &req,
        )
        .await
    else {
        return;
    };
    rec.check(
        "idem.lease.takeover",
        (200..300).contains(&r2.status),
        "the retry takes the key over and completes",
        r2.summary(),
    );
    let first = match tokio::time::timeout(HOLD * 4, original).await {
        Ok(Ok(sent)) => rec.record(&label, &format!("the held original with {a}"), sent),
        _ => None,
    };
    let seen: Vec<&Response> = first.iter().chain(std::iter::once(&r2)).collect();
    rec.check_effects(
        "idem.lease.fencing",
        0,
        &marker,
        &seen,
        1,
        "the paused writer's commit is rejected",
    )
    .await;
}
