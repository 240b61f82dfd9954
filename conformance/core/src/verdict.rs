//! The severity rule and the verdict of one check, for both checks.
//!
//! A check is made of a clause, whether the observation met it, what the
//! clause permits and what was observed. Its level comes from the clause
//! table; its class is the clause's class, or milder when the check names a
//! milder [`Consequence`] for what it saw (a check can never make a clause
//! worse than it is).

use idem_spec::clauses::{self, Class, Level};
use idem_spec::report::{CheckReport, Verdict};

use crate::clause::ClauseId;

/// What the behaviour a failed check observed can do to a correct
/// counterpart: the severity rule, once. Only the first three are safety.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consequence {
    /// One operation took effect twice, or can have: a duplicate executed, a
    /// key-less state-changing request resent after it may have been sent,
    /// a fresh key per attempt.
    SecondEffect,
    /// A request was answered with another request's stored outcome.
    AnotherRequestsAnswer,
    /// One caller's data was shown to another caller.
    CrossCaller,
    /// Broken behaviour that leaves nothing false believed about effects: a
    /// stored 5xx replayed, a final 4xx executed again or retried with its
    /// key, an ignored hint, a missing deadline, a refused or lost request.
    Behaviour,
    /// A spelling a counterpart may misread: a status, an error code, a
    /// header.
    Spelling,
}

impl Consequence {
    /// The class the severity rule gives this consequence.
    pub const fn class(self) -> Class {
        match self {
            Self::SecondEffect | Self::AnotherRequestsAnswer | Self::CrossCaller => Class::Safety,
            Self::Behaviour => Class::Semantics,
            Self::Spelling => Class::Interop,
        }
    }
}

/// The verdict of one check at `level`: a broken MUST fails, a missed
/// SHOULD or MAY is non-strict.
pub const fn of(ok: bool, level: Level) -> Verdict {
    match (ok, level) {
        (true, _) => Verdict::Pass,
        (false, Level::Must) => Verdict::Fail,
        (false, _) => Verdict::NonStrict,
    }
}

/// The clause's own level and class (MUST and safety for an ID the table
/// lacks, which [`ClauseId`] already rules out).
pub fn level_and_class(clause: ClauseId) -> (Level, Class) {
    clauses::get(clause.as_str()).map_or((Level::Must, Class::Safety), |c| (c.level, c.class))
}

/// One check of `clause` at the clause's own level and class.
pub fn check(
    clause: ClauseId,
    ok: bool,
    permitted: impl Into<String>,
    observed: impl Into<String>,
) -> CheckReport {
    let (level, class) = level_and_class(clause);
    build(clause, level, class, ok, permitted, observed)
}

/// One check of `clause` whose failure had the consequence `seen`: its
/// class is the milder of the clause's and the consequence's.
pub fn check_as(
    clause: ClauseId,
    seen: Consequence,
    ok: bool,
    permitted: impl Into<String>,
    observed: impl Into<String>,
) -> CheckReport {
    let (level, class) = level_and_class(clause);
    build(
        clause,
        level,
        class.min(seen.class()),
        ok,
        permitted,
        observed,
    )
}

/// One check at a level other than the clause's: for a clause that is a MAY
/// in one reading and a MUST NOT in another (`idem.client.500-with-key`: a
/// keyed retry of a 500 may happen, a key-less one must not). The class
/// follows `seen`, never worse than the clause's.
pub fn check_at(
    clause: ClauseId,
    level: Level,
    seen: Consequence,
    ok: bool,
    permitted: impl Into<String>,
    observed: impl Into<String>,
) -> CheckReport {
    let (_, class) = level_and_class(clause);
    build(
        clause,
        level,
        class.min(seen.class()),
        ok,
        permitted,
        observed,
    )
}

fn build(
    clause: ClauseId,
    level: Level,
    class: Class,
    ok: bool,
    permitted: impl Into<String>,
    observed: impl Into<String>,
) -> CheckReport {
    CheckReport {
        clause: clause.to_string(),
        level,
        class,
        verdict: of(ok, level),
        permitted: permitted.into(),
        observed: observed.into(),
        headline: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clause;

    #[test]
    fn only_effects_answers_and_leaks_are_safety() {
        let safety: Vec<_> = [
            Consequence::SecondEffect,
            Consequence::AnotherRequestsAnswer,
            Consequence::CrossCaller,
            Consequence::Behaviour,
            Consequence::Spelling,
        ]
        .into_iter()
        .filter(|c| c.class() == Class::Safety)
        .collect();
        assert_eq!(
            safety,
            [
                Consequence::SecondEffect,
                Consequence::AnotherRequestsAnswer,
                Consequence::CrossCaller
            ]
        );
    }

    #[test]
    fn a_check_is_never_worse_than_its_clause() {
        // idem.client.allowlist is semantics: a second effect named by a
        // check cannot make it safety.
        let c = check_as(
            clause!("idem.client.allowlist"),
            Consequence::SecondEffect,
            false,
            "",
            "",
        );
        assert_eq!((c.class, c.verdict), (Class::Semantics, Verdict::Fail));
        // ...while a milder consequence makes a safety clause milder.
        let c = check_as(
            clause!("idem.scope.caller"),
            Consequence::Behaviour,
            false,
            "",
            "",
        );
        assert_eq!(c.class, Class::Semantics);
    }

    #[test]
    fn levels_decide_fail_or_non_strict() {
        assert_eq!(of(false, Level::Must), Verdict::Fail);
        assert_eq!(of(false, Level::Should), Verdict::NonStrict);
        assert_eq!(of(false, Level::May), Verdict::NonStrict);
        assert_eq!(of(true, Level::Must), Verdict::Pass);
        let c = check_at(
            clause!("idem.client.500-with-key"),
            Level::Must,
            Consequence::SecondEffect,
            false,
            "",
            "",
        );
        assert_eq!(
            (c.level, c.verdict, c.class),
            (Level::Must, Verdict::Fail, Class::Safety)
        );
    }
}
