//! Throwaway databases on both backends.
//!
//! A SQLite test gets its own file under the temp dir; a PostgreSQL test
//! gets its own schema in the database named by `IDEM_TEST_DATABASE_URL`
//! (selected with `search_path` in the URL it hands out), so tests run in
//! parallel without seeing each other's rows. Both are removed on drop.

use sqlx::Connection;

/// The environment variable naming the PostgreSQL database tests use.
pub const DATABASE_URL_ENV: &str = "IDEM_TEST_DATABASE_URL";

/// Which store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A fresh SQLite file.
    Sqlite,
    /// A fresh schema in `IDEM_TEST_DATABASE_URL`.
    Postgres,
}

/// A database that exists for one test and is removed afterwards.
#[derive(Debug)]
pub struct TestDb {
    /// The URL to connect to (`sqlite://...` or `postgres://...?options=...`).
    pub url: String,
    cleanup: Cleanup,
}

#[derive(Debug)]
enum Cleanup {
    Files(Vec<std::path::PathBuf>),
    Schema { admin_url: String, schema: String },
}

impl TestDb {
    /// A fresh database, or `None` (after a loud SKIPPED line) when the
    /// backend is PostgreSQL and `IDEM_TEST_DATABASE_URL` is unset. CI sets
    /// it; a CI run without it fails ([`crate::skip_without`]).
    ///
    /// # Panics
    /// When PostgreSQL is configured but unreachable: a test must fail, not
    /// pass silently, when its database is broken.
    pub async fn new(backend: Backend, test: &str) -> Option<Self> {
        match backend {
            Backend::Sqlite => {
                let path = std::env::temp_dir().join(format!(
                    "idem-test-{}-{}.db",
                    test.replace(['/', ' '], "-"),
                    uuid::Uuid::new_v4().simple()
                ));
                let files = ["", "-wal", "-shm"]
                    .iter()
                    .map(|s| std::path::PathBuf::from(format!("{}{s}", path.display())))
                    .collect();
                Some(Self {
                    url: format!("sqlite://{}", path.display()),
                    cleanup: Cleanup::Files(files),
                })
            }
            Backend::Postgres => {
                let Ok(admin_url) = std::env::var(DATABASE_URL_ENV) else {
                    crate::skip_without(
                        &format!("{test} on PostgreSQL"),
                        &format!("{DATABASE_URL_ENV} is not set"),
                    );
                    return None;
                };
                let schema = format!("idem_t_{}", uuid::Uuid::new_v4().simple());
                #[allow(clippy::unwrap_used)]
                let mut conn = sqlx::PgConnection::connect(&admin_url).await.unwrap();
                #[allow(clippy::unwrap_used)]
                sqlx::query(&format!("CREATE SCHEMA {schema}"))
                    .execute(&mut conn)
                    .await
                    .unwrap();
                conn.close().await.ok();
                let sep = if admin_url.contains('?') { '&' } else { '?' };
                Some(Self {
                    url: format!("{admin_url}{sep}options=-c%20search_path%3D{schema}"),
                    cleanup: Cleanup::Schema { admin_url, schema },
                })
            }
        }
    }

    /// The SQLite file, for SQLite databases.
    pub fn sqlite_path(&self) -> Option<&std::path::Path> {
        match &self.cleanup {
            Cleanup::Files(files) => files.first().map(std::path::PathBuf::as_path),
            Cleanup::Schema { .. } => None,
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        match &self.cleanup {
            Cleanup::Files(files) => {
                for f in files {
                    let _ = std::fs::remove_file(f);
                }
            }
            Cleanup::Schema { admin_url, schema } => {
                let (url, schema) = (admin_url.clone(), schema.clone());
                // Drop runs inside a runtime; do the async cleanup on a thread
                // with its own runtime, and wait for it.
                let _ = std::thread::spawn(move || {
                    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    else {
                        return;
                    };
                    rt.block_on(async {
                        if let Ok(mut c) = sqlx::PgConnection::connect(&url).await {
                            let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                                .execute(&mut c)
                                .await;
                            let _ = c.close().await;
                        }
                    });
                })
                .join();
            }
        }
    }
}

/// `db!(backend, "name")`: a fresh [`TestDb`], or `return` from the test
/// (after the loud SKIPPED line) when PostgreSQL is not configured.
#[macro_export]
macro_rules! db {
    ($b:expr, $name:expr) => {
        match $crate::TestDb::new($b, $name).await {
            Some(db) => db,
            None => return,
        }
    };
}

/// `both!(name)`: declares the async test body `name(Backend)` twice, as
/// `name::sqlite` and `name::postgres` (multi-threaded runtimes, so
/// concurrency tests really run in parallel).
#[macro_export]
macro_rules! both {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name($crate::Backend::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name($crate::Backend::Postgres).await
            }
        }
    };
}
