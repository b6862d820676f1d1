//! Fused causal multi-head self-attention over a fused QKV tensor, with grouped-query heads
//! and rotary position embeddings for the Llama family.
//!
//! `qkv [B, T, W]` holds q (`NH` heads), k and v (`KVH` heads each) side by side, `W = (NH +
//! 2 KVH) HS`; query head `h` uses key/value head `h / (NH / KVH)` (GPT-2: `KVH = NH`, `W =
//! 3C`). Each (batch, key/value head) pair is one task, its query heads one after another,
//! working through blocks of query rows with the GEMM: `S = Q·Kᵀ` for the block, the causal
//! softmax in place, `O = P·V`. Only one row block of scores exists at a time (in the task's
//! scratch, never a `T x T` matrix); forward saves the output `[B, T, C]` (heads
//! concatenated, as PyTorch's `transpose(1, 2).view(B, T, C)`) and each row's log-sum-exp
//! `lse [B, NH, T]`, from which backward recomputes the block's probabilities
//! (FlashAttention style). With dropout, the probabilities are masked after the softmax
//! (element `((b * NH + h) * T + i) * T + j` of the site, see [`super::dropout`]) and backward
//! draws the same mask again.
//!
//! With [`Rope`], q and k are rotated as they are loaded (Hugging Face's rotate-half layout;
//! qkv keeps the projections' values) and backward rotates dQ and dK back.
//!
//! With bf16 operands ([`Operands::Bf16`], `--precision bf16` on the CPU) the products run on
//! [`crate::gemm::bf16`]'s kernel, the probabilities and their gradients rounded as they are
//! packed (the softmax and its gradient stay f32); `Kᵀ` and `V` (backward: `Kᵀ` and `Vᵀ`) are
//! packed into bf16 panels once per task instead of transposed.

use super::dropout::{DropoutKey, Mask, Site};
use crate::config::RopeScaling;
use crate::float::{dot, max_of_first, sum_map, Float};
use crate::gemm::bf16::{self, BOperand};
use crate::gemm::{gemm_banded, transpose, Band, Operands, Rows, RowsMut, Shape, Strided, MAX_MR};
use crate::parallel::{split_range, Parallel, SharedMut};
use crate::simd::wide_dispatch;
use core::ops::Range;

/// Shape of one attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    /// Batch size `B`.
    pub batch: usize,
    /// Sequence length `T`.
    pub seq: usize,
    /// Query heads `NH`.
    pub heads: usize,
    /// Key/value heads `KVH`, dividing `NH` (GPT-2: `NH`).
    pub kv_heads: usize,
    /// Head size `HS`; `C = NH * HS`.
    pub head_size: usize,
    /// Rotary position embeddings of q and k, if any.
    pub rope: Option<Rope>,
}

impl AttentionShape {
    fn c(&self) -> usize {
        self.heads * self.head_size
    }

    /// Floating-point operations of `products` `[T, T] x HS` products over the causal pairs
    /// of every (batch, head) (a multiply-add is two), for a kernel's achieved FLOP/s: the
    /// forward's two (the scores, probabilities times values), dQ's three (the scores again,
    /// dout times values, dQ), dK and dV's four (those two, dV, dK).
    pub fn causal_flops(&self, products: f64) -> f64 {
        let pairs = (self.batch * self.heads) as f64 * self.seq as f64 * (self.seq + 1) as f64 / 2.0;
        products * 2.0 * pairs * self.head_size as f64
    }

    /// Width of a row of qkv: `(NH + 2 KVH) HS`.
    pub fn width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_size
    }

    /// Query heads per key/value head.
    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// Elements of the rotary table (see [`Rope::fill_table`]): `T x HS`, none without RoPE.
    fn table_len(&self) -> usize {
        if self.rope.is_some() {
            self.seq * self.head_size
        } else {
            0
        }
    }
}

/// Rotary position embeddings as Hugging Face's Llama applies them: pair `i` of a head
/// (elements `i` and `i + HS/2`) rotated by position × `inv_freq(i)`, the angle a product of
/// two f32 values as there.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// The base (`rope_theta`).
    pub theta: f64,
    /// Llama 3's frequency scaling, if any.
    pub scaling: Option<RopeScaling>,
}

