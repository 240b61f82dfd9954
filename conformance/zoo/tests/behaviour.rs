//! The zoo's promises: without a defect every dialect is a correct
//! idempotency implementation that only spells things its own way; with a
//! defect, exactly that defect is observable over HTTP.

mod support;

use std::time::Duration;

use idem_zoo::{
    Defect, Dialect, Gate, REJECTED_AMOUNT, REJECTED_STATUS, SERVER_ERROR_AMOUNT, ZooConfig,
};
use reqwest::Method;
use support::{Target, assert_verbatim, marker, order};

/// Checks a contract error's spelling: a problem document with `code` in
/// the reference dialect, plain `{"error": ...}` without `code` elsewhere.
fn assert_error(dialect: Dialect, a: &support::Answer, status: u16, code: &str, context: &str) {
    assert_eq!(a.status, status, "{dialect} {context}: status");
    let body = a.json();
    if dialect.is_problem_json() {
        assert_eq!(
            a.header("content-type"),
            Some("application/problem+json"),
            "{dialect} {context}"
        );
        assert_eq!(body["code"], code, "{dialect} {context}: code");
        assert_eq!(body["status"], status, "{dialect} {context}: status member");
    } else {
        assert_eq!(
            a.header("content-type"),
            Some("application/json"),
            "{dialect} {context}"
        );
        assert!(body["error"].is_string(), "{dialect} {context}: {body}");
        assert!(body.get("code").is_none(), "{dialect} {context}: no code");
    }
}

fn marker_of(dialect: Dialect, a: &support::Answer) -> Option<String> {
    dialect
        .replay_marker()
        .and_then(|m| a.header(m).map(str::to_owned))
}

// clause: idem.replay.verbatim
// clause: idem.replay.marker
// clause: idem.replay.no-reexecution
#[tokio::test]
async fn every_dialect_replays_a_success_verbatim_with_its_own_marker() {
    for dialect in Dialect::ALL {
        let t = Target::start(dialect, None, 0).await;
        let m = marker("replay");
        let first = t.post("alice", Some("k-replay"), &order(7, &m)).await;
        assert_eq!(first.status, 201, "{dialect}");
        let body = first.json();
        assert_eq!(body["caller"], "alice");
        assert_eq!(body["amount"], 7);
        let id = body["id"].as_str().expect("id").to_owned();
        assert_eq!(
            first.header("location"),
            Some(format!("/v1/orders/{id}").as_str())
        );
        assert!(first.header("etag").is_some(), "{dialect}: ETag");
        assert_eq!(
            marker_of(dialect, &first),
            None,
            "{dialect}: first is unmarked"
        );

        let replay = t.post("alice", Some("k-replay"), &order(7, &m)).await;
        assert_verbatim(&first, &replay, dialect.as_str());
        match dialect.replay_marker() {
            Some(_) => assert_eq!(marker_of(dialect, &replay).as_deref(), Some("true")),
            None => {
                for name in ["idempotent-replayed", "idempotency-replayed"] {
                    assert!(replay.header(name).is_none(), "{dialect}: no {name}");
                }
            }
        }
        assert_eq!(t.effects(&m).await, 1, "{dialect}: one order");
        assert_eq!(t.executions(&m).await, 1, "{dialect}: one run");
        let shown = t.send(Method::GET, &format!("/v1/orders/{id}")).await;
        assert_eq!(shown.json(), body, "{dialect}: GET returns the order");
        t.zoo.shutdown().await;
    }
}

// clause: idem.fingerprint.mismatch
#[tokio::test]
async fn every_dialect_rejects_a_mismatch_with_its_own_status() {
    for dialect in Dialect::ALL {
        let t = Target::start(dialect, None, 0).await;
        let m = marker("mismatch");
        assert_eq!(
            t.post("alice", Some("k-mm"), &order(7, &m)).await.status,
            201
        );
        let other = t.post("alice", Some("k-mm"), &order(8, &m)).await;
        assert_error(
            dialect,
            &other,
            dialect.mismatch_status(),
            "idempotency_key_mismatch",
            "mismatch",
        );
        assert_eq!(t.effects(&m).await, 1, "{dialect}");
        assert_eq!(t.executions(&m).await, 1, "{dialect}");
        t.zoo.shutdown().await;
    }
}

