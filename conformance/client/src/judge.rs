//! Verdicts over recorded attempts: pure functions of a [`RunRecord`] (and,
//! for the cross-run clauses, of several), so every rule is table-tested
//! without a server or a client.
//!
//! Every check is made by the verdict core
//! ([`idem_conformance_core::verdict`]), citing its clause through the
//! compile-time [`clause!`]; its level is the clause's, and its class the
//! severity rule's reading of what the check saw ([`Consequence`]): a
//! second effect made possible (a key-less state-changing request resent
//! after it may have been sent, a fresh key per attempt) is safety; a final
//! 4xx retried *with its key* is semantics (against a server that follows
//! the contract the retry is refused or replayed again and can never take
//! effect twice), and so are an ignored hint, a missing deadline and a
//! missing jitter; a key's spelling is interop. The one check made at a
//! level other than its clause's is `idem.client.500-with-key`'s MUST NOT
//! half ([`verdict::check_at`]): the clause is a MAY for a keyed retry and a
//! MUST NOT otherwise.
//!
//! The command's exit code is checked against its final answer
//! ([`judge_exit`]); no client clause names that yet, so that check is the
//! kit's own, [`EXIT_CHECK`], with the class the severity rule gives a
//! behaviour that misleads no server.

use std::time::Duration;

use idem_conformance_core::clause;
use idem_conformance_core::verdict::{self, Consequence, check_as, check_at};
use idem_spec::clauses::Level;
use idem_spec::headers::{REQUEST_DEADLINE_MS, parse_request_deadline_ms};
use idem_spec::report::{CheckReport, Verdict};

use super::record::{self, Answer, Exit, KeySource, Kill, Retry, RunRecord};
use super::scenario::{self, Scenario};

/// The contract's default attempt cap (`idem.client.max-attempts`).
pub const MAX_ATTEMPTS: usize = 3;
/// The contract's default ceiling on requests sent per operation, every
/// request counted (`idem.client.attempt-cap`, a MUST).
pub const MAX_SENDS: usize = 10;
/// The contract's default overall deadline (`idem.client.deadline`).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);
/// The first backoff ceiling of the contract's full jitter (base 500 ms).
pub const FIRST_CEILING: Duration = Duration::from_millis(500);
/// How much earlier than a delta-seconds `Retry-After` allows a retry may
/// arrive and still count as honouring it (timer and clock granularity).
pub const RETRY_AFTER_TOLERANCE: Duration = Duration::from_millis(100);
/// The same for an HTTP date, whose own resolution is one second.
pub const DATE_TOLERANCE: Duration = Duration::from_secs(1);
/// "Stop at once" when a hint lands past the deadline: the client must
/// have finished within this long of the answer. Generous (a loaded
/// machine delays a prompt exit), and still far below the wait of a client
/// that honours the hint, which is the deadline plus 30 s.
pub const STOP_AT_ONCE: Duration = Duration::from_secs(5);

/// The jitter test's threshold: the first retry delays of the repeated
/// runs, without the [`JITTER_TRIM`] longest, must spread over at least
/// this much, or the backoff is judged constant. Small enough that jitter
/// over only the top quarter of the first ceiling (a 125 ms wide draw)
/// passes reliably ([`NARROW_JITTER_WIDTH`]); large enough that a constant
/// delay's scheduling noise (4 to 13 ms measured) stays below it.
pub const JITTER_THRESHOLD: Duration = Duration::from_millis(25);
/// How many of the longest first delays the jitter test ignores: load on
/// the machine only ever lengthens a delay, so the longest few are where a
/// constant client's noise lands.
pub const JITTER_TRIM: usize = 2;
/// The fewest runs that must have retried for the jitter test to judge.
pub const JITTER_MIN_SAMPLES: usize = 6;
/// The width of the narrowest jitter the test is calibrated for: a draw
/// over 75 to 100 % of the 500 ms first ceiling.
pub const NARROW_JITTER_WIDTH: Duration = Duration::from_millis(125);

/// A resend after a lost connection that arrives within this long of the
/// reset is *immediate*. A client drawing full jitter under the 500 ms
/// first ceiling waits longer with probability 0.9 ([`RESEND_WAIT_P`]);
/// load only lengthens a wait, so it never makes a waiting client look
/// immediate.
pub const IMMEDIATE: Duration = Duration::from_millis(50);
/// The least probability that a conforming client's resend waits past
/// [`IMMEDIATE`] (`1 - 50 ms / 500 ms`).
pub const RESEND_WAIT_P: f64 = 0.9;
/// The largest false-alarm rate the zero-backoff test accepts for a
/// conforming client.
pub const ZERO_BACKOFF_MAX_FALSE_ALARM: f64 = 1e-4;

