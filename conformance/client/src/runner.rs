//! Runs the client under test once per scenario run, each against its own
//! fault server, in parallel, bounded in time and in requests, and turns
//! the records into the kit's one report.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_spec::clauses::{Level, Party};
use idem_spec::report::{CaseReport, Report, Verdict};
use sha2::Digest;

use super::judge::{self, Limits};
use super::record::{Exit, KeySource, Kill, RunRecord};
use super::redact::Redactor;
use super::scenario::{self, Scenario};
use super::server::{FaultServer, Setup};
use crate::Error;

/// What one invocation of the client under test reported.
#[derive(Debug, Clone, Default)]
pub struct ClientRun {
    /// Whether the SDK finally got a 2xx (exit 0, or the closure's `true`).
    pub ok: bool,
    /// The process exit code, for a command.
    pub code: Option<i32>,
    /// Its stdout (truncated).
    pub stdout: String,
    /// Its stderr (truncated).
    pub stderr: String,
}

/// The future an invocation returns. Dropping it must stop the client:
/// that is how the kit ends a run that went on too long.
pub type Invocation<'a> = Pin<Box<dyn Future<Output = Result<ClientRun, String>> + Send + 'a>>;

/// A client (SDK) under test: performs one state-changing call against
/// `base_url` per invocation. Implemented by [`ShellCommand`] and by any
/// async closure `Fn(String) -> impl Future<Output = bool>`.
pub trait ClientUnderTest: Send + Sync {
    /// What the report names as the target.
    fn describe(&self) -> String;
    /// The shell command line, for a command: the reproduce line re-runs
    /// the kit with it (secrets redacted).
    fn command(&self) -> Option<&str> {
        None
    }
    /// Performs one operation against `base_url`.
    fn invoke(&self, base_url: String) -> Invocation<'_>;
}

impl<F, Fut> ClientUnderTest for F
where
    F: Fn(String) -> Fut + Send + Sync,
    Fut: Future<Output = bool> + Send + 'static,
{
    fn describe(&self) -> String {
        "in-process client".to_owned()
    }

    fn invoke(&self, base_url: String) -> Invocation<'_> {
        let fut = self(base_url);
        Box::pin(async move {
            Ok(ClientRun {
                ok: fut.await,
                ..ClientRun::default()
            })
        })
    }
}

/// A shell command (`sh -c COMMAND`) told the API's base URL in
/// `IDEM_BASE_URL` and nothing else; exit 0 means a final 2xx.
#[derive(Debug, Clone)]
pub struct ShellCommand {
    /// The command line.
    pub command: String,
}

impl ShellCommand {
    /// The command `command`.
    pub fn new(command: impl Into<String>) -> Self {
        Self {
            command: command.into(),
        }
    }
}

/// How much of a command's output the kit keeps.
const OUTPUT_CAP: usize = 16 * 1024;

/// Kills a process group when dropped: the command's children too, when
/// the run ends or the kit stops it.
struct Group(Option<u32>);

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(pid) = self.0.take() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

