//! Placeholder for the client crate; filled by its issue.
