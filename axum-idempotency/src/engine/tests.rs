//! The loop's branches, driven by the scripted store double
//! ([`crate::store::scripted`]): what the engine does when the store says
//! a concurrent request won, the key is busy elsewhere, or the winner is
//! gone again. Each case states the script, then checks the answer, how
//! often the endpoint ran and the store calls in order.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use idem_spec::{Fingerprint, KeyState, RecoveryPoint};

use super::*;
use crate::clock::SystemClock;
use crate::key::Caller;
use crate::store::StoredResponse;
use crate::store::scripted::{Claim, Script, Scripted, Seen, Single};
use crate::tx::IdemTx;

const NOW_SLACK: Millis = 3_600_000;

fn engine(store: &Scripted) -> Engine<Scripted> {
    let config = EngineConfig {
        wait_poll_interval: Duration::from_millis(1),
        ..EngineConfig::default()
    };
    Engine::new(store.clone(), Arc::new(SystemClock), config)
}

fn request(extra: &[(&str, &str)]) -> Request<Body> {
    let mut b = Request::post("/things").header("idempotency-key", "k");
    for (n, v) in extra {
        b = b.header(*n, *v);
    }
    let mut req = b.body(Body::from("{}")).expect("request");
    req.extensions_mut().insert(Caller::new("ann"));
    req
}

fn fingerprint() -> Fingerprint {
    Fingerprint::compute("POST", "/things", None, b"{}")
}

/// The winner's committed record: complete, inside its window.
fn winner() -> KeyRecord {
    let now = SystemClock.now_ms();
    KeyRecord {
        fingerprint: fingerprint(),
        state: KeyState::Complete,
        recovery_point: RecoveryPoint::finished(),
        generation: 1,
        lease_expires_at: None,
        created_at: now,
        replay_until: now + NOW_SLACK,
        expires_at: now + 3 * NOW_SLACK,
        response: Some(StoredResponse {
            status: 201,
            headers: Vec::new(),
            body: b"winner".to_vec(),
        }),
    }
}

fn absent() -> Seen {
    Seen::default()
}

/// An endpoint that notes itself in the store's log, writes through its
/// `IdemTx` when `writes`, and answers `status`; `runs` counts its calls.
#[derive(Clone)]
struct Endpoint {
    store: Scripted,
    runs: Arc<AtomicUsize>,
    writes: bool,
    status: StatusCode,
}

impl Endpoint {
    fn new(store: &Scripted, writes: bool, status: StatusCode) -> Self {
        Self {
            store: store.clone(),
            runs: Arc::default(),
            writes,
            status,
        }
    }

    fn service(
        &self,
    ) -> impl tower::Service<
        Request<Body>,
        Response = Response<Body>,
        Error = Infallible,
        Future = impl Send,
    > + Send {
        let this = self.clone();
        tower::service_fn(move |req: Request<Body>| {
            let this = this.clone();
            async move {
                this.runs.fetch_add(1, Ordering::SeqCst);
                this.store.note("endpoint");
                if this.writes {
                    let tx = req
                        .extensions()
                        .get::<IdemTx<Scripted>>()
                        .cloned()
                        .expect("the engine hands the endpoint its IdemTx");
                    let guard = tx.lock().await.expect("lock");
                    this.store.note(format!("write #{}", guard.0));
                }
                let mut response = Response::new(Body::from("mine"));
                *response.status_mut() = this.status;
                Ok::<_, Infallible>(response)
            }
        })
    }
}

/// Serves one request (with `extra` headers) through `endpoint` on an
/// engine over `store`.
async fn serve(store: &Scripted, endpoint: &Endpoint, extra: &[(&str, &str)]) -> Response<Body> {
    engine(store)
        .handle(request(extra), endpoint.service(), &[])
        .await
}

async fn body(response: Response<Body>) -> Vec<u8> {
    axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body")
        .to_vec()
}

fn log(store: &Scripted) -> Vec<String> {
    store.script().log.clone()
}

fn script(store: &Scripted, set: impl FnOnce(&mut Script)) {
    set(&mut store.script());
}