impl Rope {
    /// Pair `i`'s inverse frequency in a head of `hs`: `theta^(-2i/hs)`, with Llama 3's
    /// scaling (Hugging Face's `_compute_llama3_parameters`), as f32.
    pub fn inv_freq(&self, i: usize, hs: usize) -> f32 {
        let f = 1.0 / libm::pow(self.theta, (2 * i) as f64 / hs as f64);
        let Some(r) = self.scaling else { return f as f32 };
        let old = r.original_max_position_embeddings as f64;
        let (low_wavelen, high_wavelen) = (old / r.low_freq_factor, old / r.high_freq_factor);
        let wavelen = 2.0 * core::f64::consts::PI / f;
        let scaled = if wavelen < high_wavelen {
            f
        } else if wavelen > low_wavelen {
            f / r.factor
        } else {
            let smooth = (old / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
            (1.0 - smooth) * f / r.factor + smooth * f
        };
        scaled as f32
    }

    /// `(cos, sin)` of position `pos`'s angle for pair `i` of a head of `hs`.
    pub fn cos_sin(&self, pos: usize, i: usize, hs: usize) -> (f64, f64) {
        let angle = (pos as f32 * self.inv_freq(i, hs)) as f64;
        (libm::cos(angle), libm::sin(angle))
    }

    /// `table [T, HS]`: row `p` holds the cosines of position `p`'s `HS/2` angles, then their
    /// sines (what the devices' attention kernels read, uploaded once).
    pub fn fill_table<T: Float>(&self, par: &dyn Parallel, table: &mut [T], hs: usize) {
        let t = table.len() / hs;
        let tasks = par.threads().min(t);
        let table_p = SharedMut(table.as_mut_ptr());
        par.run(tasks, &|task| {
            let rows = split_range(t, tasks, task);
            // SAFETY: tasks own disjoint rows.
            let mine = unsafe { table_p.slice(rows.start * hs, rows.len() * hs) };
            for (pos, row) in rows.zip(mine.chunks_exact_mut(hs)) {
                let (cos, sin) = row.split_at_mut(hs / 2);
                for (i, (c, s)) in cos.iter_mut().zip(sin).enumerate() {
                    let (cv, sv) = self.cos_sin(pos, i, hs);
                    (*c, *s) = (T::from_f64(cv), T::from_f64(sv));
                }
            }
        });
    }

    /// Rotates every head (`hs` wide) of `row` in place as position `pos` (a key written to
    /// a KV cache).
    pub fn rotate_row<T: Float>(&self, row: &mut [T], pos: usize, hs: usize) {
        for head in row.chunks_exact_mut(hs) {
            let (a, b) = head.split_at_mut(hs / 2);
            for (i, (x, y)) in a.iter_mut().zip(b).enumerate() {
                let (c, s) = self.cos_sin(pos, i, hs);
                let (c, s) = (T::from_f64(c), T::from_f64(s));
                (*x, *y) = (*x * c - *y * s, *y * c + *x * s);
            }
        }
    }
}

/// `dst = rotate(src)` for one head row (`cs`: the position's table row).
#[inline(always)]
fn rotate<T: Float>(dst: &mut [T], src: &[T], cs: &[T]) {
    let half = cs.len() / 2;
    let (cos, sin) = cs.split_at(half);
    for i in 0..half {
        let (x, y) = (src[i], src[i + half]);
        dst[i] = x * cos[i] - y * sin[i];
        dst[i + half] = y * cos[i] + x * sin[i];
    }
}

/// The inverse rotation in place (a gradient back through [`rotate`]).
#[inline(always)]
fn rotate_back<T: Float>(row: &mut [T], cs: &[T]) {
    let half = cs.len() / 2;
    let (cos, sin) = cs.split_at(half);
    for i in 0..half {
        let (x, y) = (row[i], row[i + half]);
        row[i] = x * cos[i] + y * sin[i];
        row[i + half] = y * cos[i] - x * sin[i];
    }
}

/// Query rows per block, rounded up to whole micro-tiles of the GEMM kernel's rows. Block
/// `[q0, q1)` scores keys `..q1` only, so smaller blocks skip more of the masked triangle
/// but make more GEMM calls; whole tiles keep edge tiles out. 24 (two 12-row AVX-512 tiles,
/// four 6-row AVX2 ones) and 16 in WebAssembly (four 4-row tiles) ran fastest
/// (docs/performance.md, "Kernel choices").
const QUERY_BLOCK_ROWS: usize = if cfg!(target_arch = "wasm32") { 16 } else { 24 };
/// The most query rows per block, whatever the kernel (for sizing scratch).
const MAX_QUERY_BLOCK: usize = QUERY_BLOCK_ROWS + MAX_MR - 1;

impl AttentionShape {
    fn query_block<T: Float>(&self) -> usize {
        QUERY_BLOCK_ROWS.next_multiple_of(crate::gemm::kernel::<T>().mr).min(self.seq)
    }

    /// Keys to score for a block whose queries see `keys` keys: up to the GEMM kernel's next
    /// whole column panel (the softmax masks the extra ones), since a partial panel costs
    /// more than a whole one (with AVX-512, 48 queries by 48 keys took longer than by 64).
    fn scored_keys<T: Float>(&self, keys: usize) -> usize {
        keys.next_multiple_of(crate::gemm::kernel::<T>().nr).min(self.seq)
    }

    /// Scratch one (batch, key/value head) task needs: `Kᵀ` and `Vᵀ` (`HS x T` each, or as
    /// bf16 panels: [`Self::keys_len`] each), two row blocks of scores (at most
    /// `MAX_QUERY_BLOCK x T` each) and, with RoPE, the rotated keys and one head's rotated
    /// queries (`T x HS` each).
    fn task_scratch(&self) -> usize {
        let rotated = if self.rope.is_some() { 2 * self.seq * self.head_size } else { 0 };
        2 * (self.keys_len() + self.seq * MAX_QUERY_BLOCK.min(self.seq)) + rotated
    }

    /// Elements of a task's `Kᵀ` and of its `Vᵀ`: `HS x T`, or the bf16 panels of either
    /// orientation, whichever is longer.
    fn keys_len(&self) -> usize {
        let (t, hs) = (self.seq, self.head_size);
        (t * hs).max(bf16::panels_len(hs, t)).max(bf16::panels_len(t, hs))
    }

    /// Elements of scratch [`forward`], [`backward`] and [`decode`] need: the rotary table,
    /// then every task's.
    pub fn scratch_len(&self) -> usize {
        self.table_len() + self.batch * self.kv_heads * self.task_scratch().max(self.group() * self.head_size)
    }
}

/// One task's view of qkv: batch `b`, key/value head `g`.
struct Head<'a, T> {
    qkv: &'a [T],
    s: AttentionShape,
    b: usize,
    g: usize,
}

impl<T> Head<'_, T> {
    /// Offset in a `[B, T, W]` tensor of row `i`, column `col`.
    fn at(&self, i: usize, col: usize) -> usize {
        (self.b * self.s.seq + i) * self.s.width() + col
    }
    /// The first column of query head `h`.
    fn q_col(&self, h: usize) -> usize {
        h * self.s.head_size
    }
    /// The first column of this task's key head (its value head: `+ KVH * HS`).
    fn k_col(&self) -> usize {
        self.s.c() + self.g * self.s.head_size
    }
    fn v_col(&self) -> usize {
        self.k_col() + self.s.kv_heads * self.s.head_size
    }
    /// Rows `i..` from column `col` as a GEMM operand (row stride W).
    fn part(&self, i: usize, col: usize) -> Strided<T> {
        Strided { ptr: self.qkv[self.at(i, col)..].as_ptr(), rs: self.s.width(), cs: 1 }
    }
    /// Query head `h` or the key head (`col`) as the GEMM reads it: straight from qkv, or
    /// rotated into `buf [T, HS]` with the rotary `table`.
    fn loaded(&self, col: usize, table: &[T], buf: &mut [T]) -> Strided<T>
    where
        T: Float,
    {
        if self.s.rope.is_none() {
            return self.part(0, col);
        }
        let hs = self.s.head_size;
        for (i, (dst, cs)) in buf.chunks_exact_mut(hs).zip(table.chunks_exact(hs)).enumerate() {
            rotate(dst, &self.qkv[self.at(i, col)..self.at(i, col) + hs], cs);
        }
        Strided { ptr: buf.as_ptr(), rs: hs, cs: 1 }
    }
}

