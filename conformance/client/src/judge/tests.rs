//! Table tests of the verdicts: hand-built records, the verdicts they must
//! and must not produce.

use super::*;
use crate::record::Attempt;
use crate::scenario::{IN_FLIGHT_CODE, MISMATCH_CODE, all};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn status(code: u16) -> Answer {
    Answer::Status {
        code,
        retry_after: None,
        problem: None,
    }
}

fn att(t: u64, key: Option<&str>, answer: Answer) -> Attempt {
    let mut headers = vec![("Content-Type".to_owned(), "application/json".to_owned())];
    if let Some(k) = key {
        headers.push(("Idempotency-Key".to_owned(), k.to_owned()));
    }
    Attempt {
        at: ms(t),
        conn: 1,
        method: "POST".to_owned(),
        path: "/payments".to_owned(),
        headers,
        body: "{}".to_owned(),
        answer,
        answered: Some(ms(t + 1)),
        client_gave_up: None,
        not_before: None,
    }
}

fn hinted(mut a: Attempt, hint: &str, wait_ms: u64) -> Attempt {
    if let Answer::Status { retry_after, .. } = &mut a.answer {
        *retry_after = Some(hint.to_owned());
    }
    a.not_before = Some(a.answered.unwrap_or(a.at) + ms(wait_ms));
    a
}

fn rec(attempts: Vec<Attempt>, exit: Exit, ended: u64) -> RunRecord {
    RunRecord {
        scenario: "x",
        run: 0,
        attempts,
        exit,
        ended: ms(ended),
        stdout: String::new(),
        stderr: String::new(),
        base_url: "http://127.0.0.1:1".to_owned(),
        note: None,
    }
}

fn ok() -> Exit {
    Exit::Finished {
        ok: true,
        code: Some(0),
    }
}

fn scenario(id: &str) -> Scenario {
    all(2)
        .into_iter()
        .find(|s| s.id == id)
        .unwrap_or_else(|| panic!("scenario {id}"))
}

fn verdict_of(checks: &[CheckReport], clause: &str) -> Option<(Verdict, Class)> {
    checks
        .iter()
        .filter(|c| c.clause == clause)
        .map(|c| (c.verdict, c.class))
        .max_by_key(|(v, _)| *v)
}

const S: &str = "retry.502";
const SUCCESS: Answer = Answer::Success { code: 201 };

