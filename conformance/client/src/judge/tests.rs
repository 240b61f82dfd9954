//! Table tests of the verdicts: hand-built records, the verdicts they must
//! and must not produce.

use super::*;
use crate::record::{Attempt, KeySource};
use crate::scenario::{IN_FLIGHT_CODE, MISMATCH_CODE, all};
use idem_spec::clauses::Class;

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

/// An attempt arriving `t` ms into the run, with the `Request-Deadline-Ms` a
/// client with the default 30 s deadline, started at 0, sends then.
fn att(t: u64, key: Option<&str>, answer: Answer) -> Attempt {
    let mut headers = vec![
        ("Content-Type".to_owned(), "application/json".to_owned()),
        (
            "Request-Deadline-Ms".to_owned(),
            30_000u64.saturating_sub(t).to_string(),
        ),
    ];
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
    // The worst verdict, and of equal verdicts the worst class.
    checks
        .iter()
        .filter(|c| c.clause == clause)
        .map(|c| (c.verdict, c.class))
        .max_by_key(|(v, c)| (*v, *c))
}

const S: &str = "retry.502";
const SUCCESS: Answer = Answer::Success { code: 201 };

fn failed(code: i32) -> Exit {
    Exit::Finished {
        ok: false,
        code: Some(code),
    }
}

fn held(t: u64, key: Option<&str>, gave_up: Option<u64>) -> Attempt {
    let mut a = att(t, key, Answer::Held);
    a.answered = None;
    a.client_gave_up = gave_up.map(ms);
    a
}

fn with_header(mut a: Attempt, name: &str, value: &str) -> Attempt {
    a.headers.push((name.to_owned(), value.to_owned()));
    a
}

/// `a` with its `Request-Deadline-Ms` set to `value` (`None`: removed).
fn with_deadline(mut a: Attempt, value: Option<&str>) -> Attempt {
    a.headers.retain(|(n, _)| n != "Request-Deadline-Ms");
    if let Some(v) = value {
        a.headers
            .push(("Request-Deadline-Ms".to_owned(), v.to_owned()));
    }
    a
}

fn with_body(mut a: Attempt, body: &str) -> Attempt {
    a.body = body.to_owned();
    a
}

