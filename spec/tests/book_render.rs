//! The built book, rendered by a real browser: Debian's Chromium, headless.
//!
//! What only a browser can show, on every page of `SUMMARY.md`, laid out at
//! 1280 px (a laptop, sidebar open) and at 390 px (a phone):
//! - **Nothing overflows sideways.** At 1280 px nothing may need horizontal
//!   scrolling: not the page, and not a code block or a table either,
//!   because a reader on a desktop should see every line whole. At 390 px a
//!   code block or a table may scroll inside its own box (it cannot
//!   reflow), but the page itself must not scroll sideways and no other
//!   element may stick out of its box, a box of width 0 included. Scrollbars
//!   are drawn, as on a desktop, so the checks are on the safe side.
//! - **No table loses a column.** Every column is at least as wide as the
//!   widest word of its header (a line may break at a space or after a
//!   hyphen, never inside a word): a CSS rule that gives a column 0 px, or
//!   squeezes it below its header, fails here.
//! - **No text is clipped or spills.** Every piece of text stays inside its
//!   table cell, and no box that hides what does not fit (`overflow:
//!   hidden` or `clip`) cuts text off, sideways or below.
//! - **No table row is taller than the screen** (900 px), with collapsed
//!   parts (`<details>`) closed; they are opened for the checks above.
//! - **Search finds the rules.** For every error code of the contract, a
//!   search for its plain words (`idempotency_key_mismatch` → "mismatch",
//!   `idempotency_key_in_use` → "in use", `rate_limited` → "rate limited")
//!   must list the code's section of the errors page among the first
//!   results; and the words a reader types for a rule (expiry, TTL, lease,
//!   deadline, jitter, …: [`READER_SEARCHES`]) must list the section that
//!   states it.
//!
//! How: the test writes a small harness page that loads each book page in an
//! iframe of the given width (media queries inside an iframe see the
//! iframe's width, as they would a window's), measures it, drives mdBook's
//! own search box through `?search=`, and writes what it found into the
//! page; Chromium runs it with `--dump-dom`, and the test reads the result
//! back. No DevTools client, no Node, no extra crate: one process, bounded
//! in time. The harness also measures control pages written by the test,
//! one per kind of problem (each must be reported) and one with none (which
//! must not be), and searches for a word that is nowhere, so a harness that
//! reports nothing whatever it sees fails.
//!
//! It needs the built book, so it is `#[ignore]`d in the ordinary test run
//! and run by `.ci/run` right after `mdbook build book`:
//! `cargo test -p idem-spec --test book_render -- --ignored` (about 10 s
//! with a warm build). `IDEM_CHROMIUM` names the browser (default:
//! `chromium` on the `PATH`, as Debian installs it); `IDEM_BOOK_HTML` the
//! built book (default: `book/book`).

#![allow(clippy::unwrap_used)]

mod support;

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use idem_spec::ErrorCode;
use serde_json::{Value, json};

/// The widths every page is laid out at.
const WIDTHS: [u32; 2] = [1280, 390];

/// How far down the result list a section may be and still count as found:
/// the first screen of mdBook's result list.
const SEARCH_TOP: usize = 5;

/// Wall-clock bound on the browser run (it takes a few seconds).
const BROWSER_TIMEOUT: Duration = Duration::from_secs(240);

/// The plain words a reader would type for an error: the code without the
/// `idempotency_key_` prefix, underscores as spaces (`idempotency_key_in_use`
/// → "in use", `rate_limited` → "rate limited").
fn plain_words(code: &str) -> String {
    code.trim_start_matches("idempotency_key_")
        .replace('_', " ")
}

