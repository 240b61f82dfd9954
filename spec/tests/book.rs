//! Checks on the book itself, the published contract.
//!
//! - The book never promises "exactly once" outside the one passage that
//!   explains why nobody can ([`forbidden_claims`]).
//! - Clause labels parse, once each (`clauses::parse_book`).
//! - Every relative link, anchor and `{{#include}}` resolves, with heading
//!   ids computed the way mdBook 0.5 computes them ([`check_links`]).
//! - Every error code has a section whose id is the code, which is where a
//!   problem document's `type` URI points, and that section states the
//!   status and code under every profile.
//! - The tables the book includes (error codes, jitter draws, worked retry
//!   schedules) are generated here from the spec crate's types and a fixed
//!   seed; a test fails when the committed copies are stale. Regenerate
//!   them with `IDEM_BLESS=1 cargo test -p idem-spec --test book`.
//!
//! Each checker is a plain function over strings, unit-tested on small bad
//! inputs below, so a checker that silently passes everything is caught.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use idem_spec::{ErrorCode, IdempotencyKey, Profile, clauses};

// ---------------------------------------------------------------------------
// Reading the book

fn book_src() -> PathBuf {
    support::workspace_root().join("book/src")
}

/// Every Markdown file under `book/src`, SUMMARY.md included, keyed by its
/// path relative to `book/src` with `/` separators.
fn book_pages() -> BTreeMap<String, String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).expect("read book dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(base, &path, out);
            } else if path.extension().and_then(|e| e.to_str()) == Some("md") {
                let rel = path
                    .strip_prefix(base)
                    .expect("under base")
                    .to_string_lossy()
                    .replace('\\', "/");
                let text = std::fs::read_to_string(&path).expect("read page");
                out.insert(rel, text);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&book_src(), &book_src(), &mut out);
    out
}

// ---------------------------------------------------------------------------
// "Exactly once"

const EXPLAINED_OPEN: &str = "<!-- exactly-once-explained -->";
const EXPLAINED_CLOSE: &str = "<!-- /exactly-once-explained -->";

/// Removes the marked passages that explain why the claim is false. Fails on
/// a marker that is unbalanced or nested, so a stray opening marker cannot
/// exempt the rest of a page.
fn strip_explained(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let open = rest.find(EXPLAINED_OPEN);
        let close = rest.find(EXPLAINED_CLOSE);
        match (open, close) {
            (None, None) => {
                out.push_str(rest);
                return Ok(out);
            }
            (Some(o), Some(c)) if o < c => {
                let inner = &rest[o + EXPLAINED_OPEN.len()..c];
                if inner.contains(EXPLAINED_OPEN) {
                    return Err("nested exactly-once-explained marker".to_owned());
                }
                out.push_str(&rest[..o]);
                rest = &rest[c + EXPLAINED_CLOSE.len()..];
            }
            (Some(_), None) => return Err("exactly-once-explained marker never closed".to_owned()),
            _ => return Err("closing exactly-once-explained marker without an opening one".into()),
        }
    }
}

/// Every place the text claims "exactly once", in any case, spelled with a
/// space (or any whitespace, line breaks included), a hyphen, a non-breaking
/// hyphen or a dash, and with Markdown emphasis or code ticks ignored.
/// Returns a short excerpt around each hit.
fn forbidden_claims(text: &str) -> Vec<String> {
    let mut normal = String::with_capacity(text.len());
    let mut last_space = false;
    for c in text.chars() {
        let c = match c {
            '*' | '`' => continue,
            '-' | '_' | '\u{2010}' | '\u{2011}' | '\u{2012}' | '\u{2013}' | '\u{2014}' => ' ',
            c if c.is_whitespace() => ' ',
            c => c,
        };
        if c == ' ' {
            if last_space {
                continue;
            }
            last_space = true;
        } else {
            last_space = false;
        }
        normal.extend(c.to_lowercase());
    }
    let needle = "exactly once";
    let mut hits = Vec::new();
    let mut from = 0;
    while let Some(i) = normal[from..].find(needle) {
        let at = from + i;
        let start = normal[..at]
            .char_indices()
            .rev()
            .nth(30)
            .map_or(0, |(j, _)| j);
        let end = (at + needle.len() + 30).min(normal.len());
        let end = (end..=normal.len())
            .find(|&e| normal.is_char_boundary(e))
            .unwrap_or(normal.len());
        hits.push(normal[start..end].to_owned());
        from = at + needle.len();
    }
    hits
}

#[test]
fn the_book_never_claims_exactly_once_outside_the_explanation() {
    let mut problems = Vec::new();
    let mut explained = 0;
    for (page, text) in book_pages() {
        if text.contains(EXPLAINED_OPEN) {
            explained += 1;
        }
        match strip_explained(&text) {
            Ok(rest) => {
                for hit in forbidden_claims(&rest) {
                    problems.push(format!("{page}: \"...{hit}...\""));
                }
            }
            Err(e) => problems.push(format!("{page}: {e}")),
        }
    }
    assert!(
        problems.is_empty(),
        "the book may only say \"exactly once\" inside the marked passage that explains why \
         it is not on offer:\n{}",
        problems.join("\n")
    );
    assert_eq!(explained, 1, "exactly one page carries the explanation");
}

#[test]
fn exactly_once_checker_catches_every_spelling() {
    for bad in [
        "We deliver exactly once.",
        "an Exactly-Once guarantee",
        "exactly\u{2011}once (non-breaking hyphen)",
        "exactly\u{a0}once (no-break space)",
        "executed exactly\nonce, across a line break",
        "**exactly** once",
        "`exactly_once`",
    ] {
        assert_eq!(forbidden_claims(bad).len(), 1, "missed: {bad:?}");
    }
    for fine in [
        "exactly one request executes",
        "at least once, effectively-once",
        "exactly one time",
    ] {
        assert!(forbidden_claims(fine).is_empty(), "false alarm: {fine:?}");
    }
    let marked =
        format!("before {EXPLAINED_OPEN} exactly once is impossible {EXPLAINED_CLOSE} after");
    assert!(forbidden_claims(&strip_explained(&marked).unwrap()).is_empty());
    let outside = format!("{EXPLAINED_OPEN} why {EXPLAINED_CLOSE} but we do exactly-once");
    assert_eq!(
        forbidden_claims(&strip_explained(&outside).unwrap()).len(),
        1
    );
    assert!(strip_explained(&format!("{EXPLAINED_OPEN} exactly once forever")).is_err());
    assert!(strip_explained(&format!("x {EXPLAINED_CLOSE}")).is_err());
    assert!(
        strip_explained(&format!(
            "{EXPLAINED_OPEN} a {EXPLAINED_OPEN} b {EXPLAINED_CLOSE}"
        ))
        .is_err()
    );
}

// ---------------------------------------------------------------------------
// The key table agrees with the parser

/// The code spans of a Markdown table cell, in order.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// Rows of the key chapter's table whose first cell is one header line
/// (`` `Idempotency-Key: …` `` and nothing else): the header value, the
/// key the book says it names (when shown as code), and whether the book
/// says it is accepted.
fn key_table_rows(text: &str) -> Vec<(String, Option<String>, bool)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        let [header, key, verdict] = cells.as_slice() else {
            continue;
        };
        let header = header.trim();
        let spans = code_spans(header);
        let [only] = spans.as_slice() else {
            continue;
        };
        if header != format!("`{only}`") {
            continue;
        }
        let Some(value) = only.strip_prefix("Idempotency-Key:") else {
            continue;
        };
        let verdict = verdict.trim();
        let accepted = if verdict.starts_with("yes") {
            true
        } else if verdict.starts_with("no") {
            false
        } else {
            continue;
        };
        let key = code_spans(key).first().map(|k| (*k).to_owned());
        out.push((value.to_owned(), key, accepted));
    }
    out
}

