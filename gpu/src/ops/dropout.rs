//! Dropout's dispatches ([`alpha_core::ops::dropout`]; `shaders/dropout.wgsl`).

use super::u;
use crate::kernels::{rows_grid, Kernel, ProgramBuilder, View};
use alpha_core::ops::dropout;

/// Dropout forward: `out = residual + mask * scale * y` with the micro-batch's `key` (4 words).
pub fn forward<'a>(p: &mut ProgramBuilder<'a>, a: dropout::Forward<View<'a>, View<'a>>, key: View<'a>) {
    let dropout::Forward { out, y, residual, site } = a;
    let words = [u(out.len), site.id, site.threshold, (site.scale() as f32).to_bits(), u(residual.is_some() as usize)];
    // One thread per Philox block of four elements, 64 per workgroup.
    p.push(Kernel::Dropout, &words, &[Some(out), Some(y), residual, Some(key)], rows_grid(1, out.len.div_ceil(4).div_ceil(64)));
}

/// Dropout backward: `dy = mask * scale * dout` (forward's mask).
pub fn backward<'a>(p: &mut ProgramBuilder<'a>, a: dropout::Backward<View<'a>, View<'a>>, key: View<'a>) {
    let dropout::Backward { dy, dout, site } = a;
    forward(p, dropout::Forward { out: dy, y: dout, residual: None, site }, key)
}