#[test]
fn verdicts_over_recorded_attempts() {
    use Verdict::{Fail, NonStrict, Pass};
    let k = Some("k-1");
    // (what, scenario, record, expected (clause, verdict, class), clauses that must not fail)
    #[allow(clippy::type_complexity)]
    let table: Vec<(&str, &str, RunRecord, Vec<(&str, Verdict, Class)>)> = vec![
        (
            "same key on a retry of a 503",
            S,
            rec(
                vec![att(0, k, status(503)), att(300, k, SUCCESS)],
                ok(),
                310,
            ),
            vec![
                ("idem.client.same-key", Pass, Class::Safety),
                ("idem.client.no-key-no-retry", Pass, Class::Safety),
                ("idem.client.deadline", Pass, Class::Semantics),
            ],
        ),
        (
            "a fresh key per attempt",
            S,
            rec(
                vec![att(0, k, status(503)), att(300, Some("k-2"), SUCCESS)],
                ok(),
                310,
            ),
            vec![("idem.client.same-key", Fail, Class::Safety)],
        ),
        (
            "the key dropped on the retry",
            S,
            rec(
                vec![att(0, k, status(503)), att(300, None, SUCCESS)],
                ok(),
                310,
            ),
            vec![
                ("idem.client.same-key", Pass, Class::Safety),
                ("idem.client.no-key-no-retry", Fail, Class::Safety),
            ],
        ),
        (
            "key-less resend after a reset after reading",
            "retry.reset-after-read",
            rec(
                vec![
                    att(0, None, Answer::ResetAfterRead),
                    att(200, None, SUCCESS),
                ],
                ok(),
                210,
            ),
            vec![("idem.client.no-key-no-retry", Fail, Class::Safety)],
        ),
        (
            "key-less retry of a 500",
            "retry.500",
            rec(
                vec![att(0, None, status(500)), att(200, None, SUCCESS)],
                ok(),
                210,
            ),
            vec![
                ("idem.client.500-with-key", Fail, Class::Safety),
                ("idem.client.no-key-no-retry", Fail, Class::Safety),
            ],
        ),
        (
            "keyed retry of a 500",
            "retry.500",
            rec(
                vec![att(0, k, status(500)), att(200, k, SUCCESS)],
                ok(),
                210,
            ),
            vec![("idem.client.500-with-key", Pass, Class::Safety)],
        ),
        (
            "a 400 retried, with the same key",
            "final.400",
            rec(
                vec![att(0, k, status(400)), att(200, k, SUCCESS)],
                ok(),
                210,
            ),
            vec![
                ("idem.client.allowlist", Fail, Class::Safety),
                ("idem.client.same-key", Pass, Class::Safety),
            ],
        ),
        (
            "a 409 mismatch, not retried",
            "final.409-mismatch",
            rec(
                vec![att(
                    0,
                    k,
                    Answer::Status {
                        code: 409,
                        retry_after: None,
                        problem: Some(MISMATCH_CODE),
                    },
                )],
                Exit::Finished {
                    ok: false,
                    code: Some(1),
                },
                10,
            ),
            vec![("idem.client.allowlist", Pass, Class::Safety)],
        ),
        (
            "Retry-After: 2 undercut by 150 ms",
            "retry-after.503-seconds",
            rec(
                vec![
                    hinted(att(0, k, status(503)), "2", 2000),
                    att(1851, k, SUCCESS),
                ],
                ok(),
                1860,
            ),
            vec![("idem.client.retry-after", Fail, Class::Semantics)],
        ),
        (
            "Retry-After: 2 met within the 100 ms tolerance",
            "retry-after.503-seconds",
            rec(
                vec![
                    hinted(att(0, k, status(503)), "2", 2000),
                    att(1950, k, SUCCESS),
                ],
                ok(),
                1960,
            ),
            vec![("idem.client.retry-after", Pass, Class::Semantics)],
        ),
        (
            "an HTTP date within its one-second resolution",
            "retry-after.429-date",
            rec(
                vec![
                    hinted(
                        att(0, k, status(429)),
                        "Wed, 02 Dec 2026 10:00:04 GMT",
                        3400,
                    ),
                    att(2500, k, SUCCESS),
                ],
                ok(),
                2510,
            ),
            vec![("idem.client.retry-after", Pass, Class::Semantics)],
        ),
        (
            "an HTTP date ignored",
            "retry-after.429-date",
            rec(
                vec![
                    hinted(
                        att(0, k, status(429)),
                        "Wed, 02 Dec 2026 10:00:04 GMT",
                        3400,
                    ),
                    att(300, k, SUCCESS),
                ],
                ok(),
                310,
            ),
            vec![("idem.client.retry-after", Fail, Class::Semantics)],
        ),
        (
            "a hint past the deadline: stopped at once",
            "retry-after.past-deadline",
            rec(
                vec![hinted(att(0, k, status(503)), "60", 60_000)],
                Exit::Finished {
                    ok: false,
                    code: Some(1),
                },
                400,
            ),
            vec![("idem.client.retry-after", Pass, Class::Semantics)],
        ),
        (
            "a hint past the deadline: waited for it until killed",
            "retry-after.past-deadline",
            rec(
                vec![hinted(att(0, k, status(503)), "60", 60_000)],
                Exit::Killed(Kill::PastDeadline),
                37_500,
            ),
            vec![
                ("idem.client.retry-after", Fail, Class::Semantics),
                ("idem.client.deadline", Fail, Class::Semantics),
            ],
        ),
        (
            "the deadline met within its tolerance",
            "limits.hang",
            rec(
                vec![
                    att(0, k, Answer::Held),
                    att(10_300, k, Answer::Held),
                    att(21_000, k, Answer::Held),
                ],
                Exit::Finished {
                    ok: false,
                    code: Some(1),
                },
                31_200,
            ),
            vec![
                ("idem.client.deadline", Pass, Class::Semantics),
                ("idem.client.max-attempts", Pass, Class::Semantics),
            ],
        ),
        (
            "the deadline reset per attempt",
            "limits.hang",
            rec(
                vec![att(0, k, Answer::Held), att(30_300, k, Answer::Held)],
                Exit::Killed(Kill::PastDeadline),
                37_500,
            ),
            vec![("idem.client.deadline", Fail, Class::Semantics)],
        ),
        (
            "four attempts at an always-503",
            "limits.always-503",
            rec(
                (0..4).map(|i| att(i * 500, k, status(503))).collect(),
                Exit::Finished {
                    ok: false,
                    code: Some(1),
                },
                1600,
            ),
            vec![("idem.client.max-attempts", NonStrict, Class::Semantics)],
        ),
        (
            "409s in flight go uncounted",
            "limits.always-503",
            rec(
                vec![
                    att(
                        0,
                        k,
                        Answer::Status {
                            code: 409,
                            retry_after: None,
                            problem: Some(IN_FLIGHT_CODE),
                        },
                    ),
                    att(
                        1000,
                        k,
                        Answer::Status {
                            code: 409,
                            retry_after: None,
                            problem: Some(IN_FLIGHT_CODE),
                        },
                    ),
                    att(2000, k, status(503)),
                    att(2500, k, status(503)),
                    att(3000, k, SUCCESS),
                ],
                ok(),
                3010,
            ),
            vec![("idem.client.max-attempts", Pass, Class::Semantics)],
        ),
        (
            "no key on the plain success",
            scenario::PREFLIGHT,
            rec(vec![att(0, None, SUCCESS)], ok(), 10),
            vec![("idem.client.auto-key", NonStrict, Class::Safety)],
        ),
        (
            "a quoted key is one key",
            scenario::PREFLIGHT,
            rec(vec![att(0, Some("\"order-42\""), SUCCESS)], ok(), 10),
            vec![
                ("idem.key.syntax", Pass, Class::Interop),
                ("idem.client.auto-key", Pass, Class::Safety),
            ],
        ),
        (
            "a key of 256 characters",
            scenario::PREFLIGHT,
            rec(vec![att(0, Some(&"k".repeat(256)), SUCCESS)], ok(), 10),
            vec![("idem.key.syntax", Fail, Class::Interop)],
        ),
    ];
    for (what, sc, r, want) in &table {
        let checks = judge_run(&scenario(sc), r, &Limits::default());
        for (clause, verdict, class) in want {
            assert_eq!(
                verdict_of(&checks, clause),
                Some((*verdict, *class)),
                "{what}: {clause}\n{checks:#?}"
            );
        }
        // Nothing but the expected failures fail.
        for c in checks.iter().filter(|c| c.verdict != Pass) {
            assert!(
                want.iter()
                    .any(|(id, v, _)| *id == c.clause && *v == c.verdict),
                "{what}: unexpected {} {}",
                c.clause,
                c.verdict
            );
        }
    }
}

