//! The middleware against a real socket: a local axum server on 127.0.0.1:0 plays a script of
//! responses and records every request it receives. Time is a `ManualClock`, so sleeps are
//! recorded, not waited for; no assertion depends on wall-clock timing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_client::rng::SplitMix64;
use idem_client::{
    AttemptInfo, Backoff, Deadline, Error, HookVerdict, ManualClock, RetryBudget, RetryEvent,
    RetryMiddleware, RetryPolicy, RetryReason, RetryReport, StopReason, derive_key,
};
use idem_spec::headers::IDEMPOTENCY_KEY;
use idem_spec::{ErrorCode, IdempotencyKey};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};

mod support;
use support::{Answer, Shared, answer, serve};

fn client(mw: RetryMiddleware) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new()).with(mw).build()
}

fn keys(script: &Shared) -> Vec<Option<String>> {
    script.lock().expect("script lock").seen_keys.clone()
}

fn report(resp: &reqwest::Response) -> RetryReport {
    resp.extensions()
        .get::<RetryReport>()
        .cloned()
        .expect("the middleware attaches a report")
}

/// The jitter the middleware draws for its first operation when seeded with `seed`.
fn first_operation_schedule(seed: u64, n: u32) -> Vec<Duration> {
    let op_seed = SplitMix64::new(seed).next_u64();
    Backoff::default().schedule(op_seed, n)
}

