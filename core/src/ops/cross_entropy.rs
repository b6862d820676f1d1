//! Fused softmax cross-entropy: per-row loss, and optionally d(loss)/d(logits) written over
//! the logits in the same pass.

use crate::float::Float;
use crate::parallel::{split_range, Parallel, SharedMut};

/// Forward (and, with `grad_scale`, backward). `logits [N, V]`, `targets [N]`, `losses [N]`.
///
/// With `Some(scale)` every logits row is replaced by `scale * (softmax(row) - onehot(target))`,
/// the gradient of `scale * Σ losses`; use `scale = 1 / N` for the mean loss.
pub fn forward<T: Float>(
    par: &dyn Parallel,
    losses: &mut [T],
    logits: &mut [T],
    targets: &[u32],
    v: usize,
    grad_scale: Option<T>,
) {
    let n = targets.len();
    assert!(losses.len() == n && logits.len() == n * v);
    let tasks = par.threads().min(n).max(1);
    let (loss_p, logit_p) = (SharedMut(losses.as_mut_ptr()), SharedMut(logits.as_mut_ptr()));
    par.run(tasks, &|task| {
        for i in split_range(n, tasks, task) {
            // SAFETY: tasks own disjoint rows.
            let (row, loss) = unsafe { (logit_p.slice(i * v, v), loss_p.slice(i, 1)) };
            let target = targets[i] as usize;
            let max = row.iter().fold(row[0], |m, &x| m.max(x));
            let mut sum = T::ZERO;
            for &x in row.iter() {
                sum += (x - max).exp();
            }
            let lse = max + sum.ln();
            loss[0] = lse - row[target];
            if let Some(scale) = grad_scale {
                for x in row.iter_mut() {
                    *x = (*x - lse).exp() * scale;
                }
                row[target] -= scale;
            }
        }
    });
}

/// The mean of `losses`, summed in `f64` in index order.
pub fn mean<T: Float>(losses: &[T]) -> f64 {
    losses.iter().map(|l| l.to_f64()).sum::<f64>() / losses.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::*;
    use crate::parallel::Serial;
    use crate::rng::Rng;

    #[test]
    fn gradients_match_finite_differences() {
        let (n, v) = (4, 6);
        let mut rng = Rng::new(7);
        let mut logits = random(&mut rng, n * v, 3.0);
        let targets = [0u32, 5, 2, 2];
        let mut losses = vec![0.0; n];
        let mut grad = logits.clone();
        forward(&Serial, &mut losses, &mut grad, &targets, v, Some(1.0 / n as f64));
        let numeric = numeric_grad(&mut logits, |x| {
            let mut l = x.to_vec();
            forward(&Serial, &mut losses, &mut l, &targets, v, None);
            mean(&losses)
        });
        assert_close("dlogits", &grad, &numeric);
    }

    #[test]
    fn uniform_logits_give_log_vocab() {
        let mut logits = [0.5f32; 8];
        let mut losses = [0.0f32; 2];
        forward(&Serial, &mut losses, &mut logits, &[1, 3], 4, None);
        for l in losses {
            assert!((l - 4f32.ln()).abs() < 1e-6);
        }
    }
}