#[test]
fn header_spelling_is_case_insensitive_but_the_name_is_not_negotiable() {
    let sc = scenario(scenario::PREFLIGHT);
    let mut lower = att(0, None, SUCCESS);
    lower
        .headers
        .push(("idempotency-key".to_owned(), "k".to_owned()));
    let checks = judge_run(&sc, &rec(vec![lower], ok(), 10), &Limits::default());
    assert_eq!(
        verdict_of(&checks, "idem.key.header"),
        Some((Verdict::Pass, Class::Interop))
    );
    let mut vendor = att(0, None, SUCCESS);
    vendor
        .headers
        .push(("X-Idempotency-Key".to_owned(), "k".to_owned()));
    let checks = judge_run(&sc, &rec(vec![vendor], ok(), 10), &Limits::default());
    assert_eq!(
        verdict_of(&checks, "idem.key.header"),
        Some((Verdict::Fail, Class::Interop))
    );
    let mut twice = att(0, Some("a"), SUCCESS);
    twice
        .headers
        .push(("Idempotency-Key".to_owned(), "b".to_owned()));
    let checks = judge_run(&sc, &rec(vec![twice], ok(), 10), &Limits::default());
    assert_eq!(
        verdict_of(&checks, "idem.key.syntax"),
        Some((Verdict::Fail, Class::Interop))
    );
}