// clause: idem.client.same-key, idem.client.allowlist, idem.client.retry-after, idem.client.budget
#[tokio::test]
async fn retries_503_then_409_in_use_then_201_with_one_key() -> Result<(), reqwest_middleware::Error>
{
    let in_use = ErrorCode::IdempotencyKeyInUse.as_str();
    let (url, script) = serve(vec![
        Answer {
            status: 503,
            retry_after: Some("1"),
            code: None,
        },
        Answer {
            status: 409,
            retry_after: Some("2"),
            code: Some(in_use),
        },
        answer(201),
    ])
    .await;
    // ANCHOR: one_line
    let clock = ManualClock::default();
    let budget = RetryBudget::default();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(
            RetryMiddleware::default()
                .with_shared_budget(budget.clone())
                .with_clock(clock.clone())
                .with_seed(7),
        )
        .build();
    let resp = client
        .post(&url)
        .header("content-type", "application/json")
        .body(r#"{"sku":"A-1","qty":2}"#)
        .send()
        .await?;
    // ANCHOR_END: one_line
    assert_eq!(resp.status().as_u16(), 201);
    let report = report(&resp);

    // Three attempts, all with the one key the middleware minted, which the caller can read.
    let seen = keys(&script);
    assert_eq!(seen.len(), 3);
    let key = report.key.clone().expect("a POST gets a key");
    assert!(report.key_minted);
    assert!(
        seen.iter().all(|k| k.as_deref() == Some(key.as_str())),
        "{seen:?}"
    );
    assert_eq!(report.attempts, 3);
    // The 409 in flight does not count against the cap: the 503 and the 201 do.
    assert_eq!(report.counted_attempts, 2);
    assert_eq!(report.stopped, None);

    // The sleeps honoured Retry-After as a floor over the seeded full-jitter draws.
    let jitter = first_operation_schedule(7, 2);
    let want = vec![
        jitter[0].max(Duration::from_secs(1)),
        jitter[1].max(Duration::from_secs(2)),
    ];
    assert_eq!(clock.sleeps(), want);
    assert_eq!(report.delays, want);
    assert!(want[0] >= Duration::from_secs(1) && want[1] >= Duration::from_secs(2));

    // Two throttling retries (503 with Retry-After, 409 in use) cost 5 each; the 201 after
    // them refunds the last retry's 5 (the AWS standard mode's rule).
    assert_eq!(budget.available(), 500 - 5 - 5 + 5);
    assert_eq!(report.budget_left, Some(495));
    Ok(())
}

// clause: idem.client.same-key, idem.client.key-derivation, idem.client.500-with-key
#[tokio::test]
async fn a_caller_key_is_sent_unchanged_on_every_attempt() {
    let (url, script) = serve(vec![answer(500), answer(502), answer(201)]).await;
    let client = client(
        RetryMiddleware::default()
            .with_clock(ManualClock::default())
            .with_seed(1),
    );
    // ANCHOR: caller_key
    let key = derive_key("order-confirm", 8412).expect("valid key");
    // Persist `key` with the order before sending; a restarted process derives the same one.
    let resp = client
        .post(&url)
        .with_extension(key.clone())
        .body("{}")
        .send()
        .await
        .expect("eventually 201");
    // ANCHOR_END: caller_key
    assert_eq!(resp.status().as_u16(), 201);
    let r = report(&resp);
    assert_eq!(r.key.as_ref(), Some(&key));
    assert!(!r.key_minted);
    assert_eq!(
        keys(&script),
        vec![Some("order-confirm-8412".to_owned()); 3]
    );

    // A key set directly as a header is honoured the same way.
    let (url, script) = serve(vec![answer(503), answer(200)]).await;
    let resp = client
        .patch(&url)
        .header(IDEMPOTENCY_KEY, "\"order-confirm-9\"")
        .body("{}")
        .send()
        .await
        .expect("eventually 200");
    assert_eq!(
        report(&resp).key,
        Some(IdempotencyKey::parse("order-confirm-9").expect("valid"))
    );
    assert_eq!(
        keys(&script),
        vec![Some("\"order-confirm-9\"".to_owned()); 2]
    );
}

// clause: idem.client.key-per-operation, idem.client.auto-key
#[tokio::test]
async fn each_logical_operation_gets_its_own_minted_key() {
    let (url, script) = serve(vec![answer(503), answer(201), answer(503), answer(201)]).await;
    let client = client(
        RetryMiddleware::default()
            .with_clock(ManualClock::default())
            .with_seed(3),
    );
    let a = client.post(&url).body("{}").send().await.expect("first");
    let b = client.post(&url).body("{}").send().await.expect("second");
    let (ka, kb) = (report(&a).key.expect("key"), report(&b).key.expect("key"));
    assert_ne!(ka, kb);
    let seen = keys(&script);
    assert_eq!(
        seen,
        vec![
            Some(ka.to_string()),
            Some(ka.to_string()),
            Some(kb.to_string()),
            Some(kb.to_string())
        ]
    );
}

// clause: idem.client.no-key-no-retry
#[tokio::test]
async fn a_post_without_a_key_is_sent_once_when_auto_keys_are_off() {
    let (url, script) = serve(vec![answer(503), answer(201)]).await;
    let client = client(
        RetryMiddleware::default()
            .auto_keys(false)
            .with_clock(ManualClock::default()),
    );
    let resp = client
        .post(&url)
        .body("{}")
        .send()
        .await
        .expect("a response");
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(keys(&script), vec![None]);
    let r = report(&resp);
    assert_eq!(r.stopped, Some(StopReason::NonIdempotentWithoutKey));
    assert_eq!(r.attempts, 1);

    // A GET needs no key and is retried.
    let (url, script) = serve(vec![answer(503), answer(200)]).await;
    let resp = client.get(&url).send().await.expect("a response");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(keys(&script), vec![None, None]);
}

// clause: idem.client.allowlist
#[tokio::test]
async fn a_final_4xx_is_handed_back_after_one_attempt() {
    for (status, code) in [
        (400, Some("validation_failed")),
        (409, Some("idempotency_key_mismatch")),
        (422, None),
    ] {
        let (url, script) = serve(vec![Answer {
            status,
            retry_after: None,
            code,
        }])
        .await;
        let client = client(RetryMiddleware::default().with_clock(ManualClock::default()));
        let resp = client
            .post(&url)
            .body("{}")
            .send()
            .await
            .expect("a response");
        assert_eq!(resp.status().as_u16(), status);
        assert_eq!(keys(&script).len(), 1);
        assert_eq!(
            report(&resp).stopped,
            Some(StopReason::NotRetryable {
                status: Some(status)
            })
        );
        // The body the middleware had to read (for the 409 code) is handed back intact.
        let body = resp.text().await.expect("body");
        if let Some(code) = code {
            assert!(body.contains(code), "{body}");
        }
    }
}

// clause: idem.client.retry-after, idem.client.deadline
#[tokio::test]
async fn a_retry_after_past_the_deadline_hands_back_that_response_at_once() {
    let (url, script) = serve(vec![Answer {
        status: 429,
        retry_after: Some("120"),
        code: Some("rate_limited"),
    }])
    .await;
    let clock = ManualClock::default();
    let client = client(RetryMiddleware::default().with_clock(clock.clone()));
    let resp = client
        .post(&url)
        .with_extension(Deadline::Within(Duration::from_secs(10)))
        .body("{}")
        .send()
        .await
        .expect("the 429 itself, not an error");
    // The caller gets the server's answer, headers and body intact, to decide for itself.
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(
        resp.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"120"[..])
    );
    let r = report(&resp);
    assert_eq!(
        r.stopped,
        Some(StopReason::RetryAfterPastDeadline {
            hint: Duration::from_secs(120),
            remaining: Duration::from_secs(10),
        })
    );
    assert_eq!(r.attempts, 1);
    assert_eq!(
        r.key.as_ref().map(IdempotencyKey::to_string),
        keys(&script)[0].clone()
    );
    let body: serde_json::Value = resp.json().await.expect("the problem body, unread before");
    assert_eq!(body["code"], "rate_limited");
    // No sleep was started: waiting would only have ended past the deadline.
    assert!(clock.sleeps().is_empty());
    assert_eq!(keys(&script).len(), 1);
}

