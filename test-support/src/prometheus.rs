//! [`Prometheus`]: a real Prometheus server (Debian's `prometheus`) of one
//! test's own, on a free loopback port with its storage in a temporary
//! directory, killed on drop; and the HTTP API calls the suites make of it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::time::Instant;

use crate::TempDir;

/// Where Debian's `prometheus` package installs the server.
pub const BINARY: &str = "/usr/bin/prometheus";

/// A running Prometheus; the process is killed and its storage removed on
/// drop.
#[derive(Debug)]
pub struct Prometheus {
    _child: tokio::process::Child,
    _dir: TempDir,
    base: String,
    http: reqwest::Client,
}

impl Prometheus {
    /// [`BINARY`], or `None` after [`crate::skip_without`] for `test` (a loud
    /// SKIPPED line on a developer's machine, a failure in CI).
    pub fn binary(test: &str) -> Option<PathBuf> {
        let path = PathBuf::from(BINARY);
        if path.exists() {
            return Some(path);
        }
        crate::skip_without(
            test,
            "/usr/bin/prometheus is not installed (Debian's prometheus package)",
        );
        None
    }

    /// Starts `binary` with `config` as its whole `prometheus.yml`, and
    /// waits (at most `within`) until it answers ready.
    ///
    /// # Panics
    /// When the server cannot be started or is not ready in time: the test
    /// must fail, not pass silently.
    pub async fn start(binary: &Path, config: &str, within: Duration) -> Self {
        let dir = TempDir::new("idem-prom");
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, config).unwrap_or_else(|e| panic!("writing {file:?}: {e}"));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("no free port: {e}"));
        let child = tokio::process::Command::new(binary)
            .arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {binary:?}: {e}"));
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_else(|e| panic!("an HTTP client: {e}"));
        let p = Self {
            _child: child,
            _dir: dir,
            base: format!("http://127.0.0.1:{port}"),
            http,
        };
        let deadline = Instant::now() + within;
        loop {
            let ready = p.http.get(format!("{}/-/ready", p.base)).send().await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return p;
            }
            assert!(Instant::now() < deadline, "prometheus never became ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `GET` of an HTTP API path (such as `/api/v1/rules`), asserting the
    /// API answered `"status": "success"`.
    ///
    /// # Panics
    /// When the request fails or the API reports an error.
    pub async fn get(&self, path: &str) -> serde_json::Value {
        let v: serde_json::Value = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: not JSON: {e}"));
        assert_eq!(v["status"], "success", "{path}: {v}");
        v
    }

    /// The instant vector of `query` as (labels, value) pairs.
    ///
    /// # Panics
    /// As [`Prometheus::get`], and when a sample is not a number.
    pub async fn query(&self, query: &str) -> Vec<(serde_json::Value, f64)> {
        let v = self
            .get(&format!("/api/v1/query?query={}", encode(query)))
            .await;
        v["data"]["result"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|r| {
                        let value = r["value"][1]
                            .as_str()
                            .and_then(|s| s.parse::<f64>().ok())
                            .unwrap_or_else(|| panic!("{query}: sample {r}"));
                        (r["metric"].clone(), value)
                    })
                    .collect()
            })
            .unwrap_or_else(|| panic!("{query}: no result vector in {v}"))
    }
}

/// Percent-encodes a query parameter (everything but unreserved characters).
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
