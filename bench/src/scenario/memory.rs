//! Server memory at many connections (issue 13): `rss_connections`
//! connections send first executions, the path that holds a request
//! longest (the SQLite writer gate queues them), while idem-server's
//! VmRSS is sampled; VmHWM is read afterwards.

use std::time::{Duration, Instant};

use crate::child::ChildServer;
use crate::config::{Config, Scenario, StoreKind};
use crate::load::{self, Load};
use crate::procfs;
use crate::results::Memory;

/// Runs the memory cell on `server` and fills `memory`'s loaded figures.
pub async fn measure(
    cfg: &Config,
    server: &ChildServer,
    tag: u64,
    memory: &mut Memory,
    kind: StoreKind,
    progress: &(dyn Fn(&str) + Sync),
) {
    let (make, expect) = crate::scenario::requests(
        Scenario::First,
        cfg.callers,
        cfg.replay_keys_per_caller,
        tag,
    );
    let pid = server.pid;
    let sampler = tokio::spawn(async move {
        let mut max = 0;
        let end = Instant::now() + Duration::from_secs(150);
        while Instant::now() < end {
            max = max.max(procfs::rss_kib(pid).unwrap_or(0));
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        max
    });
    let r = load::run(Load {
        addr: server.addr,
        concurrency: cfg.rss_connections,
        duration: cfg.duration,
        max_requests: None,
        per_worker: None,
        make,
        expect,
    })
    .await;
    sampler.abort();
    // The sampler was aborted: read once more now, at the end of load.
    memory.loaded_kib = procfs::rss_kib(pid);
    memory.peak_kib = procfs::peak_rss_kib(pid);
    progress(&format!(
        "{kind} memory: idle {:.1} MiB, {} connections: peak {:.1} MiB ({:.0} req/s, {} errors)",
        memory.idle_kib.unwrap_or(0) as f64 / 1024.0,
        cfg.rss_connections,
        memory.peak_kib.unwrap_or(0) as f64 / 1024.0,
        r.throughput,
        r.errors
    ));
    memory.load = Some(r);
}
