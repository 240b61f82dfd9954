//! The contract as a model, and the generated phase that checks a target
//! against it.
//!
//! proptest generates operation sequences (send, resend, resend with a
//! changed body, the same key from another caller, concurrent bursts,
//! clock advances); each is executed against the target with fresh,
//! run-unique keys and every answer is compared with what the model
//! permits. A violation is shrunk by proptest to the shortest sequence that
//! still fails, narrated, and saved as data (the concrete operations, not
//! only a seed) so `replay FILE --target M` re-runs it against any base URL.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_spec::ErrorCode;
use idem_spec::report::Verdict;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestError, TestRng, TestRunner};
use serde::{Deserialize, Serialize};

use crate::case::{Case, Ctx, Rec, is_error, wire_desc};
use crate::http::Response;
use crate::manifest::expand;

/// Keys per sequence (small, so collisions between operations are common).
pub const KEYS: u8 = 2;

/// One generated operation. `variant` picks one of two bodies per
/// (caller, key), so "resend with a changed body" is `variant` flipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "op")]
pub enum Op {
    /// Send (or resend) the operation once.
    Send {
        /// Caller index (0 or 1).
        caller: u8,
        /// Key index within the sequence.
        key: u8,
        /// Body variant (0 or 1).
        variant: u8,
    },
    /// Send `n` identical copies released together.
    Burst {
        /// Caller index.
        caller: u8,
        /// Key index.
        key: u8,
        /// Body variant.
        variant: u8,
        /// Copies.
        n: u8,
    },
    /// Advance the target's clock (only generated with a clock hook).
    Advance {
        /// Seconds.
        secs: u64,
    },
}

/// What the model says about one (caller, key).
#[derive(Debug, Clone)]
struct Stored {
    variant: u8,
    response: Option<Response>,
    at: u64,
}

/// The model's state: completed keys and the model clock.
#[derive(Debug, Default)]
pub struct Model {
    keys: BTreeMap<(u8, u8), Stored>,
    now: u64,
    window: u64,
    /// Executions expected per marker.
    pub effects: BTreeMap<String, u64>,
}

/// A violation found while executing a sequence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// The clause broken.
    pub clause: String,
    /// What the model permitted.
    pub permitted: String,
    /// What the target did.
    pub observed: String,
    /// The sequence, narrated.
    pub narrative: Vec<String>,
    /// `curl` commands for the sequence's requests, secrets redacted.
    #[serde(default)]
    pub reproduction: Vec<String>,
}

/// A saved counterexample: replayable against any target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Counterexample {
    /// Kit version that found it.
    pub kit_version: String,
    /// Seed of the run that found it.
    pub seed: u64,
    /// The shrunk operations.
    pub ops: Vec<Op>,
    /// The violation as first seen.
    pub violation: Violation,
}

/// Strategy for one sequence.
pub fn sequence(with_clock: bool, window: u64) -> impl Strategy<Value = Vec<Op>> {
    let send = (
        0u8..2,
        0u8..KEYS,
        prop_oneof![3 => Just(0u8), 1 => Just(1u8)],
    )
        .prop_map(|(caller, key, variant)| Op::Send {
            caller,
            key,
            variant,
        });
    let burst =
        (0u8..2, 0u8..KEYS, 0u8..2, 2u8..=4).prop_map(|(caller, key, variant, n)| Op::Burst {
            caller,
            key,
            variant,
            n,
        });
    let small = (window / 100).max(1);
    let advance = prop_oneof![Just(small), Just(window + 60)].prop_map(|secs| Op::Advance { secs });
    let op = if with_clock {
        prop_oneof![6 => send, 2 => burst, 1 => advance].boxed()
    } else {
        prop_oneof![6 => send, 2 => burst].boxed()
    };
    proptest::collection::vec(op, 1..8)
}

/// Executes one sequence with fresh keys tagged `tag`; checks every answer
/// against the model and, at the end, every marker's effect count.
pub async fn execute(ctx: &Ctx, ops: &[Op], tag: &str) -> Result<usize, Violation> {
    let mut repro = Vec::new();
    execute_recording(ctx, ops, tag, &mut repro)
        .await
        .map_err(|mut v| {
            v.reproduction = repro;
            v
        })
}

