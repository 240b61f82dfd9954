//! One store test suite, run against SQLite and PostgreSQL.
#![allow(clippy::unwrap_used)]

mod support;

use idem_server::Error;
use idem_server::store::{
    ClaimOutcome, ClaimRequest, KeyStore, Store, StoredHeader, StoredResponse,
};
use idem_server::with_pool;
use idem_spec::KeyState;
use support::{Backend, TestDb, both, db};

const HOUR: i64 = 3_600_000;

async fn store(db: &TestDb) -> Store {
    Store::connect(&db.url, 4).await.unwrap()
}

fn req<'a>(caller: &'a str, key: &'a str, fingerprint: &'a str, now: i64) -> ClaimRequest<'a> {
    ClaimRequest {
        caller,
        key,
        fingerprint,
        method: "POST",
        path: "/v1/things",
        content_type: Some("application/json"),
        body: b"{}",
        now,
        lease_expires_at: now + 60_000,
        replay_until: now + 24 * HOUR,
        expires_at: now + 72 * HOUR,
    }
}

fn response() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: vec![
            StoredHeader::new("content-type", b"application/json"),
            StoredHeader::new("location", b"/v1/things/1"),
            StoredHeader::new("x-raw", b"caf\xe9"),
        ],
        body: br#"{"id":1}"#.to_vec(),
    }
}

fn claimed<T>(o: ClaimOutcome<T>) -> idem_server::store::Claimed<T> {
    match o {
        ClaimOutcome::Claimed(c) => c,
        ClaimOutcome::Busy => panic!("expected Claimed, got Busy"),
        ClaimOutcome::Taken => panic!("expected Claimed, got Taken"),
    }
}

// clause: idem.state.three-states, idem.replay.verbatim, idem.claim.transactional
async fn claim_complete_lookup_round_trip(b: Backend) {
    let db = db!(b, "store-roundtrip");
    let s = store(&db).await;
    assert!(s.lookup("alice", "k").await.unwrap().is_none(), "absent");
    let c = claimed(s.claim(&req("alice", "k", "fp1", 1_000)).await.unwrap());
    assert_eq!(c.generation, 1);
    // Uncommitted: other readers still see the key as absent.
    assert!(s.lookup("alice", "k").await.unwrap().is_none());
    s.complete(c.tx, "alice", "k", 1, &response(), 2_000)
        .await
        .unwrap();
    let rec = s.lookup("alice", "k").await.unwrap().unwrap();
    assert_eq!(rec.state, KeyState::Complete);
    assert_eq!(rec.fingerprint, "fp1");
    assert_eq!(rec.recovery_point, "finished");
    assert_eq!(
        rec.response,
        Some(response()),
        "byte for byte, even non-ASCII header bytes"
    );
    assert_eq!(rec.response.unwrap().headers[2].value_bytes(), b"caf\xe9");
    assert_eq!(
        (rec.created_at, rec.replay_until),
        (1_000, 1_000 + 24 * HOUR)
    );
    // A complete key inside its window cannot be claimed again.
    assert!(matches!(
        s.claim(&req("alice", "k", "fp1", 3_000)).await.unwrap(),
        ClaimOutcome::Taken
    ));
    // Other caller, same key: its own record.
    let other = claimed(s.claim(&req("bob", "k", "fp1", 3_000)).await.unwrap());
    s.abandon(other.tx).await.unwrap();
}
both!(claim_complete_lookup_round_trip);

// clause: idem.failure.5xx-not-stored, idem.failure.unclaimed
async fn abandon_leaves_the_key_absent(b: Backend) {
    let db = db!(b, "store-abandon");
    let s = store(&db).await;
    let c = claimed(s.claim(&req("alice", "k", "fp1", 1_000)).await.unwrap());
    s.abandon(c.tx).await.unwrap();
    assert!(s.lookup("alice", "k").await.unwrap().is_none());
    let again = claimed(s.claim(&req("alice", "k", "fp2", 2_000)).await.unwrap());
    assert_eq!(again.generation, 1, "nothing was ever committed");
    s.abandon(again.tx).await.unwrap();
}
both!(abandon_leaves_the_key_absent);

