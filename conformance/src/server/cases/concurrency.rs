//! The concurrency gate: N identical requests with one key, released
//! together at a barrier; exactly one side effect, and every other answer an
//! in-flight refusal or an identical replay.
//!
//! The effect count is the whole safety verdict (`idem.concurrency.single-
//! effect`): a target that executes once but refuses duplicates in its own
//! spelling is judged on the spelling under interop clauses, never here.
//! The gate does not blame `idem.claim.atomic` or `idem.inflight.conflict`
//! for a double effect: from outside, a non-atomic claim and a missing
//! in-flight state look the same, and the kit reports what it saw.

use idem_conformance_core::clause;
use idem_conformance_core::verdict::Consequence;
use idem_spec::ErrorCode;

use crate::server::case::{Aim, Case, Rec, shared};
use crate::server::dialect::Dialect;
use crate::server::http::{Failure, Request, Response, Sent};
use crate::server::manifest::ManifestExt;

/// Gate rounds per run: a race that loses once in a few tries still shows.
pub const ROUNDS: usize = 3;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            id: "concurrency.gate",
            title: "N identical concurrent requests (one key) execute exactly once",
            clauses: &[
                clause!("idem.concurrency.single-effect"),
                clause!("idem.inflight.conflict"),
                clause!("idem.inflight.retry-after"),
                clause!("idem.replay.verbatim"),
                clause!("idem.replay.marker"),
                clause!("idem.errors.profiles"),
            ],
            needs: &[],
            aim: Aim::Main,
            alone: shared,
            permitted: |m| {
                vec![format!(
                    "per round of {} requests: the probe counts one effect; every other answer an in-flight refusal ({} as declared, with Retry-After) or an identical replay",
                    m.limits.concurrency,
                    m.spelled(ErrorCode::IdempotencyKeyInUse)
                )]
            },
            run: |r| Box::pin(gate(r)),
        },
        Case {
            id: "concurrency.two-callers",
            title: "two callers racing with the same key each execute exactly once",
            clauses: &[
                clause!("idem.scope.caller"),
                clause!("idem.concurrency.single-effect"),
            ],
            needs: &[],
            aim: Aim::Main,
            alone: shared,
            permitted: |_| {
                vec!["one effect per caller; no caller sees the other's response".into()]
            },
            run: |r| Box::pin(two_callers(r)),
        },
    ]
}

/// What one gate round saw, by behaviour (spellings are counted apart).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GateObs {
    /// Executions by the target's own account: the first 2xx, plus every
    /// 2xx that is neither marked as a replay nor identical to it.
    pub executed: usize,
    /// Answers identical to the first execution (replays).
    pub identical_replays: usize,
    /// Of those, how many lacked the contract's replay marker.
    pub replays_without_marker: usize,
    /// 409 answers (an in-flight refusal in any spelling).
    pub conflicts: usize,
    /// Of those, how many are the declared in-use error.
    pub conflicts_as_declared: usize,
    /// Of those, how many lacked Retry-After.
    pub conflicts_without_retry_after: usize,
    /// Other 4xx answers (refused, in an unexpected way).
    pub other_refusals: Vec<String>,
    /// 429 and 503 answers: the target shed load. Refused without effect,
    /// not an in-flight answer, so neither counted against the gate nor
    /// judged for their spelling.
    pub throttled: usize,
    /// Answers that are none of the above (5xx, marked replays of a
    /// different body), described.
    pub other: Vec<String>,
    /// Requests with no answer (timeouts, resets).
    pub no_answer: usize,
}

impl GateObs {
    /// Refusals of every kind.
    pub fn refused(&self) -> usize {
        self.conflicts + self.other_refusals.len()
    }

    /// One line for reports.
    pub fn describe(&self) -> String {
        format!(
            "{} execution(s), {} identical replay(s), {} conflict(s) ({} as declared), {} throttled, {} other refusal(s) [{}], other [{}], {} unanswered",
            self.executed,
            self.identical_replays,
            self.conflicts,
            self.conflicts_as_declared,
            self.throttled,
            self.other_refusals.len(),
            tally(&self.other_refusals),
            tally(&self.other),
            self.no_answer
        )
    }
}

