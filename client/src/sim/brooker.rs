//! Brooker's 2015 experiment, "Exponential Backoff And Jitter", as a deterministic
//! discrete-event simulation.
//!
//! The model follows the post's published simulator exactly:
//!
//! - one server holds one row with a version number (optimistic concurrency control);
//! - N clients start at t = 0; each wants one successful write: read the version, write with
//!   it (the write succeeds iff the version is unchanged, and bumps it), and after a failed write
//!   increment its failure counter `n` (so `n = 1` after the first failure, as in Brooker's code,
//!   not the SDK's count of retries made, which starts at 0), sleep the backoff, and start again
//!   with a read;
//! - every hop (client→server or back) takes `|Normal(10 ms, sd 2 ms)|`; the backoff sleep is
//!   added to the hop that starts the next read;
//! - backoff base 5 ms, cap 2000 ms; the strategies are [`Jitter`]'s variants, computed by the
//!   client's own [`Backoff`] code (the same code the middleware runs);
//! - per (N, strategy) cell, 100 independent runs; reported: mean number of server *writes*
//!   (reads are not counted) and mean completion time (when the last event is handled).
//!
//! Differences from the Python original, none of which change the model: one seeded SplitMix64
//! stream per run (instead of Python's global generator), ties in event time broken by insertion
//! order, and sleeps rounded down to whole microseconds.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::backoff::{Backoff, Jitter};
use crate::rng::SplitMix64;

/// Parameters of the experiment.
#[derive(Debug, Clone, PartialEq)]
pub struct BrookerConfig {
    /// Client counts to sweep.
    pub clients: Vec<u32>,
    /// Independent runs per (client count, strategy) cell.
    pub runs: u32,
    /// Seed of the whole sweep; each run derives its own stream from it.
    pub seed: u64,
    /// Backoff base.
    pub base: Duration,
    /// Backoff cap.
    pub cap: Duration,
    /// Mean of the per-hop network delay, in milliseconds.
    pub net_mean_ms: f64,
    /// Standard deviation of the per-hop network delay, in milliseconds.
    pub net_sd_ms: f64,
    /// Strategies to compare, in report order.
    pub strategies: Vec<Jitter>,
}

impl Default for BrookerConfig {
    /// The post's parameters: N = 10, 20, …, 190; 100 runs; base 5 ms; cap 2 s; hops
    /// |Normal(10, 2)| ms; all five strategies.
    fn default() -> Self {
        Self {
            clients: (10..=190).step_by(10).collect(),
            runs: 100,
            seed: 2015,
            base: Duration::from_millis(5),
            cap: Duration::from_millis(2000),
            net_mean_ms: 10.0,
            net_sd_ms: 2.0,
            strategies: Jitter::ALL.to_vec(),
        }
    }
}

impl BrookerConfig {
    /// A small sweep that runs in well under a second even in a debug build: what the
    /// staleness test regenerates.
    pub fn quick() -> Self {
        Self {
            clients: vec![10, 30, 50],
            runs: 10,
            ..Self::default()
        }
    }

    /// One line describing the parameters, written above every table.
    pub fn describe(&self) -> String {
        let clients: Vec<String> = self.clients.iter().map(u32::to_string).collect();
        format!(
            "N = {}; {} runs per cell; seed {}; base {} ms, cap {} ms; every hop |Normal({} ms, sd {} ms)|",
            clients.join(", "),
            self.runs,
            self.seed,
            self.base.as_millis(),
            self.cap.as_millis(),
            self.net_mean_ms,
            self.net_sd_ms
        )
    }
}

/// What one run measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunStats {
    /// Server writes (successful and failed).
    pub writes: u64,
    /// Successful writes (the row's final version); always equals the client count.
    pub successes: u64,
    /// Time the last event was handled, in milliseconds.
    pub time_ms: f64,
}

/// The mean of one (client count, strategy) cell.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CellResult {
    /// Client count.
    pub clients: u32,
    /// Strategy.
    pub jitter: Jitter,
    /// Mean server writes per run.
    pub mean_writes: f64,
    /// Mean completion time per run, in milliseconds.
    pub mean_time_ms: f64,
}

/// The whole sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct BrookerResults {
    /// The parameters that produced it.
    pub config: BrookerConfig,
    /// One entry per (client count, strategy), client counts outer, strategies inner.
    pub cells: Vec<CellResult>,
}

