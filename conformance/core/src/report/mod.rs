//! Renderers of the one report data model ([`idem_spec::report::Report`]).
//! Every count any of them prints comes from the report's summary and
//! clause matrix, so console, JSON, JUnit and HTML always agree
//! (`tests/zoo.rs` compares them).

use idem_spec::clauses::Class;
use idem_spec::report::{CaseReport, CheckReport, Report, Verdict};

pub mod console;
pub mod html;
pub mod junit;

/// The JSON report (schema: `spec/generated/schemas/Report.schema.json`).
pub fn json(report: &Report) -> Result<String, crate::Error> {
    serde_json::to_string_pretty(report).map_err(|e| crate::Error::Report(e.to_string()))
}

/// The worst class among a case's failing (MUST) checks.
pub fn failed_class(c: &CaseReport) -> Option<Class> {
    c.checks
        .iter()
        .filter(|k| k.verdict == Verdict::Fail)
        .map(|k| k.class)
        .max()
}

/// A case's tag: `[PASS]`, `[FAIL safety]`, `[NON-STRICT]`.
pub fn tag(c: &CaseReport) -> String {
    match failed_class(c) {
        Some(class) if c.verdict == Verdict::Fail => format!("[FAIL {class}]"),
        _ => format!("[{}]", c.verdict.as_str().to_uppercase()),
    }
}

/// ` — failed: scope.caller (safety), replay.verbatim (semantics)`: the
/// clauses a failing case broke, each with its worst class, so the case
/// table names what failed rather than only the worst class.
pub fn failed_clauses(c: &CaseReport) -> String {
    let mut worst: std::collections::BTreeMap<&str, Class> = std::collections::BTreeMap::new();
    for k in c.checks.iter().filter(|k| k.verdict == Verdict::Fail) {
        let e = worst.entry(k.clause.as_str()).or_insert(k.class);
        *e = (*e).max(k.class);
    }
    if worst.is_empty() {
        return String::new();
    }
    let mut v: Vec<(&str, Class)> = worst.into_iter().collect();
    v.sort_by_key(|(id, class)| (std::cmp::Reverse(*class), *id));
    let list: Vec<String> = v
        .iter()
        .map(|(id, class)| format!("{} ({class})", id.trim_start_matches("idem.")))
        .collect();
    format!(" — failed: {}", list.join(", "))
}

fn explain_checks(out: &mut Vec<String>, checks: &[CheckReport], indent: &str) {
    // Worst first: a safety failure leads, whatever order the case ran in.
    let mut failing: Vec<&CheckReport> = checks
        .iter()
        .filter(|k| k.verdict != Verdict::Pass)
        .collect();
    failing.sort_by_key(|k| (std::cmp::Reverse(k.verdict), std::cmp::Reverse(k.class)));
    for k in failing {
        let text =
            idem_spec::clauses::get(&k.clause).map_or("(unknown clause)", |cl| cl.text.as_str());
        out.push(format!(
            "{indent}{} {} [{}, {}]: {text}",
            k.level.as_str(),
            k.clause,
            k.verdict,
            k.class
        ));
        out.push(format!("{indent}  permitted: {}", k.permitted));
        out.push(format!("{indent}  observed:  {}", k.observed));
    }
}

fn explain_story(
    out: &mut Vec<String>,
    narrative: &[String],
    reproduction: &[String],
    indent: &str,
) {
    if !narrative.is_empty() {
        out.push(format!("{indent}what happened:"));
        for (i, l) in narrative.iter().enumerate() {
            out.push(format!("{indent}  {}. {l}", i + 1));
        }
    }
    if !reproduction.is_empty() {
        out.push(format!("{indent}reproduce (secrets redacted):"));
        for l in reproduction {
            for line in l.lines() {
                out.push(format!("{indent}  {line}"));
            }
        }
    }
}

/// The explanation of a non-passing case, as lines: each failing check with
/// its clause text, class, what was permitted and what was observed, then
/// the numbered narrative, then the curl reproduction; and, after an
/// automatic re-run, the re-run's own evidence the same way.
pub fn explain(c: &CaseReport) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(r) = &c.reason {
        out.push(format!("reason: {r}"));
    }
    if let Some(w) = &c.waived {
        out.push(format!("waived: {w}"));
    }
    explain_checks(&mut out, &c.checks, "");
    if c.verdict != Verdict::Unsupported {
        explain_story(&mut out, &c.narrative, &c.reproduction, "");
    }
    if let Some(again) = &c.rerun {
        out.push(format!(
            "automatic re-run: {}{}",
            again.verdict,
            again
                .reason
                .as_ref()
                .map_or(String::new(), |r| format!(" ({r})"))
        ));
        explain_checks(&mut out, &again.checks, "  ");
        explain_story(&mut out, &again.narrative, &again.reproduction, "  ");
    }
    out
}