/// The published pages, in reading order, as `.html` paths.
fn book_pages() -> Vec<String> {
    let src = support::workspace_root().join("book/src");
    support::read_book(&src)
        .expect("read the book")
        .into_iter()
        .map(|(page, _)| page)
        .filter(|p| {
            // Only pages SUMMARY.md publishes are rendered; read_book lists
            // the others (included fragments) after them.
            let summary = std::fs::read_to_string(src.join("SUMMARY.md")).unwrap_or_default();
            summary.contains(&format!("]({p})"))
        })
        .map(|p| p.trim_end_matches(".md").to_owned() + ".html")
        .collect()
}

/// The measuring page. `CONFIG` is replaced by the JSON the test builds.
const HARNESS: &str = r#"<!doctype html>
<html><head><meta charset="utf-8"><title>book render check</title></head>
<body style="margin:0"><pre id="out"></pre>
<script>
const CONFIG = __CONFIG__;

function describe(el) {
  let s = el.tagName.toLowerCase();
  if (el.id) s += '#' + el.id;
  if (el.classList.length) s += '.' + [...el.classList].join('.');
  const text = (el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 60);
  return s + ' "' + text + '"';
}

// Elements allowed to scroll sideways inside their own box at a narrow width:
// code blocks and the wrappers mdBook puts around tables.
function mayScroll(el) {
  return el.matches('pre, pre > code, .table-wrapper');
}

// Parts of mdBook's chrome that are not the page: the sidebar (off screen on
// a phone), the search bar and the keyboard help, both hidden until asked for.
const CHROME = '#mdbook-sidebar, .sidebar, #mdbook-search-wrapper, #mdbook-help-container';

// Overflow: the page, or an element, wider than its box.
function overflows(win, narrow, out) {
  const doc = win.document;
  const se = doc.scrollingElement;
  if (se.scrollWidth > se.clientWidth + 1) {
    out.push('overflow: the page scrolls sideways: ' + se.scrollWidth + ' px of content in ' + se.clientWidth + ' px');
  }
  const vw = doc.documentElement.clientWidth;
  const overflowing = (el, cs) =>
    // An inline element has no box width of its own (clientWidth 0); its
    // text is checked by clipped() instead. A block or a cell of width 0
    // with content is exactly what must not pass.
    !/^inline$|^contents$/.test(cs.display) && el.scrollWidth > el.clientWidth + 1;
  for (const el of doc.querySelectorAll('body *')) {
    if (el.closest(CHROME)) continue;
    // Rows and row groups report the cells' padding as overflow; a table
    // that is too wide shows on its wrapper or its container instead.
    if (el.matches('tr, thead, tbody, tfoot')) continue;
    const cs = win.getComputedStyle(el);
    if (cs.display === 'none' || cs.visibility === 'hidden') continue;
    if (overflowing(el, cs)) {
      const scrolls = cs.overflowX === 'auto' || cs.overflowX === 'scroll';
      if (!(narrow && scrolls && mayScroll(el))) {
        // Report the innermost culprit only: skip an element whose overflow
        // comes from a descendant that is itself reported.
        const inner = [...el.querySelectorAll('*')].some(d => {
          const dcs = win.getComputedStyle(d);
          return dcs.display !== 'none' && overflowing(d, dcs) && !(narrow && mayScroll(d)) && !d.closest(CHROME);
        });
        if (!inner) {
          out.push('overflow: ' + describe(el) + ': ' + el.scrollWidth + ' px of content in a ' + el.clientWidth + ' px box' + (scrolls ? ' (scrolls)' : ' (clipped or spilling)'));
        }
      }
    }
    // A box that hides what does not fit, with lines below its bottom: text
    // cut off (line boxes, not the glyphs' taller font boxes, decide).
    if (/hidden|clip/.test(cs.overflowY) && el.scrollHeight > el.clientHeight + 1 && el.textContent.trim()) {
      out.push('clipped: ' + describe(el) + ': ' + el.scrollHeight + ' px of lines in a ' + el.clientHeight + ' px high box that hides the rest');
    }
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > vw + 1 && !el.closest('pre, .table-wrapper')) {
      out.push('overflow: ' + describe(el) + ': right edge at ' + Math.round(r.right) + ' px, past the ' + vw + ' px viewport');
    }
  }
}

