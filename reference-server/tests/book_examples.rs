//! Every `console` example in the book that runs `curl` is sent, verbatim,
//! in reading order (the order of `SUMMARY.md`), to ONE live `idem-server`
//! started exactly as the quick start says: `cargo run -p idem-server`, no
//! flags, so it listens on `127.0.0.1:8080` with the demo tokens and keeps
//! its data in `./idem.db` of a fresh working directory. State carries from
//! one chapter to the next, as it does for a reader who follows the book
//! with one server: a key the quick start used is still used in the
//! responses chapter, and balances show every transfer made before them.
//!
//! What is compared, for each example:
//! - the status: the status line of a `-i` example; for a `-s` example, a
//!   2xx, or the `status` member of the problem document it shows;
//! - the headers shown, by value; and every contract header the server sent
//!   (`Content-Type`, `Location`, `ETag`, `Retry-After`,
//!   `Preference-Applied` and the replay marker `Idempotent-Replayed`) must
//!   be shown, so a missing marker is caught as surely as a wrong one;
//! - the body, member by member, both ways: a member the server sent and
//!   the book does not show is a failure, unless the shown object says it
//!   leaves members out with the explicit marker `…` (a bare ellipsis where
//!   a member would be). Nothing is elided silently.
//!
//! Generated ids (`tr_…`) and times (`created_at`) are not compared by
//! value: a time must be an RFC 3339 UTC timestamp, and an id the book
//! repeats must come back repeated (a replay names the same transfer) while
//! two ids the book shows as different must differ. A block whose response
//! is an illustration that a single curl cannot produce is written as
//! `text`, not `console`.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use idem_test_support::{ChildServer, TempDir};
use serde_json::Value;

/// The base URL the book's runnable examples use: the default `--listen`.
const BOOK_BASE: &str = "http://127.0.0.1:8080";

/// Prefixes of ids the server generates; their values are matched by
/// binding, not compared.
const ID_PREFIXES: [&str; 3] = ["tr_", "pay_", "ch_"];

/// Body members whose value is the server's clock: shown, but not compared.
const TIME_MEMBERS: [&str; 1] = ["created_at"];

// ---------------------------------------------------------------------------
// Reading the examples

/// One `curl` command as the book spells it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Curl {
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    data: Option<String>,
    /// `-i`: the response shown starts with the status line and headers.
    include: bool,
}

/// What the book shows under a command.
#[derive(Debug, Clone, PartialEq)]
struct Shown {
    status: Option<u16>,
    headers: Vec<(String, String)>,
    body: Option<Value>,
}

/// One command and the answer shown for it, with where it is in the book.
#[derive(Debug, Clone)]
struct Example {
    at: String,
    curl: Curl,
    shown: Shown,
}

