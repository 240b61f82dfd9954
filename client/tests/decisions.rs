//! The book's client decision table (`book/src/tables/client-decisions.md`) against the
//! policy, row by row: each row is read back into the outcomes it stands for (every
//! `retryable` and `Retry-After` variant its cells name), the default policy decides each one
//! on a first attempt for each kind of request, and the committed action must be what it did.
//! Then: every contract code under every profile has its row, and the file is current.

use std::path::PathBuf;
use std::time::Duration;

use idem_client::decisions::{
    self, DECISIONS_TABLE_PATH, HINT_BEFORE_DEADLINE, HINT_PAST_DEADLINE, REQUESTS,
};
use idem_client::{Outcome, RequestFacts, RetryBudget, RetryPolicy, RetryState};
use idem_spec::{ErrorCode, Profile};

fn committed() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(DECISIONS_TABLE_PATH);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The table's data rows, as trimmed cells.
fn table_rows(md: &str) -> Vec<Vec<String>> {
    md.lines()
        .filter(|l| l.starts_with('|'))
        .skip(2) // header and separator
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

fn unquote(cell: &str) -> &str {
    cell.trim_matches('`')
}

/// The outcome of the "Arrived" cell, or the status it names.
fn arrived(cell: &str) -> Result<Outcome, u16> {
    match cell {
        "connection refused" => Ok(Outcome::ConnectError),
        "connection lost" => Ok(Outcome::ConnectionLost),
        "attempt timeout" => Ok(Outcome::Timeout),
        "other transport failure" => Ok(Outcome::OtherTransport),
        s => Err(unquote(s)
            .parse()
            .unwrap_or_else(|_| panic!("unknown arrival {s:?}"))),
    }
}

/// The `retryable` values a cell stands for; `None` in the outer option means no problem body.
fn retryable_variants(cell: &str) -> Vec<Option<bool>> {
    cell.split(" or ")
        .map(|v| match v {
            "`true`" => Some(true),
            "`false`" => Some(false),
            "absent" => None,
            other => panic!("unknown retryable cell {other:?}"),
        })
        .collect()
}

fn hint_variants(cell: &str) -> Vec<Option<Duration>> {
    if cell == "any" {
        return vec![None, Some(HINT_BEFORE_DEADLINE), Some(HINT_PAST_DEADLINE)];
    }
    cell.split(" or ")
        .map(|v| match v {
            "—" => None,
            "before the deadline" => Some(HINT_BEFORE_DEADLINE),
            "past the deadline" => Some(HINT_PAST_DEADLINE),
            other => panic!("unknown Retry-After cell {other:?}"),
        })
        .collect()
}

/// Every outcome one row stands for.
fn outcomes(row: &[String]) -> Vec<Outcome> {
    let status = match arrived(&row[0]) {
        Ok(transport) => {
            assert!(row[1..5].iter().all(|c| c == "—"), "{row:?}");
            return vec![transport];
        }
        Err(status) => status,
    };
    let code = (row[1] != "—").then(|| unquote(&row[1]).to_owned());
    let retryables = if row[2] == "—" {
        assert!(code.is_none(), "a code without a problem body: {row:?}");
        vec![None]
    } else {
        retryable_variants(&row[2])
    };
    let mut all = Vec::new();
    for retryable in retryables {
        for hint in hint_variants(&row[3]) {
            let mut o = Outcome::status(status).with_problem(code.as_deref(), retryable);
            if let Some(h) = hint {
                o = o.with_retry_after(h);
            }
            all.push(o);
        }
    }
    all
}

// clause: idem.client.allowlist, idem.client.retry-after, idem.client.500-with-key, idem.client.no-key-no-retry
#[test]
fn every_row_of_the_book_table_is_what_the_policy_decides() {
    let md = committed();
    let rows = table_rows(&md);
    assert!(rows.len() > 40, "{} rows", rows.len());
    let policy = RetryPolicy::default();
    let mut checked = 0;
    for row in &rows {
        assert_eq!(row.len(), 8, "{row:?}");
        for outcome in outcomes(row) {
            let responded = matches!(outcome, Outcome::Response { .. });
            for (column, (method, key)) in REQUESTS.iter().enumerate() {
                let decision = policy.decide(
                    &mut RetryState::seeded(1),
                    RequestFacts::new(method, *key),
                    &outcome,
                    Duration::ZERO,
                    Some(&RetryBudget::default()),
                );
                assert_eq!(
                    row[5 + column],
                    decisions::action(&decision, responded),
                    "row {row:?}, {outcome:?}, {method} key={key}: {decision:?}"
                );
                checked += 1;
            }
        }
    }
    println!("{checked} decisions checked in {} rows", rows.len());
}

// clause: idem.errors.profiles, idem.client.allowlist
#[test]
fn the_table_covers_every_contract_code_under_every_profile() {
    let md = committed();
    let rows = table_rows(&md);
    for code in ErrorCode::ALL {
        for profile in Profile::ALL {
            let status = format!("`{}`", code.status(profile));
            let wire = format!("`{}`", code.wire_code(profile));
            let retryable = format!("`{}`", code.retryable());
            let mine: Vec<&Vec<String>> = rows
                .iter()
                .filter(|r| r[0] == status && r[1] == wire)
                .filter(|r| r[4] == "all" || r[4].split(", ").any(|p| p == profile.as_str()))
                .collect();
            assert!(!mine.is_empty(), "{code} under {profile}: no row");
            // The retryable member as the contract sends it, and every Retry-After variant.
            let mut hints: Vec<Option<Duration>> = mine
                .iter()
                .filter(|r| r[2].split(" or ").any(|v| v == retryable))
                .flat_map(|r| hint_variants(&r[3]))
                .collect();
            hints.sort();
            assert_eq!(
                hints,
                [None, Some(HINT_BEFORE_DEADLINE), Some(HINT_PAST_DEADLINE)],
                "{code} under {profile}"
            );
        }
    }
    // The in-flight 409 is retried under every profile; the mismatch under none.
    for profile in Profile::ALL {
        let in_use = format!("`{}`", ErrorCode::IdempotencyKeyInUse.wire_code(profile));
        assert!(
            rows.iter()
                .any(|r| r[1] == in_use && r[5].starts_with("retry"))
        );
        let mismatch = format!("`{}`", ErrorCode::IdempotencyKeyMismatch.wire_code(profile));
        assert!(
            rows.iter()
                .filter(|r| r[1] == mismatch)
                .all(|r| r[5] == "return: final")
        );
    }
}

#[test]
fn the_committed_table_is_current() {
    assert!(
        committed() == decisions::markdown(),
        "{DECISIONS_TABLE_PATH} is stale: run `cargo run -p idem-client --bin idem-client-vectors`"
    );
}

/// The chapter says how many rows the table has; that number is the table's.
#[test]
fn the_book_states_the_tables_row_count() {
    let md = committed();
    let n = table_rows(&md).len();
    assert_eq!(n, decisions::rows().len());
    let chapter = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../book/src/client.md"),
    )
    .expect("client.md");
    assert!(
        chapter.contains(&format!("It has {n} rows")),
        "book/src/client.md must say the decision table has {n} rows"
    );
}
