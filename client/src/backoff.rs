//! How long to wait before the next attempt: capped exponential backoff and its jitter family.
//!
//! Backoff spreads retries out in time; jitter spreads *clients* out from each other. Without
//! jitter every client that failed together retries together, so the contention that caused the
//! failure comes back on schedule. Marc Brooker's 2015 experiment (reproduced by `idem-sim`)
//! shows the effect: plain exponential backoff only trims the work of retrying at once (about
//! two thirds of it at 190 clients) while taking far longer, and any jitter cuts both work and
//! time well below it.
//!
//! Notation, shared with the book (clause `idem.client.backoff-jitter`) and the published vectors
//! (`client/vectors/backoff.json`): `n` is the number of retries already made, counted from 0
//! (so `n = 0` for the sleep before the first retry), `base` and `cap` are durations, and the
//! exponential envelope, the book's "ceiling", is
//!
//! ```text
//! e(n) = min(cap, base * 2^n)
//! ```
//!
//! so `base` is the first ceiling: with the defaults the ceilings run 500 ms, 1 s, 2 s, … 20 s.
//! Brooker's simulator counts `n` from 1 on the first failure instead (its first ceiling is
//! `2 * base`); `idem-sim` passes that count explicitly to reproduce his model, see
//! `idem_client::sim::brooker` (feature `sim`).
//!
//! All arithmetic is on whole microseconds; `U[a, b)` is
//! [`SplitMix64::uniform_u64`](crate::rng::SplitMix64::uniform_u64) and consumes exactly one
//! random output per draw, even when the range is empty.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::rng::SplitMix64;

/// Which member of the backoff family to use. Each formula is exact; see the module docs for `e(n)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Jitter {
    /// Retry at once: `sleep = 0`, drawing nothing. Only for the simulator's baseline; a real
    /// client that does this turns every outage into a hot loop.
    None,
    /// Capped exponential, no jitter: `sleep = e(n)`, drawing nothing (`base`, `2 * base`, … up
    /// to `cap`). Clients that failed together stay in lock-step, which is why Brooker's
    /// experiment shows it doing the most work.
    Exponential,
    /// Full jitter (the default): `sleep = U[0, e(n))`. Least total work in Brooker's experiment;
    /// mean `e(n)/2`.
    #[default]
    Full,
    /// Equal jitter: `sleep = e(n)/2 + U[0, e(n)/2)` (integer halving). Never sleeps less than half
    /// the envelope, so it keeps some spacing guarantee at the price of more waiting.
    Equal,
    /// Decorrelated jitter: `sleep = min(cap, U[base, 3 * previous))`, where `previous` is the
    /// sleep before the previous retry, or `base` before the first one (Brooker's formula). Ignores
    /// `n`; the walk grows by about 1.5x per failure on average and can fall back near
    /// `base` at any step, so it often finishes sooner than full jitter for a latency-bound caller.
    Decorrelated,
}

impl Jitter {
    /// Every variant, in the order the simulator reports them.
    pub const ALL: [Jitter; 5] = [
        Jitter::None,
        Jitter::Exponential,
        Jitter::Full,
        Jitter::Equal,
        Jitter::Decorrelated,
    ];

    /// The kebab-case name used in vectors, tables and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Jitter::None => "none",
            Jitter::Exponential => "exponential",
            Jitter::Full => "full",
            Jitter::Equal => "equal",
            Jitter::Decorrelated => "decorrelated",
        }
    }
}

impl fmt::Display for Jitter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Capped exponential backoff with a jitter variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    /// `base` in the formulas.
    pub base: Duration,
    /// `cap` in the formulas: no computed sleep exceeds it.
    pub cap: Duration,
    /// Which formula.
    pub jitter: Jitter,
}

impl Default for Backoff {
    /// Full jitter, base 500 ms, cap 20 s (clause `idem.client.backoff-jitter`).
    fn default() -> Self {
        Self {
            base: Duration::from_millis(500),
            cap: Duration::from_secs(20),
            jitter: Jitter::Full,
        }
    }
}

impl Backoff {
    // ANCHOR: jitter
    /// The exponential envelope (the ceiling) before retry `n + 1`, where `n` counts the retries
    /// already made: `e(n) = min(cap, base * 2^n)`, so `e(0) = base`. Saturating, never overflows.
    pub fn envelope(&self, n: u32) -> Duration {
        let base = micros(self.base);
        let cap = micros(self.cap);
        let scaled = if n >= 64 {
            u64::MAX
        } else {
            base.saturating_mul(1u64 << n)
        };
        Duration::from_micros(scaled.min(cap))
    }