impl BrookerResults {
    /// The cell for `clients` and `jitter`.
    pub fn cell(&self, clients: u32, jitter: Jitter) -> Option<&CellResult> {
        self.cells
            .iter()
            .find(|c| c.clients == clients && c.jitter == jitter)
    }

    /// Mean of `metric` over every client count, for one strategy: a one-number summary.
    pub fn overall(&self, jitter: Jitter, metric: impl Fn(&CellResult) -> f64) -> f64 {
        let xs: Vec<f64> = self
            .cells
            .iter()
            .filter(|c| c.jitter == jitter)
            .map(metric)
            .collect();
        xs.iter().sum::<f64>() / xs.len().max(1) as f64
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// A read request reaches the server.
    ServerRead,
    /// The server's read answer (a version) reaches the client.
    ReadReply(u64),
    /// A write request carrying the version read reaches the server.
    ServerWrite(u64),
    /// The server's write answer reaches the client.
    WriteReply(bool),
}

/// Heap entry: (time bits, insertion order, client, kind). Non-negative f64s order like their
/// bit patterns, so the time can be compared as an integer.
type Event = Reverse<(u64, u64, u32, Kind)>;

struct Queue {
    heap: BinaryHeap<Event>,
    seq: u64,
}

impl Queue {
    fn push(&mut self, time_ms: f64, client: u32, kind: Kind) {
        self.seq += 1;
        self.heap
            .push(Reverse((time_ms.to_bits(), self.seq, client, kind)));
    }
}

/// One run of the experiment.
pub fn run_once(config: &BrookerConfig, clients: u32, jitter: Jitter, seed: u64) -> RunStats {
    let backoff = Backoff {
        base: config.base,
        cap: config.cap,
        jitter,
    };
    let mut rng = SplitMix64::new(seed);
    let hop =
        |rng: &mut SplitMix64| (config.net_mean_ms + config.net_sd_ms * rng.next_normal()).abs();
    let mut failures = vec![0u32; clients as usize];
    let mut previous: Vec<Option<Duration>> = vec![None; clients as usize];
    let mut version = 0u64;
    let mut writes = 0u64;
    let mut queue = Queue {
        heap: BinaryHeap::with_capacity(clients as usize * 2),
        seq: 0,
    };
    for c in 0..clients {
        let t = hop(&mut rng);
        queue.push(t, c, Kind::ServerRead);
    }
    let mut now = 0.0f64;
    while let Some(Reverse((bits, _, c, kind))) = queue.heap.pop() {
        now = f64::from_bits(bits);
        let ci = c as usize;
        match kind {
            Kind::ServerRead => {
                let t = now + hop(&mut rng);
                queue.push(t, c, Kind::ReadReply(version));
            }
            Kind::ReadReply(v) => {
                let t = now + hop(&mut rng);
                queue.push(t, c, Kind::ServerWrite(v));
            }
            Kind::ServerWrite(v) => {
                writes += 1;
                let ok = v == version;
                if ok {
                    version += 1;
                }
                let t = now + hop(&mut rng);
                queue.push(t, c, Kind::WriteReply(ok));
            }
            Kind::WriteReply(true) => {}
            Kind::WriteReply(false) => {
                failures[ci] += 1;
                // Deliberately not the SDK's convention. idem-client counts n from 0 (retries
                // already made, so its first ceiling is `base`); Brooker's simulator counts the
                // failures, so n = 1 on the first one and his first ceiling is 2 * base. Passing
                // the failure count (= retries made + 1) reproduces his model exactly.
                let sleep = backoff.delay(failures[ci], previous[ci], &mut rng);
                previous[ci] = Some(sleep);
                let t = now + hop(&mut rng) + sleep.as_secs_f64() * 1000.0;
                queue.push(t, c, Kind::ServerRead);
            }
        }
    }
    RunStats {
        writes,
        successes: version,
        time_ms: now,
    }
}

/// Runs the sweep on `threads` threads. The result does not depend on `threads`: each run's
/// seed is derived from (seed, client count, strategy, run index) alone.
pub fn run(config: &BrookerConfig, threads: usize) -> BrookerResults {
    let jobs: Vec<(u32, usize, Jitter)> = config
        .clients
        .iter()
        .flat_map(|&n| {
            config
                .strategies
                .iter()
                .enumerate()
                .map(move |(si, &j)| (n, si, j))
        })
        .collect();
    let results: Mutex<Vec<Option<CellResult>>> = Mutex::new(vec![None; jobs.len()]);
    let next = AtomicUsize::new(0);
    let threads = threads.clamp(1, jobs.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(n, si, jitter)) = jobs.get(i) else {
                        break;
                    };
                    let cell = run_cell(config, n, si, jitter);
                    if let Ok(mut r) = results.lock() {
                        r[i] = Some(cell);
                    }
                }
            });
        }
    });
    let cells = results
        .into_inner()
        .unwrap_or_default()
        .into_iter()
        .flatten()
        .collect();
    BrookerResults {
        config: config.clone(),
        cells,
    }
}

