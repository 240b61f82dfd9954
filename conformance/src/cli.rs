//! The CLI's subcommands, as library functions so tests can drive them.

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};

use crate::Error;
pub use crate::output::{Outputs, emit};
use crate::server::manifest::{self, Loaded};
use crate::server::runner::{self, Options};
use idem_conformance_core::{EXIT_CONFORMS, EXIT_HARNESS, EXIT_UNSAFE};

/// Checks an HTTP API against the idempotency contract, black-box.
#[derive(Debug, Parser)]
#[command(name = "idem-conformance", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Zero configuration: start the reference server and check it.
    Demo {
        /// Seed of the run.
        #[arg(long)]
        seed: Option<u64>,
        /// Only cases matching this glob.
        #[arg(long)]
        only: Option<String>,
        /// Start the server with this deliberate flaw (needs the server's `flaws` feature).
        #[arg(long)]
        flaw: Option<String>,
        /// Serve, and check, this profile: reference, ietf-draft, stripe or resend.
        #[arg(long, default_value = "reference", value_parser = parse_profile)]
        profile: idem_spec::Profile,
        /// Reports.
        #[command(flatten)]
        out: Outputs,
    },
    /// Check the target a manifest describes.
    Run {
        /// The target manifest (TOML).
        #[arg(long, short)]
        target: PathBuf,
        /// Seed of the run.
        #[arg(long)]
        seed: Option<u64>,
        /// Only cases matching this glob.
        #[arg(long)]
        only: Option<String>,
        /// Use this base URL instead of the manifest's.
        #[arg(long)]
        base_url: Option<String>,
        /// Also fail (DEVIATES, exit 3) on non-strict findings: a missed
        /// SHOULD or MAY.
        #[arg(long)]
        strict: bool,
        /// Reports.
        #[command(flatten)]
        out: Outputs,
    },
    /// Print the cases a run would execute, with their clauses and permitted
    /// outcomes under the manifest's profile; sends nothing.
    List {
        /// The target manifest (TOML).
        #[arg(long, short)]
        target: PathBuf,
    },
    /// Write a commented manifest template, or one seeded from your OpenAPI
    /// document.
    Init {
        /// Where to write it.
        #[arg(default_value = "idem-target.toml")]
        path: PathBuf,
        /// Seed the manifest from this OpenAPI 3.x document, a file or an
        /// http(s) URL, JSON or YAML: every operation declaring an
        /// Idempotency-Key header (or named by --keyed) becomes an endpoint,
        /// security schemes become caller headers to fill in, the key
        /// header's schema (format uuid, maxLength) the `[key]` grammar.
        #[arg(long, value_name = "FILE_OR_URL")]
        from_openapi: Option<String>,
        /// Treat this operation as keyed though the document does not
        /// declare the header (a middleware reading it): `METHOD /path` as
        /// in the document, or an operationId. Repeatable.
        #[arg(long, value_name = "OPERATION", requires = "from_openapi")]
        keyed: Vec<String>,
    },
    /// Check a client or SDK: run COMMAND once per scenario against a
    /// fault-injecting API at $IDEM_BASE_URL and judge its retries against
    /// the contract's client clauses.
    #[command(after_help = CLIENT_HELP)]
    Client {
        /// The command performing one POST with a JSON body through the SDK
        /// under test, to any path under $IDEM_BASE_URL; exit 0 iff the SDK
        /// finally got a 2xx. Run with `sh -c`.
        #[arg(long = "run", value_name = "COMMAND")]
        command: String,
        /// The JSON body every success answers with: what the SDK parses
        /// its result from, e.g. --success-body '{"id":"pay_1","status":"succeeded"}'.
        #[arg(long, default_value = "{}", value_name = "JSON")]
        success_body: String,
        /// The SDK's configured overall deadline, in seconds.
        #[arg(long, default_value_t = 30, value_name = "SECS")]
        deadline: u64,
        /// How many runs the jitter test makes (at least 6).
        #[arg(long, default_value_t = 12, value_name = "N")]
        runs: usize,
        /// Seed of the run (picks the Retry-After hints).
        #[arg(long)]
        seed: Option<u64>,
        /// Only scenarios matching this glob (the plain success always runs).
        #[arg(long)]
        only: Option<String>,
        /// The header the API reads the key from (a tracing-id header such
        /// as x-ms-client-request-id is refused: no server deduplicates on it).
        #[arg(long, default_value = "Idempotency-Key", value_name = "NAME")]
        key_header: String,
        /// The key travels in the JSON body instead, at this JSON pointer,
        /// e.g. /idempotency_key.
        #[arg(long, value_name = "POINTER")]
        key_pointer: Option<String>,
        /// Also fail (DEVIATES, exit 3) on non-strict findings: a missed
        /// SHOULD, such as jitter other than full or more than 3 attempts.
        #[arg(long)]
        strict: bool,
        /// Reports.
        #[command(flatten)]
        out: Outputs,
    },
    /// Re-run a saved counterexample against a target.
    Replay {
        /// The counterexample file written by a failing run.
        file: PathBuf,
        /// The target manifest (TOML).
        #[arg(long, short)]
        target: PathBuf,
        /// Use this base URL instead of the manifest's.
        #[arg(long)]
        base_url: Option<String>,
    },
}

