//! LayerNorm's dispatches ([`alpha_core::ops::layernorm`]; `shaders/layernorm.wgsl`).

use super::{add_partials, u};
use crate::kernels::{rows_grid, Kernel, ProgramBuilder, View};
use alpha_core::ops::layernorm;
use alpha_core::ops::row_blocks::blocks;

/// LayerNorm forward: `out [N, C]`, saving `mean [N]` and `rstd [N]`.
pub fn forward<'a>(p: &mut ProgramBuilder<'a>, a: layernorm::Forward<View<'a>, View<'a>>) {
    let layernorm::Forward { out, mean, rstd, x, weight, bias } = a;
    let (n, c) = (mean.len, weight.len);
    p.push(Kernel::LayerNormForward, &[u(n), u(c)], &[Some(out), Some(mean), Some(rstd), Some(x), Some(weight), Some(bias)], rows_grid(1, n));
}

/// LayerNorm backward: `dx += ...`, `dweight`, `dbias` accumulated. `partials`: at least
/// `blocks(N) * 2C` elements of scratch.
pub fn backward<'a>(p: &mut ProgramBuilder<'a>, a: layernorm::Backward<View<'a>, View<'a>>, partials: View<'a>) {
    let layernorm::Backward { dx, dweight, dbias, dout, x, mean, rstd, weight } = a;
    let (n, c) = (mean.len, weight.len);
    let views = [Some(dx), Some(dout), Some(x), Some(mean), Some(rstd), Some(weight)];
    p.push(Kernel::LayerNormBackward, &[u(n), u(c)], &views, rows_grid(1, n));
    let views = [Some(partials), Some(dout), Some(x), Some(mean), Some(rstd)];
    p.push(Kernel::LayerNormParamPartials, &[u(n), u(c)], &views, [u(c.div_ceil(64)), u(blocks(n)), 1]);
    add_partials(p, dweight, Some(dbias), partials, blocks(n), 2 * c);
}
