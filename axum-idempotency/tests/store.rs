//! One store test suite, run against SQLite and PostgreSQL (through
//! [`Store`], so both concrete stores are exercised).
#![allow(clippy::unwrap_used)]

use axum_idempotency::store::{
    ClaimOutcome, ClaimRequest, Claimed, DbTx, FencedWrite, KeyStore, SingleTx, Store,
    StoredHeader, StoredRequest, StoredResponse, Unfinished, sql,
};
use axum_idempotency::{
    Caller, Error, Fence, Fingerprint, IdempotencyKey, KeyId, RecoveryPoint, with_pool,
};
use idem_spec::KeyState;
use idem_test_support::{Backend, TestDb, both, db};
use sqlx::Connection;

const HOUR: i64 = 3_600_000;

async fn store(db: &TestDb) -> Store {
    let s = Store::connect(&db.url, 4).await.unwrap();
    s.migrate().await.unwrap();
    // Idempotent: a second start migrates nothing and fails nothing.
    s.migrate().await.unwrap();
    s
}

fn id(caller: &str, key: &str) -> KeyId {
    KeyId::new(Caller::new(caller), IdempotencyKey::parse(key).unwrap())
}

fn fp(name: &str) -> Fingerprint {
    Fingerprint::compute("POST", name, None, b"")
}

fn request() -> StoredRequest {
    StoredRequest {
        method: "POST".into(),
        path: "/v1/things".into(),
        content_type: Some("application/json".into()),
        body: axum::body::Bytes::from_static(b"{}"),
    }
}

/// Claims (caller, key) with fingerprint `f` at `now`.
async fn claim(
    s: &Store,
    caller: &str,
    key: &str,
    f: &str,
    now: i64,
) -> ClaimOutcome<axum_idempotency::store::DbTx> {
    let (id, fingerprint, request) = (id(caller, key), fp(f), request());
    s.claim(&ClaimRequest {
        id: &id,
        fingerprint: &fingerprint,
        request: &request,
        now,
        lease_expires_at: now + 60_000,
        replay_until: now + 24 * HOUR,
        expires_at: now + 72 * HOUR,
    })
    .await
    .unwrap()
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

fn claimed<T>(o: ClaimOutcome<T>) -> Claimed<T> {
    match o {
        ClaimOutcome::Claimed(c) => c,
        ClaimOutcome::Busy => panic!("expected Claimed, got Busy"),
        ClaimOutcome::Taken => panic!("expected Claimed, got Taken"),
    }
}

/// Stores the final response under `fence` and commits.
async fn complete(
    s: &Store,
    mut tx: axum_idempotency::store::DbTx,
    fence: &Fence,
    now: i64,
) -> Result<(), Error> {
    match s
        .write_fenced(&mut tx, fence, FencedWrite::Final(&response()), now)
        .await
    {
        Ok(()) => s.commit(tx).await,
        Err(e) => {
            s.rollback(tx).await?;
            Err(e)
        }
    }
}

fn point(name: &str) -> RecoveryPoint {
    RecoveryPoint::new(name).unwrap()
}

// clause: idem.state.three-states, idem.replay.verbatim, idem.claim.transactional
async fn claim_complete_lookup_round_trip(b: Backend) {
    let db = db!(b, "store-roundtrip");
    let s = store(&db).await;
    assert!(
        s.lookup(&id("alice", "k")).await.unwrap().is_none(),
        "absent"
    );
    let c = claimed(claim(&s, "alice", "k", "fp1", 1_000).await);
    assert_eq!(c.fence.generation(), 1);
    // Uncommitted: other readers still see the key as absent.
    assert!(s.lookup(&id("alice", "k")).await.unwrap().is_none());
    complete(&s, c.tx, &id("alice", "k").fence(1), 2_000)
        .await
        .unwrap();
    let rec = s.lookup(&id("alice", "k")).await.unwrap().unwrap();
    assert_eq!(rec.state, KeyState::Complete);
    assert_eq!(rec.fingerprint, fp("fp1"));
    assert_eq!(rec.recovery_point.as_str(), "finished");
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
        claim(&s, "alice", "k", "fp1", 3_000).await,
        ClaimOutcome::Taken
    ));
    // Other caller, same key: its own record.
    let other = claimed(claim(&s, "bob", "k", "fp1", 3_000).await);
    s.rollback(other.tx).await.unwrap();
}
both!(claim_complete_lookup_round_trip);

// clause: idem.failure.5xx-not-stored, idem.failure.unclaimed
async fn abandon_leaves_the_key_absent(b: Backend) {
    let db = db!(b, "store-abandon");
    let s = store(&db).await;
    let c = claimed(claim(&s, "alice", "k", "fp1", 1_000).await);
    s.rollback(c.tx).await.unwrap();
    assert!(s.lookup(&id("alice", "k")).await.unwrap().is_none());
    let again = claimed(claim(&s, "alice", "k", "fp2", 2_000).await);
    assert_eq!(again.fence.generation(), 1, "nothing was ever committed");
    s.rollback(again.tx).await.unwrap();
}
both!(abandon_leaves_the_key_absent);