// clause: idem.claim.transactional, idem.concurrency.single-effect
#[tokio::test]
async fn a_deferred_transaction_opens_at_the_endpoints_first_write_and_commits_with_the_record() {
    let store = Scripted::default();
    script(&store, |s| {
        s.seen.push_back(absent());
        s.finals.push_back(Some(1));
    });
    let endpoint = Endpoint::new(&store, true, StatusCode::CREATED);
    let response = serve(&store, &endpoint, &[]).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(body(response).await, b"mine");
    assert_eq!(
        log(&store),
        [
            "observe",
            "begin_single",
            "endpoint",
            "begin #1",
            "write #1",
            "record_final #1",
            "commit #1"
        ],
        "nothing is opened before the endpoint asks"
    );
}

// clause: idem.claim.transactional
#[tokio::test]
async fn an_endpoint_that_writes_nothing_records_its_outcome_in_a_transaction_of_its_own() {
    let store = Scripted::default();
    script(&store, |s| {
        s.seen.push_back(absent());
        s.finals.push_back(Some(1));
    });
    let endpoint = Endpoint::new(&store, false, StatusCode::UNPROCESSABLE_ENTITY);
    let response = serve(&store, &endpoint, &[]).await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        log(&store),
        [
            "observe",
            "begin_single",
            "endpoint",
            "begin #1",
            "record_final #1",
            "commit #1"
        ]
    );
}

// clause: idem.concurrency.single-effect, idem.claim.atomic
#[tokio::test]
async fn a_lost_final_write_rolls_back_and_answers_from_the_winners_record() {
    let store = Scripted::default();
    script(&store, |s| {
        s.seen.push_back(absent());
        s.seen.push_back(Seen {
            record: Some(winner()),
            ..Seen::default()
        });
        s.finals.push_back(None);
    });
    let endpoint = Endpoint::new(&store, true, StatusCode::CREATED);
    let response = serve(&store, &endpoint, &[]).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(
        response
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(b"true".as_slice())
    );
    assert_eq!(body(response).await, b"winner", "the winner's body");
    assert_eq!(endpoint.runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        log(&store),
        [
            "observe",
            "begin_single",
            "endpoint",
            "begin #1",
            "write #1",
            "record_final #1",
            "rollback #1",
            "observe"
        ],
        "the loser's writes roll back; nothing commits"
    );
}

// clause: idem.concurrency.single-effect
#[tokio::test]
// No record holds the key when the loser looks again (the winner's was
// reaped, or on Galera the loser lost to another key's transaction), so it is
// not "in use": the answer is the store's retryable conflict.
async fn a_loser_whose_winner_is_gone_again_answers_a_retryable_503_and_never_runs_twice() {
    let store = Scripted::default();
    script(&store, |s| {
        s.seen.push_back(absent());
        s.seen.push_back(absent());
        s.finals.push_back(None);
        s.single.push_back(Single::Deferred);
        s.single.push_back(Single::Open);
    });
    let endpoint = Endpoint::new(&store, true, StatusCode::CREATED);
    let response = serve(&store, &endpoint, &[]).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(endpoint.runs.load(Ordering::SeqCst), 1, "ran once only");
    let log = log(&store);
    assert_eq!(
        &log[log.len() - 3..],
        ["begin_single", "begin #2", "rollback #2"],
        "the second claim's transaction is rolled back unused: {log:?}"
    );
}

// clause: idem.inflight.conflict
#[tokio::test]
async fn a_key_busy_elsewhere_is_answered_409_without_a_transaction() {
    let store = Scripted::default();
    script(&store, |s| {
        s.seen.push_back(Seen {
            busy: true,
            ..Seen::default()
        });
    });
    let endpoint = Endpoint::new(&store, true, StatusCode::CREATED);
    let response = serve(&store, &endpoint, &[]).await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(endpoint.runs.load(Ordering::SeqCst), 0);
    assert_eq!(log(&store), ["observe"]);
}

// clause: idem.inflight.conflict
#[tokio::test]
async fn busy_at_the_claim_is_decided_at_once_without_observing_again() {
    let store = Scripted::default();
    script(&store, |s| {
        s.seen.push_back(absent());
        s.single.push_back(Single::Busy);
    });
    let endpoint = Endpoint::new(&store, true, StatusCode::CREATED);
    let response = serve(&store, &endpoint, &[]).await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(endpoint.runs.load(Ordering::SeqCst), 0);
    assert_eq!(log(&store), ["observe", "begin_single"]);
}

