//! A real Prometheus (Debian's `prometheus`) scrapes a running server while
//! scripted traffic runs, and the series are read back through
//! Prometheus's HTTP query API: each must count exactly what was sent.
//!
//! The script, on one server process: first executions, replays, a
//! mismatch, a missing and an invalid key, a released 5xx, an in-flight
//! conflict, and a payment whose writer stalls past its lease so the
//! completer takes it over and the stalled writer's commit is fenced (the
//! duplicate side-effect alarm, `idem_fence_lost_total`). Then a payment is
//! killed with SIGKILL in the middle (its intent committed), the server is
//! restarted, and the new process's completer resumes it: first against a
//! processor that is down (the orphaned-key gauge shows it), then finishes
//! it once the processor is back.
//!
//! Every wait is a poll of the query API (or the server) with a deadline.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;

use idem_fake_processor::{ControlMode, ControlRequest, spawn_in_process};
use idem_test_support::{ChildServer, TempDir};
use tokio::time::Instant;

/// Longest any poll of this test may take before the test fails.
const GUARD: Duration = Duration::from_secs(40);

const TRANSFER: &str = r#"{"from":"acc_alice_main","to":"acc_alice_savings","amount":1}"#;
const PAYMENT: &str = r#"{"amount":4200,"currency":"eur","source":"tok_prom"}"#;

/// A Prometheus of the test's own, scraping `target` every 250 ms; killed on
/// drop.
struct Prometheus(idem_test_support::Prometheus);

impl Prometheus {
    async fn start(binary: &Path, target: &str) -> Self {
        let config = format!(
            "global:\n  scrape_interval: 250ms\n  evaluation_interval: 250ms\n\
             scrape_configs:\n  - job_name: idem\n    scrape_timeout: 200ms\n    \
             static_configs:\n      - targets: ['{target}']\n"
        );
        Self(idem_test_support::Prometheus::start(binary, &config, GUARD).await)
    }

    /// The instant vector of `query` as (labels, value) pairs.
    async fn query(&self, query: &str) -> Vec<(serde_json::Value, f64)> {
        self.0.query(query).await
    }

    /// The one value of `query` (absent: `None`).
    async fn value(&self, query: &str) -> Option<f64> {
        let r = self.query(query).await;
        assert!(r.len() <= 1, "{query} has {} series: {r:?}", r.len());
        r.first().map(|(_, v)| *v)
    }