#[test]
fn the_key_table_agrees_with_the_spec_parser() {
    let text = std::fs::read_to_string(book_src().join("keys.md")).expect("read keys.md");
    let rows = key_table_rows(&text);
    assert!(rows.len() >= 12, "only {} checkable rows", rows.len());
    let mut problems = Vec::new();
    for (value, key, accepted) in &rows {
        match (IdempotencyKey::parse(value), accepted) {
            (Ok(parsed), true) => {
                if let Some(key) = key
                    && parsed.as_str() != key
                {
                    problems.push(format!(
                        "{value:?}: the book says key {key:?}, the parser {parsed:?}"
                    ));
                }
            }
            (Err(_), false) => {}
            (Ok(parsed), false) => problems.push(format!(
                "{value:?}: the book rejects it, the parser accepts {parsed:?}"
            )),
            (Err(e), true) => problems.push(format!(
                "{value:?}: the book accepts it, the parser says {e}"
            )),
        }
    }
    assert!(
        problems.is_empty(),
        "keys.md and spec/src/key.rs disagree:\n{}",
        problems.join("\n")
    );
    // The decision on commas is in the table, both ways.
    assert!(rows.iter().any(|(v, _, ok)| v.trim() == "a,b" && *ok));
    assert!(rows.iter().any(|(v, _, ok)| v.trim() == "a, b" && !*ok));
}

#[test]
fn key_table_reader_takes_only_single_header_rows() {
    let t = "| `Idempotency-Key: x` | `x` | yes |\n| `Idempotency-Key: a b` | | no: space |\n| `Idempotency-Key: A` and `a` | | yes |\n| 256 × `a` | | no |\n| `Idempotency-Key: y` | the key | maybe |\n";
    assert_eq!(
        key_table_rows(t),
        vec![
            (" x".to_owned(), Some("x".to_owned()), true),
            (" a b".to_owned(), None, false)
        ]
    );
}

// ---------------------------------------------------------------------------
// Softer single-execution promises

/// Phrases that promise a single execution. Each is allowed only in a
/// qualified sentence ([`qualified`]); the strongest one, "exactly once",
/// is also forbidden outright by [`forbidden_claims`].
const SOFT_CLAIMS: [&str; 5] = [
    "runs twice",
    "run twice",
    "at most once",
    "exactly one",
    "exactly once",
];

/// A sentence is qualified when it names the scope of the promise (the key,
/// which belongs to one caller, or the window), or when it denies or
/// explains the impossibility (a negation).
fn qualified(words: &[&str]) -> bool {
    words.iter().any(|w| {
        matches!(
            *w,
            "key" | "keys" | "window" | "windows" | "not" | "never" | "cannot" | "impossible"
        ) || w.ends_with("n't")
    })
}

/// Lower-cases, drops emphasis and code ticks, and turns hyphens, dashes and
/// runs of whitespace into single spaces.
fn normalize_prose(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last_space = true;
    for c in text.chars() {
        let c = match c {
            '*' | '`' | '_' => continue,
            '-' | '\u{2010}' | '\u{2011}' | '\u{2012}' | '\u{2013}' | '\u{2014}' => ' ',
            '\u{2019}' => '\'',
            c if c.is_whitespace() => ' ',
            c => c,
        };
        if c == ' ' {
            if last_space {
                continue;
            }
            last_space = true;
        } else {
            last_space = false;
        }
        out.extend(c.to_lowercase());
    }
    out
}

/// The prose of a page as sentences: fenced code is left out, paragraphs
/// end at blank lines, each table row and list item stands alone, and a
/// sentence ends at `.`, `!` or `?` followed by a space.
fn sentences(text: &str) -> Vec<(usize, String)> {
    let mut paragraphs: Vec<(usize, String)> = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (n, line) in prose_lines(text) {
        let t = line.trim();
        let starts_block = t.is_empty()
            || t.starts_with('|')
            || t.starts_with("- ")
            || t.starts_with('#')
            || t.split_once(". ")
                .is_some_and(|(num, _)| num.parse::<u32>().is_ok());
        if starts_block && let Some(p) = current.take() {
            paragraphs.push(p);
        }
        if t.is_empty() {
            continue;
        }
        match &mut current {
            Some((_, p)) => {
                p.push(' ');
                p.push_str(t);
            }
            None => current = Some((n, t.to_owned())),
        }
        if t.starts_with('|') || t.starts_with('#') {
            paragraphs.extend(current.take());
        }
    }
    paragraphs.extend(current);
    let mut out = Vec::new();
    for (n, p) in paragraphs {
        let p = normalize_prose(&p);
        let mut start = 0;
        let bytes = p.as_bytes();
        for i in 0..bytes.len() {
            let end = matches!(bytes[i], b'.' | b'!' | b'?')
                && bytes.get(i + 1).is_none_or(|b| *b == b' ');
            if end {
                out.push((n, p[start..=i].trim().to_owned()));
                start = i + 1;
            }
        }
        if start < p.len() && !p[start..].trim().is_empty() {
            out.push((n, p[start..].trim().to_owned()));
        }
    }
    out
}

/// Every unqualified sentence that makes a soft single-execution promise,
/// as (line of its paragraph, phrase, sentence).
fn soft_claims(text: &str) -> Vec<(usize, &'static str, String)> {
    let mut out = Vec::new();
    for (n, sentence) in sentences(text) {
        let words: Vec<&str> = sentence
            .split(|c: char| !(c.is_alphanumeric() || c == '\''))
            .filter(|w| !w.is_empty())
            .collect();
        let joined = format!(" {} ", words.join(" "));
        let Some(phrase) = SOFT_CLAIMS
            .iter()
            .find(|p| joined.contains(&format!(" {p} ")))
        else {
            continue;
        };
        if !qualified(&words) {
            out.push((n, *phrase, sentence));
        }
    }
    out
}

#[test]
fn the_book_scopes_every_single_execution_promise() {
    let mut problems = Vec::new();
    for (page, text) in book_pages() {
        let rest = strip_explained(&text).expect("markers balance (checked above)");
        for (line, phrase, sentence) in soft_claims(&rest) {
            problems.push(format!("{page}:{line}: \"{phrase}\" in: {sentence}"));
        }
    }
    assert!(
        problems.is_empty(),
        "a promise of a single execution must say its scope (name the key or the window) or be \
         a negation; say \"effect\", not \"execution\", where that is what is meant:\n{}",
        problems.join("\n")
    );
}

#[test]
fn soft_claim_checker_flags_unscoped_promises_only() {
    for bad in [
        "A repeat of a running one is told to wait; nothing runs twice.",
        "The server runs the operation at most once.",
        "the server MUST execute *exactly one*; every other answer is a 409.",
        "Retries are harmless:\nthe handler\nruns twice at worst.",
        "| Burst | exactly one executes |",
        "- exactly one of them runs",
        "Done. It runs at most-once! Really.",
    ] {
        assert_eq!(soft_claims(bad).len(), 1, "missed: {bad:?}");
    }
    for fine in [
        "Per key, within the replay window, it takes effect at most once.",
        "With a unique constraint on `(caller, key)` the database picks exactly one winner.",
        "No protocol makes a request run exactly once: it cannot be done.",
        "It is not true that nothing runs twice.",
        "The client sends at least once.",
        "Each gets exactly two retries.",
        "```text\nnothing runs twice\n```",
    ] {
        assert!(soft_claims(fine).is_empty(), "false alarm: {fine:?}");
    }
    // The scope must be in the same sentence, not the one before it.
    assert_eq!(
        soft_claims("Keys are scoped to a caller. The server runs it at most once.").len(),
        1
    );
}

// ---------------------------------------------------------------------------
// Clause labels

#[test]
fn clause_labels_are_well_formed_and_unique() {
    let pages = support::read_book(&book_src()).expect("read book");
    let clauses = clauses::parse_book(&pages).expect("every label parses");
    assert!(clauses.len() >= 40, "the contract has its clauses");
    // A label the parser skipped would render as plain text: every line
    // that starts like a label outside code fences must be one it accepted.
    let ids: BTreeSet<&str> = clauses.iter().map(|c| c.id.as_str()).collect();
    for (page, text) in &pages {
        for (line, id) in label_lines(text) {
            assert!(
                ids.contains(id.as_str()),
                "{page}:{line}: label r[{id}] not accepted"
            );
        }
    }
}

/// Clause texts that name a contract error whose status or code differs
/// between profiles without saying that the answer is the profile's: "MUST
/// answer 409 `idempotency_key_mismatch`" is false under `ietf-draft` (422).
fn profile_blind_clauses(clauses: &[clauses::Clause]) -> Vec<String> {
    let mut out = Vec::new();
    for c in clauses {
        for code in ErrorCode::ALL {
            let varies = Profile::ALL.iter().any(|p| {
                code.status(*p) != code.status(Profile::Reference)
                    || code.wire_code(*p) != code.wire_code(Profile::Reference)
            });
            if varies && c.text.contains(code.as_str()) && !c.text.contains("profile") {
                out.push(format!(
                    "{}: names `{}`, whose answer differs between profiles, without saying it is the profile's",
                    c.id,
                    code.as_str()
                ));
            }
        }
    }
    out
}