// The widest word of an element's text, each word measured whole in the
// font of the element that holds it.
function widestWord(el) {
  const doc = el.ownerDocument;
  const texts = [];
  const walker = doc.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) texts.push(n);
  let best = { word: '', width: 0 };
  for (const n of texts) {
    // A line may break at a space or after a hyphen (`Retry-` / `After`),
    // as typesetting does; never inside a word.
    for (const word of n.data.split(/\s+|(?<=-)/).filter(Boolean)) {
      const probe = doc.createElement('span');
      probe.style.cssText = 'position:absolute;left:0;top:0;visibility:hidden;white-space:nowrap;overflow-wrap:normal;word-break:normal';
      probe.textContent = word;
      n.parentElement.appendChild(probe);
      const width = probe.getBoundingClientRect().width;
      probe.remove();
      if (width > best.width) best = { word, width };
    }
  }
  return best;
}

// Columns: every column at least as wide as the widest word of its header
// (a column of 0 px shows nothing, one narrower than its header breaks or
// spills the header's words).
function columns(win, out) {
  for (const table of win.document.querySelectorAll('table')) {
    if (table.closest(CHROME)) continue;
    const head = table.rows[0];
    if (!head) continue;
    const names = [...head.cells].map(c => c.textContent.trim().replace(/\s+/g, ' '));
    [...head.cells].forEach((th, i) => {
      const cs = win.getComputedStyle(th);
      const inner = th.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
      const w = widestWord(th);
      if (w.width > inner + 1) {
        out.push('column: column ' + (i + 1) + ' "' + names[i].slice(0, 30) + '" of ' + tableName(table) + ' is ' +
          Math.max(0, Math.round(inner)) + ' px wide, narrower than its header word "' + w.word + '" (' + Math.round(w.width) + ' px)');
      }
    });
  }
}

function tableName(table) {
  const head = table.rows[0];
  const names = head ? [...head.cells].map(c => c.textContent.trim().replace(/\s+/g, ' ')) : [];
  return 'the table "' + names.join(' | ').slice(0, 70) + '"';
}

// No table row taller than the screen, where a reader sees neither the
// header nor the row's start and end together. Measured before collapsed
// parts are opened: a list a reader opens on purpose may be long.
function tallRows(win, out) {
  const screen = win.innerHeight;
  for (const table of win.document.querySelectorAll('table')) {
    if (table.closest(CHROME)) continue;
    for (const row of table.rows) {
      const h = row.getBoundingClientRect().height;
      if (h > screen) {
        out.push('tall row: a row of ' + tableName(table) + ' is ' + Math.round(h) + ' px tall, taller than the ' + screen + ' px screen: "' +
          row.textContent.trim().replace(/\s+/g, ' ').slice(0, 50) + '"');
        break;
      }
    }
  }
}

// Text a reader cannot see whole across: a piece of text outside its table
// cell (spilling over the next one), or cut off at the side by a box that
// hides what does not fit (`overflow: hidden` or `clip`). (Cut off at the
// bottom is overflows()'s check: a text's font box is taller than its line,
// so only line boxes tell.) What a scrolling box holds can be scrolled to;
// whether that box may scroll is overflows()'s question too.
function clipped(win, out) {
  const doc = win.document;
  const styles = new Map();
  const style = el => {
    if (!styles.has(el)) styles.set(el, win.getComputedStyle(el));
    return styles.get(el);
  };
  const range = doc.createRange();
  const walker = doc.createTreeWalker(doc.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (!n.data.trim()) continue;
    const el = n.parentElement;
    if (!el || el.closest(CHROME + ', script, style, noscript')) continue;
    if (style(el).visibility === 'hidden') continue;
    range.selectNodeContents(n);
    const rects = [...range.getClientRects()].filter(r => r.width > 0.5 && r.height > 0.5);
    if (!rects.length) continue;
    const text = JSON.stringify(n.data.trim().replace(/\s+/g, ' ').slice(0, 40));
    for (let a = el; a && a !== doc.documentElement; a = a.parentElement) {
      const cs = style(a);
      if (/auto|scroll/.test(cs.overflowX)) break;
      const cell = a.matches('td, th');
      const clips = /hidden|clip/.test(cs.overflowX);
      if (!cell && !clips) continue;
      const b = a.getBoundingClientRect();
      if (rects.some(r => r.left < b.left - 1 || r.right > b.right + 1)) {
        out.push('clipped: text ' + text + (cell
          ? ' spills out of its ' + Math.round(b.width) + ' px table cell ' + describe(a)
          : ' is cut off at the side by ' + describe(a)));
        break;
      }
    }
  }
}

