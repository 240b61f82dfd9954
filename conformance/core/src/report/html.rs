//! One self-contained HTML page: header with the run's identity, the
//! clause × verdict matrix, every case with its explanation. No external
//! assets, so the file can be attached to a CI run or mailed.

use std::fmt::Write;

use idem_spec::report::{Report, Verdict};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn color(v: Verdict) -> &'static str {
    match v {
        Verdict::Pass => "#2e7d32",
        Verdict::NonStrict => "#9e9d24",
        Verdict::Unsupported => "#757575",
        Verdict::Inconclusive => "#ef6c00",
        Verdict::Error => "#6a1b9a",
        Verdict::Fail => "#c62828",
    }
}

fn badge(v: Verdict) -> String {
    format!(
        "<span class=\"b\" style=\"background:{}\">{}</span>",
        color(v),
        v.as_str()
    )
}

/// Renders the HTML report. Every count sits in an element with a
/// `data-count` attribute (`id="count-..."`), so tools (and the kit's own
/// agreement test) can read them without parsing prose.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    head(&mut s, r);
    identity(&mut s, r);
    counts(&mut s, r);
    clause_matrix(&mut s, r);
    case_table(&mut s, r);
    waivers(&mut s, r);
    let _ = writeln!(s, "</body></html>");
    s
}

