//! Golden delay schedules, published as `client/vectors/backoff.json`.
//!
//! Any client, in any language, can check its jitter against these: implement SplitMix64 and
//! the formulas on [`Jitter`], seed, draw, compare. The file is regenerated with
//! `cargo run -p idem-client --bin idem-client-vectors` and a test fails when it is stale.

use serde::{Deserialize, Serialize};

use crate::backoff::{Backoff, Jitter};
use crate::rng::SplitMix64;

/// Where the committed vectors live, relative to the workspace root.
pub const VECTORS_PATH: &str = "client/vectors/backoff.json";

/// The whole file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackoffVectors {
    /// What the file is and how to use it.
    pub description: Vec<String>,
    /// Reference outputs of the generator, to check a port before checking schedules.
    pub prng: PrngVector,
    /// One schedule per (parameters, jitter, seed).
    pub schedules: Vec<ScheduleVector>,
}

/// Reference outputs of [`SplitMix64`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrngVector {
    /// Always `splitmix64`.
    pub algorithm: String,
    /// The seed.
    pub seed: u64,
    /// The first outputs, as decimal strings (they exceed 2^53, so JSON numbers would lose bits
    /// in many parsers).
    pub outputs: Vec<String>,
}

/// The sleeps after failures 1, 2, … for one configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleVector {
    /// The jitter variant.
    pub jitter: Jitter,
    /// `base`, in microseconds.
    pub base_us: u64,
    /// `cap`, in microseconds.
    pub cap_us: u64,
    /// Seed of the generator, fresh for this schedule.
    pub seed: u64,
    /// Sleep after failure `n` at index `n - 1`, in microseconds.
    pub delays_us: Vec<u64>,
}

/// Builds the vectors from the current code.
pub fn generate() -> BackoffVectors {
    let mut rng = SplitMix64::new(42);
    let outputs = (0..5).map(|_| rng.next_u64().to_string()).collect();
    let configs = [
        Backoff::default(),
        Backoff {
            base: std::time::Duration::from_millis(5),
            cap: std::time::Duration::from_millis(2000),
            jitter: Jitter::Full,
        },
    ];
    let mut schedules = Vec::new();
    for config in configs {
        for jitter in Jitter::ALL {
            for seed in [1u64, 42, 20_260_101] {
                let b = Backoff { jitter, ..config };
                schedules.push(ScheduleVector {
                    jitter,
                    base_us: micros(b.base),
                    cap_us: micros(b.cap),
                    seed,
                    delays_us: b.schedule(seed, 10).into_iter().map(micros).collect(),
                });
            }
        }
    }
    BackoffVectors {
        description: vec![
            "Golden backoff schedules of idem-client (clause idem.client.backoff-jitter).".into(),
            "Generator: SplitMix64; u = (next_u64 >> 11) * 2^-53; U[lo, hi) = lo + floor(u * (hi - lo)), or lo when hi <= lo; one output per draw; none and exponential draw nothing.".into(),
            "n = number of the attempt that just failed (1-based); e(n) = min(cap, base * 2^n), in whole microseconds.".into(),
            "none: 0. exponential: e(n). full: U[0, e(n)). equal: h + U[0, h) with h = floor(e(n) / 2). decorrelated: s(n) = min(cap, U[base, 3 * s(n-1))), s(0) = base.".into(),
            "Each schedule starts from a fresh generator seeded with `seed`; delays_us[i] is the sleep after failure i + 1.".into(),
            "Regenerate: cargo run -p idem-client --bin idem-client-vectors".into(),
        ],
        prng: PrngVector {
            algorithm: "splitmix64".into(),
            seed: 42,
            outputs,
        },
        schedules,
    }
}

/// The file's exact text: pretty JSON with one schedule per line, so the book can show it.
pub fn render() -> String {
    let v = generate();
    let mut out = String::from("{\n  \"description\": [\n");
    let lines: Vec<String> = v
        .description
        .iter()
        .map(|d| format!("    {}", compact(d)))
        .collect();
    out.push_str(&lines.join(",\n"));
    out.push_str("\n  ],\n  \"prng\": ");
    out.push_str(&compact(&v.prng));
    out.push_str(",\n  \"schedules\": [\n");
    let lines: Vec<String> = v
        .schedules
        .iter()
        .map(|s| format!("    {}", compact(s)))
        .collect();
    out.push_str(&lines.join(",\n"));
    out.push_str("\n  ]\n}\n");
    out
}

/// Compact JSON of one value.
fn compact<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
