//! The replay family: a duplicate of a completed request gets the stored
//! response byte for byte, with the marker, and causes nothing.

use idem_conformance_core::clause;
use idem_conformance_core::verdict::Consequence;

use super::{check_marked, check_replay, fresh};
use crate::server::case::{Aim, Case, Rec, shared};
use crate::server::manifest::ManifestExt;

/// The cases of this family.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            id: "replay.verbatim",
            title: "a duplicate of a completed request is replayed byte for byte, with the marker, without re-executing",
            clauses: &[
                clause!("idem.replay.verbatim"),
                clause!("idem.replay.marker"),
                clause!("idem.replay.no-reexecution"),
                clause!("idem.state.three-states"),
                clause!("idem.failure.final-outcomes"),
            ],
            needs: &[],
            aim: Aim::Main,
            alone: shared,
            permitted: |m| {
                vec![format!(
                    "R1: a 2xx without a replay marker; R2, R3: the same status, body and headers with {}; one side effect",
                    m.marker_spelled()
                )]
            },
            run: |r| Box::pin(verbatim(r)),
        },
        Case {
            id: "replay.canonical-json",
            title: "key order and whitespace do not make a retry a different request",
            clauses: &[
                clause!("idem.fingerprint.canonical-json"),
                clause!("idem.replay.no-reexecution"),
            ],
            needs: &[],
            aim: Aim::Main,
            alone: shared,
            permitted: |_| {
                vec!["the reformatted body gets a replay (SHOULD); never a second execution".into()]
            },
            run: |r| Box::pin(canonical(r)),
        },
        Case {
            id: "replay.incidental-header",
            title: "a true retry whose only change is an incidental header (traceparent) is replayed",
            clauses: &[
                clause!("idem.fingerprint.inputs"),
                clause!("idem.replay.no-reexecution"),
            ],
            needs: &[],
            aim: Aim::Main,
            alone: shared,
            permitted: |m| {
                if m.policy.fingerprint.covers_header(INCIDENTAL) {
                    vec![format!(
                        "R2 (a new {INCIDENTAL}): a replay, or the declared difference (policy.fingerprint.headers covers it): refused as a mismatch, never a second execution"
                    )]
                } else {
                    vec![format!(
                        "R2 (a new {INCIDENTAL}, nothing else changed): the stored response; one side effect"
                    )]
                }
            },
            run: |r| Box::pin(incidental_header(r)),
        },
    ]
}

/// The header a true retry changes: every attempt of a traced client gets
/// a new W3C trace context span, so it differs between retries of one
/// operation.
pub const INCIDENTAL: &str = "traceparent";

fn traceparent(n: u64) -> String {
    format!("00-{:032x}-{:016x}-01", u128::from(n) + 1, n + 1)
}

async fn incidental_header(rec: &mut Rec) {
    let key = rec.ctx.key();
    let a = rec.alias(&key);
    let name = rec.ctx.name(0).to_owned();
    let marker = rec.ctx.marker();
    let body = rec.ctx.body(0, &marker);
    let base = rec.ctx.op(0, Some(&key), &marker, &body);
    let r1_req = base
        .clone()
        .header(INCIDENTAL, &traceparent(rec.ctx.unique()));
    let Some(first) = rec
        .send(
            &format!("{name} sends a fresh request with {a} and a {INCIDENTAL}"),
            &r1_req,
        )
        .await
    else {
        return;
    };
    if !(200..300).contains(&first.status) {
        rec.stop(
            idem_spec::report::Verdict::Inconclusive,
            format!("the fresh request was answered {}", first.summary()),
        );
        return;
    }
    let r2_req = base.header(INCIDENTAL, &traceparent(rec.ctx.unique()));
    let Some(r2) = rec
        .send(
            &format!("{name} retries it with {a}, only its {INCIDENTAL} new"),
            &r2_req,
        )
        .await
    else {
        return;
    };
    let declared = rec
        .ctx
        .manifest
        .policy
        .fingerprint
        .covers_header(INCIDENTAL);
    let replayed =
        r2.same_outcome(&first) || rec.ctx.manifest.marked(&r2) == Some(true) || r2.replayed();
    let refused = (400..500).contains(&r2.status);
    if declared && refused {
        rec.note(format!(
            "policy.fingerprint.headers declares {INCIDENTAL} part of the fingerprint: the refusal is the declared difference"
        ));
    }
    // Refused, the caller is told the truth (nothing ran twice): semantics,
    // or the declared difference (interop) when the manifest says so.
    rec.check_as(
        clause!("idem.fingerprint.inputs"),
        if declared {
            Consequence::Spelling
        } else {
            Consequence::Behaviour
        },
        replayed,
        format!("a retry differing only in {INCIDENTAL} is the same request: replayed"),
        r2.summary(),
    );
    rec.check_effects(
        clause!("idem.replay.no-reexecution"),
        0,
        &marker,
        &[&first, &r2],
        1,
        &format!("R2 is a retry of R1 with a new {INCIDENTAL}"),
    )
    .await;
}