/// The clause the command's exit code is checked against: its caller must
/// be handed the final answer as it is.
pub const EXIT_CHECK: &str = "idem.client.outcome";

/// What every verdict is measured against.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The client's configured overall deadline.
    pub deadline: Duration,
    /// Where the API reads the key.
    pub keys: KeySource,
    /// Whether the client retried a transient answer in any run of this
    /// check: only a client that retries shows, by not retrying, that it
    /// stopped for a hint past its deadline.
    pub retrier: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            deadline: DEFAULT_DEADLINE,
            keys: KeySource::default(),
            retrier: true,
        }
    }
}

impl Limits {
    /// How far past the deadline a run may end and still meet it
    /// (process exit, scheduling): 1 s or 5 % of the deadline.
    pub fn tolerance(&self) -> Duration {
        (self.deadline / 20).max(Duration::from_secs(1))
    }

    /// How long past the deadline the kit lets a run go before it kills it:
    /// 5 s or a quarter of the deadline.
    pub fn grace(&self) -> Duration {
        (self.deadline / 4).max(Duration::from_secs(5))
    }

    /// The request count past which the kit kills a run: attempts are then
    /// unbounded for any purpose.
    pub fn attempt_ceiling(&self) -> usize {
        MAX_SENDS + 5
    }
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

/// Whether `k` (after unquoting) is a key the contract's grammar accepts:
/// 1 to 255 visible ASCII characters (`idem.key.syntax`).
pub fn key_syntax_ok(raw: &str) -> bool {
    let k = record::unquote(raw);
    (1..=255).contains(&k.len()) && k.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

/// Every verdict one run supports on its own.
pub fn judge_run(sc: &Scenario, r: &RunRecord, lim: &Limits) -> Vec<CheckReport> {
    let mut out = Vec::new();
    let a = &r.attempts;
    if a.is_empty() {
        return out;
    }
    if lim.keys.is_contracts() {
        interop(r, &mut out);
    }
    // idem.client.auto-key: judged once, on the plain success.
    if sc.id == scenario::PREFLIGHT && a[0].non_idempotent() {
        let key = lim.keys.key(&a[0]);
        out.push(check_as(
            clause!("idem.client.auto-key"),
            Consequence::SecondEffect,
            key.is_some(),
            format!(
                "a POST carries a key ({}) minted before the first attempt",
                lim.keys.describe()
            ),
            match key {
                Some(k) => format!("the first attempt carried key {k}"),
                None => format!(
                    "{} {} was sent without a key in the {}",
                    a[0].method,
                    a[0].path,
                    lim.keys.describe()
                ),
            },
        ));
    }
    if a.len() >= 2 {
        keys_on_retries(r, &lim.keys, &mut out);
    }
    answers_and_retries(r, lim, &mut out);
    out.push(judge_deadline(sc, r, lim));
    out.extend(judge_deadline_header(sc, r, lim));
    if let Some(c) = judge_attempt_cap(sc, r, lim) {
        out.push(c);
    }
    if let Some(c) = judge_max_attempts(sc, r, lim) {
        out.push(c);
    }
    if let Some(c) = judge_exit(r) {
        out.push(c);
    }
    out
}

/// `idem.key.header` and `idem.key.syntax`: where the key travels and how
/// it is spelt, when the API reads it where the contract says. Header names
/// compare case-insensitively, as HTTP says; a lower-case
/// `idempotency-key` is the same header.
fn interop(r: &RunRecord, out: &mut Vec<CheckReport>) {
    let keys = KeySource::default();
    let mut wrong_header: Option<String> = None;
    let mut bad_key: Option<String> = None;
    let mut any_key = false;
    for (i, x) in r.attempts.iter().enumerate() {
        for (n, _) in &x.headers {
            let l = n.to_ascii_lowercase();
            if l != "idempotency-key" && l.contains("idempot") && wrong_header.is_none() {
                wrong_header = Some(format!("attempt {} sent the key in header {n}", i + 1));
            }
        }
        let found = keys.raw_keys(x);
        any_key |= !found.is_empty();
        if bad_key.is_none() {
            if found.len() > 1 {
                bad_key = Some(format!(
                    "attempt {} sent Idempotency-Key {} times: {}",
                    i + 1,
                    found.len(),
                    found.join(" | ")
                ));
            } else if let Some(k) = found.first()
                && !key_syntax_ok(k)
            {
                bad_key = Some(format!(
                    "attempt {} sent key {k:?} ({} characters after unquoting)",
                    i + 1,
                    record::unquote(k).len()
                ));
            }
        }
    }
    if any_key || wrong_header.is_some() {
        out.push(check_as(
            clause!("idem.key.header"),
            Consequence::Spelling,
            wrong_header.is_none(),
            "the key travels in the Idempotency-Key header (any letter case)",
            wrong_header.unwrap_or_else(|| "every key was in Idempotency-Key".to_owned()),
        ));
    }
    if any_key {
        out.push(check_as(
            clause!("idem.key.syntax"),
            Consequence::Spelling,
            bad_key.is_none(),
            "one header, 1 to 255 visible ASCII characters (bare or a quoted Structured-Field string)",
            bad_key.unwrap_or_else(|| "every key fits the grammar".to_owned()),
        ));
    }
}

/// The tracing-id headers ([`record::TRACING_HEADERS`]) the run's first
/// attempt sent and every later attempt resent unchanged: what a key-less
/// SDK may believe makes its retries safe.
pub fn resent_tracing_ids(r: &RunRecord) -> Vec<String> {
    let Some((first, rest)) = r.attempts.split_first() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (name, value) in &first.headers {
        if record::is_tracing_header(name)
            && !rest.is_empty()
            && rest
                .iter()
                .all(|x| x.header_values(name).first() == Some(&value.as_str()))
            && !out.contains(name)
        {
            out.push(name.clone());
        }
    }
    out
}

/// `idem.client.same-key` and `idem.client.no-key-no-retry`.
fn keys_on_retries(r: &RunRecord, ks: &KeySource, out: &mut Vec<CheckReport>) {
    let a = &r.attempts;
    let keys: Vec<Option<String>> = a.iter().map(|x| ks.key(x)).collect();
    // A retry with no key is judged by idem.client.no-key-no-retry; this
    // clause is about a retry with a different key.
    let first_keyed = keys.iter().flatten().next();
    let changed = keys
        .iter()
        .enumerate()
        .find(|(_, k)| matches!((k, first_keyed), (Some(k), Some(f)) if k != f));
    if let Some(k0) = first_keyed {
        let distinct = {
            let mut d: Vec<&String> = keys.iter().flatten().collect();
            d.sort();
            d.dedup();
            d.len()
        };
        let dropped = keys.iter().skip(1).filter(|k| k.is_none()).count();
        let mut c = check_as(
            clause!("idem.client.same-key"),
            Consequence::SecondEffect,
            changed.is_none(),
            format!("every attempt of the operation carries key {k0}"),
            match changed {
                Some((i, Some(k))) => format!("attempt {} carried a different key, {k}", i + 1),
                _ if dropped > 0 => format!(
                    "no attempt carried another key; {dropped} retr(y/ies) carried none (judged under idem.client.no-key-no-retry)"
                ),
                _ => format!("all {} attempts carried {k0}", a.len()),
            },
        );
        if changed.is_some() {
            c.headline = Some(format!(
                "one operation sent {distinct} different keys over {} attempts: each retry is a new operation to the server",
                a.len()
            ));
        }
        out.push(c);
    }
    if a[0].non_idempotent() {
        let keyless = a
            .iter()
            .enumerate()
            .skip(1)
            .find(|(i, _)| keys[*i].is_none());
        let tracing = resent_tracing_ids(r);
        let mut c = check_as(
            clause!("idem.client.no-key-no-retry"),
            Consequence::SecondEffect,
            keyless.is_none(),
            format!(
                "a POST without a key (in the {}) is never sent again once it may have been sent",
                ks.describe()
            ),
            match keyless {
                Some((i, x)) => format!(
                    "attempt {} resent {} {} without a key after attempt {} reached the server ({}){}",
                    i + 1,
                    x.method,
                    x.path,
                    i,
                    a[i - 1].answer.describe(),
                    if tracing.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; it resent {} unchanged, a tracing id no server deduplicates on, not a key",
                            tracing.join(", ")
                        )
                    }
                ),
                None => "every retry carried a key".to_owned(),
            },
        );
        if let Some((i, _)) = keyless {
            c.headline = Some(format!(
                "a key-less {} was sent again after {}: the server may now run it twice",
                a[0].method,
                a[i - 1].answer.describe()
            ));
        }
        out.push(c);
    }
}

