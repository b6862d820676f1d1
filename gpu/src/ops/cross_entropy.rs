//! The fused cross-entropy's dispatches ([`alpha_core::ops::cross_entropy`];
//! `shaders/cross_entropy.wgsl`) and the loss sum the step reads back.

use super::{rows_per_piece, u};
use crate::kernels::{rows_grid, Kernel, ProgramBuilder, View};
use alpha_core::ops::cross_entropy;

/// Fused cross-entropy against `targets [N]` over the first `classes` logits of each row:
/// `losses [N]`, and with `grad_scale` the logits `[N, V]` replaced by `grad_scale * S *
/// (softmax - onehot)` (zero on the padding), S the loss scale in `stats[scale_slot]`.
pub fn forward<'a>(p: &mut ProgramBuilder<'a>, a: cross_entropy::Forward<View<'a>>, targets: View<'a>, stats: View<'a>, scale_slot: usize) {
    let cross_entropy::Forward { losses, logits, grad_scale, classes } = a;
    let (n, v) = (losses.len, logits.len / losses.len);
    let scale = grad_scale.map(|s| s as f32);
    // Logits larger than one binding go in pieces of whole rows.
    let piece = rows_per_piece(v, p.max_binding());
    for r0 in (0..n).step_by(piece) {
        let rows = piece.min(n - r0);
        let words = [u(rows), u(v), u32::from(scale.is_some()), scale.unwrap_or(0.0).to_bits(), u(classes), u(scale_slot)];
        let views = [Some(logits.part(r0 * v, rows * v)), Some(losses.part(r0, rows)), Some(targets.part(r0, rows)), Some(stats)];
        p.push(Kernel::CrossEntropy, &words, &views, rows_grid(1, rows));
    }
}

/// `stats[slot] += Σ losses`.
pub fn sum_losses<'a>(p: &mut ProgramBuilder<'a>, losses: View<'a>, stats: View<'a>, slot: usize) {
    p.push(Kernel::SumLosses, &[u(losses.len), u(slot)], &[Some(losses), Some(stats)], [1, 1, 1]);
}
