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
    ]
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
