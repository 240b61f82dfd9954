//! The conformance report: one data model every reporter renders (console,
//! JSON, JUnit XML, HTML). Its JSON Schema is generated
//! (`spec/generated/schemas/Report.schema.json`) so CI systems can consume
//! the JSON report without depending on the kit.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::clauses::{Class, Level};

/// The verdict of one case, and of one clause for one target.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
    utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Every check held.
    Pass,
    /// A SHOULD (or a declared MAY) was missed; conformant but not strict.
    NonStrict,
    /// A required capability (hook) was not declared; never counted as pass.
    Unsupported,
    /// The outcome could not be known (e.g. a timeout); never counted as pass.
    Inconclusive,
    /// A harness or network problem, kept apart from target failures.
    Error,
    /// A MUST was broken.
    Fail,
}

impl Verdict {
    /// Every verdict, best first.
    pub const ALL: [Verdict; 6] = [
        Self::Pass,
        Self::NonStrict,
        Self::Unsupported,
        Self::Inconclusive,
        Self::Error,
        Self::Fail,
    ];

    /// The kebab-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::NonStrict => "non-strict",
            Self::Unsupported => "unsupported",
            Self::Inconclusive => "inconclusive",
            Self::Error => "error",
            Self::Fail => "fail",
        }
    }
}

impl Verdict {
    /// Whether a case with this verdict says the target was not shown to
    /// keep its MUSTs: broken (`Fail`), unknown (`Inconclusive`) or not
    /// judged for the harness's fault (`Error`). What a test of a target
    /// expected to conform requires none of.
    pub fn unsettled(self) -> bool {
        matches!(self, Self::Fail | Self::Error | Self::Inconclusive)
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The overall result of a run, and what its exit code says.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// No MUST clause failed. Exit code 0.
    Conforms,
    /// A MUST clause of class `safety` failed: the API can execute twice,
    /// leak a response, or answer one request with another's outcome.
    /// Exit code 1, whatever else happened.
    Unsafe,
    /// The harness could not do its job (a case errored, the budget ran
    /// out) and no safety failure was found. Exit code 2.
    HarnessError,
    /// Only `semantics` or `interop` MUST clauses failed: the API behaves
    /// safely but differs from the contract in behaviour or spelling.
    /// Exit code 3.
    Deviates,
}

impl Outcome {
    /// The process exit code.
    pub fn exit_code(self) -> i32 {
        match self {
            Self::Conforms => 0,
            Self::Unsafe => 1,
            Self::HarnessError => 2,
            Self::Deviates => 3,
        }
    }

    /// The upper-case word reports lead with.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Conforms => "CONFORMS",
            Self::Unsafe => "UNSAFE",
            Self::HarnessError => "HARNESS ERROR",
            Self::Deviates => "DEVIATES",
        }
    }
}

/// One line per unwaived safety failure, with the number that proves it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
pub struct Headline {
    /// The clause broken.
    pub clause: String,
    /// The case that saw it.
    pub case: String,
    /// E.g. "32 concurrent requests with one key: 12 effects".
    pub text: String,
}

/// One run of the kit against one target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
pub struct Report {
    /// Version of the kit that produced the report.
    pub kit_version: String,
    /// The contract version checked (`idem_spec::CONTRACT_VERSION`).
    pub contract_version: String,
    /// The profile the target declared (`reference`, ..., or `custom`).
    pub profile: String,
    /// SHA-256 (hex) of the manifest file's bytes, so results are only
    /// compared like with like.
    pub manifest_sha256: String,
    /// The target's name.
    pub target: String,
    /// The target's base URL.
    pub base_url: String,
    /// The run-unique prefix carried by every key and marker.
    pub run_id: String,
    /// Seed of the generated (property) phase.
    pub seed: u64,
    /// Start of the run, seconds since the Unix epoch.
    pub started_unix_secs: u64,
    /// Wall time of the run, milliseconds.
    pub duration_ms: u64,
    /// State-changing requests sent (the side-effect budget's meter).
    pub side_effect_requests: u64,
    /// Every request sent.
    pub requests: u64,
    /// What the preflight verified before any case ran.
    #[serde(default)]
    pub preflight: Vec<String>,
    /// Why the run stopped before its cases (a manifest the kit could not
    /// use, a failed preflight), in one sentence; the result is then
    /// `harness-error` and `cases` is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harness_error: Option<String>,
    /// One line per unwaived safety failure, worst first; reports lead
    /// with these.
    #[serde(default)]
    pub headlines: Vec<Headline>,
    /// One entry per case, in plan order.
    pub cases: Vec<CaseReport>,
    /// One entry per server clause: the clause × verdict matrix.
    pub clauses: Vec<ClauseReport>,
    /// Every waiver of the manifest and whether it still applies.
    pub waivers: Vec<WaiverReport>,
    /// Counts and the exit code.
    pub summary: Summary,
}

impl Report {
    /// The ids of the cases whose verdict is [`Verdict::unsettled`], in
    /// report order.
    pub fn unsettled_cases(&self) -> Vec<&str> {
        self.cases
            .iter()
            .filter(|c| c.verdict.unsettled())
            .map(|c| c.id.as_str())
            .collect()
    }
}