async fn execute_recording(
    ctx: &Ctx,
    ops: &[Op],
    tag: &str,
    repro: &mut Vec<String>,
) -> Result<usize, Violation> {
    let mut model = Model {
        window: ctx.manifest.policy.replay_window_secs,
        ..Model::default()
    };
    let mut narrative = Vec::new();
    let mut seen: BTreeMap<String, Vec<Response>> = BTreeMap::new();
    let names = [ctx.caller(0).name.clone(), ctx.caller(1).name.clone()];
    let violation =
        |clause: &str, permitted: String, observed: String, narrative: &Vec<String>| Violation {
            clause: clause.to_owned(),
            permitted,
            observed,
            narrative: narrative.clone(),
            reproduction: Vec::new(),
        };
    for (i, op) in ops.iter().enumerate() {
        let step = format!("S{}", i + 1);
        match *op {
            Op::Advance { secs } => {
                ctx.advance_clock(secs).await.map_err(|e| {
                    violation(
                        "idem.window.replay",
                        "the clock hook works".into(),
                        e,
                        &narrative,
                    )
                })?;
                model.now += secs;
                let (now, window) = (model.now, model.window);
                model.keys.retain(|_, s| now - s.at <= window);
                narrative.push(format!("{step}: the clock advances {secs} s"));
                repro.push(format!(
                    "# {step}: advance the clock {secs} s through hooks.clock"
                ));
            }
            Op::Send {
                caller,
                key,
                variant,
            }
            | Op::Burst {
                caller,
                key,
                variant,
                ..
            } => {
                let n = if let Op::Burst { n, .. } = *op {
                    n as usize
                } else {
                    1
                };
                let marker = format!("{}-{tag}-c{caller}k{key}v{variant}", ctx.run_id);
                let keyname = format!("{}-{tag}-k{key}", ctx.run_id);
                let body = expand(
                    &ctx.endpoint().body,
                    ctx.caller(caller as usize),
                    &marker,
                    1 + u64::from(key) * 3 + u64::from(variant) * 11,
                );
                let req = ctx.op(caller as usize, Some(&keyname), &body);
                repro.push(format!(
                    "# {step}{}\n{}",
                    if n > 1 {
                        format!(" ({n} copies at once)")
                    } else {
                        String::new()
                    },
                    ctx.client.curl(&req)
                ));
                let sent = if n == 1 {
                    vec![ctx.client.send(&req).await]
                } else {
                    ctx.client.burst(vec![req; n]).await
                };
                let answers: Vec<Response> = match sent.into_iter().collect::<Result<Vec<_>, _>>() {
                    Ok(a) => a,
                    Err(f) => {
                        return Err(violation(
                            "idem.state.three-states",
                            "an answer".into(),
                            format!("no answer: {f}"),
                            &narrative,
                        ));
                    }
                };
                let what = format!(
                    "{step}: {} sends {}key k{key} with body {variant}",
                    names[caller as usize],
                    if n > 1 {
                        format!("{n} concurrent copies, ")
                    } else {
                        String::new()
                    }
                );
                let shown: Vec<String> = answers.iter().map(Response::summary).collect();
                narrative.push(format!("{what} → {}", shown.join(" | ")));
                seen.entry(marker.clone())
                    .or_default()
                    .extend(answers.iter().cloned());
                let state = model.keys.get(&(caller, key)).cloned();
                match state {
                    None => {
                        let exec: Vec<&Response> = answers
                            .iter()
                            .filter(|r| (200..300).contains(&r.status) && !r.replayed())
                            .collect();
                        let Some(first) = exec.first().copied() else {
                            // Another caller's use of the same key index is
                            // the only thing that could shape this answer.
                            let other = model.keys.contains_key(&(1 - caller.min(1), key));
                            let clause = if other {
                                "idem.scope.caller"
                            } else {
                                "idem.state.three-states"
                            };
                            return Err(violation(
                                clause,
                                "an absent key executes: one 2xx without the replay marker".into(),
                                shown.join(" | "),
                                &narrative,
                            ));
                        };
                        for r in &answers {
                            if std::ptr::eq(r, first)
                                || is_error(&ctx.manifest, r, ErrorCode::IdempotencyKeyInUse)
                            {
                                continue;
                            }
                            if r.same_outcome(first) {
                                if !r.replayed() {
                                    return Err(violation(
                                        "idem.replay.marker",
                                        "a replay carries Idempotent-Replayed: true".into(),
                                        r.summary(),
                                        &narrative,
                                    ));
                                }
                                continue;
                            }
                            return Err(violation(
                                "idem.concurrency.single-effect",
                                format!(
                                    "one execution; others {} or identical replays",
                                    wire_desc(&ctx.manifest, ErrorCode::IdempotencyKeyInUse)
                                ),
                                r.summary(),
                                &narrative,
                            ));
                        }
                        *model.effects.entry(marker.clone()).or_default() += 1;
                        model.keys.insert(
                            (caller, key),
                            Stored {
                                variant,
                                response: Some(first.clone()),
                                at: model.now,
                            },
                        );
                    }
                    Some(s) if s.variant == variant => {
                        let fresh = answers.iter().any(|r| {
                            (200..300).contains(&r.status)
                                && !r.replayed()
                                && !s.response.as_ref().is_some_and(|f| f.same_outcome(r))
                        });
                        if fresh && s.at < model.now {
                            // Executed again after the clock moved, inside
                            // the window: the window broke, not the replay.
                            return Err(violation(
                                "idem.window.replay",
                                format!(
                                    "a replay: the key is {} s old, inside the {} s window",
                                    model.now - s.at,
                                    model.window
                                ),
                                shown.join(" | "),
                                &narrative,
                            ));
                        }
                        for r in &answers {
                            let ok = r.replayed()
                                && s.response.as_ref().is_some_and(|f| f.same_outcome(r));
                            if !ok {
                                return Err(violation("idem.replay.verbatim", "a verbatim replay of the stored response, with Idempotent-Replayed: true".into(), r.summary(), &narrative));
                            }
                        }
                    }
                    Some(_) => {
                        for r in &answers {
                            if !is_error(&ctx.manifest, r, ErrorCode::IdempotencyKeyMismatch) {
                                return Err(violation(
                                    "idem.fingerprint.mismatch",
                                    wire_desc(&ctx.manifest, ErrorCode::IdempotencyKeyMismatch),
                                    r.summary(),
                                    &narrative,
                                ));
                            }
                        }
                    }
                }
            }
        }
    }
    for (marker, responses) in &seen {
        let caller = if marker.contains("-c1k") { 1 } else { 0 };
        let want = model.effects.get(marker).copied().unwrap_or(0);
        let refs: Vec<&Response> = responses.iter().collect();
        match ctx.effects(caller, marker, &refs).await {
            Ok(n) if n == want => {}
            Ok(n) => {
                narrative.push(format!("the probe counts {n} effect(s) for {marker:?}"));
                return Err(violation(
                    "idem.replay.no-reexecution",
                    format!("{want} effect(s) for {marker:?}"),
                    format!("{n} effect(s)"),
                    &narrative,
                ));
            }
            Err(e) => {
                return Err(violation(
                    "idem.replay.no-reexecution",
                    "a working probe".into(),
                    e,
                    &narrative,
                ));
            }
        }
    }
    Ok(ops.len())
}

