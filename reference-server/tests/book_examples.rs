//! Every `console` example in the book that runs `curl` is sent, verbatim,
//! to a live `idem-server` started the way the book says (`cargo run -p
//! idem-server`: default flags, demo tokens), and the answer is compared
//! with what the book shows: the status line, each header shown, and each
//! JSON body member shown. Generated ids (`tr_…`) and times (`created_at`)
//! are not compared by value, but an id the book repeats must come back
//! repeated (a replay names the same transfer) and two ids the book shows
//! as different must differ.
//!
//! Examples in one chapter build on each other (a replay of a key used a
//! few paragraphs earlier), so each chapter runs in order against its own
//! fresh server and database. A block whose response is an illustration
//! that a single curl cannot produce is written as `text`, not `console`.
//!
//! The server is the built binary, spawned as a child process on
//! `127.0.0.1:0` with a temporary SQLite file.
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
        Some(
            serde_json::from_str(&body_text)
                .map_err(|e| format!("shown body is not JSON ({e}): {body_text:?}"))?,
        )
    };
    Ok(Shown {
        status,
        headers,
        body,
    })
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

/// Every page of the book with at least one curl example, by file name.
fn book_examples() -> BTreeMap<String, Vec<Example>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(book_src()).expect("read book/src") {
        let path = entry.expect("dir entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("md") {
            continue;
        }
        let page = path
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&path).expect("read page");
        let examples = examples_in(&page, &text).unwrap_or_else(|e| panic!("{e}"));
        if !examples.is_empty() {
            out.insert(page, examples);
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

/// Every member the book shows must be in the answer with a matching value;
/// members it leaves out are not compared. Arrays match element by element
/// and must have the same length.
fn match_json(path: &str, shown: &Value, actual: &Value, ids: &mut Ids) -> Result<(), String> {
    match (shown, actual) {
        (Value::Object(s), Value::Object(a)) => {
            for (k, sv) in s {
                let p = format!("{path}/{k}");
                let av = a
                    .get(k)
                    .ok_or_else(|| format!("{p}: missing in the answer"))?;
                if TIME_MEMBERS.contains(&k.as_str()) {
                    if !av.is_string() {
                        return Err(format!("{p}: expected a time string, got {av}"));
                    }
                    continue;
                }
                match_json(&p, sv, av, ids)?;
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

fn compare(example: &Example, got: &Answer, ids: &mut Ids) -> Result<(), String> {
    let shown = &example.shown;
    if let Some(status) = shown.status
        && status != got.status
    {
        return Err(format!(
            "status: shown {status}, got {} ({})",
            got.status,
            String::from_utf8_lossy(&got.body)
        ));
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
    if let Some(body) = &shown.body {
        let actual: Value = serde_json::from_slice(&got.body).map_err(|e| {
            format!(
                "body: not JSON ({e}): {:?}",
                String::from_utf8_lossy(&got.body)
            )
        })?;
        match_json("", body, &actual, ids).map_err(|e| format!("body {e}"))?;
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

// clause: idem.replay.verbatim, idem.replay.marker, idem.scope.caller, idem.fingerprint.mismatch, idem.key.invalid
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_curl_example_in_the_book_gets_the_answer_it_shows() {
    let chapters = book_examples();
    let total: usize = chapters.values().map(Vec::len).sum();
    // The quick start, the key, responses, scope: a floor, so an edit that
    // turns examples into `text` cannot quietly empty this test.
    assert!(
        chapters.len() >= 4 && total >= 10,
        "only {total} curl examples in {} pages: {:?}",
        chapters.len(),
        chapters.keys().collect::<Vec<_>>()
    );
    let http = client();
    let mut failures = Vec::new();
    for (page, examples) in &chapters {
        let server = Server::start(page, &[]).await;
        let mut ids = Ids::default();
        for ex in examples {
            let result = match send(&http, &server.base, &ex.curl).await {
                Ok(answer) => compare(ex, &answer, &mut ids),
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                failures.push(format!("{}: {e}", ex.at));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {total} book examples do not match the server:\n{}",
        failures.len(),
        failures.join("\n")
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
    let got = serde_json::json!({"id":"tr_q","amount":100,"created_at":"x","memo":null});
    match_json("", &shown, &got, &mut Ids::default()).expect("shown members match");
    let wrong = serde_json::json!({"id":"tr_q","amount":101,"created_at":"x"});
    assert!(match_json("", &shown, &wrong, &mut Ids::default()).is_err());
    let missing = serde_json::json!({"id":"tr_q","created_at":"x"});
    assert!(match_json("", &shown, &missing, &mut Ids::default()).is_err());
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
