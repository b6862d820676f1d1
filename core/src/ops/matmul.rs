//! Linear layer with fused epilogues: `out [N, M] = epilogue(x [N, K] · wᵀ + bias)`, with
//! `w [M, K]` in `nn.Linear` layout. Epilogues: none, GELU (tanh approximation; a training
//! forward leaves GELU's slope at the pre-activation for backward), SwiGLU over the product's
//! two halves (`silu(gate) · up`, Llama's MLP; its slopes likewise), or a residual add
//! (`out = input + x·wᵀ + bias`).

use super::row_blocks;
use crate::float::Float;
use crate::gemm::bf16::{self, BOperand};
use crate::gemm::{gemm_packed, pack_panels, panels_len, row_block, BLayout, Band, Operands, RowsMut, Shape, Strided, KC};
use crate::parallel::{split_range, Parallel, Serial, SharedMut};
use crate::simd::wide_dispatch;

/// What is applied to `x·wᵀ + bias` before it is stored: the one epilogue type of the tape,
/// the CPU kernels and the GPU's, over `W` tensors written and `R` read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Epilogue<W, R> {
    /// Store as is.
    None,
    /// Store `gelu(pre)` in `out`.
    Gelu {
        /// `[N, M]`: receives the pre-activation, or, in a forward that a backward follows,
        /// `gelu'(pre)`, which is all the backward needs (it multiplies instead of evaluating
        /// GELU a second time).
        pre: W,
    },
    /// Store `silu(gate) · up` in `out [N, M/2]`, where the product's row is `[gate, up]`
    /// (`M/2` each).
    SwiGlu {
        /// `[N, M]`: receives the product, or, in a forward that a backward follows, the
        /// slopes `[up · silu'(gate), silu(gate)]`, which backward multiplies by the output's
        /// gradient in place to get the product's.
        pre: W,
    },
    /// Store `input + x·wᵀ + bias`. In backward the input's gradient is `dout` itself.
    Residual {
        /// The residual stream `[N, M]`.
        input: R,
    },
}

/// How backward gets the product's output gradient from an activation epilogue, in place in
/// [`Backward::dout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActivationGrad<R> {
    /// `dout` holds the gradient of GELU's output: multiplied by the `slope` a training
    /// forward left at `pre` (same shape).
    Gelu {
        /// GELU's slope `[N, M]`.
        slope: R,
    },
    /// `dout` is the `pre` a training forward left (the slopes `[N, M]`): each half
    /// multiplied by `dh`.
    SwiGlu {
        /// The gradient of SwiGLU's output `[N, M/2]`.
        dh: R,
    },
}

impl<W, R> Epilogue<W, R> {
    /// The same epilogue over other tensors.
    pub fn map<W2, R2>(self, write: impl FnOnce(W) -> W2, read: impl FnOnce(R) -> R2) -> Epilogue<W2, R2> {
        match self {
            Epilogue::None => Epilogue::None,
            Epilogue::Gelu { pre } => Epilogue::Gelu { pre: write(pre) },
            Epilogue::SwiGlu { pre } => Epilogue::SwiGlu { pre: write(pre) },
            Epilogue::Residual { input } => Epilogue::Residual { input: read(input) },
        }
    }
}

/// Forward's tensors, `W` written and `R` read (slices here, device views on the GPU).
pub struct Forward<W, R> {
    /// Output `[N, M]`.
    pub out: W,
    /// Input `[N, K]`.
    pub x: R,
    /// Weight `[M, K]`.
    pub weight: R,
    /// Bias `[M]`.
    pub bias: Option<R>,
    /// Applied before the store.
    pub epilogue: Epilogue<W, R>,
    /// A backward follows: an activation leaves its slopes at `pre` (see [`Epilogue::Gelu`]).
    pub save_slope: bool,
    /// Input width `K`.
    pub k: usize,
    /// Output width `M`.
    pub m: usize,
}

/// Backward's tensors, `W` written and `R` read.
pub struct Backward<W, R> {
    /// Gradient of `x` `[N, K]` (overwritten), if wanted.
    pub dx: Option<W>,
    /// Gradient of the weight `[M, K]` (accumulated).
    pub dweight: W,
    /// Gradient of the bias `[M]` (accumulated).
    pub dbias: Option<W>,
    /// Gradient of the output `[N, M]`; with `activation`, what it says, turned into the
    /// product's output gradient in place.
    pub dout: W,
    /// Forward's input `[N, K]`.
    pub x: R,
    /// Weight `[M, K]`.
    pub weight: R,
    /// The activation epilogue's gradient, if the forward had one.
    pub activation: Option<ActivationGrad<R>>,
    /// Input width `K`.
    pub k: usize,
    /// Output width `M`.
    pub m: usize,
}

const GELU_SCALE: f64 = 0.797_884_560_802_865_4; // sqrt(2/pi)
const GELU_CUBIC: f64 = 0.044715;

/// `σ(2u)` for GELU's `u = sqrt(2/π)·(x + 0.044715·x³)`: since `(1 + tanh(u)) / 2 = σ(2u)`,
/// the tanh form costs one exp and one division.
#[inline(always)]
fn gelu_sigmoid<T: Float>(x: T) -> T {
    T::ONE / (T::ONE + (T::from_f64(-2.0) * gelu_u(x)).exp())
}

/// GELU's `u = sqrt(2/π)·(x + 0.044715·x³)`.
#[inline(always)]
fn gelu_u<T: Float>(x: T) -> T {
    T::from_f64(GELU_SCALE) * (x + T::from_f64(GELU_CUBIC) * x * x * x)
}

/// GELU, tanh approximation (PyTorch's `approximate="tanh"`): `0.5·x·(1 + tanh(u)) = x·σ(2u)`.
#[inline(always)]
pub fn gelu<T: Float>(x: T) -> T {
    x * gelu_sigmoid(x)
}

/// Derivative of [`gelu`] given `s = gelu_sigmoid(x)`: `s + 2x·s·(1 − s)·u'`.
#[inline(always)]
fn gelu_slope<T: Float>(x: T, s: T) -> T {
    let du = T::from_f64(GELU_SCALE) * (T::ONE + T::from_f64(3.0 * GELU_CUBIC) * x * x);
    s + T::from_f64(2.0) * x * s * (T::ONE - s) * du
}