// clause: idem.lease.fencing
async fn a_commit_with_a_stale_generation_is_refused_and_changes_nothing(b: Backend) {
    let db = db!(b, "store-fence");
    let s = store(&db).await;
    let c = claimed(claim(&s, "alice", "k", "fp1", 1_000).await);
    let err = complete(
        &s,
        c.tx,
        &id("alice", "k").fence(c.fence.generation() + 7),
        2_000,
    )
    .await;
    assert!(matches!(err, Err(Error::Fenced)), "{err:?}");
    assert!(
        s.lookup(&id("alice", "k")).await.unwrap().is_none(),
        "rolled back"
    );
}
both!(a_commit_with_a_stale_generation_is_refused_and_changes_nothing);

// clause: idem.window.expiry, idem.lease.takeover
async fn reclaim_after_the_window_or_an_expired_lease_bumps_the_generation(b: Backend) {
    let db = db!(b, "store-reclaim");
    let s = store(&db).await;
    let c = claimed(claim(&s, "alice", "k", "fp1", 0).await);
    complete(&s, c.tx, &id("alice", "k").fence(1), 10)
        .await
        .unwrap();
    let late = 24 * HOUR;
    let c2 = claimed(claim(&s, "alice", "k", "fp-new", late).await);
    assert_eq!(c2.fence.generation(), 2);
    complete(&s, c2.tx, &id("alice", "k").fence(2), late + 1)
        .await
        .unwrap();
    let rec = s.lookup(&id("alice", "k")).await.unwrap().unwrap();
    assert_eq!((rec.fingerprint, rec.created_at), (fp("fp-new"), late));

    // A committed in-flight record (what a multi-step request leaves between
    // phases): taken while its lease lives, taken over once it expires at
    // `started`, left alone past `started` (resuming is the phase engine's job).
    for (key, point) in [
        ("lease-started", "started"),
        ("lease-later", "charge_created"),
    ] {
        with_pool!(&s, p => {
            sqlx::query(&sql(p,
                "INSERT INTO idempotency_keys (caller, idem_key, fingerprint, state, recovery_point, \
                 generation, locked_at, lease_expires_at, created_at, replay_until, expires_at, \
                 request_method, request_path) VALUES ('alice', $1, $2, 'in_flight', $3, 5, 0, \
                 60000, 0, $4, $5, 'POST', '/v1/things')",
            ))
            .bind(key)
            .bind(fp("fp").to_hex())
            .bind(point)
            .bind(24 * HOUR)
            .bind(72 * HOUR)
            .execute(p)
            .await
            .unwrap();
        });
        assert!(matches!(
            claim(&s, "alice", key, "fp", 30_000).await,
            ClaimOutcome::Taken
        ));
    }
    let t = claimed(claim(&s, "alice", "lease-started", "fp", 60_000).await);
    assert_eq!(t.fence.generation(), 6);
    s.rollback(t.tx).await.unwrap();
    assert!(matches!(
        claim(&s, "alice", "lease-later", "fp", 60_000).await,
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
            match claim(&s, "alice", "race", "fp", 1_000).await {
                ClaimOutcome::Claimed(c) => {
                    complete(
                        &s,
                        c.tx,
                        &id("alice", "race").fence(c.fence.generation()),
                        1_001,
                    )
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
    let c = claimed(claim(&s, "alice", "done", "fp", 0).await);
    complete(&s, c.tx, &id("alice", "done").fence(1), 1)
        .await
        .unwrap();
    with_pool!(&s, p => {
        sqlx::query(&sql(p,
            "INSERT INTO idempotency_keys (caller, idem_key, fingerprint, state, recovery_point, \
             generation, created_at, replay_until, expires_at, request_method, request_path) \
             VALUES ('alice', 'stuck', $1, 'in_flight', 'charge_created', 1, 0, $2, $3, 'POST', '/x')",
        ))
        .bind(fp("fp").to_hex())
        .bind(24 * HOUR)
        .bind(72 * HOUR)
        .execute(p)
        .await
        .unwrap();
    });
    let young = claimed(claim(&s, "alice", "young", "fp", 10 * HOUR).await);
    complete(&s, young.tx, &id("alice", "young").fence(1), 10 * HOUR)
        .await
        .unwrap();
    assert_eq!(s.reap(72 * HOUR - 1, 1_000).await.unwrap().deleted, 0);
    let report = s.reap(72 * HOUR, 1_000).await.unwrap();
    assert_eq!(report.deleted, 2);
    assert_eq!(
        report.unfinished,
        vec![Unfinished {
            id: id("alice", "stuck"),
            recovery_point: point("charge_created"),
        }]
    );
    assert!(s.lookup(&id("alice", "young")).await.unwrap().is_some());
}
both!(reap_deletes_past_retention_and_reports_unfinished);

/// Inserts `n` records of `state` at `point` whose retention ends at
/// `expires_at`, keys `{prefix}{i}`, in one statement.
async fn insert_many(s: &Store, prefix: &str, n: i64, state: &str, point: &str, expires_at: i64) {
    if s.backend() == "mysql" {
        // No recursive CTE (MySQL caps its depth at 1000): numbers from
        // four digit tables, up to 10 000.
        with_pool!(s, p => {
            sqlx::query(&sql(p,
                "INSERT INTO idempotency_keys (caller, idem_key, fingerprint, state, recovery_point, \
                 generation, created_at, replay_until, expires_at, request_method, request_path) \
                 SELECT 'alice', CONCAT($1, n.i), $2, $3, $4, 1, 0, 0, $5, 'POST', '/x' FROM \
                 (SELECT a.d * 1000 + b.d * 100 + c.d * 10 + e.d + 1 AS i FROM \
                 (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 \
                  UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) a \
                 CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 \
                  UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) b \
                 CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 \
                  UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) c \
                 CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 \
                  UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) e) n \
                 WHERE n.i <= $6",
            ))
            .bind(prefix)
            .bind(fp("fp").to_hex())
            .bind(state)
            .bind(point)
            .bind(expires_at)
            .bind(n)
            .execute(p)
            .await
            .unwrap();
        });
        return;
    }
    with_pool!(s, p => {
        sqlx::query(&sql(p,
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) \
             INSERT INTO idempotency_keys (caller, idem_key, fingerprint, state, recovery_point, \
             generation, created_at, replay_until, expires_at, request_method, request_path) \
             SELECT 'alice', CAST($2 AS TEXT) || CAST(i AS TEXT), $3, $4, $5, 1, 0, 0, $6, \
             'POST', '/x' FROM n",
        ))
        .bind(n)
        .bind(prefix)
        .bind(fp("fp").to_hex())
        .bind(state)
        .bind(point)
        .bind(expires_at)
        .execute(p)
        .await
        .unwrap();
    });
}

/// A `MakeWriter` into a shared buffer: the log lines a test reads back.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// A clock stopped at one instant.
#[derive(Debug)]
struct At(i64);

impl axum_idempotency::clock::Clock for At {
    fn now_ms(&self) -> i64 {
        self.0
    }
}

// clause: idem.reaper.retention
async fn a_reaper_pass_deletes_a_backlog_in_bounded_batches_and_logs_one_summary(b: Backend) {
    let db = db!(b, "store-reap-batches");
    let s = store(&db).await;
    insert_many(&s, "done-", 250, "complete", "finished", 72 * HOUR).await;
    insert_many(&s, "stuck-", 25, "in_flight", "charge_created", 72 * HOUR).await;
    insert_many(&s, "young-", 5, "complete", "finished", 80 * HOUR).await;
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let clock = At(72 * HOUR);
    let config = axum_idempotency::reaper::ReaperConfig {
        batch_size: 100,
        pause: std::time::Duration::from_millis(1),
        max_batches: 100,
    };
    let report = {
        // The pass runs on this thread (the test body is not spawned).
        let _guard = tracing::subscriber::set_default(subscriber);
        axum_idempotency::reaper::reap_once_with(&s, &clock, &config)
            .await
            .unwrap()
    };
    assert_eq!(report.deleted, 275, "the whole backlog");
    assert_eq!(report.batches, 3, "100 + 100 + 75, one transaction each");
    assert_eq!(report.unfinished, 25);
    assert_eq!(
        report.unfinished_sample.len(),
        axum_idempotency::reaper::UNFINISHED_SAMPLE
    );
    assert!(s.lookup(&id("alice", "young-1")).await.unwrap().is_some());
    assert!(s.lookup(&id("alice", "stuck-1")).await.unwrap().is_none());
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("axum_idempotency::reaper"))
        .collect();
    assert_eq!(lines.len(), 2, "one summary and one warning: {text}");
    assert!(
        lines[0].contains("INFO")
            && lines[0].contains("deleted=275")
            && lines[0].contains("batches=3"),
        "{text}"
    );
    assert!(
        lines[1].contains("WARN") && lines[1].contains("unfinished=25"),
        "{text}"
    );
    // Nothing left: the next pass is one empty batch and says nothing.
    let again = axum_idempotency::reaper::reap_once_with(&s, &clock, &config)
        .await
        .unwrap();
    assert_eq!((again.deleted, again.batches), (0, 1));
}
both!(a_reaper_pass_deletes_a_backlog_in_bounded_batches_and_logs_one_summary);

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
    let c = claimed(claim(&s, "alice", "k", "fp", 1_000).await);
    let second = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        claim(&s, "alice", "k", "fp", 1_000),
    )
    .await
    .expect("must not block");
    assert!(matches!(second, ClaimOutcome::Busy));
    // A different key is not affected.
    let other = claimed(claim(&s, "alice", "k2", "fp", 1_000).await);
    s.rollback(other.tx).await.unwrap();
    complete(&s, c.tx, &id("alice", "k").fence(1), 2_000)
        .await
        .unwrap();
    assert!(matches!(
        claim(&s, "alice", "k", "fp", 3_000).await,
        ClaimOutcome::Taken
    ));
}

