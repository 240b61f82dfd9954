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
