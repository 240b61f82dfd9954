//! Clauses: the numbered, normative statements of the contract.
//!
//! The book is the normative source. Every normative paragraph there is
//! preceded by a label on its own line, `r[idem.area.rule]`, in the style of
//! the Rust Reference, and states its level (MUST, SHOULD or MAY) in its
//! text. [`parse_book`] derives the clause list from the book; the generator
//! commits it to `spec/generated/clauses.json`, and [`all`] serves that
//! committed list to the rest of the workspace.
//!
//! Every clause also carries a [`Class`]: the worst thing that can happen to
//! a caller when a server breaks it (a second effect, a wrong answer, a
//! different spelling). The classes live in [`CLASSES`], a table in this
//! crate, rather than in the book's labels. The reasons: the class is the
//! conformance kit's judgement of consequence, used to tell an unsafe API
//! from one that merely spells things differently, so it belongs with the
//! types the kit's verdicts are made of; the `r[idem.area.rule]` label
//! syntax stays the Rust Reference's, which other tools read as it is; and
//! the check is just as strict either way, since a clause the table does
//! not classify fails generation ([`Error::ClauseNoClass`]) with a message
//! naming this file. The book shows the class next to every clause (the
//! preprocessor renders it) and in the clause index.
//!
//! Code cites a clause with a plain marker, `clause: idem.area.rule` (usually
//! in a `//` comment above a test; several IDs separated by commas). The
//! citation scanner ([`find_citations`]) reads those markers, the clause
//! lists of conformance cases (`id: "family.name"` followed by
//! `clauses: &[...]`), and every other string literal that looks like a
//! clause ID, so a typo in a check is caught as well. Only markers count as
//! tests and only case lists as kit cases ([`CitationKind`]): an ID used as
//! data (a check's clause, a table in a test) is validated but not counted.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Error;

/// The strength of a clause, as RFC 2119 words it.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
    utoipa::ToSchema,
)]
pub enum Level {
    /// An absolute requirement (also MUST NOT).
    #[serde(rename = "MUST")]
    Must,
    /// Recommended; missing it is "non-strict", not a failure (also SHOULD NOT).
    #[serde(rename = "SHOULD")]
    Should,
    /// Optional behaviour; when offered it must behave as described.
    #[serde(rename = "MAY")]
    May,
}

impl Level {
    /// The RFC 2119 word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Must => "MUST",
            Self::Should => "SHOULD",
            Self::May => "MAY",
        }
    }
}

/// What breaking a clause can cost a caller, worst first when compared
/// (`Safety > Semantics > Interop`).
///
/// A clause's class is the worst consequence breaking it can have. A check
/// of the conformance kit that observed a milder consequence of breaking
/// the same clause (a mismatched request executed as a new one rather than
/// answered with the stored response) records that milder class, never a
/// worse one.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// Spelling: status codes, error codes, problem+json, the replay marker,
    /// key grammar details, published documents. A client written for the
    /// contract may misread the answer, but nothing happens twice and
    /// nothing leaks.
    Interop,
    /// Every other broken MUST: behaviour a client relies on without anything
    /// false believed about effects: in-flight detection, mismatches
    /// rejected at all, the replay window, the failure policy (a stored 5xx
    /// replayed, a final 4xx executed again), replays that are not the
    /// stored response, an ignored hint, a missing deadline.
    Semantics,
    /// The severity rule: a behaviour that can make a correct counterpart
    /// believe something false about effects. A second effect of one
    /// operation (a duplicate executed, a lost response executed again; on a
    /// client, a key-less state-changing request resent after it may have
    /// been sent, or a fresh key per attempt), a request answered with
    /// another request's stored outcome, or one caller's data shown to
    /// another. A stored 5xx replayed or a final 4xx executed again is not
    /// safety: the answer is true about what happened.
    Safety,
}

impl Class {
    /// Every class, worst first.
    pub const ALL: [Class; 3] = [Self::Safety, Self::Semantics, Self::Interop];

    /// The snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Safety => "safety",
            Self::Semantics => "semantics",
            Self::Interop => "interop",
        }
    }
}

