//! Strict coverage: every MUST clause that binds servers is cited by at
//! least one conformance case, every cited clause exists, and case IDs are
//! unique and well-formed.

use std::collections::BTreeSet;

use idem_spec::clauses::{self, Level, Party};

#[test]
fn every_must_server_clause_has_a_case() {
    let cases = idem_conformance::cases::all();
    let cited: BTreeSet<&str> = cases
        .iter()
        .flat_map(|c| c.clauses.iter().copied())
        .collect();
    let uncovered: Vec<&str> = clauses::all()
        .iter()
        .filter(|c| c.level == Level::Must && c.party == Party::Server)
        .map(|c| c.id.as_str())
        .filter(|id| !cited.contains(id))
        .collect();
    assert!(
        uncovered.is_empty(),
        "MUST server clauses without a conformance case: {uncovered:?}"
    );
}

#[test]
fn cases_cite_existing_clauses_and_have_unique_ids() {
    let cases = idem_conformance::cases::all();
    let mut ids = BTreeSet::new();
    for c in &cases {
        assert!(ids.insert(c.id), "duplicate case id {}", c.id);
        assert!(c.id.contains('.'), "case id {} is family.name", c.id);
        assert!(!c.clauses.is_empty(), "{} cites no clause", c.id);
        for cl in c.clauses {
            let clause =
                clauses::get(cl).unwrap_or_else(|| panic!("{} cites unknown clause {cl}", c.id));
            assert_eq!(
                clause.party,
                Party::Server,
                "{} cites a client clause {cl}",
                c.id
            );
        }
    }
}
