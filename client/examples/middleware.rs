//! The reqwest-middleware integration: one line added to a client, an operation with a stable
//! key, and the report read back.
//!
//! ```text
//! cargo run -p idem-server                               # the reference server, 127.0.0.1:8080
//! cargo run -p idem-client --example middleware          # one transfer, for invoice 8412
//! cargo run -p idem-client --example middleware -- URL   # another base URL
//! ```
//!
//! Run it twice: the second run derives the same key, so the server replays the first answer
//! (`Idempotent-Replayed: true`) instead of moving the money again. The crate's tests run
//! `pay_invoice` against a local server that fails the first attempt.

use std::process::ExitCode;

// ANCHOR: middleware
use idem_client::{RetryMiddleware, RetryReport, derive_key};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};

/// The one line: every request through this client gets a key when it needs one, and its
/// retries, budget and deadline.
pub fn client() -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::default())
        .build()
}

/// Pays invoice `invoice` with one transfer, however many attempts that takes.
pub async fn pay_invoice(
    client: &ClientWithMiddleware,
    base: &str,
    invoice: u64,
) -> Result<(u16, RetryReport), Box<dyn std::error::Error + Send + Sync>> {
    // One key per operation, derived from the event that caused it: a process that crashes and
    // runs again derives the same key, so its retry gets a replay, not a second transfer.
    let key = derive_key("transfer-invoice", invoice)?;
    let sent = client
        .post(format!("{base}/v1/transfers"))
        .bearer_auth("demo-alice")
        .header("content-type", "application/json")
        .body(r#"{"from":"acc_alice_main","to":"acc_alice_savings","amount":100}"#)
        .with_extension(key.clone())
        .send()
        .await;
    let resp = match sent {
        Ok(resp) => resp,
        Err(e) => {
            // No response even after retrying: the outcome is unknown. Keep the key; trying
            // again later with it is safe for as long as the server keeps the key.
            let kept = idem_client::Error::from_middleware(&e).and_then(idem_client::Error::key);
            eprintln!("invoice {invoice}: no answer; retry later with key {kept:?}");
            return Err(e.into());
        }
    };
    // Any status comes back as a response (a 422, a 429 past the deadline…), with a report.
    let status = resp.status().as_u16();
    let report = resp
        .extensions()
        .get::<RetryReport>()
        .cloned()
        .ok_or("the retry middleware attaches a report to every response")?;
    // The same key sent again, by this run or a later one, gets the first answer replayed.
    let replayed = resp.headers().contains_key("idempotent-replayed");
    println!(
        "invoice {invoice}: {status}{} after {} attempt(s) with key {key}",
        if replayed { " (replayed)" } else { "" },
        report.attempts
    );
    if let Some(why) = &report.stopped {
        println!("  not retried (further): {why}");
    }
    Ok((status, report))
}
// ANCHOR_END: middleware

#[tokio::main]
async fn main() -> ExitCode {
    let base = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:8080".to_owned());
    match pay_invoice(&client(), &base, 8412).await {
        Ok((status, _)) if status < 300 => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
