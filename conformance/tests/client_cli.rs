//! `idem-conformance client --run` end to end, with real shell commands:
//! curl without retries conforms; curl's own `--retry` resends the same key
//! (never called a key change) but has no overall deadline and fixed
//! delays; a key-less retrying curl is unsafe, unless its key travels in
//! the body and the kit is told so; a command that is not there, or never
//! calls the API, is a harness error that says so; a command whose exit
//! code contradicts its answer deviates; a planted secret appears in no
//! output and no report file; `--help` lists the exit codes; a partial run
//! says how much it checked, and the reproduce line re-runs the kit.

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
    kit_in(&out_dir(), command, extra, &[])
}

fn kit_in(
    dir: &std::path::Path,
    command: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (Output, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_idem-conformance"))
        .args(["client", "--run", command, "--out-dir"])
        .arg(dir)
        .args(extra)
        .envs(env.iter().copied())
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
    // It never retries, so there is no delay to judge: no jitter verdict.
    let jitter = r["cases"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["id"] == "backoff.jitter"))
        .expect("jitter case");
    let judged: Vec<&str> = jitter["checks"]
        .as_array()
        .map(|c| c.iter().filter_map(|k| k["clause"].as_str()).collect())
        .unwrap_or_default();
    assert!(!judged.iter().any(|c| c.contains("jitter")), "{jitter}");
    assert_eq!(
        clause(&r, "idem.client.backoff-jitter")["verdict"],
        serde_json::Value::Null
    );
    // curl sends no Request-Deadline-Ms: a missed SHOULD, which leaves CONFORMS.
    assert_eq!(
        clause(&r, "idem.client.deadline-header")["verdict"],
        "non-strict"
    );
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
    // Its delays are 1 s, 2 s, ...: the same in every run, which the
    // contract forbids (a MUST NOT), besides missing full jitter (a SHOULD).
    assert_eq!(
        clause(&r, "idem.client.no-unjittered-backoff")["verdict"],
        "fail",
        "{all}"
    );
    assert_eq!(
        clause(&r, "idem.client.backoff-jitter")["verdict"],
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

/// The verdict of the kit's own exit-code check in a case.
fn exit_check<'a>(r: &'a serde_json::Value, case: &str) -> Option<&'a serde_json::Value> {
    r["cases"].as_array()?.iter().find(|c| c["id"] == case)?["checks"]
        .as_array()?
        .iter()
        .find(|k| k["clause"] == "idem.client.outcome")
}

#[test]
fn help_lists_the_exit_codes_and_a_success_body_example() {
    let out = Command::new(env!("CARGO_BIN_EXE_idem-conformance"))
        .args(["client", "--help"])
        .output()
        .expect("the kit runs");
    let help = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{help}");
    for line in [
        "0  CONFORMS",
        "1  UNSAFE",
        "2  HARNESS ERROR",
        "3  DEVIATES",
        r#"--success-body '{"id":"pay_1","status":"succeeded"}'"#,
        "--key-pointer",
        "--key-header",
    ] {
        assert!(help.contains(line), "{line} missing from:\n{help}");
    }
}

// clause: idem.client.outcome
#[test]
fn a_command_that_exits_1_after_its_201_deviates() {
    let cmd = format!("{KEYED}; exit 1");
    let (o, r) = kit(
        &cmd,
        &["--deadline", "3", "--runs", "6", "--only", "final.400"],
    );
    let all = text(&o);
    assert_eq!(o.status.code(), Some(3), "{all}");
    let c = exit_check(&r, "basics.success").expect("judged");
    assert_eq!(c["verdict"], "fail", "{c}");
    assert_eq!(c["class"], "semantics", "{c}");
    // After a final 400, exit 1 is the truth.
    assert_eq!(
        exit_check(&r, "final.400").expect("judged")["verdict"],
        "pass"
    );
    // A partial run says how much it checked, wherever its result shows.
    assert!(all.contains("partial run (--only final.400): "), "{all}");
    assert!(
        r["target"]
            .as_str()
            .is_some_and(|t| t.contains("partial run, --only final.400")),
        "{}",
        r["target"]
    );
}

