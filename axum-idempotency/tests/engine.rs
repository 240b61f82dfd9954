//! The engine end to end through its layer, on both stores: an app built
//! the way the crate docs say, with a handler the test controls.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use axum_idempotency::clock::{Clock, SystemClock};
use axum_idempotency::failpoint::Failpoints;
use axum_idempotency::store::{
    ClaimRequest, KeyStore, StoredHeader, StoredRequest, StoredResponse,
};
use axum_idempotency::{
    Caller, Engine, EngineConfig, IdemTx, IdempotencyLayer, KeySource, Store, with_conn,
};
use idem_test_support::{Backend, TestDb, both, db};
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// The handler's controls: how many times it ran, a gate it waits on when
/// `hold` is set, and the status it answers (from the body).
#[derive(Clone)]
struct Ctl {
    runs: Arc<AtomicUsize>,
    hold: Arc<std::sync::atomic::AtomicBool>,
    entered: Arc<Semaphore>,
    release: Arc<Semaphore>,
}

impl Default for Ctl {
    fn default() -> Self {
        Self {
            runs: Arc::default(),
            hold: Arc::default(),
            entered: Arc::new(Semaphore::new(0)),
            release: Arc::new(Semaphore::new(0)),
        }
    }
}

async fn handler(
    State(ctl): State<Ctl>,
    tx: IdemTx<Store>,
    caller: Caller,
    Json(status): Json<u16>,
) -> Result<(StatusCode, String), axum_idempotency::Error> {
    let n = ctl.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let mut tx = tx.lock().await?;
    with_conn!(&mut *tx, c => {
        sqlx::query(&axum_idempotency::store::sql(&*c, "INSERT INTO effects (owner, n) VALUES ($1, $2)"))
            .bind(caller.as_str())
            .bind(i64::try_from(n).unwrap())
            .execute(&mut *c)
            .await?;
    });
    drop(tx);
    if ctl.hold.load(Ordering::SeqCst) {
        ctl.entered.add_permits(1);
        ctl.release.acquire().await.unwrap().forget();
    }
    Ok((StatusCode::from_u16(status).unwrap(), format!("run {n}")))
}

/// [`handler`] for a JSON event whose `status` member is the answer's.
async fn event(
    ctl: State<Ctl>,
    tx: IdemTx<Store>,
    caller: Caller,
    Json(event): Json<serde_json::Value>,
) -> Result<(StatusCode, String), axum_idempotency::Error> {
    let status = event["status"]
        .as_u64()
        .and_then(|s| u16::try_from(s).ok())
        .unwrap_or(201);
    handler(ctl, tx, caller, Json(status)).await
}

/// Writes one effect, then answers 201 with a body of the requested size
/// and the headers a real handler sets: its own, repeated ones, caching,
/// hop-by-hop and per-response ones.
async fn rich(
    tx: IdemTx<Store>,
    caller: Caller,
    Json(size): Json<usize>,
) -> Result<(StatusCode, axum::http::HeaderMap, String), axum_idempotency::Error> {
    let mut tx = tx.lock().await?;
    with_conn!(&mut *tx, c => {
        sqlx::query(&axum_idempotency::store::sql(&*c, "INSERT INTO effects (owner, n) VALUES ($1, 1)"))
            .bind(caller.as_str())
            .execute(&mut *c)
            .await?;
    });
    drop(tx);
    let mut headers = axum::http::HeaderMap::new();
    for (name, value) in [
        ("x-request-cost", "7"),
        ("x-multi", "a"),
        ("x-multi", "b"),
        ("cache-control", "no-store"),
        ("location", "/things/1"),
        ("link", "</things/1/receipt>; rel=\"receipt\""),
        ("x-declared-date", "Wed, 02 Dec 2026 06:00:00 GMT"),
        ("date", "Wed, 02 Dec 2026 06:00:00 GMT"),
        ("set-cookie", "session=first"),
        ("connection", "close"),
    ] {
        headers.append(
            axum::http::HeaderName::from_static(name),
            axum::http::HeaderValue::from_static(value),
        );
    }
    Ok((StatusCode::CREATED, headers, "x".repeat(size)))
}