/// `idem.client.allowlist`, `idem.client.500-with-key` and
/// `idem.client.retry-after`: each answer against what followed it.
fn answers_and_retries(r: &RunRecord, lim: &Limits, out: &mut Vec<CheckReport>) {
    let a = &r.attempts;
    let first = a.first().map_or(Duration::ZERO, |x| x.at);
    for (i, x) in a.iter().enumerate() {
        let next = a.get(i + 1);
        match x.answer.retry() {
            Retry::Final | Retry::NotTransient => {
                // Retried with its key, a final answer is refused or
                // replayed again by a conforming server: behaviour, not a
                // second effect (a key-less or fresh-key retry is caught
                // by the key checks, as safety).
                out.push(check_as(
                    clause!("idem.client.allowlist"),
                    Consequence::Behaviour,
                    next.is_none(),
                    format!("{} is final: not retried", x.answer.describe()),
                    match next {
                        Some(n) => format!(
                            "retried {} after it, {} later, {}",
                            x.answer.describe(),
                            secs(n.at.saturating_sub(x.at)),
                            match (lim.keys.key(x), lim.keys.key(n)) {
                                (Some(k), Some(l)) if k == l => "with the same key".to_owned(),
                                (_, None) => "without a key".to_owned(),
                                _ => "with another key".to_owned(),
                            }
                        ),
                        None => "not retried".to_owned(),
                    },
                ));
            }
            Retry::WithKeyOnly => {
                if let Some(n) = next {
                    let ok = lim.keys.key(n).is_some() && lim.keys.key(x).is_some();
                    let mut c = check_at(
                        clause!("idem.client.500-with-key"),
                        Level::Must,
                        Consequence::SecondEffect,
                        ok,
                        "a 500 is retried only with an idempotency key",
                        if ok {
                            "retried with the key".to_owned()
                        } else {
                            "retried the 500 without a key".to_owned()
                        },
                    );
                    if !ok {
                        c.headline =
                            Some("a key-less request that got a 500 was sent again".into());
                    }
                    out.push(c);
                }
            }
            _ => {}
        }
        if let Some(c) = judge_hint(r, i, first, lim) {
            out.push(c);
        }
    }
}

