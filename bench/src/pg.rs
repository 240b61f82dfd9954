//! A throwaway PostgreSQL cluster for the benchmark, and the counters read
//! from it.
//!
//! Its own cluster (initdb + pg_ctl, as in `/work/shared/BUILD-NOTES.md`)
//! rather than a database in the machine's shared server, for two reasons:
//! it can load `pg_stat_statements` (which needs `shared_preload_libraries`,
//! a restart of the shared server), and every process of it is ours, so
//! the database's CPU per request is the CPU of its process tree. Its
//! settings are PostgreSQL's defaults (`fsync` and `synchronous_commit`
//! on), like the shared server's. It is stopped and removed on drop.
//!
//! Counters, all read synchronously (`pg_stat_database` is flushed by
//! backends up to seconds late, so it is not used):
//! - statements: `sum(calls)` of `pg_stat_statements` for the database
//!   (utility statements such as BEGIN and COMMIT included);
//! - commits: write transactions, the advance of the next transaction id
//!   (`pg_snapshot_xmax(pg_current_snapshot())`): a transaction gets an id
//!   at its first write, so read-only statements outside a transaction
//!   (the layer's lookup, a replay) are not commits here, and every write
//!   transaction is one WAL flush;
//! - WAL bytes: the advance of `pg_current_wal_lsn()`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::Serialize;
use sqlx::Connection;

use crate::child::TempDir;
use crate::{Error, Result};

/// A running throwaway cluster.
#[derive(Debug)]
pub struct Cluster {
    dir: TempDir,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
    /// The postmaster's pid (root of the process tree whose CPU we read).
    pub postmaster: u32,
}

/// The counters at one moment, for one database.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PgCounters {
    /// `sum(calls)` in `pg_stat_statements` for the database.
    pub statements: u64,
    /// `calls` of `COMMIT` statements.
    pub commit_statements: u64,
    /// The next transaction id (cluster-wide).
    pub next_xid: u64,
    /// `pg_current_wal_lsn()` in bytes.
    pub wal_bytes: u64,
}

fn find_bin() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("initdb"))
            .find(|p| p.is_file())
    });
    if let Some(p) = on_path {
        return p
            .canonicalize()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf));
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("initdb").is_file())
        .collect();
    versions.sort();
    versions.pop()
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| Error::Setup(e.to_string()))?;
    Ok(l.local_addr()
        .map_err(|e| Error::Setup(e.to_string()))?
        .port())
}

