//! What the fault server saw and did in one run of the client under test:
//! the plain data the judge reads, so verdicts are pure functions of it.

use std::time::Duration;

/// What the kit answered (or did instead of answering) to one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A success: `code` with the configured JSON body.
    Success {
        /// 201 for a POST, 200 otherwise.
        code: u16,
    },
    /// An error status with an optional `Retry-After` and problem `code`.
    Status {
        /// The status code.
        code: u16,
        /// The `Retry-After` value as sent.
        retry_after: Option<String>,
        /// The problem document's `code`, when the body is one.
        problem: Option<&'static str>,
    },
    /// The connection was reset (RST) before the server read the request;
    /// the bytes already received were only peeked for this record.
    ResetBeforeRead,
    /// The request was read in full, then the connection was reset.
    ResetAfterRead,
    /// The request was read and never answered.
    Held,
}

/// How the contract's allowlist classes an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// A 2xx: done.
    Done,
    /// 408, 429, 502, 503, 504: retry (with a key, for a POST).
    Transient,
    /// A 409 whose problem says the key's first request is in flight.
    InFlight,
    /// 500: retry only with a key.
    WithKeyOnly,
    /// A reset or an unanswered attempt: it may have been processed; retry
    /// only with a key (or an idempotent method).
    MayHaveRun,
    /// Any other 4xx (and a 409 mismatch): never retry.
    Final,
    /// Any other 5xx: not transient, never retry.
    NotTransient,
}

impl Answer {
    /// The allowlist's verdict on retrying after this answer.
    pub fn retry(&self) -> Retry {
        match self {
            Self::Success { .. } => Retry::Done,
            Self::ResetBeforeRead | Self::ResetAfterRead | Self::Held => Retry::MayHaveRun,
            Self::Status { code, problem, .. } => match code {
                408 | 429 | 502 | 503 | 504 => Retry::Transient,
                409 if *problem == Some(super::scenario::IN_FLIGHT_CODE) => Retry::InFlight,
                500 => Retry::WithKeyOnly,
                400..=499 => Retry::Final,
                200..=299 => Retry::Done,
                _ => Retry::NotTransient,
            },
        }
    }

    /// One short phrase for a timeline.
    pub fn describe(&self) -> String {
        match self {
            Self::Success { code } => format!("{code} success"),
            Self::Status {
                code,
                retry_after,
                problem,
            } => {
                let mut s = code.to_string();
                if let Some(p) = problem {
                    s.push_str(&format!(" ({p})"));
                }
                if let Some(r) = retry_after {
                    s.push_str(&format!(" Retry-After: {r}"));
                }
                s
            }
            Self::ResetBeforeRead => "connection reset before the request was read".to_owned(),
            Self::ResetAfterRead => "request read, then connection reset".to_owned(),
            Self::Held => "held, never answered".to_owned(),
        }
    }
}

/// One attempt as the server received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// When its request head arrived (for a reset before reading: when the
    /// connection was accepted), since the run started.
    pub at: Duration,
    /// The connection it came on, numbered from 1 in the run.
    pub conn: u32,
    /// The request method (`?` when nothing could be read).
    pub method: String,
    /// The request target.
    pub path: String,
    /// Every header, in order, with the name as the client spelt it.
    pub headers: Vec<(String, String)>,
    /// The body, lossily as UTF-8.
    pub body: String,
    /// What the kit did.
    pub answer: Answer,
    /// When the answer was written (or the reset done), since the run
    /// started.
    pub answered: Option<Duration>,
    /// For a held attempt: when the client closed the connection (its
    /// attempt timeout), since the run started.
    pub client_gave_up: Option<Duration>,
    /// The earliest moment a `Retry-After` hint allowed the next attempt,
    /// since the run started.
    pub not_before: Option<Duration>,
}

