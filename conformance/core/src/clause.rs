//! Typed clause IDs: a case can only cite, check or blame a clause the
//! contract defines, and a misspelt ID fails to compile.
//!
//! [`clause!`](crate::clause!) builds a [`ClauseId`] in a constant, so its
//! check against the spec's clause table ([`idem_spec::clauses::CLASSES`],
//! which generation keeps equal to the book's labels) runs at compile time.

use std::fmt;

/// A clause ID of the contract, e.g. `idem.scope.caller`. Made only by
/// [`clause!`](crate::clause!) (checked when compiled) or
/// [`ClauseId::find`] (checked when run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClauseId(&'static str);

impl ClauseId {
    /// The ID, panicking (at compile time, in a constant) when the contract
    /// has no such clause. Use [`clause!`](crate::clause!).
    pub const fn new(id: &'static str) -> Self {
        assert!(known(id), "not a clause ID of the contract");
        Self(id)
    }

    /// The clause `id` names, if the contract has it.
    pub fn find(id: &str) -> Option<Self> {
        idem_spec::clauses::CLASSES
            .iter()
            .find(|(c, _)| *c == id)
            .map(|(c, _)| Self(c))
    }

    /// The ID as text.
    pub const fn as_str(self) -> &'static str {
        self.0
    }
}

impl fmt::Display for ClauseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl From<ClauseId> for String {
    fn from(c: ClauseId) -> String {
        c.0.to_owned()
    }
}

impl PartialEq<str> for ClauseId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for ClauseId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for ClauseId {
    fn eq(&self, other: &String) -> bool {
        self.0 == other
    }
}

const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

const fn known(id: &str) -> bool {
    let table = idem_spec::clauses::CLASSES;
    let mut i = 0;
    while i < table.len() {
        if same(table[i].0, id) {
            return true;
        }
        i += 1;
    }
    false
}

/// A [`ClauseId`] checked at compile time: `clause!("idem.scope.caller")`.
/// An ID the contract does not define is a compile error:
///
/// ```compile_fail
/// let _ = idem_conformance_core::clause!("idem.scope");
/// ```
///
/// ```
/// assert_eq!(idem_conformance_core::clause!("idem.scope.caller").as_str(), "idem.scope.caller");
/// ```
#[macro_export]
macro_rules! clause {
    ($id:literal) => {{
        const ID: $crate::clause::ClauseId = $crate::clause::ClauseId::new($id);
        ID
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_against_the_contract() {
        assert_eq!(
            crate::clause!("idem.scope.caller").as_str(),
            "idem.scope.caller"
        );
        assert!(ClauseId::find("idem.scope.caller").is_some());
        assert!(ClauseId::find("idem.scope").is_none());
        assert!(known("idem.replay.verbatim") && !known("idem.replay"));
    }
}