/// A claimed key committed at `point` (as a multi-step request's first
/// phase leaves it), lease ending at `lease`.
async fn in_flight_at(s: &Store, key: &str, at: &str, lease: i64) -> i64 {
    let mut c = claimed(claim(s, "alice", key, "fp1", 0).await);
    s.write_fenced(
        &mut c.tx,
        &id("alice", key).fence(c.fence.generation()),
        FencedWrite::Point {
            point: &point(at),
            lease_expires_at: lease,
        },
        0,
    )
    .await
    .unwrap();
    s.commit(c.tx).await.unwrap();
    c.fence.generation()
}

// clause: idem.lease.takeover, idem.multistep.resume
async fn take_over_waits_for_the_lease_and_keeps_the_recovery_point(b: Backend) {
    let db = db!(b, "store-takeover");
    let s = store(&db).await;
    let g1 = in_flight_at(&s, "k", "charge_created", 60_000).await;
    // Live lease, or another request's fingerprint: no takeover.
    assert_eq!(
        s.take_over(&id("alice", "k"), &fp("fp1"), 59_999, 120_000)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        s.take_over(&id("alice", "k"), &fp("fp2"), 60_000, 120_000)
            .await
            .unwrap(),
        None
    );
    let t = s
        .take_over(&id("alice", "k"), &fp("fp1"), 60_000, 120_000)
        .await
        .unwrap()
        .expect("expired lease");
    assert_eq!(t.fence.generation(), g1 + 1);
    assert_eq!(
        t.recovery_point.as_str(),
        "charge_created",
        "resumes where it stopped"
    );
    assert_eq!(t.created_at, 0, "first-claim time survives the takeover");
    let rec = s.lookup(&id("alice", "k")).await.unwrap().unwrap();
    assert_eq!(rec.state, KeyState::InFlight);
    assert_eq!(rec.lease_expires_at, Some(120_000));
    // The new lease is live again: a second taker loses.
    assert_eq!(
        s.take_over(&id("alice", "k"), &fp("fp1"), 60_001, 180_000)
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
        .take_over(&id("alice", "k"), &fp("fp1"), 60_000, 120_000)
        .await
        .unwrap()
        .unwrap();
    let before = s.lookup(&id("alice", "k")).await.unwrap().unwrap();

    // The old worker's phase commit, final commit and release: all refused
    // (the driver then rolls back the phase's writes with the guard).
    let mut tx = s.begin().await.unwrap();
    let err = s
        .write_fenced(
            &mut tx,
            &id("alice", "k").fence(g1),
            FencedWrite::Point {
                point: &point("charge_created"),
                lease_expires_at: 121_000,
            },
            61_000,
        )
        .await;
    assert!(matches!(err, Err(Error::Fenced)), "{err:?}");
    s.rollback(tx).await.unwrap();
    let mut tx = s.begin().await.unwrap();
    let err = s
        .write_fenced(
            &mut tx,
            &id("alice", "k").fence(g1),
            FencedWrite::Final(&response()),
            61_000,
        )
        .await;
    assert!(matches!(err, Err(Error::Fenced)), "{err:?}");
    s.rollback(tx).await.unwrap();
    assert!(
        !s.release_lease(&id("alice", "k").fence(g1), 61_000)
            .await
            .unwrap()
    );
    assert_eq!(s.lookup(&id("alice", "k")).await.unwrap().unwrap(), before);

    // The current generation commits.
    let mut tx = s.begin().await.unwrap();
    s.write_fenced(
        &mut tx,
        &id("alice", "k").fence(t.fence.generation()),
        FencedWrite::Final(&response()),
        62_000,
    )
    .await
    .unwrap();
    s.commit(tx).await.unwrap();
    let rec = s.lookup(&id("alice", "k")).await.unwrap().unwrap();
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
    let done = claimed(claim(&s, "alice", "done", "fp1", 0).await);
    complete(
        &s,
        done.tx,
        &id("alice", "done").fence(done.fence.generation()),
        1,
    )
    .await
    .unwrap();
    let found = s.abandoned(50_000, 10).await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    let k = &found[0];
    assert_eq!(k.id, id("alice", "expired"));
    assert_eq!(k.recovery_point.as_str(), "payment_created");
    assert_eq!(k.request, request());
    assert_eq!(k.fingerprint, fp("fp1"));
}
both!(abandoned_lists_expired_multi_step_keys_only);

fn claim_request<'a>(
    id: &'a KeyId,
    fingerprint: &'a Fingerprint,
    request: &'a StoredRequest,
    now: i64,
) -> ClaimRequest<'a> {
    ClaimRequest {
        id,
        fingerprint,
        request,
        now,
        lease_expires_at: now + 60_000,
        replay_until: now + 24 * HOUR,
        expires_at: now + 72 * HOUR,
    }
}