/// The `client` subcommand's help after its options: the exit codes and
/// an example.
const CLIENT_HELP: &str = "\
Exit codes:
  0  CONFORMS       no MUST clause failed (a missed SHOULD is non-strict)
  1  UNSAFE         a safety clause failed: a second effect is possible
  2  HARNESS ERROR  the kit could not judge (command not found, never reached the API)
  3  DEVIATES       only semantics or interop MUST clauses failed

Example:
  idem-conformance client --deadline 30 \\
    --success-body '{\"id\":\"pay_1\",\"status\":\"succeeded\"}' \\
    --run 'python pay.py'

Secrets in the command, its environment and the headers it sends are redacted from every report.";

fn parse_profile(s: &str) -> Result<idem_spec::Profile, String> {
    idem_spec::Profile::from_name(s).ok_or_else(|| {
        format!("unknown profile {s:?}; expected reference, ietf-draft, stripe or resend")
    })
}

/// Runs a parsed command line; returns the process exit code.
pub async fn execute(cli: Cli) -> i32 {
    let result = match cli.command {
        Command::Demo {
            seed,
            only,
            flaw,
            profile,
            out,
        } => demo_command(seed, only, flaw, profile, &out).await,
        Command::Run {
            target,
            seed,
            only,
            base_url,
            strict,
            out,
        } => run_command(&target, seed, only, base_url, strict, &out).await,
        Command::List { target } => list(&target).map(|s| {
            print!("{s}");
            EXIT_CONFORMS
        }),
        Command::Init {
            path,
            from_openapi: Some(doc),
            keyed,
        } => init_seeded_command(&path, &doc, &keyed).await,
        Command::Init {
            path,
            from_openapi: None,
            ..
        } => init_template_command(&path),
        Command::Replay {
            file,
            target,
            base_url,
        } => replay(&file, &target, base_url).await,
        Command::Client {
            command,
            success_body,
            deadline,
            runs,
            seed,
            only,
            key_header,
            key_pointer,
            strict,
            out,
        } => {
            let keys =
                idem_conformance_client::KeySource::new(Some(&key_header), key_pointer.as_deref());
            let opts = keys.map(|keys| idem_conformance_client::ClientOptions {
                deadline: std::time::Duration::from_secs(deadline.max(1)),
                runs,
                seed,
                only,
                success_body,
                progress: true,
                keys,
                strict,
                ..idem_conformance_client::ClientOptions::default()
            });
            match opts {
                Ok(opts) => client(command, opts, &out).await,
                Err(e) => Err(Error::Client(e)),
            }
        }
    };
    result.unwrap_or_else(|e| {
        eprintln!("idem-conformance: {e}");
        EXIT_HARNESS
    })
}

/// The options of a server check run from the command line: progress on,
/// artifacts next to the reports.
fn cli_options(seed: Option<u64>, only: Option<String>, strict: bool, dir: &Path) -> Options {
    Options {
        seed,
        only,
        progress: true,
        artifacts_dir: Some(dir.to_owned()),
        strict,
    }
}

/// The `demo` subcommand: the reference server, started and checked.
async fn demo_command(
    seed: Option<u64>,
    only: Option<String>,
    flaw: Option<String>,
    profile: idem_spec::Profile,
    out: &Outputs,
) -> Result<i32, Error> {
    let dir = out.prepare()?;
    crate::server::demo::run(cli_options(seed, only, false, dir), flaw, profile, out).await
}

/// The `run` subcommand: the target a manifest describes.
async fn run_command(
    target: &Path,
    seed: Option<u64>,
    only: Option<String>,
    base_url: Option<String>,
    strict: bool,
    out: &Outputs,
) -> Result<i32, Error> {
    let dir = out.prepare()?;
    run(target, base_url, cli_options(seed, only, strict, dir), out).await
}

/// `init --from-openapi`: a manifest seeded from the document.
async fn init_seeded_command(path: &Path, doc: &str, keyed: &[String]) -> Result<i32, Error> {
    let text = read_document(doc).await?;
    let notes = init_from_openapi_text(path, &text, doc, keyed)?;
    println!(
        "wrote {} from {doc}; {} thing(s) to fill in (marked TODO in the file; every {} value must be filled in or its line deleted before a run), then: idem-conformance list --target {}",
        path.display(),
        notes,
        crate::server::openapi::FILL_ME,
        path.display()
    );
    Ok(EXIT_CONFORMS)
}

