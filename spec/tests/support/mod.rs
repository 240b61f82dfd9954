//! File-system helpers shared by the `idem-spec-gen` binary and the spec
//! crate's tests: reading the book, comparing generated files, scanning the
//! workspace for clause citations, and rendering clause labels in the book.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use idem_spec::clauses::{self, Citation, CitationKind};

/// Files never scanned for citations: the scanner's own unit tests use
/// made-up IDs on purpose.
const CITATION_SCAN_EXCLUDES: [&str; 1] = ["spec/src/clauses.rs"];

/// Reads the book's pages in reading order: first the files SUMMARY.md links
/// to, in its order, then any other `.md` file, sorted (SUMMARY.md itself
/// excluded).
pub fn read_book(src: &Path) -> std::io::Result<Vec<(String, String)>> {
    let summary = std::fs::read_to_string(src.join("SUMMARY.md"))?;
    let mut order: Vec<String> = Vec::new();
    for part in summary.split("](").skip(1) {
        if let Some(end) = part.find(')') {
            let target = part[..end].trim_start_matches("./").to_owned();
            if target.ends_with(".md") && !order.contains(&target) {
                order.push(target);
            }
        }
    }
    let mut rest = Vec::new();
    collect(src, src, "md", &mut rest)?;
    rest.sort();
    for rel in rest {
        if rel != "SUMMARY.md" && !order.contains(&rel) {
            order.push(rel);
        }
    }
    order
        .into_iter()
        .filter(|rel| src.join(rel).is_file())
        .map(|rel| std::fs::read_to_string(src.join(&rel)).map(|t| (rel, t)))
        .collect()
}

fn collect(base: &Path, dir: &Path, ext: &str, out: &mut Vec<String>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() {
            if name == "target" || name.starts_with('.') || name == "generated" || name == "book" {
                continue;
            }
            collect(base, &path, ext, out)?;
        } else if path.extension().and_then(|e| e.to_str()) == Some(ext)
            && let Ok(rel) = path.strip_prefix(base)
        {
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
    Ok(())
}

/// Paths (relative to `dir`) whose committed content differs from the
/// freshly generated one, plus committed files that would no longer be
/// generated.
pub fn stale_files(dir: &Path, fresh: &BTreeMap<String, String>) -> Vec<String> {
    let mut stale = Vec::new();
    for (rel, text) in fresh {
        match std::fs::read_to_string(dir.join(rel)) {
            Ok(old) if &old == text => {}
            Ok(_) => stale.push(format!("{rel} (differs)")),
            Err(_) => stale.push(format!("{rel} (missing)")),
        }
    }
    let mut on_disk = Vec::new();
    if dir.exists() {
        let _ = collect(dir, dir, "json", &mut on_disk);
    }
    for rel in on_disk {
        if !fresh.contains_key(&rel) {
            stale.push(format!("{rel} (no longer generated)"));
        }
    }
    stale
}

/// Every clause citation in the workspace's Rust sources.
pub fn workspace_citations(root: &Path) -> std::io::Result<Vec<Citation>> {
    let mut files = Vec::new();
    // Every top-level folder with a Cargo.toml is a workspace member; reading
    // the folders (not a fixed list) means a new crate is scanned from day one.
    let mut members: Vec<String> = std::fs::read_dir(root)?
        .filter_map(Result::ok)
        .filter(|e| e.path().join("Cargo.toml").is_file())
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|name| !name.starts_with('.') && name != "target")
        .collect();
    members.sort();
    for member in members {
        let dir = root.join(&member);
        {
            let mut rels = Vec::new();
            collect(&dir, &dir, "rs", &mut rels)?;
            files.extend(rels.into_iter().map(|r| format!("{member}/{r}")));
        }
    }
    files.sort();
    let mut out = Vec::new();
    for rel in files {
        if CITATION_SCAN_EXCLUDES.contains(&rel.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(root.join(&rel))?;
        out.extend(clauses::find_citations(&rel, &text));
    }
    Ok(out)
}

/// The workspace root as seen from a test or the generator.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Rewrites every chapter's `content` in an mdBook JSON tree: clause labels
/// become linkable anchors with their citations, and the marker
/// `{{#idem-clause-index}}` becomes the clause tables, one per chapter,
/// headed by the chapter's name.
pub fn render_labels(node: &mut serde_json::Value, citations: &[Citation]) {
    let mut titles = BTreeMap::new();
    chapter_titles(node, &mut titles);
    render_labels_in(node, citations, &titles);
}

/// Every chapter's name by its source path (`keys.md` → "The key"): any
/// object with string `path` and `name` members.
fn chapter_titles(node: &serde_json::Value, out: &mut BTreeMap<String, String>) {
    match node {
        serde_json::Value::Object(map) => {
            if let (Some(serde_json::Value::String(path)), Some(serde_json::Value::String(name))) =
                (map.get("path"), map.get("name"))
            {
                out.insert(path.clone(), name.clone());
            }
            for v in map.values() {
                chapter_titles(v, out);
            }
        }
        serde_json::Value::Array(items) => {
            for v in items {
                chapter_titles(v, out);
            }
        }
        _ => {}
    }
}

fn render_labels_in(
    node: &mut serde_json::Value,
    citations: &[Citation],
    titles: &BTreeMap<String, String>,
) {
    match node {
        serde_json::Value::Object(map) => {
            if let Some(serde_json::Value::String(content)) = map.get_mut("content") {
                *content = render_page_titled(content, citations, titles);
            }
            for (_, v) in map.iter_mut() {
                render_labels_in(v, citations, titles);
            }
        }
        serde_json::Value::Array(items) => {
            for v in items {
                render_labels_in(v, citations, titles);
            }
        }
        _ => {}
    }
}

fn cited_by<'a>(id: &str, citations: &'a [Citation]) -> Vec<&'a Citation> {
    citations.iter().filter(|c| c.id == id).collect()
}

