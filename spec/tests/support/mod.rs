//! File-system helpers shared by the `idem-spec-gen` binary and the spec
//! crate's tests: reading the book, comparing generated files, scanning the
//! workspace for clause citations, and rendering clause labels in the book.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use idem_spec::clauses::{self, Citation};

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
/// `{{#idem-clause-index}}` becomes the full clause table.
pub fn render_labels(node: &mut serde_json::Value, citations: &[Citation]) {
    match node {
        serde_json::Value::Object(map) => {
            if let Some(serde_json::Value::String(content)) = map.get_mut("content") {
                *content = render_page(content, citations);
            }
            for (_, v) in map.iter_mut() {
                render_labels(v, citations);
            }
        }
        serde_json::Value::Array(items) => {
            for v in items {
                render_labels(v, citations);
            }
        }
        _ => {}
    }
}

fn cited_by<'a>(id: &str, citations: &'a [Citation]) -> Vec<&'a Citation> {
    citations.iter().filter(|c| c.id == id).collect()
}

/// Renders one page: labels to anchors, the index marker to a table.
pub fn render_page(content: &str, citations: &[Citation]) -> String {
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
            let n = cited_by(id, citations).len();
            // A blank line after the HTML block, so the clause's paragraph
            // is still rendered as Markdown.
            out.push_str(&format!(
                "<div class=\"clause\" id=\"{anchor}\"><a href=\"#{anchor}\">[{id}]</a> <small>checked by {n} test{}</small></div>\n\n",
                if n == 1 { "" } else { "s" }
            ));
        } else if !in_fence && t == "{{#idem-clause-index}}" {
            out.push_str(&clause_index(citations));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn clause_index(citations: &[Citation]) -> String {
    let mut s = String::from(
        "| Clause | Level | Binds | Statement | Checked by |\n|---|---|---|---|---|\n",
    );
    for c in clauses::all() {
        let cites = cited_by(&c.id, citations);
        let by: Vec<String> = cites
            .iter()
            .map(|x| {
                if x.item.is_empty() {
                    format!("`{}`", x.location)
                } else {
                    format!("`{}` ({})", x.item, x.location)
                }
            })
            .collect();
        let party = match c.party {
            clauses::Party::Server => "server",
            clauses::Party::Client => "client",
        };
        s.push_str(&format!(
            "| [`{}`]({}) | {} | {} | {} | {} |\n",
            c.id,
            c.anchor,
            c.level.as_str(),
            party,
            c.title.replace('|', "\\|"),
            if by.is_empty() {
                "—".to_owned()
            } else {
                by.join("<br>")
            }
        ));
    }
    s
}
