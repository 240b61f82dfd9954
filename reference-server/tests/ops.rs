//! Operating the binary: logs without colour codes when stderr is not a
//! terminal, and bearer tokens from the environment rather than from
//! arguments every local user can read.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use idem_test_support::{ChildServer, TempDir};

/// Longest any wait of these tests may take before the test fails.
const GUARD: Duration = Duration::from_secs(30);

struct Server {
    child: ChildServer,
    _dir: TempDir,
}

/// Starts the server on a fresh SQLite file with `env`, logging at info.
async fn start(env: &[(&str, &str)]) -> Server {
    let dir = TempDir::new("idem-ops");
    let url = format!("sqlite://{}", dir.join("idem.db").display());
    let mut spawn = ChildServer::command(env!("CARGO_BIN_EXE_idem-server"))
        .args(["--listen", "127.0.0.1:0", "--database-url", &url])
        .env("RUST_LOG", "info")
        .capture_stderr();
    for (k, v) in env {
        spawn = spawn.env(k, v);
    }
    let child = spawn.start().await.expect("start idem-server");
    Server { child, _dir: dir }
}

#[tokio::test]
async fn logs_carry_no_colour_codes_when_stderr_is_not_a_terminal() {
    let server = start(&[]).await;
    let log = server
        .child
        .stderr_containing("background jobs started", GUARD)
        .await;
    assert!(log.contains(" INFO "), "{log}");
    assert!(!log.contains('\u{1b}'), "ANSI escape in {log:?}");
}

#[tokio::test]
async fn tokens_from_the_environment_authenticate_and_stay_out_of_ps_and_the_logs() {
    let server = start(&[("IDEM_TOKENS", "env-s3cret=carol")]).await;
    let client = reqwest::Client::new();
    let accounts = |token: &'static str| {
        client
            .get(format!("{}/v1/accounts", server.child.base_url()))
            .header("authorization", format!("Bearer {token}"))
            .send()
    };
    assert_eq!(accounts("env-s3cret").await.unwrap().status(), 200);
    assert_eq!(
        accounts("demo-alice").await.unwrap().status(),
        401,
        "configured tokens replace the demo ones"
    );
    #[cfg(target_os = "linux")]
    {
        let pid = server.child.pid().unwrap();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        assert!(!cmdline.windows(10).any(|w| w == b"env-s3cret"));
    }
    assert!(!server.child.stderr().contains("env-s3cret"));
}
