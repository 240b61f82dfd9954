//! The target's declared dialect: how its answers are read (error codes,
//! the replay marker, resource ids). The pure judges ([`crate::server::model::judge`],
//! [`crate::server::cases::concurrency::classify`]) take this and nothing
//! else of a run, so they see only what they judge.

use idem_spec::manifest::{EffectProbe, Manifest};
use serde_json::Value;

use crate::server::http::Response;
use crate::server::manifest::ManifestExt;

/// A read-only view of the manifest's dialect.
#[derive(Debug, Clone, Copy)]
pub struct Dialect<'a>(pub &'a Manifest);

impl Dialect<'_> {
    /// `: ids X (this answer) and X (the other caller's)`, when both
    /// answers carry an id (the resource-id probe's pointer, else `/id`,
    /// else `Location`).
    pub fn ids_side_by_side(&self, mine: &Response, theirs: &Response) -> String {
        self.ids_beside(mine, theirs, "the other caller's")
    }

    /// `; resource ids: X (this answer) and Y (label)`, when both carry one.
    pub fn ids_beside(&self, mine: &Response, theirs: &Response, label: &str) -> String {
        match (self.resource_id(mine), self.resource_id(theirs)) {
            (Some(a), Some(b)) => format!("; resource ids: {a} (this answer) and {b} ({label})"),
            _ => String::new(),
        }
    }

    /// The resource id a 2xx answer names, for reports.
    pub fn resource_id(&self, r: &Response) -> Option<String> {
        let pointer = match &self.0.probe {
            EffectProbe::ResourceId { id_pointer } => id_pointer.as_str(),
            _ => "/id",
        };
        r.json()
            .and_then(|d| {
                d.pointer(pointer).map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
            })
            .or_else(|| r.header("location").map(str::to_owned))
    }

    /// Whether `r` is the contract error `code` as the target declares it.
    pub fn is(&self, r: &Response, code: idem_spec::ErrorCode) -> bool {
        self.0.matches(r, code)
    }

    /// `code` as the target declares it, for reports.
    pub fn spelled(&self, code: idem_spec::ErrorCode) -> String {
        self.0.spelled(code)
    }

    /// Whether `r` is a first execution by the target's own account: a 2xx
    /// without the declared replay marker and, when the stored outcome is
    /// known, not byte-identical to it (a replay without a marker).
    pub fn executed(&self, r: &Response, stored: Option<&Response>) -> bool {
        (200..300).contains(&r.status)
            && self.0.marked(r) != Some(true)
            && !stored.is_some_and(|s| s.same_outcome(r))
    }

    /// Whether `r` carries the declared replay marker (`None`: the target
    /// declares none).
    pub fn marked(&self, r: &Response) -> Option<bool> {
        self.0.marked(r)
    }
}
