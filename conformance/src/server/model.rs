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
//!
//! The model judges behaviour only (executed, refused, replayed, leaked,
//! and the effect counts), under the declared dialect; spellings are the
//! fixed cases' business, so a foreign dialect never stops the search
//! early. A clause passes only when some sequence exercised it (a clock
//! advance for the window, two callers on one key for scope, a burst for
//! single-effect). An answer that never came is not a violation: the
//! sequence is undecided, and the case inconclusive if nothing failed.

use idem_conformance_core::clause;
use idem_conformance_core::clause::ClauseId;
use idem_conformance_core::verdict::Consequence;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use std::collections::BTreeSet;

use idem_spec::clauses::Class;
use idem_spec::report::Verdict;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestError, TestRng, TestRunner};
use serde::{Deserialize, Serialize};

use crate::server::case::{Aim, Case, Ctx, Rec};
use crate::server::cases::concurrency;
use crate::server::dialect::Dialect;
use crate::server::http::{Failure, Response, Sent};
use crate::server::manifest::expand;
use crate::server::probe::ProbeError;

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
    /// Keys whose window the model clock passed.
    expired: BTreeSet<(u8, u8)>,
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
    /// What breaking it cost, as observed.
    #[serde(default = "safety")]
    pub class: Class,
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

fn safety() -> Class {
    Class::Safety
}

/// Why a sequence did not end in agreement with the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The target broke a clause.
    Violation(Violation),
    /// The outcome cannot be known (no answer, a probe that cannot see the
    /// operation): inconclusive, not a failure.
    Undecided(String),
    /// The harness failed (the clock hook, a broken probe).
    Harness(String),
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

/// A sequence that agreed with the model.
#[derive(Debug, Clone, Default)]
pub struct Agreed {
    /// The clauses it exercised.
    pub exercised: BTreeSet<ClauseId>,
    /// `curl` commands for its requests, secrets redacted.
    pub reproduction: Vec<String>,
}

/// Executes one sequence with fresh keys tagged `tag`; checks every answer
/// against the model and, at the end, every marker's effect count.
pub async fn execute(ctx: &Ctx, ops: &[Op], tag: &str) -> Result<Agreed, Stop> {
    let mut repro = Vec::new();
    match execute_recording(ctx, ops, tag, &mut repro).await {
        Ok(exercised) => Ok(Agreed {
            exercised,
            reproduction: repro,
        }),
        Err(Stop::Violation(mut v)) => {
            v.reproduction = repro;
            Err(Stop::Violation(v))
        }
        Err(other) => Err(other),
    }
}

/// The marker of (caller, key, variant) in sequence `tag`.
fn marker_of(ctx: &Ctx, tag: &str, caller: u8, key: u8, variant: u8) -> String {
    format!("{}-{tag}-c{caller}k{key}v{variant}", ctx.run_id)
}

/// What the contract permits for one send (or burst) of `(caller, key,
/// variant)`, given the model's state. Pure: no request, no probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// The key is absent for this caller: the request executes once (a
    /// burst: once in all, every other copy refused or an identical
    /// replay).
    Execute {
        /// The other caller's stored response for the same key, if any:
        /// it must neither leak nor block this caller.
        other_caller: Option<Response>,
        /// The key was this caller's before its window ran out.
        after_expiry: bool,
        /// Copies sent at once.
        copies: usize,
    },
    /// The same request under a completed key: the stored response,
    /// replayed.
    Replay {
        /// The stored response (`None` when the model has no bytes).
        stored: Option<Response>,
        /// How old the key is, when the model clock moved since it was
        /// stored (`None` when it did not).
        age: Option<u64>,
        /// The declared window.
        window: u64,
    },
    /// Another body under a completed key: refused, never the stored
    /// response.
    Mismatch {
        /// The stored response.
        stored: Option<Response>,
    },
}

/// What the contract permits after `op` in `model`. Pure.
pub fn expect(model: &Model, caller: u8, key: u8, variant: u8, copies: usize) -> Expect {
    match model.keys.get(&(caller, key)) {
        None => Expect::Execute {
            other_caller: model
                .keys
                .get(&(1 - caller.min(1), key))
                .and_then(|s| s.response.clone()),
            after_expiry: model.expired.contains(&(caller, key)),
            copies,
        },
        Some(s) if s.variant == variant => Expect::Replay {
            stored: s.response.clone(),
            age: (s.at < model.now).then(|| model.now - s.at),
            window: model.window,
        },
        Some(s) => Expect::Mismatch {
            stored: s.response.clone(),
        },
    }
}

/// A finding of the judge, before it is wrapped with the narrative.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The clause broken.
    pub clause: ClauseId,
    /// What breaking it cost.
    pub class: Class,
    /// What the model permitted.
    pub permitted: String,
    /// What the target did.
    pub observed: String,
}