// clause: idem.inflight.conflict
// clause: idem.inflight.retry-after
#[tokio::test]
async fn every_dialect_refuses_an_in_flight_duplicate_with_409_and_retry_after() {
    for dialect in Dialect::ALL {
        let gate = Gate::new();
        let config = ZooConfig {
            dialect,
            ..ZooConfig::default()
        };
        let t = Target::on(
            idem_zoo::spawn_with_gate(config, gate.clone())
                .await
                .expect("zoo starts"),
        );
        let m = marker("inflight");
        let first = {
            let http = t.http.clone();
            let url = t.url("/v1/orders");
            let body = order(7, &m).to_string();
            tokio::spawn(async move {
                let resp = http
                    .post(url)
                    .header("Authorization", "Bearer zoo-alice")
                    .header("Idempotency-Key", "k-busy")
                    .header("Content-Type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .expect("first POST");
                support::answer(resp).await
            })
        };
        assert!(
            gate.wait_entered(1, Duration::from_secs(10)).await,
            "{dialect}: the first request reaches its handler"
        );
        let dup = t.post("alice", Some("k-busy"), &order(7, &m)).await;
        assert_error(dialect, &dup, 409, "idempotency_key_in_use", "in flight");
        assert_eq!(dup.header("retry-after"), Some("1"), "{dialect}");
        gate.release(1);
        let first = first.await.expect("first request task");
        assert_eq!(first.status, 201, "{dialect}");
        let after = t.post("alice", Some("k-busy"), &order(7, &m)).await;
        assert_verbatim(&first, &after, dialect.as_str());
        assert_eq!(t.executions(&m).await, 1, "{dialect}");
        t.zoo.shutdown().await;
    }
}

// clause: idem.failure.5xx-not-stored
#[tokio::test]
async fn every_dialect_releases_the_key_after_a_5xx() {
    for dialect in Dialect::ALL {
        let t = Target::start(dialect, None, 0).await;
        let m = marker("5xx");
        let failed = t
            .post("alice", Some("k-500"), &order(SERVER_ERROR_AMOUNT, &m))
            .await;
        assert_error(
            dialect,
            &failed,
            500,
            "internal_error",
            "body-triggered 5xx",
        );
        let again = t
            .post("alice", Some("k-500"), &order(SERVER_ERROR_AMOUNT, &m))
            .await;
        assert_eq!(again.status, 500, "{dialect}");
        assert_eq!(marker_of(dialect, &again), None, "{dialect}: not a replay");
        assert_eq!(t.executions(&m).await, 2, "{dialect}: the retry ran again");
        assert_eq!(t.effects(&m).await, 0, "{dialect}: nothing committed");
        t.zoo.shutdown().await;
    }
}

// clause: idem.failure.final-outcomes
#[tokio::test]
async fn every_dialect_stores_and_replays_a_4xx() {
    for dialect in Dialect::ALL {
        let t = Target::start(dialect, None, 0).await;
        let m = marker("4xx");
        let rejected = t.post("alice", Some("k-422"), &order(-5, &m)).await;
        assert_error(
            dialect,
            &rejected,
            REJECTED_STATUS,
            "validation_failed",
            "body-triggered 4xx",
        );
        let again = t.post("alice", Some("k-422"), &order(-5, &m)).await;
        assert_verbatim(&rejected, &again, dialect.as_str());
        if dialect.replay_marker().is_some() {
            assert_eq!(
                marker_of(dialect, &again).as_deref(),
                Some("true"),
                "{dialect}"
            );
        }
        assert_eq!(t.executions(&m).await, 1, "{dialect}: replayed, not re-run");
        t.zoo.shutdown().await;
    }
}

// clause: idem.scope.caller
// clause: idem.key.syntax
#[tokio::test]
async fn every_dialect_scopes_keys_by_caller_and_reads_quoted_keys_as_bare() {
    for dialect in Dialect::ALL {
        let t = Target::start(dialect, None, 0).await;
        let m = marker("scope");
        let alice = t.post("alice", Some("k-shared"), &order(7, &m)).await;
        let bob = t.post("bob", Some("k-shared"), &order(7, &m)).await;
        assert_eq!((alice.status, bob.status), (201, 201), "{dialect}");
        assert_eq!(bob.json()["caller"], "bob", "{dialect}: no leak");
        assert_ne!(alice.json()["id"], bob.json()["id"], "{dialect}");
        assert_eq!(marker_of(dialect, &bob), None, "{dialect}");
        assert_eq!(t.effects(&m).await, 2, "{dialect}");

        let quoted = t.post("alice", Some("\"k-shared\""), &order(7, &m)).await;
        assert_verbatim(&alice, &quoted, dialect.as_str());
        assert_eq!(
            t.executions(&m).await,
            2,
            "{dialect}: the quoted key replayed"
        );
        t.zoo.shutdown().await;
    }
}

// clause: idem.key.required
// clause: idem.key.invalid
// clause: idem.failure.unclaimed
#[tokio::test]
async fn every_dialect_rejects_bad_requests_before_claiming() {
    for dialect in Dialect::ALL {
        let t = Target::start(dialect, None, 0).await;
        let m = marker("bad");
        let missing = t.post("alice", None, &order(7, &m)).await;
        assert_error(
            dialect,
            &missing,
            400,
            "idempotency_key_missing",
            "missing key",
        );
        let long = "x".repeat(300);
        let invalid = t.post("alice", Some(&long), &order(7, &m)).await;
        assert_error(
            dialect,
            &invalid,
            400,
            "idempotency_key_invalid",
            "invalid key",
        );
        let stranger = t.post("mallory", Some("k-auth"), &order(7, &m)).await;
        assert_error(dialect, &stranger, 401, "unauthenticated", "unknown caller");
        assert_eq!(t.executions(&m).await, 0, "{dialect}: nothing ran");
        // The failed attempt did not consume the key.
        assert_eq!(
            t.post("alice", Some("k-auth"), &order(7, &m)).await.status,
            201
        );

        let route = t.send(Method::GET, "/v1/nothing-here").await;
        assert_eq!(
            route.status,
            dialect.unknown_route_status(),
            "{dialect}: route"
        );
        let method = t.send(Method::DELETE, "/v1/orders").await;
        assert_eq!(
            method.status,
            dialect.unsupported_method_status(),
            "{dialect}: method"
        );
        t.zoo.shutdown().await;
    }
}

// clause: idem.concurrency.single-effect
// clause: idem.claim.atomic
#[tokio::test]
async fn without_defects_concurrent_duplicates_execute_once() {
    for dialect in [Dialect::Reference, Dialect::PlainJson417] {
        let t = Target::start(dialect, None, 200).await;
        let m = marker("race-ok");
        let statuses = burst(&t, "k-burst", &m, 8).await;
        assert_eq!(t.effects(&m).await, 1, "{dialect}: {statuses:?}");
        assert_eq!(t.executions(&m).await, 1, "{dialect}");
        assert!(
            statuses.iter().all(|s| *s == 201 || *s == 409),
            "{statuses:?}"
        );
        t.zoo.shutdown().await;
    }
}

/// Sends `n` identical requests at once and returns their statuses.
async fn burst(t: &Target, key: &str, m: &str, n: usize) -> Vec<u16> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (http, url, key, body) = (
            t.http.clone(),
            t.url("/v1/orders"),
            key.to_owned(),
            order(7, m).to_string(),
        );
        set.spawn(async move {
            http.post(url)
                .header("Authorization", "Bearer zoo-alice")
                .header("Idempotency-Key", key)
                .header("Content-Type", "application/json")
                .body(body)
                .send()
                .await
                .expect("burst POST")
                .status()
                .as_u16()
        });
    }
    set.join_all().await
}