/// An inner middleware that records, for each attempt, the request's own timeout (which the
/// retry middleware must leave alone) and the attempt's timeout it announces.
#[derive(Clone, Default)]
struct RecordTimeouts(Arc<Mutex<Vec<Seen>>>);

/// The request's own timeout and the attempt the retry middleware announced.
type Seen = (Option<Duration>, Option<AttemptInfo>);

#[async_trait::async_trait]
impl Middleware for RecordTimeouts {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut http::Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        self.0.lock().expect("lock").push((
            req.timeout().copied(),
            extensions.get::<AttemptInfo>().copied(),
        ));
        next.run(req, extensions).await
    }
}

// clause: idem.client.deadline
#[tokio::test]
async fn each_attempt_timeout_is_carved_from_one_deadline_without_touching_the_request() {
    let (url, _script) = serve(vec![answer(504), answer(504), answer(200)]).await;
    let clock = ManualClock::default();
    let timeouts = RecordTimeouts::default();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(
            RetryMiddleware::default()
                .with_clock(clock.clone())
                .with_seed(11),
        )
        .with(timeouts.clone())
        .build();
    let resp = client
        .get(&url)
        .with_extension(Deadline::Within(Duration::from_secs(8)))
        .send()
        .await
        .expect("200 on the third attempt");
    assert_eq!(resp.status().as_u16(), 200);
    let s = clock.sleeps();
    assert_eq!(s.len(), 2);
    let d = Duration::from_secs(8);
    let info = |number, timeout| Some(AttemptInfo { number, timeout });
    // The 8 s deadline is shorter than the 10 s attempt timeout, so it is what each attempt
    // gets; the request's own timeout stays unset, so a client timeout would still apply.
    assert_eq!(
        *timeouts.0.lock().expect("lock"),
        vec![
            (None, info(1, d)),
            (None, info(2, d - s[0])),
            (None, info(3, d - s[0] - s[1]))
        ]
    );
    assert_eq!(report(&resp).remaining, d - s[0] - s[1]);

    // A caller's own per-request timeout is passed on unchanged; the attempt timeout is the
    // policy's when it is shorter than what is left of the deadline.
    let (url, _script) = serve(vec![answer(503), answer(200)]).await;
    let timeouts = RecordTimeouts::default();
    let policy = RetryPolicy {
        attempt_timeout: Duration::from_secs(2),
        ..RetryPolicy::default()
    };
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy).with_clock(ManualClock::default()))
        .with(timeouts.clone())
        .build();
    let resp = client
        .get(&url)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .expect("200");
    assert_eq!(resp.status().as_u16(), 200);
    let five = Some(Duration::from_secs(5));
    let two = Duration::from_secs(2);
    assert_eq!(
        *timeouts.0.lock().expect("lock"),
        vec![(five, info(1, two)), (five, info(2, two))]
    );
}

