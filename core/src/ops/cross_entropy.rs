//! Fused softmax cross-entropy: per-row loss, and optionally d(loss)/d(logits) written over
//! the logits in the same pass. Rows may end in padding (a vocabulary padded to a multiple of
//! 64, as nanoGPT's 50304 for GPT-2's 50257): the softmax runs over the first `classes`
//! logits, and the padding gets no probability and a zero gradient.

use crate::float::{max_of, sum_map, Float};
use crate::parallel::{split_range, Parallel, SharedMut};
use crate::simd::wide_dispatch;

/// The fused op's tensors (slices here, device views on the GPU) and what it computes.
pub struct Forward<W> {
    /// Per-row losses `[N]`.
    pub losses: W,
    /// Logits `[N, V]`; with `grad_scale`, replaced by their gradient.
    pub logits: W,
    /// With `Some(scale)` every logits row is replaced by `scale * (softmax(row) -
    /// onehot(target))`, the gradient of `scale * Σ losses`; `scale = 1 / N` gives the mean's.
    pub grad_scale: Option<f64>,
    /// Logits in use at the start of each row; the rest are padding.
    pub classes: usize,
}

/// Forward (and, with `grad_scale`, backward) against `targets [N]`.
pub fn forward<T: Float>(par: &dyn Parallel, a: Forward<&mut [T]>, targets: &[u32]) {
    let Forward { losses, logits, grad_scale, classes } = a;
    let grad_scale = grad_scale.map(T::from_f64);
    let n = targets.len();
    let v = logits.len() / n.max(1);
    assert!(losses.len() == n && logits.len() == n * v && (1..=v).contains(&classes), "cross-entropy: shape mismatch");
    let tasks = par.threads().min(n).max(1);
    let (loss_p, logit_p) = (SharedMut(losses.as_mut_ptr()), SharedMut(logits.as_mut_ptr()));
    par.run(tasks, &|task| {
        let rows = split_range(n, tasks, task);
        // SAFETY: tasks own disjoint rows.
        let (logits, losses) = unsafe { (logit_p.slice(rows.start * v, rows.len() * v), loss_p.slice(rows.start, rows.len())) };
        softmax_rows(logits, losses, &targets[rows], v, classes, grad_scale);
    });
}

#[inline(always)]
fn softmax_rows_body<T: Float>(logits: &mut [T], losses: &mut [T], targets: &[u32], v: usize, classes: usize, grad_scale: Option<T>) {
    for ((row, loss), &target) in logits.chunks_exact_mut(v).zip(losses).zip(targets) {
        let (row, padding) = row.split_at_mut(classes);
        if grad_scale.is_some() {
            padding.fill(T::ZERO);
        }
        let (max, target_logit) = (max_of(row), row[target as usize]);
        // With a gradient to write, the exponentials are kept in the row (one exp per logit).
        let sum = match grad_scale {
            None => sum_map(row, |x| (x - max).exp()),
            Some(_) => {
                for x in row.iter_mut() {
                    *x = (*x - max).exp();
                }
                sum_map(row, |e| e)
            }
        };
        *loss = max + sum.ln() - target_logit;
        if let Some(scale) = grad_scale {
            let to_grad = scale / sum;
            for x in row.iter_mut() {
                *x *= to_grad;
            }
            row[target as usize] -= scale;
        }
    }
}

wide_dispatch!(
    /// Each `v`-wide row's loss `logsumexp(row[..classes]) - row[target]` into `losses`, and
    /// with `grad_scale` the row replaced by its gradient (see [`forward`]).
    fn softmax_rows<T>(logits: &mut [T], losses: &mut [T], targets: &[u32], v: usize, classes: usize, grad_scale: Option<T>) => softmax_rows_body
);

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
        forward(&Serial, Forward { losses: &mut losses, logits: &mut grad, grad_scale: Some(1.0 / n as f64), classes: v }, &targets);
        let numeric = numeric_grad(&mut logits, |x| {
            let mut l = x.to_vec();
            forward(&Serial, Forward { losses: &mut losses, logits: &mut l, grad_scale: None, classes: v }, &targets);
            mean(&losses)
        });
        assert_close("dlogits", &grad, &numeric);
    }

    /// Rows wider than the 16 lanes with a ragged tail, in f32 (the vectorised build where the
    /// CPU has it), against the same loss and gradient in f64.
    #[test]
    fn wide_rows_match_f64() {
        let (n, v) = (5, 84);
        let mut rng = Rng::new(11);
        let logits = random(&mut rng, n * v, 4.0);
        let targets = [0u32, 83, 17, 64, 64];
        let (mut losses, mut grad) = (vec![0.0; n], logits.clone());
        forward(&Serial, Forward { losses: &mut losses, logits: &mut grad, grad_scale: Some(0.5), classes: v }, &targets);
        let (mut losses32, mut grad32) = (vec![0f32; n], logits.iter().map(|&x| x as f32).collect::<Vec<_>>());
        forward(&Serial, Forward { losses: &mut losses32, logits: &mut grad32, grad_scale: Some(0.5), classes: v }, &targets);
        for (a, b) in losses32.iter().zip(&losses) {
            assert!((*a as f64 - b).abs() < 1e-6 * b.abs().max(1.0), "loss {a} vs {b}");
        }
        for (a, b) in grad32.iter().zip(&grad) {
            assert!((*a as f64 - b).abs() < 1e-7, "grad {a} vs {b}");
        }
    }

    #[test]
    fn uniform_logits_give_log_vocab() {
        let mut logits = [0.5f32; 8];
        let mut losses = [0.0f32; 2];
        forward(&Serial, Forward { losses: &mut losses, logits: &mut logits, grad_scale: None, classes: 4 }, &[1, 3]);
        for l in losses {
            assert!((l - 4f32.ln()).abs() < 1e-6);
        }
    }

    /// A padded row is the unpadded row: the same loss and gradient, whatever the padding
    /// holds, and a zero gradient on the padding.
    #[test]
    fn padding_gets_no_probability_and_no_gradient() {
        let (n, classes, v) = (3, 5, 8);
        let mut rng = Rng::new(2);
        let padded = random(&mut rng, n * v, 30.0);
        let live: Vec<f64> = padded.chunks(v).flat_map(|row| row[..classes].to_vec()).collect();
        let targets = [4u32, 0, 2];
        let run = |logits: &[f64], classes| {
            let (mut losses, mut grad) = (vec![0.0; n], logits.to_vec());
            forward(&Serial, Forward { losses: &mut losses, logits: &mut grad, grad_scale: Some(0.25), classes }, &targets);
            (losses, grad)
        };
        // The row width comes from the logits' length: v, then classes.
        let (padded_losses, padded_grad) = run(&padded, classes);
        let (live_losses, live_grad) = run(&live, classes);
        assert_eq!(padded_losses, live_losses);
        for (row, live_row) in padded_grad.chunks(v).zip(live_grad.chunks(classes)) {
            assert_eq!(&row[..classes], live_row);
            assert!(row[classes..].iter().all(|&g| g == 0.0));
        }
    }
}