// clause: idem.concurrency.single-effect
#[tokio::test]
async fn defect_race_double_execution_executes_concurrent_duplicates() {
    let t = Target::start(
        Dialect::PlainJson422,
        Some(Defect::RaceDoubleExecution),
        300,
    )
    .await;
    let m = marker("race");
    let statuses = burst(&t, "k-race", &m, 8).await;
    let effects = t.effects(&m).await;
    assert!(
        effects > 1,
        "8 concurrent duplicates, {effects} effect(s): {statuses:?}"
    );
    t.zoo.shutdown().await;
}

// clause: idem.scope.caller
#[tokio::test]
async fn defect_global_key_space_leaks_a_response_across_callers() {
    let t = Target::start(Dialect::PlainJson400, Some(Defect::GlobalKeySpace), 0).await;
    let m = marker("global");
    let alice = t.post("alice", Some("k-global"), &order(7, &m)).await;
    let bob = t.post("bob", Some("k-global"), &order(7, &m)).await;
    assert_eq!(bob.status, 201);
    assert_eq!(bob.json()["caller"], "alice", "bob got alice's order");
    assert_eq!(bob.body, alice.body);
    assert_eq!(t.effects(&m).await, 1);
    t.zoo.shutdown().await;
}

// clause: idem.fingerprint.mismatch
#[tokio::test]
async fn defect_silent_mismatch_replay_answers_another_body_with_the_first_outcome() {
    let t = Target::start(Dialect::Reference, Some(Defect::SilentMismatchReplay), 0).await;
    let m = marker("silent");
    let first = t.post("alice", Some("k-silent"), &order(7, &m)).await;
    let other = t.post("alice", Some("k-silent"), &order(9, &m)).await;
    assert_verbatim(&first, &other, "mismatched body");
    assert_eq!(
        other.json()["amount"],
        7,
        "the amount 9 request got amount 7's order"
    );
    t.zoo.shutdown().await;
}

