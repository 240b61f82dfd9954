//! The zero-configuration demo: build (if needed) and start the reference
//! server on a temporary SQLite file, write a manifest for it, run every
//! case, and leave the reports on disk.
//!
//! How the server binary is found, from a clean clone: the kit never links
//! the server, so it asks Cargo for it. It runs `cargo build -p idem-server`
//! (with `--release` when the kit itself is a release build) against the
//! workspace this crate was compiled in (`CARGO_MANIFEST_DIR/..`), with
//! `--message-format=json`, and takes the binary's path from Cargo's
//! `compiler-artifact` message. When the binary is fresh the build is a
//! no-op of a fraction of a second; Cargo releases its build lock before
//! `cargo run` starts the kit, so the nested build does not deadlock (the
//! same pattern as `cargo xtask`). `IDEM_SERVER_BIN` overrides all of this
//! with a path to a prebuilt binary.

use std::io::BufRead;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, BufReader};

use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use crate::Error;
use crate::server::case::Restarter;

/// Environment variable naming a prebuilt `idem-server` binary.
pub const SERVER_BIN_ENV: &str = "IDEM_SERVER_BIN";

/// The workspace root this crate was built in.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Environment variable naming a prebuilt `idem-fake-processor` binary.
pub const PROCESSOR_BIN_ENV: &str = "IDEM_PROCESSOR_BIN";

/// Builds (or finds fresh) the `idem-server` binary and returns its path.
/// `features` are passed to Cargo (e.g. `["flaws"]`).
pub fn build_server(release: bool, features: &[&str]) -> Result<PathBuf, Error> {
    if let Some(p) = std::env::var_os(SERVER_BIN_ENV) {
        return Ok(PathBuf::from(p));
    }
    build_bin("idem-server", release, features)
}

/// Builds (or finds fresh) the `idem-fake-processor` binary, the payment
/// processor `POST /v1/payments` calls.
pub fn build_processor(release: bool) -> Result<PathBuf, Error> {
    if let Some(p) = std::env::var_os(PROCESSOR_BIN_ENV) {
        return Ok(PathBuf::from(p));
    }
    build_bin("idem-fake-processor", release, &[])
}

/// `cargo build -p NAME --bin NAME` in this workspace; the executable's
/// path from Cargo's JSON messages.
fn build_bin(name: &str, release: bool, features: &[&str]) -> Result<PathBuf, Error> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(workspace_root().join("Cargo.toml"))
        .args([
            "-p",
            name,
            "--bin",
            name,
            "--message-format=json-render-diagnostics",
        ]);
    if release {
        cmd.arg("--release");
    }
    if !features.is_empty() {
        cmd.arg("--features").arg(features.join(","));
    }
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| Error::Server(format!("could not run cargo: {e}")))?;
    if !out.status.success() {
        return Err(Error::Server(format!(
            "`cargo build -p {name}` failed ({}); see its output above",
            out.status
        )));
    }
    BufRead::lines(&out.stdout[..])
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == name)
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| Error::Server(format!("cargo built no {name} executable")))
}

/// Starts `bin args`, reads its stdout until a `listening on URL` line
/// (bounded), and keeps draining stdout afterwards.
async fn spawn_ready(bin: &Path, args: &[String]) -> Result<(Child, String, Vec<String>), Error> {
    let mut child = Command::new(bin)
        .args(args)
        // The demo passes its own tokens on the command line; tokens an
        // operator exported for another server must not replace them.
        .env_remove("IDEM_TOKENS")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Error::Server(format!("could not start {}: {e}", bin.display())))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| Error::Server("no stdout".into()))?;
    let mut lines = BufReader::new(stdout).lines();
    let mut banner = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let url = loop {
        let line = tokio::time::timeout_at(deadline, lines.next_line())
            .await
            .map_err(|_| {
                Error::Server(format!(
                    "{}: no `listening on` line within 30 s",
                    bin.display()
                ))
            })?
            .map_err(|e| Error::Server(e.to_string()))?
            .ok_or_else(|| {
                Error::Server(format!(
                    "{} exited before listening; it printed: {banner:?}",
                    bin.display()
                ))
            })?;
        banner.push(line.clone());
        if let Some(pos) = line.find("listening on ") {
            break line[pos + "listening on ".len()..]
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .trim_end_matches('/')
                .to_owned();
        }
    };
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, url, banner))
}

/// The fake payment processor as a child process on a temporary SQLite
/// file; killed on drop, its files removed.
#[derive(Debug)]
pub struct Processor {
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
    child: Child,
    dir: PathBuf,
}