// clause: idem.client.observability
#[tokio::test]
async fn the_hook_sees_every_retry_and_can_veto() {
    let (url, script) = serve(vec![answer(502), answer(429), answer(503), answer(200)]).await;
    let seen: Arc<Mutex<Vec<RetryEvent>>> = Arc::default();
    let log = seen.clone();
    let budget = RetryBudget::default();
    // ANCHOR: on_retry
    let middleware = RetryMiddleware::default()
        .with_shared_budget(budget.clone())
        .with_clock(ManualClock::default())
        .on_retry(move |event: &RetryEvent| {
            log.lock().expect("lock").push(event.clone());
            // Veto the second retry: e.g. the caller's own shutdown is in progress.
            if event.plan.failed_attempt >= 2 {
                HookVerdict::Veto
            } else {
                HookVerdict::Proceed
            }
        });
    // ANCHOR_END: on_retry
    let client = client(middleware);
    let resp = client.get(&url).send().await.expect("a response");
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(report(&resp).stopped, Some(StopReason::Vetoed));
    assert_eq!(keys(&script).len(), 2);
    let events = seen.lock().expect("lock").clone();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].plan.reason, RetryReason::BadGateway);
    assert_eq!(events[0].plan.budget_left, Some(486));
    assert_eq!(events[1].plan.reason, RetryReason::TooManyRequests);
    assert_eq!(events[1].plan.budget_left, Some(481));
    // The vetoed retry's tokens went back.
    assert_eq!(budget.available(), 486);
}

