//! The CI recipes in `conformance/ci/` run as written: every command of the
//! GitHub Actions job and of the GitLab CI job is executed verbatim with
//! `bash -c` against a staging stand-in (the zoo's reference dialect, which
//! conforms), with the credentials coming from the environment as the
//! manifest names them. The kit's cache is taken as hit (the built kit is
//! put where the cache restores it), which is what every run after the
//! first one does; the build step is the documented `cargo install`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use idem_zoo::{Dialect, ZooConfig};
use serde_json::Value;

fn recipe(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("ci")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("recipe");
    serde_saphyr::from_str(&text).expect("the recipe is YAML")
}

/// A checkout of an API team's repository: the manifest naming its
/// secrets, and the kit where the cache restores it.
fn checkout() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-ci-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(dir.join(".idem/bin")).expect("dir");
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("zoo/manifests/reference.toml");
    let text = std::fs::read_to_string(manifest)
        .expect("zoo manifest")
        .replace("Bearer zoo-alice", "Bearer ${SANDBOX_ALICE_TOKEN}")
        .replace("Bearer zoo-bob", "Bearer ${SANDBOX_BOB_TOKEN}");
    assert!(
        text.contains("${SANDBOX_BOB_TOKEN}"),
        "the manifest names the secrets"
    );
    std::fs::write(dir.join("idem-target.toml"), text).expect("manifest");
    std::fs::copy(
        env!("CARGO_BIN_EXE_idem-conformance"),
        dir.join(".idem/bin/idem-conformance"),
    )
    .expect("the kit where the cache puts it");
    dir
}

/// What the CI system would put in `${{ vars.X }}` and `${{ secrets.X }}`.
fn ci_value(expr: &str, staging: &str) -> String {
    let name = expr
        .trim()
        .trim_start_matches("${{")
        .trim_end_matches("}}")
        .trim()
        .rsplit('.')
        .next()
        .unwrap_or_default()
        .to_owned();
    match name.as_str() {
        "STAGING_URL" => staging.to_owned(),
        "SANDBOX_ALICE_TOKEN" => "zoo-alice".to_owned(),
        "SANDBOX_BOB_TOKEN" => "zoo-bob".to_owned(),
        "IDEMKIT_REPO" => "https://example.invalid/idemkit".to_owned(),
        "IDEMKIT_REF" => "v0.1.0".to_owned(),
        other => panic!("the recipe uses {other}, which this test does not provide"),
    }
}

fn run(dir: &Path, command: &str, env: &[(String, String)]) -> std::process::Output {
    let out = Command::new("bash")
        .arg("-c")
        .arg(command)
        .current_dir(dir)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .expect("bash");
    out
}

fn check_reports(dir: &Path) {
    for f in ["report.json", "junit.xml", "report.html"] {
        assert!(dir.join("idem-report").join(f).is_file(), "{f} written");
    }
    let json = std::fs::read_to_string(dir.join("idem-report/report.json")).expect("json");
    assert!(!json.contains("zoo-alice"), "no secret in the report");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_github_actions_job_runs_as_written() {
    let zoo = idem_zoo::spawn(ZooConfig {
        dialect: Dialect::Reference,
        defect: None,
        delay: Duration::ZERO,
        quirk: None,
    })
    .await
    .expect("zoo");
    let dir = checkout();
    let job = &recipe("github-actions.yml")["jobs"]["conformance"];
    let mut ran = 0;
    for step in job["steps"].as_array().expect("steps") {
        let Some(command) = step["run"].as_str() else {
            continue;
        };
        // The build step runs only on a cache miss.
        if step["if"]
            .as_str()
            .is_some_and(|c| c.contains("cache-hit != 'true'"))
        {
            assert!(
                command.contains("cargo install --locked --git"),
                "{command}"
            );
            assert!(
                command.contains("--root .idem"),
                "installs where the cache is"
            );
            continue;
        }
        let env: Vec<(String, String)> = step["env"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| {
                (
                    k.clone(),
                    ci_value(v.as_str().unwrap_or_default(), &zoo.base_url),
                )
            })
            .collect();
        let out = tokio::task::block_in_place(|| run(&dir, command, &env));
        assert!(
            out.status.success(),
            "{command}: {:?}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ran += 1;
    }
    assert_eq!(ran, 1, "the check step ran");
    check_reports(&dir);
    // The cache's path is the one the build step installs into.
    let cache = job["steps"]
        .as_array()
        .and_then(|s| {
            s.iter().find(|s| {
                s["uses"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("actions/cache"))
            })
        })
        .expect("a cache step");
    assert_eq!(cache["with"]["path"], ".idem");
    let _ = std::fs::remove_dir_all(&dir);
    zoo.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gitlab_ci_job_runs_as_written() {
    let zoo = idem_zoo::spawn(ZooConfig {
        dialect: Dialect::Reference,
        defect: None,
        delay: Duration::ZERO,
        quirk: None,
    })
    .await
    .expect("zoo");
    let dir = checkout();
    let job = &recipe("gitlab-ci.yml")["idempotency-contract"];
    assert_eq!(job["cache"]["paths"][0], ".idem/");
    let env: Vec<(String, String)> = [
        "STAGING_URL",
        "SANDBOX_ALICE_TOKEN",
        "SANDBOX_BOB_TOKEN",
        "IDEMKIT_REPO",
        "IDEMKIT_REF",
    ]
    .iter()
    .map(|k| ((*k).to_owned(), ci_value(k, &zoo.base_url)))
    .collect();
    let script = job["script"].as_array().expect("script");
    assert_eq!(script.len(), 2);
    for line in script {
        let command = line.as_str().expect("a command");
        let out = tokio::task::block_in_place(|| run(&dir, command, &env));
        assert!(
            out.status.success(),
            "{command}: {:?}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    check_reports(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    zoo.shutdown().await;
}
