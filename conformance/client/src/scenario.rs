//! The scenarios: for each, the script of answers the fault server gives,
//! attempt after attempt, and what the scenario is about. Pure data.

/// The in-flight problem `code` the kit's 409 carries (the reference
/// profile's, with `"retryable": true`).
pub const IN_FLIGHT_CODE: &str = "idempotency_key_in_use";
/// The mismatch problem `code` (`"retryable": false`).
pub const MISMATCH_CODE: &str = "idempotency_key_mismatch";

/// How a `Retry-After` hint is spelt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hint {
    /// Delta-seconds.
    Seconds(u64),
    /// An HTTP date this many whole seconds after the next full second.
    DateIn(u64),
    /// Delta-seconds this many seconds past the client's deadline.
    PastDeadline(u64),
}

/// What the server does with one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The success answer (201 for a POST, else 200) with the success body.
    Success,
    /// An error status, optionally with a hint and a problem code.
    Status {
        /// The status code.
        code: u16,
        /// The `Retry-After` hint.
        hint: Option<Hint>,
        /// The problem document's `code`.
        problem: Option<&'static str>,
    },
    /// Reset the connection before reading the request.
    ResetBeforeRead,
    /// Read the request, then reset the connection.
    ResetAfterRead,
    /// Read the request and never answer.
    Hold,
}

const fn status(code: u16) -> Step {
    Step::Status {
        code,
        hint: None,
        problem: None,
    }
}

const fn hinted(code: u16, hint: Hint) -> Step {
    Step::Status {
        code,
        hint: Some(hint),
        problem: None,
    }
}

const fn problem(code: u16, p: &'static str) -> Step {
    Step::Status {
        code,
        hint: None,
        problem: Some(p),
    }
}

/// One scenario: a script and what it is about.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Stable ID, `family.name`.
    pub id: &'static str,
    /// One line for the report.
    pub title: &'static str,
    /// The answers in order; the last one repeats for every later attempt.
    pub script: Vec<Step>,
    /// Whether it runs repeatedly, one run after another, for a statistic
    /// over the runs: the jitter scenario runs `--runs` times,
    /// [`RESET_RUNS_ID`] [`RESET_RUNS`] times.
    pub repeated: bool,
}

impl Scenario {
    /// The step for the `n`th attempt (0-based): the last step repeats.
    pub fn step(&self, n: usize) -> Step {
        self.script
            .get(n)
            .or(self.script.last())
            .copied()
            .unwrap_or(Step::Success)
    }

    /// The family: the ID's part before the first dot.
    pub fn family(&self) -> &'static str {
        self.id.split('.').next().unwrap_or(self.id)
    }
}

/// The scenario every run starts with (alone): a plain success. It proves
/// the command talks to the API before the rest run in parallel.
pub const PREFLIGHT: &str = "basics.success";
/// The scenario run `--runs` times for the jitter test.
pub const JITTER: &str = "backoff.jitter";
/// The scenario run [`RESET_RUNS`] times for the zero-backoff test: a lost
/// connection, then success; does the resend wait?
pub const RESET_RUNS_ID: &str = "backoff.reset-runs";
/// How many runs [`RESET_RUNS_ID`] makes, one after another.
pub const RESET_RUNS: usize = 6;
/// The scenario whose every attempt is reset.
pub const RESET_FOREVER: &str = "limits.always-reset";

