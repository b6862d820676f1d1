//! AdamW's dispatch ([`alpha_core::optim`]; `shaders/adamw.wgsl`) with the clip factor and
//! the skip of non-finite steps.

use super::u;
use crate::kernels::{Kernel, ProgramBuilder, View};
use alpha_core::optim::AdamWConfig;

/// The AdamW dispatch over whole arenas; its words change every step ([`words`]).
/// Returns the dispatch's index in the program.
pub fn dispatch<'a>(p: &mut ProgramBuilder<'a>, params: View<'a>, grads: View<'a>, m: View<'a>, v: View<'a>, stats: View<'a>) -> usize {
    let groups = params.len.div_ceil(64);
    let x = groups.min(65535);
    p.push(Kernel::AdamW, &[], &[Some(params), Some(grads), Some(m), Some(v), Some(stats)], [u(x), u(groups.div_ceil(x)), 1])
}

/// The step's AdamW words (see adamw.wgsl): the constants computed in f64 as the CPU does.
pub fn words(len: usize, decay_end: usize, cfg: &AdamWConfig, lr: f64, step: u64, max_norm: f64, stats_slots: [usize; 3]) -> [u32; 16] {
    let bc1 = 1.0 - cfg.beta1.powf(step as f64);
    let bc2_sqrt = (1.0 - cfg.beta2.powf(step as f64)).sqrt();
    let f = |x: f64| (x as f32).to_bits();
    let mut w = [0u32; 16];
    let [loss_slot, norm_slot, skipped_slot] = stats_slots;
    w[..13].copy_from_slice(&[
        u(len),
        u(decay_end),
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
    ]);
    w
}