/// Splits a shell command line the way `sh` would for the quoting the book
/// uses: single quotes, double quotes (with `\"`, `\\`, `\$` escapes) and
/// backslash escapes outside quotes.
fn shell_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err(format!("unclosed ' in {line:?}")),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(e @ ('"' | '\\' | '$' | '`')) => word.push(e),
                            Some(e) => {
                                word.push('\\');
                                word.push(e);
                            }
                            None => return Err(format!("unclosed \" in {line:?}")),
                        },
                        Some('$') => return Err(format!("shell expansion in {line:?}")),
                        Some(c) => word.push(c),
                        None => return Err(format!("unclosed \" in {line:?}")),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some(e) => word.push(e),
                    None => return Err(format!("trailing backslash in {line:?}")),
                }
            }
            '$' | '`' | '|' | '>' | '<' | ';' | '&' => {
                return Err(format!("shell syntax {c:?} in {line:?}: not a plain curl"));
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

/// Parses a `curl` command line (without the `$ ` prompt). Unknown options
/// are errors, so an example cannot use a flag this test would ignore.
fn parse_curl(line: &str) -> Result<Curl, String> {
    let words = shell_words(line)?;
    let mut it = words.into_iter();
    if it.next().as_deref() != Some("curl") {
        return Err(format!("not a curl command: {line:?}"));
    }
    let mut method = None;
    let mut url = None;
    let mut headers = Vec::new();
    let mut data = None;
    let mut include = false;
    while let Some(w) = it.next() {
        match w.as_str() {
            "-i" | "--include" => include = true,
            "-s" | "--silent" => {}
            "-si" | "-is" => include = true,
            "-X" | "--request" => method = Some(it.next().ok_or("-X without a method")?),
            "-H" | "--header" => {
                let h = it.next().ok_or("-H without a header")?;
                let (name, value) = h
                    .split_once(':')
                    .ok_or_else(|| format!("header without a colon: {h:?}"))?;
                headers.push((name.trim().to_owned(), value.trim().to_owned()));
            }
            "-d" | "--data" | "--data-raw" => {
                if data.is_some() {
                    return Err("several -d: not supported".into());
                }
                data = Some(it.next().ok_or("-d without data")?);
            }
            w if w.starts_with("http://") || w.starts_with("https://") => {
                if url.is_some() {
                    return Err("two URLs".into());
                }
                url = Some(w.to_owned());
            }
            other => {
                return Err(format!(
                    "curl option {other:?} is not understood by this test"
                ));
            }
        }
    }
    let url = url.ok_or("no URL")?;
    let method = method.unwrap_or_else(|| if data.is_some() { "POST" } else { "GET" }.into());
    Ok(Curl {
        method,
        url,
        headers,
        data,
        include,
    })
}

/// Parses the answer shown under a command.
fn parse_shown(text: &str, include: bool) -> Result<Shown, String> {
    let mut status = None;
    let mut headers = Vec::new();
    let body_text;
    if include {
        let mut lines = text.lines();
        let first = lines.next().ok_or("no status line")?;
        let code = first
            .strip_prefix("HTTP/1.1 ")
            .and_then(|rest| rest.split(' ').next())
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(|| format!("bad status line {first:?}"))?;
        status = Some(code);
        let mut rest = Vec::new();
        let mut in_headers = true;
        for line in lines {
            if in_headers {
                if line.trim().is_empty() {
                    in_headers = false;
                    continue;
                }
                let (n, v) = line
                    .split_once(':')
                    .ok_or_else(|| format!("bad header line {line:?}"))?;
                headers.push((n.trim().to_owned(), v.trim().to_owned()));
            } else {
                rest.push(line);
            }
        }
        body_text = rest.join("\n");
    } else {
        body_text = text.to_owned();
    }
    let body = if body_text.trim().is_empty() {
        None
    } else {
        let json = mark_elisions(&body_text)?;
        Some(
            serde_json::from_str(&json)
                .map_err(|e| format!("shown body is not JSON ({e}): {body_text:?}"))?,
        )
    };
    Ok(Shown {
        status,
        headers,
        body,
    })
}

/// The explicit elision marker: a bare `…` where an object member would be
/// says "this object has more members than shown".
const ELIDED: &str = "…";

/// Turns each bare `…` (outside strings) into the member `"…":null`, so the
/// shown text parses as JSON and the object remembers it was abridged. A `…`
/// anywhere else (an array element, a value) then fails to parse, which is
/// what it should do: only members may be left out.
fn mark_elisions(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in text.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '…' => out.push_str("\"…\":null"),
            '.' if out.ends_with("..") => {
                return Err(format!(
                    "\"...\" in a shown body: elide members with the marker {ELIDED}"
                ));
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// The `curl` examples of one page, in order. Blocks without a `$ curl`
/// (`$ cargo run …`) are not HTTP examples and are skipped; a block that
/// mixes curl with other commands is an error.
fn examples_in(page: &str, text: &str) -> Result<Vec<Example>, String> {
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((_, line)) = lines.next() {
        let fence = line.trim_start();
        if !fence.starts_with("```") {
            continue;
        }
        let lang = fence.trim_start_matches('`').trim();
        let mut block = Vec::new();
        for (n, l) in lines.by_ref() {
            if l.trim_start().starts_with("```") {
                break;
            }
            block.push((n + 1, l));
        }
        if lang != "console" {
            continue;
        }
        let has_curl = block.iter().any(|(_, l)| l.starts_with("$ curl"));
        if !has_curl {
            continue;
        }
        // Commands start with "$ " and continue while a line ends with "\";
        // the answer runs up to the next command.
        let mut i = 0;
        while i < block.len() {
            let (n, l) = block[i];
            if l.trim().is_empty() {
                i += 1;
                continue;
            }
            let Some(first) = l.strip_prefix("$ ") else {
                return Err(format!("{page}:{n}: text before the first command: {l:?}"));
            };
            let mut command = String::new();
            let mut part = first;
            loop {
                match part.strip_suffix('\\') {
                    Some(p) => {
                        command.push_str(p);
                        command.push(' ');
                        i += 1;
                        part = block.get(i).map(|(_, l)| *l).ok_or_else(|| {
                            format!("{page}:{n}: command continues past the block")
                        })?;
                    }
                    None => {
                        command.push_str(part);
                        i += 1;
                        break;
                    }
                }
            }
            let mut answer = Vec::new();
            while i < block.len() && !block[i].1.starts_with("$ ") {
                answer.push(block[i].1);
                i += 1;
            }
            let curl = parse_curl(&command).map_err(|e| format!("{page}:{n}: {e}"))?;
            let shown = parse_shown(answer.join("\n").trim(), curl.include)
                .map_err(|e| format!("{page}:{n}: {e}"))?;
            out.push(Example {
                at: format!("{page}:{n}"),
                curl,
                shown,
            });
        }
    }
    Ok(out)
}

fn book_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../book/src")
}

/// The book's pages in reading order: every `(page.md)` link of
/// `SUMMARY.md`, top to bottom.
fn reading_order(summary: &str) -> Vec<String> {
    let mut pages = Vec::new();
    for line in summary.lines() {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = &after[..end];
            if target.ends_with(".md") && !pages.iter().any(|p| p == target) {
                pages.push(target.to_owned());
            }
            rest = &after[end..];
        }
    }
    pages
}

/// Every curl example of the book, in reading order, with the page each
/// comes from. Pages that are not in `SUMMARY.md` are not published, so an
/// example on one would be an error.
fn book_examples() -> Vec<Example> {
    let src = book_src();
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).expect("read SUMMARY.md");
    let order = reading_order(&summary);
    assert!(order.len() >= 10, "SUMMARY.md lists only {order:?}");
    let mut out = Vec::new();
    for page in &order {
        let text = std::fs::read_to_string(src.join(page))
            .unwrap_or_else(|e| panic!("read {page} (listed in SUMMARY.md): {e}"));
        out.extend(examples_in(page, &text).unwrap_or_else(|e| panic!("{e}")));
    }
    // A curl example on a page the summary does not list would never be
    // read, and never run here.
    for entry in std::fs::read_dir(&src).expect("read book/src") {
        let path = entry.expect("dir entry").path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if name.ends_with(".md") && name != "SUMMARY.md" && !order.iter().any(|p| p == name) {
            let text = std::fs::read_to_string(&path).expect("read page");
            let stray = examples_in(name, &text).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                stray.is_empty(),
                "{name} has curl examples but is not in SUMMARY.md"
            );
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Comparing

/// Generated ids seen so far in one chapter: the book's id to the server's,
/// both ways, so a repeated id must stay repeated and distinct ids distinct.
#[derive(Default)]
struct Ids {
    shown_to_actual: BTreeMap<String, String>,
    actual_to_shown: BTreeMap<String, String>,
}

impl Ids {
    fn bind(&mut self, shown: &str, actual: &str) -> Result<(), String> {
        match (
            self.shown_to_actual.get(shown),
            self.actual_to_shown.get(actual),
        ) {
            (None, None) => {
                self.shown_to_actual
                    .insert(shown.to_owned(), actual.to_owned());
                self.actual_to_shown
                    .insert(actual.to_owned(), shown.to_owned());
                Ok(())
            }
            (Some(a), _) if a == actual => Ok(()),
            (Some(a), _) => Err(format!(
                "the book shows {shown} again, but the server answered {actual}, not {a}"
            )),
            (None, Some(s)) => Err(format!(
                "the book shows a new id {shown}, but the server answered {actual} again (shown before as {s})"
            )),
        }
    }
}

/// Splits text into literal runs and generated ids.
fn segments(text: &str) -> Vec<(bool, &str)> {
    let mut out = Vec::new();
    let mut lit_start = 0;
    let mut i = 0;
    let bytes = text.as_bytes();
    while i < bytes.len() {
        let at_word_start = i == 0 || !bytes[i - 1].is_ascii_alphanumeric() && bytes[i - 1] != b'_';
        let prefix = ID_PREFIXES
            .iter()
            .find(|p| at_word_start && text[i..].starts_with(**p));
        if let Some(p) = prefix {
            let end = i
                + p.len()
                + bytes[i + p.len()..]
                    .iter()
                    .take_while(|b| b.is_ascii_alphanumeric())
                    .count();
            if end > i + p.len() {
                if lit_start < i {
                    out.push((false, &text[lit_start..i]));
                }
                out.push((true, &text[i..end]));
                lit_start = end;
                i = end;
                continue;
            }
        }
        i += 1;
    }
    if lit_start < text.len() {
        out.push((false, &text[lit_start..]));
    }
    out
}

/// Compares a shown string with the actual one, ids bound rather than
/// compared.
fn match_text(shown: &str, actual: &str, ids: &mut Ids) -> Result<(), String> {
    let s = segments(shown);
    let a = segments(actual);
    let differ = || format!("shown {shown:?}, got {actual:?}");
    if s.len() != a.len() {
        return Err(differ());
    }
    for ((s_id, s_text), (a_id, a_text)) in s.iter().zip(&a) {
        match (s_id, a_id) {
            (true, true) => ids
                .bind(s_text, a_text)
                .map_err(|e| format!("{e} ({})", differ()))?,
            (false, false) if s_text == a_text => {}
            _ => return Err(differ()),
        }
    }
    Ok(())
}

/// Whether `s` is an RFC 3339 UTC timestamp as the server writes them
/// (`2026-12-01T10:15:02.417Z`, fraction optional).
fn is_utc_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| r.clone().all(|i| b.get(i).is_some_and(u8::is_ascii_digit));
    let shape = b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    if !shape || !s.ends_with('Z') {
        return false;
    }
    let tail = &s[19..s.len() - 1];
    tail.is_empty()
        || tail
            .strip_prefix('.')
            .is_some_and(|f| !f.is_empty() && f.bytes().all(|c| c.is_ascii_digit()))
}

/// Compares a shown body with the answer, both ways: every member shown
/// must be in the answer with a matching value, and every member of the
/// answer must be shown, unless the shown object carries the elision
/// marker. Arrays match element by element and must have the same length.
fn match_json(path: &str, shown: &Value, actual: &Value, ids: &mut Ids) -> Result<(), String> {
    match (shown, actual) {
        (Value::Object(s), Value::Object(a)) => {
            let abridged = s.contains_key(ELIDED);
            for (k, sv) in s {
                if k == ELIDED {
                    continue;
                }
                let p = format!("{path}/{k}");
                let av = a
                    .get(k)
                    .ok_or_else(|| format!("{p}: shown, but missing in the answer"))?;
                if TIME_MEMBERS.contains(&k.as_str()) {
                    let (Some(sv), Some(av)) = (sv.as_str(), av.as_str()) else {
                        return Err(format!("{p}: expected time strings, shown {sv}, got {av}"));
                    };
                    if !is_utc_timestamp(sv) || !is_utc_timestamp(av) {
                        return Err(format!(
                            "{p}: not an RFC 3339 UTC time: shown {sv:?}, got {av:?}"
                        ));
                    }
                    continue;
                }
                match_json(&p, sv, av, ids)?;
            }
            if !abridged {
                let unshown: Vec<_> = a.keys().filter(|k| !s.contains_key(*k)).collect();
                if !unshown.is_empty() {
                    return Err(format!(
                        "{path}: the answer has {unshown:?}, which the book neither shows nor elides with {ELIDED}"
                    ));
                }
            }
            Ok(())
        }
        (Value::Array(s), Value::Array(a)) => {
            if s.len() != a.len() {
                return Err(format!("{path}: shown {} items, got {}", s.len(), a.len()));
            }
            for (i, (sv, av)) in s.iter().zip(a).enumerate() {
                match_json(&format!("{path}/{i}"), sv, av, ids)?;
            }
            Ok(())
        }
        (Value::String(s), Value::String(a)) => {
            match_text(s, a, ids).map_err(|e| format!("{path}: {e}"))
        }
        (s, a) if s == a => Ok(()),
        (s, a) => Err(format!("{path}: shown {s}, got {a}")),
    }
}

/// An answer as received.
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

/// Headers of the contract: when the server sends one, a `-i` example must
/// show it (the replay marker above all: its absence says "first
/// execution").
const CONTRACT_HEADERS: [&str; 6] = [
    "content-type",
    "location",
    "etag",
    "retry-after",
    "preference-applied",
    "idempotent-replayed",
];

fn compare(example: &Example, got: &Answer, ids: &mut Ids) -> Result<(), String> {
    let shown = &example.shown;
    let body_text = || String::from_utf8_lossy(&got.body).into_owned();
    match shown.status {
        Some(status) if status != got.status => {
            return Err(format!(
                "status: shown {status}, got {} ({})",
                got.status,
                body_text()
            ));
        }
        Some(_) => {}
        // `-s` shows no status line: the body says it, as a problem's
        // `status`, or the answer must be a success.
        None => {
            let problem_status = shown
                .body
                .as_ref()
                .and_then(|b| b.get("status"))
                .and_then(Value::as_u64);
            match problem_status {
                Some(s) if u64::from(got.status) != s => {
                    return Err(format!(
                        "status: the shown problem says {s}, got {} ({})",
                        got.status,
                        body_text()
                    ));
                }
                Some(_) => {}
                None if !(200..300).contains(&got.status) => {
                    return Err(format!(
                        "status: a -s example shows a success, got {} ({})",
                        got.status,
                        body_text()
                    ));
                }
                None => {}
            }
        }
    }
    for (name, value) in &shown.headers {
        let actual: Vec<_> = got
            .headers
            .get_all(name.as_str())
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect();
        match actual.as_slice() {
            [one] => match_text(value, one, ids).map_err(|e| format!("header {name}: {e}"))?,
            [] => return Err(format!("header {name}: shown, but absent from the answer")),
            many => {
                return Err(format!(
                    "header {name}: sent {} times: {many:?}",
                    many.len()
                ));
            }
        }
    }
    if example.curl.include {
        for name in CONTRACT_HEADERS {
            let sent = got.headers.get(name);
            let is_shown = shown
                .headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case(name));
            if let (Some(v), false) = (sent, is_shown) {
                return Err(format!(
                    "header {name}: the server sent {v:?}, the book does not show it"
                ));
            }
        }
    }
    match &shown.body {
        Some(body) => {
            let actual: Value = serde_json::from_slice(&got.body)
                .map_err(|e| format!("body: not JSON ({e}): {:?}", body_text()))?;
            match_json("", body, &actual, ids).map_err(|e| format!("body {e}"))?;
        }
        None if !got.body.is_empty() => {
            return Err(format!("body: the book shows none, got {:?}", body_text()));
        }
        None => {}
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The live server

/// A running `idem-server` with its own SQLite file, killed and removed on
/// drop.
struct Server {
    base: String,
    _child: ChildServer,
    _dir: TempDir,
}

impl Server {
    async fn start(name: &str, extra: &[&str]) -> Server {
        let dir = TempDir::new(&format!("idem-book-{}", name.replace(['/', '.'], "-")));
        let db = format!("sqlite://{}", dir.join("idem.db").display());
        let child = ChildServer::command(env!("CARGO_BIN_EXE_idem-server"))
            .args(["--listen", "127.0.0.1:0", "--database-url", &db])
            .args(extra)
            .start()
            .await
            .expect("start idem-server");
        Server {
            base: child.base_url().to_owned(),
            _child: child,
            _dir: dir,
        }
    }
}

/// The server as the quick start runs it: the `idem-server` binary with no
/// arguments at all, in a fresh working directory (so `./idem.db` is new),
/// without `IDEM_TOKENS` (which would replace the demo callers). It must
/// announce exactly the book's address. Killed, and its directory removed,
/// on drop.
struct QuickStartServer {
    child: tokio::process::Child,
    _dir: TempDir,
}

/// How long to keep trying while another process holds 127.0.0.1:8080
/// (another run of this test in a parallel worktree, most likely).
const PORT_BUSY_PATIENCE: Duration = Duration::from_secs(180);

impl QuickStartServer {
    async fn start() -> QuickStartServer {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt};
        let deadline = tokio::time::Instant::now() + PORT_BUSY_PATIENCE;
        let mut pause = Duration::from_millis(200);
        loop {
            let dir = TempDir::new("idem-book-quick-start");
            let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem-server"))
                .current_dir(dir.path())
                .env_remove("IDEM_TOKENS")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("run idem-server");
            let stdout = child.stdout.take().expect("stdout");
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
                .await
                .expect("idem-server printed nothing within 60 s");
            if let Ok(Some(line)) = first {
                assert_eq!(
                    line,
                    format!("listening on {BOOK_BASE}"),
                    "the server does not serve where the quick start says"
                );
                // Keep draining stdout and stderr (its log) so the child
                // never blocks on a full pipe.
                tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
                if let Some(mut e) = child.stderr.take() {
                    tokio::spawn(async move {
                        let mut buf = [0u8; 4096];
                        while let Ok(n) = e.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                        }
                    });
                }
                return QuickStartServer { child, _dir: dir };
            }
            // It exited before listening: say why, and wait for the port
            // only when the port is the reason.
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ =
                    tokio::time::timeout(Duration::from_secs(10), e.read_to_string(&mut err)).await;
            }
            let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
            let busy = err.to_ascii_lowercase().contains("address already in use");
            assert!(
                busy && tokio::time::Instant::now() < deadline,
                "idem-server, started as the quick start says, did not listen on {BOOK_BASE}: {err}"
            );
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }
}