/// Classifies a round's answers under the target's declared dialect.
pub fn classify(dialect: &Dialect<'_>, sent: &[Sent]) -> GateObs {
    let mut o = GateObs::default();
    let answers: Vec<&Response> = sent.iter().filter_map(|s| s.as_ref().ok()).collect();
    o.no_answer = sent.len() - answers.len();
    let first = answers.iter().find(|r| dialect.executed(r, None)).copied();
    if first.is_some() {
        o.executed = 1;
    }
    for r in answers {
        if first.is_some_and(|f| std::ptr::eq(f, r)) {
            continue;
        }
        if first.is_some_and(|f| f.same_outcome(r)) {
            o.identical_replays += 1;
            if !r.replayed() {
                o.replays_without_marker += 1;
            }
        } else if matches!(r.status, 429 | 503) {
            o.throttled += 1;
        } else if r.status == 409 {
            o.conflicts += 1;
            if dialect.is(r, ErrorCode::IdempotencyKeyInUse) {
                o.conflicts_as_declared += 1;
            }
            if r.header("retry-after").is_none() {
                o.conflicts_without_retry_after += 1;
            }
        } else if (400..500).contains(&r.status) {
            if dialect.is(r, ErrorCode::IdempotencyKeyInUse) {
                // A dialect that refuses in-flight duplicates with another
                // status, as it declares.
                o.conflicts += 1;
                o.conflicts_as_declared += 1;
                if r.header("retry-after").is_none() {
                    o.conflicts_without_retry_after += 1;
                }
            } else {
                o.other_refusals.push(r.summary());
            }
        } else if dialect.executed(r, first) {
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
    rec.note(format!(
        "{label_from}..{label_to}: {what}, {n} copies released together at a barrier → {}",
        tally_sent(&sent)
    ));
    stop_if_unsent(rec, &sent);
    sent
}

/// A burst the harness did not send (the budget, no connection) stops the
/// case as a harness error: the rule is that nothing is judged from a
/// request that was not sent. Returns whether it stopped.
pub fn stop_if_unsent(rec: &mut Rec, sent: &[Sent]) -> bool {
    if let Some(Err(f)) = sent.iter().find(|s| {
        matches!(
            s,
            Err(Failure::Budget(_) | Failure::Connect(_) | Failure::Harness(_))
        )
    }) {
        rec.fail_send(f);
        return true;
    }
    false
}

fn tally_sent(sent: &[Sent]) -> String {
    let lines: Vec<String> = sent
        .iter()
        .map(|s| match s {
            Ok(r) => r.summary(),
            Err(f) => format!("no response ({f})"),
        })
        .collect();
    tally(&lines)
}

async fn gate(rec: &mut Rec) {
    let n = rec.ctx.manifest.limits.concurrency as usize;
    let name = rec.ctx.name(0).to_owned();
    for round_no in 1..=ROUNDS {
        let key = rec.ctx.key();
        let a = rec.alias(&key);
        let marker = rec.ctx.marker();
        let body = rec.ctx.body(0, &marker);
        let req = rec.ctx.op(0, Some(&key), &marker, &body);
        let sent = round(
            rec,
            &req,
            n,
            &format!("round {round_no}: {name}, key {a}, one body"),
        )
        .await;
        if rec.harness_stopped() {
            return;
        }
        let o = classify(&rec.ctx.dialect(), &sent);
        let responses: Vec<&Response> = sent.iter().filter_map(|s| s.as_ref().ok()).collect();
        let Some(effects) = rec
            .check_effects(
                clause!("idem.concurrency.single-effect"),
                0,
                &marker,
                &responses,
                1,
                &format!("{n} concurrent requests with one key"),
            )
            .await
        else {
            return;
        };
        check_burst_answers(rec, &o, effects);
        if o.throttled > 0 {
            rec.note(format!(
                "{} of {n} answers were 429 or 503: the target shed load, which neither counts against it nor shows its in-flight answer (a lower limits.concurrency avoids it)",
                o.throttled
            ));
        }
        if o.no_answer > 0 {
            rec.stop(
                idem_spec::report::Verdict::Inconclusive,
                format!("{} of {n} requests got no answer", o.no_answer),
            );
            return;
        }
        if effects != 1 || !o.other.is_empty() {
            // The evidence is in; later rounds would only spend budget.
            return;
        }
        // After the burst the key is complete: a resend replays the execution.
        let Some(first) = responses
            .iter()
            .find(|r| rec.ctx.dialect().executed(r, None))
            .map(|r| (*r).clone())
        else {
            return;
        };
        let Some(after) = rec
            .send(&format!("{name} resends with {a} after the burst"), &req)
            .await
        else {
            return;
        };
        super::check_replay(rec, &first, &after, "after the burst");
    }
}

/// What a burst's answers other than its execution show, given its effect
/// count: each a refusal or an identical replay; replays verbatim and
/// marked; in-flight refusals as declared, with Retry-After.
fn check_burst_answers(rec: &mut Rec, o: &GateObs, effects: u64) {
    // The other answers, by behaviour: refusals (any 4xx) and identical
    // replays keep the contract's promise to the caller; a 5xx does
    // not. After several executions, replays of another execution are
    // their consequence, already judged above: not a second finding.
    if effects <= 1 {
        rec.check_as(
            clause!("idem.concurrency.single-effect"),
            Consequence::Behaviour,
            o.other.is_empty(),
            "every answer but one is a refusal or an identical replay",
            o.describe(),
        );
    }
    if o.executed > 1 && effects == 1 {
        // Distinct 2xx bodies for one effect: replays that are not the
        // stored response.
        rec.check(
            clause!("idem.replay.verbatim"),
            false,
            "replays identical to the execution",
            format!("{} 2xx answers unlike the execution", o.executed - 1),
        );
    }
    if effects == 1 && o.conflicts > 0 {
        // Positive evidence only: duplicates arrived in flight, were
        // refused, and nothing ran twice.
        rec.check(
            clause!("idem.inflight.conflict"),
            true,
            "duplicates that arrive in flight are refused, not executed",
            format!("{} refused in flight; one effect", o.conflicts),
        );
    }
    if o.conflicts + o.other_refusals.len() > 0 {
        let declared = rec.ctx.dialect().spelled(ErrorCode::IdempotencyKeyInUse);
        rec.check(
            clause!("idem.errors.profiles"),
            o.conflicts_as_declared == o.refused(),
            format!("every in-flight refusal is {declared}"),
            format!(
                "{} of {} refusals as declared{}",
                o.conflicts_as_declared,
                o.refused(),
                if o.other_refusals.is_empty() {
                    String::new()
                } else {
                    format!("; others: {}", tally(&o.other_refusals))
                }
            ),
        );
    }
    if o.conflicts > 0 {
        super::check_retry_after(
            rec,
            "every in-flight refusal carries Retry-After",
            o.conflicts_without_retry_after == 0,
            format!(
                "{} of {} without Retry-After",
                o.conflicts_without_retry_after, o.conflicts
            ),
        );
    }
    if o.identical_replays > 0 {
        rec.check(
            clause!("idem.replay.marker"),
            o.replays_without_marker == 0,
            "every replay carries Idempotent-Replayed: true",
            format!(
                "{} of {} identical answers without it",
                o.replays_without_marker, o.identical_replays
            ),
        );
    }
}

async fn two_callers(rec: &mut Rec) {
    let n = (rec.ctx.manifest.limits.concurrency as usize / 2).max(2);
    let key = rec.ctx.key();
    let a = rec.alias(&key);
    let names = [rec.ctx.name(0).to_owned(), rec.ctx.name(1).to_owned()];
    let markers = [rec.ctx.marker(), rec.ctx.marker()];
    let reqs: Vec<Request> = (0..2)
        .map(|c| {
            let body = rec.ctx.body(c, &markers[c]);
            rec.ctx.op(c, Some(&key), &markers[c], &body)
        })
        .collect();
    let sent = send_interleaved(rec, &reqs, &names, n, &a).await;
    if stop_if_unsent(rec, &sent) {
        return;
    }
    let mine = |c: usize| -> Vec<&Response> {
        sent.iter()
            .skip(c)
            .step_by(2)
            .filter_map(|s| s.as_ref().ok())
            .collect()
    };
    let (alice, bob) = (mine(0), mine(1));
    if alice.len() + bob.len() < sent.len() {
        rec.stop(
            idem_spec::report::Verdict::Inconclusive,
            "some requests got no answer",
        );
    }
    for (c, answers) in [(0usize, &alice), (1usize, &bob)] {
        let side = Side {
            c,
            who: &names[c],
            them: &names[1 - c],
            answers,
            other: if c == 0 { &bob } else { &alice },
            own_marker: &markers[c],
            their_marker: &markers[1 - c],
        };
        judge_side(rec, n, &side).await;
    }
}

/// The two callers' copies, interleaved and released together, recorded
/// as one label range per caller.
async fn send_interleaved(
    rec: &mut Rec,
    reqs: &[Request],
    names: &[String; 2],
    n: usize,
    a: &str,
) -> Vec<Sent> {
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
    for (c, req) in reqs.iter().enumerate() {
        rec.reproduction.push(format!(
            "# {first}..{last}: {n} copies of this request by {}, interleaved with the other caller's, sent at once\n{}",
            names[c],
            rec.ctx.client.curl(req)
        ));
    }
    rec.ctx.client.warm(&rec.ctx.url("/"), 2 * n).await;
    let sent = rec.ctx.client.burst(batch).await;
    rec.note(format!(
        "{first}..{last}: {} and {} each send {n} copies of their own operation with {a}, all released together → {}",
        names[0],
        names[1],
        tally_sent(&sent)
    ));
    sent
}

/// One caller's side of a two-caller race: its answers, the other's, and
/// both operations' markers.
struct Side<'a> {
    c: usize,
    who: &'a str,
    them: &'a str,
    answers: &'a [&'a Response],
    other: &'a [&'a Response],
    own_marker: &'a str,
    their_marker: &'a str,
}

