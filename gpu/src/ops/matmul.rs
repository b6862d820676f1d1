//! The linear layer's dispatches ([`alpha_core::ops::matmul`]; `shaders/matmul.wgsl`): the
//! GEMM with the fused epilogues (64 x 64 tiles, or 128 x 128 for large products: see
//! [`kernel_for`]), and the bias and weight gradients.

use super::{add_partials, u};
use crate::kernels::{rows_grid, Kernel, ProgramBuilder, View};
use alpha_core::ops::matmul::{self, Epilogue};
use alpha_core::ops::row_blocks::blocks;

const EPI_ACCUMULATE: u32 = 1;
const EPI_BIAS: u32 = 2;
const EPI_GELU: u32 = 4;
const EPI_RESIDUAL: u32 = 8;
const EPI_GELU_SLOPE: u32 = 16;
/// Not an epilogue: the operands rounded to f16 as they are loaded (`--precision f16`).
const F16_OPERANDS: u32 = 32;

/// Workgroups (64 x 64 output tiles) a weight gradient aims for: one with fewer tiles splits
/// its depth (the tokens) into chunks, each a slice of its own, summed afterwards in order.
const SPLIT_TARGET_GROUPS: usize = 512;
/// Smallest depth chunk of a split weight gradient.
const SPLIT_MIN_DEPTH: usize = 128;

/// Output tile of the `matmul_wide` kernel.
const WIDE_TILE: usize = 128;
/// Fewest workgroups a product runs `matmul_wide` with (one per SM of a large GPU): below,
/// `matmul`'s 64 x 64 tiles give it four times as many workgroups to spread.
const WIDE_MIN_GROUPS: usize = 128;

/// The GEMM kernel for a `rows x cols` product in `splits` depth chunks, and its tile.
pub fn kernel_for(rows: usize, cols: usize, splits: usize) -> (Kernel, usize) {
    let groups = rows.div_ceil(WIDE_TILE) * cols.div_ceil(WIDE_TILE) * splits;
    if rows >= WIDE_TILE && cols >= WIDE_TILE && groups >= WIDE_MIN_GROUPS {
        (Kernel::MatmulWide, WIDE_TILE)
    } else {
        (Kernel::Matmul, 64)
    }
}

/// Depth chunks of the weight gradient `dw [M, K] += doutᵀ·x` over `n` rows (1: not split).
pub fn weight_grad_splits(n: usize, k: usize, m: usize) -> usize {
    let tiles = m.div_ceil(64) * k.div_ceil(64);
    SPLIT_TARGET_GROUPS.div_ceil(tiles).min(n / SPLIT_MIN_DEPTH).max(1)
}

/// Scratch elements [`backward`] needs for a weight gradient: one `M x K` slice per
/// depth chunk, none when it is not split.
pub fn weight_grad_scratch_len(n: usize, k: usize, m: usize) -> usize {
    match weight_grad_splits(n, k, m) {
        1 => 0,
        splits => splits * m * k,
    }
}

/// One dispatch of the GEMM kernel: `c[rows, cols] (+)= a·b` with `a[i, k]` at
/// `i*a_rs + k*a_cs`, `b[k, j]` at `k*b_rs + j*b_cs`; with `splits` above 1, chunk `z` of the
/// depth goes to slice `z` of `c` (`rows * cols` each), without epilogue.
struct Gemm<'a> {
    c: View<'a>,
    a: View<'a>,
    b: View<'a>,
    bias: Option<View<'a>>,
    /// The epilogue's tensor: GELU's pre-activation or the residual.
    aux: Option<View<'a>>,
    flags: u32,
    /// `[rows, cols, depth]`.
    shape: [usize; 3],
    /// `[a_rs, a_cs, b_rs, b_cs]`.
    strides: [usize; 4],
    splits: usize,
}

impl<'a> Gemm<'a> {
    /// `c = a·b` over `shape` with `strides`, no bias, epilogue or split.
    fn plain(c: View<'a>, a: View<'a>, b: View<'a>, shape: [usize; 3], strides: [usize; 4]) -> Self {
        Gemm { c, a, b, bias: None, aux: None, flags: 0, shape, strides, splits: 1 }
    }

