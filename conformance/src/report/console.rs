//! The console report: one line per case, the explanation of every case
//! that did not pass, and the summary last (where CI logs end).

use std::fmt::Write;

use idem_spec::report::{Report, Verdict};

/// Renders the console report.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "idem-conformance {} against {} ({})",
        r.kit_version, r.target, r.base_url
    );
    let mut family = "";
    for c in &r.cases {
        if c.family != family {
            family = c.family.as_str();
            let _ = writeln!(s, "\n{family}");
        }
        let waived = if c.waived.is_some() { " (waived)" } else { "" };
        let _ = writeln!(
            s,
            "  {:<12} {:<26} {:<6} {}{waived}",
            tag(c.verdict),
            c.id,
            c.tier.as_str(),
            c.title
        );
    }
    let details: Vec<_> = r
        .cases
        .iter()
        .filter(|c| !matches!(c.verdict, Verdict::Pass | Verdict::Unsupported))
        .collect();
    if !details.is_empty() {
        let _ = writeln!(s, "\n── details ──");
        for c in details {
            let _ = writeln!(s, "\n{} {} — {}", tag(c.verdict), c.id, c.title);
            for l in super::explain(c) {
                let _ = writeln!(s, "  {l}");
            }
        }
    }
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
    let by = |v: Verdict| r.clauses.iter().filter(|c| c.verdict == v).count();
    let sm = &r.summary;
    let _ = writeln!(s, "\n── summary ──");
    let _ = writeln!(
        s,
        "cases:   {} pass, {} fail, {} non-strict, {} inconclusive, {} unsupported, {} error",
        sm.pass, sm.fail, sm.non_strict, sm.inconclusive, sm.unsupported, sm.error
    );
    let _ = writeln!(
        s,
        "clauses: {} pass, {} fail, {} non-strict, {} inconclusive, {} unsupported, {} error (of {} server clauses)",
        by(Verdict::Pass),
        by(Verdict::Fail),
        by(Verdict::NonStrict),
        by(Verdict::Inconclusive),
        by(Verdict::Unsupported),
        by(Verdict::Error),
        r.clauses.len()
    );
    if !sm.must_clauses_failed.is_empty() {
        let _ = writeln!(
            s,
            "MUST clauses failed: {}",
            sm.must_clauses_failed.join(", ")
        );
    }
    if sm.stale_waivers > 0 {
        let _ = writeln!(s, "stale waivers: {}", sm.stale_waivers);
    }
    let _ = writeln!(
        s,
        "kit {} · contract {} · profile {} · manifest sha256 {} · run {} · seed {} · {} requests ({} state-changing) in {} ms",
        r.kit_version,
        r.contract_version,
        r.profile,
        &r.manifest_sha256[..r.manifest_sha256.len().min(16)],
        r.run_id,
        r.seed,
        r.requests,
        r.side_effect_requests,
        r.duration_ms
    );
    let _ = writeln!(
        s,
        "result: {} (exit {})",
        match sm.exit_code {
            0 => "CONFORMS (no MUST clause failed)",
            1 => "DOES NOT CONFORM (a MUST clause failed)",
            _ => "HARNESS ERROR (see errors above)",
        },
        sm.exit_code
    );
    s
}

fn tag(v: Verdict) -> String {
    format!("[{}]", v.as_str().to_uppercase())
}