/// A task's scratch: `Kᵀ`, `Vᵀ`, the two score blocks, the rotated keys and queries.
struct TaskScratch<'a, T> {
    kt: &'a mut [T],
    vt: &'a mut [T],
    p: &'a mut [T],
    dp: &'a mut [T],
    k_rot: &'a mut [T],
    q_rot: &'a mut [T],
}

impl<'a, T> TaskScratch<'a, T> {
    fn split(mine: &'a mut [T], s: &AttentionShape, qb: usize) -> Self {
        let t = s.seq;
        let (kt, rest) = mine.split_at_mut(s.keys_len());
        let (vt, rest) = rest.split_at_mut(s.keys_len());
        let (p, rest) = rest.split_at_mut(MAX_QUERY_BLOCK.min(t) * t);
        let (dp, rest) = rest.split_at_mut(MAX_QUERY_BLOCK.min(t) * t);
        let rotated = if s.rope.is_some() { t * s.head_size } else { 0 };
        let (k_rot, rest) = rest.split_at_mut(rotated);
        debug_assert!(qb <= MAX_QUERY_BLOCK.min(t));
        TaskScratch { kt, vt, p, dp, k_rot, q_rot: &mut rest[..rotated] }
    }
}

/// A B operand of attention's products: f32 rows, or, with bf16 operands, f32 values the
/// product rounds as it packs them or panels packed once per task ([`pack_panels`]).
#[derive(Clone, Copy)]
enum B<T> {
    Rows(Rows<T>),
    Bf16(BOperand),
}

impl<T: Float> B<T> {
    /// `m` (adjacent columns) as products in `operands` read it.
    fn of(m: Strided<T>, operands: Operands) -> Self {
        match operands {
            Operands::F32 => B::Rows(m.rows()),
            Operands::Bf16 => B::Bf16(BOperand::Values(bf16::as_f32(m))),
        }
    }
}

/// B `[k x n]` (`b`, a unit stride) packed into bf16 panels in `out`'s storage, on this
/// thread, once for all of a task's products that read it.
fn pack_panels<T: Float>(b: Strided<T>, k: usize, n: usize, out: &mut [T]) -> B<T> {
    // SAFETY: B's k x n values are the task's view of qkv (caller).
    B::Bf16(unsafe { bf16::pack_panels_of(&crate::parallel::Serial, b, k, n, out) })
}

/// `m`'s `t x hs` values transposed into `out` (`hs x t`), as f32 products read them.
fn transposed<T: Float>(m: Strided<T>, t: usize, hs: usize, out: &mut [T]) -> B<T> {
    // SAFETY: `m` addresses t rows of hs values, `rs` apart (the task's view of qkv).
    transpose(unsafe { core::slice::from_raw_parts(m.ptr, (t - 1) * m.rs + hs) }, t, hs, m.rs, out);
    B::Rows(Rows { ptr: out.as_ptr(), ld: t })
}

/// `c = a·b + beta·c`, `a` zero outside `band`, in the precision `b` is given in.
///
/// # Safety
/// As [`gemm_banded`]'s (or [`bf16::gemm_bf16`]'s).
unsafe fn product<T: Float>(shape: Shape, a: Strided<T>, b: B<T>, beta: T, c: RowsMut<T>, band: Band) {
    // SAFETY: forwarded.
    unsafe {
        match b {
            B::Rows(b) => gemm_banded(shape, a, b, beta, c, band),
            B::Bf16(b) => bf16::product_of(shape, a, b, beta, None, c, band),
        }
    }
}

/// `row[j] = exp(row[j]·scale − shift)` for the first `live` entries and 0 after them. The
/// exponentials run over whole 8-lane chunks (past `live` they are computed, then zeroed), so
/// short causal rows vectorise too; 16-lane chunks would compute more of them past `live`.
#[inline(always)]
fn exp_causal_row<T: Float>(row: &mut [T], live: usize, scale: T, shift: T) {
    let padded = live.next_multiple_of(8).min(row.len());
    for x in &mut row[..padded] {
        *x = (*x * scale - shift).exp();
    }
    row[live..].fill(T::ZERO);
}

#[inline(always)]
fn causal_softmax_rows<T: Float>(p: &mut [T], t: usize, rows: Range<usize>, scale: T, lse: &mut [T]) {
    // Over the block's rows three times: the maxima, the exponentials, the sums. Row by
    // row, each row's exponentials waited for its maximum, and its sum for them.
    let padded = |i: usize| (i + 1).next_multiple_of(16).min(t);
    for (r, i) in rows.clone().enumerate() {
        lse[i] = max_of_first(&p[r * t..r * t + padded(i)], i + 1) * scale;
    }
    for (r, i) in rows.clone().enumerate() {
        exp_causal_row(&mut p[r * t..(r + 1) * t], i + 1, scale, lse[i]);
    }
    for (r, i) in rows.enumerate() {
        // Sums and products over whole 16-lane chunks (zero past key `i`), so each is one
        // vector loop (fixed order: deterministic).
        let row = &mut p[r * t..r * t + padded(i)];
        let sum = sum_map(row, |x| x);
        let inv = T::ONE / sum;
        for x in row {
            *x *= inv;
        }
        lse[i] += sum.ln();
    }
}

#[inline(always)]
fn causal_softmax_recompute_rows<T: Float>(p: &mut [T], t: usize, rows: Range<usize>, scale: T, lse: &[T]) {
    for (r, i) in rows.enumerate() {
        exp_causal_row(&mut p[r * t..(r + 1) * t], i + 1, scale, lse[i]);
    }
}