// clause: idem.failure.5xx-not-stored
#[tokio::test]
async fn defect_server_error_stored_replays_a_5xx() {
    let t = Target::start(Dialect::PlainJson417, Some(Defect::ServerErrorStored), 0).await;
    let m = marker("5xx-stored");
    let failed = t
        .post("alice", Some("k-5xx"), &order(SERVER_ERROR_AMOUNT, &m))
        .await;
    let again = t
        .post("alice", Some("k-5xx"), &order(SERVER_ERROR_AMOUNT, &m))
        .await;
    assert_verbatim(&failed, &again, "5xx");
    assert_eq!(again.status, 500);
    assert_eq!(
        t.executions(&m).await,
        1,
        "the retry was a replay of the 5xx"
    );
    t.zoo.shutdown().await;
}

// clause: idem.failure.final-outcomes
#[tokio::test]
async fn defect_client_error_reexecuted_runs_a_4xx_retry_again() {
    let t = Target::start(
        Dialect::PlainJson422,
        Some(Defect::ClientErrorReexecuted),
        0,
    )
    .await;
    let m = marker("4xx-rerun");
    let rejected = t
        .post("alice", Some("k-4xx"), &order(REJECTED_AMOUNT, &m))
        .await;
    let again = t
        .post("alice", Some("k-4xx"), &order(REJECTED_AMOUNT, &m))
        .await;
    assert_verbatim(&rejected, &again, "4xx");
    assert_eq!(again.header("idempotency-replayed"), None);
    assert_eq!(
        t.executions(&m).await,
        2,
        "only the execution count sees it"
    );
    t.zoo.shutdown().await;
}

