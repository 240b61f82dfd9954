//! Verdicts over recorded attempts: pure functions of a [`RunRecord`] (and,
//! for the cross-run clauses, of several), so every rule is table-tested
//! without a server or a client.
//!
//! Levels and classes follow the clause table, with two deliberate
//! exceptions, both written down where they are made: a final 4xx retried
//! is a *safety* failure of `idem.client.allowlist` (the reading:
//! against an API that does not store 4xx, the retry executes an operation
//! the server already gave a final answer to; the server side calls "a
//! final outcome executed again" safety too), and a key-less retry of a 500
//! breaks `idem.client.500-with-key` at MUST level (the clause is a MAY for
//! a keyed retry and a MUST NOT otherwise).

use std::time::Duration;

use idem_spec::clauses::{Class, Level};
use idem_spec::report::{CheckReport, Verdict};

use super::record::{Answer, Exit, Kill, Retry, RunRecord};
use super::scenario::{self, Scenario};

/// The contract's default attempt cap (`idem.client.max-attempts`).
pub const MAX_ATTEMPTS: usize = 3;
/// The contract's default ceiling on requests sent per operation.
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
/// runs must spread over at least this much, or the backoff is judged
/// constant.
pub const JITTER_THRESHOLD: Duration = Duration::from_millis(100);
/// The fewest runs that must have retried for the jitter test to judge.
pub const JITTER_MIN_SAMPLES: usize = 6;

/// What every verdict is measured against.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The client's configured overall deadline.
    pub deadline: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            deadline: DEFAULT_DEADLINE,
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