impl Drop for QuickStartServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("HTTP client")
}

/// Sends one example's request to `base` instead of the book's address, as
/// curl would send it (`-d` without a `Content-Type` is a form post).
async fn send(http: &reqwest::Client, base: &str, curl: &Curl) -> Result<Answer, String> {
    let path = curl
        .url
        .strip_prefix(BOOK_BASE)
        .ok_or_else(|| format!("{} is not on {BOOK_BASE}", curl.url))?;
    let method = reqwest::Method::from_bytes(curl.method.as_bytes()).map_err(|e| e.to_string())?;
    let mut req = http.request(method, format!("{base}{path}"));
    for (n, v) in &curl.headers {
        req = req.header(n.as_str(), v.as_str());
    }
    if let Some(data) = &curl.data {
        if !curl
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("content-type"))
        {
            req = req.header("content-type", "application/x-www-form-urlencoded");
        }
        req = req.body(data.clone());
    }
    let resp = req
        .send()
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .bytes()
        .await
        .map_err(|e| format!("reading the body: {e}"))?
        .to_vec();
    Ok(Answer {
        status,
        headers,
        body,
    })
}

// ---------------------------------------------------------------------------
// The tests

// clause: idem.replay.verbatim, idem.replay.marker, idem.scope.caller, idem.fingerprint.mismatch, idem.key.invalid, idem.failure.unclaimed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_curl_example_in_reading_order_gets_the_answer_it_shows() {
    let examples = book_examples();
    let pages: Vec<&str> = {
        let mut p: Vec<&str> = examples
            .iter()
            .map(|e| e.at.split(':').next().unwrap_or_default())
            .collect();
        p.dedup();
        p
    };
    // A floor, so an edit that turns examples into `text` cannot quietly
    // empty this test.
    assert!(
        pages.len() >= 5 && examples.len() >= 15,
        "only {} curl examples in {pages:?}",
        examples.len()
    );
    let server = QuickStartServer::start().await;
    let http = client();
    let mut ids = Ids::default();
    let mut failures = Vec::new();
    for ex in &examples {
        let result = match send(&http, BOOK_BASE, &ex.curl).await {
            Ok(answer) => compare(ex, &answer, &mut ids),
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            failures.push(format!("{}: {e}", ex.at));
        }
    }
    drop(server);
    eprintln!(
        "{} curl examples on {} pages, in reading order, against one server: {} differ",
        examples.len(),
        pages.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} book examples do not match the server:\n{}",
        failures.len(),
        examples.len(),
        failures.join("\n")
    );
}

