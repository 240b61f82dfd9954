//! Operating the binary: logs without colour codes when stderr is not a
//! terminal, bearer tokens from the environment rather than from
//! arguments every local user can read, and every counter the shipped
//! alerts and dashboard read exported before the first request.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use idem_test_support::{ChildServer, TempDir};

/// Longest any wait of these tests may take before the test fails.
const GUARD: Duration = Duration::from_secs(30);

struct Server {
    child: ChildServer,
    _dir: TempDir,
}

/// Starts the server on a fresh SQLite file with `env`, logging at info.
async fn start(env: &[(&str, &str)]) -> Server {
    let dir = TempDir::new("idem-ops");
    let url = format!("sqlite://{}", dir.join("idem.db").display());
    let mut spawn = ChildServer::command(env!("CARGO_BIN_EXE_idem-server"))
        .args(["--listen", "127.0.0.1:0", "--database-url", &url])
        .env("RUST_LOG", "info")
        .capture_stderr();
    for (k, v) in env {
        spawn = spawn.env(k, v);
    }
    let child = spawn.start().await.expect("start idem-server");
    Server { child, _dir: dir }
}

#[tokio::test]
async fn logs_carry_no_colour_codes_when_stderr_is_not_a_terminal() {
    let server = start(&[]).await;
    let log = server
        .child
        .stderr_containing("background jobs started", GUARD)
        .await;
    assert!(log.contains(" INFO "), "{log}");
    assert!(!log.contains('\u{1b}'), "ANSI escape in {log:?}");
}

#[tokio::test]
async fn tokens_from_the_environment_authenticate_and_stay_out_of_ps_and_the_logs() {
    let server = start(&[("IDEM_TOKENS", "env-s3cret=carol")]).await;
    let client = reqwest::Client::new();
    let accounts = |token: &'static str| {
        client
            .get(format!("{}/v1/accounts", server.child.base_url()))
            .header("authorization", format!("Bearer {token}"))
            .send()
    };
    assert_eq!(accounts("env-s3cret").await.unwrap().status(), 200);
    assert_eq!(
        accounts("demo-alice").await.unwrap().status(),
        401,
        "configured tokens replace the demo ones"
    );
    #[cfg(target_os = "linux")]
    {
        let pid = server.child.pid().unwrap();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        assert!(!cmdline.windows(10).any(|w| w == b"env-s3cret"));
    }
    assert!(!server.child.stderr().contains("env-s3cret"));
}

/// The counters the alert rules and the dashboard take `rate()` or
/// `increase()` of, each with the label values their selectors fix
/// (`idem_requests_total{outcome="store_unavailable"}` gives
/// `("idem_requests_total", [("outcome", "store_unavailable")])`).
fn counter_selectors(exprs: &[String]) -> Vec<(String, Vec<(String, String)>)> {
    let mut out = Vec::new();
    for expr in exprs {
        let bytes = expr.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let rest = &expr[i..];
            let name_len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let name = &rest[..name_len];
            let boundary =
                i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
            if boundary && name.starts_with("idem_") && name.ends_with("_total") {
                let mut labels = Vec::new();
                if let Some(body) = rest[name_len..].strip_prefix('{') {
                    let body = &body[..body.find('}').unwrap_or(body.len())];
                    for m in body.split(',') {
                        // Only exact matchers fix a value; `$job` is Grafana's.
                        if let Some((k, v)) = m.split_once('=')
                            && !k.ends_with('!')
                            && !v.starts_with('~')
                            && !v.contains('$')
                        {
                            let v = v.trim().trim_matches('"');
                            let k = k.trim();
                            if k != "job" && k != "instance" {
                                labels.push((k.to_owned(), v.to_owned()));
                            }
                        }
                    }
                }
                out.push((name.to_owned(), labels));
            }
            i += name_len.max(1);
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn counter_selectors_are_read_from_promql() {
    let got = counter_selectors(&[
        r#"sum(rate(idem_requests_total{job="$job",outcome="store_unavailable"}[5m])) / rate(idem_requests_total[5m]) and my_idem_x_total"#.to_owned(),
    ]);
    assert_eq!(
        got,
        vec![
            ("idem_requests_total".to_owned(), vec![]),
            (
                "idem_requests_total".to_owned(),
                vec![("outcome".to_owned(), "store_unavailable".to_owned())]
            ),
        ]
    );
}

/// Every `expr` of the shipped alert rules and dashboard.
fn shipped_exprs() -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let rules = std::fs::read_to_string(root.join("ops/prometheus/idem-alerts.yml")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("ops/grafana/idem-dashboard.json")).unwrap(),
    )
    .unwrap();
    let mut exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect();
    // The rules' expressions, one-line or folded `|` blocks.
    let mut lines = rules.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(rest) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let indent = line.len() - line.trim_start().len();
        let mut expr = rest.trim().to_owned();
        if expr == "|" {
            expr.clear();
            while let Some(next) = lines.peek() {
                if next.len() - next.trim_start().len() <= indent {
                    break;
                }
                expr.push(' ');
                expr.push_str(next.trim());
                lines.next();
            }
        }
        exprs.push(expr);
    }
    exprs
}

/// A counter that first appears at its first increment has no earlier
/// sample, so `rate()` and `increase()` miss that increment: an outage whose
/// first refusals are the series' first samples may never page. So every
/// counter the rules and the dashboard select is exported, at zero, by a
/// server that has served nothing yet (the request counters at zero).
#[tokio::test]
async fn every_counter_the_alerts_and_dashboard_read_is_exported_before_the_first_request() {
    let exprs = shipped_exprs();
    let wanted = counter_selectors(&exprs);
    assert!(
        wanted.iter().any(|(n, l)| n == "idem_requests_total"
            && l.contains(&("outcome".to_owned(), "store_unavailable".to_owned()))),
        "the store-outage page's counter is among them: {wanted:?}"
    );
    let server = start(&[]).await;
    let text = reqwest::get(format!("{}/metrics", server.child.base_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect();
    let missing: Vec<String> = wanted
        .iter()
        .filter(|(name, labels)| {
            !series.iter().any(|line| {
                // Any value: a background pass may have run already.
                let head = line.rsplit_once(' ').map_or(*line, |(h, _)| h);
                let (n, rest) = head.split_once('{').unwrap_or((head, ""));
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
            })
        })
        .map(|(name, labels)| format!("{name}{labels:?}"))
        .collect();
    let requests: Vec<&&str> = series
        .iter()
        .filter(|l| l.starts_with("idem_requests_total{"))
        .collect();
    assert!(
        requests.iter().all(|l| l.ends_with(" 0")),
        "nothing was served yet: {requests:?}"
    );
    assert!(
        missing.is_empty(),
        "counters the shipped rules or dashboard read but a fresh server does not export: {missing:?}"
    );
}