#[test]
fn a_key_shared_by_two_operations_fails() {
    let runs = |keys: &[&str]| -> Vec<(String, String)> {
        keys.iter()
            .enumerate()
            .map(|(i, k)| (format!("run {i}"), (*k).to_owned()))
            .collect()
    };
    let fresh = judge_key_per_operation(&runs(&["a", "b", "c"])).expect("judged");
    assert_eq!(fresh.verdict, Verdict::Pass);
    let shared = judge_key_per_operation(&runs(&["a", "b", "a"])).expect("judged");
    assert_eq!(
        (shared.verdict, shared.class),
        (Verdict::Fail, Class::Safety)
    );
    assert!(judge_key_per_operation(&runs(&["a"])).is_none());
}

/// splitmix64: a seeded generator for the simulations, so they are
/// deterministic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn uniform(&mut self, max: Duration) -> Duration {
        max.mul_f64((self.next() >> 11) as f64 / (1u64 << 53) as f64)
    }
}

fn judged_constant(delays: &[Duration]) -> bool {
    let checks = judge_jitter(delays, delays.len()).expect("enough samples");
    checks.iter().all(|c| c.verdict == Verdict::NonStrict)
}

#[test]
fn the_jitter_test_false_alarm_rate_matches_its_formula() {
    // At the contract's defaults the stated rate is tiny.
    let stated = false_alarm_rate(12, JITTER_THRESHOLD, FIRST_CEILING);
    assert!((stated - 6.22e-5).abs() < 1e-6, "{stated}");
    // Without trimming the formula would be n r^(n-1) - (n-1) r^n; with
    // it, P(Binomial(n, r) >= n - 3). Spot-check n = 8, r = 0.2.
    let p8 = false_alarm_rate(8, JITTER_THRESHOLD, ms(500));
    assert!((p8 - 0.010_406).abs() < 1e-5, "{p8}");
    let mut rng = Rng(23);
    const TRIALS: usize = 20_000;
    let alarms = (0..TRIALS)
        .filter(|_| {
            let d: Vec<Duration> = (0..12).map(|_| rng.uniform(FIRST_CEILING)).collect();
            judged_constant(&d)
        })
        .count();
    // Expected 1.2 of 20,000; 10 is far in the tail.
    assert!(alarms <= 10, "{alarms} false alarms in {TRIALS}");
    // Where false alarms are common (a 150 ms ceiling), the simulation
    // agrees with the formula: the formula is what the report states.
    let ceiling = ms(200);
    let p = false_alarm_rate(12, JITTER_THRESHOLD, ceiling);
    assert!(p > 0.05, "{p}: a rate the simulation can measure");
    let alarms = (0..TRIALS)
        .filter(|_| {
            let d: Vec<Duration> = (0..12).map(|_| rng.uniform(ceiling)).collect();
            judged_constant(&d)
        })
        .count();
    let measured = alarms as f64 / TRIALS as f64;
    assert!(
        (measured - p).abs() < 0.015,
        "formula {p:.4}, simulated {measured:.4}"
    );
}

#[test]
fn a_constant_delay_with_scheduling_noise_is_caught() {
    let mut rng = Rng(7);
    for _ in 0..1000 {
        let d: Vec<Duration> = (0..8).map(|_| ms(500) + rng.uniform(ms(60))).collect();
        assert!(judged_constant(&d), "{d:?}");
    }
    assert!(judge_jitter(&[ms(1), ms(2), ms(3)], 8).is_none(), "too few");
}
