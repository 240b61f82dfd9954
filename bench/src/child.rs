//! The servers under test as child processes, and the binaries they run.
//!
//! The same shape as `idem_test_support::ChildServer` (which this crate
//! may not link: a production build never links the test support, see
//! `reference-server/tests/edges.rs`): start on `127.0.0.1:0`, read the
//! `listening on http://ADDR` line, drain stdout, kill on drop. Stderr can
//! be counted line by line: the statement-counting pass counts sqlx's
//! per-statement log lines that way.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::{Error, Result};

/// A server running as a child process; killed on drop.
#[derive(Debug)]
pub struct ChildServer {
    child: Child,
    /// Its address.
    pub addr: SocketAddr,
    /// Its process id (for `/proc`).
    pub pid: u32,
    /// Statements in the stderr lines containing the watched marker so far
    /// (see [`Spawn::count_stderr`]).
    counted: Arc<AtomicU64>,
}

/// How to start one: program, arguments, environment.
#[derive(Debug, Clone)]
pub struct Spawn {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    count: Option<String>,
}

impl Spawn {
    /// `program` with no arguments yet.
    pub fn new(program: &Path) -> Self {
        Self {
            program: program.to_owned(),
            args: Vec::new(),
            env: Vec::new(),
            count: None,
        }
    }

    /// Adds arguments.
    pub fn args<S: AsRef<str>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets an environment variable of the child.
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_owned(), v.to_owned()));
        self
    }

    /// Counts the statements in the child's stderr lines that contain
    /// `marker`: one per line, plus one per `"; "` in it (sqlx logs a
    /// statement list sent as one query, such as SQLite's final write with
    /// its `COMMIT`, as one line; none of the logged SQL has a `;` of its
    /// own).
    pub fn count_stderr(mut self, marker: &str) -> Self {
        self.count = Some(marker.to_owned());
        self
    }

    /// Starts it and waits (at most 60 s) for its ready line.
    pub async fn start(self) -> Result<ChildServer> {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            // The servers take their tokens from the files we write; tokens
            // exported for some other server must not join them.
            .env_remove("IDEM_TOKENS")
            .env("RUST_LOG", "warn")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(if self.count.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            Error::Setup(format!("could not start {}: {e}", self.program.display()))
        })?;
        let pid = child
            .id()
            .ok_or_else(|| Error::Setup("child has no pid".into()))?;
        let counted = Arc::new(AtomicU64::new(0));
        if let (Some(marker), Some(err)) = (self.count.clone(), child.stderr.take()) {
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(err).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.contains(&marker) {
                        let listed = line.matches("; ").count() as u64;
                        counted.fetch_add(1 + listed, Ordering::Relaxed);
                    }
                }
            });
        }
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| Error::Setup("child stdout not captured".into()))?;
        let mut lines = BufReader::new(stdout).lines();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let addr = loop {
            let line = tokio::time::timeout_at(deadline, lines.next_line())
                .await
                .map_err(|_| {
                    Error::Setup(format!(
                        "{}: no `listening on` line within 60 s",
                        self.program.display()
                    ))
                })?
                .map_err(|e| Error::Setup(e.to_string()))?
                .ok_or_else(|| {
                    Error::Setup(format!(
                        "{} {:?} exited before it listened",
                        self.program.display(),
                        self.args
                    ))
                })?;
            if let Some(rest) = line.strip_prefix("listening on http://") {
                let addr = rest
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .trim_end_matches('/');
                break addr
                    .parse::<SocketAddr>()
                    .map_err(|e| Error::Setup(format!("ready line {line:?}: {e}")))?;
            }
        };
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(ChildServer {
            child,
            addr,
            pid,
            counted,
        })
    }
}

impl ChildServer {
    /// `http://ADDR`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stderr lines with the marker so far, once the count has stopped
    /// moving (at most 3 s: the log is written asynchronously).
    pub async fn counted_settled(&self) -> u64 {
        let end = tokio::time::Instant::now() + Duration::from_secs(3);
        let mut last = self.counted.load(Ordering::Relaxed);
        loop {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let now = self.counted.load(Ordering::Relaxed);
            if now == last || tokio::time::Instant::now() >= end {
                return now;
            }
            last = now;
        }
    }

    /// Stops it (SIGKILL) and waits, bounded.
    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }
}

/// The workspace root this crate was built in.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// `cargo build -p PACKAGE --bin BIN` (release when `release`) in this
/// workspace, and the executable Cargo reports; `env_override` names an
/// environment variable holding a prebuilt binary instead. The same
/// pattern as the conformance kit's `demo`: Cargo has released its lock
/// before `cargo run` starts us, so the nested build is a quick no-op when
/// the binary is fresh.
pub fn cargo_bin(package: &str, bin: &str, release: bool, env_override: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env_override) {
        return Ok(PathBuf::from(p));
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(workspace_root().join("Cargo.toml"))
        .args(["-p", package, "--bin", bin])
        .arg("--message-format=json-render-diagnostics")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    if release {
        cmd.arg("--release");
    }
    let out = cmd
        .output()
        .map_err(|e| Error::Setup(format!("running cargo: {e}")))?;
    if !out.status.success() {
        return Err(Error::Setup(format!(
            "cargo build -p {package} failed ({})",
            out.status
        )));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == bin)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| Error::Setup(format!("cargo reported no {bin} executable")))
}

/// A directory under the system temp dir, removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `{prefix}-{short uuid}` (short: PostgreSQL's socket path
    /// must stay under 107 bytes).
    pub fn new(prefix: &str) -> Result<Self> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let dir = std::env::temp_dir().join(format!("{prefix}-{}", &id[..12]));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::Setup(format!("creating {}: {e}", dir.display())))?;
        Ok(Self(dir))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