// clause: idem.errors.profiles
#[test]
fn clauses_speak_in_the_profiles_answers() {
    let pages = support::read_book(&book_src()).expect("read book");
    let clauses = clauses::parse_book(&pages).expect("every label parses");
    let blind = profile_blind_clauses(&clauses);
    assert!(blind.is_empty(), "{}", blind.join("\n"));
}

#[test]
fn profile_checker_flags_a_hard_coded_status() {
    let page = vec![(
        "keys.md".to_owned(),
        "r[idem.fingerprint.mismatch]\nA server MUST answer 409 `idempotency_key_mismatch`.\n\nr[idem.inflight.conflict]\nA server MUST give its profile's `idempotency_key_in_use` answer.\n\nr[idem.failure.unclaimed]\nA server MUST answer 401 `unauthenticated`.\n".to_owned(),
    )];
    let clauses = clauses::parse_book(&page).expect("parses");
    let blind = profile_blind_clauses(&clauses);
    assert_eq!(blind.len(), 1, "{blind:?}");
    assert!(
        blind[0].split(':').next() == Some("idem.fingerprint.mismatch"),
        "{blind:?}"
    );
}

/// Lines outside code fences that start with `r[`, as (line number, inner text).
fn label_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fence = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if let Some(f) = fence_marker(t) {
            fence = match fence {
                None => Some(f),
                Some(open) if t.starts_with(open) => None,
                keep => keep,
            };
            continue;
        }
        if fence.is_none()
            && let Some(rest) = t.strip_prefix("r[")
        {
            out.push((i + 1, rest.trim_end_matches(']').to_owned()));
        }
    }
    out
}

#[test]
fn clause_checker_rejects_malformed_and_duplicated_labels() {
    let page = |t: &str| vec![("p.md".to_owned(), t.to_owned())];
    // A well-formed label parses once the class table classifies it.
    assert!(clauses::parse_book(&page("r[idem.key.syntax]\nA server MUST.\n")).is_ok());
    assert!(clauses::parse_book(&page("r[idem.a.b]\nA server MUST.\n")).is_err());
    assert!(clauses::parse_book(&page("r[idem.a.b]\nMUST.\n\nr[idem.a.b]\nMUST.\n")).is_err());
    assert!(clauses::parse_book(&page("r[idem.A.b]\nMUST.\n")).is_err());
    assert!(clauses::parse_book(&page("r[idem.a.b\nMUST.\n")).is_err());
    assert!(clauses::parse_book(&page("r[idem.a.b]\nno level here.\n")).is_err());
    assert_eq!(
        label_lines("```\nr[idem.x.y]\n```\nr[idem.a.b]\n"),
        [(4, concat!("idem.", "a.b").to_owned())]
    );
}

/// Every clause ID the text mentions (`idem.` followed by two or more
/// dot-separated segments), label lines included, with sentence-ending dots
/// trimmed.
fn clause_mentions(text: &str) -> Vec<String> {
    let is_id_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    let mut out = Vec::new();
    for (pos, _) in text.match_indices("idem.") {
        let before = text[..pos].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &text[pos..];
        let end = rest.find(|c: char| !is_id_char(c)).unwrap_or(rest.len());
        let id = rest[..end].trim_end_matches('.');
        if id.matches('.').count() >= 2 {
            out.push(id.to_owned());
        }
    }
    out
}

#[test]
fn every_clause_the_book_mentions_exists() {
    let known: BTreeSet<&str> = clauses::all().iter().map(|c| c.id.as_str()).collect();
    let mut unknown = Vec::new();
    for (page, text) in book_pages() {
        for id in clause_mentions(&text) {
            if !known.contains(id.as_str()) {
                unknown.push(format!("{page}: {id}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "unknown clauses mentioned:\n{}",
        unknown.join("\n")
    );
}

#[test]
fn clause_mentions_are_found_in_prose_code_and_links() {
    let text = "See `idem.replay.verbatim`. Also [x](responses.md#r-idem.claim.atomic) \
                and idem.window.replay, not idemkit.dev or idem.one or my_idem.a.b.";
    assert_eq!(
        clause_mentions(text),
        [
            concat!("idem.", "replay.verbatim"),
            concat!("idem.", "claim.atomic"),
            concat!("idem.", "window.replay")
        ]
    );
}

// ---------------------------------------------------------------------------
// Links, anchors and includes

/// The id mdBook 0.5 gives a heading: its text lower-cased, each whitespace
/// character turned into `-`, and everything but letters, digits, `-` and
/// `_` dropped. (Checked against `mdbook build` output; see the unit test.)
fn normalize_id(heading_text: &str) -> String {
    heading_text
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_lowercase().collect::<String>())
            } else if c.is_whitespace() {
                Some("-".to_owned())
            } else {
                None
            }
        })
        .collect()
}

/// The text a heading renders to: inline code ticks, emphasis stars, HTML
/// tags and link targets removed.
fn heading_text(raw: &str) -> String {
    let mut out = String::new();
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '`' | '*' => {}
            '<' => {
                for d in chars.by_ref() {
                    if d == '>' {
                        break;
                    }
                }
            }
            '[' => {}
            ']' if chars.peek() == Some(&'(') => {
                for d in chars.by_ref() {
                    if d == ')' {
                        break;
                    }
                }
            }
            ']' => {}
            c => out.push(c),
        }
    }
    out.trim().to_owned()
}

/// ```` ``` ```` or `~~~` (with its length) when the line opens or closes a
/// fenced code block.
fn fence_marker(trimmed: &str) -> Option<&str> {
    ["````", "```", "~~~"]
        .into_iter()
        .find(|f| trimmed.starts_with(f))
}

/// Lines outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut fence: Option<&str> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if let Some(f) = fence_marker(t) {
            fence = match fence {
                None => Some(f),
                Some(open) if t.starts_with(open) => None,
                keep => keep,
            };
            continue;
        }
        if fence.is_none() {
            out.push((i + 1, line));
        }
    }
    out
}

/// Removes inline code spans, so `[a](b)` inside backticks is not a link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// Every id a page defines: heading ids (mdBook's, with `-1`, `-2` for
/// repeats, or an explicit `{ #id }`), `id="..."` attributes of inline HTML,
/// and the `r-<clause>` anchor of every clause label.
fn page_ids(text: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (_, line) in prose_lines(text) {
        let t = line.trim();
        let hashes = t.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && t[hashes..].starts_with(' ') {
            let mut body = t[hashes..].trim().trim_end_matches('#').trim().to_owned();
            if let Some(open) = body.rfind("{#").or_else(|| body.rfind("{ #"))
                && body.ends_with('}')
            {
                let explicit = body[open..]
                    .trim_matches(|c| c == '{' || c == '}' || c == ' ')
                    .trim_start_matches('#')
                    .to_owned();
                ids.insert(explicit);
                body.truncate(open);
                continue;
            }
            let base = normalize_id(&heading_text(&body));
            let n = seen.entry(base.clone()).or_insert(0);
            ids.insert(if *n == 0 {
                base.clone()
            } else {
                format!("{base}-{n}")
            });
            *n += 1;
        }
        if let Some(id) = t.strip_prefix("r[").and_then(|s| s.strip_suffix(']')) {
            ids.insert(clauses::anchor_id(id));
        }
        for part in line.split(" id=\"").skip(1) {
            if let Some(end) = part.find('"') {
                ids.insert(part[..end].to_owned());
            }
        }
    }
    ids
}

/// One outgoing reference of a page.
#[derive(Debug, PartialEq, Eq)]
enum Ref {
    /// A Markdown link, image or HTML `href`/`src`.
    Link { line: usize, target: String },
    /// An mdBook `{{#include path[:anchor]}}` (or `rustdoc_include`).
    Include {
        line: usize,
        path: String,
        anchor: Option<String>,
    },
}

