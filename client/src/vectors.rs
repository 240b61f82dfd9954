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

/// Where the book's worked-schedule table lives, relative to the workspace root.
pub const SCHEDULE_TABLE_PATH: &str = "book/src/sim/backoff-schedule.md";

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

/// The sleeps before retries 1, 2, … for one configuration.
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
    /// The sleep before retry `n + 1` at index `n` (`n` = retries already made), in
    /// microseconds.
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
            "n = number of retries already made, from 0 (n = 0 before the first retry); e(n) = min(cap, base * 2^n), so e(0) = base; whole microseconds.".into(),
            "none: 0. exponential: e(n). full: U[0, e(n)). equal: h + U[0, h) with h = floor(e(n) / 2). decorrelated: s = min(cap, U[base, 3 * p)), p = the previous sleep of the schedule, or base before the first retry.".into(),
            "Each schedule starts from a fresh generator seeded with `seed`; delays_us[n] is the sleep before retry n + 1.".into(),
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

/// The worked schedule for the book: the default backoff (base 500 ms, cap 20 s), seed 42, every
/// jitter variant, the sleeps before retries 1 to 6 (`n` = 0 to 5), in milliseconds. The caption
/// sits inside the anchor, so the table explains itself wherever the book includes it.
pub fn schedule_markdown() -> String {
    let mut out = String::from("<!-- Generated by `idem-client-vectors`; do not edit. -->\n");
    out.push_str("<!-- ANCHOR: schedule -->\n");
    out.push_str("| Strategy | Delay | n = 0 | 1 | 2 | 3 | 4 | 5 |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|\n");
    for jitter in Jitter::ALL {
        let b = Backoff {
            jitter,
            ..Backoff::default()
        };
        let cells: Vec<String> = b
            .schedule(42, 6)
            .iter()
            .map(|d| format!("{:.3}", d.as_secs_f64() * 1000.0))
            .collect();
        let range = match jitter {
            Jitter::None => "0",
            Jitter::Exponential => "`c`",
            Jitter::Full => "`random(0, c)`",
            Jitter::Equal => "`c/2 + random(0, c/2)`",
            Jitter::Decorrelated => "`min(cap, random(base, 3 × previous))`",
        };
        out.push_str(&format!("| {jitter} | {range} | {} |\n", cells.join(" | ")));
    }
    out.push_str(
        "\nDelays in ms before retry n + 1, where n counts the retries already made and \
         `c = min(cap, base × 2ⁿ)`; base 500 ms, cap 20 s; each row from a fresh SplitMix64 \
         seeded with 42. The full vectors are in `client/vectors/backoff.json`.\n",
    );
    out.push_str("<!-- ANCHOR_END: schedule -->\n");
    out
}

/// Compact JSON of one value.
fn compact<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