async fn business_rows(s: &Store) -> i64 {
    with_pool!(s, p => {
        sqlx::query_scalar("SELECT count(*) FROM business").fetch_one(p).await.unwrap()
    })
}

// clause: idem.claim.atomic, idem.claim.transactional, idem.concurrency.single-effect
async fn a_single_phase_claim_that_loses_its_final_write_leaves_no_business_write(b: Backend) {
    // The single-phase protocol's race, made deterministic: a request
    // observes its key absent, and before its final claim-and-record a
    // competitor's record for the same key commits. On PostgreSQL that is
    // a transaction that committed between our statement's snapshot and
    // our advisory lock (so we hold the lock and saw nothing); on SQLite a
    // request of another process that committed between our read and our
    // BEGIN IMMEDIATE. The competitor is written here with the same final
    // statement on a transaction of its own (not the key's lock, which on
    // PostgreSQL we hold), which is the state of the world the race leaves.
    let db = db!(b, "store-final-lost");
    let s = store(&db).await;
    with_pool!(&s, p => {
        sqlx::query("CREATE TABLE business (n BIGINT NOT NULL)").execute(p).await.unwrap();
    });
    let (kid, fingerprint, request) = (id("alice", "k"), fp("fp"), request());
    let ours = claim_request(&kid, &fingerprint, &request, 1_000);
    let observed = s.observe(&kid, 1_000).await.unwrap();
    assert!(observed.record.is_none() && !observed.busy, "absent, free");
    // The winner commits its record.
    let mut theirs = s.begin().await.unwrap();
    let won = s
        .record_final(&mut theirs, &ours, &response(), 1_100)
        .await
        .unwrap();
    assert_eq!(won, Some(1), "a fresh key is inserted at generation 1");
    s.commit(theirs).await.unwrap();
    // Ours runs its endpoint in the claim's transaction, then loses. On
    // MySQL the claim is an insert made before the endpoint runs, so it
    // loses there instead, and the endpoint never runs at all.
    let tx = match observed.tx {
        Some(tx) => Some(tx),
        None => match s.begin_single(&ours).await.unwrap() {
            SingleTx::Open(tx) => Some(tx),
            SingleTx::Deferred => Some(s.begin().await.unwrap()),
            SingleTx::Taken => None,
            SingleTx::Busy => panic!("busy"),
        },
    };
    let mut mine = response();
    mine.body = br#"{"id":2}"#.to_vec();
    if let Some(mut tx) = tx {
        axum_idempotency::with_conn!(&mut tx, c => {
            sqlx::query("INSERT INTO business (n) VALUES (1)").execute(&mut *c).await.unwrap();
        });
        assert_eq!(
            s.record_final(&mut tx, &ours, &mine, 1_200).await.unwrap(),
            None,
            "the committed record is inside its window: not replaceable"
        );
        s.rollback(tx).await.unwrap();
    } else {
        assert_eq!(b, Backend::MySql, "only MySQL claims before the endpoint");
    }
    assert_eq!(business_rows(&s).await, 0, "the loser's write is gone");
    let rec = s.lookup(&kid).await.unwrap().unwrap();
    assert_eq!(rec.state, KeyState::Complete);
    assert_eq!(
        rec.response,
        Some(response()),
        "the winner's record, untouched"
    );
    // Past the window the same statement replaces the record: a new request.
    let later = claim_request(&kid, &fingerprint, &request, 1_000 + 25 * HOUR);
    let mut tx = single_tx(&s, &later).await;
    assert_eq!(
        s.record_final(&mut tx, &later, &mine, later.now)
            .await
            .unwrap(),
        Some(2),
        "replaced, generation bumped"
    );
    s.commit(tx).await.unwrap();
    let rec = s.lookup(&kid).await.unwrap().unwrap();
    assert_eq!(rec.response.map(|r| r.body), Some(mine.body));
    assert_eq!(rec.replay_until, later.replay_until);
}
both!(a_single_phase_claim_that_loses_its_final_write_leaves_no_business_write);