/// Elements GELU's forward steps through together (see [`gelu_chunks`]): four AVX2 vectors.
const GELU_LANES: usize = 32;
/// [`GELU_LANES`] with AVX-512: six vectors, whose 32 registers keep more of the exps'
/// chains in flight (docs/performance.md, "Kernel choices").
const GELU_LANES_AVX512: usize = 96;

/// `out = gelu(pre)`; with `slope`, also `pre = gelu'(pre)` (one exp for both): whole chunks
/// of `LANES` step by step (one loop per step, so that the lanes' exps' chains of dependent
/// steps interleave: see [`Float::exp_lanes`]), the last few one by one.
#[inline(always)]
fn gelu_chunks<T: Float, const LANES: usize>(out: &mut [T], pre: &mut [T], slope: bool) {
    let mut outs = out.chunks_exact_mut(LANES);
    let mut pres = pre.chunks_exact_mut(LANES);
    for (o, p) in (&mut outs).zip(&mut pres) {
        let mut x = [T::ZERO; LANES];
        x.copy_from_slice(p);
        let mut s = [T::ZERO; LANES];
        for i in 0..LANES {
            s[i] = T::from_f64(-2.0) * gelu_u(x[i]);
        }
        let mut s = T::exp_lanes(s);
        for i in 0..LANES {
            s[i] = T::ONE / (T::ONE + s[i]);
            o[i] = x[i] * s[i];
        }
        if slope {
            for i in 0..LANES {
                p[i] = gelu_slope(x[i], s[i]);
            }
        }
    }
    for (o, p) in outs.into_remainder().iter_mut().zip(pres.into_remainder()) {
        let s = gelu_sigmoid(*p);
        *o = *p * s;
        if slope {
            *p = gelu_slope(*p, s);
        }
    }
}

#[inline(always)]
fn mul_rows<T: Float>(d: &mut [T], factor: &[T]) {
    for (d, &f) in d.iter_mut().zip(factor) {
        *d *= f;
    }
}

wide_dispatch!(
    /// `out = gelu(pre)` element-wise; with `slope`, `pre = gelu'(pre)` as well.
    fn gelu_forward<T>(out: &mut [T], pre: &mut [T], slope: bool) => gelu_chunks::<T, GELU_LANES_AVX512>, gelu_chunks::<T, GELU_LANES>
);
wide_dispatch!(
    /// `d *= factor` element-wise (GELU's backward, given its slope).
    fn gelu_backward<T>(d: &mut [T], factor: &[T]) => mul_rows
);

/// SiLU's sigmoid, `σ(g)`.
#[inline(always)]
fn sigmoid<T: Float>(g: T) -> T {
    T::ONE / (T::ONE + (-g).exp())
}

#[inline(always)]
fn swiglu_rows_body<T: Float>(out: &mut [T], pre: &mut [T], slope: bool) {
    let half = out.len();
    let (gate, up) = pre.split_at_mut(half);
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        let s = sigmoid(*g);
        let silu = *g * s;
        *o = silu * *u;
        if slope {
            // d/dgate = up · σ(g) · (1 + g · (1 − σ(g))); d/dup = silu(g).
            (*g, *u) = (*u * s * (T::ONE + *g * (T::ONE - s)), silu);
        }
    }
}

wide_dispatch!(
    /// One row: `out = silu(gate) · up` from `pre = [gate, up]`; with `slope`, `pre` becomes
    /// the two slopes.
    fn swiglu_row<T>(out: &mut [T], pre: &mut [T], slope: bool) => swiglu_rows_body
);

#[inline(always)]
fn swiglu_backward_rows_body<T: Float>(d: &mut [T], dh: &[T]) {
    let (gate, up) = d.split_at_mut(dh.len());
    for ((g, u), &h) in gate.iter_mut().zip(up).zip(dh) {
        *g *= h;
        *u *= h;
    }
}

wide_dispatch!(
    /// One row: both halves of the slopes `d = [gate, up]` multiplied by `dh`.
    fn swiglu_backward_row<T>(d: &mut [T], dh: &[T]) => swiglu_backward_rows_body
);

/// SwiGLU after the product: every row of `pre [N, M]` into `out [N, M/2]`.
fn swiglu_forward<T: Float>(par: &dyn Parallel, out: SharedMut<T>, pre: SharedMut<T>, n: usize, m: usize, slope: bool) {
    let tasks = par.threads().min(n);
    par.run(tasks, &|task| {
        for row in split_range(n, tasks, task) {
            // SAFETY: tasks own disjoint rows of both.
            unsafe { swiglu_row(out.slice(row * m / 2, m / 2), pre.slice(row * m, m), slope) };
        }
    });
}

/// Rows per block of [`forward`]'s pipeline (residual copy, GEMM with bias, GELU): the GEMM's
/// own row block, and the block's output stays in L2 between the passes.
const ROW_BLOCK: usize = crate::gemm::MC;

/// Widest column chunk of [`forward`] when it splits columns: a 768-deep chunk's panels
/// (1.5 MiB) stay in L2 while every row of `x` passes them.
const COLUMN_CHUNK: usize = 512;

/// Elements of the scratch [`forward`] and [`backward`] need for `w [M, K]`: forward's
/// wᵀ in the GEMM's panels; backward's w in them (then, in the same place, one K block of
/// both halves' `x` in panels: see `weight_gradient`), and the second half of `dw`'s sum.
pub fn scratch_len(k: usize, m: usize) -> usize {
    panels_len(m, k).max(backward_panels_len(k, m) + m * k)
}

/// The part of backward's scratch that holds w's panels, then `x`'s.
fn backward_panels_len(k: usize, m: usize) -> usize {
    panels_len(k, m).max(2 * panels_len(k, KC))
}

