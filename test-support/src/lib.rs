//! # idem-test-support: what the workspace's test suites share
//!
//! Test-only code that used to be copied from suite to suite. It is a
//! dev-dependency of the crates that use it and never part of a
//! production build (a test on `cargo metadata` in `idem-server` checks
//! that).
//!
//! - [`mod@db`]: [`TestDb`], a throwaway SQLite file or PostgreSQL schema per
//!   test, removed on drop; [`db!`] skips a PostgreSQL test loudly when
//!   `IDEM_TEST_DATABASE_URL` is unset; [`both!`] runs one test body on both
//!   backends.
//! - [`mod@child`]: [`ChildServer`], a server binary started as a child process
//!   on `127.0.0.1:0` that announces `listening on http://ADDR` on its first
//!   stdout lines; killed on drop, restartable on the same port.
//! - [`cargo_bin`]: builds (or finds fresh) another package's binary from a
//!   test of a crate that cannot use `env!("CARGO_BIN_EXE_...")`.
//! - [`TempDir`]: a directory under the system temp dir, removed on drop.
//! - [`mod@pg`]: [`PgCluster`], a PostgreSQL cluster of a test's own, to
//!   stop and start under a running server; [`mod@mariadb`]: [`MariaDb`],
//!   the same for MariaDB (and to make read-only); [`mod@galera`]:
//!   [`Galera`], a multi-primary MariaDB cluster of several nodes.
//! - [`mod@prometheus`]: [`Prometheus`], a real Prometheus server of a
//!   test's own, and the HTTP API queries the suites make of it.
//! - [`Tmpfs`]: a small tmpfs mounted for one test (root only), to fill a
//!   filesystem for real.
//! - [`skip_without`]: what a test does when a component it needs is
//!   missing: a loud SKIPPED line on a developer's machine, a failure in CI
//!   ([`in_ci`]), where every component must be there.

pub mod child;
pub mod db;
pub mod galera;
pub mod mariadb;
pub mod pg;
pub mod prometheus;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, OnceLock};

pub use child::{ChildServer, READY_PREFIX, SpawnError};
pub use db::{Backend, MYSQL_URL_ENV, TestDb, mysql_url_with_database};
pub use galera::Galera;
pub use mariadb::MariaDb;
pub use pg::PgCluster;
pub use prometheus::Prometheus;

/// The variable `.ci/run` exports (`IDEM_CI=1`): with it, or with the
/// conventional `CI` of hosted runners, a test that cannot find a component
/// it needs fails rather than skips.
pub const CI_ENV: &str = "IDEM_CI";

/// Whether this is a CI run: [`CI_ENV`] or `CI` set to anything but empty,
/// `0` or `false`.
pub fn in_ci() -> bool {
    [CI_ENV, "CI"]
        .iter()
        .any(|name| std::env::var(name).is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false")))
}

/// Call where a test finds that `component` (a binary, a database, a
/// privilege) is missing, then return from the test. Outside CI it prints a
/// loud SKIPPED line naming `test`, so the skip is seen in the output; in
/// CI ([`in_ci`]) it fails the test, because there a skip would pass a
/// check that never ran.
///
/// # Panics
/// In CI, always.
#[track_caller]
pub fn skip_without(test: &str, component: &str) {
    assert!(
        !in_ci(),
        "{test} needs {component}, and this is CI ({CI_ENV} or CI is set): \
         failing instead of skipping"
    );
    eprintln!("\n*** SKIPPED {test}: {component} ***\n");
}

/// A fresh directory under the system temp dir, removed (with everything
/// in it) on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `{prefix}-{uuid}` under the system temp dir.
    ///
    /// # Panics
    /// When the directory cannot be created (a test cannot go on without it).
    pub fn new(prefix: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4().simple()));
        #[allow(clippy::unwrap_used)]
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A path inside the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tmpfs of a fixed size mounted on a fresh directory, unmounted (and the
/// directory removed) on drop. Mounting needs root.
#[derive(Debug)]
pub struct Tmpfs {
    dir: TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (e.g. `"4m"`), or `None` (after a loud
    /// SKIPPED line naming `test`, see [`skip_without`]) when this process
    /// is not root.
    ///
    /// # Panics
    /// When running as root and the mount fails, and in CI when not root.
    pub fn mount(size: &str, test: &str) -> Option<Self> {
        let root = std::process::Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
        if !root {
            skip_without(test, "mounting a tmpfs needs root");
            return None;
        }
        let dir = TempDir::new("idem-tmpfs");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status();
        assert!(
            status.as_ref().is_ok_and(|s| s.success()),
            "mount -t tmpfs failed: {status:?}"
        );
        Some(Self { dir })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A path inside the mount.
    pub fn join(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a file still open in the test process must not keep the
        // mount (and the test machine's memory) alive.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// The path of an up-to-date binary `bin` of workspace package `package`,
/// for tests of *other* crates (where `env!("CARGO_BIN_EXE_...")` is not
/// available).
///
/// Returns the path in environment variable `env_override` when it is set.
/// Otherwise it runs `cargo build -p PACKAGE --bin BIN` once per test process
/// (with `--release` when the test itself runs from a release `target/`) and
/// returns the executable cargo reports, so a stale binary is never used. It
/// blocks: call it through `tokio::task::spawn_blocking` from async tests.
/// Cargo releases its build lock before running tests, so this works under
/// `cargo test`.
pub fn cargo_bin(package: &str, bin: &str, env_override: &str) -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(env_override) {
        return Ok(PathBuf::from(path));
    }
    /// (package, bin) → what building it gave.
    type Built = BTreeMap<(String, String), Result<PathBuf, String>>;
    static BUILT: OnceLock<Mutex<Built>> = OnceLock::new();
    let built = BUILT.get_or_init(Default::default);
    let mut built = built
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    built
        .entry((package.to_owned(), bin.to_owned()))
        .or_insert_with(|| build(package, bin))
        .clone()
}

fn build(package: &str, bin: &str) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // This crate sits one level below the workspace root.
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("Cargo.toml");
    let release = std::env::current_exe()
        .ok()
        .is_some_and(|exe| exe.components().any(|c| c.as_os_str() == "release"));
    let mut command = std::process::Command::new(cargo);
    command
        .arg("build")
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["-p", package, "--bin", bin])
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
        return Err(format!(
            "cargo build -p {package} exited with {}",
            output.status
        ));
    }
    // Cargo prints one JSON object per line; the artifact line of the binary
    // carries its path in "executable".
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|msg| msg["reason"] == "compiler-artifact" && msg["target"]["name"] == bin)
        .find_map(|msg| msg["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| format!("cargo reported no {bin} executable"))
}