function measure(win, narrow) {
  const out = [];
  tallRows(win, out);
  // A reader can open every collapsed part: the rest is measured open.
  for (const d of win.document.querySelectorAll('details')) d.open = true;
  overflows(win, narrow, out);
  columns(win, out);
  clipped(win, out);
  return [...new Set(out)].slice(0, 40);
}

function load(url, width) {
  return new Promise((resolve) => {
    const f = document.createElement('iframe');
    f.style.width = width + 'px';
    f.style.height = '900px';
    f.style.border = '0';
    f.onload = () => resolve(f);
    f.src = url;
    document.body.appendChild(f);
  });
}

function settle(win) {
  return (win.document.fonts ? win.document.fonts.ready : Promise.resolve())
    .then(() => new Promise(r => setTimeout(r, 50)));
}

async function waitFor(pred, ms) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (pred()) return true;
    await new Promise(r => setTimeout(r, 50));
  }
  return pred();
}

async function run() {
  const result = { layout: [], search: [] };
  for (const width of CONFIG.widths) {
    for (const page of CONFIG.pages) {
      const f = await load(page.url, width);
      await settle(f.contentWindow);
      const doc = f.contentDocument;
      result.layout.push({
        page: page.name,
        width,
        loaded: !!(doc && doc.querySelector('main, body')),
        title: doc ? doc.title : '',
        viewport: doc ? doc.documentElement.clientWidth : 0,
        problems: doc ? measure(f.contentWindow, width < 700) : ['not loaded'],
      });
      f.remove();
    }
  }
  for (const s of CONFIG.searches) {
    const f = await load(CONFIG.search_url + '?search=' + encodeURIComponent(s.words), 1280);
    const doc = f.contentDocument;
    const header = () => doc.getElementById('mdbook-searchresults-header');
    await waitFor(() => header() && header().innerText.trim() !== '', 10000);
    const links = [...doc.querySelectorAll('#mdbook-searchresults li > a')].map(a => a.getAttribute('href'));
    result.search.push({ words: s.words, header: header() ? header().innerText : null, links });
    f.remove();
  }
  document.getElementById('out').textContent = JSON.stringify(result);
}
run().catch(e => { document.getElementById('out').textContent = JSON.stringify({ error: String(e) }); });
</script></body></html>
"#;