wide_dispatch!(
    /// Turns the raw scores of query rows `rows` (block row `r` is query `rows.start + r`, row
    /// stride `t`) into causal softmax probabilities in place: scaled, masked to keys `<= i`,
    /// normalised; stores each row's log-sum-exp in `lse[i]`.
    fn causal_softmax<T>(p: &mut [T], t: usize, rows: Range<usize>, scale: T, lse: &mut [T]) => causal_softmax_rows
);
wide_dispatch!(
    /// Backward's twin of [`causal_softmax`]: the probabilities again, from the saved `lse`.
    fn causal_softmax_recompute<T>(p: &mut [T], t: usize, rows: Range<usize>, scale: T, lse: &[T]) => causal_softmax_recompute_rows
);

/// One head's rows of the output and of its gradient (for [`softmax_grad`]): row `r` is
/// `hs` values at `r * stride` of each.
#[derive(Clone, Copy)]
struct HeadRows<'a, T> {
    d_o: &'a [T],
    o: &'a [T],
    stride: usize,
    hs: usize,
}

impl<T: Float> HeadRows<'_, T> {
    /// `rowsum(dO ⊙ O)` of row `r`.
    #[inline(always)]
    fn dot(&self, r: usize) -> T {
        let row = r * self.stride..r * self.stride + self.hs;
        dot(&self.d_o[row.clone()], &self.o[row])
    }
}

#[inline(always)]
fn softmax_grad_rows<T: Float>(ds: &mut [T], p: &[T], t: usize, keys: usize, outputs: HeadRows<'_, T>, scale: T) {
    for r in 0..ds.len() / t {
        let delta = outputs.dot(r);
        for (dsj, &pj) in ds[r * t..r * t + keys].iter_mut().zip(&p[r * t..r * t + keys]) {
            *dsj = pj * (*dsj - delta) * scale;
        }
    }
}

