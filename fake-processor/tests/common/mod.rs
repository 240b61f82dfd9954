//! Shared test helpers: a throwaway database directory and a sample charge.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use idem_fake_processor::ChargeRequest;
use idem_spec::IdempotencyKey;

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `idem-fake-processor-<uuid>`.
    pub fn new() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "idem-fake-processor-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        Self(dir)
    }

    /// The database file inside the directory.
    pub fn db(&self) -> PathBuf {
        self.0.join("processor.db")
    }

    /// The directory itself.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A valid key.
pub fn key(s: &str) -> IdempotencyKey {
    IdempotencyKey::parse(s).expect("valid key")
}

/// A valid charge request for `amount` cents.
pub fn charge(amount: i64) -> ChargeRequest {
    ChargeRequest {
        amount,
        currency: "eur".into(),
        source: Some("tok_visa".into()),
        description: Some("order 42".into()),
    }
}