async fn read_capped(r: Option<impl tokio::io::AsyncRead + Unpin>) -> String {
    use tokio::io::AsyncReadExt;
    let Some(mut r) = r else {
        return String::new();
    };
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = r.read(&mut buf).await {
        if n == 0 {
            break;
        }
        if out.len() < OUTPUT_CAP {
            out.extend_from_slice(&buf[..n.min(OUTPUT_CAP - out.len())]);
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl ClientUnderTest for ShellCommand {
    fn describe(&self) -> String {
        format!("client: {}", self.command)
    }

    fn command(&self) -> Option<&str> {
        Some(&self.command)
    }

    fn invoke(&self, base_url: String) -> Invocation<'_> {
        Box::pin(async move {
            let mut cmd = tokio::process::Command::new("sh");
            cmd.arg("-c")
                .arg(&self.command)
                .env("IDEM_BASE_URL", &base_url)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .process_group(0)
                .kill_on_drop(true);
            let mut child = cmd.spawn().map_err(|e| format!("cannot run sh: {e}"))?;
            let _group = Group(child.id());
            let out = tokio::spawn(read_capped(child.stdout.take()));
            let err = tokio::spawn(read_capped(child.stderr.take()));
            let status = child.wait().await.map_err(|e| e.to_string())?;
            drop(_group);
            // The group is gone, so the pipes close; bounded all the same.
            let grab = |h: tokio::task::JoinHandle<String>| async move {
                tokio::time::timeout(Duration::from_secs(2), h)
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or_default()
            };
            Ok(ClientRun {
                ok: status.success(),
                code: status.code(),
                stdout: grab(out).await,
                stderr: grab(err).await,
            })
        })
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// How many runs start at once by default: two per core of this machine
/// of two cores, four at least.
pub const START_SLOTS: usize = 4;

/// Options of a client check.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The client's configured overall deadline.
    pub deadline: Duration,
    /// How many runs the jitter test makes.
    pub runs: usize,
    /// Seed of the run (picks the `Retry-After` hints); random when absent.
    pub seed: Option<u64>,
    /// Only scenarios whose ID matches this glob (the plain success always
    /// runs first, as the preflight).
    pub only: Option<String>,
    /// The JSON a success answers with.
    pub success_body: String,
    /// Progress lines on stderr.
    pub progress: bool,
    /// How long the first run may take to reach the API (a command that
    /// builds before it runs needs a while).
    pub first_contact: Duration,
    /// How long every later run may take to reach the API.
    pub contact: Duration,
    /// Where the API reads the key (`--key-header`, `--key-pointer`).
    pub keys: KeySource,
    /// How many runs may be starting at once (started, not yet at the
    /// API): a slow start-up then costs a few waves, not one stampede of
    /// every scenario's process.
    pub start_slots: usize,
    /// Non-strict findings (a missed SHOULD) make the result DEVIATES.
    pub strict: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            deadline: judge::DEFAULT_DEADLINE,
            runs: 12,
            seed: None,
            only: None,
            success_body: "{}".to_owned(),
            progress: false,
            first_contact: Duration::from_secs(300),
            contact: Duration::from_secs(60),
            keys: KeySource::default(),
            start_slots: START_SLOTS,
            strict: false,
        }
    }
}

/// Runs `client` once in `sc` against a fresh fault server.
pub async fn run_once(
    client: &dyn ClientUnderTest,
    sc: &Scenario,
    run: u32,
    opts: &ClientOptions,
    contact: Duration,
    contacted: Option<tokio::sync::mpsc::UnboundedSender<()>>,
    slots: Option<Arc<tokio::sync::Semaphore>>,
) -> Result<RunRecord, Error> {
    let mut contacted = contacted;
    // A start slot is held from the start until the run reaches the API.
    let mut slot = match slots {
        Some(s) => Some(
            s.acquire_owned()
                .await
                .map_err(|e| Error::Check(format!("start slots: {e}")))?,
        ),
        None => None,
    };
    let start = Instant::now();
    let lim = Limits {
        deadline: opts.deadline,
        ..Limits::default()
    };
    let server = FaultServer::start(Setup {
        scenario: sc.clone(),
        start,
        deadline: opts.deadline,
        success_body: Arc::from(opts.success_body.as_str()),
    })
    .await
    .map_err(|e| Error::FaultServer(e.to_string()))?;
    let base_url = server.base_url().to_owned();
    let mut changes = server.watch();
    let (exit, out) = {
        let fut = client.invoke(base_url.clone());
        tokio::pin!(fut);
        let mut watching = true;
        loop {
            let attempts = server.attempts();
            if !attempts.is_empty() {
                slot.take();
                if let Some(tx) = contacted.take() {
                    let _ = tx.send(());
                }
            }
            if attempts.len() > lim.attempt_ceiling() {
                break (Exit::Killed(Kill::TooManyAttempts), ClientRun::default());
            }
            let (limit, why) = match attempts.first() {
                None => (start + contact, Kill::NeverContacted),
                Some(a) => (
                    start + a.at + opts.deadline + lim.grace(),
                    Kill::PastDeadline,
                ),
            };
            tokio::select! {
                r = &mut fut => break match r {
                    Ok(c) => (Exit::Finished { ok: c.ok, code: c.code }, c),
                    Err(e) => (Exit::NotStarted(e), ClientRun::default()),
                },
                () = tokio::time::sleep_until(limit.into()) => {
                    break (Exit::Killed(why), ClientRun::default());
                }
                changed = changes.changed(), if watching => {
                    watching = changed.is_ok();
                }
            }
        }
    };
    let ended = start.elapsed();
    drop(slot);
    if let Some(tx) = contacted.take() {
        let _ = tx.send(());
    }
    // A client that gave up on a held attempt closed the socket as it
    // exited; give the server a moment (bounded) to note when.
    let pending = |s: &FaultServer| {
        s.attempts()
            .iter()
            .any(|a| a.answer == super::record::Answer::Held && a.client_gave_up.is_none())
    };
    for _ in 0..10 {
        if !pending(&server) {
            break;
        }
        let _ = tokio::time::timeout(Duration::from_millis(20), changes.changed()).await;
    }
    let mut attempts = server.attempts();
    if matches!(exit, Exit::Killed(_)) {
        // Sockets the kill closed are not the client giving up.
        for a in &mut attempts {
            a.client_gave_up = a.client_gave_up.filter(|g| *g < ended);
        }
    }
    Ok(RunRecord {
        scenario: sc.id,
        run,
        attempts,
        exit,
        ended,
        stdout: out.stdout,
        stderr: out.stderr,
        base_url,
        note: None,
    })
}

/// Why a run that never reached the API did not, in one sentence.
fn never_contacted(client: &dyn ClientUnderTest, r: &RunRecord, contact: Duration) -> String {
    let tail = |s: &str| {
        s.lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .to_owned()
    };
    match &r.exit {
        Exit::NotStarted(e) => format!("could not start {}: {e}", client.describe()),
        Exit::Finished {
            code: Some(127), ..
        } => format!(
            "command not found: {} (sh said: {})",
            client.describe(),
            tail(&r.stderr)
        ),
        Exit::Finished { code, ok } => format!(
            "{} never contacted the API: it {} without sending a request to IDEM_BASE_URL={}{}",
            client.describe(),
            match (ok, code) {
                (_, Some(c)) => format!("exited with code {c}"),
                (true, None) => "returned success".to_owned(),
                (false, None) => "returned failure".to_owned(),
            },
            r.base_url,
            match tail(&r.stderr) {
                t if t.is_empty() => String::new(),
                t => format!("; its stderr ends: {t}"),
            }
        ),
        Exit::Killed(_) => format!(
            "{} never contacted the API at IDEM_BASE_URL={} within {} s; killed",
            client.describe(),
            r.base_url,
            contact.as_secs()
        ),
    }
}

fn glob(pattern: &str, id: &str) -> bool {
    idem_conformance_core::waivers::matches(pattern, id)
}

/// The order the single runs start in: the longest first (the hang, the
/// always-failing scenarios, the waits for a hint or a timeout), so that
/// start slots shorten the check rather than lengthen it.
fn start_rank(s: &Scenario) -> u8 {
    match s.family() {
        "limits" => 0,
        "retry-after" => 1,
        _ if s.id == "retry.slow-answer" => 1,
        _ => 2,
    }
}

/// The single runs the repeated ones do not wait for: those that last
/// about as long as the deadline or a timeout, idle most of that time.
fn long_running(s: &Scenario) -> bool {
    s.family() == "limits" || s.id == "retry-after.past-deadline" || s.id == "retry.slow-answer"
}

/// Reports a single run's end when dropped, however its task ends.
struct Finished(Option<tokio::sync::mpsc::UnboundedSender<()>>);

impl Drop for Finished {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// How many times a repeated scenario runs.
fn repeats(s: &Scenario, opts: &ClientOptions) -> usize {
    if s.id == scenario::RESET_RUNS_ID {
        scenario::RESET_RUNS
    } else {
        opts.runs.max(2)
    }
}

/// Whether any run retried a transient answer (a 5xx or a 429): what
/// makes a client's not retrying after a hint past its deadline evidence.
fn retried_transient(records: &[RunRecord]) -> bool {
    records.iter().any(|r| {
        r.attempts.windows(2).any(|w| {
            matches!(
                w[0].answer.retry(),
                super::record::Retry::Transient | super::record::Retry::WithKeyOnly
            )
        })
    })
}

/// Checks `client` against the contract's client clauses: the plain
/// success first (a harness error when the client never reaches the API),
/// then every other scenario, each on its own server: the single runs in
/// parallel, at most [`ClientOptions::start_slots`] starting at once, the
/// repeated ones (the jitter and zero-backoff statistics) each one run
/// after another once the others have reached the API. Every secret of the
/// command, its environment and the recorded headers is redacted from the
/// report ([`Redactor`]).
pub async fn run(client: Arc<dyn ClientUnderTest>, opts: &ClientOptions) -> Result<Report, Error> {
    let started = Instant::now();
    let started_unix_secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let seed = opts.seed.unwrap_or_else(|| {
        u64::from_le_bytes(
            uuid::Uuid::new_v4().as_bytes()[..8]
                .try_into()
                .unwrap_or([0; 8]),
        )
    });
    let mut redactor = Redactor::for_command(client.command().unwrap_or(""));
    let all = scenario::all(2 + seed % 2);
    let progress = |s: String, redactor: &Redactor| {
        if opts.progress {
            eprintln!("{}", redactor.redact(&s));
        }
    };
    let pre = all
        .iter()
        .find(|s| s.id == scenario::PREFLIGHT)
        .cloned()
        .ok_or_else(|| Error::Check("no preflight scenario".into()))?;
    progress(
        format!(
            "idem-conformance client: {} (deadline {} s, {} jitter runs, key in the {})",
            client.describe(),
            opts.deadline.as_secs(),
            opts.runs,
            opts.keys.describe()
        ),
        &redactor,
    );
    let first = run_once(
        client.as_ref(),
        &pre,
        0,
        opts,
        opts.first_contact,
        None,
        None,
    )
    .await?;
    redactor.add_headers(first.attempts.iter().flat_map(|a| a.headers.iter()));
    let mut base = base_report(client.as_ref(), seed, started_unix_secs);
    if first.attempts.is_empty() {
        base.harness_error = Some(never_contacted(client.as_ref(), &first, opts.first_contact));
        base.duration_ms = started.elapsed().as_millis() as u64;
        finish(&mut base, opts);
        redactor.report(&mut base);
        return Ok(base);
    }
    progress(
        format!(
            "  {} run 1: {} attempt(s), {:.1} s",
            pre.id,
            first.attempts.len(),
            first.ended.as_secs_f64()
        ),
        &redactor,
    );
    base.preflight = vec![format!(
        "{} reached the API ({} {}) and finished",
        client.describe(),
        first.attempts[0].method,
        first.attempts[0].path
    )];
    let chosen: Vec<Scenario> = all
        .iter()
        .filter(|s| s.id != scenario::PREFLIGHT)
        .filter(|s| opts.only.as_deref().is_none_or(|p| glob(p, s.id)))
        .cloned()
        .collect();
    let mut records = run_scenarios(&client, &chosen, opts, &|s| progress(s, &redactor)).await?;
    records.insert(0, first);
    records.sort_by_key(|r| r.run);
    for r in &records {
        redactor.add_headers(r.attempts.iter().flat_map(|a| a.headers.iter()));
    }
    let scenarios: Vec<&Scenario> = std::iter::once(&pre).chain(chosen.iter()).collect();
    let cases = cases_of(client.as_ref(), &scenarios, &records, opts, seed);
    base.requests = records.iter().map(|r| r.attempts.len() as u64).sum();
    base.side_effect_requests = records
        .iter()
        .flat_map(|r| r.attempts.iter())
        .filter(|a| a.non_idempotent())
        .count() as u64;
    base.cases = cases;
    base.duration_ms = started.elapsed().as_millis() as u64;
    finish(&mut base, opts);
    redactor.report(&mut base);
    Ok(base)
}

/// Runs every chosen scenario but the preflight: the single runs in
/// parallel, the longest first, at most [`ClientOptions::start_slots`]
/// starting at once; then each repeated scenario's runs one after another.
async fn run_scenarios(
    client: &Arc<dyn ClientUnderTest>,
    chosen: &[Scenario],
    opts: &ClientOptions,
    progress: &(dyn Fn(String) + Sync),
) -> Result<Vec<RunRecord>, Error> {
    let (mut single, repeated): (Vec<&Scenario>, Vec<&Scenario>) =
        chosen.iter().partition(|s| !s.repeated);
    single.sort_by_key(|s| start_rank(s));
    let total = single.len() + repeated.iter().map(|s| repeats(s, opts)).sum::<usize>();
    let slots = Arc::new(tokio::sync::Semaphore::new(opts.start_slots.max(1)));
    let mut set = tokio::task::JoinSet::new();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let short = single.iter().filter(|s| !long_running(s)).count();
    for s in &single {
        let (client, opts, s, tx, slots) = (
            client.clone(),
            opts.clone(),
            (*s).clone(),
            tx.clone(),
            slots.clone(),
        );
        let done = (!long_running(&s)).then(|| done_tx.clone());
        set.spawn(async move {
            let _done = Finished(done);
            let contact = opts.contact;
            let r = run_once(
                client.as_ref(),
                &s,
                0,
                &opts,
                contact,
                Some(tx),
                Some(slots.clone()),
            )
            .await?;
            if !r.attempts.is_empty() {
                return Ok(vec![r]);
            }
            // A run that never reached the API says nothing about retries;
            // the preflight proved the command can, so it gets one re-run
            // before the case is called an error.
            let why = never_contacted(client.as_ref(), &r, contact);
            let mut again =
                run_once(client.as_ref(), &s, 0, &opts, contact, None, Some(slots)).await?;
            again.note = Some(format!(
                "re-run: the first run never reached the API ({why})"
            ));
            Ok(vec![again])
        });
    }
    drop((tx, done_tx));
    // The repeated runs measure delays to a few milliseconds, so they start
    // once the single runs have reached the API (the start-up burst is
    // over) and the short ones have finished (their retries and start-ups
    // measured, in the zoo, as 20 to 65 ms of noise on the first jitter
    // runs), and each scenario's runs go one after another. The long runs
    // left (the hang, the always-failing, the waits) are idle by then.
    let settle = async {
        let mut n = 0;
        while n < single.len() && rx.recv().await.is_some() {
            n += 1;
        }
        let mut n = 0;
        while n < short && done_rx.recv().await.is_some() {
            n += 1;
        }
    };
    let _ = tokio::time::timeout(opts.contact, settle).await;
    for s in &repeated {
        let (client, opts, s) = (client.clone(), opts.clone(), (*s).clone());
        set.spawn(async move {
            let mut out = Vec::new();
            for i in 0..repeats(&s, &opts) {
                let contact = opts.contact;
                out.push(
                    run_once(client.as_ref(), &s, i as u32, &opts, contact, None, None).await?,
                );
            }
            Ok(out)
        });
    }
    let mut records: Vec<RunRecord> = Vec::new();
    while let Some(j) = set.join_next().await {
        let rs: Vec<RunRecord> = j.map_err(|e| Error::Check(format!("a run panicked: {e}")))??;
        for r in rs {
            progress(format!(
                "  [{}/{total}] {} run {}: {} attempt(s), {}, {:.1} s",
                records.len() + 1,
                r.scenario,
                r.run + 1,
                r.attempts.len(),
                match &r.exit {
                    Exit::Finished { ok: true, .. } => "success".to_owned(),
                    Exit::Finished { .. } => "failure".to_owned(),
                    Exit::Killed(_) => "killed".to_owned(),
                    Exit::NotStarted(_) => "not started".to_owned(),
                },
                r.ended.as_secs_f64()
            ));
            records.push(r);
        }
    }
    Ok(records)
}

/// The cases of a check: one per scenario, judged on its runs, and
/// `keys.per-operation` across every run.
fn cases_of(
    client: &dyn ClientUnderTest,
    scenarios: &[&Scenario],
    records: &[RunRecord],
    opts: &ClientOptions,
    seed: u64,
) -> Vec<CaseReport> {
    let lim = Limits {
        deadline: opts.deadline,
        keys: opts.keys.clone(),
        retrier: retried_transient(records),
    };
    let mut cases = Vec::new();
    for s in scenarios {
        let rs: Vec<&RunRecord> = records.iter().filter(|r| r.scenario == s.id).collect();
        let mut case = case_report(client, s, &rs, &lim, opts.runs);
        if case.verdict != Verdict::Pass {
            case.reproduction
                .insert(0, reproduce_line(client, s, opts, seed));
        }
        cases.push(case);
    }
    let keyed: Vec<(String, String)> = records
        .iter()
        .filter_map(|r| {
            let k = lim.keys.key(r.attempts.first()?)?;
            Some((format!("{} run {}", r.scenario, r.run + 1), k))
        })
        .collect();
    if let Some(c) = judge::judge_key_per_operation(&keyed) {
        let verdict = c.verdict;
        cases.push(CaseReport {
            id: "keys.per-operation".to_owned(),
            family: "keys".to_owned(),
            title: "each run of the command is a new operation with a new key".to_owned(),
            tier: Level::Must,
            clauses: vec![c.clause.clone()],
            verdict,
            reason: None,
            narrative: keyed.iter().map(|(l, k)| format!("{l}: key {k}")).collect(),
            checks: vec![c],
            reproduction: Vec::new(),
            waived: None,
            duration_ms: 0,
            side_effect_requests: 0,
            rerun: None,
        });
    }
    cases
}

/// How to reproduce one scenario: the kit again, on that scenario alone,
/// with the same seed and options (its fault server is gone once the check
/// ends, so a line naming its address would lead nowhere).
pub fn reproduce_line(
    client: &dyn ClientUnderTest,
    sc: &Scenario,
    opts: &ClientOptions,
    seed: u64,
) -> String {
    let mut args = vec![
        format!("--only {}", sc.id),
        format!("--seed {seed}"),
        format!("--deadline {}", opts.deadline.as_secs()),
    ];
    if sc.id == scenario::JITTER {
        args.push(format!("--runs {}", opts.runs));
    }
    if opts.keys.pointer.is_none() && !opts.keys.is_contracts() {
        args.push(format!("--key-header {}", opts.keys.header));
    }
    if let Some(p) = &opts.keys.pointer {
        args.push(format!("--key-pointer {p}"));
    }
    if opts.success_body != "{}" {
        args.push(format!(
            "--success-body {}",
            shell_quote(&opts.success_body)
        ));
    }
    match client.command() {
        Some(cmd) => format!(
            "idem-conformance client --run {} {}   # this scenario alone, against a fresh fault server",
            shell_quote(cmd),
            args.join(" ")
        ),
        None => format!(
            "re-run the check with ClientOptions {{ only: Some({:?}), seed: Some({seed}), .. }} ({})",
            sc.id,
            args.join(" ")
        ),
    }
}

/// The clauses no run can observe from the wire, and why.
pub const UNOBSERVABLE: &[(&str, &str)] = &[
    (
        "idem.client.observability",
        "logs and metrics stay inside the client; nothing on the wire shows them",
    ),
    (
        "idem.client.budget",
        "a budget shows only across many operations of one process; each run is one operation",
    ),
    (
        "idem.client.key-derivation",
        "where a key comes from (an event, a unit of work) is not visible on the wire",
    ),
    (
        "idem.client.decorrelated-jitter",
        "a MAY: any random delay passes the jitter test",
    ),
];

/// How many of the report's clause rows got a verdict, of how many.
pub fn clauses_checked(report: &Report) -> (usize, usize) {
    let checked = report
        .clauses
        .iter()
        .filter(|c| c.verdict.is_some())
        .count();
    (checked, report.clauses.len())
}

fn finish(report: &mut Report, opts: &ClientOptions) {
    let cited: std::collections::BTreeSet<String> = report
        .cases
        .iter()
        .flat_map(|c| c.checks.iter().map(|k| k.clause.clone()))
        .collect();
    report.summary.strict = opts.strict;
    idem_conformance_core::summary::finish_where(report, &[], &|c| {
        c.party == Party::Client || cited.contains(&c.id)
    });
    for row in &mut report.clauses {
        if row.verdict.is_some() {
            continue;
        }
        if let Some((_, why)) = UNOBSERVABLE.iter().find(|(id, _)| *id == row.id) {
            row.unchecked = Some((*why).to_owned());
        } else if !opts.keys.is_contracts() && row.id.split('.').nth(1) == Some("key") {
            row.unchecked = Some(format!(
                "the API reads its key from the {}, not the contract's Idempotency-Key header",
                opts.keys.describe()
            ));
        }
    }
    // A partial run says so wherever its result is shown: a bare CONFORMS
    // over a handful of clauses would claim more than was checked.
    if let Some(only) = &opts.only {
        let (checked, of) = clauses_checked(report);
        report.target = format!(
            "{} (partial run, --only {only}: {checked} of {of} client clauses checked)",
            report.target
        );
    }
}

fn base_report(client: &dyn ClientUnderTest, seed: u64, started_unix_secs: u64) -> Report {
    let name = client.describe();
    Report {
        kit_version: idem_conformance_core::KIT_VERSION.to_owned(),
        contract_version: idem_spec::CONTRACT_VERSION.to_owned(),
        profile: "client".to_owned(),
        manifest_sha256: hex::encode(sha2::Sha256::digest(name.as_bytes())),
        target: name,
        base_url: "127.0.0.1, one fault server per run".to_owned(),
        run_id: idem_conformance_core::run_id(),
        seed,
        started_unix_secs,
        duration_ms: 0,
        side_effect_requests: 0,
        requests: 0,
        preflight: Vec::new(),
        harness_error: None,
        headlines: Vec::new(),
        cases: Vec::new(),
        clauses: Vec::new(),
        waivers: Vec::new(),
        summary: idem_conformance_core::summary::empty_summary(),
    }
}

/// The statistic a repeated scenario's runs feed, or why it could not
/// judge.
fn judge_repeated(
    sc: &Scenario,
    runs: &[&RunRecord],
    want_runs: usize,
) -> Result<Vec<idem_spec::report::CheckReport>, String> {
    let delays: Vec<Duration> = runs.iter().filter_map(|r| judge::first_delay(r)).collect();
    if sc.id == scenario::RESET_RUNS_ID {
        let n = runs.len().max(scenario::RESET_RUNS);
        return judge::judge_zero_backoff(&delays, n)
            .map(|c| vec![c])
            .ok_or_else(|| {
                format!(
                    "zero backoff not judged: only {} of {} runs resent after the reset (at least {} must)",
                    delays.len(),
                    runs.len(),
                    (1..=scenario::RESET_RUNS)
                        .find(|&n| judge::immediate_allowance(n) < n)
                        .unwrap_or(scenario::RESET_RUNS)
                )
            });
    }
    judge::judge_jitter(&delays, runs.len().max(want_runs)).ok_or_else(|| {
        format!(
            "jitter not judged: only {} of {} runs retried the 503 (at least {} must)",
            delays.len(),
            runs.len(),
            judge::JITTER_MIN_SAMPLES
        )
    })
}

/// One scenario's case: every run judged, the statistic of a repeated
/// scenario, every run's timeline as the narrative.
pub fn case_report(
    client: &dyn ClientUnderTest,
    sc: &Scenario,
    runs: &[&RunRecord],
    lim: &Limits,
    want_runs: usize,
) -> CaseReport {
    let mut checks = Vec::new();
    let mut narrative = Vec::new();
    let mut silent = Vec::new();
    for r in runs {
        if r.attempts.is_empty() {
            silent.push(never_contacted(client, r, Duration::ZERO));
        }
        checks.extend(judge::judge_run(sc, r, lim));
        let prefix = if runs.len() > 1 {
            format!("run {}: ", r.run + 1)
        } else {
            String::new()
        };
        narrative.extend(
            r.timeline(&lim.keys)
                .into_iter()
                .map(|l| format!("{prefix}{l}")),
        );
    }
    let mut reason = None;
    if sc.repeated {
        match judge_repeated(sc, runs, want_runs) {
            Ok(j) => checks.extend(j),
            Err(why) => reason = Some(why),
        }
    }
    let mut verdict = judge::worst(&checks);
    if reason.is_some() && verdict == Verdict::Pass {
        // Not judged is not passed.
        verdict = Verdict::Inconclusive;
    }
    if !silent.is_empty() {
        verdict = Verdict::Error;
        reason = Some(silent.join("; "));
    }
    let mut clauses: Vec<String> = checks.iter().map(|c| c.clause.clone()).collect();
    clauses.sort();
    clauses.dedup();
    let mut reproduction = Vec::new();
    if verdict != Verdict::Pass {
        for r in runs.iter().take(1) {
            for (name, text) in [("stdout", &r.stdout), ("stderr", &r.stderr)] {
                let t = text.trim();
                if !t.is_empty() {
                    let tail: Vec<&str> = t.lines().rev().take(8).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    reproduction.push(format!("{name} (last lines):\n{}", tail.join("\n")));
                }
            }
        }
    }
    CaseReport {
        id: sc.id.to_owned(),
        family: sc.family().to_owned(),
        title: sc.title.to_owned(),
        tier: Level::Must,
        clauses,
        verdict,
        reason,
        checks,
        narrative,
        reproduction,
        waived: None,
        duration_ms: runs
            .iter()
            .map(|r| r.ended.as_millis() as u64)
            .max()
            .unwrap_or(0),
        side_effect_requests: runs
            .iter()
            .flat_map(|r| r.attempts.iter())
            .filter(|a| a.non_idempotent())
            .count() as u64,
        rerun: None,
    }
}
