//! The fleet simulator behind `idem-sim`: why the client's defaults are what they are.
//!
//! Two scenarios, both deterministic for a seed and both driving the client's own code (the
//! [`Backoff`](crate::Backoff) formulas; in the outage scenario the whole
//! [`RetryPolicy`](crate::RetryPolicy) with its budget):
//!
//! - [`brooker`]: Marc Brooker's 2015 optimistic-concurrency experiment. Jitter matters more
//!   than backoff: capped exponential backoff without jitter keeps colliding clients in
//!   lock-step, so it still does roughly three times the work of full jitter at 190 clients and
//!   takes an order of magnitude longer. Full jitter does the least work over the sweep (equal
//!   jitter is close in work but slower); decorrelated jitter does more work than full jitter
//!   and, up to about 120 clients, finishes a little sooner. The same ordering as the post.
//! - [`outage`]: an open-loop fleet facing a 10 s outage. An attempt cap multiplies the load on
//!   the failing backend; a shared budget brings it back to about one attempt per call. The
//!   same fleet facing a restart (connections refused) shows that refusals, which no longer
//!   spend the attempt cap, stay under the budget's bound.
//!
//! Outputs (Markdown tables and SVG plots) are committed under `book/src/sim/`; see
//! [`brooker_artifacts`], [`outage_artifacts`] and the tests that keep them current.

pub mod brooker;
pub mod outage;
pub mod plot;

use std::path::Path;

use crate::Error;
use crate::backoff::Jitter;
use plot::{Chart, Series};

/// Where the committed outputs live, relative to the workspace root.
pub const BOOK_SIM_DIR: &str = "book/src/sim";

/// One output file: a path relative to [`BOOK_SIM_DIR`] and its exact contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// Relative path.
    pub path: String,
    /// Exact contents.
    pub contents: String,
}

/// The table and two plots of a Brooker sweep, named `{prefix}.md`, `{prefix}-writes.svg`,
/// `{prefix}-time.svg`.
pub fn brooker_artifacts(
    results: &brooker::BrookerResults,
    prefix: &str,
) -> Result<Vec<Artifact>, Error> {
    let series = |metric: fn(&brooker::CellResult) -> f64| -> Vec<Series> {
        results
            .config
            .strategies
            .iter()
            .map(|&j: &Jitter| Series {
                label: j.to_string(),
                points: results
                    .cells
                    .iter()
                    .filter(|c| c.jitter == j)
                    .map(|c| (f64::from(c.clients), metric(c)))
                    .collect(),
            })
            .collect()
    };
    let writes = Chart {
        title: "Brooker 2015: mean server writes (log scale)".into(),
        x_label: "clients".into(),
        y_label: "writes per run".into(),
        log_y: true,
        series: series(|c| c.mean_writes),
    };
    let time = Chart {
        title: "Brooker 2015: mean completion time (log scale)".into(),
        x_label: "clients".into(),
        y_label: "milliseconds".into(),
        log_y: true,
        series: series(|c| c.mean_time_ms),
    };
    Ok(vec![
        Artifact {
            path: format!("{prefix}.md"),
            contents: brooker::markdown(results),
        },
        Artifact {
            path: format!("{prefix}-writes.svg"),
            contents: plot::render(&writes)?,
        },
        Artifact {
            path: format!("{prefix}-time.svg"),
            contents: plot::render(&time)?,
        },
    ])
}

/// The table and load plot of an outage run: `outage.md`, `outage-load.svg`.
pub fn outage_artifacts(results: &outage::OutageResults) -> Result<Vec<Artifact>, Error> {
    outage_artifacts_named(results, "outage")
}

/// The table and load plot of an outage run, named `{name}.md` and `{name}-load.svg` (the
/// restart scenario is `restart`).
pub fn outage_artifacts_named(
    results: &outage::OutageResults,
    name: &str,
) -> Result<Vec<Artifact>, Error> {
    let bin = results.config.bin.as_secs_f64();
    let chart = Chart {
        title: format!(
            "Backend load, outage from {} s to {} s",
            results.config.outage_start.as_secs_f64(),
            (results.config.outage_start + results.config.outage_len).as_secs_f64()
        ),
        x_label: "seconds".into(),
        y_label: "attempts per second".into(),
        log_y: false,
        series: results
            .scenarios
            .iter()
            .map(|s| Series {
                label: s.scenario.label.clone(),
                points: s
                    .load
                    .iter()
                    .enumerate()
                    .map(|(i, l)| (i as f64 * bin, *l))
                    .collect(),
            })
            .collect(),
    };
    Ok(vec![
        Artifact {
            path: format!("{name}.md"),
            contents: outage::markdown(results),
        },
        Artifact {
            path: format!("{name}-load.svg"),
            contents: plot::render(&chart)?,
        },
    ])
}

/// Writes `artifacts` under `dir`, creating folders as needed.
pub fn write(dir: &Path, artifacts: &[Artifact]) -> Result<(), Error> {
    for a in artifacts {
        let path = dir.join(&a.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| Error::Io {
                path: parent.to_owned(),
                source,
            })?;
        }
        std::fs::write(&path, &a.contents).map_err(|source| Error::Io { path, source })?;
    }
    Ok(())
}

/// The artifacts whose committed copy under `dir` is missing or differs.
pub fn stale(dir: &Path, artifacts: &[Artifact]) -> Vec<String> {
    artifacts
        .iter()
        .filter(|a| std::fs::read_to_string(dir.join(&a.path)).ok().as_deref() != Some(&a.contents))
        .map(|a| a.path.clone())
        .collect()
}