/// Control pages, each with the one kind of problem the harness must see
/// in it at every width (the start of its message), and one with none.
const CONTROLS: [(&str, Option<&str>, &str); 5] = [
    // A table wider than any screen, and a long unbreakable line in a code
    // block.
    (
        "control-wide",
        Some("overflow:"),
        r#"<!doctype html><html><head><title>wide</title></head><body>
<main><table><tr><td>aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa</td></tr></table>
<pre style="overflow-x:auto">bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb</pre>
</main></body></html>"#,
    ),
    // The clause index's old rule on an 8-column table: fixed layout, seven
    // widths summing to 100 %, so the eighth column gets 0 px.
    (
        "control-lost-column",
        Some("column:"),
        r#"<!doctype html><html><head><title>lost column</title>
<meta name="viewport" content="width=device-width">
<style>table { table-layout: fixed; width: 100%; } th:nth-child(-n+7) { width: 14.2857%; }</style></head><body>
<main><table><thead><tr><th>One</th><th>Two</th><th>Three</th><th>Four</th><th>Five</th><th>Six</th><th>Seven</th><th>Then</th></tr></thead>
<tbody><tr><td>1</td><td>2</td><td>3</td><td>4</td><td>5</td><td>6</td><td>7</td><td>8</td></tr></tbody></table></main></body></html>"#,
    ),
    // Text cut off by a box that hides it: a second line under a box one
    // line high (no horizontal overflow, so only the text check sees it).
    (
        "control-clipped",
        Some("clipped:"),
        r#"<!doctype html><html><head><title>clipped</title>
<meta name="viewport" content="width=device-width"></head><body>
<main><p style="height:1.2em;overflow:hidden;line-height:1.2em">First line.<br>Second line.</p></main></body></html>"#,
    ),
    // A row taller than the screen.
    (
        "control-tall-row",
        Some("tall row:"),
        r#"<!doctype html><html><head><title>tall row</title>
<meta name="viewport" content="width=device-width"></head><body>
<main><table><thead><tr><th>Name</th><th>Tests</th></tr></thead>
<tbody><tr><td>a</td><td><div style="height:2000px">many</div></td></tr></tbody></table></main></body></html>"#,
    ),
    // Fits at every width: a paragraph that wraps, a short code block, and a
    // table whose columns hold their header words, with a long list folded
    // in a row.
    (
        "control-narrow",
        None,
        r#"<!doctype html><html><head><title>narrow</title>
<meta name="viewport" content="width=device-width"></head><body>
<main><p>A short paragraph that wraps.</p><pre style="overflow-x:auto">short</pre>
<table><thead><tr><th>Attempt</th><th>Then</th></tr></thead><tbody><tr><td>1</td><td>retry</td></tr>
<tr><td>2</td><td><details><summary>2 tests</summary><div style="height:2000px">a long list</div></details></td></tr></tbody></table>
</main></body></html>"#,
    ),
];

/// A search term that is in no page.
const NOWHERE: &str = "zqxjvkwuuyb";

fn chromium() -> PathBuf {
    std::env::var_os("IDEM_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("chromium"))
}

fn file_url(path: &Path) -> String {
    format!("file://{}", path.display())
}

/// Runs Chromium on the harness and returns what it wrote, bounded in time.
fn run_browser(harness: &Path, profile: &Path) -> Value {
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            // The harness reads the book's pages through iframes of file://
            // URLs; without this, Chromium treats each file as its own origin.
            "--allow-file-access-from-files",
            // Lets the harness's timers run to completion before the DOM is
            // dumped, without waiting for them in real time.
            "--virtual-time-budget=600000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(file_url(harness))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {:?} ({e}); install Debian's chromium (.ci/run does) or set IDEM_CHROMIUM",
                chromium()
            )
        });
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for chromium") {
            break status;
        }
        if started.elapsed() > BROWSER_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within {BROWSER_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let dom = out_reader.join().expect("stdout reader");
    let err = err_reader.join().expect("stderr reader");
    assert!(status.success(), "chromium failed ({status}): {err}");
    let start = dom
        .find("<pre id=\"out\">")
        .unwrap_or_else(|| panic!("no result in the dumped page; chromium said: {err}"))
        + "<pre id=\"out\">".len();
    let end = start + dom[start..].find("</pre>").expect("end of the result");
    let text = dom[start..end]
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&amp;", "&");
    assert!(
        !text.trim().is_empty(),
        "the harness wrote nothing: it did not finish within Chromium's virtual time budget"
    );
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("harness result is not JSON ({e}): {text}"))
}

