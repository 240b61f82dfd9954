//! Placeholder for the conformance crate; filled by its issue.