    /// Pushes the product: one dispatch, or, where an operand is larger than one binding
    /// may be ([`ProgramBuilder::max_binding`]), one per block of rows, columns and depth
    /// (see [`Gemm::blocks`], so that every piece starts aligned), the depth's blocks accumulated
    /// and the epilogue applied with the last.
    fn push(self, p: &mut ProgramBuilder<'a>) {
        let ([rows, cols, depth], [a_rs, a_cs, b_rs, b_cs]) = (self.shape, self.strides);
        let operands = if p.f16_products() { F16_OPERANDS } else { 0 };
        if self.splits > 1 {
            let chunk = depth.div_ceil(self.splits);
            let words = [u(rows), u(cols), u(depth), self.flags | operands, u(a_rs), u(a_cs), u(b_rs), u(b_cs), u(chunk), u(cols)];
            let views = [Some(self.a), Some(self.b), Some(self.c), self.bias, self.aux];
            let (kernel, tile) = kernel_for(rows, cols, self.splits);
            let i = p.push(kernel, &words, &views, [u(cols.div_ceil(tile)), u(rows.div_ceil(tile)), u(depth.div_ceil(chunk))]);
            p.count_flops(i, product_flops(rows, cols, depth));
            return;
        }
        let [rc, cc, dc] = self.blocks(p.max_binding());
        let last_depth = (depth - 1) / dc * dc;
        for r0 in (0..rows).step_by(rc) {
            for c0 in (0..cols).step_by(cc) {
                for d0 in (0..depth).step_by(dc) {
                    let [r, c, d] = [rc.min(rows - r0), cc.min(cols - c0), dc.min(depth - d0)];
                    // Accumulate into earlier depth blocks; the epilogue once, with the last.
                    let accumulate = if d0 == 0 { self.flags & EPI_ACCUMULATE } else { EPI_ACCUMULATE };
                    let flags = accumulate | if d0 == last_depth { self.flags & !EPI_ACCUMULATE } else { 0 };
                    let a = self.a.part(r0 * a_rs + d0 * a_cs, extent(r, a_rs, d, a_cs));
                    let b = self.b.part(d0 * b_rs + c0 * b_cs, extent(d, b_rs, c, b_cs));
                    let out = |v: View<'a>| v.part(r0 * cols + c0, extent(r, cols, c, 1));
                    let words = [u(r), u(c), u(d), flags | operands, u(a_rs), u(a_cs), u(b_rs), u(b_cs), u(d), u(cols)];
                    let views = [Some(a), Some(b), Some(out(self.c)), self.bias.map(|v| v.part(c0, c)), self.aux.map(out)];
                    let (kernel, tile) = kernel_for(r, c, 1);
                    let i = p.push(kernel, &words, &views, [u(c.div_ceil(tile)), u(r.div_ceil(tile)), 1]);
                    p.count_flops(i, product_flops(r, c, d));
                }
            }
        }
    }

    /// Rows, columns and depth per dispatch: the whole product, halved (in multiples of 64,
    /// or 128 where a tensor is f16, so that every piece starts on 256 bytes) along the
    /// dimension that weighs most in the largest operand until every operand fits
    /// `max_binding` elements (or no block can shrink: the builder then reports the size).
    fn blocks(&self, max_binding: usize) -> [usize; 3] {
        let ([rows, cols, depth], [a_rs, a_cs, b_rs, b_cs]) = (self.shape, self.strides);
        let grain = if [self.a, self.b, self.c].iter().any(|v| v.half) { 128 } else { 64 };
        let mut blocks = [rows, cols, depth];
        loop {
            let [r, c, d] = blocks;
            // (extent, and the two dimensions it spans with their strides)
            let operands = [
                (extent(r, a_rs, d, a_cs), [(0, a_rs), (2, a_cs)]),
                (extent(d, b_rs, c, b_cs), [(2, b_rs), (1, b_cs)]),
                (extent(r, cols, c, 1), [(0, cols), (1, 1)]),
            ];
            let (largest, dims) = operands.into_iter().max_by_key(|o| o.0).expect("three operands");
            if largest <= max_binding {
                return blocks;
            }
            let shrinkable = dims.into_iter().filter(|&(dim, _)| blocks[dim] > grain).max_by_key(|&(dim, stride)| blocks[dim] * stride);
            match shrinkable {
                Some((dim, _)) => blocks[dim] = (blocks[dim] / 2).next_multiple_of(grain),
                None => return blocks,
            }
        }
    }
}

