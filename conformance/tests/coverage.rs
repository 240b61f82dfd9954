//! Strict, honest coverage: every MUST clause that binds servers is cited
//! by a conformance case or listed in the conformance chapter's table of
//! clauses no black box can check; that table lists exactly the server
//! clauses no case cites, each with its reason and the server tests that
//! cover it; every cited clause exists; case IDs are unique and
//! well-formed; and the citation scanner the book's counts come from reads
//! the case declarations exactly as the kit runs them.

use std::collections::{BTreeMap, BTreeSet};

use idem_spec::clauses::{self, CitationKind, Level, Party};

fn workspace() -> std::path::PathBuf {
    idem_conformance::server::demo::workspace_root()
}

/// The clause IDs of the chapter's "What no black box can check" table,
/// each with its row.
fn uncheckable() -> BTreeMap<String, String> {
    let chapter = std::fs::read_to_string(workspace().join("book/src/conformance.md"))
        .expect("book/src/conformance.md");
    let start = chapter
        .find("## What no black box can check")
        .expect("the chapter has the section");
    let section = &chapter[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |e| e + 3);
    section[..end]
        .lines()
        .filter(|l| l.starts_with("| [`idem."))
        .map(|l| {
            let id = l["| [`".len()..].split('`').next().unwrap_or("").to_owned();
            (id, l.to_owned())
        })
        .collect()
}

fn cited() -> BTreeSet<&'static str> {
    idem_conformance::server::cases::all()
        .iter()
        .flat_map(|c| c.clauses.iter().map(|c| c.as_str()))
        .collect()
}

#[test]
fn every_must_server_clause_has_a_case_or_a_reason() {
    let cited = cited();
    let listed = uncheckable();
    let uncovered: Vec<&str> = clauses::all()
        .iter()
        .filter(|c| c.level == Level::Must && c.party == Party::Server)
        .map(|c| c.id.as_str())
        .filter(|id| !cited.contains(id) && !listed.contains_key(*id))
        .collect();
    assert!(
        uncovered.is_empty(),
        "MUST server clauses without a conformance case or a reason in the chapter: {uncovered:?}"
    );
}

#[test]
fn the_chapter_lists_exactly_the_clauses_no_case_cites() {
    let cited = cited();
    let listed = uncheckable();
    let uncited: BTreeSet<String> = clauses::all()
        .iter()
        .filter(|c| c.party == Party::Server && !cited.contains(c.id.as_str()))
        .map(|c| c.id.clone())
        .collect();
    let in_table: BTreeSet<String> = listed.keys().cloned().collect();
    assert_eq!(
        in_table, uncited,
        "book/src/conformance.md's table must list exactly the server clauses no case cites"
    );
    for (id, row) in &listed {
        let cells: Vec<&str> = row.split(" | ").collect();
        assert_eq!(cells.len(), 3, "three columns: {row}");
        assert!(
            cells[1].len() > 40,
            "{id}: a reason, not a placeholder: {row}"
        );
        assert!(
            row.contains(&format!("{{{{#idem-tests {id}}}}}")),
            "{id}: the last column lists the server's tests: {row}"
        );
        let anchor = &clauses::get(id).expect("exists").anchor;
        let page = anchor.replace(".html#", ".md#");
        assert!(
            row.contains(&format!("]({page})")),
            "{id}: links {page}: {row}"
        );
    }
}

#[test]
fn cases_cite_existing_clauses_and_have_unique_ids() {
    let cases = idem_conformance::server::cases::all();
    let mut ids = BTreeSet::new();
    for c in &cases {
        assert!(ids.insert(c.id), "duplicate case id {}", c.id);
        assert!(c.id.contains('.'), "case id {} is family.name", c.id);
        assert!(!c.clauses.is_empty(), "{} cites no clause", c.id);
        for cl in c.clauses {
            let clause = clauses::get(cl.as_str())
                .unwrap_or_else(|| panic!("{} cites unknown clause {cl}", c.id));
            assert_eq!(
                clause.party,
                Party::Server,
                "{} cites a client clause {cl}",
                c.id
            );
        }
    }
}

/// The book counts "kit cases" from the source text; this keeps that scan
/// equal to what the kit runs.
#[test]
fn the_scanner_reads_case_declarations_as_the_kit_runs_them() {
    let src = workspace().join("conformance/src");
    let mut files = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let mut scanned: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read");
        for c in clauses::find_citations(&f.display().to_string(), &text) {
            if c.kind == CitationKind::Case {
                scanned.entry(c.item).or_default().insert(c.id);
            }
        }
    }
    let declared: BTreeMap<String, BTreeSet<String>> = idem_conformance::server::cases::all()
        .iter()
        .map(|c| {
            (
                c.id.to_owned(),
                c.clauses.iter().map(|s| s.to_string()).collect(),
            )
        })
        .collect();
    assert_eq!(scanned, declared);
}