struct App {
    router: Router,
    store: Store,
    ctl: Ctl,
    _db: TestDb,
}

async fn app(db: TestDb, failpoints: bool) -> App {
    let store = Store::connect(&db.url, 4).await.unwrap();
    store.migrate().await.unwrap();
    axum_idempotency::with_pool!(&store, p => {
        sqlx::query("CREATE TABLE effects (owner TEXT NOT NULL, n BIGINT NOT NULL)")
            .execute(p)
            .await
            .unwrap();
    });
    let ctl = Ctl::default();
    let router = router(&store, &ctl, failpoints);
    App {
        router,
        store,
        ctl,
        _db: db,
    }
}

/// The app's router on a new [`Engine`] over `store`: a second one on the
/// same store has its own in-flight registry, like another process.
fn router(store: &Store, ctl: &Ctl, failpoints: bool) -> Router {
    let mut engine = Engine::new(
        store.clone(),
        Arc::new(SystemClock),
        EngineConfig::default(),
    );
    if failpoints {
        engine = engine.with_failpoints(Arc::new(Failpoints::new(Duration::from_secs(5))));
    }
    Router::new()
        .route(
            "/rich",
            post(rich)
                .layer(IdempotencyLayer::new(engine.clone()).replay_header("x-declared-date")),
        )
        .route(
            "/event",
            post(event).layer(
                IdempotencyLayer::new(engine.clone())
                    .key_source(KeySource::BodyPointer("/id".into())),
            ),
        )
        .route(
            "/hooked",
            post(handler).layer(IdempotencyLayer::new(engine.clone()).key_source(
                KeySource::Header(axum::http::HeaderName::from_static("webhook-id")),
            )),
        )
        .route("/do", post(handler).layer(IdempotencyLayer::new(engine)))
        .layer(axum::middleware::from_fn(
            |mut req: Request<Body>, next: axum::middleware::Next| async move {
                if let Some(user) = req.headers().get("x-user").and_then(|v| v.to_str().ok()) {
                    let caller = Caller::new(user);
                    req.extensions_mut().insert(caller);
                }
                next.run(req).await
            },
        ))
        .with_state(ctl.clone())
}

fn req(key: Option<&str>, status: u16, extra: &[(&str, &str)]) -> Request<Body> {
    req_as("ann", key, status, extra)
}

fn req_as(user: &str, key: Option<&str>, status: u16, extra: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::post("/do")
        .header("x-user", user)
        .header("content-type", "application/json");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    for (k, v) in extra {
        b = b.header(*k, *v);
    }
    b.body(Body::from(status.to_string())).unwrap()
}

