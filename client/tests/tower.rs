//! `idem_client::tower`: the same `decide` as a `tower::retry::Policy`, against a scripted
//! service (each answer, or error, in turn; every request it receives recorded).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use idem_client::budget::{BudgetConfig, RetryBudget};
use idem_client::tower::{BoxError, IdemRetryLayer, IdemRetryPolicy, ProblemHint};
use idem_client::{Backoff, Jitter, RetryPolicy};
use tower::{Service, ServiceBuilder, ServiceExt};

mod support;

type Answer = Result<Response<String>, BoxError>;

#[derive(Clone, Default)]
struct Script {
    answers: Arc<Mutex<VecDeque<Answer>>>,
    seen: Arc<Mutex<Vec<http::HeaderMap>>>,
}

impl Script {
    fn new(answers: Vec<Answer>) -> Self {
        Self {
            answers: Arc::new(Mutex::new(answers.into())),
            seen: Arc::default(),
        }
    }

    fn header(&self, name: &str) -> Vec<Option<String>> {
        self.seen
            .lock()
            .expect("lock")
            .iter()
            .map(|h| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned))
            .collect()
    }

    fn calls(&self) -> usize {
        self.seen.lock().expect("lock").len()
    }

    fn service(
        &self,
    ) -> impl Service<Request<String>, Response = Response<String>, Error = BoxError, Future: Send>
    + Clone
    + Send
    + 'static {
        let script = self.clone();
        tower::service_fn(move |req: Request<String>| {
            let script = script.clone();
            async move {
                script
                    .seen
                    .lock()
                    .expect("lock")
                    .push(req.headers().clone());
                let next = script.answers.lock().expect("lock").pop_front();
                next.unwrap_or_else(|| Ok(status(200)))
            }
        })
    }
}

fn status(code: u16) -> Response<String> {
    let mut r = Response::new(String::new());
    *r.status_mut() = http::StatusCode::from_u16(code).expect("status");
    r
}

fn in_flight() -> Response<String> {
    let mut r = status(409);
    r.headers_mut()
        .insert("retry-after", http::HeaderValue::from_static("0"));
    r.extensions_mut().insert(ProblemHint {
        code: Some("idempotency_key_in_use".into()),
        retryable: Some(true),
    });
    r
}

/// The default policy with millisecond backoff, so the real sleeps stay short.
fn fast() -> RetryPolicy {
    RetryPolicy {
        backoff: Backoff {
            base: Duration::from_millis(5),
            cap: Duration::from_millis(20),
            jitter: Jitter::Full,
        },
        ..RetryPolicy::default()
    }
}

fn post() -> Request<String> {
    Request::post("http://127.0.0.1:9/orders")
        .body("{}".to_owned())
        .expect("request")
}

// clause: idem.client.same-key, idem.client.allowlist, idem.client.auto-key
#[tokio::test]
async fn a_post_is_retried_through_503_and_a_409_in_flight_with_one_minted_key() {
    let script = Script::new(vec![Ok(status(503)), Ok(in_flight()), Ok(status(201))]);
    let svc = ServiceBuilder::new()
        .layer(IdemRetryLayer::new(
            IdemRetryPolicy::new(fast()).with_attempt_header(),
        ))
        .service(script.service());
    let resp = svc.oneshot(post()).await.expect("response");
    assert_eq!(resp.status().as_u16(), 201);
    let keys = script.header("idempotency-key");
    assert_eq!(keys.len(), 3);
    assert!(keys[0].is_some());
    assert!(keys.iter().all(|k| *k == keys[0]), "{keys:?}");
    // The first attempt goes out as built; each retry carries its number.
    assert_eq!(
        script.header("attempt-count"),
        [None, Some("2".into()), Some("3".into())]
    );
}

// clause: idem.client.no-key-no-retry
#[tokio::test]
async fn without_a_key_a_post_is_not_retried_unless_the_connection_was_refused() {
    let script = Script::new(vec![Ok(status(503))]);
    let svc = ServiceBuilder::new()
        .layer(IdemRetryLayer::new(IdemRetryPolicy::new(fast())).auto_keys(false))
        .service(script.service());
    let resp = svc.oneshot(post()).await.expect("response");
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(script.calls(), 1);
    assert_eq!(script.header("idempotency-key"), [None]);

    let refused = || -> Answer {
        Err(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )))
    };
    let script = Script::new(vec![refused(), refused(), refused(), Ok(status(201))]);
    let svc = ServiceBuilder::new()
        .layer(IdemRetryLayer::new(IdemRetryPolicy::new(fast())).auto_keys(false))
        .service(script.service());
    let resp = svc.oneshot(post()).await.expect("response");
    // Three refusals do not spend the 3-attempt cap: the fourth send succeeds.
    assert_eq!(resp.status().as_u16(), 201);
    assert_eq!(script.calls(), 4);
}