// clause: idem.claim.transactional, idem.claim.atomic, idem.window.expiry
async fn the_final_write_and_its_commit_as_one_step(b: Backend) {
    // What the engine calls at the end of every single-phase first
    // execution (SQLite sends the insert and COMMIT to its worker at once,
    // the other stores record then commit). For each shape of key row:
    // the endpoint's write commits exactly when the record does, and the
    // connections come back clean (a nested transaction is a savepoint,
    // nothing is left open), so the next request on them is unaffected.
    let db = db!(b, "store-final-commit");
    let s = store(&db).await;
    with_pool!(&s, p => {
        sqlx::query("CREATE TABLE business (n BIGINT NOT NULL)").execute(p).await.unwrap();
    });
    let (fingerprint, request) = (fp("fp1"), request());
    let now = 5_000;
    // A complete record inside its window, one past it, an abandoned claim
    // at `started`: what a fresh key's insert finds in its way.
    let won = id("alice", "won");
    let mut tx = s.begin().await.unwrap();
    let winner = claim_request(&won, &fingerprint, &request, 1_000);
    assert_eq!(
        s.record_final(&mut tx, &winner, &response(), 1_000)
            .await
            .unwrap(),
        Some(1)
    );
    s.commit(tx).await.unwrap();
    let old = id("alice", "old");
    let mut tx = s.begin().await.unwrap();
    let mut first = claim_request(&old, &fingerprint, &request, 0);
    first.replay_until = 1_000;
    assert_eq!(
        s.record_final(&mut tx, &first, &response(), 0)
            .await
            .unwrap(),
        Some(1)
    );
    s.commit(tx).await.unwrap();
    in_flight_at(&s, "abandoned", "started", 0).await;
    let mut mine = response();
    mine.body = br#"{"id":"mine"}"#.to_vec();
    let mut committed = 0;
    for (key, expected) in [
        ("fresh", Some(1)),
        ("won", None),
        ("old", Some(2)),
        ("abandoned", Some(2)),
    ] {
        let kid = id("alice", key);
        let req = claim_request(&kid, &fingerprint, &request, now);
        // MySQL claims before the endpoint: a row it may not replace is
        // Taken there already, and the endpoint never runs.
        let mut tx = match s.begin_single(&req).await.unwrap() {
            SingleTx::Open(tx) => tx,
            SingleTx::Deferred => s.begin().await.unwrap(),
            SingleTx::Taken => {
                assert_eq!((b, expected), (Backend::MySql, None), "{key}");
                continue;
            }
            SingleTx::Busy => panic!("{key}: busy"),
        };
        axum_idempotency::with_conn!(&mut tx, c => {
            sqlx::query("INSERT INTO business (n) VALUES (1)").execute(&mut *c).await.unwrap();
        });
        let got = s
            .record_final_and_commit(tx, &req, &mine, now)
            .await
            .unwrap();
        assert_eq!(got, expected, "{key}");
        committed += i64::from(got.is_some());
        assert_eq!(
            business_rows(&s).await,
            committed,
            "{key}: writes iff recorded"
        );
        let rec = s.lookup(&kid).await.unwrap().unwrap();
        assert_eq!(rec.state, KeyState::Complete, "{key}");
        let body = rec.response.map(|r| r.body);
        if got.is_some() {
            assert_eq!(body, Some(mine.body.clone()), "{key}: ours");
            assert_eq!(rec.generation, expected.unwrap(), "{key}");
        } else {
            assert_eq!(
                body,
                Some(response().body),
                "{key}: the winner's, untouched"
            );
        }
    }
    // Every pooled connection, taken at once: none is inside a
    // transaction, and a transaction on each nests as a savepoint.
    with_pool!(&s, p => {
        let mut held = Vec::new();
        for _ in 0..4 {
            let mut c = p.acquire().await.unwrap();
            assert!(!c.is_in_transaction(), "a connection came back inside a transaction");
            let mut outer = c.begin().await.unwrap();
            let inner = outer.begin().await.unwrap();
            inner.rollback().await.unwrap();
            outer.rollback().await.unwrap();
            held.push(c);
        }
    });
    // And the writer is free: a new write transaction opens and commits.
    let tx = s.begin().await.unwrap();
    s.commit(tx).await.unwrap();
}
both!(the_final_write_and_its_commit_as_one_step);