async fn send(app: &App, r: Request<Body>) -> (StatusCode, axum::http::HeaderMap, String) {
    let resp = app.router.clone().oneshot(r).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

async fn effects(app: &App) -> i64 {
    axum_idempotency::with_pool!(&app.store, p => {
        sqlx::query_scalar("SELECT count(*) FROM effects").fetch_one(p).await.unwrap()
    })
}

// clause: idem.replay.verbatim, idem.replay.marker, idem.failure.final-outcomes, idem.fingerprint.mismatch
async fn finals_are_replayed_and_another_request_is_refused(b: Backend) {
    let app = app(db!(b, "engine-replay"), false).await;
    for (key, status) in [("ok", 201), ("client-error", 422)] {
        let first = send(&app, req(Some(key), status, &[])).await;
        assert_eq!(first.0.as_u16(), status);
        let again = send(&app, req(Some(key), status, &[])).await;
        assert_eq!(
            (again.0, &again.2),
            (first.0, &first.2),
            "{key}: the same answer"
        );
        assert_eq!(again.1["idempotent-replayed"], "true");
        let other = send(&app, req(Some(key), 200, &[])).await;
        assert_eq!(other.0, StatusCode::CONFLICT, "{key}: another request");
    }
    assert_eq!(app.ctl.runs.load(Ordering::SeqCst), 2);
    assert_eq!(effects(&app).await, 2);
}
both!(finals_are_replayed_and_another_request_is_refused);

// clause: idem.failure.5xx-not-stored
async fn a_5xx_rolls_back_and_frees_the_key(b: Backend) {
    let app = app(db!(b, "engine-5xx"), false).await;
    assert_eq!(
        send(&app, req(Some("k"), 503, &[])).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(effects(&app).await, 0, "the handler's write rolled back");
    let retry = send(&app, req(Some("k"), 201, &[])).await;
    assert_eq!(retry.0, StatusCode::CREATED);
    assert!(
        !retry.1.contains_key("idempotent-replayed"),
        "executed again"
    );
    assert_eq!(effects(&app).await, 1);
}
both!(a_5xx_rolls_back_and_frees_the_key);

// clause: idem.failure.unclaimed, idem.key.required, idem.scope.caller
async fn rejections_before_the_claim_touch_nothing(b: Backend) {
    let app = app(db!(b, "engine-reject"), false).await;
    assert_eq!(
        send(&app, req(None, 201, &[])).await.0,
        StatusCode::BAD_REQUEST
    );
    let anonymous = Request::post("/do")
        .header("idempotency-key", "k")
        .header("content-type", "application/json")
        .body(Body::from("201"))
        .unwrap();
    assert_eq!(send(&app, anonymous).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(app.ctl.runs.load(Ordering::SeqCst), 0);
}
both!(rejections_before_the_claim_touch_nothing);

// clause: idem.inflight.conflict, idem.inflight.retry-after, idem.inflight.prefer-wait
async fn a_duplicate_in_flight_is_409_or_waits_for_the_replay(b: Backend) {
    let app = Arc::new(app(db!(b, "engine-inflight"), false).await);
    app.ctl.hold.store(true, Ordering::SeqCst);
    let original = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, req(Some("k"), 201, &[])).await })
    };
    app.ctl.entered.acquire().await.unwrap().forget();
    let dup = send(&app, req(Some("k"), 201, &[])).await;
    assert_eq!(dup.0, StatusCode::CONFLICT);
    assert!(dup.1.contains_key("retry-after"));
    let waiter = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, req(Some("k"), 201, &[("prefer", "wait=10")])).await })
    };
    app.ctl.release.add_permits(1);
    let (first, waited) = (original.await.unwrap(), waiter.await.unwrap());
    assert_eq!(first.0, StatusCode::CREATED);
    assert_eq!(
        (waited.0, &waited.2),
        (first.0, &first.2),
        "the waiter got the replay"
    );
    assert_eq!(app.ctl.runs.load(Ordering::SeqCst), 1);
}
both!(a_duplicate_in_flight_is_409_or_waits_for_the_replay);

/// An application that never opted in to failpoints cannot be made to fail
/// by a client that sends the header.
#[tokio::test]
async fn the_failpoint_header_does_nothing_without_the_opt_in() {
    let app = app(db!(Backend::Sqlite, "engine-fp-off"), false).await;
    let r = send(
        &app,
        req(Some("k"), 201, &[("idem-failpoint", "error-after=started")]),
    )
    .await;
    assert_eq!(r.0, StatusCode::CREATED, "{}", r.2);
    // Not even parsed: a malformed value is no 400 either.
    let r = send(&app, req(Some("k2"), 201, &[("idem-failpoint", "explode")])).await;
    assert_eq!(r.0, StatusCode::CREATED);
    assert_eq!(app.ctl.runs.load(Ordering::SeqCst), 2);
}

// clause: idem.failure.5xx-not-stored
#[tokio::test]
async fn with_the_opt_in_an_injected_error_is_a_5xx_that_frees_the_key() {
    let app = app(db!(Backend::Sqlite, "engine-fp-on"), true).await;
    let r = send(
        &app,
        req(Some("k"), 201, &[("idem-failpoint", "error-after=started")]),
    )
    .await;
    assert_eq!(r.0, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        app.ctl.runs.load(Ordering::SeqCst),
        0,
        "the handler never ran"
    );
    let bad = send(&app, req(Some("k"), 201, &[("idem-failpoint", "explode")])).await;
    assert_eq!(
        bad.0,
        StatusCode::UNPROCESSABLE_ENTITY,
        "refused before the claim"
    );
    assert_eq!(
        send(&app, req(Some("k"), 201, &[])).await.0,
        StatusCode::CREATED
    );
}