/// Whether one caller got the other's response, proved by the other
/// operation's marker; checked, and headlined when it did.
fn check_no_leak(rec: &mut Rec, s: &Side<'_>) -> bool {
    let Side {
        who,
        them,
        answers,
        other,
        ..
    } = *s;
    // A leak is proved by the other operation's marker in the answer
    // (the markers differ), not by equal bytes alone.
    let leaked: Vec<&Response> = answers
        .iter()
        .copied()
        .filter(|r| {
            (200..300).contains(&r.status)
                && other.iter().any(|o| o.same_payload(r))
                && String::from_utf8_lossy(&r.body).contains(s.their_marker)
        })
        .collect();
    rec.check(
        clause!("idem.scope.caller"),
        leaked.is_empty(),
        format!("{who}: never the other caller's response"),
        format!(
            "{} answer(s) that are the other caller's response",
            leaked.len()
        ),
    );
    if let Some(r) = leaked.first() {
        let ids = other
            .iter()
            .find(|o| o.same_payload(r))
            .map_or(String::new(), |o| rec.ctx.dialect().ids_side_by_side(r, o));
        rec.headline(format!(
            "{who} got {} response(s) of {them}, racing with the same key: they carry {them}'s marker {:?}{ids}",
            leaked.len(),
            s.their_marker
        ));
    }
    !leaked.is_empty()
}