/// Forward: `out = epilogue(x·wᵀ + bias)`; rows (or columns, see below) split across tasks,
/// the products' operands in `operands` (bf16: `T` is f32; one row, a decoded token, runs in
/// f32). `wt` is scratch of at least [`scratch_len`] elements: with f32 operands wᵀ is packed
/// there once into the GEMM's panels, which every task reads (not once per row block).
pub fn forward<T: Float>(par: &dyn Parallel, a: Forward<&mut [T], &[T]>, wt: &mut [T], operands: Operands) {
    let Forward { out, x, weight: w, bias, epilogue, save_slope: slope, k, m } = a;
    let n = x.len() / k;
    let out_width = if matches!(epilogue, Epilogue::SwiGlu { .. }) { m / 2 } else { m };
    assert!(x.len() == n * k && w.len() == m * k && out.len() == n * out_width, "matmul forward: shape mismatch");
    if n == 1 {
        return forward_row(par, Forward { out, x, weight: w, bias, epilogue, save_slope: slope, k, m });
    }
    // Where w is the larger operand (more outputs per row than rows: the LM head, or a
    // prompt's few rows), tasks take chunks of columns over all rows, so that each part of
    // w's panels streams from memory once and stays in L2 while x passes it (row blocks would
    // stream all of w's panels once per block); else blocks of rows over all columns, which
    // stream x once. Measured: docs/performance.md, "Kernel choices".
    forward_tiles(par, Forward { out, x, weight: w, bias, epilogue, save_slope: slope, k, m }, wt, m > n, operands);
}

/// [`forward`] of at least two rows, its tasks each a tile of `out`: a chunk of columns
/// over all rows if `by_columns`, else a block of rows over all columns. The same bits
/// either way (the GEMM's sums do not depend on where tiles start).
fn forward_tiles<T: Float>(par: &dyn Parallel, a: Forward<&mut [T], &[T]>, wt: &mut [T], by_columns: bool, operands: Operands) {
    let Forward { out, x, weight: w, bias, epilogue, save_slope: slope, k, m } = a;
    let n = x.len() / k;
    pack_b(operands, par, w, BLayout::Transposed, k, m, wt);
    let wt: &[T] = wt;
    let out_p = SharedMut(out.as_mut_ptr());
    let swiglu = matches!(epilogue, Epilogue::SwiGlu { .. });
    let (pre_p, residual) = match epilogue {
        Epilogue::None => (None, None),
        Epilogue::Gelu { pre } | Epilogue::SwiGlu { pre } => {
            assert_eq!(pre.len(), n * m);
            (Some(SharedMut(pre.as_mut_ptr())), None)
        }
        Epilogue::Residual { input } => {
            assert_eq!(input.len(), n * m);
            (None, Some(input))
        }
    };
    // Each task's tile goes through residual, GEMM and GELU while it is still in cache; several
    // tasks per thread, so that an idle thread can take some of a slower one's (see
    // `ThreadPool`).
    let chunk = (m.div_ceil(4 * par.threads())).next_multiple_of(crate::gemm::MAX_NR).min(COLUMN_CHUNK);
    let tasks = if by_columns { m.div_ceil(chunk) } else { n.div_ceil(ROW_BLOCK) };
    par.run(tasks, &|task| {
        let (rows, cols) =
            if by_columns { (0..n, task * chunk..((task + 1) * chunk).min(m)) } else { (task * ROW_BLOCK..((task + 1) * ROW_BLOCK).min(n), 0..m) };
        let target = pre_p.unwrap_or(out_p);
        // SAFETY (row segments): tasks own disjoint tiles of `out` and `pre`.
        let segment = |p: SharedMut<T>, row: usize| unsafe { p.slice(row * m + cols.start, cols.len()) };
        // The residual is copied in and added by the GEMM (beta 1), the bias by its
        // micro-kernel: out = x·wᵀ + (input + bias).
        let beta = match residual {
            Some(r) => {
                for row in rows.clone() {
                    segment(target, row).copy_from_slice(&r[row * m + cols.start..row * m + cols.end]);
                }
                T::ONE
            }
            None => T::ZERO,
        };
        // SAFETY: x rows are K-strided, wt holds wᵀ [K, M] as panels (a chunk's from its
        // first column on: chunks start at multiples of every kernel's panel width, the bf16
        // one's included); the tile is rows x cols of `out` (row stride m) and overlaps
        // neither.
        unsafe {
            let a = Strided { ptr: x.as_ptr().add(rows.start * k), rs: k, cs: 1 };
            let c = RowsMut { ptr: target.0.add(rows.start * m + cols.start), ld: m };
            let (shape, bias) = (Shape { m: rows.len(), n: cols.len(), k }, bias.map(|b| &b[cols.clone()]));
            packed_product(operands, shape, a, wt, cols.start, beta, bias, c);
        }
        if pre_p.is_some() && !swiglu {
            for row in rows {
                gelu_forward(segment(out_p, row), segment(target, row), slope);
            }
        }
    });
    // SwiGLU pairs columns M/2 apart, which one tile need not hold both of.
    if let (Some(pre), true) = (pre_p, swiglu) {
        swiglu_forward(par, out_p, pre, n, m, slope);
    }
}

/// Outputs per task of [`forward_row`]: enough weight rows to stream per task.
const ROW_OUTPUTS: usize = 64;

/// [`forward`] of one row (decoding a token): each output a dot product over a row of `w`,
/// which streams the weight once, where the GEMM would first pack it (as much traffic again).
fn forward_row<T: Float>(par: &dyn Parallel, a: Forward<&mut [T], &[T]>) {
    let Forward { out, x, weight: w, bias, epilogue, save_slope: slope, k, m } = a;
    let swiglu = matches!(epilogue, Epilogue::SwiGlu { .. });
    let (pre_p, residual) = match epilogue {
        Epilogue::None => (None, None),
        Epilogue::Gelu { pre } | Epilogue::SwiGlu { pre } => (Some(SharedMut(pre.as_mut_ptr())), None),
        Epilogue::Residual { input } => (None, Some(input)),
    };
    let out_p = SharedMut(out.as_mut_ptr());
    par.run(m.div_ceil(ROW_OUTPUTS), &|task| {
        let cols = task * ROW_OUTPUTS..((task + 1) * ROW_OUTPUTS).min(m);
        // SAFETY: tasks own disjoint columns of `out` and `pre`.
        let target = unsafe { pre_p.unwrap_or(out_p).slice(cols.start, cols.len()) };
        dot_rows(target, x, &w[cols.start * k..cols.end * k]);
        for (j, t) in cols.clone().zip(target.iter_mut()) {
            *t += bias.map_or(T::ZERO, |b| b[j]) + residual.map_or(T::ZERO, |r| r[j]);
        }
        if pre_p.is_some() && !swiglu {
            // SAFETY: as above, the same columns of `out`.
            gelu_forward(unsafe { out_p.slice(cols.start, cols.len()) }, target, slope);
        }
    });
    if let (Some(pre), true) = (pre_p, swiglu) {
        swiglu_forward(&Serial, out_p, pre, 1, m, slope);
    }
}