impl std::fmt::Display for Class {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The class of every clause. A clause the book labels and this table does
/// not list fails generation; an entry naming no clause of the book fails
/// it too ([`check_class_table`]).
pub const CLASSES: &[(&str, Class)] = {
    use Class::{Interop, Safety, Semantics};
    &[
        // Keys: where the key is read and how it is spelled.
        ("idem.key.header", Interop),
        ("idem.key.syntax", Interop),
        ("idem.key.invalid", Interop),
        // A key-required endpoint that executes a keyless request lets a
        // non-retryable request through: behaviour, not spelling.
        ("idem.key.required", Semantics),
        ("idem.key.endpoints-published", Interop),
        ("idem.client.key-derivation", Safety),
        ("idem.client.same-key", Safety),
        ("idem.client.key-per-operation", Safety),
        // Scope: one caller's response reaching another.
        ("idem.scope.caller", Safety),
        // Fingerprints: what counts as the same request (semantics); what
        // happens to a mismatched one (answered with the stored outcome:
        // safety).
        ("idem.fingerprint.inputs", Semantics),
        ("idem.fingerprint.canonical-json", Semantics),
        ("idem.fingerprint.mismatch", Safety),
        // Windows.
        ("idem.window.replay", Semantics),
        ("idem.window.retention", Semantics),
        ("idem.window.expiry", Semantics),
        // A missing header is a spelling; a window said longer than the one
        // kept can lead a client to retry where the retry executes again,
        // but clients are told to trust the published window, not the
        // header alone: semantics.
        ("idem.window.expiry-header", Semantics),
        // Replacing a request that committed progress executes it again.
        ("idem.window.progress", Safety),
        ("idem.window.published", Interop),
        // State and claim.
        ("idem.state.three-states", Semantics),
        ("idem.claim.atomic", Safety),
        ("idem.claim.transactional", Safety),
        ("idem.store.fail-closed", Semantics),
        // Deadlines: work started for a caller that has given up is waste,
        // and its outcome still answers the caller's retry: behaviour.
        ("idem.deadline.spent", Semantics),
        ("idem.deadline.bound", Semantics),
        // In flight: a duplicate executed while the original runs.
        ("idem.inflight.conflict", Safety),
        ("idem.inflight.retry-after", Interop),
        ("idem.inflight.prefer-wait", Semantics),
        ("idem.concurrency.single-effect", Safety),
        // Replays.
        ("idem.replay.verbatim", Semantics),
        ("idem.replay.marker", Interop),
        ("idem.replay.no-reexecution", Safety),
        // Errors: spellings.
        ("idem.errors.problem-json", Interop),
        ("idem.errors.distinct", Interop),
        ("idem.errors.type-uri", Interop),
        ("idem.errors.profiles", Interop),
        // Failure policy. A final 2xx executed again is a second effect
        // (safety); a final 4xx executed again, or a 5xx stored and
        // replayed, tells the caller the truth about effects (semantics:
        // the kit's checks of those name the milder consequence).
        ("idem.failure.final-outcomes", Safety),
        ("idem.failure.5xx-not-stored", Semantics),
        ("idem.failure.unclaimed", Semantics),
        ("idem.failure.before-claim", Semantics),
        // Clients.
        ("idem.client.no-key-no-retry", Safety),
        ("idem.client.auto-key", Safety),
        ("idem.client.allowlist", Semantics),
        ("idem.client.500-with-key", Safety),
        ("idem.client.backoff-jitter", Semantics),
        ("idem.client.decorrelated-jitter", Semantics),
        ("idem.client.no-unjittered-backoff", Semantics),
        ("idem.client.retry-after", Semantics),
        ("idem.client.deadline", Semantics),
        ("idem.client.deadline-header", Semantics),
        ("idem.client.deadline-header-truthful", Semantics),
        ("idem.client.attempt-cap", Semantics),
        ("idem.client.max-attempts", Semantics),
        ("idem.client.budget", Semantics),
        ("idem.client.observability", Interop),
        // Misreporting the outcome misleads the caller, not the server:
        // nothing takes effect twice because of it.
        ("idem.client.outcome", Semantics),
        // Multi-step requests: a repeated phase or foreign call is a
        // second effect.
        ("idem.multistep.phases", Safety),
        ("idem.multistep.resume", Safety),
        ("idem.multistep.foreign-key", Safety),
        ("idem.lease.takeover", Semantics),
        ("idem.lease.fencing", Safety),
        ("idem.lease.heartbeat", Semantics),
        ("idem.completer.drives", Semantics),
        ("idem.reaper.retention", Semantics),
        ("idem.multistep.staged-jobs", Safety),
    ]
};

/// The class [`CLASSES`] gives `id`.
pub fn class_of(id: &str) -> Option<Class> {
    CLASSES.iter().find(|(c, _)| *c == id).map(|(_, k)| *k)
}

/// Checks [`CLASSES`] against the whole book's clauses: every entry names
/// a clause, none twice. (A clause without an entry already fails
/// [`parse_book`].)
pub fn check_class_table(clauses: &[Clause]) -> Result<(), Error> {
    let mut seen = std::collections::BTreeSet::new();
    for (id, _) in CLASSES {
        if !seen.insert(*id) || !clauses.iter().any(|c| c.id == *id) {
            return Err(Error::ClassStale {
                id: (*id).to_owned(),
            });
        }
    }
    Ok(())
}

/// Who a clause binds. Derived from the ID: `idem.client.*` binds clients;
/// everything else binds servers (and is what the conformance kit checks).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Party {
    /// An obligation of the API (checked by the conformance kit).
    Server,
    /// An obligation of the caller (checked by `idem-client`'s tests).
    Client,
}

