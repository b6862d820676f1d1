//! Global gradient norm, deterministic: fixed chunks summed in `f64`, then in chunk order.

use crate::float::Float;
use crate::parallel::{split_range, Parallel, SharedMut};

const CHUNKS: usize = 64;

/// `Σ x²` over the whole slice. The result does not depend on the number of threads.
pub fn sum_squares<T: Float>(par: &dyn Parallel, x: &[T]) -> f64 {
    let mut partial = [0f64; CHUNKS];
    let p = SharedMut(partial.as_mut_ptr());
    par.run(CHUNKS, &|chunk| {
        let r = split_range(x.len(), CHUNKS, chunk);
        let mut acc = [0f64; 4];
        let quads = x[r.clone()].chunks_exact(4);
        let tail: f64 = quads.remainder().iter().map(|v| v.to_f64() * v.to_f64()).sum();
        for q in quads {
            for i in 0..4 {
                acc[i] += q[i].to_f64() * q[i].to_f64();
            }
        }
        // SAFETY: each task writes its own element.
        let slot = unsafe { p.slice(chunk, 1) };
        slot[0] = (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail;
    });
    partial.iter().sum()
}

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
