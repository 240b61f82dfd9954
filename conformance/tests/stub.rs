//! The kit against a small in-test double: an in-memory axum service that
//! keeps the contract (and variants that deliberately break one clause).
//! It makes the kit's own behaviour testable without the reference server;
//! the real proof is `reference_server.rs` and `flaws.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use idem_conformance::server::{manifest, runner};
use idem_spec::report::Verdict;
use idem_spec::{ErrorCode, Fingerprint, IdempotencyKey, Problem, Profile};
use serde_json::{Value, json};

#[derive(Clone, Copy, Default)]
struct Breaks {
    no_marker: bool,
    global_keys: bool,
}

#[derive(Clone)]
enum Entry {
    InFlight(Fingerprint),
    Done {
        fp: Fingerprint,
        status: u16,
        location: String,
        body: Vec<u8>,
        at: u64,
    },
}

#[derive(Default)]
struct St {
    keys: HashMap<(String, String), Entry>,
    transfers: Vec<(String, Value)>,
    now: u64,
    next_id: u64,
}

#[derive(Clone)]
struct App {
    st: Arc<Mutex<St>>,
    breaks: Breaks,
}

const WINDOW: u64 = 86_400;

fn problem(code: ErrorCode, detail: &str) -> Response {
    let p = Problem::new(code, Profile::Reference, detail);
    let mut r = (
        StatusCode::from_u16(p.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        serde_json::to_vec(&p).unwrap_or_default(),
    )
        .into_response();
    r.headers_mut().insert(
        "content-type",
        "application/problem+json".parse().expect("static"),
    );
    r
}

fn stored(status: u16, location: &str, body: Vec<u8>, replay: bool) -> Response {
    let mut r = (StatusCode::from_u16(status).unwrap_or(StatusCode::OK), body).into_response();
    let h = r.headers_mut();
    // The content type follows from the status, so a replay reproduces it.
    let ct = if status >= 400 {
        "application/problem+json"
    } else {
        "application/json"
    };
    h.insert("content-type", ct.parse().expect("static"));
    if !location.is_empty() {
        h.insert("location", location.parse().expect("ascii"));
    }
    if replay {
        h.insert("idempotent-replayed", "true".parse().expect("static"));
    }
    r
}

fn caller(h: &HeaderMap) -> Option<String> {
    match h.get("authorization")?.to_str().ok()? {
        "Bearer ta" => Some("alice".into()),
        "Bearer tb" => Some("bob".into()),
        _ => None,
    }
}

async fn transfers(
    State(app): State<App>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(who) = caller(&headers) else {
        return problem(ErrorCode::Unauthenticated, "no token");
    };
    if method == Method::GET {
        let st = app.st.lock().expect("lock");
        let mine: Vec<&Value> = st
            .transfers
            .iter()
            .filter(|(c, _)| *c == who)
            .map(|(_, t)| t)
            .collect();
        return axum::Json(json!({ "transfers": mine })).into_response();
    }
    let key = match IdempotencyKey::from_header_values(
        headers
            .get_all("idempotency-key")
            .iter()
            .map(|v| v.as_bytes()),
    ) {
        Ok(k) => k,
        Err(idem_spec::Error::KeyMissing) => {
            return problem(ErrorCode::IdempotencyKeyMissing, "missing");
        }
        Err(e) => return problem(ErrorCode::IdempotencyKeyInvalid, &e.to_string()),
    };
    let fp = Fingerprint::compute(
        method.as_str(),
        uri.path_and_query().map_or("/", |p| p.as_str()),
        headers.get("content-type").and_then(|v| v.to_str().ok()),
        &body,
    );
    let scope = if app.breaks.global_keys {
        String::new()
    } else {
        who.clone()
    };
    let slot = (scope, key.as_str().to_owned());
    {
        // The claim: one critical section decides absent → in flight.
        let mut st = app.st.lock().expect("lock");
        let now = st.now;
        match st.keys.get(&slot).cloned() {
            Some(Entry::Done { at, .. }) if now - at > WINDOW => {
                st.keys.insert(slot.clone(), Entry::InFlight(fp));
            }
            Some(Entry::Done { fp: f, .. }) | Some(Entry::InFlight(f)) if f != fp => {
                return problem(ErrorCode::IdempotencyKeyMismatch, "other request");
            }
            Some(Entry::InFlight(_)) => {
                let mut r = problem(ErrorCode::IdempotencyKeyInUse, "in flight");
                r.headers_mut()
                    .insert("retry-after", "1".parse().expect("static"));
                return r;
            }
            Some(Entry::Done {
                status,
                location,
                body,
                ..
            }) => {
                return stored(status, &location, body, !app.breaks.no_marker);
            }
            None => {
                st.keys.insert(slot.clone(), Entry::InFlight(fp));
            }
        }
    }
    // Let concurrent duplicates arrive while this one is in flight.
    tokio::task::yield_now().await;
    let (status, location, out) = if method != Method::POST {
        (
            405,
            String::new(),
            serde_json::to_vec(&Problem::new(
                ErrorCode::MethodNotAllowed,
                Profile::Reference,
                "POST only",
            ))
            .unwrap_or_default(),
        )
    } else {
        match serde_json::from_slice::<Value>(&body) {
            Ok(v) if v["amount"].as_u64().is_some_and(|a| a > 1_000_000) => (
                422,
                String::new(),
                serde_json::to_vec(&Problem::new(
                    ErrorCode::ValidationFailed,
                    Profile::Reference,
                    "insufficient funds",
                ))
                .unwrap_or_default(),
            ),
            Ok(v) => {
                let mut st = app.st.lock().expect("lock");
                st.next_id += 1;
                let id = format!("tr_{}", st.next_id);
                let t = json!({ "id": id, "amount": v["amount"], "memo": v["memo"] });
                st.transfers.push((who.clone(), t.clone()));
                (
                    201,
                    format!("/v1/transfers/{id}"),
                    t.to_string().into_bytes(),
                )
            }
            Err(_) => (
                400,
                String::new(),
                serde_json::to_vec(&Problem::new(
                    ErrorCode::MalformedBody,
                    Profile::Reference,
                    "json",
                ))
                .unwrap_or_default(),
            ),
        }
    };
    let mut st = app.st.lock().expect("lock");
    let at = st.now;
    st.keys.insert(
        slot,
        Entry::Done {
            fp,
            status,
            location: location.clone(),
            body: out.clone(),
            at,
        },
    );
    let mut r = stored(status, &location, out, false);
    if status >= 400 {
        r.headers_mut().insert(
            "content-type",
            "application/problem+json".parse().expect("static"),
        );
    }
    r
}

async fn clock(State(app): State<App>, axum::Json(v): axum::Json<Value>) -> StatusCode {
    app.st.lock().expect("lock").now += v["advance_secs"].as_u64().unwrap_or(0);
    StatusCode::OK
}

async fn serve(breaks: Breaks) -> String {
    let app = App {
        st: Arc::default(),
        breaks,
    };
    let router = axum::Router::new()
        .route("/v1/transfers", any(transfers))
        .route("/_test/clock", post(clock))
        // Refused by the declared Content-Length before the handler (and so
        // before the claim), as idem.failure.before-claim asks.
        .layer(tower_http::limit::RequestBodyLimitLayer::new(64 * 1024))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

fn manifest_for(base: &str) -> manifest::Loaded {
    let text = format!(
        r#"
[target]
name = "stub"
base_url = "{base}"

[[callers]]
name = "alice"
headers = {{ Authorization = "Bearer ta" }}
vars = {{ from = "a1", to = "a2" }}

[[callers]]
name = "bob"
headers = {{ Authorization = "Bearer tb" }}
vars = {{ from = "b1", to = "b2" }}

[[endpoints]]
name = "transfer"
method = "POST"
path = "/v1/transfers"
body = {{ from = "{{{{from}}}}", to = "{{{{to}}}}", amount = "{{{{amount}}}}", memo = "{{{{marker}}}}" }}
rejected_body = {{ from = "{{{{from}}}}", to = "{{{{to}}}}", amount = 999999999, memo = "{{{{marker}}}}" }}

[policy]
in_flight = "conflict"

[probe]
kind = "list"
url = "/v1/transfers"
items_pointer = "/transfers"
match_pointer = "/memo"

[hooks]
clock = {{ url = "/_test/clock" }}

[limits]
requests_per_second = 1000
max_side_effects = 2000
property_sequences = 6
"#
    );
    manifest::parse(&text, "stub").expect("stub manifest")
}

async fn run(breaks: Breaks) -> idem_spec::report::Report {
    let base = serve(breaks).await;
    run_with(manifest_for(&base)).await
}

async fn run_with(loaded: manifest::Loaded) -> idem_spec::report::Report {
    runner::run(
        &loaded,
        &runner::Options {
            seed: Some(42),
            only: None,
            progress: false,
            artifacts_dir: Some(std::env::temp_dir()),
            strict: false,
        },
    )
    .await
    .expect("run")
}

// clause: idem.replay.verbatim, idem.concurrency.single-effect, idem.fingerprint.mismatch, idem.scope.caller, idem.window.expiry, idem.failure.before-claim
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_contract_keeping_double_passes() {
    let r = run(Breaks::default()).await;
    let console = idem_conformance::verdict::report::console::render(&r);
    let bad = r.unsettled_cases();
    assert!(bad.is_empty(), "{bad:?}\n{console}");
    assert_eq!(r.summary.exit_code, 0, "{console}");
    let prefer = r
        .cases
        .iter()
        .find(|c| c.id == "inflight.prefer-wait")
        .expect("case");
    assert_eq!(
        prefer.verdict,
        Verdict::Unsupported,
        "declared conflict-only: not run"
    );
}

// clause: idem.replay.marker
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_double_that_drops_the_marker_fails_idem_replay_marker() {
    let r = run(Breaks {
        no_marker: true,
        ..Breaks::default()
    })
    .await;
    assert!(
        r.summary
            .must_clauses_failed
            .iter()
            .any(|c| c == "idem.replay.marker"),
        "{:?}",
        r.summary
    );
    // The marker is a spelling: the double behaves safely otherwise.
    assert_eq!(r.summary.result, idem_spec::report::Outcome::Deviates);
    assert_eq!(r.summary.exit_code, idem_conformance::EXIT_DEVIATES);
    assert!(r.summary.unsafe_clauses.is_empty(), "{:?}", r.summary);
    assert!(r.headlines.is_empty());
    let v = r
        .cases
        .iter()
        .find(|c| c.id == "replay.verbatim")
        .expect("case");
    assert_eq!(v.verdict, Verdict::Fail);
    let text = idem_conformance::verdict::report::explain(v).join("\n");
    assert!(
        text.contains("idem.replay.marker") && text.contains("curl "),
        "{text}"
    );
    assert!(!text.contains("Bearer ta"), "secrets are redacted:\n{text}");
}

// clause: idem.scope.caller
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_double_with_global_keys_fails_idem_scope_caller() {
    let r = run(Breaks {
        global_keys: true,
        ..Breaks::default()
    })
    .await;
    assert!(
        r.summary
            .must_clauses_failed
            .iter()
            .any(|c| c == "idem.scope.caller"),
        "{:?}",
        r.summary
    );
    let s = r
        .cases
        .iter()
        .find(|c| c.id == "scope.other-caller")
        .expect("case");
    assert_eq!(s.verdict, Verdict::Fail);
    assert_eq!(r.summary.result, idem_spec::report::Outcome::Unsafe);
    assert_eq!(r.summary.exit_code, idem_conformance::EXIT_UNSAFE);
    assert!(
        r.headlines
            .iter()
            .any(|h| h.clause == "idem.scope.caller" && h.text.contains("bob")),
        "the headline names the manifest's callers: {:?}",
        r.headlines
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_run_stops_before_the_side_effect_budget_is_exceeded() {
    let base = serve(Breaks::default()).await;
    let mut loaded = manifest_for(&base);
    loaded.manifest.limits.max_side_effects = 25;
    let r = run_with(loaded).await;
    assert!(
        r.side_effect_requests <= 25,
        "sent {} state-changing requests",
        r.side_effect_requests
    );
    let starved: Vec<&str> = r
        .cases
        .iter()
        .filter(|c| {
            c.verdict == Verdict::Error && c.reason.as_deref().is_some_and(|s| s.contains("budget"))
        })
        .map(|c| c.id.as_str())
        .collect();
    assert!(starved.contains(&"concurrency.gate"), "{starved:?}");
    assert!(
        r.summary.must_clauses_failed.is_empty(),
        "running out of budget is not a target failure"
    );
    assert_eq!(r.summary.exit_code, idem_conformance::EXIT_HARNESS);
}

/// A listing that shows an effect only on its third read: the kit reads a
/// short count again (bounded), and a count that stays short stands.
#[tokio::test]
async fn a_lagging_probe_is_read_again_and_a_short_count_still_stands() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let reads = Arc::new(AtomicU64::new(0));
    let r2 = reads.clone();
    let router = axum::Router::new().route(
        "/count",
        axum::routing::get(move || {
            let n = r2.fetch_add(1, Ordering::SeqCst);
            async move { axum::Json(json!({ "count": u64::from(n >= 2) })) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await });
    let mut loaded = manifest_for(&format!("http://{addr}"));
    loaded.manifest.probe = idem_spec::manifest::EffectProbe::Count {
        url: "/count".into(),
        count_pointer: "/count".into(),
        caller: None,
    };
    loaded.manifest.limits.probe_settle_ms = 1_000;
    let client = runner::client(&loaded).expect("client");
    let ctx = idem_conformance::server::case::Ctx::new(loaded.manifest, client, "run".into(), 1);
    let n = ctx.effects_settled(0, "m", &[], 1).await.expect("probe");
    assert_eq!(n, 1, "read until the listing caught up");
    assert_eq!(reads.load(Ordering::SeqCst), 3);
    // Expecting 2, the count never gets there: it stands after the bound.
    let started = std::time::Instant::now();
    let n = ctx.effects_settled(0, "m", &[], 2).await.expect("probe");
    assert_eq!(n, 1);
    assert!(started.elapsed() >= std::time::Duration::from_secs(1));
    // A count already at what is expected is final at once.
    let before = reads.load(Ordering::SeqCst);
    assert_eq!(ctx.effects_settled(0, "m", &[], 0).await.expect("probe"), 1);
    assert_eq!(reads.load(Ordering::SeqCst), before + 1);
}