/// Whether a search result link points at `page#anchor` (mdBook puts a
/// `?highlight=` between the two).
fn links_to(href: &str, page: &str, anchor: &str) -> bool {
    let (path, frag) = href.split_once('#').unwrap_or((href, ""));
    let path = path.split('?').next().unwrap_or_default();
    path.trim_start_matches("./") == page && frag == anchor
}

/// What a reader types when looking for a rule, and the sections that hold
/// it (`page`, heading id): one of them must be among the first
/// [`SEARCH_TOP`] results. mdBook indexes each section's heading and text,
/// stemmed (so "expire" also finds "expires", but "expiry" finds only
/// "expiry"), which is why the sections use the readers' words too.
const READER_SEARCHES: [(&str, &[(&str, &str)]); 7] = [
    ("expiry", &[("scope-and-windows.html", "windows")]),
    ("expire", &[("scope-and-windows.html", "windows")]),
    ("TTL", &[("scope-and-windows.html", "windows")]),
    (
        "retention",
        &[
            ("scope-and-windows.html", "windows"),
            ("multi-step.html", "the-reaper"),
        ],
    ),
    ("lease", &[("multi-step.html", "leases-and-fencing")]),
    ("deadline", &[("client.html", "deadlines")]),
    ("jitter", &[("backoff.html", "backoff-and-jitter")]),
];

/// The searches to run: every error code's plain words, which must find the
/// code's section of the errors page, and [`READER_SEARCHES`].
fn searches() -> Vec<(String, Vec<(String, String)>)> {
    let mut out: Vec<(String, Vec<(String, String)>)> = ErrorCode::ALL
        .iter()
        .map(|c| {
            (
                plain_words(c.as_str()),
                vec![("errors.html".to_owned(), c.as_str().to_owned())],
            )
        })
        .collect();
    for (words, targets) in READER_SEARCHES {
        out.push((
            words.to_owned(),
            targets
                .iter()
                .map(|(p, a)| ((*p).to_owned(), (*a).to_owned()))
                .collect(),
        ));
    }
    out
}