// clause: idem.lease.fencing
async fn a_commit_with_a_stale_generation_is_refused_and_changes_nothing(b: Backend) {
    let db = db!(b, "store-fence");
    let s = store(&db).await;
    let c = claimed(s.claim(&req("alice", "k", "fp1", 1_000)).await.unwrap());
    let err = s
        .complete(c.tx, "alice", "k", c.generation + 7, &response(), 2_000)
        .await;
    assert!(matches!(err, Err(Error::Fenced)), "{err:?}");
    assert!(
        s.lookup("alice", "k").await.unwrap().is_none(),
        "rolled back"
    );
}
both!(a_commit_with_a_stale_generation_is_refused_and_changes_nothing);

// clause: idem.window.expiry, idem.lease.takeover
async fn reclaim_after_the_window_or_an_expired_lease_bumps_the_generation(b: Backend) {
    let db = db!(b, "store-reclaim");
    let s = store(&db).await;
    let c = claimed(s.claim(&req("alice", "k", "fp1", 0)).await.unwrap());
    s.complete(c.tx, "alice", "k", 1, &response(), 10)
        .await
        .unwrap();
    let late = 24 * HOUR;
    let c2 = claimed(s.claim(&req("alice", "k", "fp-new", late)).await.unwrap());
    assert_eq!(c2.generation, 2);
    s.complete(c2.tx, "alice", "k", 2, &response(), late + 1)
        .await
        .unwrap();
    let rec = s.lookup("alice", "k").await.unwrap().unwrap();
    assert_eq!((rec.fingerprint.as_str(), rec.created_at), ("fp-new", late));

    // A committed in-flight record (what a multi-step request leaves between
    // phases): taken while its lease lives, taken over once it expires at
    // `started`, left alone past `started` (resuming is the phase engine's job).
    for (key, point) in [
        ("lease-started", "started"),
        ("lease-later", "charge_created"),
    ] {
        with_pool!(&s, p => {
            sqlx::query(
                "INSERT INTO idempotency_keys (caller, idem_key, fingerprint, state, recovery_point, \
                 generation, locked_at, lease_expires_at, created_at, replay_until, expires_at, \
                 request_method, request_path) VALUES ('alice', $1, 'fp', 'in_flight', $2, 5, 0, \
                 60000, 0, $3, $4, 'POST', '/v1/things')",
            )
            .bind(key)
            .bind(point)
            .bind(24 * HOUR)
            .bind(72 * HOUR)
            .execute(p)
            .await
            .unwrap();
        });
        assert!(matches!(
            s.claim(&req("alice", key, "fp", 30_000)).await.unwrap(),
            ClaimOutcome::Taken
        ));
    }
    let t = claimed(
        s.claim(&req("alice", "lease-started", "fp", 60_000))
            .await
            .unwrap(),
    );
    assert_eq!(t.generation, 6);
    s.abandon(t.tx).await.unwrap();
    assert!(matches!(
        s.claim(&req("alice", "lease-later", "fp", 60_000))
            .await
            .unwrap(),
        ClaimOutcome::Taken
    ));
}
both!(reclaim_after_the_window_or_an_expired_lease_bumps_the_generation);

// clause: idem.claim.atomic, idem.concurrency.single-effect
async fn concurrent_claims_have_exactly_one_winner(b: Backend) {
    let db = db!(b, "store-race");
    let s = store(&db).await;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(16));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (s, barrier) = (s.clone(), barrier.clone());
        set.spawn(async move {
            barrier.wait().await;
            match s.claim(&req("alice", "race", "fp", 1_000)).await.unwrap() {
                ClaimOutcome::Claimed(c) => {
                    s.complete(c.tx, "alice", "race", c.generation, &response(), 1_001)
                        .await
                        .unwrap();
                    1
                }
                ClaimOutcome::Busy | ClaimOutcome::Taken => 0,
            }
        });
    }
    let mut winners = 0;
    while let Some(w) = set.join_next().await {
        winners += w.unwrap();
    }
    assert_eq!(winners, 1);
}
both!(concurrent_claims_have_exactly_one_winner);

