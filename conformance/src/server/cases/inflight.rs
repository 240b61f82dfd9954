//! The in-flight family: a duplicate of a running request is refused with
//! 409 in-use and Retry-After, or held and replayed under `Prefer: wait`.

use idem_conformance_core::clause;
use idem_conformance_core::verdict::Consequence;
use std::time::Duration;

use idem_spec::ErrorCode;
use idem_spec::headers::PREFER;
use idem_spec::report::Verdict;

use super::check_spelling;
use super::concurrency::{classify, round};
use crate::server::case::{Aim, Case, HOLD, Need, Rec, alone};
use crate::server::http::Response;
use crate::server::manifest::ManifestExt;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            id: "inflight.conflict",
            title: "a duplicate of a request held in flight gets 409 in use with Retry-After",
            clauses: &[
                clause!("idem.inflight.conflict"),
                clause!("idem.inflight.retry-after"),
                clause!("idem.state.three-states"),
                clause!("idem.errors.profiles"),
            ],
            needs: &[Need::PAUSE],
            aim: Aim::Main,
            alone,
            permitted: |m| {
                if m.never_refuses_in_flight() {
                    vec![format!(
                        "the duplicate: not executed (policy.in_flight = {}: held until the original finishes and replayed, or refused)",
                        m.policy.in_flight.describe()
                    )]
                } else {
                    vec![format!(
                        "the duplicate: refused ({} as declared) with Retry-After, not executed",
                        m.spelled(ErrorCode::IdempotencyKeyInUse)
                    )]
                }
            },
            run: |r| Box::pin(conflict(r)),
        },
        Case {
            id: "inflight.prefer-wait",
            title: "with Prefer: wait, concurrent duplicates are held and replayed",
            clauses: &[
                clause!("idem.inflight.prefer-wait"),
                clause!("idem.concurrency.single-effect"),
            ],
            needs: &[Need::PREFER_WAIT],
            aim: Aim::Main,
            alone,
            permitted: |m| {
                vec![format!(
                    "one execution and identical replays; {} only if the wait ran out",
                    m.spelled(ErrorCode::IdempotencyKeyInUse)
                )]
            },
            run: |r| Box::pin(prefer_wait(r)),
        },
    ]
}

/// How many times a held-request case starts over when its duplicate
/// overtook the held original (the duplicate arrived first, so it was the
/// original). Bounded; each attempt uses a fresh key.
pub(crate) const ATTEMPTS: usize = 5;

async fn conflict(rec: &mut Rec) {
    let Some((header, value)) = rec.ctx.failpoint(|f| f.pause.as_ref()) else {
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
        // A head start for the held request, doubled on every attempt. Not
        // what the verdict rests on: an overtaking duplicate is detected
        // below and the attempt is started over (or ends inconclusive).
        tokio::time::sleep(Duration::from_millis(10 << (attempt - 1))).await;
        // One duplicate. A target that executes it (no in-flight state) may
        // block it behind the held request, so it runs as its own task:
        // when it has not answered within HOLD / 2, the held request is
        // released first and the duplicate awaited afterwards.
        let dlabel = rec.next_label();
        rec.reproduction
            .push(format!("# {dlabel}\n{}", rec.ctx.client.curl(&req)));
        let client = rec.ctx.client.clone();
        let dreq = req.clone();
        let mut dup_task = tokio::spawn(async move { client.send(&dreq).await });
        let early = tokio::time::timeout(HOLD / 2, &mut dup_task).await;
        let what = format!("{name} sends a duplicate with {a} while {label} is held");
        let (dup, first) = match early {
            Ok(Ok(sent)) => {
                let dup = rec.record(&dlabel, &what, sent);
                let first = rec.ctx.finish_held(original).await;
                (dup, first)
            }
            _ => {
                rec.note(format!(
                    "{dlabel} had no answer after {} ms while {label} was held; {label} is released first",
                    (HOLD / 2).as_millis()
                ));
                let first = rec.ctx.finish_held(original).await;
                let dup = match tokio::time::timeout(HOLD * 4, dup_task).await {
                    Ok(Ok(sent)) => rec.record(&dlabel, &what, sent),
                    _ => None,
                };
                (dup, first)
            }
        };
        let first = match first {
            Some(sent) => rec.record(
                &label,
                &format!("{name}'s original with {a} and {header}: {value}"),
                sent,
            ),
            None => {
                rec.stop(
                    Verdict::Inconclusive,
                    format!("{label} did not finish in time"),
                );
                None
            }
        };
        let Some(d) = dup else { return };
        // The duplicate overtook the original: it executed first and the
        // "original" was the duplicate, refused. Not a verdict; start over.
        let overtaken = rec.ctx.dialect().executed(&d, None)
            && first.as_ref().is_some_and(|f| {
                f.status == 409 || f.replayed() || rec.ctx.manifest.marked(f) == Some(true)
            });
        if overtaken && attempt == ATTEMPTS {
            rec.stop(
                Verdict::Inconclusive,
                format!("the duplicate overtook the held request in all {ATTEMPTS} attempts"),
            );
            return;
        }
        if overtaken {
            rec.note(format!(
                "the duplicate reached the target before {label}, so it was the original; \
                 starting over with a fresh key (attempt {} of {ATTEMPTS})",
                attempt + 1
            ));
            continue;
        }
        judge_duplicate(rec, &d, first.as_ref(), &marker).await;
        return;
    }
}

