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

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::Error;

/// Environment variable naming a prebuilt `idem-server` binary.
pub const SERVER_BIN_ENV: &str = "IDEM_SERVER_BIN";

/// The workspace root this crate was built in.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Builds (or finds fresh) the `idem-server` binary and returns its path.
/// `features` are passed to Cargo (e.g. `["flaws"]`).
pub fn build_server(release: bool, features: &[&str]) -> Result<PathBuf, Error> {
    if let Some(p) = std::env::var_os(SERVER_BIN_ENV) {
        return Ok(PathBuf::from(p));
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(workspace_root().join("Cargo.toml"))
        .args([
            "-p",
            "idem-server",
            "--bin",
            "idem-server",
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
            "`cargo build -p idem-server` failed ({}); see its output above",
            out.status
        )));
    }
    BufRead::lines(&out.stdout[..])
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .filter(|v| v["reason"] == "compiler-artifact" && v["target"]["name"] == "idem-server")
        .find_map(|v| v["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| Error::Server("cargo built no idem-server executable".into()))
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
        let dir = std::env::temp_dir().join(format!(
            "idem-conformance-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
            path: dir.clone(),
            source,
        })?;
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
        let mut child = Command::new(bin)
            .args(&args)
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
        let base_url = loop {
            let line = tokio::time::timeout_at(deadline, lines.next_line())
                .await
                .map_err(|_| Error::Server("no `listening on` line within 30 s".into()))?
                .map_err(|e| Error::Server(e.to_string()))?
                .ok_or_else(|| {
                    Error::Server(format!(
                        "server exited before listening; it printed: {banner:?}"
                    ))
                })?;
            banner.push(line.clone());
            if let Some(pos) = line.find("listening on ") {
                let url = line[pos + "listening on ".len()..]
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .trim_end_matches('/')
                    .to_owned();
                break url;
            }
        };
        // Keep draining stdout so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
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
}

/// The demo: start the reference server (optionally with a flaw), write a
/// manifest for it next to the reports, run every case, emit reports.
pub async fn run(
    opts: crate::runner::Options,
    flaw: Option<String>,
    profile: idem_spec::Profile,
    out: &crate::commands::Outputs,
) -> Result<i32, Error> {
    let features: &[&str] = if flaw.is_some() { &["flaws"] } else { &[] };
    eprintln!("demo: building/locating idem-server (cargo build -p idem-server)…");
    let bin = tokio::task::spawn_blocking({
        let features: Vec<&'static str> = features.to_vec();
        move || build_server(!cfg!(debug_assertions), &features)
    })
    .await
    .map_err(|e| Error::Server(e.to_string()))??;
    let mut extra = Vec::new();
    if let Some(f) = &flaw {
        extra.extend(["--flaw".to_owned(), f.clone()]);
    }
    extra.extend(["--profile".to_owned(), profile.as_str().to_owned()]);
    let server = Server::start(&bin, &extra).await?;
    eprintln!("demo: reference server at {}", server.base_url);
    let text = manifest_for(&server, profile).await?;
    let path = PathBuf::from("idem-report-demo-target.toml");
    std::fs::write(&path, &text).map_err(|source| Error::Io {
        path: path.clone(),
        source,
    })?;
    let loaded = crate::manifest::parse(&text, "idem-report-demo-target.toml")?;
    let report = crate::runner::run(&loaded, &opts).await?;
    let code = crate::commands::emit(&report, out)?;
    eprintln!(
        "demo: manifest used: {} (re-run with `run --target {}` while a server runs)",
        path.display(),
        path.display()
    );
    drop(server);
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

[hooks]
clock = {{ url = "/_test/clock" }}

[limits]
max_side_effects = 2000
requests_per_second = 1000
concurrency = 32
request_timeout_ms = 10000
property_sequences = 12
"#,
        base = server.base_url,
        profile = profile.as_str()
    ))
}