/// Every scenario, in report order. `ra` is the `Retry-After` in seconds
/// the hinted scenarios use (the seed picks 2 or 3).
pub fn all(ra: u64) -> Vec<Scenario> {
    use Step::*;
    let s = |id, title, script: Vec<Step>| Scenario {
        id,
        title,
        script,
        repeated: false,
    };
    vec![
        s(
            PREFLIGHT,
            "a plain success: one attempt, with a key",
            vec![Success],
        ),
        Scenario {
            id: JITTER,
            title: "503 then success, run repeatedly: is the first delay random?",
            script: vec![status(503), Success],
            repeated: true,
        },
        Scenario {
            id: RESET_RUNS_ID,
            title: "request read, connection reset, then success, run repeatedly: does the resend wait?",
            script: vec![ResetAfterRead, Success],
            repeated: true,
        },
        s("retry.502", "502 then success", vec![status(502), Success]),
        s("retry.504", "504 then success", vec![status(504), Success]),
        s(
            "retry.500",
            "500 then success: a retry needs the key",
            vec![status(500), Success],
        ),
        s(
            "retry.reset-before-read",
            "connection reset before the request was read, then success",
            vec![ResetBeforeRead, Success],
        ),
        s(
            "retry.reset-after-read",
            "request read, connection reset, then success",
            vec![ResetAfterRead, Success],
        ),
        s(
            "retry.slow-answer",
            "no answer to the first attempt (the client must time out), then success",
            vec![Hold, Success],
        ),
        s(
            "retry.in-flight",
            "409 in flight with Retry-After: 1, then success",
            vec![
                Status {
                    code: 409,
                    hint: Some(Hint::Seconds(1)),
                    problem: Some(IN_FLIGHT_CODE),
                },
                Success,
            ],
        ),
        s(
            "retry-after.503-seconds",
            "503 with Retry-After in seconds, then success",
            vec![hinted(503, Hint::Seconds(ra)), Success],
        ),
        s(
            "retry-after.429-seconds",
            "429 with Retry-After in seconds, then success",
            vec![hinted(429, Hint::Seconds(ra)), Success],
        ),
        s(
            "retry-after.429-date",
            "429 with Retry-After as an HTTP date, then success",
            vec![hinted(429, Hint::DateIn(ra + 1)), Success],
        ),
        s(
            "retry-after.past-deadline",
            "503 whose Retry-After lands past the deadline: stop at once",
            vec![hinted(503, Hint::PastDeadline(30)), Success],
        ),
        s(
            "final.400",
            "400: final, never retried",
            vec![problem(400, "invalid_request"), Success],
        ),
        s(
            "final.401",
            "401: final, never retried",
            vec![problem(401, "unauthenticated"), Success],
        ),
        s(
            "final.404",
            "404: final, never retried",
            vec![problem(404, "not_found"), Success],
        ),
        s(
            "final.422",
            "422: final, never retried",
            vec![problem(422, "unprocessable"), Success],
        ),
        s(
            "final.409-mismatch",
            "409 key mismatch (retryable false): final, never retried",
            vec![problem(409, MISMATCH_CODE), Success],
        ),
        s(
            "limits.always-503",
            "503 on every attempt: how many attempts, for how long?",
            vec![status(503)],
        ),
        s(
            RESET_FOREVER,
            "every attempt read and its connection reset: are resets counted against the cap?",
            vec![ResetAfterRead],
        ),
        s(
            "limits.hang",
            "no attempt is ever answered: does the overall deadline hold?",
            vec![Hold],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_the_last_step_repeats() {
        let all = all(2);
        let mut ids: Vec<&str> = all.iter().map(|s| s.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), all.len());
        let hang = all.iter().find(|s| s.id == "limits.hang").expect("hang");
        assert_eq!(hang.step(7), Step::Hold);
        let jitter = all.iter().find(|s| s.id == JITTER).expect("jitter");
        assert_eq!(jitter.step(0), status(503));
        assert_eq!(jitter.step(5), Step::Success);
        assert_eq!(all[0].id, PREFLIGHT, "the preflight runs first");
        let forever = all
            .iter()
            .find(|s| s.id == RESET_FOREVER)
            .expect("reset forever");
        assert_eq!(forever.step(40), Step::ResetAfterRead);
        let resets = all
            .iter()
            .find(|s| s.id == RESET_RUNS_ID)
            .expect("reset runs");
        assert!(resets.repeated);
        assert_eq!(
            (resets.step(0), resets.step(1)),
            (Step::ResetAfterRead, Step::Success)
        );
    }
}