/// Every `` `--flag` (N `` the book writes, as (page, flag, N): the book's
/// way of stating a flag's default in bytes, seconds or a count.
fn stated_defaults(page: &str, text: &str) -> Vec<(String, String, u64)> {
    let mut out = Vec::new();
    let flat = text.replace('\n', " ");
    for (at, _) in flat.match_indices("`--") {
        let rest = &flat[at + 1..];
        let Some(end) = rest.find('`') else { continue };
        let flag = &rest[..end];
        let after = &rest[end + 1..];
        let Some(num) = after.strip_prefix(" (") else {
            continue;
        };
        let digits: String = num.chars().take_while(char::is_ascii_digit).collect();
        // Only a plain number that ends there: "(86400)", "(10)", "(65536;".
        if digits.is_empty() || !num[digits.len()..].starts_with([')', ';', ',']) {
            continue;
        }
        out.push((
            page.to_owned(),
            flag.to_owned(),
            digits.parse().unwrap_or(u64::MAX),
        ));
    }
    out
}

/// Each flag's default as `idem-server --help` prints it.
fn help_defaults(help: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("--") {
            current = Some(format!(
                "--{}",
                rest.split([' ', '=']).next().unwrap_or_default()
            ));
        } else if t.starts_with('-') {
            current = None;
        }
        if let (Some(flag), Some(at)) = (&current, t.find("[default: ")) {
            let v = &t[at + "[default: ".len()..];
            out.insert(flag.clone(), v.trim_end_matches(']').to_owned());
        }
    }
    out
}