wide_dispatch!(
    /// `dS = P ⊙ (dP − rowsum(dO ⊙ O)) · scale` in place over `ds` (holding dP), for row blocks
    /// of stride `t` with `keys` live columns, `outputs` the block's rows of dO and O.
    fn softmax_grad<T>(ds: &mut [T], p: &[T], t: usize, keys: usize, outputs: HeadRows<'_, T>, scale: T) => softmax_grad_rows
);

/// Forward's tensors, `W` written and `R` read (slices here, device views on the GPU).
pub struct Forward<W, R> {
    /// Output `[B, T, C]`.
    pub out: W,
    /// Each query row's log-sum-exp `[B, NH, T]`, saved for backward.
    pub lse: W,
    /// Input `[B, T, 3C]`.
    pub qkv: R,
    /// Shape.
    pub shape: AttentionShape,
    /// Dropout on the probabilities, if any.
    pub dropout: Option<Site>,
}

/// Backward's tensors, `W` written and `R` read.
pub struct Backward<W, R> {
    /// Gradient of `qkv` `[B, T, 3C]` (overwritten).
    pub dqkv: W,
    /// Gradient of the output `[B, T, C]`.
    pub dout: R,
    /// Forward's input `[B, T, 3C]`.
    pub qkv: R,
    /// Forward's output `[B, T, C]`.
    pub out: R,
    /// Forward's saved log-sum-exp `[B, NH, T]`.
    pub lse: R,
    /// Shape.
    pub shape: AttentionShape,
    /// Forward's dropout, if any.
    pub dropout: Option<Site>,
}

/// The mask of `site` in micro-batch `key` (which a kernel with dropout needs).
fn mask(site: Option<Site>, key: Option<DropoutKey>) -> Option<Mask> {
    site.map(|site| Mask { site, key: key.expect("attention with dropout needs the micro-batch's dropout key") })
}

/// Drops probabilities (or their gradients) of query rows `rows` of a block (block row `r`
/// is query `rows.start + r`, stride `t`) of (batch, head) task `task`: keys `..= i` of row `i`.
fn drop_rows<T: Float>(mask: Option<Mask>, p: &mut [T], t: usize, rows: Range<usize>, task: usize) {
    if let Some(mask) = mask {
        for (r, i) in rows.enumerate() {
            mask.apply_in_place(&mut p[r * t..r * t + i + 1], ((task * t + i) * t) as u64);
        }
    }
}

/// Forward: `out = dropout(softmax(q·kᵀ / sqrt(HS) + causal mask)) · v` per head; saves
/// `lse`. `scratch` holds at least [`AttentionShape::scratch_len`] elements; `key` is the
/// micro-batch's dropout key (needed with dropout); the products' operands are `operands`'.
pub fn forward<T: Float>(par: &dyn Parallel, a: Forward<&mut [T], &[T]>, scratch: &mut [T], key: Option<DropoutKey>, operands: Operands) {
    let Forward { out, lse, qkv, shape: s, dropout } = a;
    let mask = mask(dropout, key);
    let (t, hs, c) = (s.seq, s.head_size, s.c());
    assert!(qkv.len() == s.batch * t * s.width() && out.len() == s.batch * t * c && lse.len() == s.batch * s.heads * t);
    assert!(scratch.len() >= s.scratch_len());
    let (table, scratch) = scratch.split_at_mut(s.table_len());
    if let Some(rope) = s.rope {
        rope.fill_table(par, table, hs);
    }
    let table: &[T] = table;
    let scale = T::from_f64(1.0 / (hs as f64).sqrt());
    let (out_p, lse_p, scratch_p) = (SharedMut(out.as_mut_ptr()), SharedMut(lse.as_mut_ptr()), SharedMut(scratch.as_mut_ptr()));
    par.run(s.batch * s.kv_heads, &|task| {
        let head = Head { qkv, s, b: task / s.kv_heads, g: task % s.kv_heads };
        let qb = s.query_block::<T>();
        // SAFETY: task (b, g) owns its scratch, and lse[b, h, :] and head h's output columns
        // of its query heads h.
        let sc = TaskScratch::split(unsafe { scratch_p.slice(task * s.task_scratch(), s.task_scratch()) }, &s, qb);
        let p = sc.p;
        let keys = head.loaded(head.k_col(), table, sc.k_rot);
        let values = head.part(0, head.v_col());
        // Kᵀ and V as the products read them.
        let (keys_t, values) = match operands {
            Operands::F32 => (transposed(keys, t, hs, sc.kt), B::Rows(values.rows())),
            Operands::Bf16 => (pack_panels(keys.t(), hs, t, sc.kt), pack_panels(values, t, hs, sc.vt)),
        };
        for h in head.g * s.group()..(head.g + 1) * s.group() {
            let bh = head.b * s.heads + h;
            let q = head.loaded(head.q_col(h), table, &mut *sc.q_rot);
            // SAFETY: lse[b, h, :] is this task's.
            let lse = unsafe { lse_p.slice(bh * t, t) };
            for q0 in (0..t).step_by(qb) {
                let rows = q0..(q0 + qb).min(t);
                let keys = rows.end;
                // SAFETY: the operands are the block's rows of q, Kᵀ's first columns (at most
                // t), the block's rows of p (stride t), and of head h's output (stride C).
                unsafe {
                    let scores = RowsMut { ptr: p.as_mut_ptr(), ld: t };
                    let q_rows = Strided { ptr: q.ptr.add(q0 * q.rs), ..q };
                    product(Shape { m: rows.len(), n: s.scored_keys::<T>(keys), k: hs }, q_rows, keys_t, T::ZERO, scores, Band::Full);
                    causal_softmax(p, t, rows.clone(), scale, lse);
                    drop_rows(mask, p, t, rows.clone(), bh);
                    let probs = Strided { ptr: p.as_ptr(), rs: t, cs: 1 };
                    let o = RowsMut { ptr: out_p.ptr().add((head.b * t + q0) * c + h * hs), ld: c };
                    // Query q0 + r sees keys ..q0 + r + 1: the rest of its row of P is zero.
                    let by_query = Shape { m: rows.len(), n: hs, k: keys };
                    product(by_query, probs, values, T::ZERO, o, Band::Below(q0 + 1));
                }
            }
        }
    });
}

/// Backward: writes (overwrites) `dqkv [B, T, W]` from `dout [B, T, C]`, using the forward's
/// `out` and `lse` (and forward's dropout `key`). Each (batch, key/value head) pair is one
/// task, its query heads' dK and dV summed in head order, so no two tasks touch one element.
/// The products' operands are `operands`'.
pub fn backward<T: Float>(par: &dyn Parallel, a: Backward<&mut [T], &[T]>, scratch: &mut [T], key: Option<DropoutKey>, operands: Operands) {
    let Backward { dqkv, dout, qkv, out, lse, shape: s, dropout } = a;
    let mask = mask(dropout, key);
    let (t, hs, c, w) = (s.seq, s.head_size, s.c(), s.width());
    assert!(dqkv.len() == qkv.len() && dout.len() == out.len() && qkv.len() == s.batch * t * w);
    assert!(scratch.len() >= s.scratch_len());
    let (table, scratch) = scratch.split_at_mut(s.table_len());
    if let Some(rope) = s.rope {
        rope.fill_table(par, table, hs);
    }
    let table: &[T] = table;
    let scale = T::from_f64(1.0 / (hs as f64).sqrt());
    let (d_p, scratch_p) = (SharedMut(dqkv.as_mut_ptr()), SharedMut(scratch.as_mut_ptr()));
    par.run(s.batch * s.kv_heads, &|task| {
        let head = Head { qkv, s, b: task / s.kv_heads, g: task % s.kv_heads };
        let qb = s.query_block::<T>();
        // SAFETY: task (b, g) owns its scratch, and in batch b the columns of dqkv of its key
        // and value heads and of their query heads.
        let sc = TaskScratch::split(unsafe { scratch_p.slice(task * s.task_scratch(), s.task_scratch()) }, &s, qb);
        let (p, dp) = (sc.p, sc.dp);
        let k = head.loaded(head.k_col(), table, sc.k_rot);
        let v = head.part(0, head.v_col());
        // Kᵀ and Vᵀ as the products read them.
        let (keys_t, values_t) = match operands {
            Operands::F32 => (transposed(k, t, hs, sc.kt), transposed(v, t, hs, sc.vt)),
            Operands::Bf16 => (pack_panels(k.t(), hs, t, sc.kt), pack_panels(v.t(), hs, t, sc.vt)),
        };
        let d_at = |i: usize, col: usize| RowsMut { ptr: d_p.ptr().wrapping_add(head.at(i, col)), ld: w };
        for (nth, h) in (head.g * s.group()..(head.g + 1) * s.group()).enumerate() {
            let bh = head.b * s.heads + h;
            let q = head.loaded(head.q_col(h), table, &mut *sc.q_rot);
            // Last block of the first head first: it sees every key, so it writes all of dK
            // and dV (nothing to clear beforehand) and every later block adds to them.
            for q0 in (0..t).step_by(qb).rev() {
                let rows = q0..(q0 + qb).min(t);
                let (n, keys) = (rows.len(), rows.end);
                let beta_kv = if keys == t && nth == 0 { T::ZERO } else { T::ONE };
                let d_o = Strided { ptr: dout[(head.b * t + q0) * c + h * hs..].as_ptr(), rs: c, cs: 1 };
                // SAFETY: operands as in forward; dp rows have stride t; dq/dk/dv are this
                // task's columns of dqkv (stride W), disjoint from everything read.
                unsafe {
                    let q_rows = Strided { ptr: q.ptr.add(q0 * q.rs), ..q };
                    let scored = s.scored_keys::<T>(keys);
                    let scores = Shape { m: n, n: scored, k: hs };
                    product(scores, q_rows, keys_t, T::ZERO, RowsMut { ptr: p.as_mut_ptr(), ld: t }, Band::Full);
                    causal_softmax_recompute(p, t, rows.clone(), scale, &lse[bh * t..(bh + 1) * t]);
                    product(scores, d_o, values_t, T::ZERO, RowsMut { ptr: dp.as_mut_ptr(), ld: t }, Band::Full);
                    // With dropout that is the gradient of the dropped probabilities: through
                    // the mask to the probabilities', and P itself dropped for dV (dS needs
                    // it whole).
                    drop_rows(mask, dp, t, rows.clone(), bh);
                    let o0 = (head.b * t + q0) * c + h * hs;
                    let outputs = HeadRows { d_o: &dout[o0..o0 + (n - 1) * c + hs], o: &out[o0..o0 + (n - 1) * c + hs], stride: c, hs };
                    softmax_grad(&mut dp[..n * t], p, t, keys, outputs, scale);
                    drop_rows(mask, p, t, rows.clone(), bh);
                    let p_t = Strided { ptr: p.as_ptr(), rs: 1, cs: t };
                    let ds_t = Strided { ptr: dp.as_ptr(), rs: 1, cs: t };
                    let ds = Strided { ptr: dp.as_ptr(), rs: t, cs: 1 };
                    // dV[..keys] (+)= Pᵀ · dO;  dK[..keys] (+)= dSᵀ · Q;  dQ[rows] = dS · K. P
                    // and dS are zero past each query's keys: key j takes no query before it.
                    let (seen_from, sees) = (Band::Above(q0), Band::Below(q0 + 1));
                    let (by_key, by_query) = (Shape { m: keys, n: hs, k: n }, Shape { m: n, n: hs, k: keys });
                    product(by_key, p_t, B::of(d_o, operands), beta_kv, d_at(0, head.v_col()), seen_from);
                    product(by_key, ds_t, B::of(q_rows, operands), beta_kv, d_at(0, head.k_col()), seen_from);
                    product(by_query, ds, B::of(k, operands), T::ZERO, d_at(q0, head.q_col(h)), sees);
                }
            }
            if s.rope.is_some() {
                // SAFETY: head h's columns of dqkv in batch b are this task's.
                unsafe { rotate_back_rows(d_p, &head, head.q_col(h), table) };
            }
        }
        if s.rope.is_some() {
            // SAFETY: the key head's columns of dqkv in batch b are this task's.
            unsafe { rotate_back_rows(d_p, &head, head.k_col(), table) };
        }
    });
}

/// Rotates the gradient rows of one head (`col`) of `dqkv` back through the rotary table.
///
/// # Safety
/// Those columns of the task's batch are the caller's alone.
unsafe fn rotate_back_rows<T: Float>(dqkv: SharedMut<T>, head: &Head<'_, T>, col: usize, table: &[T]) {
    let hs = head.s.head_size;
    for (i, cs) in table.chunks_exact(hs).enumerate() {
        // SAFETY: forwarded to the caller.
        rotate_back(unsafe { dqkv.slice(head.at(i, col), hs) }, cs);
    }
}

/// One layer's key/value cache for decoding: keys then values, `[2, T, KVH * HS]` (heads
/// side by side in each row, as in qkv; the keys rotated where the model has RoPE).
pub struct KvCache<'a, T> {
    /// The cache.
    pub rows: &'a mut [T],
    /// Positions it holds (`T`).
    pub len: usize,
}

