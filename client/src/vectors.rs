//! vectors
