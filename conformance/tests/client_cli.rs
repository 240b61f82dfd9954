//! `idem-conformance client --run` end to end, with real shell commands:
//! curl without retries conforms; curl's own `--retry` resends the same key
//! (never called a key change) but has no overall deadline and fixed
//! delays; a key-less retrying curl is unsafe; a command that is not there,
//! or never calls the API, is a harness error that says so.

use std::path::PathBuf;
use std::process::{Command, Output};

fn out_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "idem-conf-client-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&d).expect("tmp dir");
    d
}

fn kit(command: &str, extra: &[&str]) -> (Output, serde_json::Value) {
    let dir = out_dir();
    let out = Command::new(env!("CARGO_BIN_EXE_idem-conformance"))
        .args(["client", "--run", command, "--out-dir"])
        .arg(&dir)
        .args(extra)
        .output()
        .expect("the kit runs");
    let json = std::fs::read_to_string(dir.join("report.json"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(serde_json::Value::Null);
    (out, json)
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The clause row of the report's matrix.
fn clause<'a>(r: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    r["clauses"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["id"] == id))
        .unwrap_or(&serde_json::Value::Null)
}

const KEYED: &str = r#"curl -sf --max-time 3 -X POST -H "Idempotency-Key: $(cat /proc/sys/kernel/random/uuid)" -H "Content-Type: application/json" -d '{"amount":1}' "$IDEM_BASE_URL/payments""#;

#[test]
fn curl_without_retries_conforms() {
    let (o, r) = kit(KEYED, &["--deadline", "3", "--runs", "6"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(r["summary"]["result"], "conforms");
    // It never retries, so there is no delay to judge: not a pass.
    let jitter = r["cases"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["id"] == "backoff.jitter"))
        .expect("jitter case");
    assert_eq!(jitter["verdict"], "inconclusive", "{jitter}");
    // Every run a new operation, every operation its own key.
    assert_eq!(
        clause(&r, "idem.client.key-per-operation")["verdict"],
        "pass"
    );
    assert!(text(&o).contains("wall time"), "{}", text(&o));
}

#[test]
fn curl_retry_keeps_its_key_but_has_no_deadline_and_no_jitter() {
    let cmd = KEYED.replace("curl -sf", "curl -sf --retry 2");
    let (o, r) = kit(&cmd, &["--deadline", "3", "--runs", "6"]);
    let all = text(&o);
    // The same -H header on every retry: the same key.
    assert_eq!(
        clause(&r, "idem.client.same-key")["verdict"],
        "pass",
        "{all}"
    );
    assert_eq!(
        r["summary"]["unsafe_clauses"],
        serde_json::json!([]),
        "{all}"
    );
    // --max-time bounds each attempt, not the operation.
    assert_eq!(
        clause(&r, "idem.client.deadline")["verdict"],
        "fail",
        "{all}"
    );
    // Its delays are 1 s, 2 s, ...: the same in every run.
    assert_eq!(
        clause(&r, "idem.client.no-unjittered-backoff")["verdict"],
        "non-strict",
        "{all}"
    );
    assert_eq!(r["summary"]["result"], "deviates");
    assert_eq!(o.status.code(), Some(3), "{all}");
    // Findings come with their timeline.
    assert!(all.contains("t=+"), "{all}");
}

#[test]
fn a_keyless_retrying_curl_is_unsafe() {
    let cmd = r#"curl -sf --retry 2 --max-time 3 -X POST -H "Content-Type: application/json" -d '{"amount":1}' "$IDEM_BASE_URL/payments""#;
    let (o, r) = kit(
        cmd,
        &["--deadline", "3", "--runs", "6", "--only", "retry.50*"],
    );
    let all = text(&o);
    assert_eq!(o.status.code(), Some(1), "{all}");
    assert_eq!(
        clause(&r, "idem.client.no-key-no-retry")["verdict"],
        "fail",
        "{all}"
    );
    assert!(all.contains("UNSAFE idem.client.no-key-no-retry"), "{all}");
}

#[test]
fn a_missing_command_is_a_harness_error_naming_it() {
    let (o, r) = kit("no-such-sdk-command-4711 --pay", &[]);
    let all = text(&o);
    assert_eq!(o.status.code(), Some(2), "{all}");
    assert!(all.contains("command not found"), "{all}");
    assert!(all.contains("no-such-sdk-command-4711"), "{all}");
    assert_eq!(r["summary"]["result"], "harness-error");
}

#[test]
fn a_command_that_never_calls_the_api_says_so() {
    let (o, _) = kit("echo hello; exit 0", &[]);
    let all = text(&o);
    assert_eq!(o.status.code(), Some(2), "{all}");
    assert!(all.contains("never contacted the API"), "{all}");
    assert!(all.contains("IDEM_BASE_URL="), "{all}");
}
