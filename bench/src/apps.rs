//! The processes and databases of one store session: where its databases
//! live ([`Dbs`]), the three servers of the issue-13 scenarios
//! ([`Stack`]: fake processor, idem-server, baseline) and the minimal app
//! ([`start_minimal`]), all child processes on `127.0.0.1:0`, and the
//! binaries they run ([`bins`]).

use std::path::{Path, PathBuf};

use crate::Result;
use crate::child::{ChildServer, Spawn, cargo_bin};
use crate::config::Config;
use crate::pg::Cluster;

/// The binaries a run needs.
#[derive(Debug, Clone)]
pub struct Bins {
    /// idem-server (only built when a server scenario is selected).
    pub server: PathBuf,
    /// idem-fake-processor (likewise).
    pub processor: PathBuf,
    /// idem-bench (serve-baseline, serve-minimal).
    pub bench: PathBuf,
}

/// Builds (or finds fresh) the server and processor binaries, when the
/// selected scenarios use them (the minimal app is this binary).
pub fn bins(cfg: &Config) -> Result<Bins> {
    if !cfg.needs_servers() {
        return Ok(Bins {
            server: PathBuf::new(),
            processor: PathBuf::new(),
            bench: cfg.bench_bin.clone(),
        });
    }
    Ok(Bins {
        server: cargo_bin("idem-server", "idem-server", cfg.release, "IDEM_SERVER_BIN")?,
        processor: cargo_bin(
            "idem-fake-processor",
            "idem-fake-processor",
            cfg.release,
            "IDEM_PROCESSOR_BIN",
        )?,
        bench: cfg.bench_bin.clone(),
    })
}

/// Where a store session keeps its databases.
pub enum Dbs {
    /// Files in the session's temp dir.
    Sqlite {
        /// The directory.
        dir: PathBuf,
    },
    /// Databases in a throwaway cluster.
    Postgres {
        /// The cluster.
        cluster: Cluster,
    },
    /// Databases of their own on a shared server.
    MySql(crate::mysql::Server),
}

impl Dbs {
    /// A fresh database `name` (SQLite: the file's URL).
    pub async fn url(&self, name: &str) -> Result<String> {
        match self {
            Self::Sqlite { dir } => Ok(format!(
                "sqlite://{}",
                dir.join(format!("{name}.db")).display()
            )),
            Self::Postgres { cluster } => cluster.create_db(name).await,
            Self::MySql(server) => server.create_db(name).await,
        }
    }

    /// The throwaway cluster, on PostgreSQL.
    pub fn cluster(&self) -> Option<&Cluster> {
        match self {
            Self::Postgres { cluster } => Some(cluster),
            Self::Sqlite { .. } | Self::MySql(_) => None,
        }
    }
}

/// The callers' bearer tokens, as `[tokens]` TOML for `--tokens-file`.
pub fn tokens_toml(callers: usize) -> String {
    let mut s = String::from("[tokens]\n");
    for i in 0..callers {
        s.push_str(&format!("\"bench-token-{i}\" = \"c{i}\"\n"));
    }
    s
}

/// The flags that give idem-server and the baseline durable settings.
pub const DURABLE_FLAGS: &[&str] = &["--sqlite-synchronous", "full"];

/// The flags that give the minimal app durable settings.
pub const MINIMAL_DURABLE_FLAGS: &[&str] = &["--synchronous", "full"];

/// The three processes of the issue-13 scenarios.
pub struct Stack {
    /// The fake payment processor.
    pub processor: ChildServer,
    /// idem-server, pointed at the processor.
    pub server: ChildServer,
    /// The baseline server ([`crate::baseline`]).
    pub baseline: ChildServer,
}

impl Stack {
    /// Starts the processor, then idem-server on `idem_url` and the
    /// baseline on `base_url`, both with `extra` flags (`--sqlite-synchronous
    /// full`); `log` is a log filter whose sqlx statement lines are counted
    /// (the SQLite counting pass).
    pub async fn start(
        bins: &Bins,
        (dir, tokens): (&Path, &Path),
        (idem_url, base_url): (&str, &str),
        extra: &[&str],
        log: Option<&str>,
    ) -> Result<Self> {
        let processor_db = dir.join(format!(
            "processor-{}.db",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        let processor = Spawn::new(&bins.processor)
            .args(["--listen", "127.0.0.1:0", "--db"])
            .args([processor_db.display().to_string()])
            .start()
            .await?;
        let with_log = |s: Spawn| match log {
            Some(filter) => s.env("RUST_LOG", filter).count_stderr("sqlx::query"),
            None => s,
        };
        let server = with_log(
            Spawn::new(&bins.server)
                .args(server_flags(tokens, idem_url))
                .args(extra)
                .args(["--processor-url", &processor.base_url()]),
        )
        .start()
        .await?;
        let baseline = with_log(
            Spawn::new(&bins.bench)
                .args(["serve-baseline", "--"])
                .args(server_flags(tokens, base_url))
                .args(extra),
        )
        .start()
        .await?;
        Ok(Self {
            processor,
            server,
            baseline,
        })
    }

    /// Stops all three.
    pub async fn stop(self) {
        self.server.stop().await;
        self.baseline.stop().await;
        self.processor.stop().await;
    }
}

/// The flags idem-server and the baseline share.
fn server_flags(tokens: &Path, url: &str) -> Vec<String> {
    vec![
        "--listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--tokens-file".to_owned(),
        tokens.display().to_string(),
        "--database-url".to_owned(),
        url.to_owned(),
        // Receipt delivery (one more write transaction per payment, in
        // the background, 100 per second at most) would spill from the
        // payments cells into the next ones: off in the benchmark.
        "--enqueuer-interval-ms".to_owned(),
        "3600000".to_owned(),
    ]
}

/// How to start a minimal app.
#[derive(Debug, Clone, Copy)]
pub struct MinimalStart<'a> {
    /// Its database.
    pub url: &'a str,
    /// Its pool size.
    pub pool: u32,
    /// What its slow routes spend before their write, ms.
    pub sleep_ms: u64,
    /// More flags (`--stage-times`, `--synchronous full`).
    pub extra: &'a [&'a str],
    /// A log filter whose sqlx statement lines are counted.
    pub log: Option<&'a str>,
}

/// Starts the minimal app ([`crate::minimal`]).
pub async fn start_minimal(bin: &Path, m: MinimalStart<'_>) -> Result<ChildServer> {
    let s = Spawn::new(bin)
        .args(["serve-minimal", "--", "--database-url", m.url])
        .args(["--max-connections", &m.pool.to_string()])
        .args(["--sleep-ms", &m.sleep_ms.to_string()])
        .args(m.extra);
    let s = match m.log {
        Some(filter) => s.env("RUST_LOG", filter).count_stderr("sqlx::query"),
        None => s,
    };
    s.start().await
}