/// One clause of the contract.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, utoipa::ToSchema)]
pub struct Clause {
    /// Stable ID, `idem.area.rule`.
    pub id: String,
    /// MUST, SHOULD or MAY.
    pub level: Level,
    /// Whom the clause binds.
    pub party: Party,
    /// The worst consequence of breaking it ([`CLASSES`]).
    pub class: Class,
    /// The first sentence of the paragraph, Markdown stripped.
    pub title: String,
    /// The whole paragraph, Markdown stripped, on one line.
    pub text: String,
    /// Book page and anchor, e.g. `responses.html#r-idem.replay.verbatim`.
    pub anchor: String,
}

/// Every clause of the committed list, in book order.
pub fn all() -> &'static [Clause] {
    static CLAUSES: OnceLock<Vec<Clause>> = OnceLock::new();
    CLAUSES.get_or_init(|| {
        // The file is generated by this crate and checked by its tests, so a
        // parse failure is a build defect, not a runtime condition.
        serde_json::from_str(include_str!("../generated/clauses.json"))
            .expect("spec/generated/clauses.json is generated by idem-spec-gen and always parses")
    })
}

/// Looks up one clause by ID.
pub fn get(id: &str) -> Option<&'static Clause> {
    all().iter().find(|c| c.id == id)
}