/// `idem.client.retry-after` for the hint on attempt `i`, if it had one:
/// not applicable when nothing followed it that shows whether it was
/// honoured (no retry after an ordinary hint; a client that ran past its
/// deadline waiting for a hint past it, which `idem.client.deadline`
/// counts, once).
fn judge_hint(r: &RunRecord, i: usize, first: Duration, lim: &Limits) -> Option<CheckReport> {
    let x = &r.attempts[i];
    let (
        Answer::Status {
            retry_after: Some(hint),
            ..
        },
        Some(floor),
    ) = (&x.answer, x.not_before)
    else {
        return None;
    };
    let next = r.attempts.get(i + 1);
    let date = !hint.trim().bytes().all(|b| b.is_ascii_digit());
    let tol = if date {
        DATE_TOLERANCE
    } else {
        RETRY_AFTER_TOLERANCE
    };
    let past_deadline = floor.saturating_sub(first) > lim.deadline;
    let answered = x.answered.unwrap_or(x.at);
    let (ok, observed) = match (next, past_deadline) {
        (Some(n), false) => (
            n.at + tol >= floor,
            format!(
                "retried {} after the answer; the hint asked for {}",
                secs(n.at.saturating_sub(answered)),
                secs(floor.saturating_sub(answered))
            ),
        ),
        // It never retried: nothing shows whether it would have waited.
        (None, false) => return None,
        (Some(n), true) => {
            let honoured = n.at + tol >= floor;
            if honoured && deadline_breach(r, lim).is_some() {
                // It waited the hint out, as a floor, past a deadline it
                // does not have: the deadline's finding, counted there.
                return None;
            }
            (
                honoured,
                format!(
                    "retried {} after a hint that lands past its deadline, instead of stopping",
                    secs(n.at.saturating_sub(answered))
                ),
            )
        }
        (None, true) => {
            if deadline_breach(r, lim).is_some() {
                // It waited for the hint, as a floor, and had no deadline
                // to stop it: the deadline's finding, counted there only.
                return None;
            }
            let took = r.ended.saturating_sub(answered);
            if took <= STOP_AT_ONCE && !lim.retrier {
                // A client that never retries stops after any answer.
                return None;
            }
            (
                took <= STOP_AT_ONCE,
                format!("stopped {} after the answer", secs(took)),
            )
        }
    };
    let permitted = if past_deadline {
        format!(
            "Retry-After: {hint} lands past the {} deadline: stop at once (within {}) and hand over the response",
            secs(lim.deadline),
            secs(STOP_AT_ONCE)
        )
    } else {
        format!(
            "Retry-After: {hint} is the least delay: no retry before {} after the answer (tolerance {})",
            secs(floor.saturating_sub(answered)),
            secs(tol)
        )
    };
    let mut c = check_as(
        clause!("idem.client.retry-after"),
        Consequence::Behaviour,
        ok,
        permitted,
        observed,
    );
    if !ok {
        c.headline = Some(if past_deadline {
            format!(
                "Retry-After: {hint} lands past the deadline, and the client did not stop at once"
            )
        } else {
            format!("Retry-After: {hint} was undercut")
        });
    }
    Some(c)
}

