//! What the client counts through the `metrics` facade (issue 21 item 6), read back from an
//! in-process recorder, and the optional attempt-count header.

use std::collections::BTreeMap;
use std::time::Duration;

use idem_client::{ManualClock, RetryBudget, RetryMiddleware, RetryPolicy, telemetry};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use reqwest_middleware::ClientBuilder;

mod support;
use support::{Answer, answer, serve};

/// `name{label=value,…}` → value, for every metric in the snapshot.
fn read(snapshotter: &Snapshotter) -> BTreeMap<String, f64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let k = key.key();
            let mut labels: Vec<String> = k
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let name = format!("{}{{{}}}", k.name(), labels.join(","));
            let v = match value {
                DebugValue::Counter(c) => c as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(h) => h.len() as f64,
            };
            (name, v)
        })
        .collect()
}

/// Runs `f` on a current-thread runtime with `recorder` installed for this thread only, so
/// nothing else in the process records into it.
fn recorded<T>(recorder: &DebuggingRecorder, f: impl std::future::Future<Output = T>) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    metrics::with_local_recorder(recorder, || rt.block_on(f))
}

fn in_use() -> Answer {
    Answer {
        status: 409,
        retry_after: Some("1"),
        code: Some("idempotency_key_in_use"),
    }
}

// clause: idem.client.observability
#[test]
fn attempts_retries_give_ups_and_budget_levels_are_counted_without_keys_in_labels() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (origin, keys, attempt_headers, budget) = recorded(&recorder, async {
        telemetry::describe();
        let (url, script) = serve(vec![answer(503), in_use(), answer(201)]).await;
        let budget = RetryBudget::default();
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(
                RetryMiddleware::default()
                    .with_clock(ManualClock::default())
                    .with_attempt_header(),
            )
            .build();
        let resp = client.post(&url).body("{}").send().await.expect("201");
        assert_eq!(resp.status().as_u16(), 201);
        // An operation that gives up: three 502s.
        let (url2, _s2) = serve(vec![answer(502), answer(502), answer(502)]).await;
        let other = ClientBuilder::new(reqwest::Client::new())
            .with(
                RetryMiddleware::default()
                    .with_shared_budget(budget.clone())
                    .with_clock(ManualClock::default()),
            )
            .build();
        let resp = other.get(&url2).send().await.expect("502");
        assert_eq!(resp.status().as_u16(), 502);
        let s = script.lock().expect("lock");
        let origin = reqwest::Url::parse(&url)
            .expect("url")
            .origin()
            .ascii_serialization();
        (
            origin,
            s.seen_keys.clone(),
            s.seen_attempts.clone(),
            budget.available(),
        )
    });
    let m = read(&snapshotter);
    let get = |k: &str| m.get(k).copied().unwrap_or_else(|| panic!("{k} in {m:#?}"));
    assert_eq!(get("idem_client_attempts_total{outcome=5xx}"), 4.0);
    assert_eq!(get("idem_client_attempts_total{outcome=4xx}"), 1.0);
    assert_eq!(get("idem_client_attempts_total{outcome=2xx}"), 1.0);
    assert_eq!(
        get("idem_client_retries_total{class=transient,reason=503-service-unavailable}"),
        1.0
    );
    assert_eq!(
        get("idem_client_retries_total{class=throttling,reason=409-key-in-use}"),
        1.0
    );
    assert_eq!(
        get("idem_client_retries_total{class=transient,reason=502-bad-gateway}"),
        2.0
    );
    assert_eq!(
        get("idem_client_retry_wait_seconds{reason=409-key-in-use}"),
        1.0
    );
    assert_eq!(get("idem_client_operations_total{result=success}"), 1.0);
    assert_eq!(get("idem_client_operations_total{result=gave_up}"), 1.0);
    assert_eq!(
        get("idem_client_gave_up_total{reason=attempts-exhausted}"),
        1.0
    );
    // The per-origin bucket after 503 (14), 409 (5) and the 201's refund of 5.
    assert_eq!(
        get(&format!("idem_client_budget_tokens{{bucket={origin}}}")),
        486.0
    );
    assert_eq!(
        get("idem_client_budget_tokens{bucket=shared}"),
        f64::from(budget)
    );
    assert_eq!(budget, 500 - 2 * 14);
    // No label carries the key.
    let key = keys[0].clone().expect("a minted key");
    assert!(keys.iter().all(|k| k.as_deref() == Some(key.as_str())));
    assert!(m.keys().all(|name| !name.contains(&key)), "{m:#?}");
    // The attempt-count header, when on: 1, 2, 3.
    assert_eq!(
        attempt_headers,
        [Some("1".into()), Some("2".into()), Some("3".into())]
    );
}

#[test]
fn the_attempt_header_is_off_by_default() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let seen = rt.block_on(async {
        let (url, script) = serve(vec![answer(503), answer(200)]).await;
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(RetryMiddleware::default().with_clock(ManualClock::default()))
            .build();
        client.get(&url).send().await.expect("200");
        let s = script.lock().expect("lock");
        s.seen_attempts.clone()
    });
    assert_eq!(seen, [None, None]);
}

#[test]
fn a_deadline_that_passed_before_the_first_attempt_is_a_give_up() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorded(&recorder, async {
        let (url, _s) = serve(vec![]).await;
        let client = ClientBuilder::new(reqwest::Client::new())
            .with(RetryMiddleware::new(RetryPolicy {
                deadline: Duration::ZERO,
                ..RetryPolicy::default()
            }))
            .build();
        client.get(&url).send().await.expect_err("no time left");
    });
    let m = read(&snapshotter);
    assert_eq!(
        m.get("idem_client_gave_up_total{reason=deadline-exceeded}"),
        Some(&1.0)
    );
    assert_eq!(m.get("idem_client_attempts_total{outcome=2xx}"), None);
}
