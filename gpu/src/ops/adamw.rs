//! AdamW's dispatch ([`alpha_core::optim`]; `shaders/adamw.wgsl`) with the clip factor and
//! the skip of non-finite steps.

use super::u;
use crate::kernels::{Kernel, ProgramBuilder, View};
use alpha_core::optim::AdamWConfig;
use std::ops::Range;

/// The AdamW dispatches over the arenas' `pieces` (see [`super::binding_pieces`]), one per
/// piece; their words change every step ([`words`]). The moments hold the parameters from
/// `moments_start` on (0, or a ZeRO-1 rank's shard). Returns each dispatch's index in the
/// program.
pub fn dispatch<'a>(p: &mut ProgramBuilder<'a>, arenas: [View<'a>; 4], pieces: &[Range<usize>], moments_start: usize, stats: View<'a>) -> Vec<usize> {
    let [params, grads, m, v] = arenas;
    pieces
        .iter()
        .map(|r| {
            let [params, grads] = [params, grads].map(|a| Some(a.part(r.start, r.len())));
            let [m, v] = [m, v].map(|a| Some(a.part(r.start - moments_start, r.len())));
            // Four elements a thread.
            p.push(Kernel::AdamW, &[], &[params, grads, m, v, Some(stats)], element_grid(r.len().div_ceil(4)))
        })
        .collect()
}

/// The step's AdamW words for the arenas' `piece` (see adamw.wgsl): the constants computed in
/// f64 as the CPU does; the first piece counts a skipped step. `stats_slots`: the loss sum,
/// Σ grad², the skipped steps' count and the loss scale.
pub fn words(piece: &Range<usize>, decay_end: usize, cfg: &AdamWConfig, lr: f64, step: u64, max_norm: f64, stats_slots: [usize; 4]) -> [u32; 16] {
    let bc1 = 1.0 - cfg.beta1.powf(step as f64);
    let bc2_sqrt = (1.0 - cfg.beta2.powf(step as f64)).sqrt();
    let f = |x: f64| (x as f32).to_bits();
    let mut w = [0u32; 16];
    let [loss_slot, norm_slot, skipped_slot, scale_slot] = stats_slots;
    w[..15].copy_from_slice(&[
        u(piece.len()),
        u(decay_end.clamp(piece.start, piece.end) - piece.start),
        f(lr / bc1),
        f(1.0 - lr * cfg.weight_decay),
        f(1.0 - cfg.beta1),
        f(cfg.beta2),
        f(1.0 - cfg.beta2),
        f(bc2_sqrt),
        f(cfg.eps),
        f(max_norm),
        u(loss_slot),
        u(norm_slot),
        u(skipped_slot),
        u((piece.start == 0) as usize),
        u(scale_slot),
    ]);
    w
}

/// The loss scale's update after the step's AdamW (see adamw.wgsl's `loss_scale_update`);
/// its words are [`loss_scale_words`]. Returns its index in the program.
pub fn loss_scale_update<'a>(p: &mut ProgramBuilder<'a>, stats: View<'a>, slots: [usize; 6], growth_interval: u32) -> usize {
    p.push(Kernel::LossScaleUpdate, &loss_scale_words(slots, growth_interval), &[Some(stats)], [1, 1, 1])
}

/// The loss scale update's words: `slots` are the statistics slots of the scale, the scale
/// the step used, Σ grad², the good steps' count, the loss sum and the non-finite losses'
/// count; `growth_interval` good steps in a row double the scale.
pub fn loss_scale_words(slots: [usize; 6], growth_interval: u32) -> [u32; 16] {
    let [scale, used, norm, good, loss, bad_loss] = slots.map(u);
    let mut w = [0u32; 16];
    w[..7].copy_from_slice(&[scale, used, norm, good, growth_interval, loss, bad_loss]);
    w
}

/// `copy = params` rounded to f16 over the arenas' `pieces` (see [`super::binding_pieces`];
/// each a multiple of 128 elements long, so that its f16 part starts aligned): the weights'
/// copy that the products read under f16 precision.
pub fn half_weights<'a>(p: &mut ProgramBuilder<'a>, params: View<'a>, copy: View<'a>, pieces: &[Range<usize>]) {
    for r in pieces {
        let views = [Some(params.part(r.start, r.len())), Some(copy.part(r.start, r.len()))];
        p.push(Kernel::HalfWeights, &[u(r.len())], &views, element_grid(r.len()));
    }
}

/// The grid of adamw.wgsl's element-wise kernels over `len` threads: 64-thread workgroups,
/// at most 65535 along x, the rest along y (thread = (y * groups.x + x) * 64 + lid).
fn element_grid(len: usize) -> [u32; 3] {
    let groups = len.div_ceil(64);
    let x = groups.min(65535);
    [u(x), u(groups.div_ceil(x)), 1]
}