/// Judges the duplicate sent while the original was held in flight: not
/// executed (safety), refused as in flight with the declared spelling and
/// Retry-After, and one effect in all.
async fn judge_duplicate(rec: &mut Rec, d: &Response, first: Option<&Response>, marker: &str) {
    if d.status != 409
        && !(200..300).contains(&d.status)
        && !rec.ctx.manifest.never_refuses_in_flight()
    {
        rec.stop(
            Verdict::Inconclusive,
            format!(
                "never observed the key in flight (duplicate got {})",
                d.summary()
            ),
        );
    }
    // Executed while the original is held: a second effect (safety).
    // Refused at all: in-flight detection (semantics). Its spelling and
    // Retry-After: interop.
    let refused = (400..500).contains(&d.status);
    rec.check(
        clause!("idem.inflight.conflict"),
        !rec.ctx.dialect().executed(d, first),
        "the duplicate is not executed while the original is in flight",
        d.summary(),
    );
    rec.headline(format!(
        "a duplicate sent while the original was held in flight was executed: {}",
        d.summary()
    ));
    if rec.ctx.manifest.never_refuses_in_flight() {
        judge_held_duplicate(rec, d, first, marker).await;
        return;
    }
    rec.check_as(
        clause!("idem.inflight.conflict"),
        Consequence::Behaviour,
        refused,
        format!(
            "refused as in flight ({} as declared)",
            rec.ctx.dialect().spelled(ErrorCode::IdempotencyKeyInUse)
        ),
        d.summary(),
    );
    if refused {
        check_spelling(rec, d, ErrorCode::IdempotencyKeyInUse, "the duplicate");
        super::check_retry_after(
            rec,
            "Retry-After present",
            d.header("retry-after").is_some(),
            d.summary(),
        );
    }
    rec.check(
        clause!("idem.state.three-states"),
        refused && !d.replayed(),
        "in flight is neither absent (execute) nor complete (replay)",
        d.summary(),
    );
    let seen: Vec<&Response> = first.into_iter().chain(std::iter::once(d)).collect();
    rec.check_effects(
        clause!("idem.inflight.conflict"),
        0,
        marker,
        &seen,
        1,
        "a duplicate sent while the original was held in flight",
    )
    .await;
}

/// [`judge_duplicate`] for a target declared never to refuse in flight.
async fn judge_held_duplicate(rec: &mut Rec, d: &Response, first: Option<&Response>, marker: &str) {
    let refused = (400..500).contains(&d.status);
    // Declared: duplicates are held (or refused in the target's own
    // way). Only "not executed" is the contract's here, plus, for a
    // held duplicate, that it got the original's answer.
    if !refused && let Some(f) = first {
        rec.check_as(
            clause!("idem.inflight.conflict"),
            Consequence::Behaviour,
            d.same_outcome(f),
            "a held duplicate is answered with the original's response",
            d.summary(),
        );
    }
    let seen: Vec<&Response> = first.into_iter().chain(std::iter::once(d)).collect();
    rec.check_effects(
        clause!("idem.inflight.conflict"),
        0,
        marker,
        &seen,
        1,
        "a duplicate sent while the original was held in flight",
    )
    .await;
}

async fn prefer_wait(rec: &mut Rec) {
    let n = (rec.ctx.manifest.limits.concurrency as usize).min(8);
    let key = rec.ctx.key();
    let a = rec.alias(&key);
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(0, &marker);
    let req = rec
        .ctx
        .op(0, Some(&key), &marker, &body)
        .header(PREFER, "wait=5");
    let name = rec.ctx.name(0).to_owned();
    let sent = round(rec, &req, n, &format!("{name}, key {a}, Prefer: wait=5")).await;
    if rec.harness_stopped() {
        return;
    }
    let o = classify(&rec.ctx.dialect(), &sent);
    rec.check(
        clause!("idem.inflight.prefer-wait"),
        o.executed == 1 && o.refused() == 0 && o.other.is_empty(),
        "duplicates held until the original finished, then replayed",
        o.describe(),
    );
    let responses: Vec<&Response> = sent.iter().filter_map(|s| s.as_ref().ok()).collect();
    rec.check_effects(
        clause!("idem.concurrency.single-effect"),
        0,
        &marker,
        &responses,
        1,
        &format!("{n} identical requests with one key, Prefer: wait"),
    )
    .await;
    if o.no_answer > 0 {
        rec.stop(
            Verdict::Inconclusive,
            format!("{} requests got no answer", o.no_answer),
        );
    }
}
