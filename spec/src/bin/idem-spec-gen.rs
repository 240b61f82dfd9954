//! `idem-spec-gen`: writes and checks `spec/generated/`, prints clause
//! coverage, and serves as the book's mdBook preprocessor.
//!
//! ```text
//! cargo run -p idem-spec --bin idem-spec-gen            # (re)write spec/generated/
//! cargo run -p idem-spec --bin idem-spec-gen -- check   # exit 1 when stale
//! cargo run -p idem-spec --bin idem-spec-gen -- coverage  # clause -> citing tests
//! ```

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use idem_spec::clauses;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    let result = match args.first().map(String::as_str) {
        None | Some("write") => write(&root),
        Some("check") => check(&root),
        Some("coverage") => coverage(&root, args.get(1).map(String::as_str) == Some("--uncited")),
        // mdBook asks `supports <renderer>` first; we support every renderer.
        Some("mdbook") if args.get(1).map(String::as_str) == Some("supports") => Ok(()),
        Some("mdbook") => preprocess(&root),
        Some(other) => Err(format!(
            "unknown command {other:?}; expected write, check, coverage or mdbook"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("idem-spec-gen: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root: two levels above this crate's manifest.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn read_book(root: &Path) -> Result<Vec<(String, String)>, String> {
    idem_spec_gen_support::read_book(&root.join("book/src")).map_err(|e| e.to_string())
}

fn write(root: &Path) -> Result<(), String> {
    let files = idem_spec::generate::artifacts(&read_book(root)?).map_err(|e| e.to_string())?;
    let dir = root.join("spec/generated");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    }
    for (rel, text) in &files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("creating {}: {e}", parent.display()))?;
        }
        std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    println!("wrote {} files to {}", files.len(), dir.display());
    Ok(())
}

fn check(root: &Path) -> Result<(), String> {
    let files = idem_spec::generate::artifacts(&read_book(root)?).map_err(|e| e.to_string())?;
    let stale = idem_spec_gen_support::stale_files(&root.join("spec/generated"), &files);
    if stale.is_empty() {
        println!("spec/generated is up to date ({} files)", files.len());
        Ok(())
    } else {
        Err(format!(
            "spec/generated is stale: {}\nrun `cargo run -p idem-spec --bin idem-spec-gen` and commit the result",
            stale.join(", ")
        ))
    }
}

fn coverage(root: &Path, uncited_only: bool) -> Result<(), String> {
    let citations = idem_spec_gen_support::workspace_citations(root).map_err(|e| e.to_string())?;
    let mut by_id: BTreeMap<&str, Vec<&clauses::Citation>> = BTreeMap::new();
    for c in &citations {
        by_id.entry(c.id.as_str()).or_default().push(c);
    }
    for clause in clauses::all() {
        let cites = by_id.get(clause.id.as_str()).cloned().unwrap_or_default();
        if uncited_only && !cites.is_empty() {
            continue;
        }
        println!(
            "{} [{} {}] {}",
            clause.id,
            clause.level.as_str(),
            clause.class.as_str(),
            clause.title
        );
        if cites.is_empty() {
            println!("    (not cited by any test)");
        }
        for c in cites {
            let item = if c.item.is_empty() {
                String::new()
            } else {
                format!(" {}", c.item)
            };
            let kind = match c.kind {
                clauses::CitationKind::Test => "test",
                clauses::CitationKind::Case => "kit case",
                clauses::CitationKind::Literal => "data",
            };
            println!("    {} ({kind}){item}", c.location);
        }
    }
    Ok(())
}

/// mdBook preprocessor: turns each `r[idem.x.y]` label line into an anchor
/// the clause list links to. It walks the book JSON generically (any object
/// with a string `content`), so it does not depend on mdBook's exact schema.
fn preprocess(root: &Path) -> Result<(), String> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| e.to_string())?;
    let value: serde_json::Value =
        serde_json::from_str(&input).map_err(|e| format!("mdbook input: {e}"))?;
    let mut book = match value {
        serde_json::Value::Array(mut parts) if parts.len() == 2 => parts.pop().unwrap_or_default(),
        _ => return Err("mdbook input is not [context, book]".to_owned()),
    };
    let citations = idem_spec_gen_support::workspace_citations(root).unwrap_or_default();
    idem_spec_gen_support::render_labels(&mut book, &citations);
    println!("{book}");
    Ok(())
}

/// File-system helpers of the generator, shared with the crate's tests
/// (kept out of the library, which does no I/O).
#[path = "../../tests/support/mod.rs"]
mod idem_spec_gen_support;