// clause: idem.reaper.retention, idem.window.retention
async fn reap_deletes_past_retention_and_reports_unfinished(b: Backend) {
    let db = db!(b, "store-reap");
    let s = store(&db).await;
    let c = claimed(s.claim(&req("alice", "done", "fp", 0)).await.unwrap());
    s.complete(c.tx, "alice", "done", 1, &response(), 1)
        .await
        .unwrap();
    with_pool!(&s, p => {
        sqlx::query(
            "INSERT INTO idempotency_keys (caller, idem_key, fingerprint, state, recovery_point, \
             generation, created_at, replay_until, expires_at, request_method, request_path) \
             VALUES ('alice', 'stuck', 'fp', 'in_flight', 'charge_created', 1, 0, $1, $2, 'POST', '/x')",
        )
        .bind(24 * HOUR)
        .bind(72 * HOUR)
        .execute(p)
        .await
        .unwrap();
    });
    let young = claimed(
        s.claim(&req("alice", "young", "fp", 10 * HOUR))
            .await
            .unwrap(),
    );
    s.complete(young.tx, "alice", "young", 1, &response(), 10 * HOUR)
        .await
        .unwrap();
    assert_eq!(s.reap(72 * HOUR - 1).await.unwrap().deleted, 0);
    let report = s.reap(72 * HOUR).await.unwrap();
    assert_eq!(report.deleted, 2);
    assert_eq!(
        report.unfinished,
        vec![(
            "alice".to_owned(),
            "stuck".to_owned(),
            "charge_created".to_owned()
        )]
    );
    assert!(s.lookup("alice", "young").await.unwrap().is_some());
}
both!(reap_deletes_past_retention_and_reports_unfinished);

// clause: idem.inflight.conflict
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_duplicate_claim_is_busy_not_blocked() {
    // On PostgreSQL a second claim while the first transaction is open
    // answers Busy at once (advisory lock) instead of waiting on the
    // uncommitted row. (SQLite serialises writers; its in-flight answer comes
    // from the engine's registry, tested in contract.rs.)
    let Some(db) = TestDb::new(Backend::Postgres, "store-busy").await else {
        return;
    };
    let s = store(&db).await;
    let c = claimed(s.claim(&req("alice", "k", "fp", 1_000)).await.unwrap());
    let second = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        s.claim(&req("alice", "k", "fp", 1_000)),
    )
    .await
    .expect("must not block");
    assert!(matches!(second.unwrap(), ClaimOutcome::Busy));
    // A different key is not affected.
    let other = claimed(s.claim(&req("alice", "k2", "fp", 1_000)).await.unwrap());
    s.abandon(other.tx).await.unwrap();
    s.complete(c.tx, "alice", "k", 1, &response(), 2_000)
        .await
        .unwrap();
    assert!(matches!(
        s.claim(&req("alice", "k", "fp", 3_000)).await.unwrap(),
        ClaimOutcome::Taken
    ));
}

/// A claimed key committed at `point` (as a multi-step request's first
/// phase leaves it), lease ending at `lease`.
async fn in_flight_at(s: &Store, key: &str, point: &str, lease: i64) -> i64 {
    let mut c = claimed(s.claim(&req("alice", key, "fp1", 0)).await.unwrap());
    s.commit_point(&mut c.tx, "alice", key, c.generation, point, 0, lease)
        .await
        .unwrap();
    c.tx.commit().await.unwrap();
    c.generation
}