/// What the client did past its deadline (plus the tolerance), measured
/// from its first attempt, if anything: sent an attempt, kept waiting on
/// one, or was still running (asleep, or killed by the kit). Judged by the
/// client's acts, never by how close the run came to the kit's kill bound.
pub fn deadline_breach(r: &RunRecord, lim: &Limits) -> Option<String> {
    let first = r.first()?;
    let allowed = lim.deadline + lim.tolerance();
    let bound = first + allowed;
    let since = |t: Duration| secs(t.saturating_sub(first));
    if let Some((i, x)) = r.attempts.iter().enumerate().find(|(_, x)| x.at > bound) {
        return Some(format!(
            "sent attempt {} {} after its first attempt",
            i + 1,
            since(x.at)
        ));
    }
    if let Some((i, x, until)) = r.attempts.iter().enumerate().find_map(|(i, x)| {
        let until = x.client_gave_up.unwrap_or(r.ended);
        (x.answer == Answer::Held && until > bound).then_some((i, x, until))
    }) {
        return Some(format!(
            "was still waiting on attempt {} (sent {} after the first, never answered) {} after its first attempt{}",
            i + 1,
            since(x.at),
            since(until),
            match r.exit {
                Exit::Killed(Kill::PastDeadline) => "; killed by the kit (total time unbounded)",
                _ => "",
            }
        ));
    }
    if r.ended > bound {
        return Some(match r.exit {
            Exit::Killed(_) => format!(
                "was still running {} after its first attempt, {} attempt(s) sent; killed by the kit (total time unbounded)",
                since(r.ended),
                r.attempts.len()
            ),
            _ => format!(
                "was still running {} after its first attempt: it slept or waited past its deadline",
                since(r.ended)
            ),
        });
    }
    None
}

/// `idem.client.deadline` for one run.
pub fn judge_deadline(sc: &Scenario, r: &RunRecord, lim: &Limits) -> CheckReport {
    let first = r.first().unwrap_or_default();
    let breach = deadline_breach(r, lim);
    let mut c = check_as(
        clause!("idem.client.deadline"),
        Consequence::Behaviour,
        breach.is_none(),
        format!(
            "one overall deadline ({}, tolerance {}) from the first attempt: no attempt sent, none waited on and no sleep running after it",
            secs(lim.deadline),
            secs(lim.tolerance())
        ),
        breach.clone().unwrap_or_else(|| {
            format!(
                "finished {} after its first attempt",
                secs(r.ended.saturating_sub(first))
            )
        }),
    );
    if let Some(b) = breach {
        c.headline = Some(format!("{}: the client {b}", sc.id));
    }
    c
}

/// The `Request-Deadline-Ms` value each attempt carried (`None`: none, or
/// one that breaks the grammar, which a server ignores).
fn deadline_values(r: &RunRecord) -> Vec<Option<Duration>> {
    r.attempts
        .iter()
        .map(|a| {
            a.headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(REQUEST_DEADLINE_MS))
                .and_then(|(_, v)| parse_request_deadline_ms(v))
        })
        .collect()
}

