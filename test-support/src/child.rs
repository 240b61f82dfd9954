//! Server binaries as child processes: started on `127.0.0.1:0`, found by
//! the `listening on http://ADDR` line they print, killed like a crash.
//!
//! Every server in this workspace (`idem-server`, `idem-fake-processor`)
//! announces its address as one stdout line starting with
//! [`READY_PREFIX`], so one spawner serves them all. Stdout is drained on a
//! task after that line, so a chatty child can never block on a full pipe;
//! stderr is either discarded or captured for the test to read.

use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

/// The start of the line a server prints once it accepts connections.
pub const READY_PREFIX: &str = "listening on ";

/// How long [`Spawn::start`] waits for the ready line by default.
/// Generous, because CI machines share few cores between many builds.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(60);

/// Most stdout lines read while looking for the ready line.
const MAX_PRELUDE_LINES: usize = 64;

/// Why a child server could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpawnError {
    /// The OS refused to run the program.
    #[error("could not start {program:?}: {source}")]
    Spawn {
        /// The program that was run.
        program: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The child exited (or closed stdout) before it was ready.
    #[error("the child exited before it was ready ({status})")]
    Exited {
        /// The exit status, or a note when it could not be read.
        status: String,
    },
    /// No ready line in time.
    #[error("the child did not print its ready line within {0:?}")]
    Timeout(Duration),
    /// A ready line that holds no `http://ADDR`.
    #[error("unreadable ready line: {0:?}")]
    BadReadyLine(String),
    /// Reading the child's stdout failed.
    #[error("reading the child's stdout: {0}")]
    Io(#[from] std::io::Error),
}

/// How to start a child server: program, arguments, environment.
#[derive(Debug, Clone)]
pub struct Spawn {
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    capture_stderr: bool,
    timeout: Duration,
}

impl Spawn {
    /// Adds one argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets an environment variable of the child.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Keeps the child's stderr for [`ChildServer::stderr`] (discarded
    /// otherwise).
    pub fn capture_stderr(mut self) -> Self {
        self.capture_stderr = true;
        self
    }

    /// How long to wait for the ready line ([`DEFAULT_START_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Starts the child and waits (bounded) for its ready line. The child is
    /// killed if it does not print one.
    pub async fn start(self) -> Result<ChildServer, SpawnError> {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(if self.capture_stderr {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .kill_on_drop(true);
        if !self.env.iter().any(|(k, _)| k == "RUST_LOG") {
            command.env("RUST_LOG", "warn");
        }
        command.envs(self.env.iter().map(|(k, v)| (k, v)));
        let mut child = command.spawn().map_err(|source| SpawnError::Spawn {
            program: self.program.clone(),
            source,
        })?;
        let stderr = Arc::new(Mutex::new(String::new()));
        if let Some(mut err) = child.stderr.take() {
            let sink = stderr.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = err.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    sink.lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
        }
        let Some(stdout) = child.stdout.take() else {
            return Err(SpawnError::Exited {
                status: "stdout was not captured".into(),
            });
        };
        match tokio::time::timeout(self.timeout, read_ready_line(stdout)).await {
            Ok(Ok(addr)) => Ok(ChildServer {
                child,
                spawn: self,
                addr,
                base_url: format!("http://{addr}"),
                stderr,
            }),
            Ok(Err(e)) => {
                let _ = child.start_kill();
                let status = match tokio::time::timeout(Duration::from_secs(5), child.wait()).await
                {
                    Ok(Ok(s)) => s.to_string(),
                    _ => "unknown".into(),
                };
                Err(match e {
                    SpawnError::Exited { .. } => SpawnError::Exited { status },
                    other => other,
                })
            }
            Err(_) => {
                let _ = child.kill().await;
                Err(SpawnError::Timeout(self.timeout))
            }
        }
    }
}

/// A running child server. Dropping it kills the child, so a failing test
/// leaves no process behind.
#[derive(Debug)]
pub struct ChildServer {
    child: Child,
    spawn: Spawn,
    addr: SocketAddr,
    base_url: String,
    stderr: Arc<Mutex<String>>,
}

impl ChildServer {
    /// A child running `program`; add arguments, then [`Spawn::start`].
    /// The caller passes `--listen 127.0.0.1:0` (or whatever the program
    /// takes) among the arguments.
    pub fn command(program: impl AsRef<Path>) -> Spawn {
        Spawn {
            program: program.as_ref().to_path_buf(),
            args: Vec::new(),
            env: Vec::new(),
            capture_stderr: false,
            timeout: DEFAULT_START_TIMEOUT,
        }
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

    /// What the child wrote to stderr so far (with
    /// [`Spawn::capture_stderr`]).
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The child's stderr once it contains `needle`, or as it is when
    /// `within` runs out (the log is read by a task of its own, a little
    /// after the child writes it).
    pub async fn stderr_containing(&self, needle: &str, within: Duration) -> String {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let log = self.stderr();
            if log.contains(needle) || tokio::time::Instant::now() >= deadline {
                return log;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills the child with SIGKILL (no cleanup, like a crash) and reaps it.
    pub async fn kill(&mut self) -> std::io::Result<()> {
        self.child.kill().await
    }

    /// Waits at most `timeout` for the child to exit by itself (e.g. after
    /// an abort it was told to perform); `None` if it is still running.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(timeout, self.child.wait())
            .await
            .ok()?
            .ok()
    }

    /// Kills the child, then starts the same command again with its
    /// `--listen` argument set to the address it had, so clients holding the
    /// base URL keep working.
    pub async fn restart(&mut self) -> Result<(), SpawnError> {
        let _ = self.kill().await;
        let mut spawn = self.spawn.clone();
        let addr = self.addr.to_string();
        let mut args = Vec::with_capacity(spawn.args.len());
        let mut it = std::mem::take(&mut spawn.args).into_iter();
        while let Some(a) = it.next() {
            if a == "--listen" {
                it.next();
                continue;
            }
            args.push(a);
        }
        args.extend([OsString::from("--listen"), OsString::from(addr)]);
        spawn.args = args;
        *self = spawn.start().await?;
        Ok(())
    }
}

/// Reads stdout until the ready line, then keeps draining it on a task.
async fn read_ready_line(stdout: tokio::process::ChildStdout) -> Result<SocketAddr, SpawnError> {
    let mut lines = BufReader::new(stdout).lines();
    for _ in 0..MAX_PRELUDE_LINES {
        let Some(line) = lines.next_line().await? else {
            return Err(SpawnError::Exited {
                status: "stdout closed".into(),
            });
        };
        let Some(url) = line.trim().strip_prefix(READY_PREFIX) else {
            continue;
        };
        let addr = url
            .strip_prefix("http://")
            .and_then(|a| a.parse::<SocketAddr>().ok())
            .ok_or_else(|| SpawnError::BadReadyLine(line.clone()))?;
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        return Ok(addr);
    }
    Err(SpawnError::BadReadyLine(format!(
        "no ready line in the first {MAX_PRELUDE_LINES} lines"
    )))
}
