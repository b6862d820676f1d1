//! The dispatches of each op family, forward and backward side by side, one file per family
//! as in `alpha_core::ops` (whose argument structs they take, over views of device buffers)
//! and `shaders/`. Shapes in comments use `N` rows (`B*T` tokens), `C` channels, `V`
//! vocabulary.
//!
//! Unstable: public for Alpha's tools and tests; it changes with any release (see the crate's
//! Stability section).

pub mod adamw;
pub mod attention;
pub mod cross_entropy;
pub mod dropout;
pub mod embedding;
pub mod grad_norm;
pub mod layernorm;
pub mod matmul;
pub mod rmsnorm;

use crate::kernels::{Kernel, ProgramBuilder, View};
use alpha_core::plan::ACT_ALIGN;
use std::ops::Range;

fn u(x: usize) -> u32 {
    u32::try_from(x).expect("GPU shapes fit in 32 bits (checked when the trainer is built)")
}

/// `0..len` cut into consecutive pieces that each fit one storage binding of at most
/// `max_binding` elements (starting aligned): how element-wise passes over a whole arena
/// (AdamW, the gradient norm) bind an arena larger than the adapter binds at once.
pub fn binding_pieces(len: usize, max_binding: usize) -> Vec<Range<usize>> {
    let piece = rows_per_piece(1, max_binding);
    (0..len.max(1)).step_by(piece).map(|start| start..(start + piece).min(len)).collect()
}

/// Rows of `width` elements per piece of a tensor bound in pieces of at most `max_binding`
/// elements: a multiple of [`ACT_ALIGN`] (so that every piece starts aligned), at least one.
pub fn rows_per_piece(width: usize, max_binding: usize) -> usize {
    (max_binding / width.max(1) / ACT_ALIGN * ACT_ALIGN).max(ACT_ALIGN)
}

/// `out [W] += Σ_b partials[b * stride ..][..W]` over `count` row blocks; with `second`
/// `[W2]`, the columns after out's too (`second += Σ_b partials[b * stride + W ..][..W2]`),
/// in the same dispatch.
pub fn add_partials<'a>(p: &mut ProgramBuilder<'a>, out: View<'a>, second: Option<View<'a>>, partials: View<'a>, count: usize, stride: usize) {
    let width = out.len + second.map_or(0, |s| s.len);
    let words = [u(count), u(width), u(stride), u(out.len)];
    p.push(Kernel::AddPartials, &words, &[Some(partials), Some(out), second], [u(width.div_ceil(64)), 1, 1]);
}