/// Floating-point operations of a `rows x depth` by `depth x cols` product.
fn product_flops(rows: usize, cols: usize, depth: usize) -> f64 {
    2.0 * rows as f64 * cols as f64 * depth as f64
}

/// Elements a strided operand of `n` by `m` spans: from its first to its last.
fn extent(n: usize, n_stride: usize, m: usize, m_stride: usize) -> usize {
    (n - 1) * n_stride + (m - 1) * m_stride + 1
}

/// Forward: `out [N, M] = epilogue(x [N, K] · w [M, K]ᵀ + bias [M])`.
pub fn forward<'a>(p: &mut ProgramBuilder<'a>, a: matmul::Forward<View<'a>, View<'a>>) {
    let matmul::Forward { out, x, weight, bias, epilogue, save_slope, k, m } = a;
    let n = x.len / k;
    let (aux, epi) = match epilogue {
        Epilogue::None => (None, 0),
        Epilogue::Gelu { pre } => (Some(pre), if save_slope { EPI_GELU | EPI_GELU_SLOPE } else { EPI_GELU }),
        Epilogue::Residual { input } => (Some(input), EPI_RESIDUAL),
        Epilogue::SwiGlu { pre } => {
            // The product into `pre`, then SwiGLU over its two halves (columns M/2 apart,
            // which one tile need not hold both of).
            let flags = if bias.is_some() { EPI_BIAS } else { 0 };
            Gemm { bias, flags, ..Gemm::plain(pre, x, weight, [n, m, k], [k, 1, 1, k]) }.push(p);
            let words = [u(n), u(m / 2), u32::from(save_slope)];
            p.push(Kernel::SwiGluForward, &words, &[Some(out), Some(pre)], rows_grid((m / 2).div_ceil(64), n));
            return;
        }
    };
    let flags = epi | if bias.is_some() { EPI_BIAS } else { 0 };
    Gemm { bias, aux, flags, ..Gemm::plain(out, x, weight, [n, m, k], [k, 1, 1, k]) }.push(p);
}

/// Backward: the activation's backward in place on `dout [N, M]` (GELU's `*= slope`,
/// SwiGLU's slopes times `dh`), `dbias += Σ rows`,
/// `dx [N, K] = dout·w` (overwritten), `dw [M, K] += doutᵀ·x`. `partials`: at least
/// `blocks(N) * M` elements of scratch; `split`: at least [`weight_grad_scratch_len`] (for a
/// weight gradient split by depth).
pub fn backward<'a>(p: &mut ProgramBuilder<'a>, a: matmul::Backward<View<'a>, View<'a>>, partials: View<'a>, split: View<'a>) {
    let matmul::Backward { dx, dweight: dw, dbias, dout, x, weight: w, activation, k, m } = a;
    let n = x.len / k;
    let gelu_slope = match activation {
        Some(matmul::ActivationGrad::Gelu { slope }) => Some(slope),
        Some(matmul::ActivationGrad::SwiGlu { dh }) => {
            p.push(Kernel::SwiGluBackward, &[u(n), u(m / 2)], &[Some(dout), Some(dh)], rows_grid((m / 2).div_ceil(64), n));
            None
        }
        None => None,
    };
    if gelu_slope.is_some() || dbias.is_some() {
        let words = [u(n), u(m), u32::from(gelu_slope.is_some())];
        p.push(Kernel::BiasGrad, &words, &[Some(dout), gelu_slope, Some(partials)], [u(m.div_ceil(64)), u(blocks(n)), 1]);
    }
    if let Some(db) = dbias {
        add_partials(p, db, None, partials, blocks(n), m);
    }
    if let Some(dx) = dx {
        Gemm::plain(dx, dout, w, [n, k, m], [m, 1, k, 1]).push(p);
    }
    match weight_grad_splits(n, k, m) {
        1 => Gemm { flags: EPI_ACCUMULATE, ..Gemm::plain(dw, dout, x, [m, k, n], [1, m, k, 1]) }.push(p),
        splits => {
            let slices = View { len: splits * m * k, ..split };
            Gemm { splits, ..Gemm::plain(slices, dout, x, [m, k, n], [1, m, k, 1]) }.push(p);
            add_partials(p, dw, None, slices, splits, m * k);
        }
    }
}
