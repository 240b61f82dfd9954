//! Renderers of the one report data model ([`idem_spec::report::Report`]).

use idem_spec::report::{CaseReport, Report, Verdict};

pub mod console;
pub mod html;
pub mod junit;

/// The JSON report (schema: `spec/generated/schemas/Report.schema.json`).
pub fn json(report: &Report) -> Result<String, crate::Error> {
    serde_json::to_string_pretty(report).map_err(|e| crate::Error::Report(e.to_string()))
}

/// The explanation of a non-passing case, as lines: each failing check with
/// its clause text, what was permitted and what was observed, then the
/// numbered narrative, then the curl reproduction.
pub fn explain(c: &CaseReport) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(r) = &c.reason {
        out.push(format!("reason: {r}"));
    }
    if let Some(w) = &c.waived {
        out.push(format!("waived: {w}"));
    }
    for k in c.checks.iter().filter(|k| k.verdict != Verdict::Pass) {
        let text =
            idem_spec::clauses::get(&k.clause).map_or("(unknown clause)", |cl| cl.text.as_str());
        out.push(format!(
            "{} {} [{}]: {text}",
            k.level.as_str(),
            k.clause,
            k.verdict
        ));
        out.push(format!("  permitted: {}", k.permitted));
        out.push(format!("  observed:  {}", k.observed));
    }
    if !c.narrative.is_empty() {
        out.push("what happened:".to_owned());
        for (i, l) in c.narrative.iter().enumerate() {
            out.push(format!("  {}. {l}", i + 1));
        }
    }
    if !c.reproduction.is_empty() && c.verdict != Verdict::Unsupported {
        out.push("reproduce (secrets redacted):".to_owned());
        for l in &c.reproduction {
            for line in l.lines() {
                out.push(format!("  {line}"));
            }
        }
    }
    out
}
