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
