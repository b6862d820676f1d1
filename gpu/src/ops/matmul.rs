//! The linear layer's dispatches ([`alpha_core::ops::matmul`]; `shaders/matmul.wgsl`): one
//! GEMM kernel with the fused epilogues, and the bias and weight gradients.

use super::{add_partials, u};
use crate::kernels::{Kernel, ProgramBuilder, View};
use alpha_core::ops::matmul::{self, Epilogue};
use alpha_core::ops::row_blocks::blocks;

const EPI_ACCUMULATE: u32 = 1;
const EPI_BIAS: u32 = 2;
const EPI_GELU: u32 = 4;
const EPI_RESIDUAL: u32 = 8;
const EPI_GELU_SLOPE: u32 = 16;

/// Workgroups (64 x 64 output tiles) a weight gradient aims for: one with fewer tiles splits
/// its depth (the tokens) into chunks, each a slice of its own, summed afterwards in order.
const SPLIT_TARGET_GROUPS: usize = 512;
/// Smallest depth chunk of a split weight gradient.
const SPLIT_MIN_DEPTH: usize = 128;

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

    fn push(self, p: &mut ProgramBuilder<'a>) {
        let ([rows, cols, depth], [a_rs, a_cs, b_rs, b_cs]) = (self.shape, self.strides);
        let chunk = depth.div_ceil(self.splits);
        let words = [u(rows), u(cols), u(depth), self.flags, u(a_rs), u(a_cs), u(b_rs), u(b_cs), u(chunk)];
        let views = [Some(self.a), Some(self.b), Some(self.c), self.bias, self.aux];
        p.push(Kernel::Matmul, &words, &views, [u(cols.div_ceil(64)), u(rows.div_ceil(64)), u(depth.div_ceil(chunk))]);
    }
}

/// Forward: `out [N, M] = epilogue(x [N, K] · w [M, K]ᵀ + bias [M])`.
pub fn forward<'a>(p: &mut ProgramBuilder<'a>, a: matmul::Forward<View<'a>, View<'a>>) {
    let matmul::Forward { out, x, weight, bias, epilogue, save_slope, k, m } = a;
    let n = x.len / k;
    let (aux, epi) = match epilogue {
        Epilogue::None => (None, 0),
        Epilogue::Gelu { pre } => (Some(pre), if save_slope { EPI_GELU | EPI_GELU_SLOPE } else { EPI_GELU }),
        Epilogue::Residual { input } => (Some(input), EPI_RESIDUAL),
    };
    let flags = epi | if bias.is_some() { EPI_BIAS } else { 0 };
    Gemm { bias, aux, flags, ..Gemm::plain(out, x, weight, [n, m, k], [k, 1, 1, k]) }.push(p);
}

/// Backward: GELU backward in place on `dout [N, M]` (`*= gelu_slope`), `dbias += Σ rows`,
/// `dx [N, K] = dout·w` (overwritten), `dw [M, K] += doutᵀ·x`. `partials`: at least
/// `blocks(N) * M` elements of scratch; `split`: at least [`weight_grad_scratch_len`] (for a
/// weight gradient split by depth).
pub fn backward<'a>(p: &mut ProgramBuilder<'a>, a: matmul::Backward<View<'a>, View<'a>>, partials: View<'a>, split: View<'a>) {
    let matmul::Backward { dx, dweight: dw, dbias, dout, x, weight: w, gelu_slope, k, m } = a;
    let n = x.len / k;
    if gelu_slope.is_some() || dbias.is_some() {
        let words = [u(n), u(m), u32::from(gelu_slope.is_some())];
        p.push(Kernel::BiasGrad, &words, &[Some(dout), gelu_slope, Some(partials)], [u(m.div_ceil(64)), u(blocks(n)), 1]);
    }
    if let Some(db) = dbias {
        add_partials(p, db, partials, blocks(n), m, 0);
    }
    if let Some(dx) = dx {
        Gemm::plain(dx, dout, w, [n, k, m], [m, 1, k, 1]).push(p);
    }
    match weight_grad_splits(n, k, m) {
        1 => Gemm { flags: EPI_ACCUMULATE, ..Gemm::plain(dw, dout, x, [m, k, n], [1, m, k, 1]) }.push(p),
        splits => {
            let slices = View { len: splits * m * k, ..split };
            Gemm { splits, ..Gemm::plain(slices, dout, x, [m, k, n], [1, m, k, 1]) }.push(p);
            add_partials(p, dw, slices, splits, m * k, 0);
        }
    }
}