// The defaults the book states for the server's flags are the ones the
// server has (forking.md once said `--lease-secs` (60) when it was 10).
#[test]
fn the_flag_defaults_the_book_states_are_the_servers() {
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_idem-server"))
        .arg("--help")
        .output()
        .expect("idem-server --help");
    assert!(help.status.success());
    let defaults = help_defaults(&String::from_utf8_lossy(&help.stdout));
    assert!(
        defaults.contains_key("--lease-secs") && defaults.contains_key("--listen"),
        "--help not understood: {defaults:?}"
    );
    let src = book_src();
    let mut stated = Vec::new();
    for page in reading_order(&std::fs::read_to_string(src.join("SUMMARY.md")).expect("summary")) {
        let text = std::fs::read_to_string(src.join(&page)).expect("page");
        stated.extend(stated_defaults(&page, &text));
    }
    assert!(
        stated.len() >= 5,
        "the book states fewer flag defaults than it did: {stated:?}"
    );
    let wrong: Vec<String> = stated
        .iter()
        .filter(|(_, flag, n)| {
            defaults.get(flag).map(String::as_str) != Some(n.to_string().as_str())
        })
        .map(|(page, flag, n)| {
            format!(
                "{page}: {flag} ({n}), but --help says {:?}",
                defaults.get(flag)
            )
        })
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn stated_defaults_are_read_from_prose() {
    let text = "`--lease-secs` (10), `--max-body-bytes` (65536; larger), `--profile` (`reference`),\n`--store-timeout-ms` (2 s by default), `--x`\n(7)";
    let got: Vec<_> = stated_defaults("p.md", text)
        .into_iter()
        .map(|(_, f, n)| (f, n))
        .collect();
    assert_eq!(
        got,
        [
            ("--lease-secs".to_owned(), 10),
            ("--max-body-bytes".to_owned(), 65536),
            ("--x".to_owned(), 7)
        ]
    );
    let help = "      --lease-secs <LEASE_SECS>\n          Lease.\n          \n          [default: 10]\n\n      --listen <LISTEN>\n          [default: 127.0.0.1:8080]\n  -h, --help\n";
    let d = help_defaults(help);
    assert_eq!(d.get("--lease-secs").map(String::as_str), Some("10"));
    assert_eq!(
        d.get("--listen").map(String::as_str),
        Some("127.0.0.1:8080")
    );
}

// A request refused for its size is refused before the claim, so the key is
// still free: the same key with a body of the right size executes as a first
// request, not as a replay of the 413 and not as a mismatch.
// clause: idem.failure.before-claim, idem.failure.unclaimed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_413_is_decided_before_the_claim_and_leaves_the_key_free() {
    let server = Server::start("before-claim", &["--max-body-bytes", "1024"]).await;
    let http = client();
    let post = |body: String| {
        http.post(format!("{}/v1/transfers", server.base))
            .header("authorization", "Bearer demo-alice")
            .header("idempotency-key", "size-first")
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let big = format!(
        r#"{{"from":"acc_alice_main","to":"acc_alice_savings","amount":7,"memo":"{}"}}"#,
        "x".repeat(2000)
    );
    let small = r#"{"from":"acc_alice_main","to":"acc_alice_savings","amount":7}"#.to_owned();
    let refused = post(big.clone()).await.expect("first request");
    assert_eq!(refused.status(), 413);
    let refused: Value = refused.json().await.expect("problem body");
    assert_eq!(refused["code"], "payload_too_large");
    // Again, too big: still 413, not a replay and not in use.
    let again = post(big).await.expect("second request");
    assert_eq!(again.status(), 413);
    assert!(again.headers().get("idempotent-replayed").is_none());
    let first = post(small.clone()).await.expect("third request");
    assert_eq!(first.status(), 201, "the key was not consumed by the 413");
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first: Value = first.json().await.expect("transfer");
    let replay = post(small).await.expect("fourth request");
    assert_eq!(replay.status(), 201);
    assert_eq!(
        replay
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    let replay: Value = replay.json().await.expect("replayed transfer");
    assert_eq!(replay["id"], first["id"]);
    let list: Value = http
        .get(format!("{}/v1/transfers", server.base))
        .header("authorization", "Bearer demo-alice")
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("list body");
    assert_eq!(list["count"], 1, "one transfer for the key: {list}");
}

// ---------------------------------------------------------------------------
// The checkers, on small inputs, so one that passes everything is caught.

#[test]
fn curl_lines_parse_like_the_shell() {
    let c = parse_curl(
        r#"curl -si http://127.0.0.1:8080/v1/transfers -H 'Authorization: Bearer demo-alice' -H 'Idempotency-Key: "a\"b"' -d '{"amount":1}'"#,
    )
    .expect("parses");
    assert_eq!(c.method, "POST");
    assert!(c.include);
    assert_eq!(c.headers[1], ("Idempotency-Key".into(), r#""a\"b""#.into()));
    assert_eq!(c.data.as_deref(), Some(r#"{"amount":1}"#));
    let g = parse_curl("curl -s http://127.0.0.1:8080/v1/accounts").expect("parses");
    assert_eq!(g.method, "GET");
    assert!(!g.include);
    assert!(parse_curl("curl -k http://127.0.0.1:8080/").is_err());
    assert!(parse_curl("curl http://x/ | jq .").is_err());
    assert!(parse_curl("curl 'http://x/").is_err());
    assert_eq!(
        shell_words(r#"a "b \"c\"" d\ e"#).expect("words"),
        vec!["a", r#"b "c""#, "d e"]
    );
}

#[test]
fn blocks_split_into_commands_and_answers() {
    let page = "text\n\n```console\n$ curl -i http://127.0.0.1:8080/v1/x \\\n    -H 'A: b'\n\nHTTP/1.1 409 Conflict\nRetry-After: 1\n\n{\"code\":\"c\",\n \"n\":1}\n$ curl -s http://127.0.0.1:8080/v1/y\n{\"k\":[1]}\n```\n\n```console\n$ cargo run -p idem-server\n```\n\n```text\n$ curl nonsense\n```\n";
    let ex = examples_in("p.md", page).expect("parses");
    assert_eq!(ex.len(), 2);
    assert_eq!(ex[0].at, "p.md:4");
    assert_eq!(ex[0].curl.headers, vec![("A".into(), "b".into())]);
    assert_eq!(ex[0].shown.status, Some(409));
    assert_eq!(
        ex[0].shown.headers,
        vec![("Retry-After".into(), "1".into())]
    );
    assert_eq!(
        ex[0].shown.body,
        Some(serde_json::json!({"code":"c","n":1}))
    );
    assert_eq!(ex[1].shown.status, None);
    assert_eq!(ex[1].shown.body, Some(serde_json::json!({"k":[1]})));
    // An abbreviated body is an error, not a skipped comparison.
    let bad = "```console\n$ curl -s http://127.0.0.1:8080/v1/y\n{\"id\":\"tr_1\", ...}\n```\n";
    assert!(examples_in("p.md", bad).is_err());
}

#[test]
fn ids_are_bound_not_compared_but_must_stay_consistent() {
    let mut ids = Ids::default();
    match_text("/v1/transfers/tr_7Qm2", "/v1/transfers/tr_abc", &mut ids).expect("binds");
    match_text("\"tr_7Qm2\"", "\"tr_abc\"", &mut ids).expect("same id again");
    assert!(
        match_text("tr_7Qm2", "tr_other", &mut ids).is_err(),
        "a repeated id must repeat"
    );
    assert!(
        match_text("tr_Kp41", "tr_abc", &mut ids).is_err(),
        "distinct ids must differ"
    );
    assert!(match_text("/v1/transfers/tr_1", "/v1/payments/tr_1", &mut ids).is_err());
    assert!(match_text("acc_alice_main", "acc_bob_main", &mut ids).is_err());
    let shown = serde_json::json!({"id":"tr_Z","amount":100,"created_at":"2026-01-01T00:00:00Z"});
    let got = serde_json::json!({"id":"tr_q","amount":100,"created_at":"2026-12-02T05:00:00.123Z"});
    match_json("", &shown, &got, &mut Ids::default()).expect("shown members match");
    let wrong = serde_json::json!({"id":"tr_q","amount":101,"created_at":"2026-12-02T05:00:00Z"});
    assert!(match_json("", &shown, &wrong, &mut Ids::default()).is_err());
    let missing = serde_json::json!({"id":"tr_q","created_at":"2026-12-02T05:00:00Z"});
    assert!(match_json("", &shown, &missing, &mut Ids::default()).is_err());
    let not_a_time = serde_json::json!({"id":"tr_q","amount":100,"created_at":"yesterday"});
    assert!(match_json("", &shown, &not_a_time, &mut Ids::default()).is_err());
    let short = serde_json::json!({"a":[1,2]});
    assert!(
        match_json(
            "",
            &serde_json::json!({"a":[1]}),
            &short,
            &mut Ids::default()
        )
        .is_err()
    );
}

#[test]
fn members_are_left_out_only_with_the_marker() {
    let got = serde_json::json!({"id":"tr_q","amount":100,"memo":null,"created_at":"2026-12-02T05:00:00Z"});
    // Silently leaving `memo` out is a failure...
    let silent = parse_shown(
        r#"{"id":"tr_a","amount":100,"created_at":"2026-12-01T10:15:02.417Z"}"#,
        false,
    )
    .expect("parses");
    let err = match_json(
        "",
        silent.body.as_ref().expect("body"),
        &got,
        &mut Ids::default(),
    )
    .expect_err("an unshown member");
    assert!(err.contains("memo"), "{err}");
    // ...saying so with the marker is not.
    let marked = parse_shown(r#"{"id":"tr_a","amount":100, …}"#, false).expect("parses");
    match_json(
        "",
        marked.body.as_ref().expect("body"),
        &got,
        &mut Ids::default(),
    )
    .expect("an explicit elision");
    // The marker stands for members only, and three dots are not it.
    assert!(parse_shown(r#"{"a":[1, …]}"#, false).is_err());
    assert!(parse_shown(r#"{"a":1, ...}"#, false).is_err());
    // An ellipsis inside a string is text.
    let text = parse_shown(r#"{"detail":"wait…"}"#, false).expect("parses");
    assert_eq!(text.body, Some(serde_json::json!({"detail":"wait…"})));
    assert!(is_utc_timestamp("2026-12-01T10:15:02.417Z"));
    assert!(is_utc_timestamp("2026-12-01T10:15:02Z"));
    assert!(!is_utc_timestamp("2026-12-01 10:15:02Z"));
    assert!(!is_utc_timestamp("2026-12-01T10:15:02.Z"));
    assert!(!is_utc_timestamp("2026-12-01T10:15:02+01:00"));
}

#[test]
fn the_marker_and_the_status_are_compared_both_ways() {
    let example = |text: &str| {
        examples_in("p.md", text)
            .expect("parses")
            .pop()
            .expect("one example")
    };
    let answer = |status: u16, headers: &[(&'static str, &'static str)], body: &str| {
        let mut map = reqwest::header::HeaderMap::new();
        for (n, v) in headers {
            map.insert(*n, reqwest::header::HeaderValue::from_static(v));
        }
        Answer {
            status,
            headers: map,
            body: body.as_bytes().to_vec(),
        }
    };
    let first = example(
        "```console\n$ curl -i http://127.0.0.1:8080/v1/x -d '{}'\n\nHTTP/1.1 201 Created\nContent-Type: application/json\n\n{\"a\":1}\n```\n",
    );
    let plain = answer(201, &[("content-type", "application/json")], r#"{"a":1}"#);
    compare(&first, &plain, &mut Ids::default()).expect("as shown");
    // The book shows a first execution; the server says it replayed.
    let replayed = answer(
        201,
        &[
            ("content-type", "application/json"),
            ("idempotent-replayed", "true"),
        ],
        r#"{"a":1}"#,
    );
    let err = compare(&first, &replayed, &mut Ids::default()).expect_err("marker not shown");
    assert!(err.contains("idempotent-replayed"), "{err}");
    let conflict = answer(409, &[("content-type", "application/json")], r#"{"a":1}"#);
    assert!(compare(&first, &conflict, &mut Ids::default()).is_err());
    // A -s example: a success, or the status its problem shows.
    let quiet = example("```console\n$ curl -s http://127.0.0.1:8080/v1/x\n{\"a\":1}\n```\n");
    compare(&quiet, &plain, &mut Ids::default()).expect("a success");
    assert!(compare(&quiet, &conflict, &mut Ids::default()).is_err());
    let problem = example(
        "```console\n$ curl -s http://127.0.0.1:8080/v1/x\n{\"status\":409,\"code\":\"c\"}\n```\n",
    );
    let got_problem = answer(409, &[], r#"{"status":409,"code":"c"}"#);
    compare(&problem, &got_problem, &mut Ids::default()).expect("the problem's status");
    let got_other = answer(400, &[], r#"{"status":409,"code":"c"}"#);
    assert!(compare(&problem, &got_other, &mut Ids::default()).is_err());
}

#[test]
fn reading_order_follows_the_summary() {
    let summary = "# Summary\n\n[Intro](introduction.md)\n\n- [Quick](quick-start.md)\n- [Key](keys.md)\n  - [Sub](a/b.md)\n- [Again](keys.md)\n";
    assert_eq!(
        reading_order(summary),
        ["introduction.md", "quick-start.md", "keys.md", "a/b.md"]
    );
}