/// Every link and include of a page. Links inside code are ignored;
/// includes are found everywhere, because mdBook expands them inside code
/// fences too (that is how the book shows code).
fn page_refs(text: &str) -> Vec<Ref> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        for kind in ["{{#include ", "{{#rustdoc_include "] {
            for (pos, _) in line.match_indices(kind) {
                if line[..pos].ends_with('\\') {
                    continue; // escaped, rendered literally
                }
                let rest = &line[pos + kind.len()..];
                let Some(end) = rest.find("}}") else { continue };
                let spec = rest[..end].trim();
                let (path, anchor) = match spec.split_once(':') {
                    Some((p, a)) if !a.chars().next().is_some_and(|c| c.is_ascii_digit()) => {
                        (p, Some(a.to_owned()))
                    }
                    Some((p, _)) => (p, None),
                    None => (spec, None),
                };
                out.push(Ref::Include {
                    line: i + 1,
                    path: path.to_owned(),
                    anchor,
                });
            }
        }
    }
    for (n, line) in prose_lines(text) {
        let line = without_code_spans(line);
        // Inline links and images: [text](target "title")
        for part in line.split("](").skip(1) {
            if let Some(end) = part.find(')') {
                let target = part[..end].split_whitespace().next().unwrap_or_default();
                out.push(Ref::Link {
                    line: n,
                    target: target.trim_matches(|c| c == '<' || c == '>').to_owned(),
                });
            }
        }
        // Reference definitions: [label]: target
        let t = line.trim_start();
        if t.starts_with('[')
            && let Some(close) = t.find("]:")
        {
            let target = t[close + 2..].split_whitespace().next().unwrap_or_default();
            out.push(Ref::Link {
                line: n,
                target: target.to_owned(),
            });
        }
        // Inline HTML
        for attr in [" href=\"", " src=\""] {
            for part in line.split(attr).skip(1) {
                if let Some(end) = part.find('"') {
                    out.push(Ref::Link {
                        line: n,
                        target: part[..end].to_owned(),
                    });
                }
            }
        }
    }
    out
}

/// Resolves `target` against the directory of `page`, lexically, to a path
/// relative to the book's `src/` (it may start with `../`).
fn resolve(page: &str, target: &str) -> String {
    let mut parts: Vec<&str> = page.split('/').collect();
    parts.pop();
    for seg in target.split('/') {
        match seg {
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != "..") => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    parts.join("/")
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:") || target.starts_with("//")
}

/// The pages mdBook renders: SUMMARY.md and every page it links to. Without
/// a SUMMARY.md (unit tests), every page.
fn rendered_pages(pages: &BTreeMap<String, String>) -> BTreeSet<String> {
    let Some(summary) = pages.get("SUMMARY.md") else {
        return pages.keys().cloned().collect();
    };
    let mut out: BTreeSet<String> = page_refs(summary)
        .into_iter()
        .filter_map(|r| match r {
            Ref::Link { target, .. } => Some(resolve("SUMMARY.md", &target)),
            Ref::Include { .. } => None,
        })
        .collect();
    out.insert("SUMMARY.md".to_owned());
    out
}

/// The page as mdBook renders it: each line that includes a whole Markdown
/// page of the book is replaced by that page. Links in included text are
/// relative to the including page (mdBook does not rewrite them), so they
/// are checked there.
fn expand_markdown_includes(page: &str, text: &str, pages: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let target = page_refs(line).into_iter().find_map(|r| match r {
            Ref::Include {
                path, anchor: None, ..
            } => pages.get(&resolve(page, &path)),
            _ => None,
        });
        match target {
            Some(included) => {
                out.push_str(included);
                out.push('\n');
            }
            None => out.push_str(line),
        }
    }
    out
}

/// Checks every reference of the book. `pages` are the book's Markdown
/// files (relative to `src/`); `file_exists` and `file_text` answer for
/// anything else, given a path relative to `src/`. Links and anchors are
/// checked on rendered pages after their Markdown includes are expanded;
/// includes are checked on every file, relative to that file, as mdBook
/// resolves them.
fn check_links(
    pages: &BTreeMap<String, String>,
    file_exists: &dyn Fn(&str) -> bool,
    file_text: &dyn Fn(&str) -> Option<String>,
) -> Vec<String> {
    let rendered: BTreeMap<String, String> = rendered_pages(pages)
        .into_iter()
        .filter_map(|p| {
            let text = pages.get(&p)?;
            Some((p.clone(), expand_markdown_includes(&p, text, pages)))
        })
        .collect();
    let ids: BTreeMap<&str, BTreeSet<String>> = rendered
        .iter()
        .map(|(p, t)| (p.as_str(), page_ids(t)))
        .collect();
    let mut problems = Vec::new();
    for (page, text) in &rendered {
        for r in page_refs(text) {
            let Ref::Link { line, target } = r else {
                continue;
            };
            if target.is_empty() || is_external(&target) {
                continue;
            }
            let (path, frag) = match target.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                page.clone()
            } else {
                // mdBook rewrites .md links to .html; accept either.
                let p = resolve(page, path);
                match p.strip_suffix(".html") {
                    Some(stem) if pages.contains_key(&format!("{stem}.md")) => {
                        format!("{stem}.md")
                    }
                    _ => p,
                }
            };
            if let Some(page_ids) = ids.get(resolved.as_str()) {
                if let Some(f) = frag
                    && !page_ids.contains(f)
                {
                    problems.push(format!(
                        "{page}:{line}: link {target:?}: no anchor #{f} in {resolved}"
                    ));
                }
            } else if pages.contains_key(&resolved) {
                problems.push(format!(
                    "{page}:{line}: link {target:?}: {resolved} is not in SUMMARY.md"
                ));
            } else if !file_exists(&resolved) {
                problems.push(format!(
                    "{page}:{line}: link {target:?}: no file {resolved}"
                ));
            }
        }
    }
    for (page, text) in pages {
        for r in page_refs(text) {
            let Ref::Include { line, path, anchor } = r else {
                continue;
            };
            let resolved = resolve(page, &path);
            let text = pages.get(&resolved).cloned().or_else(|| {
                file_exists(&resolved)
                    .then(|| file_text(&resolved))
                    .flatten()
            });
            match (text, anchor) {
                (None, _) => problems.push(format!(
                    "{page}:{line}: include {path:?}: no file {resolved}"
                )),
                (Some(t), Some(a)) => {
                    if !t.contains(&format!("ANCHOR: {a}"))
                        || !t.contains(&format!("ANCHOR_END: {a}"))
                    {
                        problems.push(format!(
                            "{page}:{line}: include {path:?}: no ANCHOR {a} in {resolved}"
                        ));
                    }
                }
                (Some(_), None) => {}
            }
        }
    }
    problems
}

#[test]
fn internal_links_anchors_and_includes_resolve() {
    let src = book_src();
    let pages = book_pages();
    let exists = |rel: &str| src.join(rel).exists();
    let read = |rel: &str| std::fs::read_to_string(src.join(rel)).ok();
    let problems = check_links(&pages, &exists, &read);
    assert!(problems.is_empty(), "broken:\n{}", problems.join("\n"));
    // Not vacuous: the book does link across pages, to clauses and includes.
    let all_refs: Vec<Ref> = pages.values().flat_map(|t| page_refs(t)).collect();
    assert!(
        all_refs
            .iter()
            .any(|r| matches!(r, Ref::Link { target, .. } if target.contains("#r-idem.")))
    );
    assert!(all_refs.iter().any(|r| matches!(r, Ref::Include { .. })));
}

