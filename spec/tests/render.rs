//! The book's rendering of clauses: labels carry their class and honest
//! counts (tests are `clause:` markers, kit cases are case clause lists; an
//! ID used as data counts as neither), the index shows each clause's full
//! statement, and `{{#idem-tests ID}}` lists the tests citing a clause.

mod support;

use idem_spec::clauses::{self, Citation, CitationKind};

fn cite(id: &str, location: &str, item: &str, kind: CitationKind) -> Citation {
    Citation {
        id: id.to_owned(),
        location: location.to_owned(),
        item: item.to_owned(),
        kind,
    }
}

#[test]
fn labels_count_tests_and_cases_but_not_data() {
    let id = "idem.scope.caller";
    let citations = vec![
        // One test cited twice (two marker lines) counts once.
        cite(
            id,
            "reference-server/tests/a.rs:3",
            "scoped",
            CitationKind::Test,
        ),
        cite(
            id,
            "reference-server/tests/a.rs:9",
            "scoped",
            CitationKind::Test,
        ),
        cite(id, "client/tests/b.rs:4", "other", CitationKind::Test),
        cite(
            id,
            "conformance/src/cases/scoping.rs:12",
            "scope.other-caller",
            CitationKind::Case,
        ),
        // Data: a check's clause, a table in a test.
        cite(
            id,
            "conformance/src/cases/scoping.rs:80",
            "",
            CitationKind::Literal,
        ),
        cite(
            id,
            "conformance/tests/flaws.rs:30",
            "",
            CitationKind::Literal,
        ),
    ];
    let page = support::render_page(
        "r[idem.scope.caller]\nA server MUST scope keys.\n",
        &citations,
    );
    assert!(
        page.contains("<small>safety · checked by 2 tests and 1 kit case</small>"),
        "{page}"
    );
    let none = support::render_page("r[idem.window.published]\nSHOULD.\n", &[]);
    assert!(
        none.contains("<small>interop · checked by 0 tests</small>"),
        "{none}"
    );
}

#[test]
fn the_index_shows_class_and_the_full_statement() {
    let index = support::render_page("{{#idem-clause-index}}\n", &[]);
    for c in clauses::all() {
        let row = index
            .lines()
            .find(|l| l.starts_with(&format!("| [`{}`]", c.id)))
            .unwrap_or_else(|| panic!("no row for {}", c.id));
        assert!(row.contains(&format!("| {} |", c.class.as_str())), "{row}");
        assert!(
            row.contains(&c.text.replace('|', "\\|")),
            "the whole paragraph, not only its first sentence: {row}"
        );
    }
}

#[test]
fn the_index_has_one_table_per_chapter_and_folds_what_checks_a_clause() {
    let id = "idem.scope.caller";
    let citations: Vec<Citation> = (0..40)
        .map(|i| {
            cite(
                id,
                &format!("reference-server/tests/t{i}.rs:1"),
                &format!("test_{i}"),
                CitationKind::Test,
            )
        })
        .chain([cite(
            id,
            "conformance/src/cases/scoping.rs:12",
            "scope.other-caller",
            CitationKind::Case,
        )])
        .collect();
    let index = support::render_page("{{#idem-clause-index}}\n", &citations);
    // One heading and one table per chapter, in book order, each table in
    // the block the book's CSS styles.
    let mut pages: Vec<&str> = Vec::new();
    for c in clauses::all() {
        let page = c.anchor.split('#').next().unwrap_or_default();
        if pages.last() != Some(&page) {
            assert!(
                !pages.contains(&page),
                "{page} comes back after another chapter"
            );
            pages.push(page);
        }
    }
    let headings: Vec<&str> = index
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .collect();
    assert_eq!(
        headings, pages,
        "without chapter names, the headings are the pages"
    );
    assert_eq!(
        index.matches("<div class=\"clause-index\">").count(),
        pages.len()
    );
    assert_eq!(index.matches("</div>").count(), pages.len());
    assert_eq!(
        index
            .matches("| Clause | Level | Class | Binds | Statement | Checked by |")
            .count(),
        pages.len()
    );
    // Forty tests are one line until opened.
    let row = index
        .lines()
        .find(|l| l.starts_with(&format!("| [`{id}`]")))
        .expect("the clause's row");
    assert!(
        row.contains("<details><summary>1 kit case, 40 tests</summary>Kit: `scope.other-caller`<br>`test_0` (`reference-server/tests/t0.rs`)<br>"),
        "{row}"
    );
    assert!(
        row.ends_with("`test_39` (`reference-server/tests/t39.rs`)</details> |"),
        "{row}"
    );
    // Nothing checks a clause: a dash, not an empty fold.
    let other = clauses::all()
        .iter()
        .find(|c| c.id != id)
        .expect("another clause");
    let row = index
        .lines()
        .find(|l| l.starts_with(&format!("| [`{}`]", other.id)))
        .expect("its row");
    assert!(row.ends_with("| — |"), "{row}");
}

#[test]
fn the_preprocessor_heads_each_table_with_its_chapter_name() {
    let mut book = serde_json::json!({ "items": [
        { "Chapter": { "name": "The key", "path": "keys.md", "content": "# The key\n", "sub_items": [] } },
        { "Chapter": { "name": "Clause index", "path": "clause-index.md",
                       "content": "{{#idem-clause-index}}\n", "sub_items": [] } },
    ] });
    support::render_labels(&mut book, &[]);
    let index = book["items"][1]["Chapter"]["content"]
        .as_str()
        .expect("content");
    assert!(
        index.contains("\n## The key\n") || index.starts_with("## The key\n"),
        "{index}"
    );
    assert!(!index.contains("## keys.html"), "{index}");
}

#[test]
fn idem_tests_lists_the_tests_outside_the_kit() {
    let id = "idem.lease.heartbeat";
    let citations = vec![
        cite(
            id,
            "reference-server/tests/m.rs:5",
            "renews_the_lease",
            CitationKind::Test,
        ),
        cite(
            id,
            "conformance/tests/x.rs:5",
            "kit_test",
            CitationKind::Test,
        ),
        cite(id, "reference-server/src/x.rs:5", "", CitationKind::Literal),
    ];
    let line = support::render_page("| x | {{#idem-tests idem.lease.heartbeat}} |\n", &citations);
    assert_eq!(
        line,
        "| x | `renews_the_lease` (`reference-server/tests/m.rs`) |\n"
    );
    let empty = support::render_page("{{#idem-tests idem.store.fail-closed}}\n", &[]);
    assert_eq!(empty, "no test cites it\n");
}