/// True when `id` is a well-formed clause ID: `idem.` then two or more
/// dot-separated segments of lower-case letters, digits and hyphens (not
/// starting with a hyphen).
pub fn is_valid_id(id: &str) -> bool {
    let mut parts = id.split('.');
    if parts.next() != Some("idem") {
        return false;
    }
    let rest: Vec<&str> = parts.collect();
    rest.len() >= 2
        && rest.iter().all(|p| {
            !p.is_empty()
                && p.as_bytes()[0] != b'-'
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// Derives the clause list from book pages, given as `(path relative to
/// src/, Markdown)` in book order. Fails on malformed or duplicated labels,
/// on clauses that state no level, and on clauses [`CLASSES`] does not
/// classify.
pub fn parse_book(pages: &[(String, String)]) -> Result<Vec<Clause>, Error> {
    let mut out = Vec::new();
    // (id, file, line) of each label, for the class lookup after the
    // syntax checks: a syntax error is reported before a missing class.
    let mut places: Vec<(String, usize)> = Vec::new();
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for (file, text) in pages {
        let lines: Vec<&str> = text.lines().collect();
        let mut in_fence = false;
        for (i, line) in lines.iter().enumerate() {
            let trimmed = line.trim();
            if trimmed.starts_with("```") {
                in_fence = !in_fence;
                continue;
            }
            if in_fence || !trimmed.starts_with("r[") {
                continue;
            }
            let where_ = format!("{file}:{}", i + 1);
            let Some(id) = trimmed.strip_prefix("r[").and_then(|s| s.strip_suffix(']')) else {
                return Err(Error::ClauseMalformed {
                    file: file.clone(),
                    line: i + 1,
                    label: trimmed.to_owned(),
                });
            };
            if !is_valid_id(id) {
                return Err(Error::ClauseMalformed {
                    file: file.clone(),
                    line: i + 1,
                    label: trimmed.to_owned(),
                });
            }
            if let Some(first) = seen.insert(id.to_owned(), where_.clone()) {
                return Err(Error::ClauseDuplicate {
                    id: id.to_owned(),
                    first,
                    second: where_,
                });
            }
            let paragraph: Vec<&str> = lines[i + 1..]
                .iter()
                .skip_while(|l| l.trim().is_empty())
                .take_while(|l| !l.trim().is_empty() && !l.trim().starts_with("r["))
                .map(|l| l.trim())
                .collect();
            if paragraph.is_empty() {
                return Err(Error::ClauseNoText {
                    id: id.to_owned(),
                    file: file.clone(),
                    line: i + 1,
                });
            }
            let text = strip_markdown(&paragraph.join(" "));
            let Some(level) = level_of(&text) else {
                return Err(Error::ClauseNoLevel {
                    id: id.to_owned(),
                    file: file.clone(),
                    line: i + 1,
                });
            };
            let page = file.trim_end_matches(".md").to_owned() + ".html";
            places.push((file.clone(), i + 1));
            out.push(Clause {
                id: id.to_owned(),
                level,
                party: if id.starts_with("idem.client.") {
                    Party::Client
                } else {
                    Party::Server
                },
                // Filled in below, once every label parsed.
                class: Class::Interop,
                title: first_sentence(&text),
                text,
                anchor: format!("{page}#{}", anchor_id(id)),
            });
        }
    }
    for (clause, (file, line)) in out.iter_mut().zip(places) {
        clause.class = class_of(&clause.id).ok_or_else(|| Error::ClauseNoClass {
            id: clause.id.clone(),
            file,
            line,
        })?;
    }
    Ok(out)
}

/// The HTML `id` a clause label renders to in the book.
pub fn anchor_id(id: &str) -> String {
    format!("r-{id}")
}

/// The strongest RFC 2119 word in the text (MUST beats SHOULD beats MAY).
fn level_of(text: &str) -> Option<Level> {
    let words: Vec<&str> = text.split(|c: char| !c.is_ascii_alphabetic()).collect();
    [
        ("MUST", Level::Must),
        ("SHOULD", Level::Should),
        ("MAY", Level::May),
    ]
    .into_iter()
    .find(|(w, _)| words.contains(w))
    .map(|(_, l)| l)
}

fn first_sentence(text: &str) -> String {
    let end = text
        .char_indices()
        .find(|(i, c)| {
            *c == '.' && text[i + 1..].starts_with(' ')
                || *c == ':' && text[i + 1..].starts_with(' ')
        })
        .map_or(text.len(), |(i, _)| i + 1);
    text[..end].trim().to_owned()
}

/// Removes emphasis, code ticks and link targets so clause text reads as
/// plain prose in reports.
fn strip_markdown(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '`' | '*' => {}
            '[' => {}
            ']' => {
                // Drop a following (target) of an inline link.
                if chars.peek() == Some(&'(') {
                    for d in chars.by_ref() {
                        if d == ')' {
                            break;
                        }
                    }
                }
            }
            _ => out.push(c),
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What a citation is, which decides what the book counts it as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CitationKind {
    /// A `clause:` marker above a test (or a test body a test macro runs):
    /// the author's claim that the test checks the clause. Counted as a test.
    Test,
    /// A conformance case's clause list (`id: "family.name"`, then
    /// `clauses: &[...]`). Counted as a kit case.
    Case,
    /// Any other string literal shaped like a clause ID: data (a check's
    /// clause, a table in a test). Validated, never counted.
    Literal,
}

/// One place in code that cites a clause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Citation {
    /// The clause ID as written.
    pub id: String,
    /// `path:line` of the citation.
    pub location: String,
    /// The test a marker belongs to (the next `fn` name after it), the case
    /// ID of a case's clause list, or empty for other literals.
    pub item: String,
    /// What the citation is.
    pub kind: CitationKind,
}

/// Finds every clause citation in one source file: `clause:` markers (IDs
/// separated by commas or spaces), conformance case clause lists, and other
/// string literals shaped like clause IDs.
pub fn find_citations(path: &str, source: &str) -> Vec<Citation> {
    let lines: Vec<&str> = source.lines().collect();
    let mut out = Vec::new();
    // The case whose `clauses: &[` list is open, and the last case ID seen.
    let mut case_id: Option<String> = None;
    let mut in_case_list = false;
    for (i, line) in lines.iter().enumerate() {
        let location = format!("{path}:{}", i + 1);
        if let Some(pos) = line.find("clause:") {
            let item = lines[i + 1..]
                .iter()
                .find_map(|l| fn_name(l))
                .unwrap_or_default();
            for id in line[pos + "clause:".len()..]
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|s| s.starts_with("idem."))
            {
                out.push(Citation {
                    id: id.to_owned(),
                    location: location.clone(),
                    item: item.clone(),
                    kind: CitationKind::Test,
                });
            }
            continue;
        }
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("id: \"") {
            case_id = rest
                .split('"')
                .next()
                .filter(|id| id.contains('.') && !id.starts_with("idem."))
                .map(str::to_owned);
        }
        // The literals of a case's list, from `clauses: &[` to its `]`.
        let mut scan = *line;
        if case_id.is_some()
            && let Some(pos) = line.find("clauses: &[")
        {
            in_case_list = true;
            scan = &line[pos..];
        }
        for lit in scan.split('"').skip(1).step_by(2) {
            if lit.starts_with("idem.") && lit.matches('.').count() >= 2 && !lit.contains(' ') {
                let (kind, item) = match (&case_id, in_case_list) {
                    (Some(c), true) => (CitationKind::Case, c.clone()),
                    _ => (CitationKind::Literal, String::new()),
                };
                out.push(Citation {
                    id: lit.to_owned(),
                    location: location.clone(),
                    item,
                    kind,
                });
            }
        }
        if in_case_list && line.contains(']') {
            in_case_list = false;
            case_id = None;
        }
    }
    out
}

fn fn_name(line: &str) -> Option<String> {
    let t = line.trim_start();
    let rest = t
        .strip_prefix("fn ")
        .or_else(|| t.strip_prefix("async fn "))
        .or_else(|| t.strip_prefix("pub fn "))
        .or_else(|| t.strip_prefix("pub async fn "))?;
    Some(
        rest.split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()?
            .to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(text: &str) -> Vec<(String, String)> {
        vec![("keys.md".to_owned(), text.to_owned())]
    }

    #[test]
    fn parses_label_level_and_anchor() {
        let c = parse_book(&page(
            "# Keys\n\nr[idem.key.syntax]\nA server **MUST** accept `\"k\"`. More text.\n",
        ))
        .expect("parse");
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].level, Level::Must);
        assert_eq!(c[0].title, "A server MUST accept \"k\".");
        assert_eq!(c[0].anchor, "keys.html#r-idem.key.syntax");
        assert_eq!(c[0].party, Party::Server);
    }

    #[test]
    fn rejects_malformed_duplicate_and_levelless_labels() {
        assert!(matches!(
            parse_book(&page("r[idem.Key.x]\nMUST.\n")),
            Err(Error::ClauseMalformed { .. })
        ));
        assert!(matches!(
            parse_book(&page("r[idem.key]\nMUST.\n")),
            Err(Error::ClauseMalformed { .. })
        ));
        assert!(matches!(
            parse_book(&page("r[idem.key.-x]\nMUST.\n")),
            Err(Error::ClauseMalformed { .. })
        ));
        assert!(matches!(
            parse_book(&page("r[idem.key.x\nMUST.\n")),
            Err(Error::ClauseMalformed { .. })
        ));
        assert!(matches!(
            parse_book(&page("r[idem.a.b]\nMUST.\n\nr[idem.a.b]\nMAY.\n")),
            Err(Error::ClauseDuplicate { .. })
        ));
        assert!(matches!(
            parse_book(&page("r[idem.a.b]\nplease do.\n")),
            Err(Error::ClauseNoLevel { .. })
        ));
        assert!(matches!(
            parse_book(&page("r[idem.a.b]\n")),
            Err(Error::ClauseNoText { .. })
        ));
    }

    #[test]
    fn every_clause_gets_its_class_and_unknown_ones_fail() {
        let c = parse_book(&page("r[idem.scope.caller]\nA server MUST scope.\n")).expect("parse");
        assert_eq!(c[0].class, Class::Safety);
        let e = parse_book(&page("r[idem.brand.new]\nA server MUST.\n")).expect_err("no class");
        assert!(
            matches!(&e, Error::ClauseNoClass { id, line: 1, .. } if id == "idem.brand.new"),
            "{e}"
        );
        assert!(e.to_string().contains("spec/src/clauses.rs"), "{e}");
        // The table may not list a clause the book lacks.
        assert!(matches!(
            check_class_table(&c),
            Err(Error::ClassStale { .. })
        ));
        assert!(Class::Safety > Class::Semantics && Class::Semantics > Class::Interop);
    }

    #[test]
    fn labels_inside_code_fences_are_examples_not_clauses() {
        let c = parse_book(&page("```text\nr[idem.x.y]\n```\n")).expect("parse");
        assert!(c.is_empty());
    }

    #[test]
    fn must_beats_should_and_client_ids_bind_clients() {
        let c = parse_book(&page(
            "r[idem.client.same-key]\nA client SHOULD log and MUST reuse.\n",
        ))
        .expect("parse");
        assert_eq!(c[0].level, Level::Must);
        assert_eq!(c[0].party, Party::Client);
    }

    #[test]
    fn citations_from_markers_and_literals() {
        let src = "// clause: idem.a.b, idem.c.d\n#[test]\nfn replays() {}\nconst C: &[&str] = &[\"idem.e.f\"];\n";
        let c = find_citations("x.rs", src);
        let ids: Vec<&str> = c.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["idem.a.b", "idem.c.d", "idem.e.f"]);
        assert_eq!(c[0].item, "replays");
        assert_eq!(c[0].kind, CitationKind::Test);
        assert_eq!(c[2].location, "x.rs:4");
        assert_eq!(c[2].kind, CitationKind::Literal, "data, not a test");
    }

    #[test]
    fn case_clause_lists_are_cases_and_checks_are_data() {
        let src = r#"
        Case {
            id: "replay.verbatim",
            title: "t",
            clauses: &[
                "idem.a.b",
                "idem.c.d",
            ],
            needs: &[],
        },
        Case {
            id: "keys.one", clauses: &["idem.e.f"],
        },
        fn run() { rec.check("idem.a.b", true, "", ""); }
        "#;
        let c = find_citations("cases.rs", src);
        let got: Vec<(&str, CitationKind, &str)> = c
            .iter()
            .map(|c| (c.id.as_str(), c.kind, c.item.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("idem.a.b", CitationKind::Case, "replay.verbatim"),
                ("idem.c.d", CitationKind::Case, "replay.verbatim"),
                ("idem.e.f", CitationKind::Case, "keys.one"),
                ("idem.a.b", CitationKind::Literal, ""),
            ]
        );
    }
}
