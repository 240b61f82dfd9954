//! `skip_without`: a loud skip on a developer's machine, a failure in CI.
//!
//! The check runs this test binary again with a chosen environment (the
//! variables are process-wide, so a test cannot safely change its own), on
//! an ignored inner test that only calls `skip_without`.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

#[test]
#[ignore = "run by skip_without_fails_in_ci_and_skips_loudly_elsewhere, in a child process"]
fn inner_component_missing() {
    idem_test_support::skip_without(
        "inner_component_missing",
        "the frobnicator is not installed",
    );
}

fn run_inner(env: &[(&str, &str)]) -> Output {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "inner_component_missing",
            "--nocapture",
        ])
        .env_remove("CI")
        .env_remove(idem_test_support::CI_ENV)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

#[test]
fn skip_without_fails_in_ci_and_skips_loudly_elsewhere() {
    let text = |o: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    for env in [[("IDEM_CI", "1")], [("CI", "true")]] {
        let out = run_inner(&env);
        assert!(
            !out.status.success(),
            "{env:?}: a missing component passed in CI"
        );
        assert!(
            text(&out).contains("failing instead of skipping"),
            "{env:?}: {}",
            text(&out)
        );
    }
    for env in [
        &[][..],
        &[("CI", "0")][..],
        &[("CI", "false")][..],
        &[("IDEM_CI", "")][..],
    ] {
        let out = run_inner(env);
        assert!(out.status.success(), "{env:?}: {}", text(&out));
        assert!(
            text(&out).contains(
                "*** SKIPPED inner_component_missing: the frobnicator is not installed ***"
            ),
            "{env:?}: the skip is not loud: {}",
            text(&out)
        );
        assert!(
            text(&out).contains("1 passed"),
            "{env:?}: the inner test did not run"
        );
    }
}
