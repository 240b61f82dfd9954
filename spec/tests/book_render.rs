//! The built book, rendered by a real browser: Debian's Chromium, headless.
//!
//! Two things only a browser can show:
//! - **Nothing overflows sideways.** Every page of `SUMMARY.md` is laid out
//!   at 1280 px (a laptop, sidebar open) and at 390 px (a phone). At 1280 px
//!   nothing may need horizontal scrolling: not the page, and not a code
//!   block or a table either, because a reader on a desktop should see every
//!   line whole. At 390 px a code block or a table may scroll inside its own
//!   box (it cannot reflow), but the page itself must not scroll sideways and
//!   no other element may stick out of its box. Scrollbars are drawn, as on
//!   a desktop, so both checks are on the safe side.
//! - **Search finds each error.** For every error code of the contract, a
//!   search for its plain words (`idempotency_key_mismatch` → "mismatch",
//!   `idempotency_key_in_use` → "in use", `rate_limited` → "rate limited")
//!   must list the code's section of the errors page among the first
//!   results.
//!
//! How: the test writes a small harness page that loads each book page in an
//! iframe of the given width (media queries inside an iframe see the
//! iframe's width, as they would a window's), measures it, drives mdBook's
//! own search box through `?search=`, and writes what it found into the
//! page; Chromium runs it with `--dump-dom`, and the test reads the result
//! back. No DevTools client, no Node, no extra crate: one process, bounded
//! in time. The harness also measures two control pages written by the test,
//! one that overflows and one that does not, and searches for a word that
//! is nowhere, so a harness that reports nothing whatever it sees fails.
//!
//! It needs the built book, so it is `#[ignore]`d in the ordinary test run
//! and run by `.ci/run` right after `mdbook build book`:
//! `cargo test -p idem-spec --test book_render -- --ignored`. `IDEM_CHROMIUM`
//! names the browser (default: `chromium` on the `PATH`, as Debian installs
//! it); `IDEM_BOOK_HTML` the built book (default: `book/book`).

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

function measure(win, narrow) {
  const doc = win.document;
  const out = [];
  const se = doc.scrollingElement;
  if (se.scrollWidth > se.clientWidth + 1) {
    out.push('the page scrolls sideways: ' + se.scrollWidth + ' px of content in ' + se.clientWidth + ' px');
  }
  const vw = doc.documentElement.clientWidth;
  for (const el of doc.querySelectorAll('body *')) {
    if (el.closest('#mdbook-sidebar, .sidebar, #mdbook-search-wrapper')) continue;
    // Rows and row groups report the cells' padding as overflow; a table
    // that is too wide shows on its wrapper or its container instead.
    if (el.matches('tr, thead, tbody, tfoot')) continue;
    const cs = win.getComputedStyle(el);
    if (cs.display === 'none' || cs.visibility === 'hidden') continue;
    if (el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1) {
      const scrolls = cs.overflowX === 'auto' || cs.overflowX === 'scroll';
      if (!(narrow && scrolls && mayScroll(el))) {
        // Report the innermost culprit only: skip an element whose overflow
        // comes from a descendant that is itself reported.
        const inner = [...el.querySelectorAll('*')].some(d =>
          d.clientWidth > 0 && d.scrollWidth > d.clientWidth + 1 &&
          !(narrow && mayScroll(d)) && !d.closest('#mdbook-sidebar, .sidebar'));
        if (!inner) {
          out.push(describe(el) + ': ' + el.scrollWidth + ' px of content in a ' + el.clientWidth + ' px box' + (scrolls ? ' (scrolls)' : ' (clipped or spilling)'));
        }
      }
    }
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > vw + 1 && !el.closest('pre, .table-wrapper')) {
      out.push(describe(el) + ': right edge at ' + Math.round(r.right) + ' px, past the ' + vw + ' px viewport');
    }
  }
  return [...new Set(out)].slice(0, 20);
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
    result.search.push({ code: s.code, words: s.words, header: header() ? header().innerText : null, links });
    f.remove();
  }
  document.getElementById('out').textContent = JSON.stringify(result);
}
run().catch(e => { document.getElementById('out').textContent = JSON.stringify({ error: String(e) }); });
</script></body></html>
"#;

/// A control page that overflows at every width: a table wider than any
/// screen, and a long unbreakable line in a code block.
const CONTROL_WIDE: &str = r#"<!doctype html><html><head><title>wide</title></head><body>
<main><table><tr><td>aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa</td></tr></table>
<pre style="overflow-x:auto">bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb</pre>
</main></body></html>"#;

/// A control page that fits at every width.
const CONTROL_NARROW: &str = r#"<!doctype html><html><head><title>narrow</title>
<meta name="viewport" content="width=device-width"></head><body>
<main><p>A short paragraph that wraps.</p><pre style="overflow-x:auto">short</pre></main></body></html>"#;

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

// clause: idem.errors.type-uri
#[test]
#[ignore = "needs the built book (`mdbook build book`) and Chromium; .ci/run runs it after building the book"]
fn the_built_book_fits_the_screen_and_search_finds_every_error() {
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
    std::fs::write(work.join("control-wide.html"), CONTROL_WIDE).expect("control");
    std::fs::write(work.join("control-narrow.html"), CONTROL_NARROW).expect("control");

    let mut page_list: Vec<Value> = pages
        .iter()
        .map(|p| json!({ "name": p, "url": file_url(&html.join(p)) }))
        .collect();
    page_list
        .push(json!({ "name": "control-wide", "url": file_url(&work.join("control-wide.html")) }));
    page_list.push(
        json!({ "name": "control-narrow", "url": file_url(&work.join("control-narrow.html")) }),
    );
    let mut searches: Vec<Value> = ErrorCode::ALL
        .iter()
        .map(|c| json!({ "code": c.as_str(), "words": plain_words(c.as_str()) }))
        .collect();
    searches.push(json!({ "code": "", "words": NOWHERE }));
    let config = json!({
        "widths": WIDTHS,
        "pages": page_list,
        "searches": searches,
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
        WIDTHS.len() * (pages.len() + 2),
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
        match name {
            // The controls prove the measure sees overflow, and only overflow.
            "control-wide" => assert!(
                !problems.is_empty(),
                "the harness saw nothing wrong with a page that overflows at {width} px"
            ),
            "control-narrow" => assert!(
                problems.is_empty(),
                "the harness flagged a page that fits at {width} px: {problems:?}"
            ),
            _ => {
                checked += 1;
                for p in problems {
                    failures.push(format!("{name} at {width} px: {p}"));
                }
            }
        }
    }

    let search = result["search"].as_array().expect("search results");
    assert_eq!(
        search.len(),
        ErrorCode::ALL.len() + 1,
        "not every search ran"
    );
    for entry in search {
        let code = entry["code"].as_str().unwrap_or_default();
        let words = entry["words"].as_str().unwrap_or_default();
        let links: Vec<&str> = entry["links"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if code.is_empty() {
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
        }
        match links.iter().position(|l| links_to(l, "errors.html", code)) {
            Some(i) if i < SEARCH_TOP => {}
            Some(i) => failures.push(format!(
                "search {words:?}: the section errors.html#{code} is result {}, not in the first {SEARCH_TOP}",
                i + 1
            )),
            None => failures.push(format!(
                "search {words:?}: the section errors.html#{code} is not among {} results {:?}",
                links.len(),
                links.iter().take(SEARCH_TOP).collect::<Vec<_>>()
            )),
        }
    }
    eprintln!(
        "{checked} page layouts checked ({} pages at {WIDTHS:?} px), {} error searches",
        pages.len(),
        ErrorCode::ALL.len()
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