#[test]
fn heading_ids_match_mdbook() {
    // Observed from `mdbook build` (0.5.4) on these exact headings.
    let page = "# Title here\n\n## `Prefer: wait`\n\n## 409 — in use (really)\n\n\
                ## Retry-After, honoured!\n\n## A & B <em>x</em>\n\n## Foo\n\n## Foo\n\n\
                ## idempotency_key_in_use\n\n## Café Ünïcode 2^n\n\n## Explicit { #custom-id }\n\n\
                ```text\n## not a heading\n```\n\nr[idem.a.b]\nA server MUST.\n\n\
                <div id=\"raw-html\"></div>\n";
    let ids = page_ids(page);
    let want: BTreeSet<String> = [
        "title-here",
        "prefer-wait",
        "409--in-use-really",
        "retry-after-honoured",
        "a--b-x",
        "foo",
        "foo-1",
        "idempotency_key_in_use",
        "café-ünïcode-2n",
        "custom-id",
        "r-idem.a.b",
        "raw-html",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(ids, want);
}

#[test]
fn link_checker_catches_broken_links_anchors_and_includes() {
    let pages: BTreeMap<String, String> = [
        (
            "a.md",
            "# A\n\n## Two words\n\nr[idem.x.y]\nMUST.\n\n[ok](b.md) [ok](b.md#deep) \
             [ok](#two-words) [ok](a.md#r-idem.x.y) [ok](b.html#deep) [ext](https://x.invalid/nope)\n\
             `[in code](nowhere.md)`\n\n```text\n[in fence](nowhere.md)\n```\n",
        ),
        ("b.md", "# B\n\n## Deep\n\n![plot](sim/p.svg)\n"),
        ("sub/c.md", "[up](../a.md#two-words)\n\n```json\n{{#include ../../data.json}}\n```\n"),
    ]
    .into_iter()
    .map(|(p, t)| (p.to_owned(), t.to_owned()))
    .collect();
    let files: BTreeMap<&str, &str> = [
        ("sim/p.svg", "<svg/>"),
        ("../data.json", "{}"),
        (
            "../code.rs",
            "// ANCHOR: loop\nfn f() {}\n// ANCHOR_END: loop\n",
        ),
    ]
    .into_iter()
    .collect();
    let exists = |p: &str| files.contains_key(p);
    let read = |p: &str| files.get(p).map(|s| (*s).to_owned());
    assert_eq!(check_links(&pages, &exists, &read), Vec::<String>::new());

    let broken = |extra_page: &str| {
        let mut p = pages.clone();
        p.insert("bad.md".to_owned(), extra_page.to_owned());
        check_links(&p, &exists, &read)
    };
    assert_eq!(broken("[x](missing.md)").len(), 1, "missing page");
    assert_eq!(broken("[x](b.md#nope)").len(), 1, "missing anchor");
    assert_eq!(broken("[x](#nope)").len(), 1, "missing same-page anchor");
    assert_eq!(
        broken("[x](a.md#r-idem.x.z)").len(),
        1,
        "unknown clause anchor"
    );
    assert_eq!(broken("[x](a.md#foo-1)").len(), 1, "no second heading");
    assert_eq!(broken("<a href=\"b.md#gone\">x</a>").len(), 1, "html link");
    assert_eq!(broken("![x](sim/missing.svg)").len(), 1, "missing image");
    assert_eq!(broken("[ref]: nowhere.md").len(), 1, "reference definition");
    assert_eq!(
        broken("{{#include ../nothing.json}}").len(),
        1,
        "missing include"
    );
    assert_eq!(
        broken("{{#include ../code.rs:loop}}").len(),
        0,
        "anchored include"
    );
    assert_eq!(
        broken("{{#include ../code.rs:other}}").len(),
        1,
        "missing anchor"
    );
    assert_eq!(broken("{{#include ../code.rs:1:2}}").len(), 0, "line range");
    assert_eq!(broken("\\{{#include ../nothing.json}}").len(), 0, "escaped");

    // With a SUMMARY.md, only listed pages render; an included fragment's
    // links count from the page that includes it.
    let mut book = pages.clone();
    book.insert(
        "SUMMARY.md".to_owned(),
        "[A](a.md)\n- [B](b.md)\n- [C](sub/c.md)\n".to_owned(),
    );
    book.insert(
        "frag.md".to_owned(),
        "## From fragment\n\n[x](b.md#deep)\n".to_owned(),
    );
    book.insert(
        "a.md".to_owned(),
        format!(
            "{}\n{{{{#include frag.md}}}}\n[y](#from-fragment)\n",
            pages["a.md"]
        ),
    );
    assert_eq!(check_links(&book, &exists, &read), Vec::<String>::new());
    book.insert(
        "sub/c.md".to_owned(),
        "{{#include ../frag.md}}\n".to_owned(),
    );
    assert_eq!(
        check_links(&book, &exists, &read).len(),
        1,
        "fragment link resolved from sub/ breaks"
    );
    book.insert("sub/c.md".to_owned(), "[x](../frag.md)\n".to_owned());
    assert_eq!(
        check_links(&book, &exists, &read).len(),
        1,
        "link to an unlisted page"
    );
}

// ---------------------------------------------------------------------------
// Error codes: anchors for problem `type` URIs, and the status per profile

/// The id of a heading, given the text after its `#`s: an explicit
/// `{#id}` at its end, or the id mdBook derives from its text.
fn heading_id(body: &str) -> String {
    let body = body.trim();
    if let Some(open) = body.rfind("{#")
        && body.ends_with('}')
    {
        return body[open + 2..body.len() - 1].trim().to_owned();
    }
    normalize_id(&heading_text(body))
}

/// The text of the section under the heading whose id is `id`, up to the
/// next heading of the same or a higher level.
fn section<'a>(page: &'a str, id: &str) -> Option<&'a str> {
    let mut start = None;
    let mut level = 0;
    let mut offset = 0;
    for line in page.split_inclusive('\n') {
        let t = line.trim();
        let hashes = t.chars().take_while(|&c| c == '#').count();
        let is_heading = (1..=6).contains(&hashes) && t[hashes..].starts_with(' ');
        if is_heading {
            if let Some(s) = start
                && hashes <= level
            {
                return Some(&page[s..offset]);
            }
            if start.is_none() && heading_id(t[hashes..].trim()) == id {
                start = Some(offset);
                level = hashes;
            }
        }
        offset += line.len();
    }
    start.map(|s| &page[s..])
}

