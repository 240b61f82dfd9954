//! A tiny, fully specified pseudo-random generator for jitter.
//!
//! Why not `rand::rngs::StdRng`? Its algorithm is explicitly allowed to change between `rand`
//! releases, and the golden delay schedules in `client/vectors/backoff.json` are meant to be
//! checked by clients written in other languages. SplitMix64 fits in ten lines, passes BigCrush
//! for this purpose, and every language can reproduce it bit for bit. Unpredictability is not a
//! goal: jitter only has to decorrelate clients, not resist an attacker.

/// SplitMix64 (Steele, Lea and Flood, 2014), the generator Java's `SplittableRandom` uses.
///
/// ```text
/// state  = state + 0x9E3779B97F4A7C15            (wrapping)
/// z      = state
/// z      = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9  (wrapping)
/// z      = (z ^ (z >> 27)) * 0x94D049BB133111EB  (wrapping)
/// output = z ^ (z >> 31)
/// ```
///
/// A uniform draw in `[0, 1)` is `(output >> 11) * 2^-53`, exact in an IEEE-754 double.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose first output is fully determined by `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator seeded from the operating system, for production use.
    pub fn from_entropy() -> Self {
        Self::new(rand::random::<u64>())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform draw in `[0, 1)` with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform integer in `[lo, hi)`: `lo + floor(u * (hi - lo))`; `lo` when the range is empty.
    /// Always consumes exactly one output, so schedules stay aligned across implementations.
    pub fn uniform_u64(&mut self, lo: u64, hi: u64) -> u64 {
        let u = self.next_f64();
        if hi <= lo {
            return lo;
        }
        let span = (hi - lo) as f64;
        // u < 1, so u * span < span; the `min` only guards float rounding at huge spans.
        lo + ((u * span) as u64).min(hi - lo - 1)
    }

    /// A standard normal draw (Box–Muller, one of the pair). Used by the simulator's network.
    pub fn next_normal(&mut self) -> f64 {
        // 1 - u is in (0, 1], so the logarithm is finite.
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Derives an independent seed for stream `index` of a family seeded by `seed`: one SplitMix64
    /// step from a mixed state, so neighbouring indices give unrelated streams.
    pub fn derive(seed: u64, index: u64) -> u64 {
        SplitMix64::new(seed ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03)).next_u64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_published_reference_outputs() {
        // Reference values of SplitMix64 for seed 1234567 (from the algorithm's reference
        // implementation, also used by Java's SplittableRandom test suites).
        let mut r = SplitMix64::new(1_234_567);
        let got: Vec<u64> = (0..5).map(|_| r.next_u64()).collect();
        assert_eq!(
            got,
            [
                6_457_827_717_110_365_317,
                3_203_168_211_198_807_973,
                9_817_491_932_198_370_423,
                4_593_380_528_125_082_431,
                16_408_922_859_458_223_821,
            ]
        );
    }

    #[test]
    fn uniform_stays_in_range_and_handles_empty_ranges() {
        let mut r = SplitMix64::new(7);
        for _ in 0..10_000 {
            let v = r.uniform_u64(5, 9);
            assert!((5..9).contains(&v));
        }
        assert_eq!(r.uniform_u64(3, 3), 3);
        assert_eq!(r.uniform_u64(4, 2), 4);
    }

    #[test]
    fn normal_draws_have_the_right_moments() {
        let mut r = SplitMix64::new(99);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| r.next_normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "variance {var}");
    }
}