impl Drop for Processor {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Processor {
    /// Starts `bin --listen 127.0.0.1:0 --db <tmp>/processor.db`.
    pub async fn start(bin: &Path) -> Result<Self, Error> {
        let dir = temp_dir()?;
        let args = vec![
            "--listen".to_owned(),
            "127.0.0.1:0".to_owned(),
            "--db".to_owned(),
            dir.join("processor.db").display().to_string(),
        ];
        let (child, base_url, _) = spawn_ready(bin, &args).await?;
        Ok(Self {
            base_url,
            child,
            dir,
        })
    }
}

fn temp_dir() -> Result<PathBuf, Error> {
    let dir = std::env::temp_dir().join(format!(
        "idem-conformance-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
        path: dir.clone(),
        source,
    })?;
    Ok(dir)
}

/// A reference server running as a child process; killed on drop, its
/// temporary database removed.
#[derive(Debug)]
pub struct Server {
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
    /// Everything the server printed on stdout before it was ready.
    pub banner: Vec<String>,
    /// The server's command line, for restarts and reports.
    pub args: Vec<String>,
    /// The binary.
    pub bin: PathBuf,
    /// (caller, bearer token) pairs the server was started with.
    pub tokens: Vec<(String, String)>,
    child: Child,
    dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Server {
    /// Starts `bin --listen 127.0.0.1:0 --database-url sqlite://<tmp>/idem.db
    /// --test-hooks --token <alice> --token <bob>` plus `extra` args, and
    /// waits (bounded) for its `listening on` line.
    pub async fn start(bin: &Path, extra: &[String]) -> Result<Self, Error> {
        let dir = temp_dir()?;
        let run = uuid::Uuid::new_v4().simple().to_string();
        let tokens = [
            ("alice".to_owned(), format!("kit-alice-{}", &run[..12])),
            ("bob".to_owned(), format!("kit-bob-{}", &run[12..24])),
        ];
        let mut args: Vec<String> = vec![
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--database-url".into(),
            format!("sqlite://{}", dir.join("idem.db").display()),
            "--test-hooks".into(),
        ];
        for (caller, token) in &tokens {
            args.extend(["--token".to_owned(), format!("{token}={caller}")]);
        }
        args.extend(extra.iter().cloned());
        let (child, base_url, banner) = spawn_ready(bin, &args).await?;
        Ok(Self {
            base_url,
            banner,
            args,
            bin: bin.to_owned(),
            tokens: tokens.to_vec(),
            child,
            dir,
        })
    }

    /// Whether the server was started with a payment processor (so
    /// `POST /v1/payments` works).
    pub fn has_payments(&self) -> bool {
        self.processor_url().is_some()
    }

    /// The payment processor's base URL the server was started with.
    pub fn processor_url(&self) -> Option<&str> {
        self.arg("--processor-url")
    }

    /// The deliberate flaw the server was started with, if any.
    pub fn flaw(&self) -> Option<&str> {
        self.arg("--flaw")
    }

    fn arg(&self, name: &str) -> Option<&str> {
        let i = self.args.iter().position(|a| a == name)?;
        self.args.get(i + 1).map(String::as_str)
    }

    /// Whether the manifest can declare the multi-step endpoint: the server
    /// has a processor, and its payments listing shows each payment to the
    /// caller that made it. The `global-keys` flaw files payments under the
    /// shared key space's caller, so no caller's listing shows them and the
    /// preflight (rightly) stops a run whose probe cannot see an effect;
    /// the demo leaves the endpoint out for that flaw, whose case
    /// (`scope.other-caller`) runs on the transfer endpoint.
    pub fn payments_listed(&self) -> bool {
        self.has_payments() && self.flaw() != Some("global-keys")
    }

    /// Restarts the server: kills it if it still runs (a crash failpoint
    /// usually killed it already), then starts the same binary on the same
    /// database and port, its test clock `clock_offset_secs` ahead (what the
    /// run moved it), and waits for it to listen.
    pub async fn restart(&mut self, clock_offset_secs: u64) -> Result<(), Error> {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        let addr = self
            .base_url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let mut args = Vec::with_capacity(self.args.len() + 2);
        let mut it = self.args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--listen" => {
                    it.next();
                    args.extend(["--listen".to_owned(), addr.clone()]);
                }
                "--test-clock-offset-secs" => {
                    it.next();
                }
                _ => args.push(a.clone()),
            }
        }
        args.extend([
            "--test-clock-offset-secs".to_owned(),
            clock_offset_secs.to_string(),
        ]);
        let (child, url, banner) = spawn_ready(&self.bin, &args).await?;
        if url != self.base_url {
            return Err(Error::Server(format!(
                "restarted server listens on {url}, not {}",
                self.base_url
            )));
        }
        self.child = child;
        self.banner = banner;
        Ok(())
    }
}

