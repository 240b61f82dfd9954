//! The client's decision table: what arrived (a transport failure, or a status with its problem
//! `code` and `retryable` member and its `Retry-After`) and what the default policy does with
//! it, for a request with a key, an idempotent request without one, and a POST without one.
//!
//! The rows are built from the same sources the client decides from: every contract error code
//! under every profile (`idem_spec::ErrorCode` and `Profile`: status, wire code, `retryable`),
//! and the action in each cell is [`RetryPolicy::decide`]'s answer on a first attempt with a
//! full budget and the default 30 s deadline. The table is committed as
//! `book/src/tables/client-decisions.md` (regenerate with
//! `cargo run -p idem-client --bin idem-client-vectors`); a test reads it back and checks every
//! row against the policy, and another that it is current.

use std::fmt::Write as _;
use std::time::Duration;

use idem_spec::{ErrorCode, Profile};

use crate::budget::{RetryBudget, RetryClass};
use crate::policy::{Decision, Outcome, RequestFacts, RetryPolicy, RetryState, StopReason};

/// Where the committed table lives, relative to the workspace root.
pub const DECISIONS_TABLE_PATH: &str = "book/src/tables/client-decisions.md";

/// A `Retry-After` the deadline leaves room for (the default deadline is 30 s).
pub const HINT_BEFORE_DEADLINE: Duration = Duration::from_secs(2);
/// A `Retry-After` past the default deadline.
pub const HINT_PAST_DEADLINE: Duration = Duration::from_secs(60);

/// The three kinds of request whose actions the table shows, in column order.
pub const REQUESTS: [(&str, bool); 3] = [("POST", true), ("GET", false), ("POST", false)];

/// What a caller gets for one decision, as the table spells it.
pub fn action(decision: &Decision, responded: bool) -> &'static str {
    let stop = |response: &'static str, error: &'static str| {
        if responded { response } else { error }
    };
    match decision {
        Decision::Done => "done",
        Decision::Retry(plan) => match plan.class {
            RetryClass::Transient => "retry (transient)",
            RetryClass::Throttling => "retry (throttling)",
        },
        Decision::Stop(reason) => match reason {
            StopReason::NotRetryable { .. } => stop("return: final", "error: not retryable"),
            StopReason::ProblemNotRetryable { .. } => stop("return: `retryable: false`", "error"),
            StopReason::NonIdempotentWithoutKey => stop("return: no key", "error: no key"),
            StopReason::ServerErrorWithoutKey => stop("return: 500 needs a key", "error"),
            StopReason::RetryAfterPastDeadline { .. } => stop("return at once", "error"),
            // Not reachable on a first attempt with a full budget and 30 s left.
            _ => stop("return", "error"),
        },
    }
}

/// The actions for `outcome`, one per [`REQUESTS`] column, on a first attempt.
pub fn actions(outcome: &Outcome) -> [&'static str; 3] {
    let policy = RetryPolicy::default();
    let responded = matches!(outcome, Outcome::Response { .. });
    REQUESTS.map(|(method, key)| {
        let decision = policy.decide(
            &mut RetryState::seeded(0),
            RequestFacts::new(method, key),
            outcome,
            Duration::ZERO,
            Some(&RetryBudget::default()),
        );
        action(&decision, responded)
    })
}

/// One row of the table, as its cells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// What arrived: `` `409` ``, `connection refused`, …
    pub arrived: String,
    /// The problem `code`, or `—` without a problem body.
    pub code: String,
    /// The problem's `retryable` member: `` `true` ``, `absent`, `` `true` or absent ``, or `—`.
    pub retryable: String,
    /// `—`, `before the deadline`, `past the deadline`, or a combination joined by ` or `.
    pub retry_after: String,
    /// Which profiles send this (status, code), `all`, or `—`.
    pub profiles: String,
    /// One action per [`REQUESTS`] column.
    pub actions: [&'static str; 3],
}

const HINTS: [(Option<Duration>, &str); 3] = [
    (None, "—"),
    (Some(HINT_BEFORE_DEADLINE), "before the deadline"),
    (Some(HINT_PAST_DEADLINE), "past the deadline"),
];

