//! The README shows the example's code verbatim, so the example's tests (`cargo test -p
//! example-idempotent-notes`: one note per retried POST on a WAL file, the fingerprint policy,
//! the reaper deleting an expired key) execute exactly what the README shows.

#[test]
fn the_readme_shows_the_example_verbatim() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap_or_default();
    let example = std::fs::read_to_string(dir.join("../examples/idempotent-notes/src/lib.rs"))
        .unwrap_or_default();
    assert!(!example.is_empty(), "the example exists");
    let block = readme
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .unwrap_or_default();
    assert_eq!(
        block, example,
        "README.md's first rust block is examples/idempotent-notes/src/lib.rs"
    );
}
