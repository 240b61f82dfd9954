//! The concurrency gate: N identical requests with one key, released
//! together at a barrier; exactly one side effect, and every other answer an
//! in-flight 409 or an identical replay.

use idem_spec::ErrorCode;
use idem_spec::manifest::Manifest;

use crate::case::{Case, Rec, is_error, wire_desc};
use crate::http::{Request, Response, Sent};

/// Gate rounds per run: a race that loses once in a few tries still shows.
pub const ROUNDS: usize = 3;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            id: "concurrency.gate",
            title: "N identical concurrent requests (one key) execute exactly once",
            clauses: &[
                "idem.concurrency.single-effect",
                "idem.claim.atomic",
                "idem.inflight.conflict",
                "idem.inflight.retry-after",
                "idem.replay.verbatim",
            ],
            needs: &[],
            permitted: |m| {
                vec![format!(
                    "per round of {} requests: one 2xx execution; every other answer {} (with Retry-After) or an identical replay; the probe counts one effect",
                    m.limits.concurrency,
                    wire_desc(m, ErrorCode::IdempotencyKeyInUse)
                )]
            },
            run: |r| Box::pin(gate(r)),
        },
        Case {
            id: "concurrency.two-callers",
            title: "two callers racing with the same key each execute exactly once",
            clauses: &["idem.scope.caller", "idem.concurrency.single-effect"],
            needs: &[],
            permitted: |_| {
                vec!["one effect per caller; no caller sees the other's response".into()]
            },
            run: |r| Box::pin(two_callers(r)),
        },
    ]
}

/// What one gate round saw.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GateObs {
    /// 2xx answers without the replay marker (executions, by the target's own account).
    pub executed: usize,
    /// Replays identical to the execution.
    pub identical_replays: usize,
    /// Answers identical to the execution but without the replay marker.
    pub unmarked_replays: usize,
    /// 409 in-use answers.
    pub in_use: usize,
    /// 409 in-use answers without Retry-After.
    pub in_use_without_retry_after: usize,
    /// Answers that are none of the above, described.
    pub other: Vec<String>,
    /// Requests with no answer (timeouts, resets).
    pub no_answer: usize,
}

/// Classifies a round's answers.
pub fn classify(m: &Manifest, sent: &[Sent]) -> GateObs {
    let mut o = GateObs::default();
    let answers: Vec<&Response> = sent.iter().filter_map(|s| s.as_ref().ok()).collect();
    o.no_answer = sent.len() - answers.len();
    let first = answers
        .iter()
        .find(|r| (200..300).contains(&r.status) && !r.replayed())
        .copied();
    if first.is_some() {
        o.executed = 1;
    }
    for r in answers {
        if first.is_some_and(|f| std::ptr::eq(f, r)) {
            continue;
        }
        if is_error(m, r, ErrorCode::IdempotencyKeyInUse) {
            o.in_use += 1;
            if r.header("retry-after").is_none() {
                o.in_use_without_retry_after += 1;
            }
        } else if first.is_some_and(|f| f.same_outcome(r)) {
            // Same status and body as the execution: a replay. Without
            // the marker it breaks idem.replay.marker, not single-effect
            // (the probe decides how many executions there were).
            if r.replayed() {
                o.identical_replays += 1;
            } else {
                o.unmarked_replays += 1;
            }
        } else if (200..300).contains(&r.status) && !r.replayed() {
            o.executed += 1;
        } else {
            o.other.push(r.summary());
        }
    }
    o
}

