//! Global gradient norm, deterministic: fixed chunks summed in `f64`, then in chunk order.

use crate::float::Float;
use crate::parallel::{split_range, Parallel, SharedMut};
use crate::simd::wide_dispatch;

const CHUNKS: usize = 64;
/// Running sums per chunk: 16 `f64` lanes are two AVX-512 vectors, so the loop is not held
/// up by the latency of one long chain of additions.
const LANES: usize = 16;

/// `Σ x²` over the whole slice. The result does not depend on the number of threads.
pub fn sum_squares<T: Float>(par: &dyn Parallel, x: &[T]) -> f64 {
    let mut partial = [0f64; CHUNKS];
    let p = SharedMut(partial.as_mut_ptr());
    par.run(CHUNKS, &|chunk| {
        // SAFETY: each task writes its own element.
        let slot = unsafe { p.slice(chunk, 1) };
        chunk_sum_squares(&x[split_range(x.len(), CHUNKS, chunk)], &mut slot[0]);
    });
    partial.iter().sum()
}

#[inline(always)]
fn chunk_sum_squares_body<T: Float>(x: &[T], sum: &mut f64) {
    let mut acc = [0f64; LANES];
    let whole = x.chunks_exact(LANES);
    let tail: f64 = whole.remainder().iter().map(|v| v.to_f64() * v.to_f64()).sum();
    for c in whole {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v.to_f64() * v.to_f64();
        }
    }
    *sum = acc.iter().sum::<f64>() + tail;
}

wide_dispatch!(
    /// `sum = Σ x²` in `f64`, over [`LANES`] running sums added in lane order, then the tail.
    fn chunk_sum_squares<T>(x: &[T], sum: &mut f64) => chunk_sum_squares_body
);

/// PyTorch's `clip_grad_norm_` factor: `min(1, max_norm / (norm + 1e-6))`.
pub fn clip_factor(norm: f64, max_norm: f64) -> f64 {
    (max_norm / (norm + 1e-6)).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parallel::Serial;

    #[test]
    fn sums_squares_exactly_for_small_integers() {
        let x: Vec<f32> = (0..1001).map(|i| (i % 7) as f32 - 3.0).collect();
        let expect: f64 = x.iter().map(|v| (*v as f64) * (*v as f64)).sum();
        assert_eq!(sum_squares(&Serial, &x), expect);
    }

    #[test]
    fn clip_factor_only_shrinks() {
        assert_eq!(clip_factor(0.5, 1.0), 1.0);
        assert!((clip_factor(4.0, 1.0) - 1.0 / (4.0 + 1e-6)).abs() < 1e-15);
    }
}
