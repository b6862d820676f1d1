//! A small seeded generator (SplitMix64) whose whole state is one `u64`, so it can be saved in
//! a checkpoint and restored exactly.

/// The independent streams a training run draws from its one seed (see [`derive_seed`]).
/// Every frontend uses the same, so a run is reproducible anywhere.
pub mod stream {
    /// Training batches (step 0: the generator lives on in checkpoints).
    pub const BATCHES: u64 = 1;
    /// Evaluation batches of the training split, per evaluation step.
    pub const EVAL_TRAIN: u64 = 2;
    /// Evaluation batches of the validation split, per evaluation step.
    pub const EVAL_VAL: u64 = 3;
    /// Samples printed during training, per step.
    pub const SAMPLES: u64 = 4;
    /// Dropout masks (the seed of [`crate::ops::dropout`]'s keys).
    pub const DROPOUT: u64 = 5;
}

/// Mixes a run's `seed` with a `stream` and a `step` into an independent generator seed.
/// (Parameters are initialised from the seed itself.)
pub fn derive_seed(seed: u64, stream: u64, step: u64) -> u64 {
    let mut rng = Rng::new(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    rng.next_u64() ^ step.wrapping_mul(0xD1B5_4A32_D192_ED03)
}

/// SplitMix64 pseudo-random generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    /// Restores a generator from [`Rng::state`].
    pub fn from_state(state: u64) -> Self {
        Rng { state }
    }

    /// The complete state.
    pub fn state(&self) -> u64 {
        self.state
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `0..n` (Lemire's multiply-shift; `n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// Standard normal sample (Box-Muller, one sample per two uniforms).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        libm::sqrt(-2.0 * libm::log(u1)) * libm::cos(2.0 * core::f64::consts::PI * u2)
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn normal_has_unit_moments() {
        let mut rng = Rng::new(42);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| rng.normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.01, "var {var}");
    }

    #[test]
    fn state_round_trips() {
        let mut a = Rng::new(7);
        a.next_u64();
        let mut b = Rng::from_state(a.state());
        assert_eq!(a.next_u64(), b.next_u64());
    }

    #[test]
    fn below_stays_in_range() {
        let mut rng = Rng::new(1);
        assert!((0..10_000).all(|_| rng.below(13) < 13));
    }
}