// clause: idem.errors.type-uri, idem.errors.profiles
#[test]
fn every_error_code_has_its_section_with_the_status_under_each_profile() {
    let errors = std::fs::read_to_string(book_src().join("errors.md")).expect("errors.md");
    let ids = page_ids(&errors);
    let mut problems = Vec::new();
    for code in ErrorCode::ALL {
        let uri = idem_spec::Problem::new(code, Profile::Reference, "x").type_uri;
        let anchor = uri.rsplit_once('#').map(|(_, a)| a).unwrap_or_default();
        assert_eq!(anchor, code.as_str());
        if !ids.contains(anchor) {
            problems.push(format!("no section with id {anchor} (type URI {uri})"));
            continue;
        }
        let body = section(&errors, anchor).unwrap_or_default();
        for p in Profile::ALL {
            let row = format!(
                "| `{}` | {} | `{}` |",
                p.as_str(),
                code.status(p),
                code.wire_code(p)
            );
            if !body.contains(&row) {
                problems.push(format!("section {anchor} lacks the row {row}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn section_finder_stops_at_the_next_heading() {
    let page = "# E\n\n## one\n\nbody 1\n\n### detail\n\nmore\n\n## two\n\nbody 2\n";
    assert_eq!(
        section(page, "one"),
        Some("## one\n\nbody 1\n\n### detail\n\nmore\n\n")
    );
    assert_eq!(section(page, "two"), Some("## two\n\nbody 2\n"));
    assert_eq!(section(page, "three"), None);
    let explicit = "## Key in use (`x_in_use`) {#x_in_use}\n\nbody\n\n## next\n";
    assert_eq!(
        section(explicit, "x_in_use"),
        Some("## Key in use (`x_in_use`) {#x_in_use}\n\nbody\n\n")
    );
    assert_eq!(section(explicit, "key-in-use-x_in_use"), None);
}

// ---------------------------------------------------------------------------
// The worked retry schedule (full jitter, Retry-After, deadline)

// ANCHOR: jitter
/// SplitMix64: a tiny, fully specified random generator, so that anyone can
/// reproduce the book's sample draws in any language.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), from the top 53 bits.
    fn next_unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform whole microseconds in [lo, hi): lo + floor(u * (hi - lo)),
    /// or lo when the range is empty. One output per draw, always.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        let u = self.next_unit();
        if hi <= lo {
            return lo;
        }
        lo + (u * (hi - lo) as f64) as u64
    }
}

const BASE_US: u64 = 500_000;
const CAP_US: u64 = 20_000_000;

/// The ceiling before retry `n`, where `n` counts the retries already made
/// (0 before the first retry): min(cap, base * 2^n).
fn ceiling_us(n: u32) -> u64 {
    let factor = 1u64.checked_shl(n).unwrap_or(u64::MAX);
    CAP_US.min(BASE_US.saturating_mul(factor))
}

/// Full jitter (the default): random(0, ceiling).
fn full_jitter_us(n: u32, rng: &mut SplitMix64) -> u64 {
    rng.between(0, ceiling_us(n))
}

/// Equal jitter: half the ceiling, plus random(0, half the ceiling).
fn equal_jitter_us(n: u32, rng: &mut SplitMix64) -> u64 {
    let half = ceiling_us(n) / 2;
    half + rng.between(0, half)
}

/// Decorrelated jitter: min(cap, random(base, 3 * previous sleep)), where the
/// previous sleep starts at base. It ignores `n` and keeps its own state.
fn decorrelated_jitter_us(previous_us: u64, rng: &mut SplitMix64) -> u64 {
    CAP_US.min(rng.between(BASE_US, 3 * previous_us))
}

/// No jitter: the ceiling itself. Every client that failed together retries
/// together, which is the failure mode jitter exists to break.
fn no_jitter_us(n: u32) -> u64 {
    ceiling_us(n)
}
// ANCHOR_END: jitter

// ANCHOR: retry_loop
/// What one attempt produced, as a retry loop sees it.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// A response arrived after `took_us`. `in_use` is true when the body is
    /// a problem with code `idempotency_key_in_use`; `retry_after_s` is the
    /// `Retry-After` header in seconds, if any.
    Response {
        status: u16,
        in_use: bool,
        retry_after_s: Option<u64>,
        took_us: u64,
    },
    /// No response: connection refused or reset, or the attempt's timeout
    /// fired. The request may or may not have been executed.
    NoResponse { took_us: u64 },
}

/// The allowlist. Every request this loop sends carries an idempotency key,
/// which is what makes 500 and "no response" safe to retry.
fn retryable(outcome: Outcome) -> bool {
    match outcome {
        Outcome::NoResponse { .. } => true,
        Outcome::Response { status, in_use, .. } => match status {
            408 | 429 | 500 | 502 | 503 | 504 => true,
            409 => in_use,
            _ => false,
        },
    }
}

const MAX_ATTEMPTS: u32 = 3;
const DEADLINE_US: u64 = 30_000_000;
const ATTEMPT_TIMEOUT_US: u64 = 10_000_000;

/// One line of a retry schedule.
#[derive(Debug, Clone)]
struct Step {
    attempt: u32,
    start_us: u64,
    timeout_us: u64,
    outcome: Outcome,
    decision: Decision,
}

#[derive(Debug, Clone)]
enum Decision {
    Done,
    Retry {
        ceiling_us: u64,
        drawn_us: u64,
        delay_us: u64,
    },
    GiveUp(&'static str),
}

/// A complete retry loop. `send(attempt, timeout_us)` performs one attempt,
/// with the same `Idempotency-Key` every time; time is counted, not slept,
/// so the schedule is reproducible.
fn retry_loop(mut send: impl FnMut(u32, u64) -> Outcome, rng: &mut SplitMix64) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut now = 0;
    for attempt in 1..=MAX_ATTEMPTS {
        // Each attempt gets what is left of the one deadline, at most 10 s.
        let timeout_us = ATTEMPT_TIMEOUT_US.min(DEADLINE_US - now);
        let outcome = send(attempt, timeout_us);
        let start_us = now;
        now += match outcome {
            Outcome::Response { took_us, .. } | Outcome::NoResponse { took_us } => {
                took_us.min(timeout_us)
            }
        };
        let decision = if !retryable(outcome) {
            Decision::Done
        } else if attempt == MAX_ATTEMPTS {
            Decision::GiveUp("attempts exhausted")
        } else {
            let ceiling_us = ceiling_us(attempt - 1);
            let drawn_us = full_jitter_us(attempt - 1, rng);
            // Retry-After is a floor on the delay, never a reason to wait less.
            let hint_us = match outcome {
                Outcome::Response { retry_after_s, .. } => retry_after_s.unwrap_or(0) * 1_000_000,
                Outcome::NoResponse { .. } => 0,
            };
            let delay_us = drawn_us.max(hint_us);
            if now + delay_us >= DEADLINE_US {
                Decision::GiveUp("the next attempt would start past the deadline")
            } else {
                Decision::Retry {
                    ceiling_us,
                    drawn_us,
                    delay_us,
                }
            }
        };
        let stop = !matches!(decision, Decision::Retry { .. });
        if let Decision::Retry { delay_us, .. } = decision {
            now += delay_us;
        }
        steps.push(Step {
            attempt,
            start_us,
            timeout_us,
            outcome,
            decision,
        });
        if stop {
            break;
        }
    }
    steps
}
// ANCHOR_END: retry_loop

/// The seed of every sample in the book.
const SEED: u64 = 42;

/// Microseconds, shown to the millisecond (rounded down).
fn ms(us: u64) -> String {
    let (s, ms) = (us / 1_000_000, us % 1_000_000 / 1000);
    if us >= 1_000_000 && ms == 0 {
        format!("{s} s")
    } else if us >= 1_000_000 {
        format!("{s}.{ms:03} s")
    } else {
        format!("{ms} ms")
    }
}

fn jitter_table() -> String {
    let mut full = SplitMix64(SEED);
    let mut equal = SplitMix64(SEED);
    let mut decor = SplitMix64(SEED);
    let mut prev = BASE_US;
    let mut s = String::from(
        "| Retry n | Exponential, no jitter: min(20 s, 500 ms × 2ⁿ) | Full (default) | Equal | Decorrelated |\n\
         |---|---|---|---|---|\n",
    );
    for n in 0..7 {
        let d = decorrelated_jitter_us(prev, &mut decor);
        prev = d;
        writeln!(
            s,
            "| {n} | {} | {} | {} | {} |",
            ms(no_jitter_us(n)),
            ms(full_jitter_us(n, &mut full)),
            ms(equal_jitter_us(n, &mut equal)),
            ms(d),
        )
        .unwrap();
    }
    s
}

fn describe(o: Outcome) -> String {
    match o {
        Outcome::NoResponse { took_us } => format!("no response (timed out after {})", ms(took_us)),
        Outcome::Response {
            status,
            in_use,
            retry_after_s,
            took_us,
        } => {
            let mut d = format!("{status}");
            if in_use {
                d.push_str(" `idempotency_key_in_use`");
            }
            if let Some(r) = retry_after_s {
                write!(d, ", `Retry-After: {r}`").unwrap();
            }
            write!(d, " after {}", ms(took_us)).unwrap();
            d
        }
    }
}

fn schedule_table(steps: &[Step]) -> String {
    let mut s = String::from(
        "| Attempt | Starts at | Timeout | Outcome | Ceiling | Drawn | Waits | Then |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for st in steps {
        let (ceiling, drawn, waits, then) = match &st.decision {
            Decision::Done => ("".into(), "".into(), "".into(), "return it".to_owned()),
            Decision::GiveUp(why) => ("".into(), "".into(), "".into(), format!("give up: {why}")),
            Decision::Retry {
                ceiling_us,
                drawn_us,
                delay_us,
            } => (
                ms(*ceiling_us),
                ms(*drawn_us),
                ms(*delay_us),
                "retry, same key".to_owned(),
            ),
        };
        writeln!(
            s,
            "| {} | {} | {} | {} | {ceiling} | {drawn} | {waits} | {then} |",
            st.attempt,
            ms(st.start_us),
            ms(st.timeout_us),
            describe(st.outcome),
        )
        .unwrap();
    }
    s
}

/// Scenario A: a 503, then an in-flight 409 with `Retry-After: 2`, then 201.
fn scenario_a() -> Vec<Step> {
    let script = [
        Outcome::Response {
            status: 503,
            in_use: false,
            retry_after_s: None,
            took_us: 120_000,
        },
        Outcome::Response {
            status: 409,
            in_use: true,
            retry_after_s: Some(2),
            took_us: 80_000,
        },
        Outcome::Response {
            status: 201,
            in_use: false,
            retry_after_s: None,
            took_us: 150_000,
        },
    ];
    retry_loop(|a, _| script[a as usize - 1], &mut SplitMix64(SEED))
}

/// Scenario B: the server hangs; each attempt times out, the third with a
/// timeout cut short by the deadline.
fn scenario_b() -> Vec<Step> {
    retry_loop(
        |_, timeout_us| Outcome::NoResponse {
            took_us: timeout_us,
        },
        &mut SplitMix64(SEED),
    )
}

/// Scenario C: a 429 whose `Retry-After: 60` lands past the deadline.
fn scenario_c() -> Vec<Step> {
    retry_loop(
        |_, _| Outcome::Response {
            status: 429,
            in_use: false,
            retry_after_s: Some(60),
            took_us: 90_000,
        },
        &mut SplitMix64(SEED),
    )
}

fn error_code_table() -> String {
    let mut s = String::from(
        "| Code | `reference` | `ietf-draft` | `stripe` | `resend` | Retryable |\n\
         |---|---|---|---|---|---|\n",
    );
    for code in ErrorCode::ALL {
        write!(s, "| [`{0}`](errors.md#{0})", code.as_str()).unwrap();
        for p in Profile::ALL {
            if code.wire_code(p) == code.as_str() {
                write!(s, " | {}", code.status(p)).unwrap();
            } else {
                write!(s, " | {} `{}`", code.status(p), code.wire_code(p)).unwrap();
            }
        }
        writeln!(s, " | {} |", if code.retryable() { "yes" } else { "no" }).unwrap();
    }
    s
}

/// One section per JSON Schema the spec crate generates, each including the
/// committed file, so a new schema appears in the book as soon as the
/// tables are regenerated (and the freshness test says when they must be).
fn schema_sections() -> String {
    let mut s = String::new();
    for (name, schema) in idem_spec::generate::json_schemas() {
        let value = serde_json::to_value(&schema).unwrap();
        let description = value["description"]
            .as_str()
            .unwrap_or_default()
            .replace("[`", "`")
            .replace("`]", "`");
        writeln!(
            s,
            "## {name}\n\n{description}\n\n```json\n\
             {{{{#include ../../../spec/generated/schemas/{name}.schema.json}}}}\n```\n"
        )
        .unwrap();
    }
    s
}

/// The generated tables, keyed by path under `book/src/`.
fn tables() -> BTreeMap<&'static str, String> {
    let note = "<!-- generated by spec/tests/book.rs; regenerate with \
                IDEM_BLESS=1 cargo test -p idem-spec --test book -->\n\n";
    [
        ("tables/error-codes.md", error_code_table()),
        ("tables/jitter-sample.md", jitter_table()),
        ("tables/schemas.md", schema_sections()),
        ("tables/schedule-a.md", schedule_table(&scenario_a())),
        ("tables/schedule-b.md", schedule_table(&scenario_b())),
        ("tables/schedule-c.md", schedule_table(&scenario_c())),
    ]
    .into_iter()
    .map(|(k, v)| (k, format!("{note}{v}")))
    .collect()
}

#[test]
fn generated_tables_are_fresh() {
    let src = book_src();
    let bless = std::env::var_os("IDEM_BLESS").is_some();
    let mut stale = Vec::new();
    for (rel, text) in tables() {
        let path = src.join(rel);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
            continue;
        }
        if bless {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
        } else {
            stale.push(rel);
        }
    }
    assert!(
        stale.is_empty(),
        "stale book tables {stale:?}; run IDEM_BLESS=1 cargo test -p idem-spec --test book"
    );
}