impl Attempt {
    /// The values of every header named `name` (any letter case).
    pub fn header_values(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// Whether the method changes state and is not idempotent by HTTP's
    /// definition (what `idem.client.no-key-no-retry` is about).
    pub fn non_idempotent(&self) -> bool {
        !matches!(
            self.method.to_ascii_uppercase().as_str(),
            "GET" | "HEAD" | "PUT" | "DELETE" | "OPTIONS" | "TRACE" | "QUERY" | "?"
        )
    }
}

/// The contract's key header (`idem.key.header`).
pub const KEY_HEADER: &str = "Idempotency-Key";

/// Request headers that carry a per-operation *tracing* id: SDKs resend
/// them unchanged on every retry, yet no server deduplicates on them, so
/// the kit never takes one for a key (`--key-header` refuses them too).
pub const TRACING_HEADERS: &[&str] = &[
    "x-ms-client-request-id",
    "amz-sdk-invocation-id",
    "x-amzn-trace-id",
    "x-request-id",
    "x-client-request-id",
    "x-correlation-id",
    "request-id",
    "traceparent",
    "tracestate",
    "x-b3-traceid",
    "x-cloud-trace-context",
];

/// Whether `name` is one of the [`TRACING_HEADERS`].
pub fn is_tracing_header(name: &str) -> bool {
    TRACING_HEADERS.iter().any(|t| t.eq_ignore_ascii_case(name))
}

/// Where the API under test reads the idempotency key: a header (the
/// contract's `Idempotency-Key` by default), or a member of the JSON body
/// named by a JSON pointer (RFC 6901), as some SDKs send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySource {
    /// The header the key travels in, when no pointer is given.
    pub header: String,
    /// The JSON pointer into the body, e.g. `/idempotency_key`.
    pub pointer: Option<String>,
}

impl Default for KeySource {
    fn default() -> Self {
        Self {
            header: KEY_HEADER.to_owned(),
            pointer: None,
        }
    }
}

impl KeySource {
    /// Checks a `--key-header` / `--key-pointer` pair: a pointer must be a
    /// JSON pointer, a header a token, and never a tracing id.
    pub fn new(header: Option<&str>, pointer: Option<&str>) -> Result<Self, String> {
        let header = header.unwrap_or(KEY_HEADER).trim();
        if header.is_empty()
            || !header
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        {
            return Err(format!("--key-header {header:?} is not a header name"));
        }
        if is_tracing_header(header) {
            return Err(format!(
                "--key-header {header}: that header carries a tracing id, which SDKs resend \
                 unchanged and no server deduplicates on; it is never taken as a key"
            ));
        }
        if let Some(p) = pointer
            && !p.starts_with('/')
        {
            return Err(format!(
                "--key-pointer {p:?} is not a JSON pointer (it starts with '/', e.g. /idempotency_key)"
            ));
        }
        Ok(Self {
            header: header.to_owned(),
            pointer: pointer.map(str::to_owned),
        })
    }

    /// Whether this is the contract's own place, `Idempotency-Key`: only
    /// then do the key's wire clauses (`idem.key.header`,
    /// `idem.key.syntax`) apply.
    pub fn is_contracts(&self) -> bool {
        self.pointer.is_none() && self.header.eq_ignore_ascii_case(KEY_HEADER)
    }

    /// Where the key is read, for a report: `header Idempotency-Key` or
    /// `body /idempotency_key`.
    pub fn describe(&self) -> String {
        match &self.pointer {
            Some(p) => format!("body member {p}"),
            None => format!("header {}", self.header),
        }
    }

    /// Every key value the attempt carries where the API reads keys: each
    /// header of that name, or the body's member at the pointer (a string,
    /// or a number as written).
    pub fn raw_keys(&self, a: &Attempt) -> Vec<String> {
        match &self.pointer {
            None => a
                .header_values(&self.header)
                .into_iter()
                .map(str::to_owned)
                .collect(),
            Some(p) => serde_json::from_str::<serde_json::Value>(&a.body)
                .ok()
                .and_then(|v| match v.pointer(p)? {
                    serde_json::Value::String(s) => Some(s.clone()),
                    n @ serde_json::Value::Number(_) => Some(n.to_string()),
                    _ => None,
                })
                .into_iter()
                .collect(),
        }
    }

    /// The key as the server would read it: the one value, unquoted when a
    /// header carries it as a Structured-Field string.
    pub fn key(&self, a: &Attempt) -> Option<String> {
        let first = self.raw_keys(a).into_iter().next()?;
        Some(if self.pointer.is_some() {
            first
        } else {
            unquote(&first)
        })
    }
}

