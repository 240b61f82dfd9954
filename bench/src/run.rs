//! One benchmark run: the binaries, then a [`session`](crate::session) per
//! store (a store that cannot be set up, other than SQLite, is skipped
//! loudly), then the targets; collected into a [`BenchResult`].

use std::time::Instant;

use crate::config::{Config, StoreKind};
use crate::results::{BenchResult, Machine, StoreResult};
use crate::{Result, procfs};

/// Runs everything `cfg` asks for. `progress` gets one line per cell.
pub async fn run(cfg: &Config, progress: &(dyn Fn(&str) + Sync)) -> Result<BenchResult> {
    let started = Instant::now();
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let bins = crate::apps::bins(cfg)?;
    let mut stores = Vec::new();
    for &kind in &cfg.stores {
        progress(&format!("== {kind} =="));
        match crate::session::session(cfg, &bins, kind, progress).await {
            Ok(r) => stores.push(r),
            Err(e) if kind != StoreKind::Sqlite && e.is_setup() => {
                progress(&format!("{kind} skipped: {e}"));
                stores.push(StoreResult::skipped(kind, e.to_string()));
            }
            Err(e) => return Err(e),
        }
    }
    let (nproc, cpu_model) = procfs::machine();
    let targets = crate::targets::targets(cfg, &stores);
    Ok(BenchResult {
        started_at,
        wall_s: started.elapsed().as_secs_f64(),
        machine: Machine {
            nproc,
            cpu_model,
            clock_ticks: procfs::ticks_per_second(),
        },
        config: cfg.clone(),
        stores,
        targets,
    })
}