/// Counts equal lines: `27× 201 Idempotent-Replayed: true; 1× 500`.
pub fn tally(items: &[String]) -> String {
    let mut t = std::collections::BTreeMap::<&str, usize>::new();
    for i in items {
        *t.entry(i.as_str()).or_default() += 1;
    }
    t.iter()
        .map(|(k, c)| format!("{c}× {k}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Runs one gate round of `n` copies of `req`; narrates and returns the answers.
pub async fn round(rec: &mut Rec, req: &Request, n: usize, what: &str) -> Vec<Sent> {
    let label_from = rec.next_label();
    let mut label_to = label_from.clone();
    for _ in 1..n {
        label_to = rec.next_label();
    }
    rec.reproduction.push(format!(
        "# {label_from} and the next {} requests: {n} copies sent at once\n{}",
        n - 1,
        rec.ctx.client.curl(req)
    ));
    // Pre-open the connections so the copies leave together.
    rec.ctx.client.warm(&rec.ctx.url("/"), n).await;
    let sent = rec.ctx.client.burst(vec![req.clone(); n]).await;
    let mut tally = std::collections::BTreeMap::<String, usize>::new();
    for s in &sent {
        let k = match s {
            Ok(r) => r.summary(),
            Err(f) => format!("no response ({f})"),
        };
        *tally.entry(k).or_default() += 1;
    }
    let parts: Vec<String> = tally.iter().map(|(k, c)| format!("{c}× {k}")).collect();
    rec.note(format!(
        "{label_from}..{label_to}: {what}, {n} copies released together at a barrier → {}",
        parts.join(", ")
    ));
    sent
}

async fn gate(rec: &mut Rec) {
    let n = rec.ctx.manifest.limits.concurrency as usize;
    for round_no in 1..=ROUNDS {
        let key = rec.ctx.key();
        let a = rec.alias(&key);
        let marker = rec.ctx.marker();
        let body = rec.ctx.body(0, &marker);
        let req = rec.ctx.op(0, Some(&key), &body);
        let sent = round(
            rec,
            &req,
            n,
            &format!("round {round_no}: alice, key {a}, one body"),
        )
        .await;
        let o = classify(&rec.ctx.manifest, &sent);
        let m = rec.ctx.manifest.clone();
        let in_use = wire_desc(&m, ErrorCode::IdempotencyKeyInUse);
        let responses: Vec<&Response> = sent.iter().filter_map(|s| s.as_ref().ok()).collect();
        rec.check(
            "idem.concurrency.single-effect",
            o.executed == 1 && o.other.is_empty(),
            format!("one execution; the rest {in_use} or identical replays"),
            format!(
                "{} execution(s), {} identical replay(s) ({} without the marker), {} in-use, other (replays of a different execution, errors): [{}], {} unanswered",
                o.executed,
                o.identical_replays + o.unmarked_replays,
                o.unmarked_replays,
                o.in_use,
                tally(&o.other),
                o.no_answer
            ),
        );
        if o.unmarked_replays > 0 {
            rec.check(
                "idem.replay.marker",
                false,
                "every replay carries Idempotent-Replayed: true",
                format!(
                    "{} identical answers without the marker",
                    o.unmarked_replays
                ),
            );
        }
        let Some(effects) = rec
            .check_effects(
                "idem.concurrency.single-effect",
                0,
                &marker,
                &responses,
                1,
                &format!("{n} identical requests, one key"),
            )
            .await
        else {
            return;
        };
        if effects > 1 {
            // Simultaneous copies that all executed: some arrived while the
            // first was in flight, and were executed instead of refused.
            rec.check(
                "idem.inflight.conflict",
                false,
                format!("a duplicate in flight gets {in_use} and is not executed"),
                format!("{effects} executions of one key from {n} simultaneous copies"),
            );
        }
        rec.check(
            "idem.claim.atomic",
            effects == 1,
            "one claim wins: one effect",
            format!("{effects} effect(s)"),
        );
        let bad_409: Vec<String> = responses
            .iter()
            .filter(|r| r.status == 409 && !is_error(&m, r, ErrorCode::IdempotencyKeyInUse))
            .map(|r| r.summary())
            .collect();
        if o.in_use + bad_409.len() > 0 {
            rec.check(
                "idem.inflight.conflict",
                bad_409.is_empty(),
                format!("a duplicate in flight gets {in_use}"),
                if bad_409.is_empty() {
                    format!("{} × {in_use}", o.in_use)
                } else {
                    bad_409.join("; ")
                },
            );
        }
        if o.in_use > 0 {
            rec.check(
                "idem.inflight.retry-after",
                o.in_use_without_retry_after == 0,
                "every 409 in use carries Retry-After",
                format!(
                    "{} of {} without Retry-After",
                    o.in_use_without_retry_after, o.in_use
                ),
            );
        }
        if o.no_answer > 0 {
            rec.stop(
                idem_spec::report::Verdict::Inconclusive,
                format!("{} of {n} requests got no answer", o.no_answer),
            );
            return;
        }
        if effects != 1 || o.executed != 1 || !o.other.is_empty() {
            // The evidence is in; later rounds would only spend budget.
            return;
        }
        // After the burst the key is complete: a resend replays the execution.
        let Some(first) = responses
            .iter()
            .find(|r| (200..300).contains(&r.status) && !r.replayed())
            .map(|r| (*r).clone())
        else {
            return;
        };
        let Some(after) = rec
            .send(&format!("alice resends with {a} after the burst"), &req)
            .await
        else {
            return;
        };
        super::check_replay(rec, &first, &after, "after the burst");
    }
}

async fn two_callers(rec: &mut Rec) {
    let n = (rec.ctx.manifest.limits.concurrency as usize / 2).max(2);
    let key = rec.ctx.key();
    let a = rec.alias(&key);
    let markers = [rec.ctx.marker(), rec.ctx.marker()];
    let reqs: Vec<Request> = (0..2)
        .map(|c| {
            let body = rec.ctx.body(c, &markers[c]);
            rec.ctx.op(c, Some(&key), &body)
        })
        .collect();
    let mut batch = Vec::with_capacity(2 * n);
    for _ in 0..n {
        batch.push(reqs[0].clone());
        batch.push(reqs[1].clone());
    }
    let first = rec.next_label();
    let mut last = first.clone();
    for _ in 1..batch.len() {
        last = rec.next_label();
    }
    let sent = rec.ctx.client.burst(batch).await;
    let alice: Vec<&Response> = sent
        .iter()
        .step_by(2)
        .filter_map(|s| s.as_ref().ok())
        .collect();
    let bob: Vec<&Response> = sent
        .iter()
        .skip(1)
        .step_by(2)
        .filter_map(|s| s.as_ref().ok())
        .collect();
    rec.note(format!(
        "{first}..{last}: alice and bob each send {n} copies of their own operation with {a}, all released together"
    ));
    if alice.len() + bob.len() < sent.len() {
        rec.stop(
            idem_spec::report::Verdict::Inconclusive,
            "some requests got no answer",
        );
    }
    let m = rec.ctx.manifest.clone();
    for (who, answers, c) in [("alice", &alice, 0usize), ("bob", &bob, 1usize)] {
        let other: &Vec<&Response> = if c == 0 { &bob } else { &alice };
        let foreign = answers
            .iter()
            .filter(|r| {
                is_error(&m, r, ErrorCode::IdempotencyKeyMismatch)
                    || ((200..300).contains(&r.status) && other.iter().any(|o| o.same_outcome(r)))
            })
            .count();
        rec.check(
            "idem.scope.caller",
            foreign == 0,
            format!("{who}: no mismatch and no response of the other caller"),
            format!("{foreign} answer(s) shaped by the other caller's use of the key"),
        );
        // When the other caller's use of the key shaped these answers, a
        // wrong effect count is that scoping failure, not a race.
        let clause = if foreign > 0 {
            "idem.scope.caller"
        } else {
            "idem.concurrency.single-effect"
        };
        rec.check_effects(
            clause,
            c,
            &markers[c],
            answers,
            1,
            &format!("{who}'s copies share one key"),
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Failure;

    fn r(status: u16, replayed: bool, body: &str, retry_after: bool) -> Sent {
        let mut headers = vec![];
        if replayed {
            headers.push(("idempotent-replayed".into(), "true".into()));
        }
        if retry_after {
            headers.push(("retry-after".into(), "1".into()));
        }
        Ok(Response {
            status,
            headers,
            body: body.as_bytes().to_vec(),
        })
    }

    fn manifest() -> Manifest {
        crate::manifest::parse(crate::manifest::TEMPLATE, "t")
            .expect("template")
            .manifest
    }

    // clause: idem.concurrency.single-effect
    #[test]
    fn classify_separates_executions_replays_and_conflicts() {
        let m = manifest();
        let in_use = r#"{"code":"idempotency_key_in_use"}"#;
        let sent = vec![
            r(201, false, "{\"id\":1}", false),
            r(201, true, "{\"id\":1}", false),
            r(409, false, in_use, true),
            r(409, false, in_use, false),
            r(201, true, "{\"id\":2}", false),
            r(201, false, "{\"id\":3}", false),
            Err(Failure::Timeout("t".into())),
        ];
        let o = classify(&m, &sent);
        assert_eq!(o.executed, 2, "the first and the distinct 201");
        assert_eq!(o.identical_replays, 1);
        assert_eq!(o.unmarked_replays, 0);
        assert_eq!(o.in_use, 2);
        assert_eq!(o.in_use_without_retry_after, 1);
        assert_eq!(o.other.len(), 1, "a replay of something else is neither");
        assert_eq!(o.no_answer, 1);
    }
}
