//! Bad input gets a clear problem and changes nothing; no input panics the
//! server (a proptest drives the router with arbitrary headers and bodies).
#![allow(clippy::unwrap_used)]

mod support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use support::*;

/// (name, content type, body, expected status, expected code)
type Case = (
    &'static str,
    Option<&'static str>,
    Vec<u8>,
    u16,
    &'static str,
);

fn raw(token: &str, key: &str, content_type: Option<&str>, body: Vec<u8>) -> Request<Body> {
    let mut b = Request::post("/v1/transfers")
        .header("authorization", format!("Bearer {token}"))
        .header("idempotency-key", key);
    if let Some(ct) = content_type {
        b = b.header("content-type", ct);
    }
    b.body(Body::from(body)).unwrap()
}

// clause: idem.errors.problem-json, idem.errors.distinct
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bad_input_gets_its_problem_and_changes_nothing() {
    let db = TestDb::new(Backend::Sqlite, "badinput").await.unwrap();
    let app = app(&db, &[]).await;
    let r = &app.router;
    let json = Some("application/json");
    let big = format!(
        r#"{{"from":"acc_alice_main","to":"acc_alice_savings","amount":1,"memo":"{}"}}"#,
        "x".repeat(70 * 1024)
    );
    // (name, content type, body, expected status, expected code)
    let cases: Vec<Case> = vec![
        (
            "malformed",
            json,
            br#"{"from":"acc_alice_main","#.to_vec(),
            400,
            "malformed_body",
        ),
        (
            "not-json",
            json,
            b"amount=5".to_vec(),
            400,
            "malformed_body",
        ),
        ("empty", json, Vec::new(), 400, "malformed_body"),
        (
            "text",
            Some("text/plain"),
            move_body("alice", 5).into_bytes(),
            415,
            "unsupported_media_type",
        ),
        (
            "no-ct",
            None,
            move_body("alice", 5).into_bytes(),
            415,
            "unsupported_media_type",
        ),
        ("too-big", json, big.into_bytes(), 413, "payload_too_large"),
        (
            "unknown-field",
            json,
            br#"{"from":"acc_alice_main","to":"acc_alice_savings","amount":5,"fee":1}"#.to_vec(),
            422,
            "validation_failed",
        ),
        (
            "negative",
            json,
            move_body("alice", -5).into_bytes(),
            422,
            "validation_failed",
        ),
        (
            "zero",
            json,
            move_body("alice", 0).into_bytes(),
            422,
            "validation_failed",
        ),
        (
            "over-max",
            json,
            move_body("alice", 1_000_000_000_001).into_bytes(),
            422,
            "validation_failed",
        ),
        (
            "i64-overflow",
            json,
            br#"{"from":"acc_alice_main","to":"acc_alice_savings","amount":9223372036854775808}"#
                .to_vec(),
            422,
            "validation_failed",
        ),
        (
            "huge-float",
            json,
            br#"{"from":"acc_alice_main","to":"acc_alice_savings","amount":1e30}"#.to_vec(),
            422,
            "validation_failed",
        ),
        (
            "fraction",
            json,
            br#"{"from":"acc_alice_main","to":"acc_alice_savings","amount":1.5}"#.to_vec(),
            422,
            "validation_failed",
        ),
        (
            "string-amount",
            json,
            br#"{"from":"acc_alice_main","to":"acc_alice_savings","amount":"5"}"#.to_vec(),
            422,
            "validation_failed",
        ),
        ("null", json, b"null".to_vec(), 422, "validation_failed"),
        (
            "same-account",
            json,
            br#"{"from":"acc_alice_main","to":"acc_alice_main","amount":5}"#.to_vec(),
            422,
            "validation_failed",
        ),
        (
            "unknown-account",
            json,
            br#"{"from":"acc_alice_main","to":"acc_nobody","amount":5}"#.to_vec(),
            404,
            "not_found",
        ),
        (
            "others-account",
            json,
            br#"{"from":"acc_bob_main","to":"acc_alice_main","amount":5}"#.to_vec(),
            404,
            "not_found",
        ),
        (
            "overdraft",
            json,
            move_body("alice", 100_001).into_bytes(),
            422,
            "validation_failed",
        ),
        (
            "memo-control",
            json,
            br#"{"from":"acc_alice_main","to":"acc_alice_savings","amount":5,"memo":"a\u0007b"}"#
                .to_vec(),
            422,
            "validation_failed",
        ),
    ];
    for (name, ct, body, status, code) in cases {
        let resp = send(r, raw("demo-alice", &format!("bad-{name}"), ct, body)).await;
        assert_eq!(resp.status.as_u16(), status, "{name}: {:?}", resp.body);
        assert_eq!(resp.problem_code(), code, "{name}");
    }
    // The case above carried no Content-Length (the limit is enforced while
    // reading); a declared length over the limit is refused before reading.
    let req = Request::post("/v1/transfers")
        .header("authorization", "Bearer demo-alice")
        .header("idempotency-key", "bad-declared")
        .header("content-type", "application/json")
        .header("content-length", "1000000")
        .body(Body::from(move_body("alice", 5)))
        .unwrap();
    let resp = send(r, req).await;
    assert_eq!(resp.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(resp.problem_code(), "payload_too_large");
    // Two Authorization headers: refused, not guessed.
    let req = Request::post("/v1/transfers")
        .header("authorization", "Bearer demo-alice")
        .header("authorization", "Bearer demo-bob")
        .header("idempotency-key", "bad-auth")
        .header("content-type", "application/json")
        .body(Body::from(move_body("alice", 5)))
        .unwrap();
    assert_eq!(send(r, req).await.problem_code(), "unauthenticated");
    // Unknown routes and methods are problems too.
    let resp = send(r, get("demo-alice", "/v1/nope")).await;
    assert_eq!(resp.problem_code(), "not_found");
    assert_eq!(balances(r, "alice").await, (100_000, 100_000));
    assert_eq!(balances(r, "bob").await, (100_000, 100_000));
    assert_eq!(transfer_count(r, "alice").await, 0);
}

/// One arbitrary request.
#[derive(Debug, Clone)]
struct Arb {
    auth: Option<Vec<String>>,
    keys: Vec<Vec<u8>>,
    content_type: Option<String>,
    path: String,
    prefer: Option<String>,
    body: Vec<u8>,
}

fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "[!-~]{1,40}".prop_map(String::into_bytes),
        "\"[ -~]{0,20}\"".prop_map(String::into_bytes),
        // Anything a header value can carry: visible ASCII, space, tab, obs-text.
        proptest::collection::vec(
            prop_oneof![0x20u8..=0x7E, Just(b'\t'), 0x80u8..=0xFF],
            0..300
        ),
        Just(vec![b'k'; 10 * 1024]),
    ]
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    let accounts = prop_oneof![
        Just("acc_alice_main".to_owned()),
        Just("acc_alice_savings".to_owned()),
        Just("acc_bob_main".to_owned()),
        Just("acc_nobody".to_owned()),
        "[a-z_]{0,12}",
    ];
    let amount = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        (-3i64..200_001).prop_map(|n| n.to_string()),
        Just("1e30".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("1.5".to_owned()),
        Just("\"7\"".to_owned()),
        Just("null".to_owned()),
    ];
    let json = (
        accounts.clone(),
        accounts,
        amount,
        proptest::option::of("[ -~]{0,20}"),
        any::<bool>(),
    )
        .prop_map(|(from, to, amount, memo, extra)| {
            let mut s = format!(r#"{{"from":"{from}","to":"{to}","amount":{amount}"#);
            if let Some(m) = memo {
                s.push_str(&format!(r#","memo":{}"#, serde_json::Value::String(m)));
            }
            if extra {
                s.push_str(r#","surprise":1"#);
            }
            s.push('}');
            s.into_bytes()
        });
    prop_oneof![
        4 => (1i64..1000, prop_oneof![Just("alice"), Just("bob")])
            .prop_map(|(n, who)| move_body(who, n).into_bytes()),
        6 => json,
        2 => proptest::collection::vec(any::<u8>(), 0..200),
        1 => Just(vec![b'{'; 70 * 1024]),
    ]
}

/// A request that should succeed (or replay, or mismatch on a reused key),
/// so the run exercises the executing path as well as the rejecting ones.
fn good() -> impl Strategy<Value = Arb> {
    (any::<bool>(), "[a-d]{1,2}", 1i64..1000).prop_map(|(alice, key, n)| {
        let who = if alice { "alice" } else { "bob" };
        Arb {
            auth: Some(vec![format!("Bearer demo-{who}")]),
            keys: vec![format!("good-{key}").into_bytes()],
            content_type: Some("application/json".to_owned()),
            path: "/v1/transfers".to_owned(),
            prefer: None,
            body: move_body(who, n).into_bytes(),
        }
    })
}

fn arb() -> impl Strategy<Value = Arb> {
    prop_oneof![1 => good(), 2 => anything()]
}

fn anything() -> impl Strategy<Value = Arb> {
    let auth = prop_oneof![
        4 => Just(Some(vec!["Bearer demo-alice".to_owned()])),
        2 => Just(Some(vec!["Bearer demo-bob".to_owned()])),
        1 => Just(None),
        1 => "[ -~]{0,30}".prop_map(|s| Some(vec![s])),
        1 => Just(Some(vec!["Bearer demo-alice".to_owned(), "Bearer demo-bob".to_owned()])),
    ];
    let keys = prop_oneof![
        3 => "[a-c]{1,2}".prop_map(|k| vec![k.into_bytes()]),
        2 => header_bytes().prop_map(|k| vec![k]),
        1 => Just(Vec::new()),
        1 => (header_bytes(), header_bytes()).prop_map(|(a, b)| vec![a, b]),
    ];
    let content_type = prop_oneof![
        5 => Just(Some("application/json".to_owned())),
        1 => Just(Some("application/merge-patch+json; charset=utf-8".to_owned())),
        1 => Just(Some("text/plain".to_owned())),
        1 => Just(None),
        1 => "[ -~]{0,30}".prop_map(Some),
    ];
    let path = prop_oneof![
        8 => Just("/v1/transfers".to_owned()),
        1 => Just("/v1/transfers?x=1".to_owned()),
        1 => Just("/v1/transfers/".to_owned()),
    ];
    let prefer = proptest::option::of(prop_oneof![Just("wait=1".to_owned()), "[ -~]{0,20}"]);
    (auth, keys, content_type, path, prefer, body()).prop_map(
        |(auth, keys, content_type, path, prefer, body)| Arb {
            auth,
            keys,
            content_type,
            path,
            prefer,
            body,
        },
    )
}

fn build(a: &Arb) -> Option<Request<Body>> {
    let mut b = Request::post(a.path.as_str());
    for v in a.auth.iter().flatten() {
        b = b.header("authorization", axum::http::HeaderValue::from_str(v).ok()?);
    }
    for k in &a.keys {
        b = b.header(
            "idempotency-key",
            axum::http::HeaderValue::from_bytes(k).ok()?,
        );
    }
    if let Some(ct) = &a.content_type {
        b = b.header("content-type", axum::http::HeaderValue::from_str(ct).ok()?);
    }
    if let Some(p) = &a.prefer {
        b = b.header("prefer", axum::http::HeaderValue::from_str(p).ok()?);
    }
    b.body(Body::from(a.body.clone())).ok()
}

// clause: idem.errors.problem-json, idem.key.invalid, idem.key.required
#[test]
fn arbitrary_requests_get_well_formed_answers_and_rejections_change_nothing() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let db = rt
        .block_on(TestDb::new(Backend::Sqlite, "proptest"))
        .unwrap();
    let app = rt.block_on(app(&db, &[]));
    let r = app.router.clone();
    let mut runner = TestRunner::new(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = proptest::collection::vec(arb(), 1..4);
    let (created, rejected) = (
        std::sync::atomic::AtomicUsize::new(0),
        std::sync::atomic::AtomicUsize::new(0),
    );
    runner
        .run(&strategy, |requests| {
            rt.block_on(async {
                for a in &requests {
                    let Some(req) = build(a) else { continue };
                    let before = (balances(&r, "alice").await, balances(&r, "bob").await);
                    let resp = send(&r, req).await;
                    let after = (balances(&r, "alice").await, balances(&r, "bob").await);
                    let s = resp.status.as_u16();
                    prop_assert!(s < 500, "server error {s} for {a:?}: {:?}", resp.body);
                    // Money is conserved per caller whatever happens.
                    prop_assert_eq!(after.0.0 + after.0.1, 200_000);
                    prop_assert_eq!(after.1.0 + after.1.1, 200_000);
                    if resp.status == StatusCode::CREATED {
                        created.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let t: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
                        prop_assert!(t["id"].as_str().is_some_and(|id| id.starts_with("tr_")));
                        if resp.replayed() {
                            prop_assert_eq!(before, after, "a replay moved money");
                        }
                    } else {
                        rejected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        prop_assert!((400..500).contains(&s), "unexpected status {s}");
                        let code = resp.problem_code();
                        prop_assert!(!code.is_empty());
                        prop_assert_eq!(
                            before,
                            after,
                            "rejected ({}) but money moved: {:?}",
                            code,
                            a
                        );
                    }
                }
                Ok(())
            })
        })
        .unwrap();
    // The generator must reach both paths, or the test proves little.
    let (created, rejected) = (created.into_inner(), rejected.into_inner());
    eprintln!("proptest: {created} transfers made or replayed, {rejected} rejected");
    assert!(
        created >= 15 && rejected >= 50,
        "{created} created, {rejected} rejected"
    );
}
