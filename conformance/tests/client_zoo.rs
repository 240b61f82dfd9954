//! The client zoo table (issue 23): every client of `idem-client-zoo`, over
//! three seeds, through the client check's in-process API. Each defective
//! client must fail (or, for a SHOULD clause, miss as non-strict) its own
//! clause with that clause's class, and no other clause in safety; the
//! conforming client (`idem-client` with its defaults) must CONFORM with
//! nothing non-strict. The table it prints is the one in the README.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_client_zoo::{ZooClient, call};
use idem_conformance::client::{ClientOptions, ClientUnderTest};
use idem_spec::clauses::Class;
use idem_spec::report::{Outcome, Report, Verdict};

/// What the kit must find in each client: the clause and its class.
fn expected(c: ZooClient) -> Option<(&'static str, Class)> {
    match c {
        ZooClient::Conforming => None,
        ZooClient::NoJitter => Some(("idem.client.no-unjittered-backoff", Class::Semantics)),
        ZooClient::FreshKeyPerAttempt => Some(("idem.client.same-key", Class::Safety)),
        ZooClient::Retries400 => Some(("idem.client.allowlist", Class::Safety)),
        ZooClient::IgnoresRetryAfter => Some(("idem.client.retry-after", Class::Semantics)),
        ZooClient::NoAttemptCap => Some(("idem.client.max-attempts", Class::Semantics)),
        ZooClient::DeadlineResetPerAttempt => Some(("idem.client.deadline", Class::Semantics)),
        ZooClient::ResendsKeylessAfterReset | ZooClient::NoKey => {
            Some(("idem.client.no-key-no-retry", Class::Safety))
        }
    }
}

/// Every clause with a non-passing check, with the worst verdict and class.
fn findings(r: &Report) -> Vec<(String, Verdict, Class)> {
    let mut out: Vec<(String, Verdict, Class)> = Vec::new();
    for k in r.cases.iter().flat_map(|c| c.checks.iter()) {
        if k.verdict == Verdict::Pass {
            continue;
        }
        match out.iter_mut().find(|(id, _, _)| *id == k.clause) {
            Some(f) => {
                f.1 = f.1.max(k.verdict);
                f.2 = f.2.max(k.class);
            }
            None => out.push((k.clause.clone(), k.verdict, k.class)),
        }
    }
    out.sort();
    out
}

async fn check(client: ZooClient, seed: u64) -> (Report, Duration) {
    // Each run draws its own jitter seed, as separate processes would.
    let n = Arc::new(AtomicU64::new(0));
    let under_test = move |url: String| {
        let s = seed * 1_000 + n.fetch_add(1, Ordering::Relaxed);
        async move { call(client, &url, s).await }
    };
    let opts = ClientOptions {
        seed: Some(seed),
        first_contact: Duration::from_secs(30),
        contact: Duration::from_secs(30),
        ..ClientOptions::default()
    };
    let started = Instant::now();
    let under_test: Arc<dyn ClientUnderTest> = Arc::new(under_test);
    let report = idem_conformance::client::run(under_test, &opts)
        .await
        .expect("the check runs");
    (report, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_zoo_client_fails_its_own_clause_and_the_conforming_one_conforms() {
    let started = Instant::now();
    let mut rows = Vec::new();
    // One seed at a time, its nine clients together: the clients share
    // this process's CPU with the kit's servers, and every run starting at
    // once would starve the servers of it (a debug build pays dearly for
    // each client's TLS set-up).
    for seed in [1u64, 2, 3] {
        let mut set = tokio::task::JoinSet::new();
        for client in ZooClient::ALL {
            set.spawn(async move {
                let (report, took) = check(client, seed).await;
                (client, seed, report, took)
            });
        }
        while let Some(done) = set.join_next().await {
            rows.push(done.expect("no panic"));
        }
    }
    rows.sort_by_key(|(c, s, _, _)| (ZooClient::ALL.iter().position(|x| x == c).unwrap_or(0), *s));
    println!(
        "| client | seed | result | findings (clause: verdict, class) | first-delay spread | wall time |"
    );
    println!("|---|---|---|---|---|---|");
    let mut problems = Vec::new();
    for (client, seed, report, took) in &rows {
        let found = findings(report);
        let list: Vec<String> = found
            .iter()
            .map(|(id, v, c)| format!("{}: {v}, {c}", id.trim_start_matches("idem.")))
            .collect();
        let spread = report
            .cases
            .iter()
            .flat_map(|c| c.checks.iter())
            .find(|k| k.clause == "idem.client.backoff-jitter")
            .and_then(|k| k.observed.rsplit("longest ").next().map(str::to_owned))
            .unwrap_or_else(|| "not judged".to_owned());
        println!(
            "| {} | {seed} | {} | {} | {spread} | {:.1} s |",
            client.name(),
            report.summary.result.as_str(),
            if list.is_empty() {
                "none".to_owned()
            } else {
                list.join("; ")
            },
            took.as_secs_f64()
        );
        let errors: Vec<&str> = report
            .cases
            .iter()
            .filter(|c| c.verdict == Verdict::Error)
            .map(|c| c.id.as_str())
            .collect();
        if report.harness_error.is_some() || !errors.is_empty() {
            problems.push(format!(
                "{} seed {seed}: harness error {:?} {errors:?}",
                client.name(),
                report.harness_error
            ));
        }
        match expected(*client) {
            None => {
                if report.summary.result != Outcome::Conforms || !found.is_empty() {
                    problems.push(format!(
                        "{} seed {seed}: expected CONFORMS with nothing found, got {} {found:?}",
                        client.name(),
                        report.summary.result.as_str()
                    ));
                }
            }
            Some((clause, class)) => {
                let own = found.iter().any(|(id, v, c)| {
                    id == clause && *c == class && matches!(v, Verdict::Fail | Verdict::NonStrict)
                });
                if !own {
                    problems.push(format!(
                        "{} seed {seed}: {clause} ({class}) not found; found {found:?}",
                        client.name()
                    ));
                }
                let other_safety: Vec<&String> = found
                    .iter()
                    .filter(|(id, v, c)| id != clause && *c == Class::Safety && *v == Verdict::Fail)
                    .map(|(id, _, _)| id)
                    .collect();
                if !other_safety.is_empty() {
                    problems.push(format!(
                        "{} seed {seed}: other safety failures {other_safety:?}",
                        client.name()
                    ));
                }
            }
        }
    }
    if !problems.is_empty() {
        // The evidence, for whoever has to look.
        for (client, seed, report, _) in &rows {
            for c in report.cases.iter().filter(|c| c.verdict != Verdict::Pass) {
                println!("\n{} seed {seed}: {} {}", client.name(), c.id, c.verdict);
                for l in idem_conformance::verdict::report::explain(c) {
                    println!("  {l}");
                }
            }
        }
    }
    println!(
        "{} checks of {} clients in {:.1} s",
        rows.len(),
        ZooClient::ALL.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
