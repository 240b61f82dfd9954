//! The processor as its own process: its state survives `kill -9`, and the
//! child helper reports start-up failures instead of hanging.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{TempDir, charge, key};
use idem_fake_processor::{Behavior, ChargeOutcome, ProcessorClient};
use idem_test_support::{ChildServer, SpawnError, cargo_bin};

const BIN: &str = env!("CARGO_BIN_EXE_idem-fake-processor");

async fn spawn_child(
    bin: impl AsRef<std::path::Path>,
    db: impl AsRef<std::path::Path>,
) -> Result<ChildServer, SpawnError> {
    spawn_on(bin, db, "127.0.0.1:0").await
}

async fn spawn_on(
    bin: impl AsRef<std::path::Path>,
    db: impl AsRef<std::path::Path>,
    listen: &str,
) -> Result<ChildServer, SpawnError> {
    ChildServer::command(bin.as_ref())
        .args(["--listen", listen, "--db"])
        .arg(db.as_ref())
        .timeout(Duration::from_secs(30))
        .start()
        .await
}

fn client(child: &ChildServer) -> ProcessorClient {
    ProcessorClient::new(child.base_url())
}

// clause: idem.multistep.foreign-key
#[tokio::test]
async fn charges_and_call_counts_survive_kill_9_and_restart() {
    let dir = TempDir::new();
    let mut child = spawn_child(BIN, dir.db()).await.unwrap();
    let c = client(&child);
    c.health().await.unwrap();

    let ChargeOutcome::Created(paid) = c
        .create_charge(&key("order-1"), &charge(1999), None)
        .await
        .unwrap()
    else {
        panic!("expected a new charge")
    };
    let declined = c
        .create_charge(&key("order-2"), &charge(50), Some(Behavior::DECLINE))
        .await
        .unwrap();
    assert!(matches!(declined, ChargeOutcome::Declined { .. }));
    let unavailable = c
        .create_charge(&key("order-3"), &charge(75), Some(Behavior::UNAVAILABLE))
        .await
        .unwrap();
    assert!(matches!(unavailable, ChargeOutcome::Unavailable { .. }));
    let before = c.charges().await.unwrap();
    assert_eq!(before.count, 2);

    let old_pid = child.pid();
    child.kill().await.unwrap();
    assert!(
        c.health().await.is_err(),
        "a killed processor must not answer"
    );

    // Same database, same port: everything committed is still there.
    child.restart().await.unwrap();
    assert_ne!(child.pid(), old_pid);
    let c = client(&child);
    let after = c.charges().await.unwrap();
    assert_eq!(after, before);
    assert_eq!(after.calls_for("order-1"), 1);
    assert_eq!(after.calls_for("order-3"), 1);

    // The key still deduplicates after the crash: a retry creates nothing.
    assert_eq!(
        c.create_charge(&key("order-1"), &charge(1999), None)
            .await
            .unwrap(),
        ChargeOutcome::Replayed(paid)
    );
    // And the 503 stored nothing, so its key can still succeed.
    assert!(matches!(
        c.create_charge(&key("order-3"), &charge(75), None)
            .await
            .unwrap(),
        ChargeOutcome::Created(_)
    ));
    let last = c.charges().await.unwrap();
    assert_eq!(last.count, 3);
    assert_eq!(last.calls_for("order-1"), 2);
    assert_eq!(last.calls_for("order-3"), 2);

    // A second, independent process on the same file sees the same state.
    child.kill().await.unwrap();
    let other = spawn_child(BIN, dir.db()).await.unwrap();
    assert_eq!(client(&other).charges().await.unwrap(), last);
}

#[tokio::test]
async fn start_up_failures_are_reported_not_hung_on() {
    let dir = TempDir::new();

    // The database's folder does not exist: the child exits with an error.
    let bad_db = dir.path().join("missing").join("processor.db");
    let err = spawn_on(BIN, &bad_db, "127.0.0.1:0").await.unwrap_err();
    assert!(matches!(err, SpawnError::Exited { .. }), "{err}");

    // No such binary.
    let err = spawn_child(dir.path().join("no-such-binary"), dir.db())
        .await
        .unwrap_err();
    assert!(matches!(err, SpawnError::Spawn { .. }), "{err}");

    // The port is taken by a running processor.
    let first = spawn_child(BIN, dir.db()).await.unwrap();
    let err = spawn_on(BIN, dir.db(), &first.addr().to_string())
        .await
        .unwrap_err();
    assert!(matches!(err, SpawnError::Exited { .. }), "{err}");
    client(&first).health().await.unwrap();
}

#[tokio::test]
async fn other_crates_find_the_same_binary_through_cargo() {
    let found = tokio::task::spawn_blocking(|| {
        cargo_bin(
            "idem-fake-processor",
            "idem-fake-processor",
            "IDEM_FAKE_PROCESSOR_BIN",
        )
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        std::fs::canonicalize(&found).unwrap(),
        std::fs::canonicalize(BIN).unwrap()
    );
    let dir = TempDir::new();
    let child = spawn_child(&found, dir.db()).await.unwrap();
    client(&child).health().await.unwrap();
}