/// One `Retry-After` cell and the actions under it.
type HintRow = (String, [&'static str; 3]);

/// Rows for one response shape, with its `Retry-After` variants merged where the actions agree.
fn hint_rows(status: u16, code: Option<&str>, retryable: Option<bool>) -> Vec<HintRow> {
    let variants: Vec<(&str, [&'static str; 3])> = HINTS
        .iter()
        .map(|(hint, label)| {
            let mut o = Outcome::status(status).with_problem(code, retryable);
            if let Some(h) = hint {
                o = o.with_retry_after(*h);
            }
            (*label, actions(&o))
        })
        .collect();
    if variants.iter().all(|(_, a)| *a == variants[0].1) {
        return vec![("any".to_owned(), variants[0].1)];
    }
    // Merge neighbours with the same actions ("— or before the deadline").
    let mut rows: Vec<HintRow> = Vec::new();
    for (label, a) in variants {
        match rows.last_mut() {
            Some((l, prev)) if *prev == a => *l = format!("{l} or {label}"),
            _ => rows.push((label.to_owned(), a)),
        }
    }
    rows
}

fn code_cell(code: Option<&str>) -> String {
    code.map_or_else(|| "—".to_owned(), |c| format!("`{c}`"))
}

fn retryable_cell(v: Option<bool>) -> String {
    v.map_or_else(|| "absent".to_owned(), |b| format!("`{b}`"))
}

/// Rows for a problem document, merging "the member as sent" with "the member absent" (as the
/// vendors' own APIs send it) when they decide alike.
fn problem_rows(status: u16, code: &str, retryable: bool, profiles: &str) -> Vec<Row> {
    let with = hint_rows(status, Some(code), Some(retryable));
    let without = hint_rows(status, Some(code), None);
    let shapes: Vec<(String, Vec<HintRow>)> = if with == without {
        vec![(
            format!("{} or absent", retryable_cell(Some(retryable))),
            with,
        )]
    } else {
        vec![
            (retryable_cell(Some(retryable)), with),
            (retryable_cell(None), without),
        ]
    };
    shapes
        .into_iter()
        .flat_map(|(retryable, hints)| {
            hints.into_iter().map(move |(retry_after, actions)| Row {
                arrived: format!("`{status}`"),
                code: code_cell(Some(code)),
                retryable: retryable.clone(),
                retry_after,
                profiles: profiles.to_owned(),
                actions,
            })
        })
        .collect()
}

/// Every row, in the order the book shows them.
pub fn rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for (outcome, label) in [
        (Outcome::ConnectError, "connection refused"),
        (Outcome::ConnectionLost, "connection lost"),
        (Outcome::Timeout, "attempt timeout"),
        (Outcome::OtherTransport, "other transport failure"),
    ] {
        rows.push(Row {
            arrived: label.to_owned(),
            code: "—".to_owned(),
            retryable: "—".to_owned(),
            retry_after: "—".to_owned(),
            profiles: "—".to_owned(),
            actions: actions(&outcome),
        });
    }
    // Every contract code under every profile, profiles with the same spelling on one row.
    for code in ErrorCode::ALL {
        let mut groups: Vec<((u16, &str), Vec<Profile>)> = Vec::new();
        for p in Profile::ALL {
            let wire = (code.status(p), code.wire_code(p));
            match groups.iter_mut().find(|(w, _)| *w == wire) {
                Some((_, ps)) => ps.push(p),
                None => groups.push((wire, vec![p])),
            }
        }
        for ((status, wire), profiles) in groups {
            let names = if profiles.len() == Profile::ALL.len() {
                "all".to_owned()
            } else {
                profiles
                    .iter()
                    .map(|p| p.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            rows.extend(problem_rows(status, wire, code.retryable(), &names));
        }
    }
    // Responses without a problem body (proxies, gateways, other APIs).
    for status in [200u16, 408, 409, 429, 500, 501, 502, 503, 504] {
        for (retry_after, actions) in hint_rows(status, None, None) {
            rows.push(Row {
                arrived: format!("`{status}`"),
                code: "—".to_owned(),
                retryable: "—".to_owned(),
                retry_after,
                profiles: "—".to_owned(),
                actions,
            });
        }
    }
    // A problem from an API outside the profiles, with a code the client does not know: on a
    // 409 its `retryable` decides, and an explicit `false` stops any retry.
    for (status, retryable) in [(409u16, Some(true)), (409, None), (503, Some(false))] {
        for (retry_after, actions) in hint_rows(status, Some("other"), retryable) {
            rows.push(Row {
                arrived: format!("`{status}`"),
                code: code_cell(Some("other")),
                retryable: retryable_cell(retryable),
                retry_after,
                profiles: "—".to_owned(),
                actions,
            });
        }
    }
    rows
}

/// The Markdown table.
pub fn markdown() -> String {
    let mut s = String::from(
        "<!-- generated by idem-client (client/src/decisions.rs); regenerate with \
         cargo run -p idem-client --bin idem-client-vectors -->\n\n",
    );
    s.push_str(
        "| Arrived | `code` | `retryable` | `Retry-After` | Profiles | With a key | GET, PUT, DELETE without a key | POST, PATCH without a key |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for r in rows() {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.arrived,
            r.code,
            r.retryable,
            r.retry_after,
            r.profiles,
            r.actions[0],
            r.actions[1],
            r.actions[2]
        );
    }
    s
}