/// One case's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
pub struct CaseReport {
    /// Stable case ID, `family.name`.
    pub id: String,
    /// The clause family (module) the case belongs to.
    pub family: String,
    /// One line: what the case does.
    pub title: String,
    /// The strongest level among the clauses the case checks.
    pub tier: Level,
    /// Clause IDs the case cites.
    pub clauses: Vec<String>,
    /// The verdict.
    pub verdict: Verdict,
    /// Why the verdict is not `pass` (inconclusive reason, missing hook, error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Per-check results; the failing ones explain the verdict.
    pub checks: Vec<CheckReport>,
    /// The steps as a numbered narrative (R1, R2, ...).
    pub narrative: Vec<String>,
    /// `curl` commands reproducing the requests, secrets redacted.
    pub reproduction: Vec<String>,
    /// The waiver's reason when a waiver matched this case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waived: Option<String>,
    /// Wall time, milliseconds.
    pub duration_ms: u64,
    /// State-changing requests the case sent (its share of the side-effect
    /// budget; a re-run's are counted in `rerun`).
    #[serde(default)]
    pub side_effect_requests: u64,
    /// The automatic re-run of a failing case, with its own evidence; its
    /// verdict says whether the failure is stable or intermittent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun: Option<Rerun>,
}

/// The evidence of a failing case's automatic re-run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
pub struct Rerun {
    /// The re-run's own verdict (the case keeps the first run's).
    pub verdict: Verdict,
    /// Why the re-run's verdict is not `pass`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The re-run's checks.
    pub checks: Vec<CheckReport>,
    /// The re-run's narrative.
    pub narrative: Vec<String>,
    /// The re-run's curl reproductions.
    pub reproduction: Vec<String>,
    /// State-changing requests the re-run sent.
    #[serde(default)]
    pub side_effect_requests: u64,
}

/// One check inside a case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
pub struct CheckReport {
    /// The clause the check enforces.
    pub clause: String,
    /// The clause's level.
    pub level: Level,
    /// What this check's failure costs a caller: the clause's class, or a
    /// milder one when the check observed a milder consequence.
    pub class: Class,
    /// The verdict of this check.
    pub verdict: Verdict,
    /// What the contract (under the declared profile) permits.
    pub permitted: String,
    /// What the target did.
    pub observed: String,
    /// For a failure, one line with the number that proves it, e.g. "32
    /// concurrent requests with one key: 12 effects".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headline: Option<String>,
}

/// The verdict for one clause across every check made of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
pub struct ClauseReport {
    /// Clause ID.
    pub id: String,
    /// Clause level.
    pub level: Level,
    /// The clause's class.
    pub class: Class,
    /// The clause's one-line title.
    pub title: String,
    /// Worst verdict of the checks made of it (waived cases included);
    /// absent when no check produced one: a clause verdict exists only if
    /// a check produced it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
    /// The worst class among its unwaived failing (MUST) checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_class: Option<Class>,
    /// How many checks were made of it.
    pub checks: u32,
    /// The cases that cite it or checked it.
    pub cases: Vec<String>,
    /// Why there is no verdict: what the citing cases ended as, or that no
    /// case cites it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unchecked: Option<String>,
}

/// A waiver and its state after the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
pub struct WaiverReport {
    /// The waiver's case pattern.
    pub case: String,
    /// The waiver's reason.
    pub reason: String,
    /// Cases the pattern matched.
    pub matched: Vec<String>,
    /// Why the waiver is stale (matches nothing, or every matched case now
    /// passes); absent when it still applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale: Option<String>,
}

/// Counts per verdict and the process exit code.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
pub struct Summary {
    /// Cases that passed.
    pub pass: u32,
    /// Cases that missed only SHOULDs.
    pub non_strict: u32,
    /// Cases that could not run for lack of a hook.
    pub unsupported: u32,
    /// Cases whose outcome could not be known.
    pub inconclusive: u32,
    /// Cases that hit a harness error.
    pub error: u32,
    /// Cases that broke a MUST (waived ones included).
    pub fail: u32,
    /// MUST clauses with a failing, unwaived check.
    pub must_clauses_failed: Vec<String>,
    /// Of those, the clauses whose worst failing check is `safety`.
    pub unsafe_clauses: Vec<String>,
    /// ... `semantics`.
    pub semantics_clauses: Vec<String>,
    /// ... `interop`.
    pub interop_clauses: Vec<String>,
    /// SHOULD and MAY clauses with a missed, unwaived check (non-strict
    /// findings): a `--strict` run fails on them.
    #[serde(default)]
    pub non_strict_clauses: Vec<String>,
    /// Whether the run was `--strict`: non-strict findings then make the
    /// result DEVIATES.
    #[serde(default)]
    pub strict: bool,
    /// Clauses some check produced a verdict for, per verdict: the clause
    /// matrix's counts, which every report prints.
    pub clause_verdicts: ClauseCounts,
    /// Waivers reported stale.
    pub stale_waivers: u32,
    /// The overall result.
    pub result: Outcome,
    /// The result's exit code: 0 conforms, 1 unsafe, 2 harness error,
    /// 3 deviates.
    pub exit_code: i32,
}

/// Server clauses per verdict. A check is pass, fail (a MUST missed) or
/// non-strict (a SHOULD or MAY missed), so a clause is one of those or
/// unchecked.
#[derive(
    Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
pub struct ClauseCounts {
    /// Every check of the clause held.
    pub pass: u32,
    /// A MUST check failed.
    pub fail: u32,
    /// Only SHOULD or MAY checks failed.
    pub non_strict: u32,
    /// No check produced a verdict.
    pub unchecked: u32,
}

#[cfg(test)]
mod tests {
    use super::Verdict;

    #[test]
    fn only_fail_error_and_inconclusive_are_unsettled() {
        let unsettled: Vec<Verdict> = Verdict::ALL.into_iter().filter(|v| v.unsettled()).collect();
        assert_eq!(
            unsettled,
            [Verdict::Inconclusive, Verdict::Error, Verdict::Fail]
        );
    }
}
