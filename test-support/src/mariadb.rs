//! A throwaway MariaDB server of its own, for tests that stop and start the
//! database under a running server, or make it read-only (the shared one at
//! `IDEM_TEST_MYSQL_URL` must never be touched that way).
//!
//! `mariadb-install-db` into a temp directory, `mariadbd` on a free
//! loopback port with its own socket, stopped like a crash (SIGKILL) and
//! removed on drop. The application connects as `app`, a user without
//! SUPER (so `SET GLOBAL read_only = 1` applies to it); the test
//! administers as `root`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::TempDir;

/// A MariaDB server in a temp directory, killed and removed on drop.
#[derive(Debug)]
pub struct MariaDb {
    dir: TempDir,
    port: u16,
    child: Mutex<Option<Child>>,
}

fn which(program: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"]
        .iter()
        .map(|d| PathBuf::from(d).join(program))
        .find(|p| p.exists())
}

impl MariaDb {
    /// Installs and starts a server, or `None` (after a loud SKIPPED line
    /// naming `test`; a failure in CI, see [`crate::skip_without`]) when
    /// `mariadbd` or `mariadb-install-db` is not installed.
    ///
    /// # Panics
    /// When the binaries exist but the server cannot be installed or started.
    pub fn start(test: &str) -> Option<Self> {
        let (Some(_), Some(install)) = (which("mariadbd"), which("mariadb-install-db")) else {
            crate::skip_without(
                test,
                "no mariadbd / mariadb-install-db (Debian mariadb-server)",
            );
            return None;
        };
        let dir = TempDir::new("idem-my");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("no free port: {e}"));
        let out = Command::new(install)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .args([
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--user=root",
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("mariadb-install-db: {e}"));
        assert!(
            out.status.success(),
            "mariadb-install-db failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let db = Self {
            dir,
            port,
            child: Mutex::new(None),
        };
        db.start_again();
        db.root_sql(
            "CREATE DATABASE IF NOT EXISTS test; CREATE USER IF NOT EXISTS 'app'@'%'; \
             GRANT ALL ON test.* TO 'app'@'%'; CREATE USER IF NOT EXISTS 'app'@'localhost'; \
             GRANT ALL ON test.* TO 'app'@'localhost'",
        );
        Some(db)
    }

    /// `mysql://app@127.0.0.1:PORT/test`: what the application connects to.
    pub fn url(&self) -> String {
        format!("mysql://app@127.0.0.1:{}/test", self.port)
    }

    /// Starts the (stopped) server on the same port and data directory and
    /// waits (at most 30 s) until it answers.
    ///
    /// # Panics
    /// When it does not start.
    pub fn start_again(&self) {
        let child = Command::new(which("mariadbd").unwrap_or_else(|| PathBuf::from("mariadbd")))
            .arg("--no-defaults")
            .arg(format!("--datadir={}", self.dir.join("data").display()))
            .arg(format!("--socket={}", self.dir.join("s").display()))
            .arg(format!("--pid-file={}", self.dir.join("pid").display()))
            .arg(format!(
                "--log-error={}",
                self.dir.join("err.log").display()
            ))
            .arg(format!("--port={}", self.port))
            .args([
                "--bind-address=127.0.0.1",
                "--user=root",
                "--innodb-buffer-pool-size=32M",
                "--innodb-log-file-size=16M",
                "--skip-log-bin",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("mariadbd: {e}"));
        *self
            .child
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.answers() {
            assert!(
                Instant::now() < deadline,
                "mariadbd did not answer within 30 s: {}",
                std::fs::read_to_string(self.dir.join("err.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills the server like a crash (SIGKILL): every connection is cut.
    pub fn stop_immediate(&self) {
        if let Some(mut child) = self
            .child
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn answers(&self) -> bool {
        Command::new("mysqladmin")
            .args([
                "-h",
                "127.0.0.1",
                "-P",
                &self.port.to_string(),
                "-u",
                "root",
            ])
            .args(["--connect-timeout=1", "ping"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Runs `statements` as root.
    ///
    /// # Panics
    /// When the client fails.
    pub fn root_sql(&self, statements: &str) {
        let out = Command::new("mysql")
            .args([
                "-h",
                "127.0.0.1",
                "-P",
                &self.port.to_string(),
                "-u",
                "root",
            ])
            .args(["-e", statements])
            .output()
            .unwrap_or_else(|e| panic!("mysql client: {e}"));
        assert!(
            out.status.success(),
            "mysql -e {statements:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        self.stop_immediate();
    }
}