/// The property phase as a case, so it appears in every report.
pub fn case() -> Case {
    Case {
        id: "model.sequences",
        title: "generated operation sequences (send, resend, changed body, other caller, bursts, clock) agree with the contract model",
        clauses: &[
            "idem.replay.verbatim",
            "idem.replay.marker",
            "idem.window.replay",
            "idem.fingerprint.mismatch",
            "idem.scope.caller",
            "idem.concurrency.single-effect",
            "idem.replay.no-reexecution",
            "idem.state.three-states",
        ],
        needs: &[],
        permitted: |m| {
            vec![format!(
                "{} sequences; every answer as the model predicts; shrunk counterexample saved for `replay`",
                m.limits.property_sequences
            )]
        },
        run: |r| Box::pin(property(r)),
    }
}

async fn property(rec: &mut Rec) {
    let cases = rec.ctx.manifest.limits.property_sequences;
    if cases == 0 {
        rec.stop(Verdict::Unsupported, "limits.property_sequences = 0");
        return;
    }
    let ctx: Arc<Ctx> = rec.ctx.clone();
    let seed = ctx.seed;
    let handle = tokio::runtime::Handle::current();
    let counter = Arc::new(AtomicU64::new(0));
    let c2 = counter.clone();
    let ctx2 = ctx.clone();
    let result = tokio::task::spawn_blocking(move || {
        let mut seed_bytes = [0u8; 32];
        seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
        let config = Config {
            cases,
            failure_persistence: None,
            max_shrink_iters: 32,
            ..Config::default()
        };
        let mut runner = TestRunner::new_with_rng(
            config,
            TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
        );
        let strategy = sequence(
            ctx2.manifest.hooks.clock.is_some(),
            ctx2.manifest.policy.replay_window_secs,
        );
        let last = std::sync::Mutex::new(None::<Violation>);
        let outcome = runner.run(&strategy, |ops| {
            c2.fetch_add(1, Ordering::SeqCst);
            let tag = format!("p{}", ctx2.unique());
            match handle.block_on(execute(&ctx2, &ops, &tag)) {
                Ok(_) => Ok(()),
                Err(v) => {
                    let msg = format!("{}: {}", v.clause, v.observed);
                    if let Ok(mut l) = last.lock() {
                        *l = Some(v);
                    }
                    Err(TestCaseError::fail(msg))
                }
            }
        });
        let last = last.into_inner().ok().flatten();
        match outcome {
            Ok(()) => Ok(()),
            Err(TestError::Fail(_, ops)) => Err(Some(Box::new((ops, last)))),
            Err(TestError::Abort(_)) => Err(None),
        }
    })
    .await;
    let executed = counter.load(Ordering::SeqCst);
    match result {
        Ok(Ok(())) => {
            rec.note(format!("{cases} generated sequences ({executed} executions, seed {seed}) agreed with the model"));
            for c in case().clauses {
                rec.check(
                    c,
                    true,
                    "as the model predicts",
                    format!("{cases} sequences agreed"),
                );
            }
        }
        Ok(Err(Some(found))) if found.1.is_some() => {
            let (ops, v) = *found;
            let Some(v) = v else { return };
            // Re-run the shrunk sequence once more for its own narrative.
            let final_v = execute(&ctx, &ops, &format!("p{}", ctx.unique()))
                .await
                .err()
                .unwrap_or(v);
            let cx = Counterexample {
                kit_version: crate::KIT_VERSION.to_owned(),
                seed,
                ops: ops.clone(),
                violation: final_v.clone(),
            };
            let file = ctx
                .artifacts
                .join(format!("idem-report-counterexample-{}.json", ctx.run_id))
                .display()
                .to_string();
            let saved = serde_json::to_string_pretty(&cx)
                .map_err(|e| e.to_string())
                .and_then(|s| std::fs::write(&file, s).map_err(|e| e.to_string()));
            rec.note(format!(
                "shrunk to {} operation(s) (seed {seed}):",
                ops.len()
            ));
            for l in &final_v.narrative {
                rec.note(l.clone());
            }
            rec.reproduction
                .extend(final_v.reproduction.iter().cloned());
            match saved {
                Ok(()) => rec.note(format!(
                    "saved as {file}; re-run with: idem-conformance replay {file} --target MANIFEST"
                )),
                Err(e) => rec.note(format!("could not save the counterexample: {e}")),
            }
            let clause = case()
                .clauses
                .iter()
                .copied()
                .find(|c| *c == final_v.clause)
                .unwrap_or("idem.state.three-states");
            rec.check(clause, false, final_v.permitted, final_v.observed);
        }
        Ok(Err(_)) => rec.stop(Verdict::Error, "the property runner aborted"),
        Err(e) => rec.stop(Verdict::Error, format!("property phase panicked: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counterexamples_round_trip_as_data() {
        let cx = Counterexample {
            kit_version: "0".into(),
            seed: 7,
            ops: vec![
                Op::Send {
                    caller: 0,
                    key: 1,
                    variant: 0,
                },
                Op::Burst {
                    caller: 1,
                    key: 1,
                    variant: 1,
                    n: 3,
                },
                Op::Advance { secs: 60 },
            ],
            violation: Violation {
                clause: "idem.scope.caller".into(),
                permitted: "p".into(),
                observed: "o".into(),
                narrative: vec![],
                reproduction: vec![],
            },
        };
        let s = serde_json::to_string(&cx).expect("serialise");
        let back: Counterexample = serde_json::from_str(&s).expect("parse");
        assert_eq!(back.ops, cx.ops);
    }

    use proptest::strategy::ValueTree;

    #[test]
    fn sequences_without_a_clock_never_advance_it() {
        let mut runner = TestRunner::deterministic();
        for _ in 0..50 {
            let ops = sequence(false, 86_400)
                .new_tree(&mut runner)
                .expect("tree")
                .current();
            assert!(!ops.is_empty() && ops.len() < 8);
            assert!(ops.iter().all(|o| !matches!(o, Op::Advance { .. })));
        }
    }
}
