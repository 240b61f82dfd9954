//! Placeholder for the reference-server crate; filled by its issue.