// clause: idem.concurrency.single-effect, idem.claim.atomic, idem.inflight.conflict
async fn concurrent_first_requests_on_two_engines_execute_once(b: Backend) {
    // Two engines on one database (two in-flight registries: two processes
    // as far as the store can tell), many identical first requests per key
    // at once, alternating between them. The single-phase protocol claims
    // and records at the end of the transaction, so requests that all saw
    // the key absent race to the final write: exactly one effect per key,
    // and every other answer a 409 in use or the winner's response byte for
    // byte (a loser whose endpoint ran rolls back and replays).
    let app = Arc::new(app(db!(b, "engine-race"), false).await);
    let other = router(&app.store, &app.ctl, false);
    const KEYS: usize = 8;
    const COPIES: usize = 12;
    let mut tasks = Vec::new();
    for k in 0..KEYS {
        for i in 0..COPIES {
            let router = if i % 2 == 0 {
                app.router.clone()
            } else {
                other.clone()
            };
            tasks.push(tokio::spawn(async move {
                let user = format!("ann-{k}");
                let resp = router
                    .oneshot(req_as(&user, Some("same"), 201, &[]))
                    .await
                    .unwrap();
                let (parts, body) = resp.into_parts();
                let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
                (k, parts.status, parts.headers, body)
            }));
        }
    }
    let mut answers: Vec<Vec<_>> = (0..KEYS).map(|_| Vec::new()).collect();
    for t in tasks {
        let (k, status, headers, body) = tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .unwrap()
            .unwrap();
        answers[k].push((status, headers, body));
    }
    for (k, answers) in answers.iter().enumerate() {
        let user = format!("ann-{k}");
        let n: i64 = axum_idempotency::with_pool!(&app.store, p => {
            sqlx::query_scalar(&axum_idempotency::store::sql(p, "SELECT count(*) FROM effects WHERE owner = $1"))
                .bind(&user)
                .fetch_one(p)
                .await
                .unwrap()
        });
        assert_eq!(n, 1, "{user}: exactly one effect");
        let firsts: Vec<_> = answers
            .iter()
            .filter(|(s, h, _)| *s == StatusCode::CREATED && !h.contains_key("idempotent-replayed"))
            .collect();
        assert_eq!(firsts.len(), 1, "{user}: one first execution answered");
        let first = &firsts[0].2;
        for (status, headers, body) in answers {
            match *status {
                StatusCode::CREATED => assert_eq!(body, first, "{user}: replay byte for byte"),
                StatusCode::CONFLICT => {
                    assert!(headers.contains_key("retry-after"));
                    let text = String::from_utf8_lossy(body);
                    assert!(text.contains("idempotency_key_in_use"), "{user}: {text}");
                }
                other => panic!("{user}: unexpected {other}"),
            }
        }
    }
}
both!(concurrent_first_requests_on_two_engines_execute_once);