/// The bare key of a header value: a quoted Structured-Field string loses
/// its quotes and escapes; anything else is the key as is.
pub fn unquote(v: &str) -> String {
    let v = v.trim();
    match v.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        Some(inner) => inner.replace("\\\"", "\"").replace("\\\\", "\\"),
        None => v.to_owned(),
    }
}

/// How the client under test's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// It finished: `ok` is its own verdict (exit 0 / the closure's true).
    Finished {
        /// Whether it reported a final 2xx (exit 0, the closure's `true`).
        ok: bool,
        /// The exit code, for a process.
        code: Option<i32>,
    },
    /// The kit stopped it.
    Killed(Kill),
    /// It could not be started.
    NotStarted(String),
}

/// Why the kit stopped a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kill {
    /// It ran past the overall deadline plus the grace.
    PastDeadline,
    /// It sent more requests than the ceiling plus a margin.
    TooManyAttempts,
    /// It never contacted the API within the start-up allowance.
    NeverContacted,
}

/// One run of the client under test in one scenario.
#[derive(Debug, Clone)]
pub struct RunRecord {
    /// The scenario's ID.
    pub scenario: &'static str,
    /// Which run of the scenario (0 for most; 0..N for the jitter runs).
    pub run: u32,
    /// Every attempt, in arrival order.
    pub attempts: Vec<Attempt>,
    /// How it ended.
    pub exit: Exit,
    /// When it ended, since the run started.
    pub ended: Duration,
    /// What it wrote to stdout (truncated).
    pub stdout: String,
    /// What it wrote to stderr (truncated).
    pub stderr: String,
    /// The base URL it was given.
    pub base_url: String,
    /// What the kit did about this run, if anything (a re-run), for the
    /// timeline.
    pub note: Option<String>,
}

impl RunRecord {
    /// When the first attempt arrived: the client's deadline started no
    /// later, so time measured from here never overstates its total.
    pub fn first(&self) -> Option<Duration> {
        self.attempts.first().map(|a| a.at)
    }

    /// The recorded attempts as a timeline, one line each:
    /// `t=+0.000s POST /x key=… conn#1 → 503 Retry-After: 1`.
    pub fn timeline(&self, keys: &KeySource) -> Vec<String> {
        let mut out: Vec<String> = self.note.iter().cloned().collect();
        let mut prev: Option<Duration> = None;
        for (i, a) in self.attempts.iter().enumerate() {
            let key = match keys.raw_keys(a).as_slice() {
                [] => "no key".to_owned(),
                [k] => format!("key={k}"),
                many => format!("{} keys: {}", many.len(), many.join(" | ")),
            };
            let gap = prev.map_or(String::new(), |p| {
                format!(" (+{:.3}s)", a.at.saturating_sub(p).as_secs_f64())
            });
            let mut line = format!(
                "t=+{:.3}s{gap} #{} {} {} {key} conn#{} → {}",
                a.at.as_secs_f64(),
                i + 1,
                a.method,
                a.path,
                a.conn,
                a.answer.describe()
            );
            if let Some(g) = a.client_gave_up {
                line.push_str(&format!(
                    "; the client gave up at t=+{:.3}s",
                    g.as_secs_f64()
                ));
            }
            out.push(line);
            prev = Some(a.at);
        }
        out.push(format!(
            "t=+{:.3}s the client {}",
            self.ended.as_secs_f64(),
            match &self.exit {
                Exit::Finished { ok, code } => format!(
                    "finished: {}{}",
                    if *ok { "success" } else { "failure" },
                    code.map_or(String::new(), |c| format!(" (exit {c})"))
                ),
                Exit::Killed(Kill::PastDeadline) =>
                    "was killed: still running past the deadline plus grace".to_owned(),
                Exit::Killed(Kill::TooManyAttempts) =>
                    "was killed: too many requests for one operation".to_owned(),
                Exit::Killed(Kill::NeverContacted) =>
                    "was killed: it never contacted the API".to_owned(),
                Exit::NotStarted(why) => format!("could not be started: {why}"),
            }
        ));
        out
    }
}