// clause: idem.client.allowlist, idem.client.max-attempts, idem.client.budget
#[tokio::test]
async fn refused_connections_do_not_spend_the_attempt_cap_but_pay_the_budget_up_to_the_send_ceiling()
 {
    // A port that was just free: nothing listens there.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let gave_up = |err: reqwest_middleware::Error| -> (StopReason, u32, bool) {
        let e = idem_client::Error::from_middleware(&err).expect("an idem-client error");
        match e {
            Error::GaveUp {
                reason,
                attempts,
                source,
                ..
            } => (
                reason.clone(),
                *attempts,
                source.reqwest().is_some_and(reqwest::Error::is_connect),
            ),
            other => panic!("expected GaveUp, got {other:?}"),
        }
    };

    // With an hour to spare, the send ceiling (10) is what stops a host that never answers:
    // ten connections refused, none counted against the 3-attempt cap, each retry paid 14.
    let clock = ManualClock::default();
    let budget = RetryBudget::default();
    let long = RetryPolicy {
        deadline: Duration::from_secs(3600),
        ..RetryPolicy::default()
    };
    let client = client(
        RetryMiddleware::new(long)
            .with_shared_budget(budget.clone())
            .with_clock(clock.clone()),
    );
    let err = client
        .put(format!("http://{addr}/orders/1"))
        .body("{}")
        .send()
        .await
        .expect_err("nothing listens");
    assert_eq!(
        gave_up(err),
        (StopReason::SendsExhausted { sends: 10 }, 10, true)
    );
    assert_eq!(clock.sleeps().len(), 9);
    assert_eq!(budget.available(), 500 - 9 * 14);

    // With the default 30 s deadline, refused connections are retried (more than the cap's 3
    // times) until the next sleep would end past the deadline, never beyond it.
    let clock = ManualClock::default();
    let client = self::client(RetryMiddleware::default().with_clock(clock.clone()));
    let err = client
        .put(format!("http://{addr}/orders/1"))
        .body("{}")
        .send()
        .await
        .expect_err("nothing listens");
    let (reason, attempts, connect) = gave_up(err);
    assert!(connect);
    assert!(attempts > 3 && attempts <= 10, "{attempts}");
    match reason {
        StopReason::DeadlineWouldPass { delay, remaining } => assert!(delay >= remaining),
        StopReason::SendsExhausted { sends } => assert_eq!(sends, 10),
        other => panic!("unexpected {other:?}"),
    }
    let slept: Duration = clock.sleeps().iter().sum();
    assert!(slept < Duration::from_secs(30), "{slept:?}");

    // An empty budget stops them: a refused connection is a transient retry (14 tokens).
    let clock = ManualClock::default();
    let poor = RetryBudget::new(idem_client::BudgetConfig {
        capacity: 30,
        ..Default::default()
    });
    let client = self::client(
        RetryMiddleware::default()
            .with_shared_budget(poor.clone())
            .with_clock(clock.clone()),
    );
    let err = client
        .put(format!("http://{addr}/orders/1"))
        .body("{}")
        .send()
        .await
        .expect_err("nothing listens");
    assert_eq!(
        gave_up(err),
        (
            StopReason::BudgetExhausted {
                cost: 14,
                available: 2
            },
            3,
            true
        )
    );

    // Setting the ceiling to the cap counts every request against one cap (the old rule).
    let clock = ManualClock::default();
    let strict = RetryPolicy {
        max_sends: 3,
        ..RetryPolicy::default()
    };
    let keyless = self::client(
        RetryMiddleware::new(strict)
            .auto_keys(false)
            .with_clock(clock.clone()),
    );
    // A refused connection proves the request was never sent, so even a POST without a key
    // (auto keys off) is retried.
    let err = keyless
        .post(format!("http://{addr}/orders"))
        .body("{}")
        .send()
        .await
        .expect_err("nothing listens");
    let e = idem_client::Error::from_middleware(&err).expect("an idem-client error");
    assert_eq!(e.key(), None);
    assert_eq!(
        gave_up(err),
        (StopReason::SendsExhausted { sends: 3 }, 3, true)
    );
    assert_eq!(clock.sleeps().len(), 2);
}

// clause: idem.client.budget
#[tokio::test]
async fn an_empty_shared_budget_stops_retries_across_requests() {
    let (url, script) = serve(vec![answer(502); 8]).await;
    let budget = RetryBudget::new(idem_client::BudgetConfig {
        capacity: 30,
        ..Default::default()
    });
    let client = client(
        RetryMiddleware::default()
            .with_shared_budget(budget.clone())
            .with_clock(ManualClock::default()),
    );
    // First request: two retries (28 tokens). Second: the bucket has 2 left, so none.
    let a = client.get(&url).send().await.expect("response");
    assert_eq!(
        report(&a).stopped,
        Some(StopReason::AttemptsExhausted { attempts: 3 })
    );
    let b = client.get(&url).send().await.expect("response");
    assert_eq!(
        report(&b).stopped,
        Some(StopReason::BudgetExhausted {
            cost: 14,
            available: 2
        })
    );
    assert_eq!(keys(&script).len(), 4);
}

// clause: idem.client.deadline
#[tokio::test]
async fn a_deadline_already_passed_sends_nothing() {
    let (url, script) = serve(vec![answer(200)]).await;
    let clock = ManualClock::default();
    let client = client(RetryMiddleware::default().with_clock(clock.clone()));
    // A deadline handed down from a caller whose own budget is spent.
    let at = idem_client::Clock::now(&clock);
    clock.advance(Duration::from_millis(1));
    let err = client
        .post(&url)
        .with_extension(Deadline::At(at))
        .body("{}")
        .send()
        .await
        .expect_err("no time left");
    let reqwest_middleware::Error::Middleware(e) = err else {
        panic!("expected a middleware error, got {err:?}")
    };
    assert!(
        matches!(
            e.downcast_ref::<Error>(),
            Some(Error::DeadlineExceeded {
                attempt: 1,
                key: Some(_)
            })
        ),
        "{e:?}"
    );
    assert!(keys(&script).is_empty());
}