// clause: idem.claim.atomic, idem.window.progress
async fn the_final_write_never_replaces_a_record_in_flight(b: Backend) {
    // A multi-step request's committed claim (live lease, and one with
    // progress whose lease is over) is never replaced by a single-phase
    // final write; an abandoned claim at `started` is.
    let db = db!(b, "store-final-inflight");
    let s = store(&db).await;
    let (fingerprint, request) = (fp("fp1"), request());
    for (key, point, lease, replaceable) in [
        ("live", "started", 10_000, false),
        ("progressed", "charge_created", 0, false),
        ("abandoned", "started", 0, true),
    ] {
        in_flight_at(&s, key, point, lease).await;
        let kid = id("alice", key);
        let req = claim_request(&kid, &fingerprint, &request, 5_000);
        // MySQL claims before the endpoint: a row it may not replace is
        // Taken there already.
        let wrote = match s.begin_single(&req).await.unwrap() {
            SingleTx::Taken => None,
            single => {
                let mut tx = match single {
                    SingleTx::Open(tx) => tx,
                    _ => s.begin().await.unwrap(),
                };
                let wrote = s
                    .record_final(&mut tx, &req, &response(), 5_000)
                    .await
                    .unwrap();
                s.rollback(tx).await.unwrap();
                wrote
            }
        };
        assert_eq!(wrote.is_some(), replaceable, "{key}");
    }
}
both!(the_final_write_never_replaces_a_record_in_flight);

