//! Running the processor binary as a child process, for tests that must
//! kill it (or the server) and look at what survived.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

use crate::server::READY_LINE_PREFIX;
use crate::{Error, ProcessorClient};

/// How long [`ProcessorChild::spawn`] waits for the ready line. Generous,
/// because CI machines share few cores between many builds.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(30);

/// Environment variable naming a prebuilt processor binary; when set,
/// [`binary`] returns it without running cargo.
pub const BINARY_ENV: &str = "IDEM_FAKE_PROCESSOR_BIN";

/// Most stdout lines read while looking for the ready line.
const MAX_PRELUDE_LINES: usize = 64;

/// A running `idem-fake-processor` child process.
///
/// Its stderr is inherited (set `RUST_LOG` to see its logs; it defaults to
/// `warn` here to keep test output quiet). Dropping the handle kills the
/// child, so a failing test leaves no process behind.
#[derive(Debug)]
pub struct ProcessorChild {
    child: Child,
    binary: PathBuf,
    db_path: PathBuf,
    addr: SocketAddr,
    base_url: String,
}

/// Starts `binary` on `127.0.0.1:0` with its database at `db_path` and waits
/// up to [`DEFAULT_START_TIMEOUT`] for its address. Same as
/// [`ProcessorChild::spawn`].
///
/// Inside this crate's tests the binary is
/// `env!("CARGO_BIN_EXE_idem-fake-processor")`; other crates can build it
/// with `cargo build -p idem-fake-processor` and pass its path.
pub async fn spawn_child(
    binary: impl AsRef<Path>,
    db_path: impl AsRef<Path>,
) -> Result<ProcessorChild, Error> {
    ProcessorChild::spawn(binary, db_path).await
}

/// The path of an up-to-date `idem-fake-processor` binary, for tests of
/// other crates (where `env!("CARGO_BIN_EXE_...")` is not available).
///
/// Returns `$IDEM_FAKE_PROCESSOR_BIN` when set. Otherwise it runs
/// `cargo build -p idem-fake-processor --bin idem-fake-processor` once per
/// test process (the release profile when the caller runs from a release
/// `target/` folder) and returns the executable cargo reports, so a
/// stale binary is never used. It blocks: call it before starting a
/// runtime or through `tokio::task::spawn_blocking`. Cargo releases its
/// build lock before running tests, so calling it from `cargo test` works.
pub fn binary() -> Result<PathBuf, Error> {
    if let Some(path) = std::env::var_os(BINARY_ENV) {
        return Ok(PathBuf::from(path));
    }
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(build_binary)
        .clone()
        .map_err(Error::Build)
}

fn build_binary() -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let release = std::env::current_exe()
        .ok()
        .is_some_and(|exe| exe.components().any(|c| c.as_os_str() == "release"));
    let mut command = std::process::Command::new(cargo);
    command
        .arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["-p", "idem-fake-processor", "--bin", "idem-fake-processor"])
        .arg("--message-format=json-render-diagnostics")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    if release {
        command.arg("--release");
    }
    let output = command
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!("cargo build exited with {}", output.status));
    }
    // Cargo prints one JSON object per line; the artifact line of our
    // binary carries its path in "executable".
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|msg| {
            msg["reason"] == "compiler-artifact" && msg["target"]["name"] == "idem-fake-processor"
        })
        .find_map(|msg| msg["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| "cargo reported no idem-fake-processor executable".to_owned())
}

impl ProcessorChild {
    /// Starts `binary` on `127.0.0.1:0` with its database at `db_path` and
    /// waits up to [`DEFAULT_START_TIMEOUT`] for its `listening on` line.
    pub async fn spawn(binary: impl AsRef<Path>, db_path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::spawn_on(
            binary,
            db_path,
            SocketAddr::from(([127, 0, 0, 1], 0)),
            DEFAULT_START_TIMEOUT,
        )
        .await
    }

    /// Starts `binary` listening on `listen`, waiting at most `timeout` for
    /// it to report its address. The child is killed if it does not.
    pub async fn spawn_on(
        binary: impl AsRef<Path>,
        db_path: impl AsRef<Path>,
        listen: SocketAddr,
        timeout: Duration,
    ) -> Result<Self, Error> {
        let binary = binary.as_ref().to_path_buf();
        let db_path = db_path.as_ref().to_path_buf();
        let mut command = Command::new(&binary);
        command
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--db")
            .arg(&db_path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "warn");
        }
        let mut child = command.spawn().map_err(|source| Error::Spawn {
            binary: binary.clone(),
            source,
        })?;
        let Some(stdout) = child.stdout.take() else {
            return Err(Error::ChildExited {
                status: "stdout was not captured".into(),
            });
        };
        let addr = match tokio::time::timeout(timeout, read_ready_line(stdout)).await {
            Ok(Ok(addr)) => addr,
            Ok(Err(e)) => {
                let _ = child.start_kill();
                let status = match tokio::time::timeout(Duration::from_secs(5), child.wait()).await
                {
                    Ok(Ok(s)) => s.to_string(),
                    _ => "unknown".into(),
                };
                return Err(match e {
                    Error::ChildExited { .. } => Error::ChildExited { status },
                    other => other,
                });
            }
            Err(_) => {
                let _ = child.kill().await;
                return Err(Error::StartTimeout(timeout));
            }
        };
        tracing::debug!(%addr, pid = ?child.id(), "processor child ready");
        Ok(Self {
            child,
            binary,
            db_path,
            addr,
            base_url: format!("http://{addr}"),
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The address the child listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The child's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The database file the child uses.
    pub fn db_path(&self) -> &Path {
        &self.db_path
    }

    /// A typed client for this child.
    pub fn client(&self) -> ProcessorClient {
        ProcessorClient::new(&self.base_url)
    }

    /// Kills the child with SIGKILL (no cleanup, like a crash) and reaps it.
    pub async fn kill(&mut self) -> Result<(), Error> {
        self.child.kill().await?;
        Ok(())
    }

    /// Kills the child, then starts the same binary on the same database
    /// and the same port, so clients holding the base URL keep working.
    pub async fn restart(&mut self) -> Result<(), Error> {
        self.kill().await?;
        *self = Self::spawn_on(
            &self.binary,
            &self.db_path,
            self.addr,
            DEFAULT_START_TIMEOUT,
        )
        .await?;
        Ok(())
    }
}

/// Reads stdout until the ready line, then keeps draining it on a task so
/// the child can never block on a full pipe.
async fn read_ready_line(stdout: ChildStdout) -> Result<SocketAddr, Error> {
    let mut lines = BufReader::new(stdout).lines();
    for _ in 0..MAX_PRELUDE_LINES {
        let Some(line) = lines.next_line().await? else {
            return Err(Error::ChildExited {
                status: "stdout closed".into(),
            });
        };
        let Some(url) = line.trim().strip_prefix(READY_LINE_PREFIX) else {
            continue;
        };
        let addr = url
            .strip_prefix("http://")
            .and_then(|a| a.parse::<SocketAddr>().ok())
            .ok_or_else(|| Error::BadReadyLine(line.clone()))?;
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        return Ok(addr);
    }
    Err(Error::BadReadyLine(format!(
        "no ready line in the first {MAX_PRELUDE_LINES} lines"
    )))
}