    /// The sleep before retry `n + 1`, where `n` counts the retries already made (0 before the
    /// first retry). `previous` is the sleep before retry `n` (`None` before the first retry);
    /// only decorrelated jitter reads it, and it ignores `n`.
    pub fn delay(&self, n: u32, previous: Option<Duration>, rng: &mut SplitMix64) -> Duration {
        let e = micros(self.envelope(n));
        let us = match self.jitter {
            Jitter::None => 0,
            Jitter::Exponential => e,
            Jitter::Full => rng.uniform_u64(0, e),
            Jitter::Equal => {
                let half = e / 2;
                half + rng.uniform_u64(0, half)
            }
            Jitter::Decorrelated => {
                let base = micros(self.base);
                let prev = previous.map_or(base, micros);
                rng.uniform_u64(base, prev.saturating_mul(3))
                    .min(micros(self.cap))
            }
        };
        Duration::from_micros(us)
    }
    // ANCHOR_END: jitter

    /// The sleeps before retries `1..=count` (`n = 0..count`), from a fresh generator seeded
    /// with `seed`: what `client/vectors/backoff.json` publishes.
    pub fn schedule(&self, seed: u64, count: u32) -> Vec<Duration> {
        let mut rng = SplitMix64::new(seed);
        let mut prev = None;
        (0..count)
            .map(|n| {
                let d = self.delay(n, prev, &mut rng);
                prev = Some(d);
                d
            })
            .collect()
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff(jitter: Jitter) -> Backoff {
        Backoff {
            jitter,
            ..Backoff::default()
        }
    }

    // clause: idem.client.backoff-jitter, idem.client.no-unjittered-backoff
    #[test]
    fn defaults_are_full_jitter_500ms_base_20s_cap() {
        let b = Backoff::default();
        assert_eq!(b.jitter, Jitter::Full);
        assert_eq!(b.base, Duration::from_millis(500));
        assert_eq!(b.cap, Duration::from_secs(20));
        // `base` is the first ceiling: n counts the retries already made, from 0.
        let ceilings: Vec<u64> = (0..8).map(|n| b.envelope(n).as_millis() as u64).collect();
        assert_eq!(
            ceilings,
            [500, 1_000, 2_000, 4_000, 8_000, 16_000, 20_000, 20_000]
        );
        assert_eq!(b.envelope(200), Duration::from_secs(20));
    }

    // clause: idem.client.backoff-jitter
    #[test]
    fn each_variant_stays_inside_its_formula() {
        let mut rng = SplitMix64::new(3);
        for n in 0..12 {
            let e = backoff(Jitter::Full).envelope(n);
            assert_eq!(
                backoff(Jitter::None).delay(n, None, &mut rng),
                Duration::ZERO
            );
            assert_eq!(backoff(Jitter::Exponential).delay(n, None, &mut rng), e);
            let full = backoff(Jitter::Full).delay(n, None, &mut rng);
            assert!(full < e);
            let equal = backoff(Jitter::Equal).delay(n, None, &mut rng);
            assert!(equal >= e / 2 && equal < e, "{equal:?} vs {e:?}");
            let prev = Duration::from_millis(700 * u64::from(n + 1));
            let dec = backoff(Jitter::Decorrelated).delay(n, Some(prev), &mut rng);
            assert!(dec >= Duration::from_millis(500));
            assert!(dec <= (prev * 3).min(Duration::from_secs(20)));
        }
    }

    #[test]
    fn decorrelated_starts_from_base_and_respects_the_cap() {
        let b = backoff(Jitter::Decorrelated);
        let mut rng = SplitMix64::new(11);
        let first = b.delay(0, None, &mut rng);
        assert!(first >= b.base && first < b.base * 3);
        let capped = b.delay(9, Some(Duration::from_secs(60)), &mut rng);
        assert!(capped <= b.cap);
    }

    #[test]
    fn full_jitter_mean_is_half_the_envelope() {
        let b = Backoff::default();
        let mut rng = SplitMix64::new(5);
        let n = 50_000u32;
        let total: Duration = (0..n).map(|_| b.delay(2, None, &mut rng)).sum();
        let mean = total / n;
        let want = b.envelope(2) / 2;
        let diff = mean.abs_diff(want);
        assert!(diff < Duration::from_millis(20), "mean {mean:?}");
    }
}