/// The judge's answer for one step. Pure: the loop gathers the data the
/// judge asks for (an effect count) and asks again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judged {
    /// The answers agree with the model: the clauses exercised, and the
    /// response to store when the request executed.
    Agreed {
        /// Clauses the step exercised.
        exercised: Vec<ClauseId>,
        /// The first execution's response (an `Execute` step), to store.
        executed: Option<Response>,
    },
    /// The verdict depends on the operation's effect count: call again
    /// with it.
    NeedsCount,
    /// The target broke a clause.
    Violation(Finding),
    /// The answers cannot decide (shed load).
    Undecided(String),
}

fn finding(
    clause: ClauseId,
    seen: Consequence,
    permitted: impl Into<String>,
    observed: impl Into<String>,
) -> Judged {
    Judged::Violation(Finding {
        clause,
        class: seen.class(),
        permitted: permitted.into(),
        observed: observed.into(),
    })
}

/// The answers of a step, one summary each, as findings show them.
fn summaries(answers: &[&Response]) -> String {
    answers
        .iter()
        .map(|r| r.summary())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Judges one step's answers against what the contract permits. `leak` is
/// the proof, gathered by the loop, that an answer is the other caller's
/// stored response; `count` the operation's effect count when the judge
/// asked for it (`want` what the model expects it to be now). Bursts are
/// classified by the concurrency gate's own rules
/// ([`concurrency::classify`]). Pure.
pub fn judge(
    dialect: &Dialect<'_>,
    expected: &Expect,
    sent: &[Sent],
    leak: Option<&str>,
    count: Option<u64>,
    want: u64,
) -> Judged {
    let answers: Vec<&Response> = sent.iter().filter_map(|s| s.as_ref().ok()).collect();
    let shown = summaries(&answers);
    if let Some(proof) = leak {
        return finding(
            clause!("idem.scope.caller"),
            Consequence::CrossCaller,
            "never the other caller's stored response",
            format!("{shown} ({proof})"),
        );
    }
    match expected {
        Expect::Execute {
            other_caller,
            after_expiry,
            copies,
        } => judge_execute(
            dialect,
            sent,
            &answers,
            other_caller.is_some(),
            *after_expiry,
            *copies,
            count,
        ),
        Expect::Replay {
            stored,
            age,
            window,
        } => judge_replay(
            dialect,
            &answers,
            stored.as_ref(),
            *age,
            *window,
            count,
            want,
        ),
        Expect::Mismatch { stored } => judge_mismatch(dialect, &answers, stored.as_ref()),
    }
}

/// [`judge`] of a request whose key is absent for its caller: it executes
/// (a burst: once in all).
fn judge_execute(
    dialect: &Dialect<'_>,
    sent: &[Sent],
    answers: &[&Response],
    other_caller: bool,
    after_expiry: bool,
    copies: usize,
    count: Option<u64>,
) -> Judged {
    let shown = summaries(answers);
    let o = concurrency::classify(dialect, sent);
    let Some(first) = answers.iter().find(|r| dialect.executed(r, None)) else {
        if o.throttled > 0 {
            // Shed load says nothing about the key.
            return Judged::Undecided(format!("the target shed load ({shown})"));
        }
        let (clause, permitted) = if other_caller {
            (
                clause!("idem.scope.caller"),
                "the other caller's use of the key neither blocks nor refuses this one: it executes",
            )
        } else if after_expiry {
            (
                clause!("idem.window.expiry"),
                "a key reused after its window executes as a new request",
            )
        } else {
            (
                clause!("idem.state.three-states"),
                "an absent key executes: a 2xx that is not a replay",
            )
        };
        return finding(clause, Consequence::Behaviour, permitted, shown);
    };
    let mut exercised = vec![clause!("idem.state.three-states")];
    if other_caller {
        exercised.push(clause!("idem.scope.caller"));
    }
    if after_expiry {
        exercised.push(clause!("idem.window.expiry"));
    }
    if copies > 1 {
        exercised.push(clause!("idem.concurrency.single-effect"));
        // More than one execution answered, or answers that are
        // neither refusals nor replays: the count decides first, so
        // a safety failure is never masked by a milder one.
        if o.executed > 1 || !o.other.is_empty() {
            match count {
                None => return Judged::NeedsCount,
                Some(got) if got > 1 => {
                    return finding(
                        clause!("idem.concurrency.single-effect"),
                        Consequence::SecondEffect,
                        format!("{copies} concurrent copies with one key: one effect"),
                        format!("{got} effects; answers {shown}"),
                    );
                }
                Some(_) => {}
            }
        }
        if !o.other.is_empty() {
            return finding(
                clause!("idem.concurrency.single-effect"),
                Consequence::Behaviour,
                "every other copy refused or answered with an identical replay",
                concurrency::tally(&o.other),
            );
        }
    }
    Judged::Agreed {
        exercised,
        executed: Some((*first).clone()),
    }
}

/// [`judge`] of the same request under a completed key: a replay, never a
/// second execution.
fn judge_replay(
    dialect: &Dialect<'_>,
    answers: &[&Response],
    stored: Option<&Response>,
    age: Option<u64>,
    window: u64,
    count: Option<u64>,
    want: u64,
) -> Judged {
    for r in answers {
        if stored.is_some_and(|f| f.same_outcome(r)) {
            continue;
        }
        if dialect.executed(r, stored) {
            // Executed again: more effects than the model allows is
            // the worst case, and only the count can show it.
            match count {
                None => return Judged::NeedsCount,
                Some(got) if got > want => {
                    return finding(
                        clause!("idem.replay.no-reexecution"),
                        Consequence::SecondEffect,
                        format!("a resend of a completed request: {want} effect(s)"),
                        format!("{got} effects; {}", r.summary()),
                    );
                }
                Some(_) => {}
            }
        }
        return match age {
            Some(age) => finding(
                clause!("idem.window.replay"),
                Consequence::Behaviour,
                format!("a replay: the key is {age} s old, inside the {window} s window"),
                r.summary(),
            ),
            None => finding(
                clause!("idem.replay.verbatim"),
                Consequence::Behaviour,
                "a verbatim replay of the stored response",
                r.summary(),
            ),
        };
    }
    let mut exercised = vec![clause!("idem.replay.verbatim")];
    if age.is_some() {
        exercised.push(clause!("idem.window.replay"));
    }
    Judged::Agreed {
        exercised,
        executed: None,
    }
}

/// [`judge`] of another body under a completed key: refused, never the
/// stored response.
fn judge_mismatch(
    dialect: &Dialect<'_>,
    answers: &[&Response],
    stored: Option<&Response>,
) -> Judged {
    for r in answers {
        if stored.is_some_and(|f| f.same_outcome(r))
            || dialect.marked(r) == Some(true)
            || r.replayed()
        {
            return finding(
                clause!("idem.fingerprint.mismatch"),
                Consequence::AnotherRequestsAnswer,
                "a changed body under a used key is never answered with the stored response",
                r.summary(),
            );
        }
        if !(400..500).contains(&r.status) {
            return finding(
                clause!("idem.fingerprint.mismatch"),
                Consequence::Behaviour,
                format!(
                    "a changed body under a used key is refused ({} as declared)",
                    dialect.spelled(idem_spec::ErrorCode::IdempotencyKeyMismatch)
                ),
                r.summary(),
            );
        }
    }
    Judged::Agreed {
        exercised: vec![clause!("idem.fingerprint.mismatch")],
        executed: None,
    }
}

/// Judges an operation's final effect count against the model's. More
/// effects than executions is safety (a burst's: single-effect; a resend's:
/// no-reexecution); fewer is semantics (answers that claimed an execution
/// that did not happen), never safety: no safety failure comes from a
/// count short of what was expected. Pure.
pub fn judge_count(marker: &str, want: u64, got: u64, burst: bool) -> Option<Finding> {
    if got == want {
        return None;
    }
    let (clause, seen) = match (got > want, burst) {
        (true, true) => (
            clause!("idem.concurrency.single-effect"),
            Consequence::SecondEffect,
        ),
        (true, false) => (
            clause!("idem.replay.no-reexecution"),
            Consequence::SecondEffect,
        ),
        (false, _) => (clause!("idem.state.three-states"), Consequence::Behaviour),
    };
    Some(Finding {
        clause,
        class: seen.class(),
        permitted: format!("{want} effect(s) for {marker:?}"),
        observed: format!("{got} effect(s)"),
    })
}

/// Applies an agreed step to the model: an execution stores its response
/// and adds one expected effect.
pub fn apply(
    model: &mut Model,
    caller: u8,
    key: u8,
    variant: u8,
    marker: &str,
    executed: Option<Response>,
) {
    model.expired.remove(&(caller, key));
    if let Some(first) = executed {
        *model.effects.entry(marker.to_owned()).or_default() += 1;
        model.keys.insert(
            (caller, key),
            Stored {
                variant,
                response: Some(first),
                at: model.now,
            },
        );
    }
}

/// Moves the model clock: keys older than the window expire.
pub fn advance(model: &mut Model, secs: u64) {
    model.now += secs;
    let (now, window) = (model.now, model.window);
    let gone: Vec<(u8, u8)> = model
        .keys
        .iter()
        .filter(|(_, s)| now - s.at > window)
        .map(|(k, _)| *k)
        .collect();
    for k in gone {
        model.keys.remove(&k);
        model.expired.insert(k);
    }
}

/// Runs the sequence: for each operation, send it, judge the answers
/// against [`expect`] with [`judge`] (fetching the count or the leak proof
/// it needs), narrate, and [`apply`] the outcome to the model.
async fn execute_recording(
    ctx: &Ctx,
    ops: &[Op],
    tag: &str,
    repro: &mut Vec<String>,
) -> Result<BTreeSet<ClauseId>, Stop> {
    let mut model = Model {
        window: ctx.manifest.policy.replay_window_secs,
        ..Model::default()
    };
    let mut narrative: Vec<String> = Vec::new();
    let mut exercised: BTreeSet<ClauseId> = BTreeSet::new();
    // marker -> (caller, whether a burst carried it, every answer)
    let mut seen: BTreeMap<String, (u8, bool, Vec<Response>)> = BTreeMap::new();
    let names = [ctx.name(0).to_owned(), ctx.name(1).to_owned()];
    for (i, op) in ops.iter().enumerate() {
        let step = format!("S{}", i + 1);
        let s = match *op {
            Op::Advance { secs } => {
                ctx.advance_clock(secs).await.map_err(Stop::Harness)?;
                advance(&mut model, secs);
                narrative.push(format!("{step}: the clock advances {secs} s"));
                repro.push(format!(
                    "# {step}: advance the clock {secs} s through hooks.clock"
                ));
                continue;
            }
            Op::Send {
                caller,
                key,
                variant,
            } => StepOp {
                caller,
                key,
                variant,
                n: 1,
            },
            Op::Burst {
                caller,
                key,
                variant,
                n,
            } => StepOp {
                caller,
                key,
                variant,
                n: usize::from(n),
            },
        };
        let (marker, sent, answers) = send_step(ctx, tag, &step, s, repro).await?;
        let StepOp {
            caller,
            key,
            variant,
            n,
        } = s;
        narrative.push(narrate(&step, &names[caller as usize], s, &answers));
        let entry = seen
            .entry(marker.clone())
            .or_insert_with(|| (caller, false, Vec::new()));
        entry.1 |= n > 1;
        entry.2.extend(answers.iter().cloned());
        let verdict = judge_step(ctx, &model, tag, s, &marker, &sent, &answers).await?;
        // Apply.
        match verdict {
            Judged::Agreed {
                exercised: e,
                executed,
            } => {
                exercised.extend(e);
                apply(&mut model, caller, key, variant, &marker, executed);
            }
            Judged::Violation(f) => return Err(violation(&narrative, f)),
            Judged::Undecided(why) => return Err(Stop::Undecided(format!("{step}: {why}"))),
            Judged::NeedsCount => {
                return Err(Stop::Harness(format!(
                    "{step}: the judge asked for a count twice"
                )));
            }
        }
    }
    judge_final_counts(ctx, &model, &seen, &mut narrative).await?;
    if !seen.is_empty() {
        exercised.insert(clause!("idem.replay.no-reexecution"));
    }
    Ok(exercised)
}

/// The narrative line of one sending step.
fn narrate(step: &str, name: &str, s: StepOp, answers: &[Response]) -> String {
    let StepOp {
        key, variant, n, ..
    } = s;
    format!(
        "{step}: {name} sends {}key k{key} with body {variant} → {}",
        if n > 1 {
            format!("{n} concurrent copies, ")
        } else {
            String::new()
        },
        answers
            .iter()
            .map(Response::summary)
            .collect::<Vec<_>>()
            .join(" | ")
    )
}

/// After the last step: each operation's effect count against the
/// model's, judged by [`judge_count`].
async fn judge_final_counts(
    ctx: &Ctx,
    model: &Model,
    seen: &BTreeMap<String, (u8, bool, Vec<Response>)>,
    narrative: &mut Vec<String>,
) -> Result<(), Stop> {
    for (marker, (caller, burst, responses)) in seen {
        let want = model.effects.get(marker).copied().unwrap_or(0);
        let refs: Vec<&Response> = responses.iter().collect();
        let got = ctx
            .effects(*caller as usize, marker, &refs)
            .await
            .map_err(probe_stop)?;
        if let Some(f) = judge_count(marker, want, got, *burst) {
            narrative.push(format!("the probe counts {got} effect(s) for {marker:?}"));
            return Err(violation(narrative, f));
        }
    }
    Ok(())
}

/// One sending step of a sequence: `n` copies of `caller`'s request under
/// key `key` with body `variant`.
#[derive(Debug, Clone, Copy)]
struct StepOp {
    caller: u8,
    key: u8,
    variant: u8,
    n: usize,
}

/// A finding of the judge as the sequence's stop, with the narrative so far.
fn violation(narrative: &[String], f: Finding) -> Stop {
    Stop::Violation(Violation {
        clause: f.clause.to_string(),
        class: f.class,
        permitted: f.permitted,
        observed: f.observed,
        narrative: narrative.to_vec(),
        reproduction: Vec::new(),
    })
}

/// A probe that cannot count: undecided without a key to match by, a
/// harness error when it failed.
fn probe_stop(e: ProbeError) -> Stop {
    match e {
        ProbeError::NoKey => Stop::Undecided(e.to_string()),
        ProbeError::Failed(s) => Stop::Harness(s),
    }
}

/// Sends one step (recording its curl line) and returns its marker, what
/// was sent and the answers; a copy not sent or not answered stops the
/// sequence, since nothing is judged from it.
async fn send_step(
    ctx: &Ctx,
    tag: &str,
    step: &str,
    s: StepOp,
    repro: &mut Vec<String>,
) -> Result<(String, Vec<Sent>, Vec<Response>), Stop> {
    let StepOp {
        caller,
        key,
        variant,
        n,
    } = s;
    let marker = marker_of(ctx, tag, caller, key, variant);
    // The same key for the same (tag, key) in every step, in the target's
    // declared grammar.
    let keyname = crate::server::keyform::mint(
        &ctx.manifest.key,
        &format!("{}-{tag}", ctx.run_id),
        u64::from(key),
    );
    let body = expand(
        &ctx.endpoint().body,
        ctx.caller(caller as usize),
        &marker,
        ctx.amount_at(u64::from(key) * 2 + u64::from(variant)),
    );
    let req = ctx.op(caller as usize, Some(&keyname), &marker, &body);
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
    // The rule: nothing is judged from a request that was not sent or
    // not answered.
    if let Some(Err(f)) = sent.iter().find(|s| s.is_err()) {
        return Err(match f {
            Failure::Budget(_) | Failure::Connect(_) | Failure::Harness(_) => {
                Stop::Harness(format!("{step}: not sent: {f}"))
            }
            Failure::Timeout(_) | Failure::Transport(_) => {
                Stop::Undecided(format!("{step}: no answer: {f}"))
            }
        });
    }
    let answers: Vec<Response> = sent
        .iter()
        .filter_map(|s| s.as_ref().ok().cloned())
        .collect();
    Ok((marker, sent, answers))
}

/// Judges one step against the model, gathering what the judge needs: the
/// proof that an answer is the other caller's, and the count when asked.
async fn judge_step(
    ctx: &Ctx,
    model: &Model,
    tag: &str,
    s: StepOp,
    marker: &str,
    sent: &[Sent],
    answers: &[Response],
) -> Result<Judged, Stop> {
    let StepOp {
        caller,
        key,
        variant,
        n,
    } = s;
    let expected = expect(model, caller, key, variant, n);
    let want = model.effects.get(marker).copied().unwrap_or(0);
    // A response only the other caller could have been given is a
    // leak, whatever this caller's own state; what proves it, the
    // loop asks the probe (identical documents alone are not proof).
    let other = 1 - caller.min(1);
    let mut leak = None;
    if let Some(s) = model.keys.get(&(other, key))
        && let Some(o) = s.response.as_ref()
    {
        let other_marker = marker_of(ctx, tag, other, key, s.variant);
        for r in answers.iter().filter(|r| r.same_payload(o)) {
            leak = ctx
                .is_leak(caller as usize, marker, want, r, o, Some(&other_marker))
                .await
                .map_err(probe_stop)?;
            if leak.is_some() {
                break;
            }
        }
    }
    let mut verdict = judge(&ctx.dialect(), &expected, sent, leak.as_deref(), None, want);
    if verdict == Judged::NeedsCount {
        let refs: Vec<&Response> = answers.iter().collect();
        let got = ctx
            .effects(caller as usize, marker, &refs)
            .await
            .map_err(probe_stop)?;
        verdict = judge(
            &ctx.dialect(),
            &expected,
            sent,
            leak.as_deref(),
            Some(got),
            want,
        );
    }
    Ok(verdict)
}

/// The property phase as a case, so it appears in every report.
pub fn case() -> Case {
    Case {
        id: "model.sequences",
        title: "generated operation sequences (send, resend, changed body, other caller, bursts, clock) agree with the contract model",
        clauses: &[
            clause!("idem.replay.verbatim"),
            clause!("idem.window.replay"),
            clause!("idem.window.expiry"),
            clause!("idem.fingerprint.mismatch"),
            clause!("idem.scope.caller"),
            clause!("idem.concurrency.single-effect"),
            clause!("idem.replay.no-reexecution"),
            clause!("idem.state.three-states"),
        ],
        needs: &[],
        aim: Aim::Main,
        // Sequences move the clock when a clock hook is declared.
        alone: |m| m.hooks.clock.is_some(),
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
    let Search { outcome, seen } = search(ctx.clone(), cases).await;
    match outcome {
        Ok(Ok(())) => report_agreed(rec, cases, seed, seen),
        Ok(Err(Some(found))) if found.1.is_some() => {
            let (ops, v) = *found;
            let Some(v) = v else { return };
            report_counterexample(rec, &ctx, ops, v).await;
        }
        Ok(Err(_)) => rec.stop(Verdict::Error, "the property runner aborted"),
        Err(e) => rec.stop(Verdict::Error, format!("property phase panicked: {e}")),
    }
}

/// The failing sequence, shrunk, with the violation its last run saw
/// (`None` as a whole: the runner aborted without one).
type Shrunk = Option<Box<(Vec<Op>, Option<Violation>)>>;

/// What the property search ended with.
struct Search {
    /// Every sequence agreed (or was undecided); or the shrunk failing
    /// sequence with its violation (`None`: the runner aborted); or the
    /// search panicked.
    outcome: Result<Result<(), Shrunk>, tokio::task::JoinError>,
    /// What the agreeing sequences showed.
    seen: Seen,
}

/// What the agreeing sequences of a search showed.
struct Seen {
    /// Sequences executed, shrinking included.
    executions: u64,
    /// What every agreeing sequence exercised.
    exercised: BTreeSet<ClauseId>,
    /// The reproduction of the longest agreeing sequence, as an example.
    example: Vec<String>,
    /// The first undecided sequence (or the last harness error).
    undecided: Option<(Verdict, String)>,
}

/// Runs `cases` generated sequences from the run's seed under proptest's
/// runner (blocking, on its own thread; each sequence driven on the
/// runtime), shrinking the first that fails.
async fn search(ctx: Arc<Ctx>, cases: u32) -> Search {
    let seed = ctx.seed;
    let handle = tokio::runtime::Handle::current();
    let counter = Arc::new(AtomicU64::new(0));
    let c2 = counter.clone();
    let ctx2 = ctx.clone();
    // What every agreeing sequence exercised, and the first undecided one.
    let exercised = Arc::new(std::sync::Mutex::new(BTreeSet::<ClauseId>::new()));
    // The reproduction of the longest agreeing sequence, as an example.
    let example = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let ex3 = example.clone();
    let undecided = Arc::new(std::sync::Mutex::new(None::<(Verdict, String)>));
    let (ex2, un2) = (exercised.clone(), undecided.clone());
    let outcome = tokio::task::spawn_blocking(move || {
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
                Ok(done) => {
                    if let Ok(mut e) = ex2.lock() {
                        e.extend(done.exercised);
                    }
                    if let Ok(mut e) = ex3.lock()
                        && done.reproduction.len() > e.len()
                    {
                        *e = done.reproduction;
                    }
                    Ok(())
                }
                Err(Stop::Violation(v)) => {
                    let msg = format!("{}: {}", v.clause, v.observed);
                    if let Ok(mut l) = last.lock() {
                        *l = Some(v);
                    }
                    Err(TestCaseError::fail(msg))
                }
                // Not a failure of the target: keep searching, and say so
                // at the end if nothing failed.
                Err(Stop::Undecided(why)) => {
                    if let Ok(mut u) = un2.lock() {
                        u.get_or_insert((Verdict::Inconclusive, why));
                    }
                    Ok(())
                }
                Err(Stop::Harness(why)) => {
                    if let Ok(mut u) = un2.lock() {
                        *u = Some((Verdict::Error, why));
                    }
                    Ok(())
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
    let seen = Seen {
        executions: counter.load(Ordering::SeqCst),
        exercised: exercised.lock().map(|e| e.clone()).unwrap_or_default(),
        example: example.lock().map(|e| e.clone()).unwrap_or_default(),
        undecided: undecided.lock().ok().and_then(|u| u.clone()),
    };
    Search { outcome, seen }
}

/// Every sequence agreed: the clauses they exercised pass, the others get
/// no verdict from this case, and an undecided sequence decides the
/// verdict.
fn report_agreed(rec: &mut Rec, cases: u32, seed: u64, seen: Seen) {
    let Seen {
        executions: executed,
        exercised,
        example,
        undecided,
    } = seen;
    rec.note(format!(
        "{cases} generated sequences ({executed} executions, seed {seed}) agreed with the model"
    ));
    // A clause passes only when a sequence exercised it.
    for c in case().clauses {
        if exercised.contains(c) {
            rec.check(
                *c,
                true,
                "as the model predicts",
                format!("{cases} sequences agreed"),
            );
        }
    }
    let skipped: Vec<&str> = case()
        .clauses
        .iter()
        .copied()
        .filter(|c| !exercised.contains(c))
        .map(ClauseId::as_str)
        .collect();
    if !skipped.is_empty() {
        rec.note(format!(
            "not exercised by these sequences (no verdict from this case): {}",
            skipped.join(", ")
        ));
    }
    if !example.is_empty() {
        rec.reproduction
            .push("# the longest generated sequence, which agreed with the model:".into());
        rec.reproduction.extend(example);
    }
    if let Some((v, why)) = undecided {
        rec.stop(
            v,
            format!("a generated sequence could not be decided: {why}"),
        );
    }
}

/// A sequence failed: the shrunk one is re-run for its own narrative,
/// saved as a counterexample for `replay`, and fails its clause.
async fn report_counterexample(rec: &mut Rec, ctx: &Ctx, ops: Vec<Op>, v: Violation) {
    let seed = ctx.seed;
    // Re-run the shrunk sequence once more for its own narrative.
    let final_v = match execute(ctx, &ops, &format!("p{}", ctx.unique())).await {
        Err(Stop::Violation(again)) => again,
        _ => v,
    };
    let cx = Counterexample {
        kit_version: idem_conformance_core::KIT_VERSION.to_owned(),
        seed,
        ops: ops.clone(),
        violation: final_v.clone(),
    };
    let file = ctx
        .artifacts
        .join(format!("counterexample-{}.json", ctx.run_id))
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
        .unwrap_or(clause!("idem.state.three-states"));
    rec.check_decided(
        clause,
        final_v.class,
        false,
        final_v.permitted.clone(),
        final_v.observed.clone(),
    );
    rec.headline(format!(
        "{} generated operation(s): got {}; the contract: {}",
        ops.len(),
        final_v.observed,
        final_v.permitted
    ));
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
                clause: clause!("idem.scope.caller").into(),
                class: Class::Safety,
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

    fn manifest() -> idem_spec::manifest::Manifest {
        crate::server::manifest::parse(crate::server::manifest::TEMPLATE, "t")
            .expect("template")
            .manifest
    }

    fn r(status: u16, body: &str, replayed: bool) -> Sent {
        let mut headers = vec![];
        if replayed {
            headers.push(("idempotent-replayed".into(), "true".into()));
        }
        Ok(Response {
            status,
            headers,
            body: body.as_bytes().to_vec(),
        })
    }

    fn resp(status: u16, body: &str) -> Response {
        r(status, body, false).expect("a response")
    }

    fn stored(body: &str) -> Stored {
        Stored {
            variant: 0,
            response: Some(resp(201, body)),
            at: 0,
        }
    }

    #[test]
    fn the_expectation_follows_the_model_state() {
        let mut m = Model {
            window: 100,
            ..Model::default()
        };
        assert!(matches!(
            expect(&m, 0, 0, 0, 1),
            Expect::Execute {
                other_caller: None,
                after_expiry: false,
                copies: 1
            }
        ));
        m.keys.insert((1, 0), stored(r#"{"id":9}"#));
        assert!(matches!(
            expect(&m, 0, 0, 0, 3),
            Expect::Execute {
                other_caller: Some(_),
                copies: 3,
                ..
            }
        ));
        m.keys.insert((0, 0), stored(r#"{"id":1}"#));
        assert!(matches!(
            expect(&m, 0, 0, 0, 1),
            Expect::Replay { age: None, .. }
        ));
        assert!(matches!(expect(&m, 0, 0, 1, 1), Expect::Mismatch { .. }));
        advance(&mut m, 50);
        assert!(matches!(
            expect(&m, 0, 0, 0, 1),
            Expect::Replay {
                age: Some(50),
                window: 100,
                ..
            }
        ));
        advance(&mut m, 60);
        assert!(matches!(
            expect(&m, 0, 0, 1, 1),
            Expect::Execute {
                after_expiry: true,
                ..
            }
        ));
    }

    /// (what, expectation, answers, leak proof, count, want) → judged
    /// clause and class (None: agreed).
    // Long on purpose: a table of rows, one per judged situation, read
    // down the page against the judge; splitting it would scatter the rows.
    #[test]
    fn the_judge_table() {
        let m = manifest();
        let c = Dialect(&m);
        let exec = |copies| Expect::Execute {
            other_caller: None,
            after_expiry: false,
            copies,
        };
        let replay = Expect::Replay {
            stored: Some(resp(201, r#"{"id":1}"#)),
            age: None,
            window: 100,
        };
        let mismatch = Expect::Mismatch {
            stored: Some(resp(201, r#"{"id":1}"#)),
        };
        let in_use = r(409, r#"{"code":"idempotency_key_in_use"}"#, false);
        type Row = (
            &'static str,
            Expect,
            Vec<Sent>,
            Option<&'static str>,
            Option<u64>,
            u64,
            Option<(&'static str, Class)>,
        );
        let table: Vec<Row> = vec![
            (
                "a fresh send executes",
                exec(1),
                vec![r(201, r#"{"id":1}"#, false)],
                None,
                None,
                0,
                None,
            ),
            (
                "a burst: one execution, refusals and replays",
                exec(3),
                vec![
                    r(201, r#"{"id":1}"#, false),
                    in_use.clone(),
                    r(201, r#"{"id":1}"#, true),
                ],
                None,
                None,
                0,
                None,
            ),
            (
                "a burst with two executions and two effects",
                exec(2),
                vec![r(201, r#"{"id":1}"#, false), r(201, r#"{"id":2}"#, false)],
                None,
                Some(2),
                0,
                Some(("idem.concurrency.single-effect", Class::Safety)),
            ),
            (
                "two executions answered but one effect: agreed",
                exec(2),
                vec![r(201, r#"{"id":1}"#, false), r(201, r#"{"id":2}"#, false)],
                None,
                Some(1),
                0,
                None,
            ),
            (
                "a 5xx beside the execution, one effect",
                exec(2),
                vec![r(201, r#"{"id":1}"#, false), r(500, "", false)],
                None,
                Some(1),
                0,
                Some(("idem.concurrency.single-effect", Class::Semantics)),
            ),
            (
                "an absent key refused: three states, semantics",
                exec(1),
                vec![in_use.clone()],
                None,
                None,
                0,
                Some(("idem.state.three-states", Class::Semantics)),
            ),
            (
                "shed load is undecided",
                exec(1),
                vec![r(503, "", false)],
                None,
                None,
                0,
                None,
            ),
            (
                "a proven leak is safety",
                exec(1),
                vec![r(201, r#"{"id":9}"#, false)],
                Some("their marker"),
                None,
                0,
                Some(("idem.scope.caller", Class::Safety)),
            ),
            (
                "a verbatim replay",
                replay.clone(),
                vec![r(201, r#"{"id":1}"#, true)],
                None,
                None,
                1,
                None,
            ),
            (
                "executed again with a second effect",
                replay.clone(),
                vec![r(201, r#"{"id":2}"#, false)],
                None,
                Some(2),
                1,
                Some(("idem.replay.no-reexecution", Class::Safety)),
            ),
            (
                "a replay that differs, no second effect",
                replay.clone(),
                vec![r(201, r#"{"id":2}"#, false)],
                None,
                Some(1),
                1,
                Some(("idem.replay.verbatim", Class::Semantics)),
            ),
            (
                "a refused resend is not a replay",
                replay,
                vec![in_use],
                None,
                None,
                1,
                Some(("idem.replay.verbatim", Class::Semantics)),
            ),
            (
                "a mismatch refused",
                mismatch.clone(),
                vec![r(422, "{}", false)],
                None,
                None,
                1,
                None,
            ),
            (
                "a mismatch answered with the stored response",
                mismatch.clone(),
                vec![r(201, r#"{"id":1}"#, false)],
                None,
                None,
                1,
                Some(("idem.fingerprint.mismatch", Class::Safety)),
            ),
            (
                "a mismatch executed",
                mismatch,
                vec![r(201, r#"{"id":3}"#, false)],
                None,
                None,
                1,
                Some(("idem.fingerprint.mismatch", Class::Semantics)),
            ),
        ];
        for (what, e, sent, leak, count, want, due) in table {
            let mut got = judge(&c, &e, &sent, leak, None, want);
            if got == Judged::NeedsCount {
                got = judge(&c, &e, &sent, leak, Some(count.expect(what)), want);
            }
            let found = match &got {
                Judged::Violation(f) => Some((f.clause.as_str(), f.class)),
                Judged::NeedsCount => panic!("{what}: asked for the count twice"),
                _ => None,
            };
            assert_eq!(found, due, "{what}: {got:?}");
            if what.starts_with("shed") {
                assert!(matches!(got, Judged::Undecided(_)), "{what}");
            }
        }
    }

    #[test]
    fn a_short_count_is_never_safety() {
        assert_eq!(judge_count("m", 1, 1, false), None);
        let f = judge_count("m", 1, 0, true).expect("a finding");
        assert_eq!(
            (f.clause.as_str(), f.class),
            ("idem.state.three-states", Class::Semantics)
        );
        let f = judge_count("m", 1, 2, true).expect("a finding");
        assert_eq!(
            (f.clause.as_str(), f.class),
            ("idem.concurrency.single-effect", Class::Safety)
        );
        let f = judge_count("m", 1, 3, false).expect("a finding");
        assert_eq!(
            (f.clause.as_str(), f.class),
            ("idem.replay.no-reexecution", Class::Safety)
        );
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
