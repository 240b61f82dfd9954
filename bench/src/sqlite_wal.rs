//! Counting SQLite commits from outside the server: commit frames in the
//! write-ahead log.
//!
//! SQLite has no statistics view, but in WAL mode every committed write
//! transaction appends frames to `DB-wal`, and the last frame of each
//! commit carries the database size in its header (other frames carry 0).
//! Frames of the current WAL generation carry the salts of the WAL header.
//! So the number of commit frames with the header's salts is the number of
//! commits since the WAL was last restarted.
//!
//! A checkpoint may restart the WAL (rewind it and change the salts) once
//! no reader uses it. [`WalWatch`] therefore holds a read transaction open
//! on the database while it counts, which keeps the WAL from being
//! rewound, and reports nothing when the salts changed anyway. Holding the
//! reader lets the WAL grow during the count, which slows a writer's
//! checkpoints: counting runs in its own pass, never in a timed cell.

use std::path::{Path, PathBuf};

use sqlx::Connection;

use crate::Result;

const WAL_HEADER: usize = 32;
const FRAME_HEADER: usize = 24;

/// What the WAL holds: its salts and how many commit frames carry them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalCount {
    /// Salt-1 and salt-2 of the WAL header (the generation).
    pub salts: (u32, u32),
    /// Commit frames of this generation.
    pub commits: u64,
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Parses WAL bytes (header and whole frames; a torn last frame is
/// ignored). `None` when it is not a WAL.
pub fn count_commits(wal: &[u8]) -> Option<WalCount> {
    let magic = be32(wal, 0)?;
    if magic & 0xFFFF_FFFE != 0x377F_0682 {
        return None;
    }
    let page = be32(wal, 8)? as usize;
    let salts = (be32(wal, 16)?, be32(wal, 20)?);
    let mut commits = 0;
    let mut at = WAL_HEADER;
    while at + FRAME_HEADER + page <= wal.len() {
        if (be32(wal, at + 8)?, be32(wal, at + 12)?) != salts {
            // The rest is an older generation the current one has not
            // overwritten yet.
            break;
        }
        if be32(wal, at + 4)? != 0 {
            commits += 1;
        }
        at += FRAME_HEADER + page;
    }
    Some(WalCount { salts, commits })
}

/// A read transaction held on a SQLite database, so its WAL is not
/// rewound while commits are counted.
pub struct WalWatch {
    conn: sqlx::SqliteConnection,
    wal: PathBuf,
}

impl std::fmt::Debug for WalWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalWatch").field("wal", &self.wal).finish()
    }
}

impl WalWatch {
    /// Opens `db` read-only and starts a read transaction on it.
    pub async fn start(db: &Path) -> Result<Self> {
        let opts = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(db)
            .read_only(true);
        let mut conn = sqlx::SqliteConnection::connect_with(&opts).await?;
        sqlx::query("BEGIN").execute(&mut conn).await?;
        // A read transaction takes its snapshot at its first read.
        sqlx::query("SELECT count(*) FROM sqlite_master")
            .execute(&mut conn)
            .await?;
        Ok(Self {
            conn,
            wal: PathBuf::from(format!("{}-wal", db.display())),
        })
    }

    /// The WAL's commit count now (`None` if there is no WAL file yet).
    pub fn count(&self) -> Option<WalCount> {
        count_commits(&std::fs::read(&self.wal).ok()?)
    }

    /// Ends the read transaction.
    pub async fn finish(mut self) {
        let _ = sqlx::query("ROLLBACK").execute(&mut self.conn).await;
        let _ = self.conn.close().await;
    }
}

/// Commits between two counts of one generation; `None` when the WAL was
/// restarted in between (the count would be wrong).
pub fn commits_between(before: Option<WalCount>, after: Option<WalCount>) -> Option<u64> {
    let (b, a) = (before?, after?);
    (b.salts == a.salts && a.commits >= b.commits).then(|| a.commits - b.commits)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real WAL written by SQLite itself: three write transactions (one
    /// of them multi-statement) are three commit frames.
    #[tokio::test]
    async fn counts_the_commits_sqlite_writes() {
        let dir = crate::child::TempDir::new("idem-bench-wal").expect("temp dir");
        let db = dir.path().join("t.db");
        let opts = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&db)
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
        let mut w = sqlx::SqliteConnection::connect_with(&opts)
            .await
            .expect("open");
        sqlx::query("CREATE TABLE t (x INTEGER)")
            .execute(&mut w)
            .await
            .expect("create");
        let watch = WalWatch::start(&db).await.expect("watch");
        let before = watch.count();
        for sql in [
            "INSERT INTO t VALUES (1)",
            "BEGIN; INSERT INTO t VALUES (2); INSERT INTO t VALUES (3); COMMIT",
            "UPDATE t SET x = x + 1",
        ] {
            sqlx::raw_sql(sql).execute(&mut w).await.expect("write");
        }
        // A read commits nothing.
        sqlx::query("SELECT * FROM t")
            .fetch_all(&mut w)
            .await
            .expect("read");
        let after = watch.count();
        assert_eq!(commits_between(before, after), Some(3));
        watch.finish().await;
        assert_eq!(count_commits(b"not a wal file at all, clearly"), None);
    }
}
