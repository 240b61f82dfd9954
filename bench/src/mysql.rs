//! The MySQL / MariaDB server the benchmark runs its MySQL store on: the
//! one at `IDEM_BENCH_MYSQL_URL` (default the machine's,
//! `mysql://root@127.0.0.1:3306/test`), with a database of its own per
//! session, dropped at the end.
//!
//! Unlike PostgreSQL's throwaway cluster, this server is shared, so its CPU
//! and counters are not the session's alone: the MySQL rows report
//! throughput and latency, and leave statements, commits and database CPU
//! per request empty rather than print another process's work as ours.

use sqlx::Connection;

use crate::{Error, Result};

/// The environment variable naming the server.
pub const URL_ENV: &str = "IDEM_BENCH_MYSQL_URL";

/// The server when [`URL_ENV`] is unset: the machine's.
pub const DEFAULT_URL: &str = "mysql://root@127.0.0.1:3306/test";

/// A reachable server and the databases this session made on it.
#[derive(Debug)]
pub struct Server {
    admin_url: String,
    made: std::sync::Mutex<Vec<String>>,
    run: String,
}

impl Server {
    /// Connects once to check the server answers (a setup error, which
    /// skips the store, when it does not).
    pub async fn connect(admin_url: &str) -> Result<Self> {
        let admin_url = admin_url.to_owned();
        let c = sqlx::MySqlConnection::connect(&admin_url)
            .await
            .map_err(|e| Error::Setup(format!("MySQL at {admin_url}: {e}")))?;
        c.close().await.ok();
        Ok(Self {
            admin_url,
            made: std::sync::Mutex::default(),
            run: uuid::Uuid::new_v4().simple().to_string()[..8].to_owned(),
        })
    }

    /// The settings that decide what a commit waits for, as one line of
    /// the report, read from the (shared) server.
    pub async fn durability(&self) -> Result<String> {
        let mut c = sqlx::MySqlConnection::connect(&self.admin_url).await?;
        let (flush, binlog): (i64, i64) = sqlx::query_as(
            "SELECT CAST(@@innodb_flush_log_at_trx_commit AS SIGNED), CAST(@@sync_binlog AS SIGNED)",
        )
        .fetch_one(&mut c)
        .await?;
        c.close().await.ok();
        Ok(format!(
            "innodb_flush_log_at_trx_commit = {flush}, sync_binlog = {binlog} (the shared server's)"
        ))
    }

    /// Creates database `name` (made unique for this session) and returns
    /// its URL.
    pub async fn create_db(&self, name: &str) -> Result<String> {
        let db = format!("{name}_{}", self.run);
        let mut c = sqlx::MySqlConnection::connect(&self.admin_url).await?;
        sqlx::query(&format!("CREATE DATABASE {db}"))
            .execute(&mut c)
            .await?;
        c.close().await.ok();
        self.made
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(db.clone());
        let (base, query) = match self.admin_url.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (self.admin_url.as_str(), None),
        };
        let authority = base.find("://").map_or(0, |i| i + 3);
        let root = match base[authority..].find('/') {
            Some(i) => &base[..authority + i],
            None => base,
        };
        Ok(match query {
            Some(q) => format!("{root}/{db}?{q}"),
            None => format!("{root}/{db}"),
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let made = std::mem::take(
            &mut *self
                .made
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let url = self.admin_url.clone();
        // Drop runs inside the runtime: a thread with its own, waited for.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                if let Ok(mut c) = sqlx::MySqlConnection::connect(&url).await {
                    for db in made {
                        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {db}"))
                            .execute(&mut c)
                            .await;
                    }
                    let _ = c.close().await;
                }
            });
        })
        .join();
    }
}