#[test]
fn the_reproduce_line_reruns_the_kit_on_the_scenario_not_a_dead_server() {
    let cmd = r#"curl -sf --retry 2 --max-time 3 -X POST -H "Content-Type: application/json" -d '{"amount":1}' "$IDEM_BASE_URL/payments""#;
    let (o, r) = kit(
        cmd,
        &["--deadline", "3", "--seed", "7", "--only", "retry.502"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let case = r["cases"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["id"] == "retry.502"))
        .expect("case");
    let line = case["reproduction"][0].as_str().expect("a reproduce line");
    assert!(
        line.starts_with("idem-conformance client --run 'curl -sf --retry 2"),
        "{line}"
    );
    assert!(
        line.contains("--only retry.502 --seed 7 --deadline 3"),
        "{line}"
    );
    assert!(!line.contains("127.0.0.1"), "{line}");
}

#[test]
fn a_key_in_the_body_is_read_there_when_the_kit_is_told() {
    let cmd = r#"k=$(cat /proc/sys/kernel/random/uuid); curl -sf --retry 2 --max-time 3 -X POST -H "Content-Type: application/json" -d "{\"amount\":1,\"idempotency_key\":\"$k\"}" "$IDEM_BASE_URL/payments""#;
    let args = ["--deadline", "3", "--only", "retry.50*"];
    let (o, r) = kit(cmd, &args);
    // Told nothing, the kit sees key-less resends: unsafe.
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let mut told: Vec<&str> = args.to_vec();
    told.extend(["--key-pointer", "/idempotency_key"]);
    let (o, r2) = kit(cmd, &told);
    let all = text(&o);
    assert_eq!(o.status.code(), Some(0), "{all}");
    assert_eq!(
        clause(&r2, "idem.client.same-key")["verdict"],
        "pass",
        "{all}"
    );
    assert_eq!(
        clause(&r2, "idem.client.no-key-no-retry")["verdict"],
        "pass",
        "{all}"
    );
    assert_eq!(clause(&r, "idem.client.no-key-no-retry")["verdict"], "fail");
    // A tracing header is never accepted as the key's place.
    let (o, _) = kit(KEYED, &["--key-header", "x-ms-client-request-id"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("tracing id"), "{}", text(&o));
}

#[test]
fn a_planted_secret_appears_in_no_output_and_no_report_file() {
    // One secret in the command line, one only in a header the client sends
    // (from a variable whose name gives nothing away), one in a secret-named
    // variable of the environment; curl -v echoes every header it sends to
    // its stderr, which the report quotes for each finding.
    const IN_COMMAND: &str = "sk_live_PLANTED_in_command_4711";
    const IN_HEADER: &str = "PLANTED-header-value-0815";
    const IN_ENV: &str = "PLANTED_env_token_1234";
    let cmd = format!(
        r#"curl -v -sf --retry 2 --max-time 3 -X POST -H "Authorization: Bearer {IN_COMMAND}" -H "X-Api-Key: $SDK_SETTING" -H "Content-Type: application/json" -d '{{"amount":1}}' "$IDEM_BASE_URL/payments"; rc=$?; echo "sent X-Api-Key $SDK_SETTING, token $PAY_API_TOKEN" >&2; exit $rc"#
    );
    let dir = out_dir();
    let extra_json = dir.join("copy.json");
    let extra_html = dir.join("copy.html");
    let extra_junit = dir.join("copy.xml");
    let (o, r) = kit_in(
        &dir,
        &cmd,
        &[
            "--deadline",
            "3",
            "--only",
            "retry.50*",
            "--json",
            extra_json.to_str().expect("utf-8"),
            "--html",
            extra_html.to_str().expect("utf-8"),
            "--junit",
            extra_junit.to_str().expect("utf-8"),
        ],
        &[("SDK_SETTING", IN_HEADER), ("PAY_API_TOKEN", IN_ENV)],
    );
    let all = text(&o);
    // Key-less retries: unsafe, so every failing case quotes its stderr
    // and its reproduce line.
    assert_eq!(o.status.code(), Some(1), "{all}");
    assert!(all.contains("reproduce (secrets redacted)"), "{all}");
    assert!(all.contains("[redacted]"), "{all}");
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).expect("out dir") {
        let path = entry.expect("entry").path();
        let body = std::fs::read_to_string(&path).expect("a text report");
        files += 1;
        for secret in [IN_COMMAND, IN_HEADER, IN_ENV] {
            assert!(!body.contains(secret), "{secret} in {}", path.display());
        }
    }
    assert_eq!(files, 6, "three reports and three copies");
    for secret in [IN_COMMAND, IN_HEADER, IN_ENV] {
        assert!(!all.contains(secret), "{secret} in the kit's output");
    }
    // The evidence is still there, without the values.
    assert!(
        r["target"]
            .as_str()
            .is_some_and(|t| t.contains("Authorization: [redacted]")),
        "{}",
        r["target"]
    );
    assert!(
        r.to_string()
            .contains("sent X-Api-Key [redacted], token [redacted]"),
        "the stderr line, redacted"
    );
}

/// The `run:` script and the `env:` names of the step called `name` in a
/// workflow file as simple as the kit's recipe: a step's keys indented
/// under its `- name:` line, a `run: |` block more indented still.
fn workflow_step(yaml: &str, name: &str) -> (String, Vec<(String, String)>) {
    let lines: Vec<&str> = yaml.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim() == format!("- name: {name}"))
        .unwrap_or_else(|| panic!("no step {name:?}"));
    let indent = |l: &str| l.len() - l.trim_start().len();
    let step_indent = indent(lines[start]);
    let body: Vec<&str> = lines[start + 1..]
        .iter()
        .take_while(|l| l.trim().is_empty() || indent(l) > step_indent)
        .copied()
        .collect();
    let (mut run, mut env) = (String::new(), Vec::new());
    let mut i = 0;
    while i < body.len() {
        let t = body[i].trim();
        if t == "run: |" {
            let block = indent(body[i]);
            i += 1;
            while i < body.len() && (body[i].trim().is_empty() || indent(body[i]) > block) {
                run.push_str(body[i].trim());
                run.push('\n');
                i += 1;
            }
            continue;
        }
        if t == "env:" {
            let block = indent(body[i]);
            i += 1;
            while i < body.len() && indent(body[i]) > block {
                let (k, v) = body[i].trim().split_once(':').expect("key: value");
                env.push((k.trim().to_owned(), v.trim().to_owned()));
                i += 1;
            }
            continue;
        }
        i += 1;
    }
    (run, env)
}