/// Forward of one new token at position `pos` (batch 1, sequence 1) against the cache:
/// its key and value are written at `pos`, then each head's output is the softmax over
/// keys `..= pos` of its scores times the values (one pass, the running maximum rescaling the
/// sums). `lse [NH]` gets each head's log-sum-exp. The decoding twin of [`forward`]: the
/// same function of the same keys and values, summed in another order. `scratch` holds at
/// least [`AttentionShape::scratch_len`] elements (the rotated queries).
pub fn decode<T: Float>(par: &dyn Parallel, a: Forward<&mut [T], &[T]>, cache: KvCache<'_, T>, pos: usize, scratch: &mut [T]) {
    let Forward { out, lse, qkv, shape: s, .. } = a;
    let (hs, c, kv_c) = (s.head_size, s.c(), s.kv_heads * s.head_size);
    assert!(s.batch == 1 && s.seq == 1 && qkv.len() == s.width() && cache.rows.len() == 2 * cache.len * kv_c && pos < cache.len);
    assert!(scratch.len() >= c);
    let (keys, values) = cache.rows.split_at_mut(cache.len * kv_c);
    keys[pos * kv_c..(pos + 1) * kv_c].copy_from_slice(&qkv[c..c + kv_c]);
    values[pos * kv_c..(pos + 1) * kv_c].copy_from_slice(&qkv[c + kv_c..]);
    let queries = &mut scratch[..c];
    queries.copy_from_slice(&qkv[..c]);
    if let Some(rope) = s.rope {
        rope.rotate_row(&mut keys[pos * kv_c..(pos + 1) * kv_c], pos, hs);
        rope.rotate_row(queries, pos, hs);
    }
    let (keys, values, queries): (&[T], &[T], &[T]) = (keys, values, queries);
    let scale = T::from_f64(1.0 / (hs as f64).sqrt());
    let (out_p, lse_p) = (SharedMut(out.as_mut_ptr()), SharedMut(lse.as_mut_ptr()));
    par.run(s.heads, &|h| {
        let q = &queries[h * hs..(h + 1) * hs];
        let g = h / s.group();
        // SAFETY: head h owns its columns of the output and its log-sum-exp.
        let (o, lse) = unsafe { (out_p.slice(h * hs, hs), lse_p.slice(h, 1)) };
        o.fill(T::ZERO);
        let (mut max, mut sum) = (T::from_f64(f64::NEG_INFINITY), T::ZERO);
        for j in 0..=pos {
            let at = j * kv_c + g * hs;
            let score = dot(q, &keys[at..at + hs]) * scale;
            if score > max {
                let rescale = (max - score).exp();
                sum *= rescale;
                for x in o.iter_mut() {
                    *x *= rescale;
                }
                max = score;
            }
            let p = (score - max).exp();
            sum += p;
            for (x, &v) in o.iter_mut().zip(&values[at..at + hs]) {
                *x += p * v;
            }
        }
        let inv = T::ONE / sum;
        for x in o.iter_mut() {
            *x *= inv;
        }
        lse[0] = max + sum.ln();
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::*;
    use crate::parallel::Serial;
    use crate::rng::Rng;

    const SHAPE: AttentionShape = AttentionShape { batch: 2, seq: 5, heads: 3, kv_heads: 3, head_size: 2, rope: None };
    /// Longer than one query block of any kernel, so later blocks see keys of earlier ones.
    const LONG: AttentionShape = AttentionShape { batch: 1, seq: MAX_QUERY_BLOCK + 7, heads: 2, kv_heads: 2, head_size: 3, rope: None };
    /// Grouped queries (three per key/value head) with rotary embeddings, Llama 3's scaling
    /// with every band of frequencies in use (a small original context).
    const GROUPED: AttentionShape = AttentionShape {
        batch: 2,
        seq: MAX_QUERY_BLOCK + 3,
        heads: 6,
        kv_heads: 2,
        head_size: 8,
        rope: Some(Rope {
            theta: 500.0,
            scaling: Some(RopeScaling { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position_embeddings: 64 }),
        }),
    };
    /// Rotary embeddings without scaling, one key/value head.
    const ROTARY: AttentionShape = AttentionShape { batch: 1, seq: 6, heads: 2, kv_heads: 1, head_size: 4, rope: Some(Rope { theta: 10000.0, scaling: None }) };
    const SHAPES: [AttentionShape; 4] = [SHAPE, LONG, GROUPED, ROTARY];
    /// Dropout on the probabilities, and its key.
    const DROPOUT: Option<Site> = Some(Site { id: 4, threshold: 1 << 30 });
    const KEY: Option<DropoutKey> = Some(DropoutKey { seed: 11, draw: 3 });

    #[test]
    fn gradients_match_finite_differences() {
        for dropout in [None, DROPOUT] {
            for s in SHAPES {
                check_gradients(s, dropout);
            }
        }
    }

    #[test]
    fn matches_explicit_softmax_and_is_causal() {
        for dropout in [None, DROPOUT] {
            for s in SHAPES {
                check_against_explicit_softmax(s, dropout);
            }
        }
    }

    /// The f32 build (this CPU's GEMM kernel, whose query blocks and scored key panels
    /// differ from the portable f64 kernel's) computes what the f64 build does, to f32
    /// rounding, over three query blocks of any kernel.
    #[test]
    fn f32_kernel_matches_f64() {
        for s in [AttentionShape { batch: 2, seq: 2 * MAX_QUERY_BLOCK + 5, heads: 2, kv_heads: 2, head_size: 8, rope: None }, GROUPED] {
            check_f32_against_f64(s);
        }
    }

    /// With bf16 operands, forward's output and backward's `dqkv` are f32's to bf16's
    /// rounding of the products' operands (the probabilities and their gradients included):
    /// within 1e-2 relative in norm, and not f32's bits. Shapes: a head of two bf16 panels
    /// over three query blocks, grouped heads with RoPE, few keys (one partial panel); with
    /// and without dropout.
    #[test]
    fn bf16_operands_follow_f32() {
        if bf16::bf16_kernel_name().is_none() {
            println!("skipped: this CPU has no AVX512-BF16");
            return;
        }
        let wide = AttentionShape { batch: 2, seq: 2 * MAX_QUERY_BLOCK + 5, heads: 2, kv_heads: 2, head_size: 64, rope: None };
        for s in [wide, GROUPED, ROTARY] {
            for dropout in [None, DROPOUT] {
                let mut rng = Rng::new(13);
                let mut random32 = |len, scale| random(&mut rng, len, scale).into_iter().map(|x| x as f32).collect::<Vec<f32>>();
                let (qkv, g) = (random32(s.batch * s.seq * s.width(), 1.5), random32(s.batch * s.seq * s.c(), 1.0));
                let (out32, dqkv32) = run_both_passes_in(s, &qkv, &g, dropout, Operands::F32);
                let (out, dqkv) = run_both_passes_in(s, &qkv, &g, dropout, Operands::Bf16);
                for (what, got, want) in [("out", out, out32), ("dqkv", dqkv, dqkv32)] {
                    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
                    let diff: Vec<f64> = got.iter().zip(&want).map(|(&a, &b)| f64::from(a) - f64::from(b)).collect();
                    let rel = norm(&diff) / norm(&want.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>());
                    assert!(rel < 1e-2 && rel > 0.0, "{s:?}, dropout {}: {what} relative difference {rel:e}", dropout.is_some());
                }
            }
        }
    }

    fn check_f32_against_f64(s: AttentionShape) {
        let (n, c) = (s.batch * s.seq, s.c());
        let mut rng = Rng::new(9);
        // Inputs that f32 holds exactly, so only the arithmetic differs.
        let mut random32 = |len, scale| random(&mut rng, len, scale).into_iter().map(|x| x as f32).collect::<Vec<f32>>();
        let (qkv, g) = (random32(n * s.width(), 1.5), random32(n * c, 1.0));
        let widen = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        let (out32, dqkv32) = run_both_passes(s, &qkv, &g, DROPOUT);
        let (out, dqkv) = run_both_passes(s, &widen(&qkv), &widen(&g), DROPOUT);
        for (what, got, want) in [("out", widen(&out32), out), ("dqkv", widen(&dqkv32), dqkv)] {
            let scale = want.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!((a - b).abs() <= 1e-5 * scale, "{what}[{i}]: f32 {a} vs f64 {b}");
            }
        }
    }

    /// Forward's output and backward's `dqkv` (from a `dqkv` holding garbage).
    fn run_both_passes<T: Float>(s: AttentionShape, qkv: &[T], g: &[T], dropout: Option<Site>) -> (Vec<T>, Vec<T>) {
        run_both_passes_in(s, qkv, g, dropout, Operands::F32)
    }

    /// [`run_both_passes`] with the products' operands in `operands`.
    fn run_both_passes_in<T: Float>(s: AttentionShape, qkv: &[T], g: &[T], dropout: Option<Site>, operands: Operands) -> (Vec<T>, Vec<T>) {
        let (n, c) = (s.batch * s.seq, s.c());
        let (mut out, mut lse, mut dqkv) = (vec![T::ZERO; n * c], vec![T::ZERO; s.batch * s.heads * s.seq], vec![T::from_f64(7.0); n * s.width()]);
        forward(&Serial, Forward { out: &mut out, lse: &mut lse, qkv, shape: s, dropout }, &mut vec![T::ZERO; s.scratch_len()], KEY, operands);
        let a = Backward { dqkv: &mut dqkv[..], dout: g, qkv, out: &out, lse: &lse, shape: s, dropout };
        backward(&Serial, a, &mut vec![T::ZERO; s.scratch_len()], KEY, operands);
        (out, dqkv)
    }

    fn check_gradients(s: AttentionShape, dropout: Option<Site>) {
        let (n, c) = (s.batch * s.seq, s.c());
        let mut rng = Rng::new(5);
        let mut qkv = random(&mut rng, n * s.width(), 1.5);
        let g = random(&mut rng, n * c, 1.0);
        let (_, dqkv) = run_both_passes(s, &qkv, &g, dropout);
        let (mut out, mut lse) = (vec![0.0; n * c], vec![0.0; s.batch * s.heads * s.seq]);
        let numeric = numeric_grad(&mut qkv, |x| {
            forward(&Serial, Forward { out: &mut out, lse: &mut lse, qkv: x, shape: s, dropout }, &mut vec![0.0; s.scratch_len()], KEY, Operands::F32);
            weighted_sum(&out, &g)
        });
        assert_close("dqkv", &dqkv, &numeric);
    }

    /// Decoding position by position against a cache gives what the whole sequence's forward
    /// gives at each position.
    #[test]
    fn decoding_with_a_cache_matches_the_forward() {
        for s in
            [AttentionShape { batch: 1, seq: MAX_QUERY_BLOCK + 5, heads: 3, kv_heads: 3, head_size: 4, rope: None }, AttentionShape { batch: 1, ..GROUPED }]
        {
            check_decoding(s);
        }
    }

    fn check_decoding(s: AttentionShape) {
        let (t, c, w) = (s.seq, s.c(), s.width());
        let qkv = random(&mut Rng::new(12), t * w, 2.0);
        let (mut out, mut lse) = (vec![0.0; t * c], vec![0.0; s.heads * t]);
        forward(&Serial, Forward { out: &mut out, lse: &mut lse, qkv: &qkv, shape: s, dropout: None }, &mut vec![0.0; s.scratch_len()], None, Operands::F32);
        let mut cache = vec![f64::NAN; 2 * t * s.kv_heads * s.head_size];
        let one = AttentionShape { seq: 1, ..s };
        let mut scratch = vec![0.0; one.scratch_len()];
        for pos in 0..t {
            let (mut o, mut l) = (vec![0.0; c], vec![0.0; s.heads]);
            let a = Forward { out: &mut o[..], lse: &mut l[..], qkv: &qkv[pos * w..(pos + 1) * w], shape: one, dropout: None };
            decode(&Serial, a, KvCache { rows: &mut cache, len: t }, pos, &mut scratch);
            for (j, (x, y)) in o.iter().zip(&out[pos * c..(pos + 1) * c]).enumerate() {
                assert!((x - y).abs() < 1e-12, "position {pos}, column {j}: {x} vs {y}");
            }
            for h in 0..s.heads {
                assert!((l[h] - lse[h * t + pos]).abs() < 1e-12);
            }
        }
    }

    /// Against the textbook formula (Hugging Face's `apply_rotary_pos_emb` and `repeat_kv`
    /// with RoPE and grouped heads), each probability dropped by its own element's mask.
    fn check_against_explicit_softmax(s: AttentionShape, dropout: Option<Site>) {
        let (t, hs, c, w) = (s.seq, s.head_size, s.c(), s.width());
        let mut rng = Rng::new(6);
        let qkv = random(&mut rng, s.batch * t * w, 2.0);
        let (mut out, mut lse) = (vec![0.0; s.batch * t * c], vec![0.0; s.batch * s.heads * t]);
        forward(&Serial, Forward { out: &mut out, lse: &mut lse, qkv: &qkv, shape: s, dropout }, &mut vec![0.0; s.scratch_len()], KEY, Operands::F32);
        let kept = |b: usize, h: usize, i: usize, j: usize| match mask(dropout, KEY) {
            Some(m) if m.keeps((((b * s.heads + h) * t + i) * t + j) as u64) => m.site.scale(),
            Some(_) => 0.0,
            None => 1.0,
        };
        for b in 0..s.batch {
            for h in 0..s.heads {
                for i in 0..t {
                    let g = h / (s.heads / s.kv_heads);
                    let col = |part: usize| [h * hs, c + g * hs, c + s.kv_heads * hs + g * hs][part];
                    let raw = |r: usize, part: usize, d: usize| qkv[(b * t + r) * w + col(part) + d];
                    // rotate_half: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), per pair.
                    let at = |r: usize, part: usize, d: usize| match s.rope {
                        Some(rope) if part < 2 => {
                            let half = hs / 2;
                            let (cos, sin) = rope.cos_sin(r, d % half, hs);
                            let partner = if d < half { -raw(r, part, d + half) } else { raw(r, part, d - half) };
                            raw(r, part, d) * cos + partner * sin
                        }
                        _ => raw(r, part, d),
                    };
                    let scores: Vec<f64> = (0..=i).map(|j| (0..hs).map(|d| at(i, 0, d) * at(j, 1, d)).sum::<f64>() / (hs as f64).sqrt()).collect();
                    let z: f64 = scores.iter().map(|s| s.exp()).sum();
                    assert!((lse[(b * s.heads + h) * t + i] - z.ln()).abs() < 1e-12);
                    for d in 0..hs {
                        let expect: f64 = scores.iter().enumerate().map(|(j, s)| s.exp() / z * kept(b, h, i, j) * at(j, 2, d)).sum();
                        assert!((out[(b * t + i) * c + h * hs + d] - expect).abs() < 1e-12);
                    }
                }
            }
        }
    }
}