/// One row: what, the scenario, the record, the limits, and for each
/// clause the expected worst (verdict, class), or `None`: no check made.
type Row = (
    &'static str,
    &'static str,
    RunRecord,
    Limits,
    Vec<(&'static str, Option<(Verdict, Class)>)>,
);

fn judged(table: Vec<Row>) {
    for (what, sc, r, lim, want) in &table {
        let checks = judge_run(&scenario(sc), r, lim);
        for (clause, expected) in want {
            assert_eq!(
                verdict_of(&checks, clause),
                *expected,
                "{what}: {clause}\n{checks:#?}"
            );
        }
        // Nothing but the expected failures fail.
        for c in checks.iter().filter(|c| c.verdict != Verdict::Pass) {
            assert!(
                want.iter()
                    .any(|(id, v)| *id == c.clause && v.is_some_and(|(v, _)| v == c.verdict)),
                "{what}: unexpected {} {}\n{checks:#?}",
                c.clause,
                c.verdict
            );
        }
    }
}

fn lim() -> Limits {
    Limits::default()
}

#[test]
fn verdicts_over_recorded_attempts() {
    use Verdict::{Fail, NonStrict, Pass};
    let k = Some("k-1");
    let (safety, semantics, interop) = (Class::Safety, Class::Semantics, Class::Interop);
    let table: Vec<Row> = vec![
        (
            "same key on a retry of a 503",
            S,
            rec(
                vec![att(0, k, status(503)), att(300, k, SUCCESS)],
                ok(),
                310,
            ),
            lim(),
            vec![
                ("idem.client.same-key", Some((Pass, safety))),
                ("idem.client.no-key-no-retry", Some((Pass, safety))),
                ("idem.client.deadline", Some((Pass, semantics))),
                (EXIT_CHECK, Some((Pass, semantics))),
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
            lim(),
            vec![("idem.client.same-key", Some((Fail, safety)))],
        ),
        (
            "the key dropped on the retry",
            S,
            rec(
                vec![att(0, k, status(503)), att(300, None, SUCCESS)],
                ok(),
                310,
            ),
            lim(),
            vec![
                ("idem.client.same-key", Some((Pass, safety))),
                ("idem.client.no-key-no-retry", Some((Fail, safety))),
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
            lim(),
            vec![("idem.client.no-key-no-retry", Some((Fail, safety)))],
        ),
        (
            "key-less retry of a 500",
            "retry.500",
            rec(
                vec![att(0, None, status(500)), att(200, None, SUCCESS)],
                ok(),
                210,
            ),
            lim(),
            vec![
                ("idem.client.500-with-key", Some((Fail, safety))),
                ("idem.client.no-key-no-retry", Some((Fail, safety))),
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
            lim(),
            vec![("idem.client.500-with-key", Some((Pass, safety)))],
        ),
        (
            "a 400 retried with the same key: semantics, never a second effect",
            "final.400",
            rec(
                vec![att(0, k, status(400)), att(200, k, SUCCESS)],
                ok(),
                210,
            ),
            lim(),
            vec![
                ("idem.client.allowlist", Some((Fail, semantics))),
                ("idem.client.same-key", Some((Pass, safety))),
            ],
        ),
        (
            "a 409 mismatch retried with the same key, as the Stripe SDKs do",
            "final.409-mismatch",
            rec(
                vec![
                    att(
                        0,
                        k,
                        Answer::Status {
                            code: 409,
                            retry_after: None,
                            problem: Some(MISMATCH_CODE),
                        },
                    ),
                    att(700, k, SUCCESS),
                ],
                ok(),
                710,
            ),
            lim(),
            vec![
                ("idem.client.allowlist", Some((Fail, semantics))),
                ("idem.client.same-key", Some((Pass, safety))),
            ],
        ),
        (
            "a 400 retried with a fresh key: the fresh key is the safety finding",
            "final.400",
            rec(
                vec![att(0, k, status(400)), att(200, Some("k-2"), SUCCESS)],
                ok(),
                210,
            ),
            lim(),
            vec![
                ("idem.client.allowlist", Some((Fail, semantics))),
                ("idem.client.same-key", Some((Fail, safety))),
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
                failed(1),
                10,
            ),
            lim(),
            vec![
                ("idem.client.allowlist", Some((Pass, semantics))),
                (EXIT_CHECK, Some((Pass, semantics))),
            ],
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
            lim(),
            vec![("idem.client.retry-after", Some((Fail, semantics)))],
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
            lim(),
            vec![("idem.client.retry-after", Some((Pass, semantics)))],
        ),
        (
            "a hint and no retry at all: retry-after not applicable",
            "retry-after.503-seconds",
            rec(
                vec![hinted(att(0, k, status(503)), "2", 2000)],
                failed(22),
                20,
            ),
            lim(),
            vec![
                ("idem.client.retry-after", None),
                (EXIT_CHECK, Some((Pass, semantics))),
            ],
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
            lim(),
            vec![("idem.client.retry-after", Some((Pass, semantics)))],
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
            lim(),
            vec![("idem.client.retry-after", Some((Fail, semantics)))],
        ),
        (
            "a hint past the deadline: a retrier stopped at once",
            "retry-after.past-deadline",
            rec(
                vec![hinted(att(0, k, status(503)), "60", 60_000)],
                failed(1),
                400,
            ),
            lim(),
            vec![("idem.client.retry-after", Some((Pass, semantics)))],
        ),
        (
            "a hint past the deadline: a client that never retries proves nothing by stopping",
            "retry-after.past-deadline",
            rec(
                vec![hinted(att(0, k, status(503)), "60", 60_000)],
                failed(22),
                40,
            ),
            Limits {
                retrier: false,
                ..lim()
            },
            vec![("idem.client.retry-after", None)],
        ),
        (
            "a hint past the deadline honoured in full, killed at the bound: the deadline's finding, once",
            "retry-after.past-deadline",
            rec(
                vec![hinted(att(0, k, status(503)), "60", 60_000)],
                Exit::Killed(Kill::PastDeadline),
                37_500,
            ),
            lim(),
            vec![
                ("idem.client.retry-after", None),
                ("idem.client.deadline", Some((Fail, semantics))),
                (EXIT_CHECK, None),
            ],
        ),
        (
            "a hint past the deadline: waited 10 s, then gave up within the deadline",
            "retry-after.past-deadline",
            rec(
                vec![hinted(att(0, k, status(503)), "60", 60_000)],
                failed(1),
                10_400,
            ),
            lim(),
            vec![
                ("idem.client.retry-after", Some((Fail, semantics))),
                ("idem.client.deadline", Some((Pass, semantics))),
            ],
        ),
        (
            "a hint past the deadline undercut by a retry",
            "retry-after.past-deadline",
            rec(
                vec![
                    hinted(att(0, k, status(503)), "60", 60_000),
                    att(800, k, SUCCESS),
                ],
                ok(),
                810,
            ),
            lim(),
            vec![("idem.client.retry-after", Some((Fail, semantics)))],
        ),
        (
            "a date hint past a short deadline waited out, retried past the deadline: counted once",
            "retry-after.429-date",
            rec(
                vec![
                    hinted(
                        with_deadline(att(0, k, status(429)), Some("3000")),
                        "Wed, 02 Dec 2026 10:00:04 GMT",
                        4000,
                    ),
                    // What it sends once the deadline has passed: nothing left.
                    with_deadline(att(4004, k, SUCCESS), Some("0")),
                ],
                ok(),
                4020,
            ),
            Limits {
                deadline: Duration::from_secs(3),
                ..lim()
            },
            vec![
                ("idem.client.retry-after", None),
                ("idem.client.deadline", Some((Fail, semantics))),
            ],
        ),
        (
            "the deadline met within its tolerance",
            "limits.hang",
            rec(
                vec![
                    held(0, k, Some(10_000)),
                    held(10_300, k, Some(20_300)),
                    held(21_000, k, Some(30_000)),
                ],
                failed(1),
                31_200,
            ),
            lim(),
            vec![
                ("idem.client.deadline", Some((Pass, semantics))),
                ("idem.client.max-attempts", Some((Pass, semantics))),
            ],
        ),
        (
            "the deadline reset per attempt",
            "limits.hang",
            rec(
                vec![held(0, k, Some(30_000)), held(30_300, k, None)],
                Exit::Killed(Kill::PastDeadline),
                37_500,
            ),
            lim(),
            vec![("idem.client.deadline", Some((Fail, semantics)))],
        ),
        (
            "no deadline: three 11 s attempts, ended 0.3 s under the kill bound",
            "limits.hang",
            rec(
                vec![
                    held(0, k, Some(11_000)),
                    held(11_200, k, Some(22_200)),
                    held(22_900, k, Some(33_900)),
                ],
                failed(1),
                34_700,
            ),
            lim(),
            vec![
                ("idem.client.deadline", Some((Fail, semantics))),
                ("idem.client.max-attempts", Some((Pass, semantics))),
            ],
        ),
        (
            "an attempt sent after the deadline, the run short of any bound",
            "limits.always-503",
            rec(
                vec![
                    att(0, k, status(503)),
                    att(29_000, k, status(503)),
                    att(31_800, k, status(503)),
                ],
                failed(1),
                31_850,
            ),
            lim(),
            vec![
                ("idem.client.deadline", Some((Fail, semantics))),
                ("idem.client.max-attempts", Some((Pass, semantics))),
            ],
        ),
        (
            "a sleep past the deadline, then giving up",
            "limits.always-503",
            rec(
                vec![att(0, k, status(503)), att(20_000, k, status(503))],
                failed(1),
                33_000,
            ),
            lim(),
            vec![("idem.client.deadline", Some((Fail, semantics)))],
        ),
        (
            "four attempts at an always-503",
            "limits.always-503",
            rec(
                (0..4).map(|i| att(i * 500, k, status(503))).collect(),
                failed(1),
                1600,
            ),
            lim(),
            vec![
                ("idem.client.max-attempts", Some((NonStrict, semantics))),
                ("idem.client.attempt-cap", Some((Pass, semantics))),
            ],
        ),
        (
            "eleven requests at an always-503, stopped by count",
            "limits.always-503",
            rec(
                (0..11).map(|i| att(i * 500, k, status(503))).collect(),
                failed(1),
                5_600,
            ),
            lim(),
            vec![
                ("idem.client.attempt-cap", Some((Fail, semantics))),
                ("idem.client.max-attempts", Some((NonStrict, semantics))),
            ],
        ),
        (
            "ten requests at an always-503: the default bound, kept",
            "limits.always-503",
            rec(
                (0..10).map(|i| att(i * 500, k, status(503))).collect(),
                failed(1),
                5_100,
            ),
            lim(),
            vec![
                ("idem.client.attempt-cap", Some((Pass, semantics))),
                ("idem.client.max-attempts", Some((NonStrict, semantics))),
            ],
        ),
        (
            "resets never counted: resent until the deadline",
            scenario::RESET_FOREVER,
            rec(
                (0..9)
                    .map(|i| att(i * 3_000, k, Answer::ResetAfterRead))
                    .collect(),
                failed(1),
                30_500,
            ),
            lim(),
            vec![
                ("idem.client.max-attempts", Some((NonStrict, semantics))),
                ("idem.client.attempt-cap", Some((Pass, semantics))),
                ("idem.client.deadline", Some((Pass, semantics))),
            ],
        ),
        (
            "resets counted: three attempts",
            scenario::RESET_FOREVER,
            rec(
                (0..3)
                    .map(|i| att(i * 400, k, Answer::ResetAfterRead))
                    .collect(),
                failed(1),
                900,
            ),
            lim(),
            vec![("idem.client.max-attempts", Some((Pass, semantics)))],
        ),
        (
            "resets resent past the kit's request ceiling",
            scenario::RESET_FOREVER,
            rec(
                (0..16)
                    .map(|i| att(i * 10, k, Answer::ResetAfterRead))
                    .collect(),
                Exit::Killed(Kill::TooManyAttempts),
                170,
            ),
            lim(),
            vec![
                ("idem.client.max-attempts", Some((NonStrict, semantics))),
                ("idem.client.attempt-cap", Some((Fail, semantics))),
            ],
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
            lim(),
            vec![("idem.client.max-attempts", Some((Pass, semantics)))],
        ),
        (
            "a deadline header that shrinks as time passes",
            "limits.always-503",
            rec(
                vec![
                    with_deadline(att(0, k, status(503)), Some("29990")),
                    with_deadline(att(1_000, k, status(503)), Some("29000")),
                    with_deadline(att(3_000, k, status(503)), Some("27100")),
                ],
                failed(1),
                3_010,
            ),
            lim(),
            vec![
                ("idem.client.deadline-header", Some((Pass, semantics))),
                (
                    "idem.client.deadline-header-truthful",
                    Some((Pass, semantics)),
                ),
            ],
        ),
        (
            "a deadline header restarted on every attempt",
            "limits.hang",
            rec(
                vec![
                    with_deadline(held(0, k, Some(10_000)), Some("30000")),
                    with_deadline(held(10_300, k, Some(20_300)), Some("30000")),
                    with_deadline(held(21_000, k, Some(30_000)), Some("30000")),
                ],
                failed(1),
                30_100,
            ),
            lim(),
            vec![(
                "idem.client.deadline-header-truthful",
                Some((Fail, semantics)),
            )],
        ),
        (
            "a deadline header claiming more than the deadline",
            "limits.always-503",
            rec(
                vec![with_deadline(att(0, k, status(503)), Some("60000"))],
                failed(1),
                10,
            ),
            lim(),
            vec![(
                "idem.client.deadline-header-truthful",
                Some((Fail, semantics)),
            )],
        ),
        (
            "no deadline header: a missed SHOULD, and nothing to hold it to",
            "limits.always-503",
            rec(
                vec![
                    with_deadline(att(0, k, status(503)), None),
                    with_deadline(att(400, k, status(503)), None),
                ],
                failed(1),
                410,
            ),
            lim(),
            vec![
                ("idem.client.deadline-header", Some((NonStrict, semantics))),
                ("idem.client.deadline-header-truthful", None),
            ],
        ),
        (
            "a deadline header only on the first attempt",
            "limits.always-503",
            rec(
                vec![
                    att(0, k, status(503)),
                    with_deadline(att(400, k, status(503)), None),
                ],
                failed(1),
                410,
            ),
            lim(),
            vec![
                ("idem.client.deadline-header", Some((NonStrict, semantics))),
                (
                    "idem.client.deadline-header-truthful",
                    Some((Pass, semantics)),
                ),
            ],
        ),
        (
            "no key on the plain success",
            scenario::PREFLIGHT,
            rec(vec![att(0, None, SUCCESS)], ok(), 10),
            lim(),
            vec![("idem.client.auto-key", Some((NonStrict, safety)))],
        ),
        (
            "a quoted key is one key",
            scenario::PREFLIGHT,
            rec(vec![att(0, Some("\"order-42\""), SUCCESS)], ok(), 10),
            lim(),
            vec![
                ("idem.key.syntax", Some((Pass, interop))),
                ("idem.client.auto-key", Some((Pass, safety))),
            ],
        ),
        (
            "a key of 256 characters",
            scenario::PREFLIGHT,
            rec(vec![att(0, Some(&"k".repeat(256)), SUCCESS)], ok(), 10),
            lim(),
            vec![("idem.key.syntax", Some((Fail, interop)))],
        ),
        (
            "a 201 and then exit 1: the caller is told it failed",
            scenario::PREFLIGHT,
            rec(vec![att(0, k, SUCCESS)], failed(1), 10),
            lim(),
            vec![(EXIT_CHECK, Some((Fail, semantics)))],
        ),
        (
            "a final 400 and then exit 0: the caller is told it succeeded",
            "final.400",
            rec(vec![att(0, k, status(400))], ok(), 10),
            lim(),
            vec![
                (EXIT_CHECK, Some((Fail, semantics))),
                ("idem.client.allowlist", Some((Pass, semantics))),
            ],
        ),
        (
            "a closure that got its 201 and returned false",
            S,
            rec(
                vec![att(0, k, status(503)), att(300, k, SUCCESS)],
                Exit::Finished {
                    ok: false,
                    code: None,
                },
                310,
            ),
            lim(),
            vec![(EXIT_CHECK, Some((Fail, semantics)))],
        ),
    ];
    judged(table);
}

#[test]
fn keys_are_read_where_the_api_reads_them_and_a_tracing_id_is_never_one() {
    use Verdict::{Fail, Pass};
    let body_key = |t, key: &str, answer| {
        with_body(
            att(t, None, answer),
            &format!(r#"{{"amount":1000,"idempotency_key":"{key}"}}"#),
        )
    };
    let in_body = Limits {
        keys: KeySource::new(None, Some("/idempotency_key")).expect("a pointer"),
        ..lim()
    };
    let custom_header = Limits {
        keys: KeySource::new(Some("X-Idempotency-Key"), None).expect("a header"),
        ..lim()
    };
    let tracing = |t, answer| with_header(att(t, None, answer), "x-ms-client-request-id", "t-1");
    let table: Vec<Row> = vec![
        (
            "a key in the body, the same on the retry",
            S,
            rec(
                vec![
                    body_key(0, "b-1", status(503)),
                    body_key(300, "b-1", SUCCESS),
                ],
                ok(),
                310,
            ),
            in_body.clone(),
            vec![
                ("idem.client.same-key", Some((Pass, Class::Safety))),
                ("idem.client.no-key-no-retry", Some((Pass, Class::Safety))),
                // The key's header clauses are the contract's header's.
                ("idem.key.header", None),
                ("idem.key.syntax", None),
            ],
        ),
        (
            "a key in the body, fresh on the retry",
            S,
            rec(
                vec![
                    body_key(0, "b-1", status(503)),
                    body_key(300, "b-2", SUCCESS),
                ],
                ok(),
                310,
            ),
            in_body.clone(),
            vec![("idem.client.same-key", Some((Fail, Class::Safety)))],
        ),
        (
            "the key pointer given, but no key in the body",
            "retry.reset-after-read",
            rec(
                vec![
                    att(0, Some("hdr"), Answer::ResetAfterRead),
                    att(300, Some("hdr"), SUCCESS),
                ],
                ok(),
                310,
            ),
            in_body,
            vec![("idem.client.no-key-no-retry", Some((Fail, Class::Safety)))],
        ),
        (
            "a key in a vendor header the kit was told about",
            S,
            rec(
                vec![
                    with_header(att(0, None, status(503)), "X-Idempotency-Key", "v-1"),
                    with_header(att(300, None, SUCCESS), "X-Idempotency-Key", "v-1"),
                ],
                ok(),
                310,
            ),
            custom_header,
            vec![
                ("idem.client.same-key", Some((Pass, Class::Safety))),
                ("idem.key.header", None),
            ],
        ),
        (
            "a tracing id resent unchanged is no key",
            "retry.reset-after-read",
            rec(
                vec![tracing(0, Answer::ResetAfterRead), tracing(300, SUCCESS)],
                ok(),
                310,
            ),
            lim(),
            vec![
                ("idem.client.no-key-no-retry", Some((Fail, Class::Safety))),
                ("idem.client.same-key", None),
            ],
        ),
    ];
    judged(table);
    // The finding says why the tracing id did not count.
    let r = rec(
        vec![tracing(0, Answer::ResetAfterRead), tracing(300, SUCCESS)],
        ok(),
        310,
    );
    let checks = judge_run(&scenario("retry.reset-after-read"), &r, &lim());
    let c = checks
        .iter()
        .find(|c| c.clause == "idem.client.no-key-no-retry")
        .expect("judged");
    assert!(
        c.observed.contains("x-ms-client-request-id"),
        "{}",
        c.observed
    );
    assert_eq!(resent_tracing_ids(&r), ["x-ms-client-request-id"]);
    // And the kit refuses to be told a tracing header carries keys.
    for name in [
        "x-ms-client-request-id",
        "amz-sdk-invocation-id",
        "Traceparent",
    ] {
        assert!(KeySource::new(Some(name), None).is_err(), "{name}");
    }
    assert!(KeySource::new(None, Some("idempotency_key")).is_err());
    assert!(KeySource::new(Some("Idempotency-Key"), None).is_ok_and(|k| k.is_contracts()));
}

#[test]
fn header_spelling_is_case_insensitive_but_the_name_is_not_negotiable() {
    let sc = scenario(scenario::PREFLIGHT);
    let mut lower = att(0, None, SUCCESS);
    lower
        .headers
        .push(("idempotency-key".to_owned(), "k".to_owned()));
    let checks = judge_run(&sc, &rec(vec![lower], ok(), 10), &lim());
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
    checks.iter().all(|c| c.verdict != Verdict::Pass)
}

/// How often `draw` (12 first delays) is judged constant in `trials`.
fn alarms(trials: usize, rng: &mut Rng, draw: impl Fn(&mut Rng) -> Duration) -> usize {
    (0..trials)
        .filter(|_| {
            let d: Vec<Duration> = (0..12).map(|_| draw(rng)).collect();
            judged_constant(&d)
        })
        .count()
}

#[test]
fn the_jitter_test_false_alarm_rates_match_their_formula() {
    // The stated rates at 12 runs: full jitter under the 500 ms first
    // ceiling, and jitter over only 75 to 100 % of it (125 ms wide).
    let full = false_alarm_rate(12, JITTER_THRESHOLD, FIRST_CEILING);
    assert!((full - 3.74e-10).abs() < 1e-12, "{full}");
    let narrow = false_alarm_rate(12, JITTER_THRESHOLD, NARROW_JITTER_WIDTH);
    assert!((narrow - 6.22e-5).abs() < 1e-7, "{narrow}");
    // The formula is P(Binomial(n, r) >= n - 3); spot-check n = 8, r = 0.2.
    let p8 = false_alarm_rate(8, ms(100), ms(500));
    assert!((p8 - 0.010_406).abs() < 1e-5, "{p8}");
    let mut rng = Rng(23);
    const TRIALS: usize = 20_000;
    // Full jitter: expected 7e-6 false alarms in 20,000 runs of the kit.
    let a = alarms(TRIALS, &mut rng, |r| r.uniform(FIRST_CEILING));
    assert_eq!(a, 0, "{a} false alarms for full jitter in {TRIALS}");
    // Narrow jitter (the issue's client that flipped between seeds):
    // expected 1.2 in 20,000; 10 is far in the tail.
    let a = alarms(TRIALS, &mut rng, |r| {
        ms(375) + r.uniform(NARROW_JITTER_WIDTH)
    });
    assert!(a <= 10, "{a} false alarms for narrow jitter in {TRIALS}");
    // Where false alarms are common (a draw 60 ms wide), the simulation
    // agrees with the formula: the formula is what the report states.
    let width = ms(60);
    let p = false_alarm_rate(12, JITTER_THRESHOLD, width);
    assert!(p > 0.01, "{p}: a rate the simulation can measure");
    let a = alarms(TRIALS, &mut rng, |r| ms(400) + r.uniform(width));
    let measured = a as f64 / TRIALS as f64;
    assert!(
        (measured - p).abs() < 0.005,
        "formula {p:.4}, simulated {measured:.4}"
    );
}

#[test]
fn narrow_jitter_passes_on_every_seed() {
    // The issue's flake: a client jittering over 75 to 100 % of the ceiling
    // passed about one time in five. Each seed is one run of the kit.
    for seed in 0..200 {
        let mut rng = Rng(seed);
        let d: Vec<Duration> = (0..12)
            .map(|_| ms(375) + rng.uniform(NARROW_JITTER_WIDTH))
            .collect();
        assert!(!judged_constant(&d), "seed {seed}: {d:?}");
    }
}

#[test]
fn a_constant_delay_with_scheduling_noise_is_caught() {
    let mut rng = Rng(7);
    for _ in 0..1000 {
        // 500 ms plus up to 15 ms of noise, and two runs a loaded machine
        // delayed by up to 300 ms: the two the test sets aside.
        let mut d: Vec<Duration> = (0..12).map(|_| ms(500) + rng.uniform(ms(15))).collect();
        d[3] += rng.uniform(ms(300));
        d[8] += rng.uniform(ms(300));
        assert!(judged_constant(&d), "{d:?}");
    }
    assert!(judge_jitter(&[ms(1), ms(2), ms(3)], 8).is_none(), "too few");
}

#[test]
fn the_jitter_finding_reports_the_spread_it_saw() {
    let d: Vec<Duration> = (0..12).map(|i| ms(480 + i)).collect();
    let checks = judge_jitter(&d, 12).expect("judged");
    // Full jitter as the schedule is a SHOULD; jitter at all is a MUST.
    let levels: Vec<(&str, Verdict)> = checks
        .iter()
        .map(|c| (c.clause.as_str(), c.verdict))
        .collect();
    assert_eq!(
        levels,
        [
            ("idem.client.backoff-jitter", Verdict::NonStrict),
            ("idem.client.no-unjittered-backoff", Verdict::Fail),
        ]
    );
    let c = &checks[0];
    assert!(
        c.observed.contains("0.009 s (0.480 s to 0.489 s)"),
        "{}",
        c.observed
    );
    assert!(!c.headline.as_deref().unwrap_or("").contains("same delay"));
    // Delays that differ by more than the threshold are never "the same".
    let d: Vec<Duration> = (0..12).map(|i| ms(380 + 10 * i)).collect();
    assert!(!judged_constant(&d), "spread 0.09 s");
}

#[test]
fn the_zero_backoff_allowance_and_its_false_alarm_rate() {
    // (resends, the most immediate ones a conforming client may make, the
    // false-alarm rate of flagging more): the largest k with
    // P(Binomial(n, 0.1) > k) <= 1e-4.
    let table: &[(usize, usize, f64)] = &[
        (1, 1, 0.0),
        (3, 3, 0.0),
        (4, 3, 1.0e-4),
        (5, 4, 1.0e-5),
        (6, 4, 5.5e-5),
        (8, 5, 2.341e-5),
        (12, 6, 5.018e-5),
    ];
    for &(n, k, rate) in table {
        assert_eq!(immediate_allowance(n), k, "n = {n}");
        let got = zero_backoff_false_alarm(n, k);
        assert!((got - rate).abs() < 1e-8, "n = {n}: {got}");
        assert!(got <= ZERO_BACKOFF_MAX_FALSE_ALARM * 1.000_001);
        if k < n {
            // k is the largest: one fewer would alarm too often.
            assert!(zero_backoff_false_alarm(n, k - 1) > ZERO_BACKOFF_MAX_FALSE_ALARM);
        }
    }
    assert_eq!(scenario::RESET_RUNS, 6);
}

#[test]
fn zero_backoff_after_a_reset_is_found_and_full_jitter_is_not_flagged() {
    // Resends after a reset at once (1 to 6 ms to reconnect), one delayed by
    // a loaded machine: still found.
    let at_once = [ms(2), ms(1), ms(6), ms(3), ms(140), ms(2)];
    let c = judge_zero_backoff(&at_once, 6).expect("judged");
    assert_eq!((c.verdict, c.class), (Verdict::NonStrict, Class::Semantics));
    assert_eq!(c.clause, "idem.client.backoff-jitter");
    // Four immediate of six: within the allowance.
    let four = [ms(2), ms(1), ms(6), ms(3), ms(140), ms(300)];
    assert_eq!(
        judge_zero_backoff(&four, 6).expect("judged").verdict,
        Verdict::Pass
    );
    // Too few resends to judge.
    assert!(judge_zero_backoff(&[ms(1), ms(1), ms(1)], 6).is_none());
    // Full jitter under the 500 ms ceiling, simulated: expected 5.5e-5 per
    // run of the kit, so 100,000 runs see about 5.5 false alarms.
    let mut rng = Rng(99);
    const TRIALS: usize = 100_000;
    let alarms = (0..TRIALS)
        .filter(|_| {
            let d: Vec<Duration> = (0..6).map(|_| rng.uniform(FIRST_CEILING)).collect();
            judge_zero_backoff(&d, 6).expect("judged").verdict != Verdict::Pass
        })
        .count();
    assert!(alarms <= 20, "{alarms} false alarms in {TRIALS}");
}