#[test]
fn the_ci_recipe_runs_as_written() {
    let yaml = include_str!("../ci/sdk-github-actions.yml");
    let (run, env) = workflow_step(yaml, "check the SDK's retries");
    assert!(run.starts_with("idem-conformance client "), "{run}");
    // Every env value is a repository variable or a secret; the test is the
    // repository, and gives them values (the install step is this build).
    const SECRET: &str = "sk_test_PLANTED_ci_secret_2026";
    let call = format!(
        r#"{KEYED} -H "Authorization: Bearer $SDK_API_KEY" || {{ echo "failed with $SDK_API_KEY" >&2; exit 22; }}"#
    );
    let value = |expr: &str| match expr {
        "${{ vars.SDK_CALL }}" => call.clone(),
        "${{ vars.SDK_DEADLINE }}" => "3".to_owned(),
        "${{ secrets.SDK_API_KEY }}" => SECRET.to_owned(),
        other => panic!("the test has no value for {other}"),
    };
    let workspace = out_dir();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_idem-conformance"))
        .parent()
        .expect("bin dir")
        .to_owned();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // GitHub runs a `run:` block as `bash -e {0}`.
    let o = Command::new("bash")
        .args(["-e", "-c", &run])
        .current_dir(&workspace)
        .env("PATH", path)
        .envs(env.iter().map(|(k, v)| (k.clone(), value(v))))
        .output()
        .expect("bash runs");
    let all = text(&o);
    assert_eq!(o.status.code(), Some(0), "{all}");
    assert!(all.contains("result: CONFORMS"), "{all}");
    let report = workspace.join("idem-client-report");
    for f in ["junit.xml", "report.json", "report.html"] {
        let body = std::fs::read_to_string(report.join(f)).expect("the step's report");
        assert!(!body.contains(SECRET), "the secret in {f}");
    }
    assert!(!all.contains(SECRET), "the secret in the output");
}

/// A shell loop over curl: one key, five attempts at an always-503 with
/// short pauses. Five attempts miss the SHOULD of 3 (`max-attempts`) and
/// keep every MUST the scenario judges (at most 10 requests, inside the
/// deadline); the pauses are fixed, but `--only limits.always-503` leaves
/// the jitter test out.
const FIVE_ATTEMPTS: &str = r#"k=$(cat /proc/sys/kernel/random/uuid); for i in 1 2 3 4 5; do curl -sf --max-time 3 -X POST -H "Idempotency-Key: $k" -H "Content-Type: application/json" -d '{"amount":1}' "$IDEM_BASE_URL/payments" && exit 0; sleep 0.2; done; exit 1"#;

#[test]
fn strict_turns_a_missed_should_into_deviates() {
    // Five attempts: only the attempt SHOULD is missed, which alone leaves
    // CONFORMS, and under --strict is DEVIATES.
    for (strict, code) in [(false, 0), (true, 3)] {
        let mut args = vec!["--deadline", "5", "--only", "limits.always-503"];
        if strict {
            args.push("--strict");
        }
        let (o, r) = kit(FIVE_ATTEMPTS, &args);
        let all = text(&o);
        assert_eq!(
            clause(&r, "idem.client.max-attempts")["verdict"],
            "non-strict",
            "{all}"
        );
        assert_eq!(
            clause(&r, "idem.client.attempt-cap")["verdict"],
            "pass",
            "{all}"
        );
        assert_eq!(
            r["summary"]["must_clauses_failed"],
            serde_json::json!([]),
            "{all}"
        );
        assert_eq!(r["summary"]["strict"], strict, "{all}");
        assert_eq!(o.status.code(), Some(code), "strict {strict}: {all}");
    }
}
