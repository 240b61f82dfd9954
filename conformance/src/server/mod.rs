//! The server check: judges any HTTP API black-box against the contract's
//! server clauses, from a target manifest.

pub mod case;
pub mod cases;
pub mod demo;
pub mod dialect;
pub mod http;
pub mod keyform;
pub mod manifest;
pub mod model;
pub mod openapi;
pub mod probe;
pub mod proxy;
pub mod runner;
pub mod sign;