/// Rows of `w` [`dot_rows`] reads together: independent sums in flight, each chunk of `x`
/// loaded once for all of them.
const DOT_ROWS: usize = 8;

/// How far ahead of its reads (in values) [`dot_rows`] prefetches each row: 512 bytes, eight
/// cache lines.
const PREFETCH_AHEAD: usize = 128;

#[inline(always)]
fn dot_rows_body<T: Float>(out: &mut [T], x: &[T], rows: &[T]) {
    let k = x.len();
    let mut groups = out.chunks_exact_mut(DOT_ROWS).zip(rows.chunks_exact(DOT_ROWS * k));
    for (o, w) in &mut groups {
        // Each row's 16 lanes as `dot` keeps them, so the sums are `dot`'s.
        let mut acc = [[T::ZERO; 16]; DOT_ROWS];
        let whole = k / 16 * 16;
        for at in (0..whole).step_by(16) {
            for (r, lanes) in acc.iter_mut().enumerate() {
                let (xs, ws) = (&x[at..at + 16], &w[r * k + at..r * k + at + 16]);
                crate::simd::prefetch(ws.as_ptr().wrapping_add(PREFETCH_AHEAD));
                for l in 0..16 {
                    lanes[l] += xs[l] * ws[l];
                }
            }
        }
        for (r, o) in o.iter_mut().enumerate() {
            let tail = (whole..k).fold(T::ZERO, |t, i| t + x[i] * w[r * k + i]);
            *o = crate::float::sum_lanes(acc[r]) + tail;
        }
    }
    let done = out.len() / DOT_ROWS * DOT_ROWS;
    for (o, row) in out[done..].iter_mut().zip(rows[done * k..].chunks_exact(k)) {
        *o = crate::float::dot(x, row);
    }
}

wide_dispatch!(
    /// `out[j] = x · rows[j]` for the consecutive rows of `rows` (each `x.len()` long).
    fn dot_rows<T>(out: &mut [T], x: &[T], rows: &[T]) => dot_rows_body
);

/// Backward. From `dout [N, M]` computes `dx = dout·w` (overwriting, if requested) and
/// accumulates `dw += doutᵀ·x`, `db += Σ_rows dout`. With `activation`, `dout` is first
/// turned into the product's output gradient in place (see [`ActivationGrad`]).
/// `partials` is scratch of at least [`row_blocks::blocks`]`(N) * M` elements (for `db`),
/// `scratch` of at least [`scratch_len`]: w packed into the GEMM's panels once for `dx` (not
/// once per block of rows), then in
/// the same place `x` in panels for `dw` (see `weight_gradient`), and beside it the second
/// half of `dw`'s sum over the N rows, which is added after the first.
/// The products' operands are `operands`' (bf16: `T` is f32).
pub fn backward<T: Float>(par: &dyn Parallel, a: Backward<&mut [T], &[T]>, partials: &mut [T], scratch: &mut [T], operands: Operands) {
    let Backward { dx, dweight: dw, dbias: db, dout, x, weight: w, activation, k, m } = a;
    let n = x.len() / k;
    assert!(x.len() == n * k && w.len() == m * k && dout.len() == n * m && dw.len() == m * k, "matmul backward: shape mismatch");
    // One pass over row blocks: the activation's gradient in place, and the blocks' column
    // sums.
    if activation.is_some() || db.is_some() {
        let d_p = SharedMut(dout.as_mut_ptr());
        let with_bias = db.is_some();
        row_blocks::for_each_block(par, n, partials, m, &|rows, partial| {
            // SAFETY: blocks own disjoint rows.
            let d = unsafe { d_p.slice(rows.start * m, rows.len() * m) };
            match activation {
                Some(ActivationGrad::Gelu { slope }) => gelu_backward(d, &slope[rows.start * m..rows.end * m]),
                Some(ActivationGrad::SwiGlu { dh }) => {
                    for (d, dh) in d.chunks_exact_mut(m).zip(dh[rows.start * m / 2..rows.end * m / 2].chunks_exact(m / 2)) {
                        swiglu_backward_row(d, dh);
                    }
                }
                None => {}
            }
            if with_bias {
                column_sums(partial, d);
            }
        });
    }
    if let Some(db) = db {
        row_blocks::add_partials(par, n, partials, m, 0, db);
    }
    let dout: &[T] = dout;
    if let Some(dx) = dx {
        assert_eq!(dx.len(), n * k);
        // dx [N, K] = dout [N, M] · w [M, K]
        let shape = Shape { m: n, n: k, k: m };
        let panels = &mut scratch[..backward_panels_len(k, m)];
        pack_b(operands, par, w, BLayout::Rows, m, k, panels);
        let panels: &[T] = panels;
        // SAFETY: the panels hold w [M, K] (pack_b checked their length).
        par_rows(par, shape, dout, dx, &|shape, a, c| unsafe { packed_product(operands, shape, a, panels, 0, T::ZERO, None, c) });
    }
    weight_gradient(par, dw, dout, x, k, m, scratch, operands);
}