// clause: idem.lease.takeover, idem.multistep.resume
async fn take_over_waits_for_the_lease_and_keeps_the_recovery_point(b: Backend) {
    let db = db!(b, "store-takeover");
    let s = store(&db).await;
    let g1 = in_flight_at(&s, "k", "charge_created", 60_000).await;
    // Live lease, or another request's fingerprint: no takeover.
    assert_eq!(
        s.take_over("alice", "k", "fp1", 59_999, 120_000)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        s.take_over("alice", "k", "fp2", 60_000, 120_000)
            .await
            .unwrap(),
        None
    );
    let t = s
        .take_over("alice", "k", "fp1", 60_000, 120_000)
        .await
        .unwrap()
        .expect("expired lease");
    assert_eq!(t.generation, g1 + 1);
    assert_eq!(
        t.recovery_point, "charge_created",
        "resumes where it stopped"
    );
    assert_eq!(t.created_at, 0, "first-claim time survives the takeover");
    let rec = s.lookup("alice", "k").await.unwrap().unwrap();
    assert_eq!(rec.state, KeyState::InFlight);
    assert_eq!(rec.lease_expires_at, Some(120_000));
    // The new lease is live again: a second taker loses.
    assert_eq!(
        s.take_over("alice", "k", "fp1", 60_001, 180_000)
            .await
            .unwrap(),
        None
    );
}
both!(take_over_waits_for_the_lease_and_keeps_the_recovery_point);

// clause: idem.lease.fencing
async fn stale_phase_commits_and_releases_change_nothing(b: Backend) {
    let db = db!(b, "store-phase-fence");
    let s = store(&db).await;
    let g1 = in_flight_at(&s, "k", "payment_created", 60_000).await;
    let t = s
        .take_over("alice", "k", "fp1", 60_000, 120_000)
        .await
        .unwrap()
        .unwrap();
    let before = s.lookup("alice", "k").await.unwrap().unwrap();

    // The old worker's phase commit, final commit and release: all refused
    // (the driver then rolls back the phase's writes with the guard).
    let mut tx = s.begin().await.unwrap();
    let err = s
        .commit_point(&mut tx, "alice", "k", g1, "charge_created", 61_000, 121_000)
        .await;
    assert!(matches!(err, Err(Error::Fenced)), "{err:?}");
    tx.rollback().await.unwrap();
    let mut tx = s.begin().await.unwrap();
    let err = s
        .store_final(&mut tx, "alice", "k", g1, &response(), 61_000)
        .await;
    assert!(matches!(err, Err(Error::Fenced)), "{err:?}");
    tx.rollback().await.unwrap();
    assert!(!s.release_lease("alice", "k", g1, 61_000).await.unwrap());
    assert_eq!(s.lookup("alice", "k").await.unwrap().unwrap(), before);

    // The current generation commits.
    let mut tx = s.begin().await.unwrap();
    s.store_final(&mut tx, "alice", "k", t.generation, &response(), 62_000)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let rec = s.lookup("alice", "k").await.unwrap().unwrap();
    assert_eq!(rec.state, KeyState::Complete);
    assert_eq!(rec.response, Some(response()));
}
both!(stale_phase_commits_and_releases_change_nothing);

// clause: idem.completer.drives
async fn abandoned_lists_expired_multi_step_keys_only(b: Backend) {
    let db = db!(b, "store-abandoned");
    let s = store(&db).await;
    in_flight_at(&s, "expired", "payment_created", 10_000).await;
    in_flight_at(&s, "live", "payment_created", 90_000).await;
    let done = claimed(s.claim(&req("alice", "done", "fp1", 0)).await.unwrap());
    s.complete(done.tx, "alice", "done", done.generation, &response(), 1)
        .await
        .unwrap();
    let found = s.abandoned(50_000, 10).await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    let k = &found[0];
    assert_eq!((k.caller.as_str(), k.key.as_str()), ("alice", "expired"));
    assert_eq!(k.recovery_point, "payment_created");
    assert_eq!((k.method.as_str(), k.path.as_str()), ("POST", "/v1/things"));
    assert_eq!(k.body, b"{}");
    assert_eq!(k.fingerprint, "fp1");
}
both!(abandoned_lists_expired_multi_step_keys_only);