// clause: idem.client.allowlist, idem.client.deadline
#[tokio::test]
async fn errors_are_sorted_by_what_they_prove_and_tower_timeouts_are_timeouts() {
    // An attempt timeout inside the retry layer: the first attempt hangs past it.
    let script = Script::new(vec![]);
    let hung = Arc::new(Mutex::new(true));
    let inner = {
        let svc = script.service();
        let hung = hung.clone();
        tower::service_fn(move |req: Request<String>| {
            let mut svc = svc.clone();
            let first = std::mem::replace(&mut *hung.lock().expect("lock"), false);
            async move {
                if first {
                    std::future::pending::<()>().await;
                }
                svc.ready().await?.call(req).await
            }
        })
    };
    let svc = ServiceBuilder::new()
        .layer(IdemRetryLayer::new(IdemRetryPolicy::new(fast())))
        .timeout(Duration::from_millis(50))
        .service(inner);
    let get = Request::get("http://127.0.0.1:9/orders/1")
        .body(String::new())
        .expect("request");
    let resp = svc.oneshot(get).await.expect("the retry answers");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        script.calls(),
        1,
        "the hung attempt never reached the script"
    );

    // Any other error is not retried.
    let script = Script::new(vec![Err("malformed response".into())]);
    let svc = ServiceBuilder::new()
        .layer(IdemRetryLayer::new(IdemRetryPolicy::new(fast())))
        .service(script.service());
    let get = Request::get("http://127.0.0.1:9/orders/1")
        .body(String::new())
        .expect("request");
    assert!(svc.oneshot(get).await.is_err());
    assert_eq!(script.calls(), 1);
}

// clause: idem.client.max-attempts, idem.client.budget
#[tokio::test]
async fn each_request_is_its_own_operation_and_the_budget_is_shared() {
    let script = Script::new((0..6).map(|_| Ok(status(502))).collect());
    let budget = RetryBudget::new(BudgetConfig {
        capacity: 30,
        ..BudgetConfig::default()
    });
    let mut svc = ServiceBuilder::new()
        .layer(IdemRetryLayer::new(
            IdemRetryPolicy::new(fast()).with_shared_budget(budget.clone()),
        ))
        .service(script.service());
    let get = || {
        Request::get("http://127.0.0.1:9/orders/1")
            .body(String::new())
            .expect("request")
    };
    // First request: three attempts (the cap), two retries paid (28 tokens).
    let a = svc
        .ready()
        .await
        .expect("ready")
        .call(get())
        .await
        .expect("502");
    assert_eq!(a.status().as_u16(), 502);
    assert_eq!(script.calls(), 3);
    assert_eq!(budget.available(), 2);
    // Second request through the same service: a fresh operation, but the budget is empty.
    let b = svc
        .ready()
        .await
        .expect("ready")
        .call(get())
        .await
        .expect("502");
    assert_eq!(b.status().as_u16(), 502);
    assert_eq!(script.calls(), 4);

    // A budget per origin by default: a fresh service has a full bucket and retries.
    let script = Script::new((0..3).map(|_| Ok(status(502))).collect());
    let svc = ServiceBuilder::new()
        .layer(IdemRetryLayer::default())
        .service(script.service());
    let policy = IdemRetryPolicy::default();
    assert_eq!(policy.policy().max_attempts, 3);
    let started = tokio::time::Instant::now();
    let r = svc.oneshot(get()).await.expect("502");
    assert_eq!(r.status().as_u16(), 502);
    assert_eq!(script.calls(), 3);
    // Two default full-jitter sleeps: under 0.5 s + 1 s.
    assert!(started.elapsed() < Duration::from_millis(1600));
}