/// `dw [M, K] += doutᵀ [M, N] · x [N, K]`, the sum over the N rows in two fixed halves: the
/// first added into `dw` by the GEMM, the second computed into `dw_half` and added after. Each
/// half reads only its own rows of `dout` and `x`, the rows that the same thread produced on
/// two threads (split by `dw` rows, every task read all N rows, half of them from the other
/// core's cache). The halves do not depend on the thread count; each is split by rows of `dw`
/// at the GEMM's row blocks, one task each, so that an idle thread can take some of a slower
/// one's (see `ThreadPool`).
///
/// A half goes through its rows in the GEMM's K blocks (the blocks one GEMM over the half
/// takes: the same sums): each block of `x` is packed into panels once (in the scratch's
/// first [`backward_panels_len`], of at least `2 * panels_len(K, KC)`), for every row block
/// of `dw` to read, instead of once per row block (a weight gradient with six row blocks
/// packed its B six times). `scratch` is [`backward`]'s.
#[allow(clippy::too_many_arguments)]
fn weight_gradient<T: Float>(par: &dyn Parallel, dw: &mut [T], dout: &[T], x: &[T], k: usize, m: usize, scratch: &mut [T], operands: Operands) {
    let n = x.len() / k;
    let (x_panels, dw_half) = scratch.split_at_mut(backward_panels_len(k, m));
    let dw_half = &mut dw_half[..m * k];
    let halves = [split_range(n, 2, 0), split_range(n, 2, 1)];
    let kernel = crate::gemm::kernel::<T>();
    let part_rows = row_block(m, kernel.mr);
    let parts = m.div_ceil(part_rows);
    let panel_len = panels_len(k, KC);
    let depth = kernel.kc;
    let (dw_p, half_p) = (SharedMut(dw.as_mut_ptr()), SharedMut(dw_half.as_mut_ptr()));
    // Rows of half `h` in its K block `block` (empty past the half's end).
    let block_rows = |h: usize, block: usize| {
        let half = &halves[h];
        let start = (half.start + block * depth).min(half.end);
        start..(start + depth).min(half.end)
    };
    // At least one block, which clears `dw_half` even when it has no rows.
    for block in 0..halves[0].len().max(halves[1].len()).div_ceil(depth).max(1) {
        let panels_p = SharedMut(x_panels.as_mut_ptr());
        par.run(2, &|h| {
            let rows = block_rows(h, block);
            // SAFETY: each half packs into its own part of the panels (on this task's thread).
            let panels = unsafe { panels_p.slice(h * panel_len, panel_len) };
            let x = &x[rows.start * k..rows.end * k];
            pack_b(operands, &Serial, x, BLayout::Rows, rows.len(), k, panels);
        });
        let x_panels: &[T] = x_panels;
        par.run(2 * parts, &|task| {
            let (h, part) = (task / parts, task % parts);
            let rows = block_rows(h, block);
            // The second half's first block overwrites `dw_half`; everything else adds.
            let (out, beta) = match (h, block) {
                (0, _) => (dw_p, T::ONE),
                (_, 0) => (half_p, T::ZERO),
                _ => (half_p, T::ONE),
            };
            let r = part * part_rows..((part + 1) * part_rows).min(m);
            // SAFETY: task (half, part) writes rows r of its own output (dw or dw_half, both
            // M x K); it reads columns r of the block's rows of dout and the block's panels
            // (or its rows of x).
            unsafe {
                let a = Strided { ptr: dout.as_ptr().wrapping_add(rows.start * m + r.start), rs: 1, cs: m };
                let c = RowsMut { ptr: out.ptr().add(r.start * k), ld: k };
                let shape = Shape { m: r.len(), n: k, k: rows.len() };
                packed_product(operands, shape, a, &x_panels[h * panel_len..], 0, beta, None, c);
            }
        });
    }
    let tasks = par.threads().min(m).max(1);
    let dw_half: &[T] = dw_half;
    par.run(tasks, &|task| {
        let r = split_range(m, tasks, task);
        // SAFETY: tasks own disjoint row ranges of dw.
        let d = unsafe { dw_p.slice(r.start * k, r.len() * k) };
        for (d, &h) in d.iter_mut().zip(&dw_half[r.start * k..r.end * k]) {
            *d += h;
        }
    });
}

#[inline(always)]
fn column_sums_body<T: Float>(sums: &mut [T], rows: &[T]) {
    sums.fill(T::ZERO);
    for row in rows.chunks_exact(sums.len()) {
        for (s, &x) in sums.iter_mut().zip(row) {
            *s += x;
        }
    }
}

wide_dispatch!(
    /// `sums[j] = Σ_i rows[i][j]` over the rows (each `sums.len()` wide), in row order.
    fn column_sums<T>(sums: &mut [T], rows: &[T]) => column_sums_body
);

/// `c [m, n] = a [m, k] · b [k, n]` by `product` (given a block's shape, its rows of `a` and
/// of `c`), one task per block of [`ROW_BLOCK`] rows of `c` (an idle thread can take some of a
/// slower one's); `a` and `c` are contiguous row-major.
fn par_rows<T: Float>(par: &dyn Parallel, shape: Shape, a: &[T], c: &mut [T], product: &(dyn Fn(Shape, Strided<T>, RowsMut<T>) + Sync)) {
    let Shape { m, n, k } = shape;
    assert!(a.len() == m * k && c.len() == m * n);
    let c_p = SharedMut(c.as_mut_ptr());
    par.run(m.div_ceil(ROW_BLOCK), &|task| {
        let r = task * ROW_BLOCK..((task + 1) * ROW_BLOCK).min(m);
        // SAFETY: each task writes its own rows of c; a's rows r are inside a.
        let (a, c) = unsafe { (Strided { ptr: a.as_ptr().add(r.start * k), rs: k, cs: 1 }, RowsMut { ptr: c_p.ptr().add(r.start * n), ld: n }) };
        product(Shape { m: r.len(), n, k }, a, c);
    });
}

/// Packs B `[k x n]` (`b` laid out as `layout` says) into `out` once for every product that
/// reads it, as [`packed_product`] in `operands` reads it: f32 panels ([`pack_panels`]) or
/// bf16 ones ([`bf16::pack_panels_of`]; `T` must be f32).
///
/// # Panics
/// If `b` or `out` is too short, or (bf16) `T` is not f32.
fn pack_b<T: Float>(operands: Operands, par: &dyn Parallel, b: &[T], layout: BLayout, k: usize, n: usize, out: &mut [T]) {
    match operands {
        Operands::F32 => pack_panels(par, b, layout, k, n, out),
        Operands::Bf16 => {
            assert!(b.len() >= k * n, "bf16 panels: B is too short");
            let b = match layout {
                BLayout::Rows => Strided { ptr: b.as_ptr(), rs: n, cs: 1 },
                BLayout::Transposed => Strided { ptr: b.as_ptr(), rs: 1, cs: k },
            };
            // SAFETY: B's k x n values are inside `b` (checked).
            unsafe { bf16::pack_panels_of(par, b, k, n, out) };
        }
    }
}