/// The page head and style, the result, a harness error and the safety
/// headlines.
fn head(s: &mut String, r: &Report) {
    let _ = write!(
        s,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>idem-conformance: {}</title>\
<style>body{{font:14px system-ui,sans-serif;margin:2em;max-width:1200px}}table{{border-collapse:collapse;width:100%}}\
td,th{{border:1px solid #ddd;padding:4px 6px;text-align:left;vertical-align:top}}th{{background:#f5f5f5}}\
.b{{color:#fff;border-radius:3px;padding:1px 6px;font-size:12px;white-space:nowrap}}pre{{background:#f7f7f7;padding:8px;overflow-x:auto;white-space:pre-wrap}}\
details{{margin:4px 0}}code{{font-size:12px}}.unsafe{{color:#c62828;font-weight:bold}}</style></head><body>",
        esc(&r.target)
    );
    let sm = &r.summary;
    let _ = write!(
        s,
        "<h1>{}</h1><p id=\"result\" data-result=\"{}\"><b>{}</b> (exit {})</p>",
        esc(&r.target),
        sm.result.as_str(),
        sm.result.as_str(),
        sm.exit_code
    );
    if let Some(why) = &r.harness_error {
        let _ = write!(
            s,
            "<p id=\"harness-error\"><b>HARNESS ERROR before any case:</b> {}</p>",
            esc(why)
        );
    }
    if !r.headlines.is_empty() {
        let _ = write!(s, "<ul id=\"headlines\">");
        for h in &r.headlines {
            let _ = write!(
                s,
                "<li class=\"unsafe\">UNSAFE <code>{}</code> (<a href=\"#{}\">{}</a>): {}</li>",
                esc(&h.clause),
                esc(&h.case),
                esc(&h.case),
                esc(&h.text)
            );
        }
        let _ = write!(s, "</ul>");
    }
}

/// The run's identity: target, versions, manifest hash, seed, traffic.
fn identity(s: &mut String, r: &Report) {
    let _ = write!(
        s,
        "<table><tr><th>base URL</th><td>{}</td><th>profile</th><td>{}</td></tr>\
<tr><th>kit</th><td>{}</td><th>contract</th><td>{}</td></tr><tr><th>manifest sha256</th><td><code>{}</code></td><th>run / seed</th><td>{} / {}</td></tr>\
<tr><th>requests</th><td>{} ({} state-changing)</td><th>duration</th><td>{:.1} s</td></tr></table>",
        esc(&r.base_url),
        esc(&r.profile),
        esc(&r.kit_version),
        esc(&r.contract_version),
        esc(&r.manifest_sha256),
        esc(&r.run_id),
        r.seed,
        r.requests,
        r.side_effect_requests,
        r.duration_ms as f64 / 1000.0
    );
}

/// Every count of the summary, each readable by its `data-count`.
fn counts(s: &mut String, r: &Report) {
    let sm = &r.summary;
    let count = |id: &str, n: usize, label: &str| {
        format!("<span id=\"count-{id}\" data-count=\"{n}\">{n} {label}</span>")
    };
    let cv = &sm.clause_verdicts;
    let _ = write!(
        s,
        "<p>cases: {}, {}, {}, {}, {}, {}</p><p>clauses: {}, {}, {}, {}</p><p>failed clauses: {}, {}, {}</p>",
        count("cases-pass", sm.pass as usize, "pass"),
        count("cases-fail", sm.fail as usize, "fail"),
        count("cases-non-strict", sm.non_strict as usize, "non-strict"),
        count(
            "cases-inconclusive",
            sm.inconclusive as usize,
            "inconclusive"
        ),
        count("cases-unsupported", sm.unsupported as usize, "unsupported"),
        count("cases-error", sm.error as usize, "error"),
        count("clauses-pass", cv.pass as usize, "pass"),
        count("clauses-fail", cv.fail as usize, "fail"),
        count("clauses-non-strict", cv.non_strict as usize, "non-strict"),
        count("clauses-unchecked", cv.unchecked as usize, "unchecked"),
        count("safety", sm.unsafe_clauses.len(), "safety"),
        count("semantics", sm.semantics_clauses.len(), "semantics"),
        count("interop", sm.interop_clauses.len(), "interop"),
    );
}

/// The clause × verdict matrix, each clause linked to its cases.
fn clause_matrix(s: &mut String, r: &Report) {
    let _ = write!(
        s,
        "<h2>Clauses</h2><table><tr><th>clause</th><th>level</th><th>class</th><th>verdict</th><th>cases</th><th>title</th></tr>"
    );
    for c in &r.clauses {
        let links: Vec<String> = c
            .cases
            .iter()
            .map(|id| format!("<a href=\"#{0}\">{0}</a>", esc(id)))
            .collect();
        let verdict = match (c.verdict, &c.failed_class) {
            (Some(v), Some(class)) => format!("{} <small>{class}</small>", badge(v)),
            (Some(v), None) => badge(v),
            (None, _) => format!(
                "<span class=\"b\" style=\"background:#bdbdbd\">unchecked</span> <small>{}</small>",
                esc(c.unchecked.as_deref().unwrap_or(""))
            ),
        };
        let _ = write!(
            s,
            "<tr class=\"clause-row\" data-verdict=\"{}\"><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            c.verdict.map_or("unchecked", |v| v.as_str()),
            esc(&c.id),
            c.level.as_str(),
            c.class.as_str(),
            verdict,
            links.join(" "),
            esc(&c.title)
        );
    }
    let _ = write!(s, "</table>");
}

/// One row per case, its explanation folded (open when it failed or
/// errored).
fn case_table(s: &mut String, r: &Report) {
    let _ = write!(
        s,
        "<h2>Cases</h2><table><tr><th>case</th><th>tier</th><th>verdict</th><th>clauses</th><th>title</th></tr>"
    );
    for c in &r.cases {
        let waived = c
            .waived
            .as_ref()
            .map_or(String::new(), |w| format!(" <i>(waived: {})</i>", esc(w)));
        let class = super::failed_class(c)
            .filter(|_| c.verdict == Verdict::Fail)
            .map_or(String::new(), |_| {
                format!(
                    " <small>{}</small>",
                    esc(super::failed_clauses(c).trim_start_matches(" — "))
                )
            });
        let _ = write!(
            s,
            "<tr id=\"{0}\" class=\"case-row\" data-verdict=\"{6}\"><td><code>{0}</code></td><td>{1}</td><td>{2}{7}{3}</td><td><code>{4}</code></td><td>{5}",
            esc(&c.id),
            c.tier.as_str(),
            badge(c.verdict),
            waived,
            esc(&c.clauses.join(", ")),
            esc(&c.title),
            c.verdict.as_str(),
            class
        );
        let lines = super::explain(c);
        if !lines.is_empty() {
            let open = if matches!(c.verdict, Verdict::Fail | Verdict::Error) {
                " open"
            } else {
                ""
            };
            let _ = write!(
                s,
                "<details{open}><summary>details</summary><pre>{}</pre></details>",
                esc(&lines.join("\n"))
            );
        }
        let _ = write!(s, "</td></tr>");
    }
    let _ = write!(s, "</table>");
}

/// The manifest's waivers, what each matched and whether it is stale.
fn waivers(s: &mut String, r: &Report) {
    if !r.waivers.is_empty() {
        let _ = write!(
            s,
            "<h2>Waivers</h2><table><tr><th>case</th><th>reason</th><th>matched</th><th>stale</th></tr>"
        );
        for w in &r.waivers {
            let _ = write!(
                s,
                "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&w.case),
                esc(&w.reason),
                esc(&w.matched.join(", ")),
                esc(w.stale.as_deref().unwrap_or(""))
            );
        }
        let _ = write!(s, "</table>");
    }
}
