//! The console report: the safety headlines first, one line per case, the
//! explanation of every case that did not pass, and the summary last (where
//! CI logs end).

use std::fmt::Write;

use idem_spec::report::{Report, Verdict};

use super::tag;

/// Renders the console report.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    header(&mut s, r);
    case_lines(&mut s, r);
    details(&mut s, r);
    unsupported(&mut s, r);
    waivers(&mut s, r);
    summary(&mut s, r);
    s
}

/// What was checked, the preflight, a harness error and the safety
/// headlines.
fn header(s: &mut String, r: &Report) {
    let _ = writeln!(
        s,
        "idem-conformance {} against {} ({})",
        r.kit_version, r.target, r.base_url
    );
    let _ = writeln!(
        s,
        "preflight: {} step(s) passed before any case ran",
        r.preflight.len()
    );
    if let Some(why) = &r.harness_error {
        let _ = writeln!(s, "\nHARNESS ERROR before any case: {why}");
    }
    if !r.headlines.is_empty() {
        let _ = writeln!(s);
        for h in &r.headlines {
            let _ = writeln!(s, "UNSAFE {} ({}): {}", h.clause, h.case, h.text);
        }
    }
}

/// One line per case, under its family.
fn case_lines(s: &mut String, r: &Report) {
    let mut family = "";
    for c in &r.cases {
        if c.family != family {
            family = c.family.as_str();
            let _ = writeln!(s, "\n{family}");
        }
        let waived = if c.waived.is_some() { " (waived)" } else { "" };
        let _ = writeln!(
            s,
            "  {:<17} {:<26} {:<6} {}{waived}{}",
            tag(c),
            c.id,
            c.tier.as_str(),
            c.title,
            super::failed_clauses(c)
        );
    }
}

/// The explanation of every case that neither passed nor was unsupported.
fn details(s: &mut String, r: &Report) {
    let details: Vec<_> = r
        .cases
        .iter()
        .filter(|c| !matches!(c.verdict, Verdict::Pass | Verdict::Unsupported))
        .collect();
    if !details.is_empty() {
        let _ = writeln!(s, "\n── details ──");
        for c in details {
            let _ = writeln!(s, "\n{} {} — {}", tag(c), c.id, c.title);
            for l in super::explain(c) {
                let _ = writeln!(s, "  {l}");
            }
        }
    }
}

/// The cases that could not run, each with why.
fn unsupported(s: &mut String, r: &Report) {
    let unsupported: Vec<_> = r
        .cases
        .iter()
        .filter(|c| c.verdict == Verdict::Unsupported)
        .collect();
    if !unsupported.is_empty() {
        let _ = writeln!(s, "\nunsupported (declare the hook to run them):");
        for c in unsupported {
            let _ = writeln!(s, "  {}: {}", c.id, c.reason.as_deref().unwrap_or(""));
        }
    }
}

/// The manifest's waivers, stale ones marked.
fn waivers(s: &mut String, r: &Report) {
    if !r.waivers.is_empty() {
        let _ = writeln!(s, "\nwaivers:");
        for w in &r.waivers {
            let _ = writeln!(
                s,
                "  {} — {}{}",
                w.case,
                w.reason,
                w.stale
                    .as_ref()
                    .map_or(String::new(), |x| format!(" [STALE: {x}]"))
            );
        }
    }
}

/// The counts, the failed clauses by class, the run's identity and the
/// result with its exit code: last, where CI logs end.
fn summary(s: &mut String, r: &Report) {
    let sm = &r.summary;
    let cv = &sm.clause_verdicts;
    let _ = writeln!(s, "\n── summary ──");
    let _ = writeln!(
        s,
        "cases:   {} pass, {} fail, {} non-strict, {} inconclusive, {} unsupported, {} error",
        sm.pass, sm.fail, sm.non_strict, sm.inconclusive, sm.unsupported, sm.error
    );
    let _ = writeln!(
        s,
        "clauses: {} pass, {} fail, {} non-strict, {} unchecked (of {} {} clauses)",
        cv.pass,
        cv.fail,
        cv.non_strict,
        cv.unchecked,
        r.clauses.len(),
        // The client check's matrix holds the client clauses (and the
        // key's wire clauses it judges).
        if r.profile == "client" {
            "client"
        } else {
            "server"
        }
    );
    for (class, list) in [
        ("safety", &sm.unsafe_clauses),
        ("semantics", &sm.semantics_clauses),
        ("interop", &sm.interop_clauses),
    ] {
        if !list.is_empty() {
            let _ = writeln!(s, "failed ({class}): {}", list.join(", "));
        }
    }
    if sm.stale_waivers > 0 {
        let _ = writeln!(s, "stale waivers: {}", sm.stale_waivers);
    }
    let _ = writeln!(
        s,
        "kit {} · contract {} · profile {} · manifest sha256 {} · run {} · seed {} · {} requests ({} state-changing) in {:.1} s",
        r.kit_version,
        r.contract_version,
        r.profile,
        &r.manifest_sha256[..r.manifest_sha256.len().min(16)],
        r.run_id,
        r.seed,
        r.requests,
        r.side_effect_requests,
        r.duration_ms as f64 / 1000.0
    );
    let _ = writeln!(
        s,
        "result: {} (exit {})",
        match sm.result {
            idem_spec::report::Outcome::Conforms => "CONFORMS (no MUST clause failed)",
            idem_spec::report::Outcome::Unsafe =>
                "UNSAFE (a safety clause failed: see the lines headed UNSAFE)",
            idem_spec::report::Outcome::HarnessError =>
                "HARNESS ERROR (the kit could not finish; see the errors above)",
            idem_spec::report::Outcome::Deviates =>
                "DEVIATES (behaves safely; semantics or interop clauses failed)",
        },
        sm.exit_code
    );
}
