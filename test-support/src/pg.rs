//! A throwaway PostgreSQL cluster of its own, for tests that stop and start
//! the database under a running server (the shared one at
//! `IDEM_TEST_DATABASE_URL` must never be stopped).
//!
//! `initdb` refuses to run as root, so as root the cluster's directory is
//! given to the `postgres` user and every command runs through `runuser`.
//! The cluster listens on `127.0.0.1` on a free port, with its socket in
//! its own directory, and is stopped (`-m immediate`) and removed on drop.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::TempDir;

/// A PostgreSQL cluster in a temp directory, stopped and removed on drop.
#[derive(Debug)]
pub struct PgCluster {
    bin: PathBuf,
    dir: TempDir,
    port: u16,
    as_postgres: bool,
}

/// Where the PostgreSQL server binaries are: `IDEM_PG_BIN_DIR`, else the
/// newest `/usr/lib/postgresql/*/bin` with an `initdb`.
fn bin_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("IDEM_PG_BIN_DIR") {
        return Some(PathBuf::from(d));
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, b)| b)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

impl PgCluster {
    /// Creates and starts a cluster, or `None` (after a loud SKIPPED line
    /// naming `test`; a failure in CI, see [`crate::skip_without`]) when no
    /// PostgreSQL server binaries are installed.
    ///
    /// # Panics
    /// When the binaries exist but the cluster cannot be created or started:
    /// the test must fail, not pass silently.
    pub fn start(test: &str) -> Option<Self> {
        let Some(bin) = bin_dir() else {
            crate::skip_without(
                test,
                "no PostgreSQL server binaries (initdb, pg_ctl) under \
                 /usr/lib/postgresql/*/bin; set IDEM_PG_BIN_DIR",
            );
            return None;
        };
        // A short path: the socket path must stay under 107 bytes.
        let dir = TempDir::new("idem-pg");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("no free port: {e}"));
        let as_postgres = is_root();
        let cluster = Self {
            bin,
            dir,
            port,
            as_postgres,
        };
        if as_postgres {
            cluster.run_plain("chown", &["-R", "postgres:postgres", &cluster.dir_str()]);
        }
        let data = cluster.data();
        cluster.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
        );
        cluster.start_again();
        Some(cluster)
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A streaming standby of `primary`: `pg_basebackup -R -X stream` (the
    /// standby signal file and its `primary_conninfo` written for it) into
    /// a directory of its own, started on a free port.
    ///
    /// # Panics
    /// When the base backup or the start fails.
    pub fn standby_of(primary: &PgCluster) -> Self {
        let dir = TempDir::new("idem-pgs");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("no free port: {e}"));
        let standby = Self {
            bin: primary.bin.clone(),
            dir,
            port,
            as_postgres: primary.as_postgres,
        };
        if standby.as_postgres {
            standby.run_plain("chown", &["-R", "postgres:postgres", &standby.dir_str()]);
        }
        standby.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &primary.port.to_string(),
                "-U",
                "postgres",
                "-D",
                &standby.data(),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ],
        );
        standby.start_again();
        standby
    }

    /// Promotes a standby to primary (`pg_ctl promote -w`).
    ///
    /// # Panics
    /// When `pg_ctl promote` fails.
    pub fn promote(&self) {
        self.run("pg_ctl", &["-D", &self.data(), "-w", "promote"]);
    }

    /// Kills the postmaster with SIGKILL: no shutdown at all, its backends
    /// exit when they notice, nothing more is sent to a standby.
    ///
    /// # Panics
    /// When the postmaster's pid cannot be read.
    pub fn kill(&self) {
        let pid_file = std::fs::read_to_string(self.dir.join("data").join("postmaster.pid"))
            .unwrap_or_else(|e| panic!("postmaster.pid: {e}"));
        let pid = pid_file
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned();
        self.run_plain("kill", &["-KILL", &pid]);
    }

    /// The directory holding the cluster (data, log, socket).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Starts the (stopped) cluster and waits until it accepts connections.
    ///
    /// # Panics
    /// When `pg_ctl start` fails.
    pub fn start_again(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir_str()
        );
        let log = self.dir.join("log").display().to_string();
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-l", &log, "-w", "-o", &opts, "start"],
        );
    }

    /// Stops the cluster like a crash (`pg_ctl stop -m immediate`): every
    /// connection is cut, nothing is shut down cleanly.
    ///
    /// # Panics
    /// When `pg_ctl stop` fails.
    pub fn stop_immediate(&self) {
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    fn dir_str(&self) -> String {
        self.dir.path().display().to_string()
    }

    fn command(&self, program: &str, args: &[&str]) -> Command {
        let exe = self.bin.join(program);
        let mut c = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        };
        c.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    }

    fn run(&self, program: &str, args: &[&str]) {
        let out = self
            .command(program, args)
            .output()
            .unwrap_or_else(|e| panic!("running {program}: {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn run_plain(&self, program: &str, args: &[&str]) {
        let status = Command::new(program)
            .args(args)
            .status()
            .unwrap_or_else(|e| panic!("running {program}: {e}"));
        assert!(status.success(), "{program} {args:?} failed ({status})");
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self
            .command(
                "pg_ctl",
                &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
            )
            .output();
    }
}