/// Judges one caller's answers in a two-caller race: never the other
/// caller's response, not refused or blocked because of the other's use
/// of the key, and one effect of its own operation.
async fn judge_side(rec: &mut Rec, n: usize, s: &Side<'_>) {
    let Side {
        c,
        who,
        them,
        answers,
        ..
    } = *s;
    let leaked = check_no_leak(rec, s);
    // Refused because the other caller held or used the key: a
    // mismatch, or an in-use refusal while no copy of this caller's own
    // operation ran (the in-flight lock is not scoped by caller).
    let mismatches = answers
        .iter()
        .filter(|r| rec.ctx.dialect().is(r, ErrorCode::IdempotencyKeyMismatch))
        .count();
    let executed_own = answers.iter().any(|r| rec.ctx.dialect().executed(r, None));
    let in_use = answers
        .iter()
        .filter(|r| r.status == 409 || rec.ctx.dialect().is(r, ErrorCode::IdempotencyKeyInUse))
        .count();
    rec.check_as(
        clause!("idem.scope.caller"),
        Consequence::Behaviour,
        mismatches == 0,
        format!("{who}: no mismatch caused by the other caller's use of the key"),
        format!("{mismatches} mismatch answer(s)"),
    );
    let blocked = !executed_own && in_use > 0;
    rec.check_as(
        clause!("idem.scope.caller"),
        Consequence::Behaviour,
        !blocked,
        format!(
            "{who}: the other caller's request in flight does not block this one (its own operation runs)"
        ),
        if blocked {
            format!(
                "none of {who}'s {n} copies ran; {in_use} refused as in flight while {them}'s request ran"
            )
        } else {
            format!("{who}'s operation ran")
        },
    );
    // When the other caller's use of the key shaped these answers, a
    // wrong effect count is that scoping failure (safety if a response
    // leaked, semantics if the caller was only refused), not a race.
    let (clause, seen) = if leaked {
        (clause!("idem.scope.caller"), Consequence::CrossCaller)
    } else if mismatches > 0 || blocked {
        (clause!("idem.scope.caller"), Consequence::Behaviour)
    } else {
        (
            clause!("idem.concurrency.single-effect"),
            Consequence::SecondEffect,
        )
    };
    rec.check_effects_as(
        clause,
        seen,
        c,
        s.own_marker,
        answers,
        1,
        &format!(
            "{n} concurrent copies of {who}'s operation, sharing a key with the other caller's"
        ),
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::http::Failure;
    use idem_spec::manifest::Manifest;

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
        crate::server::manifest::parse(crate::server::manifest::TEMPLATE, "t")
            .expect("template")
            .manifest
    }

    #[test]
    fn classify_separates_executions_replays_and_conflicts() {
        let m = manifest();
        let c = Dialect(&m);
        let in_use = r#"{"code":"idempotency_key_in_use"}"#;
        let sent = vec![
            r(201, false, "{\"id\":1}", false),
            r(201, true, "{\"id\":1}", false),
            r(201, false, "{\"id\":1}", false),
            r(409, false, in_use, true),
            r(409, false, r#"{"error":"in progress"}"#, false),
            r(422, false, r#"{"error":"busy"}"#, false),
            r(201, true, "{\"id\":2}", false),
            r(201, false, "{\"id\":3}", false),
            r(429, false, r#"{"error":"slow down"}"#, true),
            r(503, false, "", true),
            Err(Failure::Timeout("t".into())),
        ];
        let o = classify(&c, &sent);
        assert_eq!(o.throttled, 2, "shed load is neither a conflict nor odd");
        assert_eq!(o.executed, 2, "the first and the distinct 201");
        assert_eq!(o.identical_replays, 2);
        assert_eq!(o.replays_without_marker, 1);
        assert_eq!(o.conflicts, 2, "a 409 in any spelling is a conflict");
        assert_eq!(o.conflicts_as_declared, 1);
        assert_eq!(o.conflicts_without_retry_after, 1);
        assert_eq!(o.other_refusals.len(), 1);
        assert_eq!(o.other.len(), 1, "a marked replay of something else");
        assert_eq!(o.no_answer, 1);
    }

    #[test]
    fn a_dialect_without_marker_or_code_classifies_by_behaviour() {
        let mut m = manifest();
        m.profile.replay_marker = Some("none".into());
        m.profile.errors.insert(
            "idempotency_key_in_use".into(),
            idem_spec::manifest::WireError {
                status: 409,
                code: None,
                pointer: None,
                value: None,
                pattern: Some("in progress".into()),
            },
        );
        let c = Dialect(&m);
        let sent = vec![
            r(201, false, "{\"id\":1}", false),
            r(201, false, "{\"id\":1}", false),
            r(409, false, r#"{"error":"a request is in progress"}"#, true),
        ];
        let o = classify(&c, &sent);
        assert_eq!(
            (o.executed, o.identical_replays, o.conflicts_as_declared),
            (1, 1, 1)
        );
        assert!(o.other.is_empty() && o.other_refusals.is_empty());
    }
}