// clause: idem.failure.5xx-not-stored
#[tokio::test]
async fn a_server_error_rolls_the_endpoints_writes_back_and_records_nothing() {
    let store = Scripted::default();
    script(&store, |s| {
        s.seen.push_back(Seen {
            open: true,
            ..Seen::default()
        });
    });
    let endpoint = Endpoint::new(&store, true, StatusCode::INTERNAL_SERVER_ERROR);
    let response = serve(&store, &endpoint, &[]).await;
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        log(&store),
        ["observe", "begin #1", "endpoint", "write #1", "rollback #1"],
        "the observation's open transaction is the one written in, and rolled back"
    );
}

// clause: idem.inflight.prefer-wait
#[tokio::test]
async fn a_waiting_duplicate_replays_once_the_key_completes_and_says_it_waited() {
    let store = Scripted::default();
    script(&store, |s| {
        s.seen.push_back(Seen {
            busy: true,
            ..Seen::default()
        });
        s.seen.push_back(Seen {
            record: Some(winner()),
            ..Seen::default()
        });
    });
    let endpoint = Endpoint::new(&store, true, StatusCode::CREATED);
    let response = serve(&store, &endpoint, &[("prefer", "wait=5")]).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(
        response
            .headers()
            .get("preference-applied")
            .map(|v| v.as_bytes()),
        Some(b"wait=5".as_slice())
    );
    assert_eq!(body(response).await, b"winner");
    assert_eq!(endpoint.runs.load(Ordering::SeqCst), 0);
    assert_eq!(log(&store), ["observe", "observe"]);
}

/// A multi-step endpoint that finishes in its first phase.
#[derive(Clone)]
struct OnePhase;

/// [`OnePhase`]'s only point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Started;

impl crate::multistep::Points for Started {
    const ALL: &'static [Self] = &[Started];
    fn name(self) -> &'static str {
        RecoveryPoint::STARTED
    }
}

impl crate::multistep::MultiStep<Scripted> for OnePhase {
    type Error = Error;
    type Point = Started;

    async fn phase(
        &self,
        _from: Started,
        _p: &mut crate::multistep::Phase<'_, Scripted>,
    ) -> std::result::Result<crate::multistep::Next<Started>, Error> {
        Ok(crate::multistep::Next::Finish(
            (StatusCode::CREATED, "phased").into_response(),
        ))
    }
}

use axum::response::IntoResponse;

// clause: idem.claim.atomic
#[tokio::test]
async fn claim_races_are_bounded_and_end_in_a_retryable_409() {
    let store = Scripted::default();
    script(&store, |s| {
        for _ in 0..=MAX_RACES {
            s.seen.push_back(absent());
            s.claims.push_back(Claim::Taken);
        }
    });
    let endpoint =
        crate::multistep::MultiStepEndpoint::new(engine(&store), "POST", "/things", OnePhase);
    let response = endpoint.handle(request(&[])).await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let claims = log(&store).iter().filter(|c| *c == "claim").count();
    assert_eq!(claims, usize::try_from(MAX_RACES).expect("small") + 1);
    assert!(store.script().seen.is_empty() && store.script().claims.is_empty());
}

// clause: idem.inflight.conflict
#[tokio::test]
async fn a_multistep_claim_that_finds_the_key_busy_answers_409_at_once() {
    let store = Scripted::default();
    script(&store, |s| {
        s.seen.push_back(absent());
        s.claims.push_back(Claim::Busy);
    });
    let endpoint =
        crate::multistep::MultiStepEndpoint::new(engine(&store), "POST", "/things", OnePhase);
    let response = endpoint.handle(request(&[])).await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(log(&store), ["lookup", "claim"]);
}

// clause: idem.multistep.phases
#[tokio::test]
async fn a_multistep_claim_runs_its_phase_in_the_claims_transaction() {
    let store = Scripted::default();
    script(&store, |s| {
        s.seen.push_back(absent());
        s.claims.push_back(Claim::Claimed);
    });
    let endpoint =
        crate::multistep::MultiStepEndpoint::new(engine(&store), "POST", "/things", OnePhase);
    let response = endpoint.handle(request(&[])).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(
        log(&store),
        [
            "lookup",
            "claim",
            "begin #1",
            "write_fenced #1",
            "commit #1"
        ]
    );
}