    /// Polls until every `(query, value)` holds at once (bounded).
    async fn wait_all(&self, want: &[(&str, f64)]) {
        let deadline = Instant::now() + GUARD;
        loop {
            let mut wrong = Vec::new();
            for (q, v) in want {
                let got = self.value(q).await;
                if got != Some(*v) {
                    wrong.push(format!("{q} = {got:?}, want {v}"));
                }
            }
            if wrong.is_empty() {
                return;
            }
            assert!(Instant::now() < deadline, "never held: {wrong:#?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for two more scrapes of the server, then checks `want` again:
    /// the counts are exact, not a lower bound met on the way up.
    async fn still(&self, want: &[(&str, f64)]) {
        let scrapes = "count_over_time(up{job=\"idem\"}[1h])";
        let now = self.value(scrapes).await.unwrap_or(0.0);
        self.wait_until(scrapes, |v| v >= now + 2.0).await;
        for (q, v) in want {
            assert_eq!(self.value(q).await, Some(*v), "{q} moved on");
        }
    }

    async fn wait_until(&self, query: &str, ok: impl Fn(f64) -> bool) -> f64 {
        let deadline = Instant::now() + GUARD;
        loop {
            if let Some(v) = self.value(query).await
                && ok(v)
            {
                return v;
            }
            assert!(Instant::now() < deadline, "{query} never held");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    async fn post(
        &self,
        path: &str,
        key: Option<&str>,
        body: &str,
        extra: &[(&str, &str)],
    ) -> (u16, serde_json::Value, bool) {
        let mut r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("authorization", "Bearer demo-alice")
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(k) = key {
            r = r.header("idempotency-key", k);
        }
        for (h, v) in extra {
            r = r.header(*h, *v);
        }
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        let replayed = r.headers().contains_key("idempotent-replayed");
        let v = r.json().await.unwrap_or(serde_json::Value::Null);
        (status, v, replayed)
    }

    async fn hook(&self, path: &str, body: &str) -> serde_json::Value {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{path}");
        r.json().await.unwrap_or(serde_json::Value::Null)
    }

    async fn paused(&self) -> serde_json::Value {
        self.http
            .get(format!("{}/_test/failpoints", self.base))
            .send()
            .await
            .unwrap()
            .json::<serde_json::Value>()
            .await
            .unwrap()["paused"]
            .clone()
    }

    async fn wait_paused(&self, label: &str) {
        let deadline = Instant::now() + GUARD;
        loop {
            let p = self.paused().await;
            if p.as_array().unwrap().iter().any(|x| x == label) {
                return;
            }
            assert!(Instant::now() < deadline, "never paused at {label}: {p}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn payment_status(&self, key: &str) -> Option<String> {
        let v: serde_json::Value = self
            .http
            .get(format!("{}/v1/payments?idempotency_key={key}", self.base))
            .header("authorization", "Bearer demo-alice")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["payments"][0]["status"].as_str().map(str::to_owned)
    }

    async fn wait_payment(&self, key: &str, status: &str) {
        let deadline = Instant::now() + GUARD;
        loop {
            if self.payment_status(key).await.as_deref() == Some(status) {
                return;
            }
            assert!(Instant::now() < deadline, "payment {key} never {status}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The metric names in a PromQL expression: identifiers that start one of
/// the families the rules and the dashboard draw on.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    for ch in expr.chars().chain(std::iter::once(' ')) {
        if ch.is_ascii_alphanumeric() || ch == '_' {
            word.push(ch);
            continue;
        }
        if word.starts_with("idem_") || word.starts_with("process_") {
            out.push(std::mem::take(&mut word));
        }
        word.clear();
    }
    out
}

/// Checks `ops/prometheus/idem-alerts.yml` and
/// `ops/grafana/idem-dashboard.json` against what Prometheus scraped.
async fn check_rules_and_dashboard(prom: &Prometheus) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let rules = std::fs::read_to_string(root.join("ops/prometheus/idem-alerts.yml")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("ops/grafana/idem-dashboard.json")).unwrap(),
    )
    .expect("the dashboard is valid JSON");
    let mut exprs: Vec<String> = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            // Grafana's variables, as Grafana would fill them in.
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "1m")
                .replace("$job", "idem");
            exprs.push(expr);
        }
    }
    assert!(exprs.len() >= 10, "the dashboard has its panels");
    let dashboard_exprs = exprs.len();
    // The rules file's expressions (one-line or folded `|` blocks).
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
    assert!(exprs.len() >= dashboard_exprs + 7, "every alert rule read");
    let v = prom.0.get("/api/v1/label/__name__/values").await;
    let exposed: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    for expr in &exprs {
        for name in metric_names(expr) {
            assert!(
                exposed.contains(&name.as_str()),
                "{name} (in `{expr}`) is not a series the server exposes"
            );
        }
        // Valid PromQL: the query API accepts it.
        let _ = prom.query(expr).await;
    }
}

#[test]
fn metric_names_are_read_from_promql() {
    assert_eq!(
        metric_names(
            "sum(rate(idem_a_total{job=\"idem\",x=\"y\"}[1m])) / process_open_fds > 0 and on (job) idem_b"
        ),
        ["idem_a_total", "process_open_fds", "idem_b"]
    );
}

fn req(route: &str, outcome: &str) -> String {
    format!("sum(idem_requests_total{{job=\"idem\",route=\"{route}\",outcome=\"{outcome}\"}})")
}

// clause: idem.completer.drives, idem.lease.fencing
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_counts_exactly_the_scripted_traffic() {
    let Some(binary) =
        idem_test_support::Prometheus::binary("prometheus_counts_exactly_the_scripted_traffic")
    else {
        return;
    };
    let dir = TempDir::new("idem-prom");
    let processor = spawn_in_process(dir.join("processor.db")).await.unwrap();
    let db_url = format!("sqlite://{}", dir.join("idem.db").display());
    let mut server = ChildServer::command(env!("CARGO_BIN_EXE_idem-server"))
        .args(["--listen", "127.0.0.1:0", "--database-url", &db_url])
        .args(["--processor-url", processor.base_url()])
        .args(["--test-hooks", "--lease-secs", "5"])
        // The completer retries the key every pass while the processor is
        // down (no client is coming back for it).
        .args([
            "--completer-interval-ms",
            "200",
            "--completer-grace-ms",
            "0",
        ])
        .env("RUST_LOG", "error")
        .start()
        .await
        .expect("start idem-server");
    let prom = Prometheus::start(&binary, &server.addr().to_string()).await;
    let c = Client {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
        base: server.base_url().to_owned(),
    };
    prom.wait_all(&[("up{job=\"idem\"}", 1.0)]).await;

    // Single-phase: 3 first executions, 2 replays, 1 mismatch, 1 missing
    // and 1 invalid key, 1 server error (not stored, key released).
    for k in ["t-1", "t-2", "t-3"] {
        assert_eq!(c.post("/v1/transfers", Some(k), TRANSFER, &[]).await.0, 201);
    }
    for _ in 0..2 {
        let (s, _, replayed) = c.post("/v1/transfers", Some("t-1"), TRANSFER, &[]).await;
        assert_eq!((s, replayed), (201, true));
    }
    let other = TRANSFER.replace("\"amount\":1", "\"amount\":2");
    assert_eq!(
        c.post("/v1/transfers", Some("t-1"), &other, &[]).await.0,
        409
    );
    assert_eq!(c.post("/v1/transfers", None, TRANSFER, &[]).await.0, 400);
    let too_long = "k".repeat(300);
    assert_eq!(
        c.post("/v1/transfers", Some(&too_long), TRANSFER, &[])
            .await
            .0,
        400
    );
    let fail = [("idem-failpoint", "error-after=started")];
    assert_eq!(
        c.post("/v1/transfers", Some("t-5xx"), TRANSFER, &fail)
            .await
            .0,
        500
    );

    // Multi-step: writer A stalls after its processor call; a duplicate
    // meanwhile is a 409 in flight; past A's lease the completer takes
    // the key over and finishes; A's commit is then fenced.
    let a = {
        let (http, base) = (c.http.clone(), c.base.clone());
        tokio::spawn(async move {
            let c = Client { http, base };
            let pause = [("idem-failpoint", "pause-after=charge-call")];
            c.post("/v1/payments", Some("p-fence"), PAYMENT, &pause)
                .await
        })
    };
    c.wait_paused("after=charge-call").await;
    let (s, v, _) = c.post("/v1/payments", Some("p-fence"), PAYMENT, &[]).await;
    assert_eq!(
        (s, v["code"].as_str()),
        (409, Some("idempotency_key_in_use"))
    );
    c.hook("/_test/clock", r#"{"advance_secs":6}"#).await;
    c.wait_payment("p-fence", "succeeded").await;
    c.hook("/_test/failpoints/release", "").await;
    let (s, _, _) = tokio::time::timeout(GUARD, a).await.unwrap().unwrap();
    assert_eq!(s, 409, "the stalled writer is fenced");
    let (s, _, replayed) = c.post("/v1/payments", Some("p-fence"), PAYMENT, &[]).await;
    assert_eq!((s, replayed), (201, true));

    let first: Vec<(String, f64)> = vec![
        (req("/v1/transfers", "executed"), 3.0),
        (req("/v1/transfers", "replayed"), 2.0),
        (req("/v1/transfers", "mismatch"), 1.0),
        (req("/v1/transfers", "key_missing"), 1.0),
        (req("/v1/transfers", "key_invalid"), 1.0),
        (req("/v1/transfers", "server_error_released"), 1.0),
        (req("/v1/payments", "in_flight"), 1.0),
        (req("/v1/payments", "fenced"), 1.0),
        (req("/v1/payments", "replayed"), 1.0),
        (
            "sum(idem_requests_total{job=\"idem\"})".into(),
            3.0 + 2.0 + 1.0 + 1.0 + 1.0 + 1.0 + 3.0,
        ),
        ("sum(idem_fence_lost_total{job=\"idem\"})".into(), 1.0),
        ("sum(idem_takeovers_total{job=\"idem\"})".into(), 1.0),
        (
            "sum(idem_completer_resumptions_total{job=\"idem\",result=\"finished\"})".into(),
            1.0,
        ),
        (
            "sum(idem_request_duration_seconds_count{job=\"idem\",route=\"/v1/transfers\"})".into(),
            9.0,
        ),
        ("sum(idem_orphaned_keys{job=\"idem\"})".into(), 0.0),
    ];
    let want: Vec<(&str, f64)> = first.iter().map(|(q, v)| (q.as_str(), *v)).collect();
    prom.wait_all(&want).await;
    prom.still(&want).await;
    // Latency of the two operations every first execution pays.
    for op in ["observe", "claim"] {
        let q = format!(
            "sum(idem_store_operation_duration_seconds_count{{job=\"idem\",operation=\"{op}\"}})"
        );
        assert!(prom.value(&q).await.unwrap_or(0.0) >= 3.0, "{q}");
    }

    // Every series the alert rules and the dashboard name is one this
    // server exposes, and every dashboard query is valid PromQL.
    check_rules_and_dashboard(&prom).await;

    // kill -9 with a payment's intent committed, right before its call.
    let b = {
        let request = c
            .http
            .post(format!("{}/v1/payments", c.base))
            .header("authorization", "Bearer demo-alice")
            .header("content-type", "application/json")
            .header("idempotency-key", "p-kill")
            .header("idem-failpoint", "pause-before=charge-call")
            .body(PAYMENT);
        tokio::spawn(async move { request.send().await })
    };
    c.wait_paused("before=charge-call").await;
    server.kill().await.unwrap();
    assert!(
        b.await.unwrap().is_err(),
        "the killed server answered nothing"
    );
    // The processor is down for the new process's first resumptions: the
    // key stays orphaned (and is measured so) until it is back.
    const DOWN_CALLS: u64 = 12;
    processor
        .client()
        .set_control(&ControlRequest::new(ControlMode::Unavailable).for_calls(DOWN_CALLS))
        .await
        .unwrap();
    server.restart().await.expect("restart idem-server");
    // The new process counts from zero; Prometheus sees the reset.
    let orphaned = prom
        .wait_until("max_over_time(idem_orphaned_keys{job=\"idem\"}[1m])", |v| {
            v >= 1.0
        })
        .await;
    assert_eq!(orphaned, 1.0, "one orphaned key");
    c.wait_payment("p-kill", "succeeded").await;
    let second = [
        (
            "sum(idem_completer_resumptions_total{job=\"idem\",result=\"unfinished\"})",
            DOWN_CALLS as f64,
        ),
        (
            "sum(idem_completer_resumptions_total{job=\"idem\",result=\"finished\"})",
            1.0,
        ),
        (
            "sum(idem_takeovers_total{job=\"idem\"})",
            DOWN_CALLS as f64 + 1.0,
        ),
        ("sum(idem_orphaned_keys{job=\"idem\"})", 0.0),
        (
            "sum(idem_orphaned_key_oldest_age_seconds{job=\"idem\"})",
            0.0,
        ),
        // Registered at zero at start, so the first increment is seen.
        ("sum(idem_fence_lost_total{job=\"idem\"})", 0.0),
    ];
    prom.wait_all(&second).await;
    prom.still(&second).await;
    // No request reached the new process: its request series, exported at
    // zero from start-up, are all still zero.
    let requests = prom.query("idem_requests_total{job=\"idem\"}").await;
    assert!(!requests.is_empty(), "registered at start-up");
    assert!(
        requests.iter().all(|(_, v)| *v == 0.0),
        "no request reached the new process: {requests:?}"
    );
    let charges = processor.client().charges().await.unwrap();
    assert_eq!(charges.count, 2, "one charge per payment");
    drop(prom);
    drop(server);
}
