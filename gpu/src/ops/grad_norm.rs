//! The global gradient norm's dispatches ([`alpha_core::ops::grad_norm`];
//! `shaders/grad_norm.wgsl`).

use super::u;
use crate::kernels::{Kernel, ProgramBuilder, View};

/// Chunks of the squared-norm reduction (the size of its `partials`).
pub const NORM_CHUNKS: usize = 256;

/// `stats[slot] = Σ x²`, through `partials [NORM_CHUNKS]`.
pub fn sum_squares<'a>(p: &mut ProgramBuilder<'a>, x: View<'a>, partials: View<'a>, stats: View<'a>, slot: usize) {
    let chunk = x.len.div_ceil(NORM_CHUNKS).max(1);
    let count = x.len.div_ceil(chunk);
    p.push(Kernel::SumSquaresPartials, &[u(x.len), u(chunk)], &[Some(x), Some(partials)], [u(count), 1, 1]);
    p.push(Kernel::SumSquaresFinish, &[u(count), u(slot)], &[Some(partials), Some(stats)], [1, 1, 1]);
}