// clause: idem.inflight.conflict
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_begin_takes_the_key_lock_and_a_duplicate_is_busy_on_a_clean_connection() {
    // The observation is a plain read and, unless the key is replayable, a
    // `BEGIN` that takes the key's advisory lock in the same message, so a
    // duplicate's observation, `BEGIN` or multi-step claim is busy at once. The duplicate's failed `BEGIN` must not leave its pooled
    // connection inside an aborted transaction: with a pool of two and the
    // holder on one, every later statement runs on that same connection.
    let Some(db) = TestDb::new(Backend::Postgres, "store-observe").await else {
        return;
    };
    let s = Store::connect(&db.url, 2).await.unwrap();
    s.migrate().await.unwrap();
    let kid = id("alice", "k");
    let (fingerprint, request) = (fp("fp"), request());
    let req = claim_request(&kid, &fingerprint, &request, 1_000);
    // An absent key: the observation goes on to the BEGIN with the lock.
    let first = s.observe(&kid, 1_000).await.unwrap();
    assert!(first.record.is_none() && !first.busy);
    let mut holder = first.tx.expect("an absent key is observed with its lock");
    for _ in 0..3 {
        let busy = tokio::time::timeout(std::time::Duration::from_secs(5), s.begin_single(&req))
            .await
            .expect("must not block")
            .unwrap();
        assert!(matches!(busy, SingleTx::Busy), "busy");
        // The connection the busy BEGIN used answers the next statement.
        assert!(s.lookup(&kid).await.unwrap().is_none());
        let again = tokio::time::timeout(std::time::Duration::from_secs(5), s.observe(&kid, 1_000))
            .await
            .expect("must not block")
            .unwrap();
        assert!(again.busy && again.tx.is_none() && again.record.is_none());
    }
    assert!(matches!(
        claim(&s, "alice", "k", "fp", 1_000).await,
        ClaimOutcome::Busy
    ));
    // Another key is not held by this one's lock.
    let other_id = id("alice", "other");
    let other = single_tx(&s, &claim_request(&other_id, &fingerprint, &request, 1_000)).await;
    s.rollback(other).await.unwrap();
    assert!(
        s.record_final(&mut holder, &req, &response(), 1_000)
            .await
            .unwrap()
            .is_some()
    );
    s.commit(holder).await.unwrap();
    // Complete: read without any lock, even while someone holds it.
    let again = single_tx(&s, &req).await;
    let replay = s.observe(&kid, 2_000).await.unwrap();
    assert!(!replay.busy && replay.tx.is_none());
    assert_eq!(replay.record.unwrap().response, Some(response()));
    s.rollback(again).await.unwrap();
}

#[tokio::test]
async fn postgres_keys_with_quotes_and_dollars_lock_as_themselves() {
    // The fused BEGIN carries caller and key inside a simple-protocol
    // string: hex-encoded, so characters SQL would read as syntax are only
    // data, and the lock is the same one the bound statements take.
    let Some(db) = TestDb::new(Backend::Postgres, "store-quoting").await else {
        return;
    };
    let s = store(&db).await;
    let caller = "o'brien $idem$ \\ ; ROLLBACK; --";
    let kid = id(caller, "k'1$idem$");
    let (fingerprint, request) = (fp("fp"), request());
    let req = claim_request(&kid, &fingerprint, &request, 1_000);
    let holder = single_tx(&s, &req).await;
    assert!(matches!(
        claim(&s, caller, "k'1$idem$", "fp", 1_000).await,
        ClaimOutcome::Busy
    ));
    // The lock id is the one earlier versions computed from bound
    // parameters: during a rolling deploy both exclude each other.
    let mut other = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let free: bool = sqlx::query_scalar(
        "SELECT pg_try_advisory_lock(hashtextextended(\
         current_schema() || chr(31) || $1 || chr(31) || $2, 0))",
    )
    .bind(caller)
    .bind("k'1$idem$")
    .fetch_one(&mut other)
    .await
    .unwrap();
    assert!(!free, "the bound-parameter form of the lock must be held");
    s.rollback(holder).await.unwrap();
    assert!(matches!(
        s.begin_single(&req).await.unwrap(),
        SingleTx::Open(_)
    ));
}

/// The transaction a single-phase request would run in: opened now where
/// the store defers it (SQLite opens it at the endpoint's first write).
async fn single_tx(s: &Store, req: &ClaimRequest<'_>) -> DbTx {
    match s.begin_single(req).await.unwrap() {
        SingleTx::Open(tx) => tx,
        SingleTx::Deferred => s.begin().await.unwrap(),
        other => panic!("expected a transaction, got {other:?}"),
    }
}