// clause: idem.client.backoff-jitter
#[test]
fn jitter_draws_stay_inside_their_bounds() {
    assert_eq!(
        (0..8).map(ceiling_us).collect::<Vec<_>>(),
        [
            500_000, 1_000_000, 2_000_000, 4_000_000, 8_000_000, 16_000_000, 20_000_000, 20_000_000
        ]
    );
    assert_eq!(ceiling_us(200), CAP_US, "no overflow for large n");
    let mut rng = SplitMix64(7);
    let mut prev = BASE_US;
    for i in 0..10_000u32 {
        let n = i % 10;
        assert!(full_jitter_us(n, &mut rng) < ceiling_us(n).max(1));
        let e = equal_jitter_us(n, &mut rng);
        assert!(e >= ceiling_us(n) / 2 && e <= ceiling_us(n));
        let d = decorrelated_jitter_us(prev, &mut rng);
        assert!((BASE_US..=CAP_US).contains(&d));
        prev = d;
    }
    // SplitMix64 reference values, so ports can check themselves: seed 0,
    // and seed 42 (the book's seed; the same outputs idem-client publishes
    // in its backoff vectors).
    assert_eq!(SplitMix64(0).next_u64(), 0xE220_A839_7B1D_CDAF);
    let mut rng = SplitMix64(SEED);
    assert_eq!(rng.next_u64(), 13_679_457_532_755_275_413);
    assert_eq!(rng.next_u64(), 2_949_826_092_126_892_291);
}

// clause: idem.client.retry-after, idem.client.deadline, idem.client.max-attempts
#[test]
fn the_worked_schedules_keep_the_client_rules() {
    let a = scenario_a();
    assert_eq!(a.len(), 3);
    assert!(matches!(a[2].decision, Decision::Done));
    // Retry-After: 2 beat the drawn delay (at most 1 s) on the second retry.
    assert!(matches!(
        a[1].decision,
        Decision::Retry {
            drawn_us,
            delay_us: 2_000_000,
            ..
        } if drawn_us < 1_000_000
    ));

    let b = scenario_b();
    assert_eq!(b.len(), 3, "at most 3 attempts");
    let last = &b[2];
    assert!(
        last.timeout_us < ATTEMPT_TIMEOUT_US,
        "timeout carved from the deadline"
    );
    assert_eq!(last.start_us + last.timeout_us, DEADLINE_US);
    assert!(matches!(last.decision, Decision::GiveUp(_)));

    let c = scenario_c();
    assert_eq!(c.len(), 1, "a hint past the deadline fails at once");
    assert!(matches!(c[0].decision, Decision::GiveUp(_)));

    // The prose of quick-start.md and client.md quotes two of the figures.
    let Decision::Retry { drawn_us, .. } = a[1].decision else {
        panic!("second attempt of scenario A retries")
    };
    // Line breaks in the prose are only whitespace.
    let read = |page: &str| {
        let text = std::fs::read_to_string(book_src().join(page)).unwrap();
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let (quick, client) = (read("quick-start.md"), read("client.md"));
    assert!(quick.contains(&format!("drawn delay was {}", ms(drawn_us))));
    let cut = ms(b[2].timeout_us);
    assert!(quick.contains(&format!("only {cut} of the 30 s deadline")));
    assert!(client.contains(&format!("from 10 s to {cut}")));

    // No schedule ever runs past the deadline.
    for s in [&a, &b, &c] {
        for st in s.iter() {
            assert!(st.start_us + st.timeout_us <= DEADLINE_US);
        }
    }
}

// clause: idem.client.allowlist, idem.client.500-with-key
#[test]
fn the_loop_retries_only_the_allowlist() {
    let resp = |status, in_use| Outcome::Response {
        status,
        in_use,
        retry_after_s: None,
        took_us: 1,
    };
    for s in [408, 429, 500, 502, 503, 504] {
        assert!(retryable(resp(s, false)), "{s}");
    }
    assert!(retryable(resp(409, true)));
    assert!(retryable(Outcome::NoResponse { took_us: 1 }));
    for s in [200, 201, 400, 401, 402, 403, 404, 409, 413, 422, 501] {
        assert!(!retryable(resp(s, false)), "{s}");
    }
}

// ---------------------------------------------------------------------------
// What the book says about the repository and its sources

/// Tracker references in a page's prose: "issue 13", "Issue #42", "PR #7",
/// "pull request 12", "commit 5b09b21". They mean nothing to a reader of
/// the published book; what they stand for belongs in the sentence itself,
/// and a public source belongs in a link (whose target is not prose).
fn tracker_references(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        // Link targets and inline code are not prose.
        let mut prose = String::new();
        let mut rest = without_code_spans(line);
        while let Some(i) = rest.find("](") {
            prose.push_str(&rest[..i + 1]);
            rest = match rest[i..].find(')') {
                Some(j) => rest[i + j + 1..].to_owned(),
                None => String::new(),
            };
        }
        prose.push_str(&rest);
        let words: Vec<String> = prose
            .split(|c: char| c.is_whitespace() || c == '(' || c == ',')
            .filter(|w| !w.is_empty())
            .map(|w| w.to_lowercase())
            .collect();
        for pair in words.windows(2) {
            let word = pair[0].as_str();
            let next = pair[1].trim_end_matches(['.', ';', ':', ')', '\'', '’', 's']);
            let number = next.trim_start_matches('#');
            let is_number = !number.is_empty() && number.chars().all(|c| c.is_ascii_digit());
            let is_hash = number.len() >= 7 && number.chars().all(|c| c.is_ascii_hexdigit());
            let tracker = matches!(word, "issue" | "issues" | "pr" | "ticket") && is_number
                || word == "request" && next.starts_with('#') && is_number
                || word == "commit" && is_hash;
            if tracker {
                out.push((n, format!("{word} {next}")));
            }
        }
    }
    out
}