impl Cluster {
    /// initdb + start, with `pg_stat_statements` loaded. As root it runs
    /// PostgreSQL's tools as the `postgres` user (initdb refuses root).
    pub async fn start() -> Result<Self> {
        let bin = find_bin()
            .ok_or_else(|| Error::Setup("no initdb found (PATH, /usr/lib/postgresql)".into()))?;
        let dir = TempDir::new("idb")?;
        let as_postgres = rustix::process::geteuid().is_root();
        if as_postgres {
            run(std::process::Command::new("chown")
                .arg("postgres")
                .arg(dir.path()))?;
        }
        let data = dir.path().join("data");
        let port = free_port()?;
        let mut cluster = Self {
            dir,
            bin,
            port,
            as_postgres,
            postmaster: 0,
        };
        run(cluster.tool("initdb").arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        ]))?;
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 \
             -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=top",
            cluster.dir.path().display()
        );
        run(cluster
            .tool("pg_ctl")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(cluster.dir.path().join("log"))
            .args(["-w", "-o", &opts, "start"]))?;
        let pid = std::fs::read_to_string(data.join("postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next().and_then(|l| l.trim().parse().ok()))
            .ok_or_else(|| Error::Setup("no postmaster.pid".into()))?;
        cluster.postmaster = pid;
        let mut c = cluster.connect("postgres").await?;
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(&mut c)
            .await?;
        c.close().await.ok();
        Ok(cluster)
    }

    fn tool(&self, name: &str) -> std::process::Command {
        let path = self.bin.join(name);
        if self.as_postgres {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            std::process::Command::new(path)
        }
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    async fn connect(&self, db: &str) -> Result<sqlx::PgConnection> {
        Ok(sqlx::PgConnection::connect(&self.url(db)).await?)
    }

    /// The settings that decide what a commit waits for, as one line of
    /// the report (`fsync`, `synchronous_commit`, `wal_sync_method`,
    /// `full_page_writes`), read from the running cluster.
    pub async fn durability(&self) -> Result<String> {
        let mut c = self.connect("postgres").await?;
        let mut parts = Vec::new();
        for name in [
            "fsync",
            "synchronous_commit",
            "wal_sync_method",
            "full_page_writes",
        ] {
            let v: String = sqlx::query_scalar(&format!("SHOW {name}"))
                .fetch_one(&mut c)
                .await?;
            parts.push(format!("{name} = {v}"));
        }
        c.close().await.ok();
        Ok(parts.join(", "))
    }

    /// Creates database `name` and returns its URL.
    pub async fn create_db(&self, name: &str) -> Result<String> {
        let mut c = self.connect("postgres").await?;
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut c)
            .await?;
        c.close().await.ok();
        Ok(self.url(name))
    }

    /// The counters of database `db` now (read from the `postgres`
    /// database, so these reads are not counted themselves).
    pub async fn counters(&self, db: &str) -> Result<PgCounters> {
        let mut c = self.connect("postgres").await?;
        let (statements, commit_statements): (i64, i64) = sqlx::query_as(
            "SELECT COALESCE(sum(calls), 0)::bigint, \
                    COALESCE(sum(calls) FILTER (WHERE upper(query) = 'COMMIT'), 0)::bigint \
             FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
             WHERE d.datname = $1",
        )
        .bind(db)
        .fetch_one(&mut c)
        .await?;
        let (next_xid, wal): (i64, i64) = sqlx::query_as(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint, \
                    pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint",
        )
        .fetch_one(&mut c)
        .await?;
        c.close().await.ok();
        let u = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok(PgCounters {
            statements: u(statements),
            commit_statements: u(commit_statements),
            next_xid: u(next_xid),
            wal_bytes: u(wal),
        })
    }
}

/// One statement's totals in `pg_stat_statements`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StatementTotals {
    /// The normalized text.
    pub query: String,
    /// Times run.
    pub calls: u64,
    /// Time spent executing it, ms.
    pub exec_ms: f64,
}

impl Cluster {
    /// Every statement of database `db` with its calls and execution time,
    /// by query id.
    pub async fn statements(&self, db: &str) -> Result<BTreeMap<i64, StatementTotals>> {
        let mut c = self.connect("postgres").await?;
        let rows: Vec<(i64, String, i64, f64)> = sqlx::query_as(
            "SELECT s.queryid, s.query, s.calls, s.total_exec_time \
             FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
             WHERE d.datname = $1 AND s.queryid IS NOT NULL",
        )
        .bind(db)
        .fetch_all(&mut c)
        .await?;
        c.close().await.ok();
        Ok(rows
            .into_iter()
            .map(|(id, query, calls, exec_ms)| {
                (
                    id,
                    StatementTotals {
                        query,
                        calls: u64::try_from(calls).unwrap_or(0),
                        exec_ms,
                    },
                )
            })
            .collect())
    }
}

/// What ran between two [`Cluster::statements`] snapshots, most calls first.
pub fn statements_between(
    before: &BTreeMap<i64, StatementTotals>,
    after: &BTreeMap<i64, StatementTotals>,
) -> Vec<StatementTotals> {
    let mut out: Vec<StatementTotals> = after
        .iter()
        .filter_map(|(id, a)| {
            let (calls, ms) = match before.get(id) {
                Some(b) => (a.calls.saturating_sub(b.calls), a.exec_ms - b.exec_ms),
                None => (a.calls, a.exec_ms),
            };
            (calls > 0).then(|| StatementTotals {
                query: a.query.clone(),
                calls,
                exec_ms: ms.max(0.0),
            })
        })
        .collect();
    out.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.query.cmp(&b.query)));
    out
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let data = self.dir.path().join("data");
        let _ = self
            .tool("pg_ctl")
            .arg("-D")
            .arg(&data)
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn run(cmd: &mut std::process::Command) -> Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Setup(format!("{cmd:?}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Setup(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}