/// One check, its verdict from `ok` and the level (a missed SHOULD is
/// non-strict, a broken MUST fails).
pub fn check(
    clause: &str,
    level: Level,
    class: Class,
    ok: bool,
    permitted: impl Into<String>,
    observed: impl Into<String>,
) -> CheckReport {
    CheckReport {
        clause: clause.to_owned(),
        level,
        class,
        verdict: match (ok, level) {
            (true, _) => Verdict::Pass,
            (false, Level::Must) => Verdict::Fail,
            (false, _) => Verdict::NonStrict,
        },
        permitted: permitted.into(),
        observed: observed.into(),
        headline: None,
    }
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

/// Whether `k` (after unquoting) is a key the contract's grammar accepts:
/// 1 to 255 visible ASCII characters (`idem.key.syntax`).
pub fn key_syntax_ok(raw: &str) -> bool {
    let k = super::record::unquote(raw);
    (1..=255).contains(&k.len()) && k.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

/// Every verdict one run supports on its own.
pub fn judge_run(sc: &Scenario, r: &RunRecord, lim: &Limits) -> Vec<CheckReport> {
    let mut out = Vec::new();
    let a = &r.attempts;
    let Some(first) = r.first() else {
        return out;
    };
    interop(r, &mut out);
    // idem.client.auto-key: judged once, on the plain success.
    if sc.id == scenario::PREFLIGHT && a[0].non_idempotent() {
        let c = check(
            "idem.client.auto-key",
            Level::Should,
            Class::Safety,
            a[0].key().is_some(),
            "a POST carries an Idempotency-Key minted before the first attempt",
            match a[0].key() {
                Some(k) => format!("the first attempt carried key {k}"),
                None => format!(
                    "{} {} was sent without an Idempotency-Key",
                    a[0].method, a[0].path
                ),
            },
        );
        out.push(c);
    }
    if a.len() >= 2 {
        keys_on_retries(r, &mut out);
    }
    answers_and_retries(r, lim, &mut out);
    // idem.client.deadline.
    let tol = lim.tolerance();
    let span = r.ended.saturating_sub(first);
    let late = a
        .iter()
        .find(|x| x.at.saturating_sub(first) > lim.deadline + tol);
    let killed = r.exit == Exit::Killed(Kill::PastDeadline);
    let ok = !killed && span <= lim.deadline + tol && late.is_none();
    let mut c = check(
        "idem.client.deadline",
        Level::Must,
        Class::Semantics,
        ok,
        format!(
            "one overall deadline ({}, tolerance {}) bounds the operation from its first attempt",
            secs(lim.deadline),
            secs(tol)
        ),
        if killed {
            format!(
                "still running {} after its first attempt; killed (total time unbounded, {} attempts)",
                secs(span),
                a.len()
            )
        } else if let Some(x) = late {
            format!(
                "started an attempt {} after the first",
                secs(x.at.saturating_sub(first))
            )
        } else {
            format!("finished {} after its first attempt", secs(span))
        },
    );
    if !ok {
        c.headline = Some(format!(
            "{}: the operation ran {} past the first attempt, deadline {}",
            sc.id,
            secs(span),
            secs(lim.deadline)
        ));
    }
    out.push(c);
    // idem.client.max-attempts: 409s in flight may go uncounted.
    let counted = a
        .iter()
        .filter(|x| x.answer.retry() != Retry::InFlight)
        .count();
    let capped = counted <= MAX_ATTEMPTS && a.len() <= MAX_SENDS;
    let too_many = r.exit == Exit::Killed(Kill::TooManyAttempts);
    if !capped || too_many || sc.family() == "limits" {
        out.push(check(
            "idem.client.max-attempts",
            Level::Should,
            Class::Semantics,
            capped && !too_many,
            format!(
                "at most {MAX_ATTEMPTS} attempts (a 409 in flight may go uncounted) and at most {MAX_SENDS} requests per operation"
            ),
            format!(
                "{counted} counted attempt(s), {} request(s){}",
                a.len(),
                if too_many {
                    format!(
                        "; killed after {} requests (attempts unbounded)",
                        lim.attempt_ceiling()
                    )
                } else {
                    String::new()
                }
            ),
        ));
    }
    out
}

/// `idem.key.header` and `idem.key.syntax`: where the key travels and how
/// it is spelt. Header names compare case-insensitively, as HTTP says; a
/// lower-case `idempotency-key` is the same header.
fn interop(r: &RunRecord, out: &mut Vec<CheckReport>) {
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
        let keys = x.keys();
        any_key |= !keys.is_empty();
        if bad_key.is_none() {
            if keys.len() > 1 {
                bad_key = Some(format!(
                    "attempt {} sent Idempotency-Key {} times: {}",
                    i + 1,
                    keys.len(),
                    keys.join(" | ")
                ));
            } else if let Some(k) = keys.first()
                && !key_syntax_ok(k)
            {
                bad_key = Some(format!(
                    "attempt {} sent key {k:?} ({} characters after unquoting)",
                    i + 1,
                    super::record::unquote(k).len()
                ));
            }
        }
    }
    if any_key || wrong_header.is_some() {
        out.push(check(
            "idem.key.header",
            Level::Must,
            Class::Interop,
            wrong_header.is_none(),
            "the key travels in the Idempotency-Key header (any letter case)",
            wrong_header.unwrap_or_else(|| "every key was in Idempotency-Key".to_owned()),
        ));
    }
    if any_key {
        out.push(check(
            "idem.key.syntax",
            Level::Must,
            Class::Interop,
            bad_key.is_none(),
            "one header, 1 to 255 visible ASCII characters (bare or a quoted Structured-Field string)",
            bad_key.unwrap_or_else(|| "every key fits the grammar".to_owned()),
        ));
    }
}

/// `idem.client.same-key` and `idem.client.no-key-no-retry`.
fn keys_on_retries(r: &RunRecord, out: &mut Vec<CheckReport>) {
    let a = &r.attempts;
    let keys: Vec<Option<String>> = a.iter().map(|x| x.key()).collect();
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
        let mut c = check(
            "idem.client.same-key",
            Level::Must,
            Class::Safety,
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
            .find(|(_, x)| x.key().is_none());
        let mut c = check(
            "idem.client.no-key-no-retry",
            Level::Must,
            Class::Safety,
            keyless.is_none(),
            "a POST without a key is never sent again once it may have been sent",
            match keyless {
                Some((i, x)) => format!(
                    "attempt {} resent {} {} without a key after attempt {} reached the server ({})",
                    i + 1,
                    x.method,
                    x.path,
                    i,
                    a[i - 1].answer.describe()
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
                let fin = x.answer.retry() == Retry::Final;
                let mut c = check(
                    "idem.client.allowlist",
                    Level::Must,
                    if fin { Class::Safety } else { Class::Semantics },
                    next.is_none(),
                    format!("{} is final: not retried", x.answer.describe()),
                    match next {
                        Some(n) => format!(
                            "retried {} after it, {} later",
                            x.answer.describe(),
                            secs(n.at.saturating_sub(x.at))
                        ),
                        None => "not retried".to_owned(),
                    },
                );
                if next.is_some() {
                    c.headline = Some(format!(
                        "a final {} was retried: the server said the request cannot succeed as sent",
                        x.answer.describe()
                    ));
                }
                out.push(c);
            }
            Retry::WithKeyOnly => {
                if let Some(n) = next {
                    let ok = n.key().is_some() && x.key().is_some();
                    let mut c = check(
                        "idem.client.500-with-key",
                        Level::Must,
                        Class::Safety,
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
        let (
            Answer::Status {
                retry_after: Some(hint),
                ..
            },
            Some(floor),
        ) = (&x.answer, x.not_before)
        else {
            continue;
        };
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
            (None, false) => (true, "did not retry".to_owned()),
            (Some(n), true) => (
                false,
                format!(
                    "retried {} after a hint that lands past its deadline, instead of stopping",
                    secs(n.at.saturating_sub(answered))
                ),
            ),
            (None, true) => {
                let took = r.ended.saturating_sub(answered);
                (
                    took <= STOP_AT_ONCE && !matches!(r.exit, Exit::Killed(_)),
                    match r.exit {
                        Exit::Killed(_) => format!(
                            "kept waiting {} for a hint past its deadline; killed",
                            secs(took)
                        ),
                        _ => format!("stopped {} after the answer", secs(took)),
                    },
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
        let mut c = check(
            "idem.client.retry-after",
            Level::Must,
            Class::Semantics,
            ok,
            permitted,
            observed,
        );
        if !ok {
            c.headline = Some(format!("Retry-After: {hint} was not honoured"));
        }
        out.push(c);
    }
}

/// How many of the longest first delays the jitter test ignores: load on
/// the machine only ever lengthens a delay, so the longest few are where a
/// constant client's noise lands.
pub const JITTER_TRIM: usize = 2;

/// The chance that a client drawing its first delay with full jitter under
/// `ceiling` is judged constant by the jitter test: the spread of `n`
/// independent uniform draws on [0, ceiling], without the
/// [`JITTER_TRIM`] longest (`X(n-trim) - X(1)`, a Beta(n-trim-1, trim+2)
/// variable), falls below `threshold`. With r = threshold / ceiling that is
/// P(Binomial(n, r) >= n - trim - 1).
pub fn false_alarm_rate(n: usize, threshold: Duration, ceiling: Duration) -> f64 {
    if n < JITTER_TRIM + 2 || ceiling.is_zero() {
        return 1.0;
    }
    let r = (threshold.as_secs_f64() / ceiling.as_secs_f64()).min(1.0);
    let choose = |n: usize, k: usize| -> f64 {
        (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
    };
    (n - JITTER_TRIM - 1..=n)
        .map(|j| choose(n, j) * r.powi(j as i32) * (1.0 - r).powi((n - j) as i32))
        .sum()
}

/// The first retry delay of one run: from the first answer to the second
/// attempt's arrival. `None` when the run did not retry.
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
    let spread = sorted[sorted.len() - 1 - JITTER_TRIM] - sorted[0];
    let ok = spread >= JITTER_THRESHOLD;
    let rate = false_alarm_rate(delays.len(), JITTER_THRESHOLD, FIRST_CEILING);
    let list: Vec<String> = delays
        .iter()
        .map(|d| format!("{:.3}", d.as_secs_f64()))
        .collect();
    let observed = format!(
        "{} of {runs} runs retried; first delays (s): {}; spread without the {JITTER_TRIM} longest {}",
        delays.len(),
        list.join(", "),
        secs(spread)
    );
    let permitted = format!(
        "random delays: the first delays of repeated runs, without the {JITTER_TRIM} longest, spread over at least {} (a full-jitter client with the default 500 ms base is wrongly judged constant with probability {rate:.1e} at {} runs)",
        secs(JITTER_THRESHOLD),
        delays.len()
    );
    let mut out = vec![
        check(
            "idem.client.backoff-jitter",
            Level::Should,
            Class::Semantics,
            ok,
            permitted.clone(),
            observed.clone(),
        ),
        check(
            "idem.client.no-unjittered-backoff",
            Level::Should,
            Class::Semantics,
            ok,
            permitted,
            observed,
        ),
    ];
    if !ok {
        for c in &mut out {
            c.headline = Some(format!(
                "the same delay every time ({} spread over {} runs): a fleet retries in lock-step",
                secs(spread),
                delays.len()
            ));
        }
    }
    Some(out)
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
    let mut c = check(
        "idem.client.key-per-operation",
        Level::Must,
        Class::Safety,
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
