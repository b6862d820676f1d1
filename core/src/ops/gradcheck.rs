//! Test helpers: seeded random tensors and central-difference gradients in `f64`.

use crate::rng::Rng;

/// `len` values drawn uniformly from `[-scale, scale)`.
pub fn random(rng: &mut Rng, len: usize, scale: f64) -> Vec<f64> {
    (0..len).map(|_| (rng.next_f64() * 2.0 - 1.0) * scale).collect()
}

/// Central-difference derivative of `loss` with respect to every element of `x`.
pub fn numeric_grad(x: &mut [f64], mut loss: impl FnMut(&[f64]) -> f64) -> Vec<f64> {
    let h = 1e-6;
    (0..x.len())
        .map(|i| {
            let orig = x[i];
            x[i] = orig + h;
            let up = loss(x);
            x[i] = orig - h;
            let down = loss(x);
            x[i] = orig;
            (up - down) / (2.0 * h)
        })
        .collect()
}

/// Asserts `analytic` matches `numeric` to `1e-6` relative to the larger gradient magnitude.
pub fn assert_close(what: &str, analytic: &[f64], numeric: &[f64]) {
    assert_eq!(analytic.len(), numeric.len(), "{what}: length");
    let scale = numeric.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
    for (i, (a, n)) in analytic.iter().zip(numeric).enumerate() {
        assert!((a - n).abs() <= 1e-6 * scale, "{what}[{i}]: analytic {a} vs numeric {n} (scale {scale})");
    }
}

/// `sum(out * weights)`: a scalar loss whose gradient with respect to `out` is `weights`.
pub fn weighted_sum(out: &[f64], weights: &[f64]) -> f64 {
    out.iter().zip(weights).map(|(o, w)| o * w).sum()
}