// clause: idem.inflight.conflict, idem.claim.atomic
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_duplicate_is_in_flight_at_once_and_the_holder_commits() {
    // MySQL's claim is an uncommitted insert of the in-flight row. A
    // duplicate's observation probes that row with FOR UPDATE NOWAIT and is
    // told "in flight" without waiting out the 1 s lock wait; a duplicate
    // claim (single-phase or multi-step) is Busy, never an error; another
    // key is not held by it (no gap lock); and the holder's final write and
    // commit never fail because of the duplicates.
    let Some(db) = TestDb::new(Backend::MySql, "store-mysql-busy").await else {
        return;
    };
    let s = store(&db).await;
    let kid = id("alice", "k");
    let (fingerprint, request) = (fp("fp"), request());
    let req = claim_request(&kid, &fingerprint, &request, 1_000);
    let mut holder = single_tx(&s, &req).await;
    let seen = tokio::time::timeout(
        std::time::Duration::from_millis(900),
        s.observe(&kid, 1_000),
    )
    .await
    .expect("NOWAIT must not wait for the holder's lock")
    .unwrap();
    assert!(seen.busy && seen.record.is_none() && seen.tx.is_none());
    for _ in 0..2 {
        let dup = tokio::time::timeout(std::time::Duration::from_secs(5), s.begin_single(&req))
            .await
            .expect("bounded by the lock wait")
            .unwrap();
        assert!(matches!(dup, SingleTx::Busy), "{dup:?}");
        assert!(matches!(
            claim(&s, "alice", "k", "fp", 1_000).await,
            ClaimOutcome::Busy
        ));
    }
    for key in ["j", "l", "k0", "kz"] {
        let other_id = id("alice", key);
        let other = tokio::time::timeout(
            std::time::Duration::from_millis(900),
            single_tx(&s, &claim_request(&other_id, &fingerprint, &request, 1_000)),
        )
        .await
        .expect("another key never waits for this one's claim");
        s.rollback(other).await.unwrap();
    }
    assert_eq!(
        s.record_final(&mut holder, &req, &response(), 1_500)
            .await
            .unwrap(),
        Some(1)
    );
    s.commit(holder).await.unwrap();
    let after = s.observe(&kid, 2_000).await.unwrap();
    assert!(!after.busy);
    assert_eq!(after.record.unwrap().response, Some(response()));
}

// clause: idem.claim.atomic, idem.inflight.conflict
#[tokio::test]
async fn postgres_refuses_to_start_when_advisory_locks_are_stubs() {
    // A PostgreSQL-compatible engine whose pg_try_advisory_xact_lock always
    // answers "granted" (CockroachDB's did until 2026), played by a function
    // of that name in the test's schema, searched before pg_catalog. The
    // start-up check takes the lock twice and must refuse to run.
    let Some(db) = TestDb::new(Backend::Postgres, "store-stub-locks").await else {
        return;
    };
    let (_, schema) = db.url.rsplit_once("search_path%3D").unwrap();
    let schema = schema.split('&').next().unwrap().to_owned();
    let mut admin = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query(&format!(
        "CREATE FUNCTION {schema}.pg_try_advisory_xact_lock(bigint) RETURNS boolean \
         LANGUAGE sql AS 'SELECT true'"
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    let _ = admin.close().await;
    // The real locks: the same database passes the check.
    store(&db).await;
    let stubbed = db.url.replace(
        &format!("search_path%3D{schema}"),
        &format!("search_path%3D{schema}%2Cpg_catalog"),
    );
    let s = Store::connect(&stubbed, 2).await.unwrap();
    match s.migrate().await {
        Err(Error::ClaimUnsafe(why)) => {
            assert!(why.contains("pg_try_advisory_xact_lock"), "{why}")
        }
        other => panic!("a stub lock must be refused, got {other:?}"),
    }
}

/// `PRAGMA synchronous` on every connection of `store`'s pool, two held at
/// once so the answer is not one connection's.
async fn sqlite_synchronous(store: &Store) -> Vec<i64> {
    let Store::Sqlite(s) = store else {
        panic!("a SQLite store");
    };
    let mut held = Vec::new();
    let mut levels = Vec::new();
    for _ in 0..2 {
        let mut conn = s.pool().acquire().await.unwrap();
        let level: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        levels.push(level);
        held.push(conn);
    }
    levels
}

#[tokio::test]
async fn sqlite_synchronous_is_the_one_asked_for_and_other_stores_refuse_it() {
    use axum_idempotency::{SqliteSync, StoreOptions};
    let db = TestDb::new(Backend::Sqlite, "store-sync").await.unwrap();
    let normal = Store::connect_with(&db.url, &StoreOptions::default())
        .await
        .unwrap();
    assert_eq!(sqlite_synchronous(&normal).await, [1, 1], "NORMAL is 1");
    normal.close().await;
    let full = StoreOptions::default().sqlite_synchronous(SqliteSync::Full);
    let durable = Store::connect_with(&db.url, &full).await.unwrap();
    assert_eq!(sqlite_synchronous(&durable).await, [2, 2], "FULL is 2");
    durable.close().await;
    // A server store would ignore the setting: refused, never dropped.
    let mut servers = vec![Backend::Postgres];
    if cfg!(feature = "mysql") {
        servers.push(Backend::MySql);
    }
    for backend in servers {
        let Some(server) = TestDb::new(backend, "store-sync").await else {
            continue;
        };
        let refused = Store::connect_with(&server.url, &full).await;
        assert!(
            matches!(refused, Err(Error::Config(ref m)) if m.contains("sqlite_synchronous")),
            "{backend:?}: {refused:?}"
        );
    }
}