/// A hyper client (hyper-util's legacy client) under the layer, against a local server: the
/// tower path end to end, sockets included.
mod hyper_client {
    use super::*;
    use crate::support;
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    fn hyper() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
        Client::builder(TokioExecutor::new()).build_http()
    }

    // clause: idem.client.same-key, idem.client.allowlist
    #[tokio::test]
    async fn a_hyper_client_retries_a_503_with_one_key() {
        let (url, script) = support::serve(vec![support::answer(503), support::answer(201)]).await;
        let svc = ServiceBuilder::new()
            .layer(IdemRetryLayer::new(IdemRetryPolicy::new(fast())))
            .timeout(Duration::from_secs(10))
            .service(hyper());
        let req = Request::post(url.as_str())
            .body(Full::new(Bytes::from_static(b"{}")))
            .expect("request");
        let resp = svc.oneshot(req).await.expect("response");
        assert_eq!(resp.status().as_u16(), 201);
        let keys = script.lock().expect("lock").seen_keys.clone();
        assert_eq!(keys.len(), 2);
        assert!(keys[0].is_some() && keys[0] == keys[1], "{keys:?}");
    }

    // clause: idem.client.allowlist, idem.client.max-attempts
    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error_retried_up_to_the_send_ceiling() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let calls = Arc::new(Mutex::new(0u32));
        let counted = {
            let calls = calls.clone();
            let inner = hyper();
            tower::service_fn(move |req: Request<Full<Bytes>>| {
                *calls.lock().expect("lock") += 1;
                let inner = inner.clone();
                async move { inner.request(req).await }
            })
        };
        let svc = ServiceBuilder::new()
            .layer(IdemRetryLayer::new(IdemRetryPolicy::new(fast())))
            .timeout(Duration::from_secs(10))
            .service(counted);
        let req = Request::post(format!("http://{addr}/orders"))
            .body(Full::new(Bytes::from_static(b"{}")))
            .expect("request");
        let err = svc.oneshot(req).await.expect_err("nothing listens");
        assert_eq!(
            idem_client::tower::outcome_of_error(err.as_ref()),
            idem_client::Outcome::ConnectError,
            "{err:?}"
        );
        // Refusals do not spend the 3-attempt cap: the 10-send ceiling stops them.
        assert_eq!(*calls.lock().expect("lock"), 10);
    }
}

// clause: idem.client.deadline-header, idem.client.deadline-header-truthful
#[tokio::test(start_paused = true)]
async fn every_attempt_carries_what_is_left_of_the_deadline_as_it_leaves() {
    let script = Script::new(vec![Ok(status(503)), Ok(status(503)), Ok(status(201))]);
    let policy = RetryPolicy {
        deadline: Duration::from_secs(5),
        backoff: Backoff {
            base: Duration::from_millis(300),
            cap: Duration::from_millis(900),
            jitter: Jitter::Full,
        },
        ..RetryPolicy::default()
    };
    let svc = ServiceBuilder::new()
        .layer(IdemRetryLayer::new(
            IdemRetryPolicy::new(policy).with_seed(7),
        ))
        .service(script.service());
    let start = tokio::time::Instant::now();
    let mut req = post();
    // A caller's own value is replaced: only the retry knows what is left.
    req.headers_mut().insert(
        idem_spec::headers::REQUEST_DEADLINE_MS,
        http::HeaderValue::from_static("999999"),
    );
    let resp = svc.oneshot(req).await.expect("response");
    assert_eq!(resp.status().as_u16(), 201);
    let slept = start.elapsed();
    let values: Vec<u64> = script
        .header("request-deadline-ms")
        .iter()
        .map(|v| {
            v.as_deref()
                .expect("every attempt carries it")
                .parse()
                .expect("digits")
        })
        .collect();
    assert_eq!(values.len(), 3);
    // Time is paused, so it moves only by the two backoff sleeps: the first attempt carries the
    // whole deadline and the last the deadline less both sleeps, in whole milliseconds.
    assert_eq!(values[0], 5000);
    assert!(slept > Duration::ZERO, "the retries slept");
    let last_left = Duration::from_secs(5) - slept;
    assert_eq!(u128::from(values[2]), last_left.as_millis());
    assert!(values.windows(2).all(|w| w[1] <= w[0]), "{values:?}");
}

// clause: idem.client.deadline-header
#[tokio::test]
async fn the_deadline_header_can_be_turned_off_under_tower() {
    let script = Script::new(vec![Ok(status(503)), Ok(status(201))]);
    let svc = ServiceBuilder::new()
        .layer(IdemRetryLayer::new(IdemRetryPolicy::new(fast())).without_deadline_header())
        .service(script.service());
    let resp = svc.oneshot(post()).await.expect("response");
    assert_eq!(resp.status().as_u16(), 201);
    assert_eq!(script.header("request-deadline-ms"), [None, None]);
}