/// The reference server and its payment processor, as the demo and the
/// kit's own tests run them.
#[derive(Debug)]
pub struct Stack {
    /// The server (behind a lock: the restarter replaces its process).
    pub server: Arc<Mutex<Server>>,
    /// Its base URL (stable across restarts).
    pub base_url: String,
    /// The processor, dropped (killed) after the server.
    pub processor: Processor,
}

impl Stack {
    /// Starts the processor, then the server pointed at it with `extra`
    /// arguments.
    pub async fn start(
        server_bin: &Path,
        processor_bin: &Path,
        extra: &[String],
    ) -> Result<Self, Error> {
        let processor = Processor::start(processor_bin).await?;
        let mut args = vec!["--processor-url".to_owned(), processor.base_url.clone()];
        args.extend(extra.iter().cloned());
        let server = Server::start(server_bin, &args).await?;
        Ok(Self {
            base_url: server.base_url.clone(),
            server: Arc::new(Mutex::new(server)),
            processor,
        })
    }

    /// The demo manifest for this stack.
    pub async fn manifest(&self, profile: idem_spec::Profile) -> Result<String, Error> {
        let server = self.server.lock().await;
        manifest_for(&server, profile).await
    }

    /// The in-process restart the crash-recovery case uses.
    pub fn restarter(&self) -> Restarter {
        let server = self.server.clone();
        Restarter(Arc::new(move |offset| {
            let server = server.clone();
            Box::pin(async move {
                server
                    .lock()
                    .await
                    .restart(offset)
                    .await
                    .map_err(|e| e.to_string())
            })
        }))
    }
}

/// The demo: start the reference server (optionally with a flaw), write a
/// manifest for it into the output directory, run every case, emit reports
/// there.
pub async fn run(
    opts: crate::server::runner::Options,
    flaw: Option<String>,
    profile: idem_spec::Profile,
    out: &crate::output::Outputs,
) -> Result<i32, Error> {
    let features: &[&str] = if flaw.is_some() { &["flaws"] } else { &[] };
    eprintln!("demo: building/locating idem-server and idem-fake-processor (cargo build -p …)…");
    let (bin, processor_bin) = tokio::task::spawn_blocking({
        let features: Vec<&'static str> = features.to_vec();
        move || {
            let release = !cfg!(debug_assertions);
            Ok::<_, Error>((build_server(release, &features)?, build_processor(release)?))
        }
    })
    .await
    .map_err(|e| Error::Server(e.to_string()))??;
    let mut extra = Vec::new();
    if let Some(f) = &flaw {
        extra.extend(["--flaw".to_owned(), f.clone()]);
    }
    extra.extend(["--profile".to_owned(), profile.as_str().to_owned()]);
    let stack = Stack::start(&bin, &processor_bin, &extra).await?;
    eprintln!(
        "demo: reference server at {}, payment processor at {}",
        stack.base_url, stack.processor.base_url
    );
    let text = stack.manifest(profile).await?;
    let path = out.prepare()?.join("demo-target.toml");
    std::fs::write(&path, &text).map_err(|source| Error::Io {
        path: path.clone(),
        source,
    })?;
    let loaded = crate::server::manifest::parse(&text, &path.display().to_string())?;
    let report = crate::server::runner::run_with(&loaded, &opts, Some(stack.restarter())).await?;
    let code = crate::output::emit(&report, out)?;
    eprintln!(
        "demo: manifest used: {} (re-run with `run --target {}` while a server runs)",
        path.display(),
        path.display()
    );
    drop(stack);
    Ok(code)
}