// clause: idem.replay.verbatim
#[tokio::test]
async fn defect_broken_replay_after_completion_rejects_every_retry() {
    let t = Target::start(
        Dialect::Reference,
        Some(Defect::BrokenReplayAfterCompletion),
        0,
    )
    .await;
    let m = marker("broken");
    assert_eq!(
        t.post("alice", Some("k-broken"), &order(7, &m))
            .await
            .status,
        201
    );
    for attempt in 0..3 {
        let retry = t.post("alice", Some("k-broken"), &order(7, &m)).await;
        assert_error(
            Dialect::Reference,
            &retry,
            409,
            "idempotency_key_in_use",
            "retry",
        );
        assert_eq!(retry.header("retry-after"), Some("1"), "attempt {attempt}");
    }
    assert_eq!(t.executions(&m).await, 1);
    t.zoo.shutdown().await;
}

// clause: idem.replay.verbatim
// clause: idem.replay.marker
#[tokio::test]
async fn defect_replay_headers_dropped_omits_location_etag_and_marker() {
    let t = Target::start(Dialect::Reference, Some(Defect::ReplayHeadersDropped), 0).await;
    let m = marker("dropped");
    let first = t.post("alice", Some("k-drop"), &order(7, &m)).await;
    let replay = t.post("alice", Some("k-drop"), &order(7, &m)).await;
    assert_eq!(replay.body, first.body, "the body still replays");
    assert!(first.header("location").is_some() && first.header("etag").is_some());
    for name in ["location", "etag", "idempotent-replayed"] {
        assert!(replay.header(name).is_none(), "{name} dropped");
    }
    assert_eq!(t.executions(&m).await, 1);
    t.zoo.shutdown().await;
}

// clause: idem.key.syntax
#[tokio::test]
async fn defect_quoted_key_distinct_executes_the_second_spelling() {
    let t = Target::start(Dialect::PlainJson400, Some(Defect::QuotedKeyDistinct), 0).await;
    let m = marker("quoted");
    let bare = t.post("alice", Some("k-q"), &order(7, &m)).await;
    let quoted = t.post("alice", Some("\"k-q\""), &order(7, &m)).await;
    assert_eq!((bare.status, quoted.status), (201, 201));
    assert_ne!(bare.json()["id"], quoted.json()["id"]);
    assert_eq!(t.effects(&m).await, 2);
    let by_key = t.send(Method::GET, "/v1/orders?idempotency_key=k-q").await;
    assert_eq!(by_key.json()["count"], 2, "the key probe sees both effects");
    t.zoo.shutdown().await;
}

#[test]
fn names_round_trip_and_clauses_exist() {
    let clauses = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../spec/generated/clauses.json"
    ))
    .expect("clauses.json");
    for d in Dialect::ALL {
        assert_eq!(d.as_str().parse::<Dialect>().expect("dialect parses"), d);
    }
    for d in Defect::ALL {
        assert_eq!(d.to_string().parse::<Defect>().expect("defect parses"), d);
        assert!(
            clauses.contains(&format!("\"id\": \"{}\"", d.clause())),
            "{d}: clause {} exists",
            d.clause()
        );
        // A defect's class is never worse than its clause's.
        let clause = idem_spec::clauses::get(d.clause()).expect("registered");
        assert!(
            d.class() <= clause.class,
            "{d}: {} vs {}",
            d.class(),
            clause.class
        );
    }
    assert!("no-such-defect".parse::<Defect>().is_err());
}

