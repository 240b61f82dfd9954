//! The CLI's subcommands, as library functions so tests can drive them.

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use idem_spec::report::Report;

use crate::server::manifest::{self, Loaded};
use crate::server::runner::{self, Options};
use crate::Error;
use idem_conformance_core::{EXIT_CONFORMS, EXIT_HARNESS, EXIT_UNSAFE};

/// Checks an HTTP API against the idempotency contract, black-box.
#[derive(Debug, Parser)]
#[command(name = "idem-conformance", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Where a run's artefacts go: one directory holding the reports
/// (`report.html`, `report.json`, `junit.xml`), any counterexample and, for
/// the demo, the manifest it wrote. `--html`, `--json` and `--junit` write
/// an extra copy where you say.
#[derive(Debug, Clone, clap::Args)]
pub struct Outputs {
    /// The directory for every file the run writes (created if missing).
    #[arg(long, alias = "artifacts-dir", default_value = "idem-report")]
    pub out_dir: PathBuf,
    /// Also write the self-contained HTML report here.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// Also write the JSON report here (schema: spec/generated/schemas/Report.schema.json).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also write the JUnit XML report here.
    #[arg(long)]
    pub junit: Option<PathBuf>,
}

impl Outputs {
    /// Everything under `dir`, no extra copies.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            out_dir: dir.into(),
            html: None,
            json: None,
            junit: None,
        }
    }

    /// Creates the output directory.
    pub fn prepare(&self) -> Result<&Path, Error> {
        std::fs::create_dir_all(&self.out_dir).map_err(|source| Error::Io {
            path: self.out_dir.clone(),
            source,
        })?;
        Ok(&self.out_dir)
    }
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
        /// Seed the manifest from this OpenAPI 3.x document (JSON): every
        /// operation declaring an Idempotency-Key header becomes an
        /// endpoint, security schemes become caller headers to fill in.
        #[arg(long, value_name = "FILE")]
        from_openapi: Option<PathBuf>,
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
        } => match out.prepare() {
            Ok(dir) => {
                crate::server::demo::run(
                    Options {
                        seed,
                        only,
                        progress: true,
                        artifacts_dir: Some(dir.to_owned()),
                    },
                    flaw,
                    profile,
                    &out,
                )
                .await
            }
            Err(e) => Err(e),
        },
        Command::Run {
            target,
            seed,
            only,
            base_url,
            out,
        } => match out.prepare() {
            Ok(dir) => {
                run(
                    &target,
                    base_url,
                    Options {
                        seed,
                        only,
                        progress: true,
                        artifacts_dir: Some(dir.to_owned()),
                    },
                    &out,
                )
                .await
            }
            Err(e) => Err(e),
        },
        Command::List { target } => list(&target).map(|s| {
            print!("{s}");
            EXIT_CONFORMS
        }),
        Command::Init {
            path,
            from_openapi: Some(doc),
        } => init_from_openapi(&path, &doc).map(|notes| {
            println!(
                "wrote {} from {}; {} thing(s) to fill in (marked TODO in the file), then: idem-conformance list --target {}",
                path.display(),
                doc.display(),
                notes,
                path.display()
            );
            EXIT_CONFORMS
        }),
        Command::Init {
            path,
            from_openapi: None,
        } => init(&path).map(|()| {
            println!(
                "wrote {}; edit it, then: idem-conformance list --target {}",
                path.display(),
                path.display()
            );
            EXIT_CONFORMS
        }),
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
            out,
        } => match idem_conformance_client::KeySource::new(
            Some(&key_header),
            key_pointer.as_deref(),
        ) {
            Ok(keys) => {
                client(
                    command,
                    idem_conformance_client::ClientOptions {
                        deadline: std::time::Duration::from_secs(deadline.max(1)),
                        runs,
                        seed,
                        only,
                        success_body,
                        progress: true,
                        keys,
                        ..idem_conformance_client::ClientOptions::default()
                    },
                    &out,
                )
                .await
            }
            Err(e) => Err(Error::Client(e)),
        },
    };
    result.unwrap_or_else(|e| {
        eprintln!("idem-conformance: {e}");
        EXIT_HARNESS
    })
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

/// Prints the console report and writes every report into the output
/// directory (and any extra copy asked for); returns the report's exit code.
pub fn emit(report: &Report, out: &Outputs) -> Result<i32, Error> {
    print!("{}", idem_conformance_core::report::console::render(report));
    let dir = out.prepare()?;
    let write = |p: &Path, s: &str| {
        std::fs::write(p, s).map_err(|source| Error::Io {
            path: p.to_owned(),
            source,
        })
    };
    let html = idem_conformance_core::report::html::render(report);
    let json = idem_conformance_core::report::json(report)?;
    let junit = idem_conformance_core::report::junit::render(report)?;
    for (name, text, extra) in [
        ("report.html", &html, &out.html),
        ("report.json", &json, &out.json),
        ("junit.xml", &junit, &out.junit),
    ] {
        write(&dir.join(name), text)?;
        if let Some(p) = extra {
            write(p, text)?;
        }
    }
    println!(
        "reports: {} (report.html, report.json, junit.xml)",
        dir.display()
    );
    Ok(report.summary.exit_code)
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
    if path.exists() {
        return Err(Error::Io {
            path: path.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "exists; not overwriting",
            ),
        });
    }
    let text = std::fs::read_to_string(doc).map_err(|source| Error::Io {
        path: doc.to_owned(),
        source,
    })?;
    let origin = doc.display().to_string();
    let seeded = crate::server::openapi::seed(&text, &origin)?;
    let toml = crate::server::openapi::render(&seeded, &origin)?;
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
    let ctx = crate::server::case::Ctx::new(loaded.manifest.clone(), client, runner::run_id(), cx.seed);
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
            Err(crate::server::model::Stop::Undecided(why) | crate::server::model::Stop::Harness(why)) => {
                println!("UNDECIDED (attempt {attempt}): {why}");
                return Ok(EXIT_HARNESS);
            }
        }
    }
    println!("FIXED: {REPLAY_ATTEMPTS} attempts agreed with the contract model");
    Ok(EXIT_CONFORMS)
}