// clause: idem.client.deadline
#[tokio::test]
async fn a_policy_without_limits_does_not_overflow_the_attempt_timer() {
    let (url, _script) = serve(vec![answer(503), answer(200)]).await;
    let policy = RetryPolicy {
        attempt_timeout: Duration::MAX,
        deadline: Duration::MAX,
        ..RetryPolicy::default()
    };
    let client = client(RetryMiddleware::new(policy).with_clock(ManualClock::default()));
    let resp = client
        .get(&url)
        .send()
        .await
        .expect("200 on the second attempt");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(report(&resp).attempts, 2);
    // The body is still readable through the (far) attempt deadline.
    assert_eq!(resp.text().await.expect("body"), r#"{"id":"ord_1"}"#);
}

// clause: idem.client.budget
#[tokio::test]
async fn a_body_that_can_be_sent_once_is_sent_once_and_costs_no_tokens() {
    let (url, script) = serve(vec![answer(503), answer(201)]).await;
    let budget = RetryBudget::default();
    let client = client(
        RetryMiddleware::default()
            .with_shared_budget(budget.clone())
            .with_clock(ManualClock::default()),
    );
    // A streaming body (here a wrapped String) cannot be cloned for a second attempt.
    let resp = client
        .post(&url)
        .body(reqwest::Body::wrap(String::from(r#"{"sku":"A-1"}"#)))
        .send()
        .await
        .expect("the 503");
    assert_eq!(resp.status().as_u16(), 503);
    let r = report(&resp);
    assert_eq!(r.stopped, Some(StopReason::BodyNotReplayable));
    assert_eq!(r.attempts, 1);
    assert!(r.key.is_some(), "the one attempt still carries a key");
    assert_eq!(keys(&script).len(), 1);
    // The retry the policy would have paid for did not happen: its tokens are back.
    assert_eq!(budget.available(), 500);
}

// clause: idem.client.deadline-header, idem.client.deadline-header-truthful
#[tokio::test]
async fn every_attempt_carries_what_is_left_of_the_deadline() {
    let (url, script) = serve(vec![answer(503), answer(503), answer(201)]).await;
    let clock = ManualClock::default();
    let policy = RetryPolicy {
        deadline: Duration::from_secs(5),
        ..RetryPolicy::default()
    };
    let mw = RetryMiddleware::new(policy)
        .with_clock(clock.clone())
        .with_seed(11);
    let resp = client(mw)
        .post(&url)
        .header(idem_spec::headers::REQUEST_DEADLINE_MS, "999999")
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status().as_u16(), 201);
    let sleeps = clock.sleeps();
    assert_eq!(sleeps.len(), 2);
    // The manual clock moves only by the recorded sleeps: each value is the deadline less
    // the sleeps before that attempt, in whole milliseconds, and the caller's own (false)
    // value is replaced.
    let left = |slept: Duration| (Duration::from_secs(5) - slept).as_millis().to_string();
    let want = vec![
        Some("5000".to_owned()),
        Some(left(sleeps[0])),
        Some(left(sleeps[0] + sleeps[1])),
    ];
    let seen = script.lock().expect("script lock").seen_deadlines.clone();
    assert_eq!(seen, want);
    let values: Vec<u64> = seen
        .iter()
        .map(|v| v.as_deref().unwrap_or("").parse().expect("digits"))
        .collect();
    assert!(values.windows(2).all(|w| w[1] <= w[0]), "{values:?}");
}

// clause: idem.client.deadline-header
#[tokio::test]
async fn the_deadline_header_can_be_turned_off() {
    let (url, script) = serve(vec![answer(201)]).await;
    let mw = RetryMiddleware::default().without_deadline_header();
    let resp = client(mw).post(&url).send().await.expect("sent");
    assert_eq!(resp.status().as_u16(), 201);
    let seen = script.lock().expect("script lock").seen_deadlines.clone();
    assert_eq!(seen, vec![None]);
}
