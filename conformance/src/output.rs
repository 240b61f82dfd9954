//! Where a run's reports go, for every subcommand that writes them (the
//! CLI's `run`, `client` and `demo`, and the demo's library entry point):
//! the console report printed, the HTML, JSON and JUnit files written.

use std::path::{Path, PathBuf};

use idem_spec::report::Report;

use crate::Error;

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