/// The tests citing `id`: `clause:` markers, one per (file, test), in
/// workspace order. IDs used as data are not tests and are not counted.
pub fn tests_citing<'a>(id: &str, citations: &'a [Citation]) -> Vec<&'a Citation> {
    let mut seen = std::collections::BTreeSet::new();
    citations
        .iter()
        .filter(|c| c.id == id && c.kind == CitationKind::Test)
        .filter(|c| {
            let file = c.location.rsplit_once(':').map_or("", |(f, _)| f);
            seen.insert((file.to_owned(), c.item.clone()))
        })
        .collect()
}

/// The conformance cases whose clause lists cite `id`.
pub fn cases_citing(id: &str, citations: &[Citation]) -> Vec<String> {
    let mut cases: Vec<String> = citations
        .iter()
        .filter(|c| c.id == id && c.kind == CitationKind::Case)
        .map(|c| c.item.clone())
        .collect();
    cases.dedup();
    cases
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Renders one page: labels to anchors (with the clause's class and how
/// many tests and kit cases check it), `{{#idem-clause-index}}` to the
/// clause tables, and `{{#idem-tests ID}}` to the list of tests citing ID.
/// The clause tables are headed by each chapter's file name; the
/// preprocessor ([`render_labels`]) heads them with the chapters' names.
pub fn render_page(content: &str, citations: &[Citation]) -> String {
    render_page_titled(content, citations, &BTreeMap::new())
}

fn render_page_titled(
    content: &str,
    citations: &[Citation],
    titles: &BTreeMap<String, String>,
) -> String {
    let mut out = String::with_capacity(content.len());
    let mut in_fence = false;
    for line in content.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            in_fence = !in_fence;
        }
        let label = (!in_fence)
            .then(|| t.strip_prefix("r[").and_then(|s| s.strip_suffix(']')))
            .flatten()
            .filter(|id| clauses::is_valid_id(id));
        if let Some(id) = label {
            let anchor = clauses::anchor_id(id);
            let class = clauses::class_of(id).map_or("unclassified", |c| c.as_str());
            let tests = tests_citing(id, citations).len();
            let cases = cases_citing(id, citations).len();
            let mut by = format!("checked by {}", plural(tests, "test", "tests"));
            if cases > 0 {
                by.push_str(&format!(" and {}", plural(cases, "kit case", "kit cases")));
            }
            // A blank line after the HTML block, so the clause's paragraph
            // is still rendered as Markdown.
            out.push_str(&format!(
                "<div class=\"clause\" id=\"{anchor}\"><a href=\"#{anchor}\">[{id}]</a> <small>{class} · {by}</small></div>\n\n"
            ));
        } else if !in_fence && t == "{{#idem-clause-index}}" {
            out.push_str(&clause_index(citations, titles));
        } else if !in_fence && line.contains("{{#idem-tests ") {
            out.push_str(&expand_tests(line, citations));
            out.push('\n');
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Replaces each `{{#idem-tests ID}}` in a line with the tests outside the
/// conformance kit that cite ID (the reference server's, the client's),
/// or a note that there are none.
fn expand_tests(line: &str, citations: &[Citation]) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find("{{#idem-tests ") {
        out.push_str(&rest[..start]);
        let after = &rest[start + "{{#idem-tests ".len()..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[start..]);
            return out;
        };
        let id = after[..end].trim();
        let tests: Vec<String> = tests_citing(id, citations)
            .into_iter()
            .filter(|c| !c.location.starts_with("conformance/"))
            .map(|c| {
                let file = c.location.rsplit_once(':').map_or("", |(f, _)| f);
                format!("`{}` (`{file}`)", c.item)
            })
            .collect();
        out.push_str(&if tests.is_empty() {
            "no test cites it".to_owned()
        } else {
            tests.join(", ")
        });
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    out
}

/// The clause index: one table per chapter, in book order, under a heading
/// with the chapter's name. Each row has the clause's full statement; what
/// checks it is one line ("2 kit cases, 5 tests") that opens on the list,
/// so a clause cited by forty tests is a row like any other until a
/// reader asks for the forty. The tables sit in a `clause-index` block, the
/// hook `book/theme/clauses.css` styles them by.
fn clause_index(citations: &[Citation], titles: &BTreeMap<String, String>) -> String {
    let mut s = String::new();
    let mut page = None;
    for c in clauses::all() {
        let this = c.anchor.split('#').next().unwrap_or_default();
        if page != Some(this) {
            if page.is_some() {
                s.push_str("\n</div>\n\n");
            }
            page = Some(this);
            let md = this.strip_suffix(".html").map(|p| format!("{p}.md"));
            let title = md
                .as_ref()
                .and_then(|m| titles.get(m))
                .map_or(this, String::as_str);
            s.push_str(&format!(
                "## {title}\n\n<div class=\"clause-index\">\n\n\
                 | Clause | Level | Class | Binds | Statement | Checked by |\n|---|---|---|---|---|---|\n"
            ));
        }
        let tests: Vec<String> = tests_citing(&c.id, citations)
            .iter()
            .map(|x| {
                let file = x.location.rsplit_once(':').map_or("", |(f, _)| f);
                if x.item.is_empty() {
                    format!("`{}`", x.location)
                } else {
                    format!("`{}` (`{file}`)", x.item)
                }
            })
            .collect();
        let cases: Vec<String> = cases_citing(&c.id, citations)
            .iter()
            .map(|id| format!("`{id}`"))
            .collect();
        let party = match c.party {
            clauses::Party::Server => "server",
            clauses::Party::Client => "client",
        };
        s.push_str(&format!(
            "| [`{}`]({}) | {} | {} | {} | {} | {} |\n",
            c.id,
            c.anchor,
            c.level.as_str(),
            c.class.as_str(),
            party,
            c.text.replace('|', "\\|"),
            checked_by(&cases, &tests),
        ));
    }
    if page.is_some() {
        s.push_str("\n</div>\n");
    }
    s
}

/// The "Checked by" cell: the counts, opening on the kit cases and the
/// tests by name; a dash when nothing checks the clause.
fn checked_by(cases: &[String], tests: &[String]) -> String {
    if cases.is_empty() && tests.is_empty() {
        return "—".to_owned();
    }
    let mut counts = Vec::new();
    let mut lists = Vec::new();
    if !cases.is_empty() {
        counts.push(plural(cases.len(), "kit case", "kit cases"));
        lists.push(format!("Kit: {}", cases.join(", ")));
    }
    if !tests.is_empty() {
        counts.push(plural(tests.len(), "test", "tests"));
        lists.push(tests.join("<br>"));
    }
    format!(
        "<details><summary>{}</summary>{}</details>",
        counts.join(", "),
        lists.join("<br>")
    )
}