/// Finds a caller's two account ids: `GET /v1/accounts` with its token,
/// taking the ids of the first two accounts in the answer (an array, or an
/// object holding one under `accounts`/`data`/`items`).
async fn accounts(base_url: &str, token: &str) -> Result<(String, String), Error> {
    let resp = reqwest::Client::new()
        .get(format!("{base_url}/v1/accounts"))
        .bearer_auth(token)
        .send()
        .await
        .map_err(|e| Error::Server(format!("GET /v1/accounts: {e}")))?;
    let status = resp.status();
    let doc: serde_json::Value = resp
        .json()
        .await
        .map_err(|e| Error::Server(format!("GET /v1/accounts ({status}): {e}")))?;
    let items = doc
        .as_array()
        .or_else(|| {
            ["accounts", "data", "items"]
                .iter()
                .find_map(|k| doc.get(k)?.as_array())
        })
        .ok_or_else(|| Error::Server(format!("GET /v1/accounts: no list in {doc}")))?;
    let id = |v: &serde_json::Value| match v.get("id") {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let ids: Vec<String> = items.iter().filter_map(id).collect();
    match ids.as_slice() {
        [a, b, ..] => Ok((a.clone(), b.clone())),
        _ => Err(Error::Server(format!(
            "GET /v1/accounts: fewer than two accounts in {doc}"
        ))),
    }
}

/// The multi-step endpoint, with its own probe (payments listed by
/// description), when the server has a processor. The marker is also the
/// card source, which the server passes on to the processor's charge: that
/// is how the foreign probe finds the charges one operation caused.
const PAYMENTS: &str = r#"[[endpoints]]
name = "create payment"
method = "POST"
path = "/v1/payments"
body = { amount = "{{amount}}", currency = "usd", source = "{{marker}}", description = "{{marker}}" }
probe = { kind = "list", url = "/v1/payments?description={{marker}}", items_pointer = "/payments", match_pointer = "/description" }

"#;

/// Failpoints: the error and the in-flight pause on the transfer endpoint
/// (right after the claim); the recovery cases on the multi-step endpoint:
/// a pause between phases (a committed in-flight key whose lease can run
/// out), a crash after the processor charged and phase 2 committed, and a
/// crash between the processor's answer and its commit.
const FAILPOINTS_PAYMENTS: &str = r#"failpoint = { header = "Idem-Failpoint", server_error = "error-after=started", pause = "pause-after=started", release_url = "/_test/failpoints/release", recovery_endpoint = "create payment", lease_pause = "pause-after=payment_created", crash_after_commit = "crash-after=charge_created", crash_after_foreign_call = "crash-after=charge-call" }
"#;

/// The foreign probe: the processor's charge listing, matched on the
/// source the payment carried (the processor has no filter).
fn foreign_probe(processor_url: &str) -> String {
    format!(
        "foreign_probe = {{ kind = \"list\", url = \"{processor_url}/charges\", items_pointer = \"/charges\", match_pointer = \"/source\" }}\n"
    )
}

/// Without a processor: everything on the transfer endpoint, and no lease
/// pause: a single-phase request held in process keeps an uncommitted
/// claim that no test-clock move can expire.
const FAILPOINTS_TRANSFERS: &str = r#"failpoint = { header = "Idem-Failpoint", server_error = "error-after=started", pause = "pause-after=started", crash_after_commit = "crash-after=finished", release_url = "/_test/failpoints/release" }
"#;

/// Writes the manifest for a running reference server: two callers from
/// the tokens it printed, their accounts, the transfer endpoint, the clock
/// hook (the demo starts it with `--test-hooks`).
/// `profile` is the profile the manifest declares.
pub async fn manifest_for(server: &Server, profile: idem_spec::Profile) -> Result<String, Error> {
    let mut callers = String::new();
    for (name, tok) in &server.tokens {
        let (from, to) = accounts(&server.base_url, tok).await?;
        callers.push_str(&format!(
            "[[callers]]\nname = \"{name}\"\nheaders = {{ Authorization = \"Bearer {tok}\" }}\nvars = {{ from = {from:?}, to = {to:?} }}\n\n"
        ));
    }
    Ok(format!(
        r#"# Written by `idem-conformance demo` for the reference server it started.
[target]
name = "idem-server (reference, demo)"
base_url = "{base}"
openapi_url = "/openapi.json"

[profile]
base = "{profile}"
expiry_header = "Idempotency-Key-Expires"
deadline_header = "Request-Deadline-Ms"

{callers}[[endpoints]]
name = "create transfer"
method = "POST"
path = "/v1/transfers"
body = {{ from = "{{{{from}}}}", to = "{{{{to}}}}", amount = "{{{{amount}}}}", memo = "{{{{marker}}}}" }}
rejected_body = {{ from = "{{{{from}}}}", to = "{{{{to}}}}", amount = 1000000000000, memo = "{{{{marker}}}}" }}

[policy]
replay_window_secs = 86400
in_flight = "conflict_or_wait"

[probe]
kind = "list"
url = "/v1/transfers?memo={{{{marker}}}}"
items_pointer = "/transfers"
match_pointer = "/memo"

{payments}[hooks]
clock = {{ url = "/_test/clock" }}
{failpoint}{foreign}# No restart hook: the demo restarts its own server in process (same
# binary, database and port). `run --target` on this file, with a server you
# started yourself, reports recovery.crash-restart unsupported unless you add
# restart = {{ command = "..." }}.

[limits]
max_side_effects = 2000
requests_per_second = 1000
concurrency = 32
request_timeout_ms = 10000
property_sequences = 12
# Its listings read their own writes (one database): a short count is final.
probe_settle_ms = 0
"#,
        base = server.base_url,
        profile = profile.as_str(),
        payments = if server.payments_listed() {
            PAYMENTS
        } else {
            ""
        },
        foreign = server
            .processor_url()
            .filter(|_| server.payments_listed())
            .map(foreign_probe)
            .unwrap_or_default(),
        failpoint = if server.payments_listed() {
            FAILPOINTS_PAYMENTS
        } else {
            FAILPOINTS_TRANSFERS
        },
    ))
}
