//! RMSNorm's dispatches ([`alpha_core::ops::rmsnorm`]; `shaders/rmsnorm.wgsl`).

use super::{add_partials, u};
use crate::kernels::{rows_grid, Kernel, ProgramBuilder, View};
use alpha_core::ops::rmsnorm;
use alpha_core::ops::row_blocks::blocks;

/// RMSNorm forward: `out [N, C]`, saving `rstd [N]`.
pub fn forward<'a>(p: &mut ProgramBuilder<'a>, a: rmsnorm::Forward<View<'a>, View<'a>>) {
    let rmsnorm::Forward { out, rstd, x, weight, eps } = a;
    let (n, c) = (rstd.len, weight.len);
    p.push(Kernel::RmsNormForward, &[u(n), u(c), (eps as f32).to_bits()], &[Some(out), Some(rstd), Some(x), Some(weight)], rows_grid(1, n));
}

/// RMSNorm backward: `dx += ...`, `dweight` accumulated. `partials`: at least
/// `blocks(N) * C` elements of scratch.
pub fn backward<'a>(p: &mut ProgramBuilder<'a>, a: rmsnorm::Backward<View<'a>, View<'a>>, partials: View<'a>) {
    let rmsnorm::Backward { dx, dweight, dout, x, rstd, weight } = a;
    let (n, c) = (rstd.len, weight.len);
    p.push(Kernel::RmsNormBackward, &[u(n), u(c)], &[Some(dx), Some(dout), Some(x), Some(rstd), Some(weight)], rows_grid(1, n));
    p.push(Kernel::RmsNormWeightPartials, &[u(n), u(c)], &[Some(partials), Some(dout), Some(x), Some(rstd)], [u(c.div_ceil(64)), u(blocks(n)), 1]);
    add_partials(p, dweight, None, partials, blocks(n), c);
}