/// Plain `init`: the commented template.
fn init_template_command(path: &Path) -> Result<i32, Error> {
    init(path)?;
    println!(
        "wrote {}; edit it, then: idem-conformance list --target {}",
        path.display(),
        path.display()
    );
    Ok(EXIT_CONFORMS)
}

/// The `client` subcommand: checks the command, prints and writes the
/// reports; a command that never reached the API is a harness error.
pub async fn client(
    command: String,
    opts: idem_conformance_client::ClientOptions,
    out: &Outputs,
) -> Result<i32, Error> {
    if command.trim().is_empty() {
        return Err(Error::Client("--run needs a command".to_owned()));
    }
    if serde_json::from_str::<serde_json::Value>(&opts.success_body).is_err() {
        return Err(Error::Client(format!(
            "--success-body is not JSON: {}",
            opts.success_body
        )));
    }
    if opts.runs < idem_conformance_client::judge::JITTER_MIN_SAMPLES {
        return Err(Error::Client(format!(
            "--runs must be at least {}",
            idem_conformance_client::judge::JITTER_MIN_SAMPLES
        )));
    }
    out.prepare()?;
    let started = std::time::Instant::now();
    let report = idem_conformance_client::run(
        std::sync::Arc::new(idem_conformance_client::ShellCommand::new(command)),
        &opts,
    )
    .await?;
    let code = emit(&report, out)?;
    let (checked, of) = idem_conformance_client::runner::clauses_checked(&report);
    match &opts.only {
        // A partial run's result covers only what it checked.
        Some(only) => println!(
            "partial run (--only {only}): {checked} of {of} client clauses checked; the result covers those only"
        ),
        None => println!("{checked} of {of} client clauses checked"),
    }
    eprintln!(
        "idem-conformance client: wall time {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if let Some(why) = &report.harness_error {
        eprintln!("idem-conformance: {why}");
    }
    Ok(code)
}

/// Loads a manifest, optionally pointing it at another base URL.
pub fn load_with(target: &Path, base_url: Option<String>) -> Result<Loaded, Error> {
    let mut loaded = manifest::load(target)?;
    if let Some(u) = base_url {
        loaded.manifest.target.base_url = u;
        manifest::validate(&loaded.manifest)?;
    }
    for w in &loaded.warnings {
        eprintln!("idem-conformance: warning: {}: {w}", target.display());
    }
    Ok(loaded)
}