#[test]
fn the_binary_prints_its_address_first_and_serves() {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_idem-zoo"))
        .args(["--dialect", "plain-json-417", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("binary starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .expect("first line");
    let base = line
        .trim()
        .strip_prefix("listening on ")
        .expect("first line names the address")
        .to_owned();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let status = rt.block_on(async {
        reqwest::Client::new()
            .delete(format!("{base}/v1/orders"))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .expect("the binary answers")
            .status()
            .as_u16()
    });
    child.kill().expect("stop the binary");
    child.wait().expect("reap the binary");
    assert_eq!(
        status, 405,
        "plain-json-417 answers an unsupported method 405"
    );
}

// clause: idem.replay.verbatim
// clause: idem.failure.final-outcomes
#[tokio::test]
async fn a_client_that_hangs_up_mid_request_gets_the_stored_outcome_on_retry() {
    let gate = Gate::new();
    let t = Target::on(
        idem_zoo::spawn_with_gate(ZooConfig::default(), gate.clone())
            .await
            .expect("zoo starts"),
    );
    let m = marker("hangup");
    let abandoned = {
        let http = t.http.clone();
        let url = t.url("/v1/orders");
        let body = order(7, &m).to_string();
        tokio::spawn(async move {
            http.post(url)
                .header("Authorization", "Bearer zoo-alice")
                .header("Idempotency-Key", "k-hangup")
                .header("Content-Type", "application/json")
                .body(body)
                .send()
                .await
        })
    };
    assert!(gate.wait_entered(1, Duration::from_secs(10)).await);
    // Dropping the request future closes its connection mid-request.
    abandoned.abort();
    assert!(
        abandoned.await.is_err(),
        "the client gave up before any answer"
    );
    gate.release(1);
    let mut effects = 0;
    for _ in 0..200 {
        effects = t.effects(&m).await;
        if effects == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(effects, 1, "the abandoned run still committed");
    let retry = t.post("alice", Some("k-hangup"), &order(7, &m)).await;
    assert_eq!(retry.status, 201);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(t.executions(&m).await, 1);
    t.zoo.shutdown().await;
}

// clause: idem.errors.distinct
#[tokio::test]
async fn plain_json_400_tells_its_three_400s_apart_by_the_documented_texts() {
    let t = Target::start(Dialect::PlainJson400, None, 0).await;
    let m = marker("texts");
    let missing = t.post("alice", None, &order(7, &m)).await;
    let invalid = t.post("alice", Some(&"x".repeat(300)), &order(7, &m)).await;
    assert_eq!(
        t.post("alice", Some("k-t"), &order(7, &m)).await.status,
        201
    );
    let mismatch = t.post("alice", Some("k-t"), &order(8, &m)).await;
    for (a, text) in [
        (&missing, "Idempotency-Key header is required"),
        (&invalid, "invalid Idempotency-Key: "),
        (&mismatch, "Idempotency-Key reused with a different request"),
    ] {
        assert_eq!(a.status, 400);
        let error = a.json()["error"].as_str().expect("error text").to_owned();
        assert!(error.starts_with(text), "{error:?} starts with {text:?}");
    }
    t.zoo.shutdown().await;
}

// clause: idem.failure.before-claim
#[tokio::test]
async fn an_oversized_declared_body_is_refused_at_once_and_leaves_the_key_free() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for dialect in Dialect::ALL {
        let t = Target::start(dialect, None, 0).await;
        let m = marker("oversize");
        let addr = t.zoo.base_url.trim_start_matches("http://").to_owned();
        let mut sock = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        // Declares 64 MiB, sends 16 bytes, then waits: an early answer is
        // the only way this read ends before the bound.
        let head = format!(
            "POST /v1/orders HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer zoo-alice\r\nIdempotency-Key: k-big\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{{\"amount\": 7,   ",
            64 << 20
        );
        sock.write_all(head.as_bytes()).await.expect("write");
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf))
            .await
            .expect("answered before the body arrived")
            .expect("read");
        let line = String::from_utf8_lossy(&buf[..n]);
        assert!(line.starts_with("HTTP/1.1 413"), "{dialect}: {line}");
        let fresh = t.post("alice", Some("k-big"), &order(7, &m)).await;
        assert_eq!(fresh.status, 201, "{dialect}: the key was never claimed");
        assert_eq!(t.executions(&m).await, 1, "{dialect}");
        t.zoo.shutdown().await;
    }
}