/// `idem.client.deadline-header` (SHOULD: on every attempt) and, for a
/// client that sends it, `idem.client.deadline-header-truthful` (MUST: no
/// value more than the first one less the time since, nor more than the
/// deadline). Times are arrivals at the kit, so a value may look up to the
/// difference of two attempts' transit times too large: the tolerance is
/// the deadline's own (1 s or 5 %), and only a clearer excess is a finding.
pub fn judge_deadline_header(sc: &Scenario, r: &RunRecord, lim: &Limits) -> Vec<CheckReport> {
    let values = deadline_values(r);
    let Some(first) = r.attempts.first() else {
        return Vec::new();
    };
    let missing: Vec<usize> = (0..values.len()).filter(|&i| values[i].is_none()).collect();
    let mut out = vec![check_as(
        clause!("idem.client.deadline-header"),
        Consequence::Behaviour,
        missing.is_empty(),
        format!(
            "every attempt carries {REQUEST_DEADLINE_MS}: what is left of the deadline, in milliseconds"
        ),
        if missing.is_empty() {
            format!("all {} attempt(s) carried it", values.len())
        } else {
            format!(
                "{} of {} attempt(s) carried no valid {REQUEST_DEADLINE_MS} (attempt {})",
                missing.len(),
                values.len(),
                missing
                    .iter()
                    .map(|i| (i + 1).to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    )];
    let sent: Vec<(usize, Duration)> = values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.map(|v| (i, v)))
        .collect();
    let Some(&(i0, v0)) = sent.first() else {
        return out;
    };
    let t0 = r.attempts[i0].at;
    let tol = lim.tolerance();
    let mut excess: Option<String> = None;
    if v0 > lim.deadline + tol {
        excess = Some(format!(
            "attempt {} claimed {} left, more than its {} deadline",
            i0 + 1,
            secs(v0),
            secs(lim.deadline)
        ));
    }
    for &(i, v) in &sent[1..] {
        let since = r.attempts[i].at.saturating_sub(t0);
        let left = v0.saturating_sub(since);
        if excess.is_none() && v > left + tol {
            excess = Some(format!(
                "attempt {} claimed {} left, {} after attempt {} claimed {}: at most {} was left",
                i + 1,
                secs(v),
                secs(since),
                i0 + 1,
                secs(v0),
                secs(left)
            ));
        }
    }
    let list: Vec<String> = values
        .iter()
        .map(|v| v.map_or("-".to_owned(), |v| v.as_millis().to_string()))
        .collect();
    let mut c = check_as(
        clause!("idem.client.deadline-header-truthful"),
        Consequence::Behaviour,
        excess.is_none(),
        format!(
            "each value at most the first less the time since it (tolerance {}), and the first at most the {} deadline",
            secs(tol),
            secs(lim.deadline)
        ),
        excess.clone().unwrap_or_else(|| {
            format!(
                "values (ms) {}, first attempt at {}",
                list.join(", "),
                secs(first.at)
            )
        }),
    );
    if let Some(e) = excess {
        c.headline = Some(format!(
            "{}: {e}; the server is told of time its caller will not give it",
            sc.id
        ));
    }
    out.push(c);
    out
}

/// `idem.client.attempt-cap`: a bound by count, every request counted,
/// whatever the deadline allows. Only what the client sent is judged: more
/// than [`MAX_SENDS`] requests breaks the default bound, and a run the kit
/// killed for sending more than [`Limits::attempt_ceiling`] shows none. A
/// client that stops at 4 to 10 requests keeps this MUST and is found, if
/// at all, under the SHOULD of `idem.client.max-attempts`. Judged in the
/// `limits` scenarios, and wherever the bound was broken.
pub fn judge_attempt_cap(sc: &Scenario, r: &RunRecord, lim: &Limits) -> Option<CheckReport> {
    let sent = r.attempts.len();
    let killed = r.exit == Exit::Killed(Kill::TooManyAttempts);
    let bounded = sent <= MAX_SENDS && !killed;
    if bounded && sc.family() != "limits" {
        return None;
    }
    let mut c = check_as(
        clause!("idem.client.attempt-cap"),
        Consequence::Behaviour,
        bounded,
        format!(
            "at most {MAX_SENDS} requests for one operation, every request counted (a 409 in flight and a lost connection included), however much of the deadline is left"
        ),
        if killed {
            format!(
                "{sent} requests for one operation, still retrying when the kit killed it at {}: attempts bounded by the deadline alone",
                lim.attempt_ceiling()
            )
        } else {
            format!("{sent} request(s) for one operation")
        },
    );
    if !bounded {
        c.headline = Some(format!(
            "{}: {sent} requests for one operation; a fleet of such clients multiplies an outage by as much",
            sc.id
        ));
    }
    Some(c)
}

/// `idem.client.max-attempts`: 409s in flight may go uncounted. Judged in
/// the `limits` scenarios, and wherever the cap was broken.
pub fn judge_max_attempts(sc: &Scenario, r: &RunRecord, lim: &Limits) -> Option<CheckReport> {
    let a = &r.attempts;
    let counted = a
        .iter()
        .filter(|x| x.answer.retry() != Retry::InFlight)
        .count();
    let capped = counted <= MAX_ATTEMPTS && a.len() <= MAX_SENDS;
    let too_many = r.exit == Exit::Killed(Kill::TooManyAttempts);
    if capped && !too_many && sc.family() != "limits" {
        return None;
    }
    let resets = a
        .iter()
        .filter(|x| matches!(x.answer, Answer::ResetAfterRead | Answer::ResetBeforeRead))
        .count();
    Some(check_as(
        clause!("idem.client.max-attempts"),
        Consequence::Behaviour,
        capped && !too_many,
        format!(
            "at most {MAX_ATTEMPTS} attempts (a 409 in flight may go uncounted; a lost connection counts) and at most {MAX_SENDS} requests per operation"
        ),
        format!(
            "{counted} counted attempt(s), {} request(s){}{}",
            a.len(),
            if resets > 0 {
                format!(", {resets} of them lost to a reset")
            } else {
                String::new()
            },
            if too_many {
                format!(
                    "; killed after {} requests (attempts unbounded)",
                    lim.attempt_ceiling()
                )
            } else {
                String::new()
            }
        ),
    ))
}

/// The command's exit code against its final answer ([`EXIT_CHECK`]): exit
/// 0 (a closure's `true`) iff the last attempt got a 2xx. A command that
/// got its 2xx and reports failure tells its caller an operation failed
/// that took effect; one that reports success after a final failure tells
/// it one took effect that did not. Neither misleads the server, so the
/// class is [`Consequence::Behaviour`]'s; the level is a MUST, because the
/// kit's other verdicts read the run as the command reports it. Not judged
/// for a run the kit killed.
pub fn judge_exit(r: &RunRecord) -> Option<CheckReport> {
    let Exit::Finished { ok, code } = r.exit else {
        return None;
    };
    let last = r.attempts.last()?;
    let got = matches!(last.answer, Answer::Success { .. });
    let said = match code {
        Some(c) => format!("exited {c}"),
        None if ok => "returned success".to_owned(),
        None => "returned failure".to_owned(),
    };
    let pass = ok == got;
    let observed = format!(
        "its final answer (attempt {}) was {}, and it {said}{}",
        r.attempts.len(),
        last.answer.describe(),
        match (pass, got) {
            (true, _) => String::new(),
            (false, true) =>
                ": its caller is told the operation failed after it took effect (is the success body what the SDK expects? see --success-body)"
                    .to_owned(),
            (false, false) =>
                ": its caller is told the operation succeeded when its last answer was a failure"
                    .to_owned(),
        }
    );
    Some(verdict::check_as(
        clause!("idem.client.outcome"),
        Consequence::Behaviour,
        pass,
        "the command exits 0 iff its final answer was a 2xx",
        observed,
    ))
}

/// P(Binomial(n, p) >= k).
pub fn binomial_at_least(n: usize, p: f64, k: usize) -> f64 {
    let choose = |n: usize, k: usize| -> f64 {
        (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
    };
    (k..=n)
        .map(|j| choose(n, j) * p.powi(j as i32) * (1.0 - p).powi((n - j) as i32))
        .sum()
}

/// The chance that a client drawing its first delay uniformly over a range
/// `width` wide is judged constant by the jitter test: the spread of `n`
/// independent draws, without the [`JITTER_TRIM`] longest
/// (`X(n-trim) - X(1)`, a Beta(n-trim-1, trim+2) variable), falls below
/// `threshold`. With r = threshold / width that is
/// P(Binomial(n, r) >= n - trim - 1). `width` is the first ceiling for full
/// jitter, a quarter of it for jitter over 75 to 100 % of it.
pub fn false_alarm_rate(n: usize, threshold: Duration, width: Duration) -> f64 {
    if n < JITTER_TRIM + 2 || width.is_zero() {
        return 1.0;
    }
    let r = (threshold.as_secs_f64() / width.as_secs_f64()).min(1.0);
    binomial_at_least(n, r, n - JITTER_TRIM - 1)
}

/// The first retry delay of one run: from the first answer (or reset) to
/// the second attempt's arrival. `None` when the run did not retry.
pub fn first_delay(r: &RunRecord) -> Option<Duration> {
    let (a, b) = (r.attempts.first()?, r.attempts.get(1)?);
    Some(b.at.saturating_sub(a.answered.unwrap_or(a.at)))
}

/// The jitter test over the first retry delays of repeated runs of one
/// scenario: `None` when fewer than [`JITTER_MIN_SAMPLES`] runs retried
/// (nothing to judge), else the checks of `idem.client.backoff-jitter` and
/// `idem.client.no-unjittered-backoff`.
pub fn judge_jitter(delays: &[Duration], runs: usize) -> Option<Vec<CheckReport>> {
    if delays.len() < JITTER_MIN_SAMPLES {
        return None;
    }
    let mut sorted = delays.to_vec();
    sorted.sort();
    let kept = &sorted[..sorted.len() - JITTER_TRIM];
    let (lo, hi) = (kept[0], kept[kept.len() - 1]);
    let spread = hi - lo;
    let ok = spread >= JITTER_THRESHOLD;
    let n = delays.len();
    let full = false_alarm_rate(n, JITTER_THRESHOLD, FIRST_CEILING);
    let narrow = false_alarm_rate(n, JITTER_THRESHOLD, NARROW_JITTER_WIDTH);
    let list: Vec<String> = delays
        .iter()
        .map(|d| format!("{:.3}", d.as_secs_f64()))
        .collect();
    let observed = format!(
        "{n} of {runs} runs retried; first delays (s): {}; the {} shortest spread over {} ({} to {})",
        list.join(", "),
        kept.len(),
        secs(spread),
        secs(lo),
        secs(hi)
    );
    let permitted = format!(
        "random delays: the first delays of repeated runs, without the {JITTER_TRIM} longest, spread over at least {} (at {n} runs a client is wrongly judged constant with probability {full:.1e} for full jitter under the default 500 ms first ceiling, {narrow:.1e} for jitter over 75 to 100 % of it)",
        secs(JITTER_THRESHOLD)
    );
    let mut out = vec![
        check_as(
            clause!("idem.client.backoff-jitter"),
            Consequence::Behaviour,
            ok,
            permitted.clone(),
            observed.clone(),
        ),
        check_as(
            clause!("idem.client.no-unjittered-backoff"),
            Consequence::Behaviour,
            ok,
            permitted,
            observed,
        ),
    ];
    if !ok {
        for c in &mut out {
            c.headline = Some(format!(
                "{} of {n} first delays lie within {} of each other ({} to {}): a fleet retries in lock-step",
                kept.len(),
                secs(spread),
                secs(lo),
                secs(hi)
            ));
        }
    }
    Some(out)
}

/// The zero-backoff test's allowance for `n` resends: the largest `k` such
/// that a conforming client (each resend waiting past [`IMMEDIATE`] with
/// probability [`RESEND_WAIT_P`]) makes more than `k` immediate resends
/// with probability at most [`ZERO_BACKOFF_MAX_FALSE_ALARM`]. Equivalently
/// the finding needs at most `n - k - 1` waiting resends, where
/// P(Binomial(n, 0.9) <= n - k - 1) <= 1e-4. `k == n` means `n` resends
/// cannot be judged.
pub fn immediate_allowance(n: usize) -> usize {
    (0..=n)
        .find(|&k| zero_backoff_false_alarm(n, k) <= ZERO_BACKOFF_MAX_FALSE_ALARM * (1.0 + 1e-9))
        .unwrap_or(n)
}

/// The false-alarm rate of the zero-backoff test with allowance `k` over
/// `n` resends: P(more than `k` of them immediate) for a conforming client.
pub fn zero_backoff_false_alarm(n: usize, k: usize) -> f64 {
    binomial_at_least(n, 1.0 - RESEND_WAIT_P, k + 1)
}

/// The zero-backoff test over the resend delays (a reset to the resend's
/// arrival) of the repeated [`scenario::RESET_RUNS_ID`] runs: `None` when
/// too few runs resent to judge, else a check of
/// `idem.client.backoff-jitter` (a resend at once is no random delay).
pub fn judge_zero_backoff(delays: &[Duration], runs: usize) -> Option<CheckReport> {
    let n = delays.len();
    let k = immediate_allowance(n);
    if k >= n {
        return None;
    }
    let immediate = delays.iter().filter(|d| **d < IMMEDIATE).count();
    let rate = zero_backoff_false_alarm(n, k);
    let list: Vec<String> = delays
        .iter()
        .map(|d| format!("{:.3}", d.as_secs_f64()))
        .collect();
    let ok = immediate <= k;
    let mut c = check_as(
        clause!("idem.client.backoff-jitter"),
        Consequence::Behaviour,
        ok,
        format!(
            "a resend after a lost connection waits its random backoff: at most {k} of {n} resends within {} of the reset (a full-jitter client under the 500 ms first ceiling waits longer with probability {RESEND_WAIT_P}, so is wrongly flagged with probability {rate:.1e})",
            secs(IMMEDIATE)
        ),
        format!(
            "{n} of {runs} runs resent after the reset; resend delays (s): {}; {immediate} within {}",
            list.join(", "),
            secs(IMMEDIATE)
        ),
    );
    if !ok {
        c.headline = Some(format!(
            "{immediate} of {n} resends after a lost connection went at once, without a backoff"
        ));
    }
    Some(c)
}

/// `idem.client.key-per-operation` across runs: each run is a new
/// operation, so no two runs may share a first-attempt key. `runs` holds
/// (run label, its key) for every run that sent one.
pub fn judge_key_per_operation(runs: &[(String, String)]) -> Option<CheckReport> {
    if runs.len() < 2 {
        return None;
    }
    let mut seen: std::collections::BTreeMap<&str, &str> = std::collections::BTreeMap::new();
    let mut dup: Option<String> = None;
    for (label, key) in runs {
        if let Some(other) = seen.insert(key.as_str(), label.as_str())
            && dup.is_none()
        {
            dup = Some(format!("{other} and {label} both sent key {key}"));
        }
    }
    let mut c = check_as(
        clause!("idem.client.key-per-operation"),
        Consequence::AnotherRequestsAnswer,
        dup.is_none(),
        "every operation (each run of the command) mints its own key",
        dup.clone()
            .unwrap_or_else(|| format!("{} operations, {} distinct keys", runs.len(), seen.len())),
    );
    if let Some(d) = dup {
        c.headline = Some(format!(
            "two different operations shared a key ({d}): the server answers the second with the first's result"
        ));
    }
    Some(c)
}

/// The worst verdict among checks (pass when there are none).
pub fn worst(checks: &[CheckReport]) -> Verdict {
    checks
        .iter()
        .map(|c| c.verdict)
        .max()
        .unwrap_or(Verdict::Pass)
}

#[cfg(test)]
mod tests;