/// `c = a · B + (beta · c + bias)` with B the `panels` [`pack_b`] wrote for `operands`, of
/// `shape.k` depth, from its column `col` on (a multiple of every kernel's panel width).
///
/// # Safety
/// As [`gemm_packed`]'s (or [`bf16::gemm_bf16`]'s): `a` and `c` valid for `shape`, `c` not
/// overlapping them and written by no other thread meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn packed_product<T: Float>(operands: Operands, shape: Shape, a: Strided<T>, panels: &[T], col: usize, beta: T, bias: Option<&[T]>, c: RowsMut<T>) {
    // SAFETY: forwarded; the panels hold B's columns from `col` on, of depth shape.k.
    unsafe {
        match operands {
            Operands::F32 => gemm_packed(shape, a, &panels[col * shape.k..], beta, bias, c),
            Operands::Bf16 => {
                let b = BOperand::Panels { ptr: bf16::panels_at(panels.as_ptr().cast(), shape.k, col), depth: shape.k };
                bf16::product_of(shape, a, b, beta, bias, c, Band::Full)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::*;
    use crate::parallel::ReversedThreads;
    use crate::rng::Rng;

    fn check(kind: &str, with_bias: bool) {
        // Two row blocks; SwiGLU's halves 5 wide.
        let (n, k, m) = (70, 7, if kind == "swiglu" { 10 } else { 9 });
        let out_width = if kind == "swiglu" { m / 2 } else { m };
        let mut rng = Rng::new(3);
        let mut x = random(&mut rng, n * k, 1.0);
        let mut w = random(&mut rng, m * k, 1.0);
        let mut b = random(&mut rng, m, 1.0);
        let mut r = random(&mut rng, n * m, 1.0);
        let g = random(&mut rng, n * out_width, 1.0);
        let mut out = vec![0.0; n * out_width];
        let mut pre = vec![0.0; n * m];
        let run = |x: &[f64], weight: &[f64], b: &[f64], r: &[f64], pre: &mut [f64], out: &mut [f64], save_slope: bool| {
            let epilogue = match kind {
                "gelu" => Epilogue::Gelu { pre },
                "swiglu" => Epilogue::SwiGlu { pre },
                "residual" => Epilogue::Residual { input: r },
                _ => Epilogue::None,
            };
            forward(
                &Serial,
                Forward { out: &mut *out, x, weight, bias: with_bias.then_some(b), epilogue, save_slope, k, m },
                &mut vec![0.0; scratch_len(k, m)],
                Operands::F32,
            );
            weighted_sum(out, &g)
        };
        run(&x, &w, &b, &r, &mut pre, &mut out, true);
        let (mut dx, mut dw, mut db) = (vec![0.0; n * k], vec![0.0; m * k], vec![0.0; m]);
        // SwiGLU's backward turns the slopes its forward left into the product's gradient.
        let (mut dout, activation) = match kind {
            "gelu" => (g.clone(), Some(ActivationGrad::Gelu { slope: &pre[..] })),
            "swiglu" => (pre.clone(), Some(ActivationGrad::SwiGlu { dh: &g[..] })),
            _ => (g.clone(), None),
        };
        let mut partials = vec![0.0; crate::ops::row_blocks::blocks(n) * m];
        let mut scratch = vec![0.0; scratch_len(k, m)];
        let grads = Backward {
            dx: Some(&mut dx[..]),
            dweight: &mut dw[..],
            dbias: with_bias.then_some(&mut db[..]),
            dout: &mut dout[..],
            x: &x[..],
            weight: &w[..],
            activation,
            k,
            m,
        };
        backward(&Serial, grads, &mut partials, &mut scratch, Operands::F32);
        let (x0, w0, b0, r0) = (x.clone(), w.clone(), b.clone(), r.clone());
        let mut scratch = (vec![0.0; n * m], vec![0.0; n * out_width]);
        let mut loss = |x: &[f64], w: &[f64], b: &[f64], r: &[f64]| run(x, w, b, r, &mut scratch.0, &mut scratch.1, false);
        assert_close("dx", &dx, &numeric_grad(&mut x, |x| loss(x, &w0, &b0, &r0)));
        assert_close("dw", &dw, &numeric_grad(&mut w, |w| loss(&x0, w, &b0, &r0)));
        if with_bias {
            assert_close("db", &db, &numeric_grad(&mut b, |b| loss(&x0, &w0, b, &r0)));
        }
        if kind == "residual" {
            // The residual input's gradient is dout itself (the plan shares the buffer).
            assert_close("dresidual", &g, &numeric_grad(&mut r, |r| loss(&x0, &w0, &b0, r)));
        }
    }

    #[test]
    fn plain_gradients_match_finite_differences() {
        check("none", true);
        check("none", false);
    }

    #[test]
    fn gelu_gradients_match_finite_differences() {
        check("gelu", true);
    }

    #[test]
    fn swiglu_gradients_match_finite_differences() {
        check("swiglu", false);
        check("swiglu", true);
    }

    /// SwiGLU is `silu(gate) · up` with `silu(g) = g · σ(g)`, its halves taken as Hugging
    /// Face's `gate_proj` and `up_proj` outputs.
    #[test]
    fn swiglu_matches_the_definition() {
        let (k, m) = (3, 4);
        let (x, w) = ([0.5, -1.0, 2.0], [0.1, 0.2, 0.3, -0.4, 0.5, 0.6, 0.7, 0.8, -0.9, 1.0, 1.1, 1.2]);
        let (mut out, mut pre) = ([0.0f64; 2], [0.0f64; 4]);
        let a = Forward { out: &mut out[..], x: &x[..], weight: &w[..], bias: None, epilogue: Epilogue::SwiGlu { pre: &mut pre[..] }, save_slope: false, k, m };
        forward(&Serial, a, &mut vec![0.0; scratch_len(k, m)], Operands::F32);
        let y: Vec<f64> = (0..m).map(|j| (0..k).map(|i| x[i] * w[j * k + i]).sum()).collect();
        for j in 0..2 {
            let silu = y[j] / (1.0 + (-y[j]).exp());
            assert!((out[j] - silu * y[j + 2]).abs() < 1e-15, "{j}");
        }
    }

    /// The sigmoid form is PyTorch's `0.5·x·(1 + tanh(u))`: in f64 to rounding, in f32 to a
    /// few ulp of the f64 value.
    #[test]
    fn gelu_is_the_tanh_approximation() {
        let reference = |x: f64| 0.5 * x * (1.0 + libm::tanh(GELU_SCALE * (x + GELU_CUBIC * x * x * x)));
        for i in -400..=400 {
            let x = i as f64 * 0.025;
            assert!((gelu(x) - reference(x)).abs() <= 1e-15 * (1.0 + reference(x).abs()), "gelu({x})");
            let x = x as f32 as f64;
            let reference = reference(x);
            let g32 = gelu(x as f32) as f64;
            assert!((g32 - reference).abs() <= 4.0 * f32::EPSILON as f64 * (1e-3 + reference.abs()), "f32 gelu({x}) = {g32}, {reference}");
        }
    }

    #[test]
    fn residual_gradients_match_finite_differences() {
        check("residual", true);
    }

    /// The GELU loop has the scalar functions' bits whatever its build (the widest this CPU
    /// runs, or the baseline) and its chunks (AVX2's or AVX-512's, a remainder after them),
    /// with and without the slope (whose values the finite-difference test checks).
    /// One row (a decoded token) takes the dot-product path: it computes what the GEMM does
    /// for that row, with each epilogue, GELU's slope included.
    #[test]
    fn one_row_matches_the_gemm() {
        let (k, m) = (37, 150); // three tasks of outputs, the last partial
        let mut rng = Rng::new(8);
        let (x, w, b) = (random(&mut rng, 2 * k, 1.0), random(&mut rng, m * k, 1.0), random(&mut rng, m, 1.0));
        let r = random(&mut rng, 2 * m, 1.0);
        for kind in ["none", "gelu", "swiglu", "residual"] {
            let run = |rows: usize| {
                let (mut out, mut pre) = (vec![0.0; rows * m], vec![0.0; rows * m]);
                let out = if kind == "swiglu" { &mut out[..rows * m / 2] } else { &mut out[..] };
                let epilogue = match kind {
                    "gelu" => Epilogue::Gelu { pre: &mut pre[..] },
                    "swiglu" => Epilogue::SwiGlu { pre: &mut pre[..] },
                    "residual" => Epilogue::Residual { input: &r[..rows * m] },
                    _ => Epilogue::None,
                };
                let a = Forward { out: &mut *out, x: &x[..rows * k], weight: &w, bias: Some(&b), epilogue, save_slope: true, k, m };
                forward(&ReversedThreads(3), a, &mut vec![0.0; scratch_len(k, m)], Operands::F32);
                (out.to_vec(), pre)
            };
            let ((one, one_pre), (two, two_pre)) = (run(1), run(2));
            for (what, got, want) in [("out", &one, &two[..one.len()]), ("slope", &one_pre, &two_pre[..m])] {
                for (j, (a, b)) in got.iter().zip(want).enumerate() {
                    assert!((a - b).abs() < 1e-12, "{kind} {what}[{j}]: {a} vs {b}");
                }
            }
        }
    }

    /// Column chunks and row blocks give the same bits, with each epilogue and a bias, over
    /// several chunks (the last partial) and blocks on three threads.
    #[test]
    fn column_chunks_match_row_blocks() {
        let (n, k, m) = (100, 21, 150);
        let mut rng = Rng::new(9);
        let (x, w, b, r) = (random(&mut rng, n * k, 1.0), random(&mut rng, m * k, 1.0), random(&mut rng, m, 1.0), random(&mut rng, n * m, 1.0));
        for kind in ["none", "gelu", "swiglu", "residual"] {
            let run = |by_columns: bool| {
                let (mut out, mut pre) = (vec![0.0; n * m], vec![0.0; n * m]);
                let out = if kind == "swiglu" { &mut out[..n * m / 2] } else { &mut out[..] };
                let epilogue = match kind {
                    "gelu" => Epilogue::Gelu { pre: &mut pre[..] },
                    "swiglu" => Epilogue::SwiGlu { pre: &mut pre[..] },
                    "residual" => Epilogue::Residual { input: &r[..] },
                    _ => Epilogue::None,
                };
                let a = Forward { out: &mut *out, x: &x[..], weight: &w, bias: Some(&b), epilogue, save_slope: true, k, m };
                forward_tiles(&ReversedThreads(3), a, &mut vec![0.0; scratch_len(k, m)], by_columns, Operands::F32);
                (out.to_vec(), pre)
            };
            let (columns, rows) = (run(true), run(false));
            assert!(columns == rows, "{kind}: column chunks and row blocks differ");
            assert!(rows.0.iter().all(|v| *v != 0.0), "{kind}: every output written");
        }
    }

    #[test]
    fn gelu_loops_match_scalar() {
        let mut rng = Rng::new(12);
        let pre: Vec<f32> = (0..1000).map(|_| (rng.next_f64() as f32 - 0.5) * 20.0).collect();
        type Loop = fn(&mut [f32], &mut [f32], bool);
        let loops: [(&str, Loop); 3] = [
            ("dispatched", gelu_forward::<f32>),
            ("AVX2's chunks", gelu_chunks::<f32, GELU_LANES>),
            ("AVX-512's chunks", gelu_chunks::<f32, GELU_LANES_AVX512>),
        ];
        for slope in [false, true] {
            let want_out: Vec<f32> = pre.iter().map(|&x| gelu(x)).collect();
            let want_pre: Vec<f32> = pre.iter().map(|&x| if slope { gelu_slope(x, gelu_sigmoid(x)) } else { x }).collect();
            for (name, gelu_loop) in loops {
                let (mut out, mut p) = (vec![0f32; pre.len()], pre.clone());
                gelu_loop(&mut out, &mut p, slope);
                assert_eq!(out, want_out, "{name}, slope {slope}");
                assert_eq!(p, want_pre, "{name}, slope {slope}");
            }
        }
    }

    /// Forward and backward give the same bits on four threads as on one.
    #[test]
    fn threaded_split_matches_serial() {
        let four = ReversedThreads(4);
        // With one output column, two of the four tasks own no rows of dw.
        for (n, k, m) in [(13, 6, 5), (9, 4, 1)] {
            let mut rng = Rng::new(4);
            let x: Vec<f32> = random(&mut rng, n * k, 1.0).into_iter().map(|v| v as f32).collect();
            let w: Vec<f32> = random(&mut rng, m * k, 1.0).into_iter().map(|v| v as f32).collect();
            let (mut a, mut b) = (vec![0.0f32; n * m], vec![0.0f32; n * m]);
            let plain = |out| Forward { out, x: &x[..], weight: &w[..], bias: None, epilogue: Epilogue::None, save_slope: false, k, m };
            forward(&Serial, plain(&mut a[..]), &mut vec![0.0; scratch_len(k, m)], Operands::F32);
            forward(&four, plain(&mut b[..]), &mut vec![0.0; scratch_len(k, m)], Operands::F32);
            assert_eq!(a, b);
            // Backward too: both halves of dw's rows split in two on four threads.
            let g: Vec<f32> = random(&mut rng, n * m, 1.0).into_iter().map(|v| v as f32).collect();
            let dw0 = vec![0.5f32; m * k];
            let run_backward = |par: &dyn Parallel| plain_backward(par, (&x, &w, &g, &dw0), k, m, Operands::F32);
            assert_eq!(run_backward(&Serial), run_backward(&four), "{n}x{k}x{m}");
        }
    }

    /// `(dx, dw, db)` of a linear layer without an activation from `(x, w, dout, dw0)`, `dw`
    /// added to `dw0`.
    fn plain_backward(
        par: &dyn Parallel,
        (x, w, dout, dw0): (&[f32], &[f32], &[f32], &[f32]),
        k: usize,
        m: usize,
        operands: Operands,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let n = x.len() / k;
        let (mut dx, mut dw, mut db, mut dout) = (vec![0f32; n * k], dw0.to_vec(), vec![0f32; m], dout.to_vec());
        let (mut partials, mut scratch) = (vec![0f32; crate::ops::row_blocks::blocks(n) * m], vec![0f32; scratch_len(k, m)]);
        let grads =
            Backward { dx: Some(&mut dx[..]), dweight: &mut dw[..], dbias: Some(&mut db[..]), dout: &mut dout[..], x, weight: w, activation: None, k, m };
        backward(par, grads, &mut partials, &mut scratch, operands);
        (dx, dw, db)
    }

    /// With bf16 operands, forward (bias, residual; rows and columns split) and backward (dx,
    /// dw added to, over halves of several K blocks) are the f32 ones on operands rounded to
    /// bf16, within 1e-5 relative in norm (the unit sums in its own order); the bias gradient,
    /// no product, is f32's to the bit.
    #[test]
    fn bf16_operands_give_f32_results_on_rounded_operands() {
        if crate::gemm::bf16::bf16_kernel_name().is_none() {
            println!("skipped: this CPU has no AVX512-BF16");
            return;
        }
        use crate::gemm::bf16::{bf16_to_f32, round_bf16};
        let close = |what: &str, got: &[f32], want: &[f32]| {
            let err: f64 = got.iter().zip(want).map(|(&g, &w)| (f64::from(g) - f64::from(w)).powi(2)).sum();
            let norm: f64 = want.iter().map(|&w| f64::from(w).powi(2)).sum();
            assert!((err / norm).sqrt() < 1e-5, "{what}: relative error {:e}", (err / norm).sqrt());
        };
        let rounded = |v: &[f32]| v.iter().map(|&x| bf16_to_f32(round_bf16(x))).collect::<Vec<f32>>();
        let four = ReversedThreads(4);
        for (n, k, m) in [(37, 45, 70), (2 * KC + 5, 24, 33), (5, 30, 200)] {
            let mut rng = Rng::new(n as u64);
            let mut random32 = |len| random(&mut rng, len, 1.0).into_iter().map(|v| v as f32).collect::<Vec<f32>>();
            let (x, w, b, r, g, dw0) = (random32(n * k), random32(m * k), random32(m), random32(n * m), random32(n * m), random32(m * k));
            let run_forward = |x: &[f32], w: &[f32], operands| {
                let mut out = vec![0f32; n * m];
                let a =
                    Forward { out: &mut out[..], x, weight: w, bias: Some(&b[..]), epilogue: Epilogue::Residual { input: &r[..] }, save_slope: false, k, m };
                forward(&four, a, &mut vec![0.0; scratch_len(k, m)], operands);
                out
            };
            close(&format!("forward {n}x{k}x{m}"), &run_forward(&x, &w, Operands::Bf16), &run_forward(&rounded(&x), &rounded(&w), Operands::F32));
            let run_backward = |x: &[f32], w: &[f32], dout: &[f32], operands| plain_backward(&four, (x, w, dout, &dw0), k, m, operands);
            let (dx, dw, db) = run_backward(&x, &w, &g, Operands::Bf16);
            let (want_dx, want_dw, _) = run_backward(&rounded(&x), &rounded(&w), &rounded(&g), Operands::F32);
            close(&format!("dx {n}x{k}x{m}"), &dx, &want_dx);
            close(&format!("dw {n}x{k}x{m}"), &dw, &want_dw);
            assert_eq!(db, run_backward(&x, &w, &g, Operands::F32).2, "db {n}x{k}x{m}");
        }
    }

    /// Over halves of several K blocks each (the last one short), the weight gradient with
    /// `x` packed block by block has the bits of one GEMM over each half, the first added to
    /// `dw`, the second computed apart and added after.
    #[test]
    fn weight_gradient_over_k_blocks_matches_one_gemm_per_half() {
        let (n, k, m) = (4 * KC + 3, 19, 13);
        let mut rng = Rng::new(8);
        let mut random32 = |len| random(&mut rng, len, 1.0).into_iter().map(|v| v as f32).collect::<Vec<f32>>();
        let (x, dout, dw0) = (random32(n * k), random32(n * m), random32(m * k));
        let mut want = dw0.clone();
        let mut second = vec![0f32; m * k];
        for (h, out) in [&mut want, &mut second].into_iter().enumerate() {
            let rows = split_range(n, 2, h);
            // SAFETY: doutᵀ's columns `rows`, x's rows `rows`, and `out` is m x k.
            unsafe {
                let a = Strided { ptr: dout[rows.start * m..].as_ptr(), rs: 1, cs: m };
                let b = crate::gemm::Rows { ptr: x[rows.start * k..].as_ptr(), ld: k };
                crate::gemm::gemm(Shape { m, n: k, k: rows.len() }, a, b, if h == 0 { 1.0 } else { 0.0 }, RowsMut { ptr: out.as_mut_ptr(), ld: k });
            }
        }
        want.iter_mut().zip(&second).for_each(|(w, s)| *w += s);
        let mut dw = dw0;
        let mut scratch = vec![f32::NAN; scratch_len(k, m)];
        weight_gradient(&Serial, &mut dw, &dout, &x, k, m, &mut scratch, Operands::F32);
        assert_eq!(dw, want);
    }
}