fn run_cell(
    config: &BrookerConfig,
    clients: u32,
    strategy_index: usize,
    jitter: Jitter,
) -> CellResult {
    let cell_seed = SplitMix64::derive(
        SplitMix64::derive(config.seed, u64::from(clients)),
        strategy_index as u64,
    );
    let mut writes = 0u64;
    let mut time = 0.0f64;
    for run in 0..config.runs {
        let s = run_once(
            config,
            clients,
            jitter,
            SplitMix64::derive(cell_seed, u64::from(run)),
        );
        writes += s.writes;
        time += s.time_ms;
    }
    let runs = f64::from(config.runs.max(1));
    CellResult {
        clients,
        jitter,
        mean_writes: writes as f64 / runs,
        mean_time_ms: time / runs,
    }
}

/// The Markdown tables (writes, then completion time) of a sweep.
pub fn markdown(results: &BrookerResults) -> String {
    let cfg = &results.config;
    let mut out = String::new();
    out.push_str("<!-- Generated by `idem-sim`; do not edit. -->\n");
    out.push_str(&format!("Parameters: {}.\n\n", cfg.describe()));
    for (anchor, title, metric) in [
        (
            "writes",
            "Mean server writes per run (lower is less work)",
            (|c: &CellResult| format!("{:.1}", c.mean_writes)) as fn(&CellResult) -> String,
        ),
        (
            "time",
            "Mean completion time per run, ms (lower is sooner)",
            |c: &CellResult| format!("{:.0}", c.mean_time_ms),
        ),
    ] {
        out.push_str(&format!("<!-- ANCHOR: {anchor} -->\n"));
        out.push_str(&format!("**{title}**\n\n| N |"));
        for j in &cfg.strategies {
            out.push_str(&format!(" {j} |"));
        }
        out.push_str("\n|---:|");
        for _ in &cfg.strategies {
            out.push_str("---:|");
        }
        out.push('\n');
        for &n in &cfg.clients {
            out.push_str(&format!("| {n} |"));
            for &j in &cfg.strategies {
                let v = results.cell(n, j).map(metric).unwrap_or_default();
                out.push_str(&format!(" {v} |"));
            }
            out.push('\n');
        }
        out.push_str(&format!("<!-- ANCHOR_END: {anchor} -->\n\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_client_writes_once_in_four_hops() {
        let cfg = BrookerConfig::default();
        for j in Jitter::ALL {
            let s = run_once(&cfg, 1, j, 9);
            assert_eq!(s.writes, 1);
            // Four hops of about 10 ms each.
            assert!(s.time_ms > 20.0 && s.time_ms < 60.0, "{}", s.time_ms);
        }
    }

    #[test]
    fn every_client_eventually_succeeds_exactly_once() {
        let cfg = BrookerConfig::default();
        for j in Jitter::ALL {
            let s = run_once(&cfg, 20, j, 1);
            assert_eq!(s.successes, 20, "{j}");
            assert!(s.writes >= 20, "{j}: {}", s.writes);
        }
    }

    #[test]
    fn runs_are_deterministic_and_thread_count_does_not_matter() {
        let cfg = BrookerConfig {
            clients: vec![10, 20],
            runs: 3,
            ..BrookerConfig::default()
        };
        assert_eq!(run(&cfg, 1), run(&cfg, 3));
        assert_eq!(
            run_once(&cfg, 15, Jitter::Full, 4),
            run_once(&cfg, 15, Jitter::Full, 4)
        );
    }
}