#[test]
fn the_book_points_at_no_tracker() {
    let mut found = Vec::new();
    for (page, text) in book_pages() {
        for (line, what) in tracker_references(&text) {
            found.push(format!("{page}:{line}: {what}"));
        }
    }
    assert!(
        found.is_empty(),
        "tracker references in the published book (say what they stand for instead):\n{}",
        found.join("\n")
    );
}

#[test]
fn tracker_checker_finds_references_in_prose_only() {
    let page = "Issue 13's targets are met.\n\
                as asked in issue #46.\n\
                measured at commit 5b09b21 here\n\
                see PR #7, and pull request #12\n\
                ```text\nissue 99 in a code block\n```\n\
                a link [the draft's issue list](https://github.com/x/y/issues/42) and `issue 5`\n\
                an issue with 3 parts, issues of 2026, a commit message\n";
    let found: Vec<String> = tracker_references(page)
        .into_iter()
        .map(|(_, w)| w)
        .collect();
    assert_eq!(
        found,
        [
            "issue 13",
            "issue #46",
            "commit 5b09b21",
            "pr #7",
            "request #12"
        ]
    );
}

/// `x-idempotency.a.b` paths named in the book's prose.
fn x_idempotency_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (_, line) in prose_lines(text) {
        let mut rest = line;
        while let Some(i) = rest.find("x-idempotency.") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-'))
                .unwrap_or(tail.len());
            out.push(tail[..end].trim_end_matches('.').to_owned());
            rest = &tail[end..];
        }
    }
    out
}

#[test]
fn every_x_idempotency_member_the_book_names_is_published() {
    let doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(support::workspace_root().join("spec/generated/openapi.json"))
            .expect("spec/generated/openapi.json"),
    )
    .expect("the generated OpenAPI document parses");
    let mut named = 0;
    for (page, text) in book_pages() {
        for path in x_idempotency_paths(&text) {
            named += 1;
            let pointer = format!("/{}", path.replace('.', "/"));
            assert!(
                doc.pointer(&pointer).is_some(),
                "{page} names {path}, which the generated OpenAPI document does not have"
            );
        }
    }
    assert!(named > 0, "the book names no x-idempotency member");
    // One name for the lease, the one the served document uses too.
    let ext = doc["x-idempotency"].as_object().expect("x-idempotency");
    assert!(
        !ext.contains_key("default_lease_secs"),
        "the lease is x-idempotency.policy.lease_secs, in the generated document as in the served one"
    );
}

#[test]
fn x_idempotency_paths_are_read_from_prose() {
    let page = "as `x-idempotency.policy.lease_secs` in the document.\n\
                ```json\nx-idempotency.in.code\n```\n\
                and x-idempotency.policy.replay_window_secs.\n";
    assert_eq!(
        x_idempotency_paths(page),
        [
            "x-idempotency.policy.lease_secs",
            "x-idempotency.policy.replay_window_secs"
        ]
    );
}

/// The number of lines the book gives for the example app,
/// `examples/idempotent-notes`: "in N lines of Rust".
#[test]
fn the_example_app_is_as_long_as_the_book_says() {
    let root = support::workspace_root().join("examples/idempotent-notes/src");
    let lines: usize = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| {
            std::fs::read_to_string(root.join(f))
                .unwrap_or_else(|e| panic!("{f}: {e}"))
                .lines()
                .count()
        })
        .sum();
    let forking = std::fs::read_to_string(book_src().join("forking.md")).unwrap();
    let forking = forking.split_whitespace().collect::<Vec<_>>().join(" ");
    let stated = forking
        .find(" lines of Rust, `src/lib.rs` and `src/main.rs`")
        .and_then(|end| forking[..end].rsplit(' ').next())
        .and_then(|n| n.parse::<usize>().ok())
        .expect("forking.md says how many lines the example app has");
    assert_eq!(
        stated, lines,
        "forking.md says the example app has {stated} lines; src/lib.rs and src/main.rs have {lines}"
    );
}

/// The IETF draft revisions a page names: `draft-ietf-…-header-NN` in full,
/// and `draft -NN` (as in a link to the bibliography's `draft` entry).
fn draft_revisions(text: &str) -> Vec<String> {
    const FULL: &str = "draft-ietf-httpapi-idempotency-key-header-";
    let mut out = Vec::new();
    for (_, line) in prose_lines(text) {
        for (i, _) in line.match_indices(FULL) {
            let rev: String = line[i + FULL.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            out.push(rev);
        }
        for (i, _) in line.match_indices("draft -") {
            let rev: String = line[i + "draft -".len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if !rev.is_empty() {
                out.push(rev);
            }
        }
    }
    out
}

/// One revision of the IETF draft throughout: the one the bibliography's
/// `draft` entry names first, whose text the book quotes and whose section
/// numbers it gives. (The bibliography and the deviations appendix say
/// which later revision exists, as `-NN`, without naming it as the draft.)
#[test]
fn the_book_names_one_draft_revision() {
    let pages = book_pages();
    let entry = pages["bibliography.md"]
        .split("<a id=\"draft\"></a>")
        .nth(1)
        .expect("the bibliography has a draft entry");
    let revision = draft_revisions(entry)
        .into_iter()
        .next()
        .expect("the draft entry names its revision");
    let mut named = 0;
    for (page, text) in &pages {
        let revs = if page == "bibliography.md" {
            draft_revisions(entry.split("\n- ").next().unwrap_or_default())
        } else {
            draft_revisions(text)
        };
        for rev in revs {
            named += 1;
            assert_eq!(
                rev, revision,
                "{page} names draft -{rev}; the book quotes -{revision} (bibliography.md#draft)"
            );
        }
    }
    assert!(
        named >= 3,
        "the book names the draft's revision {named} times"
    );
    assert!(
        draft_revisions(
            "see [draft -07](bibliography.md#draft) and draft-ietf-httpapi-idempotency-key-header-09\n"
        ) == ["09", "07"],
        "the reader finds both spellings"
    );
}

/// Fence lines a reader would see wrong, as `page:line: why`: inside a
/// fenced block, a line that starts with the block's fence and carries text
/// after it is not a closing fence (CommonMark allows none), so everything
/// after it renders as code; and a page that ends inside a block.
fn broken_fences(page: &str, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut open: Option<(&str, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        let Some(f) = fence_marker(t) else {
            continue;
        };
        match open {
            None => open = Some((f, i + 1)),
            Some((o, _)) if t.starts_with(o) => {
                let rest = t.trim_start_matches(o.chars().next().unwrap_or('`'));
                if !rest.trim().is_empty() {
                    out.push(format!(
                        "{page}:{}: {t:?} closes nothing: text after a closing fence keeps the block open",
                        i + 1
                    ));
                }
                open = None;
            }
            Some(_) => {}
        }
    }
    if let Some((_, at)) = open {
        out.push(format!("{page}:{at}: a fenced block that never closes"));
    }
    out
}

#[test]
fn every_fenced_block_closes_on_a_line_of_its_own() {
    // The checker itself: the broken shape found once in operations.md.
    assert_eq!(
        broken_fences("t.md", "```console\n$ x\n``` With the library\ntext\n").len(),
        1
    );
    assert!(broken_fences("t.md", "```console\n$ x\n```\n\nWith the library\n").is_empty());
    assert_eq!(broken_fences("t.md", "```text\nnever closed\n").len(), 1);
    let problems: Vec<String> = book_pages()
        .iter()
        .flat_map(|(page, text)| broken_fences(page, text))
        .collect();
    assert!(problems.is_empty(), "{problems:#?}");
}