// clause: idem.concurrency.single-effect, idem.claim.transactional
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_request_that_loses_its_final_write_replays_the_winner_and_writes_nothing() {
    // The protocol's race on PostgreSQL: a transaction that committed the
    // key's record between our observation's snapshot and its advisory
    // lock. Our request then holds the lock, saw nothing, runs its endpoint
    // and loses at the final claim-and-record. Made deterministic by
    // committing the winner's record (on a transaction of its own, without
    // the lock, which our request holds) while our endpoint runs.
    let Some(db) = TestDb::new(Backend::Postgres, "engine-final-lost").await else {
        return;
    };
    let app = Arc::new(app(db, false).await);
    app.ctl.hold.store(true, Ordering::SeqCst);
    let ours = {
        let app = app.clone();
        tokio::spawn(async move { send(&app, req(Some("k"), 201, &[])).await })
    };
    app.ctl.entered.acquire().await.unwrap().forget();
    let id = axum_idempotency::KeyId::new(
        Caller::new("ann"),
        axum_idempotency::IdempotencyKey::parse("k").unwrap(),
    );
    let fingerprint =
        axum_idempotency::Fingerprint::compute("POST", "/do", Some("application/json"), b"201");
    let request = StoredRequest {
        method: "POST".into(),
        path: "/do".into(),
        content_type: Some("application/json".into()),
        body: axum::body::Bytes::from_static(b"201"),
    };
    let now = SystemClock.now_ms();
    let winner = ClaimRequest {
        id: &id,
        fingerprint: &fingerprint,
        request: &request,
        now,
        lease_expires_at: now + 60_000,
        replay_until: now + 3_600_000,
        expires_at: now + 7_200_000,
    };
    let theirs = StoredResponse {
        status: 201,
        headers: vec![StoredHeader::new(
            "content-type",
            b"text/plain; charset=utf-8",
        )],
        body: b"the winner".to_vec(),
    };
    let mut tx = app.store.begin().await.unwrap();
    assert!(
        app.store
            .record_final(&mut tx, &winner, &theirs, now)
            .await
            .unwrap()
            .is_some()
    );
    app.store.commit(tx).await.unwrap();
    app.ctl.release.add_permits(1);
    let (status, headers, body) = tokio::time::timeout(Duration::from_secs(30), ours)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((status, body.as_str()), (StatusCode::CREATED, "the winner"));
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(app.ctl.runs.load(Ordering::SeqCst), 1, "our endpoint ran");
    assert_eq!(effects(&app).await, 0, "and its write was rolled back");
}

fn rich_req(key: &str, size: usize) -> Request<Body> {
    Request::post("/rich")
        .header("x-user", "ann")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Body::from(size.to_string()))
        .unwrap()
}

fn values<'a>(headers: &'a axum::http::HeaderMap, name: &str) -> Vec<&'a [u8]> {
    headers.get_all(name).iter().map(|v| v.as_bytes()).collect()
}

// clause: idem.replay.verbatim
async fn a_replay_carries_every_header_the_handler_set_but_hop_by_hop_and_per_response_ones(
    b: Backend,
) {
    let app = app(db!(b, "engine-headers"), false).await;
    let first = send(&app, rich_req("h", 10)).await;
    assert_eq!(first.0, StatusCode::CREATED);
    let again = send(&app, rich_req("h", 10)).await;
    assert_eq!((again.0, &again.2), (first.0, &first.2));
    assert_eq!(again.1["idempotent-replayed"], "true");
    for name in [
        "content-type",
        "x-request-cost",
        "x-multi",
        "cache-control",
        "location",
        "link",
        "x-declared-date",
    ] {
        assert!(
            !values(&first.1, name).is_empty(),
            "{name} set by the handler"
        );
        assert_eq!(
            values(&again.1, name),
            values(&first.1, name),
            "{name} replayed as the handler set it"
        );
    }
    // Content-Length, where the router adds one, is the stored body's.
    for length in values(&again.1, "content-length") {
        assert_eq!(length, again.2.len().to_string().as_bytes());
    }
    for name in ["date", "set-cookie", "connection"] {
        assert!(
            values(&again.1, name).is_empty(),
            "{name} is not replayed: {:?}",
            values(&again.1, name)
        );
    }
    assert_eq!(effects(&app).await, 1);
}
both!(a_replay_carries_every_header_the_handler_set_but_hop_by_hop_and_per_response_ones);