// clause: idem.errors.type-uri
#[test]
#[ignore = "needs the built book (`mdbook build book`) and Chromium; .ci/run runs it after building the book"]
fn the_built_book_shows_every_page_whole_and_search_finds_the_rules() {
    let root = support::workspace_root();
    let html = std::env::var_os("IDEM_BOOK_HTML")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("book/book"));
    let html = html.canonicalize().unwrap_or_else(|e| {
        panic!(
            "{} is not there ({e}): run `mdbook build book` first",
            html.display()
        )
    });
    let pages = book_pages();
    assert!(pages.len() >= 20, "SUMMARY.md publishes only {pages:?}");
    for p in &pages {
        assert!(
            html.join(p).is_file(),
            "{p} is not in {}: the built book is stale; run `mdbook build book`",
            html.display()
        );
    }
    let work = std::env::temp_dir().join(format!("idem-book-render-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("temp dir");

    let mut page_list: Vec<Value> = pages
        .iter()
        .map(|p| json!({ "name": p, "url": file_url(&html.join(p)) }))
        .collect();
    for (name, _, text) in CONTROLS {
        let file = work.join(format!("{name}.html"));
        std::fs::write(&file, text).expect("control page");
        page_list.push(json!({ "name": name, "url": file_url(&file) }));
    }
    let searches = searches();
    let mut search_list: Vec<Value> = searches
        .iter()
        .map(|(words, _)| json!({ "words": words }))
        .collect();
    search_list.push(json!({ "words": NOWHERE }));
    let config = json!({
        "widths": WIDTHS,
        "pages": page_list,
        "searches": search_list,
        "search_url": file_url(&html.join("index.html")),
    });
    let harness = work.join("harness.html");
    std::fs::write(&harness, HARNESS.replace("__CONFIG__", &config.to_string())).expect("harness");

    let result = run_browser(&harness, &work.join("profile"));
    let _ = std::fs::remove_dir_all(&work);
    if let Some(e) = result.get("error") {
        panic!("the harness failed: {e}");
    }

    let layout = result["layout"].as_array().expect("layout results");
    assert_eq!(
        layout.len(),
        WIDTHS.len() * (pages.len() + CONTROLS.len()),
        "not every page was measured at every width"
    );
    let mut failures = Vec::new();
    let mut checked = 0;
    for entry in layout {
        let name = entry["page"].as_str().unwrap_or_default();
        let width = entry["width"].as_u64().unwrap_or_default();
        let problems: Vec<&str> = entry["problems"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        assert!(
            entry["loaded"].as_bool() == Some(true)
                && entry["title"].as_str().is_some_and(|t| !t.is_empty()),
            "{name} at {width} px did not load: {entry}"
        );
        // The controls prove the measure sees each kind of problem, and
        // only problems.
        if let Some((_, expect, _)) = CONTROLS.iter().find(|(n, _, _)| *n == name) {
            match expect {
                Some(kind) => assert!(
                    problems.iter().any(|p| p.starts_with(kind)),
                    "the harness did not see the {kind} problem of {name} at {width} px: {problems:?}"
                ),
                None => assert!(
                    problems.is_empty(),
                    "the harness flagged {name}, which fits at {width} px: {problems:?}"
                ),
            }
            continue;
        }
        checked += 1;
        for p in problems {
            failures.push(format!("{name} at {width} px: {p}"));
        }
    }

    let search = result["search"].as_array().expect("search results");
    assert_eq!(search.len(), searches.len() + 1, "not every search ran");
    for (entry, expected) in search.iter().zip(searches.iter().map(Some).chain([None])) {
        let words = entry["words"].as_str().unwrap_or_default();
        let links: Vec<&str> = entry["links"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let Some((expected_words, targets)) = expected else {
            // The control: a word in no page lists nothing, and the search
            // still ran (its header says so).
            assert!(links.is_empty(), "a search for {words:?} listed {links:?}");
            assert!(
                entry["header"]
                    .as_str()
                    .is_some_and(|h| !h.trim().is_empty()),
                "the search for {words:?} never ran: {entry}"
            );
            continue;
        };
        assert_eq!(words, expected_words, "searches came back out of order");
        let found = links.iter().position(|l| {
            targets
                .iter()
                .any(|(page, anchor)| links_to(l, page, anchor))
        });
        let wanted = targets
            .iter()
            .map(|(p, a)| format!("{p}#{a}"))
            .collect::<Vec<_>>()
            .join(" or ");
        match found {
            Some(i) if i < SEARCH_TOP => {}
            Some(i) => failures.push(format!(
                "search {words:?}: {wanted} is result {}, not in the first {SEARCH_TOP}",
                i + 1
            )),
            None => failures.push(format!(
                "search {words:?}: {wanted} is not among {} results; the first are {:?}",
                links.len(),
                links.iter().take(SEARCH_TOP).collect::<Vec<_>>()
            )),
        }
    }
    eprintln!(
        "{checked} page layouts checked ({} pages at {WIDTHS:?} px), {} searches",
        pages.len(),
        searches.len()
    );
    assert!(
        failures.is_empty(),
        "{} problems in the rendered book:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn plain_words_are_what_a_reader_types() {
    assert_eq!(plain_words("idempotency_key_mismatch"), "mismatch");
    assert_eq!(plain_words("idempotency_key_in_use"), "in use");
    assert_eq!(plain_words("rate_limited"), "rate limited");
    assert!(links_to(
        "errors.html?highlight=key%20mismatch#idempotency_key_mismatch",
        "errors.html",
        "idempotency_key_mismatch"
    ));
    assert!(!links_to(
        "errors.html?highlight=x#idempotency_key_missing",
        "errors.html",
        "idempotency_key_mismatch"
    ));
    assert!(!links_to(
        "client.html#idempotency_key_mismatch",
        "errors.html",
        "idempotency_key_mismatch"
    ));
}