async fn run(
    target: &Path,
    base_url: Option<String>,
    opts: Options,
    out: &Outputs,
) -> Result<i32, Error> {
    let loaded = load_with(target, base_url)?;
    match runner::run(&loaded, &opts).await {
        Ok(report) => emit(&report, out),
        // A run that stopped before its cases still leaves its reports, so
        // a CI job publishing them shows why.
        Err(e @ Error::Preflight(_)) => {
            let report = runner::harness_report(&loaded, e.to_string());
            emit(&report, out)?;
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// The plan as text: one block per case.
pub fn list(target: &Path) -> Result<String, Error> {
    let loaded = manifest::load(target)?;
    Ok(plan_text(&loaded))
}

/// Renders the plan for a loaded manifest without sending anything.
pub fn plan_text(loaded: &Loaded) -> String {
    let m = &loaded.manifest;
    let mut s = format!(
        "target {} ({}), profile {}, manifest sha256 {}\n",
        m.target.name,
        m.target.base_url,
        crate::server::manifest::ManifestExt::profile_name(m),
        loaded.sha256
    );
    for c in runner::plan(&Options::default()) {
        let status = match c.missing_need(m) {
            Some(n) => format!("unsupported: needs {}", n.describe()),
            None => "will run".to_owned(),
        };
        s.push_str(&format!(
            "\n{} [{}] — {}\n  {}\n  clauses: {}\n",
            c.id,
            c.tier().as_str(),
            c.title,
            status,
            c.clauses
                .iter()
                .map(|c| c.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
        for p in (c.permitted)(m) {
            s.push_str(&format!("  permits: {p}\n"));
        }
        for w in m
            .waivers
            .iter()
            .filter(|w| idem_conformance_core::waivers::matches(&w.case, c.id))
        {
            s.push_str(&format!("  waived: {}\n", w.reason));
        }
    }
    s
}

/// Writes the commented template; refuses to overwrite.
pub fn init(path: &Path) -> Result<(), Error> {
    if path.exists() {
        return Err(Error::Io {
            path: path.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "exists; not overwriting",
            ),
        });
    }
    std::fs::write(path, manifest::TEMPLATE).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })
}

/// Writes a manifest seeded from an OpenAPI document; refuses to
/// overwrite. Returns how many notes (things to fill in) it wrote.
pub fn init_from_openapi(path: &Path, doc: &Path) -> Result<usize, Error> {
    let text = std::fs::read_to_string(doc).map_err(|source| Error::Io {
        path: doc.to_owned(),
        source,
    })?;
    init_from_openapi_text(path, &text, &doc.display().to_string(), &[])
}

/// An OpenAPI document from a file or an http(s) URL (as a service serves
/// it, e.g. FastAPI's `/openapi.json`), bounded to 30 s and 16 MiB.
pub async fn read_document(doc: &str) -> Result<String, Error> {
    if !(doc.starts_with("http://") || doc.starts_with("https://")) {
        return std::fs::read_to_string(doc).map_err(|source| Error::Io {
            path: doc.into(),
            source,
        });
    }
    let fetch_err = |e: String| Error::Http(format!("fetching the OpenAPI document {doc}: {e}"));
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .map_err(|e| fetch_err(e.to_string()))?;
    let resp = client
        .get(doc)
        .send()
        .await
        .map_err(|e| fetch_err(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(fetch_err(format!("answered {}", resp.status())));
    }
    let bytes = resp.bytes().await.map_err(|e| fetch_err(e.to_string()))?;
    if bytes.len() > 16 << 20 {
        return Err(fetch_err("larger than 16 MiB".into()));
    }
    String::from_utf8(bytes.to_vec()).map_err(|e| fetch_err(format!("not UTF-8: {e}")))
}

/// Writes a manifest seeded from the document `text` (from `origin`), with
/// the operations `keyed` names treated as keyed; refuses to overwrite.
/// Returns how many notes (things to fill in) it wrote.
pub fn init_from_openapi_text(
    path: &Path,
    text: &str,
    origin: &str,
    keyed: &[String],
) -> Result<usize, Error> {
    if path.exists() {
        return Err(Error::Io {
            path: path.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "exists; not overwriting",
            ),
        });
    }
    let seeded = crate::server::openapi::seed_with(text, origin, keyed)?;
    let toml = crate::server::openapi::render(&seeded, origin)?;
    // What it writes must load as a manifest.
    manifest::parse(&toml, &path.display().to_string())?;
    std::fs::write(path, toml).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })?;
    Ok(seeded.notes.len())
}

/// Re-runs a counterexample: exit 1 when it still fails, 0 when fixed, 2
/// when the harness could not decide.
pub async fn replay(file: &Path, target: &Path, base_url: Option<String>) -> Result<i32, Error> {
    let text = std::fs::read_to_string(file).map_err(|source| Error::Io {
        path: file.to_owned(),
        source,
    })?;
    let cx: crate::server::model::Counterexample =
        serde_json::from_str(&text).map_err(|e| Error::ReplayFile {
            path: file.display().to_string(),
            message: e.to_string(),
        })?;
    let loaded = load_with(target, base_url)?;
    let code = replay_loaded(&cx, &loaded).await?;
    Ok(code)
}

/// Attempts per replay: races (bursts) do not lose every time, so a
/// counterexample is re-run until it fails or this many attempts pass.
pub const REPLAY_ATTEMPTS: u32 = 10;

/// Re-runs a counterexample against a loaded manifest, printing the outcome.
/// Exit 1 when any attempt still violates the contract, 0 when every
/// attempt agrees with the model.
pub async fn replay_loaded(
    cx: &crate::server::model::Counterexample,
    loaded: &Loaded,
) -> Result<i32, Error> {
    let client = runner::client(loaded)?;
    let ctx =
        crate::server::case::Ctx::new(loaded.manifest.clone(), client, runner::run_id(), cx.seed);
    println!(
        "replaying {} operation(s) (found with seed {}) against {}, up to {REPLAY_ATTEMPTS} times",
        cx.ops.len(),
        cx.seed,
        loaded.manifest.target.base_url
    );
    for attempt in 1..=REPLAY_ATTEMPTS {
        match crate::server::model::execute(&ctx, &cx.ops, &format!("r{attempt}")).await {
            Ok(_) => {}
            Err(crate::server::model::Stop::Violation(v)) => {
                println!(
                    "STILL FAILS (attempt {attempt}): {} [{}]",
                    v.clause, v.class
                );
                println!("  permitted: {}", v.permitted);
                println!("  observed:  {}", v.observed);
                for (i, l) in v.narrative.iter().enumerate() {
                    println!("  {}. {l}", i + 1);
                }
                return Ok(EXIT_UNSAFE);
            }
            Err(
                crate::server::model::Stop::Undecided(why)
                | crate::server::model::Stop::Harness(why),
            ) => {
                println!("UNDECIDED (attempt {attempt}): {why}");
                return Ok(EXIT_HARNESS);
            }
        }
    }
    println!("FIXED: {REPLAY_ATTEMPTS} attempts agreed with the contract model");
    Ok(EXIT_CONFORMS)
}