// clause: idem.failure.5xx-not-stored
async fn a_response_over_max_response_bytes_is_a_500_naming_the_setting_and_frees_the_key(
    b: Backend,
) {
    let app = app(db!(b, "engine-oversize"), false).await;
    let limit = EngineConfig::default().max_response_bytes;
    let over = send(&app, rich_req("big", limit + 1)).await;
    assert_eq!(over.0, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(over.1["content-type"], "application/problem+json");
    let problem: serde_json::Value = serde_json::from_str(&over.2).unwrap();
    assert_eq!(problem["code"], "internal_error");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("EngineConfig::max_response_bytes") && detail.contains(&limit.to_string()),
        "the detail names the setting and its value: {detail}"
    );
    assert_eq!(effects(&app).await, 0, "the handler's write rolled back");
    // Nothing stored: the same key runs again, and a body at the limit is
    // stored and replayed.
    let at_limit = send(&app, rich_req("big", limit)).await;
    assert_eq!(at_limit.0, StatusCode::CREATED, "the key was free again");
    assert!(!at_limit.1.contains_key("idempotent-replayed"));
    assert_eq!(at_limit.2.len(), limit);
    let replay = send(&app, rich_req("big", limit)).await;
    assert_eq!(replay.1["idempotent-replayed"], "true");
    assert_eq!(replay.2, at_limit.2);
    assert_eq!(effects(&app).await, 1);
}
both!(a_response_over_max_response_bytes_is_a_500_naming_the_setting_and_frees_the_key);

fn post_to(path: &str, body: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::post(path)
        .header("x-user", "ann")
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Body::from(body.to_owned())).unwrap()
}

// clause: idem.key.header, idem.replay.verbatim, idem.scope.caller
async fn a_key_from_a_webhook_header_or_the_body_is_a_key_like_any_other(b: Backend) {
    let app = app(db!(b, "engine-key-source"), false).await;
    // The event id in the body: one effect however often it comes, and the
    // Idempotency-Key header, which this route does not read, changes nothing.
    let body = r#"{"id":"evt_1","status":201}"#;
    let first = send(&app, post_to("/event", body, &[("idempotency-key", "a")])).await;
    assert_eq!(first.0, StatusCode::CREATED, "{first:?}");
    let again = send(&app, post_to("/event", body, &[("idempotency-key", "b")])).await;
    assert_eq!(again.0, StatusCode::CREATED);
    assert_eq!(again.1.get("idempotent-replayed").unwrap(), "true");
    assert_eq!(again.2, first.2);
    assert_eq!(effects(&app).await, 1);
    // A number is its decimal text; the same id with another payload is a
    // mismatch (the fingerprint still applies).
    let n = send(&app, post_to("/event", r#"{"id":42,"status":201}"#, &[])).await;
    assert_eq!(n.0, StatusCode::CREATED);
    let other = send(&app, post_to("/event", r#"{"id":42,"status":202}"#, &[])).await;
    assert_eq!(other.0, StatusCode::CONFLICT, "{other:?}");
    assert!(other.2.contains("idempotency_key_mismatch"));
    // No id: the contract's missing-key answer, saying where the key was looked for.
    let missing = send(&app, post_to("/event", r#"{"status":201}"#, &[])).await;
    assert_eq!(missing.0, StatusCode::BAD_REQUEST);
    assert!(
        missing.2.contains("idempotency_key_missing"),
        "{}",
        missing.2
    );
    assert!(missing.2.contains("the JSON body at /id"), "{}", missing.2);
    assert_eq!(effects(&app).await, 2);

    // The sender's own header.
    let h = [("webhook-id", "msg_1")];
    let first = send(&app, post_to("/hooked", "201", &h)).await;
    assert_eq!(first.0, StatusCode::CREATED);
    let again = send(&app, post_to("/hooked", "201", &h)).await;
    assert_eq!(again.1.get("idempotent-replayed").unwrap(), "true");
    assert_eq!(effects(&app).await, 3);
    let missing = send(&app, post_to("/hooked", "201", &[("idempotency-key", "x")])).await;
    assert_eq!(missing.0, StatusCode::BAD_REQUEST);
    assert!(missing.2.contains("the webhook-id header"), "{}", missing.2);
    // Keys are scoped to the caller whatever their source.
    let bob = Request::post("/hooked")
        .header("x-user", "bob")
        .header("content-type", "application/json")
        .header("webhook-id", "msg_1")
        .body(Body::from("201"))
        .unwrap();
    let bob = send(&app, bob).await;
    assert_eq!(bob.0, StatusCode::CREATED);
    assert!(
        bob.1.get("idempotent-replayed").is_none(),
        "bob's own request"
    );
    assert_eq!(effects(&app).await, 4);
}
both!(a_key_from_a_webhook_header_or_the_body_is_a_key_like_any_other);
