//! Every retry is observable as a `tracing` event. In its own test binary because tracing's
//! per-callsite interest cache is process-wide: a concurrent test that hits the same callsite
//! with no subscriber installed can make a thread-local subscriber miss events.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use idem_client::{ManualClock, RetryMiddleware};
use reqwest_middleware::ClientBuilder;

mod support;
use support::{answer, serve};

/// Captures the fields of `idem_client::retry` events.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<BTreeMap<String, String>>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if event.metadata().target() != "idem_client::retry" {
            return;
        }
        let mut map = BTreeMap::new();
        event.record(&mut Fields(&mut map));
        self.0.lock().expect("lock").push(map);
    }
}

// clause: idem.client.observability
#[tokio::test]
async fn every_retry_emits_a_tracing_event_with_attempt_reason_delay_and_budget() {
    use tracing_subscriber::layer::SubscriberExt;
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let _guard = tracing::subscriber::set_default(subscriber);

    let (url, _script) = serve(vec![answer(503), answer(408), answer(200)]).await;
    let clock = ManualClock::default();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(
            RetryMiddleware::default()
                .with_clock(clock.clone())
                .with_seed(5),
        )
        .build();
    let resp = client.get(&url).send().await.expect("200");
    assert_eq!(resp.status().as_u16(), 200);

    let events: Vec<_> = capture
        .0
        .lock()
        .expect("lock")
        .iter()
        .filter(|e| e.get("message").map(String::as_str) == Some("retrying"))
        .cloned()
        .collect();
    assert_eq!(
        events.len(),
        2,
        "{events:?} of {:?}",
        capture.0.lock().expect("lock")
    );
    let sleeps = clock.sleeps();
    for (i, (e, reason, left)) in [
        (&events[0], "503-service-unavailable", "486"),
        (&events[1], "408-request-timeout", "472"),
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(e["attempt"], (i + 1).to_string());
        assert_eq!(e["reason"], reason);
        assert_eq!(e["delay_ms"], sleeps[i].as_millis().to_string());
        assert_eq!(e["budget_left"], left);
    }
}

/// Captures every `idem_client.attempt` span's fields, in the order the spans close.
#[derive(Clone, Default)]
struct Spans {
    open: Arc<Mutex<BTreeMap<u64, BTreeMap<String, String>>>>,
    closed: Arc<Mutex<Vec<BTreeMap<String, String>>>>,
}

impl<S> tracing_subscriber::Layer<S> for Spans
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if attrs.metadata().name() != "idem_client.attempt" {
            return;
        }
        let mut map = BTreeMap::new();
        attrs.record(&mut Fields(&mut map));
        self.open.lock().expect("lock").insert(id.into_u64(), map);
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if let Some(map) = self.open.lock().expect("lock").get_mut(&id.into_u64()) {
            values.record(&mut Fields(map));
        }
    }

    fn on_close(&self, id: tracing::span::Id, _ctx: tracing_subscriber::layer::Context<'_, S>) {
        if let Some(map) = self.open.lock().expect("lock").remove(&id.into_u64()) {
            self.closed.lock().expect("lock").push(map);
        }
    }
}

// clause: idem.client.observability
#[tokio::test]
async fn every_attempt_runs_in_a_span_with_its_number_reason_wait_and_outcome() {
    use tracing_subscriber::layer::SubscriberExt;
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let _guard = tracing::subscriber::set_default(subscriber);

    let (url, _script) = serve(vec![answer(503), answer(408), answer(200)]).await;
    let clock = ManualClock::default();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(
            RetryMiddleware::default()
                .with_clock(clock.clone())
                .with_seed(5),
        )
        .build();
    let resp = client.get(&url).send().await.expect("200");
    assert_eq!(resp.status().as_u16(), 200);
    let closed = spans.closed.lock().expect("lock").clone();
    assert_eq!(closed.len(), 3, "{closed:?}");
    let sleeps = clock.sleeps();
    let want = [
        ("1", "first", "0".to_owned(), "5xx", "503", "retry"),
        (
            "2",
            "503-service-unavailable",
            sleeps[0].as_millis().to_string(),
            "4xx",
            "408",
            "retry",
        ),
        (
            "3",
            "408-request-timeout",
            sleeps[1].as_millis().to_string(),
            "2xx",
            "200",
            "done",
        ),
    ];
    for (span, (attempt, reason, wait, outcome, status, decision)) in closed.iter().zip(want) {
        assert_eq!(span["attempt"], attempt, "{span:?}");
        assert_eq!(span["reason"], reason, "{span:?}");
        assert_eq!(span["wait_ms"], wait, "{span:?}");
        assert_eq!(span["outcome"], outcome, "{span:?}");
        assert_eq!(span["status"], status, "{span:?}");
        assert_eq!(span["decision"], decision, "{span:?}");
        assert_eq!(span["method"], "GET", "{span:?}");
    }
}
