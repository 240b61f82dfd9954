//! Where the minimal app's time goes: a fresh app with `--stage-times` on
//! its own database, a fixed number of requests per minimal scenario (the
//! layer-less ones show the handler's own time) at c = 1 and at the first
//! ratio concurrency above 1, untimed otherwise; the span totals are read
//! from `GET /_bench/stages` before and after.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::Result;
use crate::apps::{Dbs, MinimalStart, start_minimal};
use crate::config::{Config, Scenario, StoreKind};
use crate::load::{self, Load};
use crate::minimal::StageTotal;
use crate::results::{Stage, StagePass};

type Totals = BTreeMap<String, StageTotal>;

/// Every stage pass of one store.
pub async fn passes(
    cfg: &Config,
    bench: &std::path::Path,
    dbs: &Dbs,
    pool: u32,
    kind: StoreKind,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Vec<StagePass>> {
    let url = dbs.url("bench_stages").await?;
    let app = start_minimal(
        bench,
        MinimalStart {
            url: &url,
            pool,
            sleep_ms: cfg.concurrent_sleep_ms,
            extra: &["--stage-times"],
            log: None,
        },
    )
    .await?;
    let mut out = Vec::new();
    let mut levels = vec![1];
    if let Some(&c) = cfg.ratio_concurrencies.iter().find(|&&c| c > 1) {
        levels.push(c);
    }
    for (i, &c) in levels.iter().enumerate() {
        for (j, scenario) in Scenario::MINIMAL.into_iter().enumerate() {
            let tag = 2_000_000 + (i * 10 + j) as u64;
            let p = pass(cfg, app.addr, scenario, c, tag).await?;
            progress(&format!(
                "{kind} stages {:>15} c={c:<3} {}",
                scenario.name(),
                p.stages
                    .iter()
                    .map(|s| format!("{} {:.0}/{:.0} µs", s.name, s.wall_us, s.busy_us))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            out.push(p);
        }
    }
    app.stop().await;
    Ok(out)
}

/// One scenario at `c`: `cfg.count_requests` requests, the span totals
/// before and after.
async fn pass(
    cfg: &Config,
    addr: SocketAddr,
    scenario: Scenario,
    c: usize,
    tag: u64,
) -> Result<StagePass> {
    let (make, expect) = crate::scenario::requests(scenario, cfg.callers, 1, tag);
    let before = totals(addr).await?;
    let r = load::run(Load {
        addr,
        concurrency: c,
        duration: load::COUNTED_PASS_BOUND,
        max_requests: Some(cfg.count_requests),
        per_worker: None,
        make,
        expect,
    })
    .await;
    let after = settled(addr, &before, r.ok).await?;
    if r.ok == 0 || r.errors > 0 {
        return Err(crate::Error::Run(format!(
            "stage pass {}: {} good, {} errors ({})",
            scenario.name(),
            r.ok,
            r.errors,
            r.first_error.unwrap_or_default()
        )));
    }
    let n = r.ok as f64;
    let stages = after
        .iter()
        .filter_map(|(name, a)| {
            let b = before.get(name).copied().unwrap_or_default();
            let count = a.count.saturating_sub(b.count);
            (count > 0).then(|| Stage {
                name: name.clone(),
                per_request: count as f64 / n,
                wall_us: a.wall_ns.saturating_sub(b.wall_ns) as f64 / 1e3 / n,
                busy_us: a.busy_ns.saturating_sub(b.busy_ns) as f64 / 1e3 / n,
            })
        })
        .collect();
    Ok(StagePass {
        scenario,
        concurrency: c,
        requests: r.ok,
        stages,
    })
}

/// The totals once `ok` more request spans have closed since `before`. A
/// span closes when its request's future is dropped, which may be a moment
/// after the answer was written: bounded wait (3 s), then whatever is in.
async fn settled(addr: SocketAddr, before: &Totals, ok: u64) -> Result<Totals> {
    let requests = |t: &Totals| t.get("minimal.request").map_or(0, |t| t.count);
    let mut after = totals(addr).await?;
    let end = Instant::now() + Duration::from_secs(3);
    while requests(&after).saturating_sub(requests(before)) < ok && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
        after = totals(addr).await?;
    }
    Ok(after)
}

async fn totals(addr: SocketAddr) -> Result<Totals> {
    let body = load::get(addr, "/_bench/stages")
        .await
        .map_err(|e| crate::Error::Run(format!("GET /_bench/stages: {e}")))?;
    serde_json::from_slice(&body).map_err(|e| crate::Error::Run(format!("GET /_bench/stages: {e}")))
}