async fn verbatim(rec: &mut Rec) {
    let key = rec.ctx.key();
    let Some((req, first, marker)) = fresh(rec, 0, &key).await else {
        return;
    };
    let a = rec.alias(&key);
    let name = rec.ctx.name(0).to_owned();
    let Some(r2) = rec
        .send(&format!("{name} resends R1 unchanged with {a}"), &req)
        .await
    else {
        return;
    };
    check_replay(rec, &first, &r2, "R2");
    rec.check(
        clause!("idem.state.three-states"),
        r2.same_outcome(&first),
        "complete key: the stored response",
        r2.summary(),
    );
    // A final outcome not replayed is a semantics finding; executed again
    // (the probes below) it is a safety one.
    rec.check_as(
        clause!("idem.failure.final-outcomes"),
        Consequence::Behaviour,
        r2.same_outcome(&first),
        format!("the 2xx outcome ({}) is stored and replayed", first.status),
        r2.summary(),
    );
    let Some(r3) = rec
        .send(&format!("{name} resends R1 again with {a}"), &req)
        .await
    else {
        return;
    };
    check_replay(rec, &first, &r3, "R3");
    rec.check_effects(
        clause!("idem.replay.no-reexecution"),
        0,
        &marker,
        &[&first, &r2, &r3],
        1,
        "R2 and R3 are replays",
    )
    .await;
    rec.check_executions(
        clause!("idem.replay.no-reexecution"),
        &marker,
        1,
        "R2 and R3 are replays",
    )
    .await;
}

/// Re-serialises a JSON value with keys in reverse order and spaces added:
/// the same value, different bytes.
fn reformatted(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let items: Vec<String> = m
                .iter()
                .rev()
                .map(|(k, v)| format!("{} :  {}", Value::String(k.clone()), reformatted(v)))
                .collect();
            format!("{{ \n {} }}", items.join(" ,\n "))
        }
        Value::Array(a) => format!(
            "[ {} ]",
            a.iter().map(reformatted).collect::<Vec<_>>().join(" , ")
        ),
        other => other.to_string(),
    }
}

async fn canonical(rec: &mut Rec) {
    let key = rec.ctx.key();
    let Some((req, first, marker)) = fresh(rec, 0, &key).await else {
        return;
    };
    let value: serde_json::Value = req
        .body
        .as_deref()
        .and_then(|b| serde_json::from_slice(b).ok())
        .unwrap_or_default();
    let mut req2 = req.clone();
    req2.body = Some(reformatted(&value).into_bytes());
    let a = rec.alias(&key);
    let name = rec.ctx.name(0).to_owned();
    let Some(r2) = rec
        .send(
            &format!("{name} resends R1's body with keys reordered and whitespace added, {a}"),
            &req2,
        )
        .await
    else {
        return;
    };
    rec.check(
        clause!("idem.fingerprint.canonical-json"),
        r2.same_outcome(&first),
        "a replay of R1 (the same JSON value)",
        r2.summary(),
    );
    if r2.same_outcome(&first) {
        check_marked(rec, &r2, "the replay");
    }
    rec.check_effects(
        clause!("idem.replay.no-reexecution"),
        0,
        &marker,
        &[&first, &r2],
        1,
        "the same operation, reformatted",
    )
    .await;
}

#[cfg(test)]
mod tests {
    #[test]
    fn reformatting_keeps_the_value_and_changes_the_bytes() {
        let v = serde_json::json!({"a": 1, "b": [1, {"c": "x"}], "d": null});
        let s = super::reformatted(&v);
        assert_ne!(s, v.to_string());
        let back: serde_json::Value = serde_json::from_str(&s).expect("valid JSON");
        assert_eq!(back, v);
    }
}
