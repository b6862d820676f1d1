//! Fused causal multi-head self-attention over a fused QKV tensor.
//!
//! `qkv [B, T, 3C]` holds q, k, v side by side; head `h` uses columns `h*HS..(h+1)*HS` of
//! each. Each (batch, head) pair is one task working through blocks of query rows with the
//! GEMM: `S = Q·Kᵀ` for the block, the causal softmax in place, `O = P·V`. Only one row block
//! of scores exists at a time (in the task's scratch, never a `T x T` matrix); forward saves
//! the output `[B, T, C]` (heads concatenated, as PyTorch's `transpose(1, 2).view(B, T, C)`)
//! and each row's log-sum-exp `lse [B, NH, T]`, from which backward recomputes the block's
//! probabilities (FlashAttention style). With dropout, the probabilities are masked after
//! the softmax (element `((b * NH + h) * T + i) * T + j` of the site, see
//! [`super::dropout`]) and backward draws the same mask again.

use super::dropout::{DropoutKey, Mask, Site};
use crate::float::{dot, max_of_first, sum_map, Float};
use crate::gemm::{gemm, gemm_banded, transpose, Band, Rows, RowsMut, Shape, Strided, MAX_MR};
use crate::parallel::{Parallel, SharedMut};
use crate::simd::wide_dispatch;
use core::ops::Range;

/// Shape of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Batch size `B`.
    pub batch: usize,
    /// Sequence length `T`.
    pub seq: usize,
    /// Heads `NH`.
    pub heads: usize,
    /// Head size `HS`; `C = NH * HS`.
    pub head_size: usize,
}

impl AttentionShape {
    fn c(&self) -> usize {
        self.heads * self.head_size
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

    /// Scratch one (batch, head) task needs: `Kᵀ` and `Vᵀ` (`HS x T` each) and two row
    /// blocks of scores (at most `MAX_QUERY_BLOCK x T` each).
    fn task_scratch(&self) -> usize {
        2 * self.seq * (self.head_size + MAX_QUERY_BLOCK.min(self.seq))
    }

    /// Elements of scratch [`forward`] and [`backward`] need.
    pub fn scratch_len(&self) -> usize {
        self.batch * self.heads * self.task_scratch()
    }
}

/// One task's view of qkv and its scratch.
struct Head<'a, T> {
    qkv: &'a [T],
    s: AttentionShape,
    b: usize,
    h: usize,
}

impl<T> Head<'_, T> {
    /// Offset in a `[B, T, 3C]` tensor of row `i`, part (0 q, 1 k, 2 v) of this head.
    fn off(&self, i: usize, part: usize) -> usize {
        let c = self.s.c();
        (self.b * self.s.seq + i) * 3 * c + part * c + self.h * self.s.head_size
    }
    /// Rows `i..` of part `part` as a GEMM operand (row stride 3C).
    fn part(&self, i: usize, part: usize) -> Strided<T> {
        Strided { ptr: self.qkv[self.off(i, part)..].as_ptr(), rs: 3 * self.s.c(), cs: 1 }
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
/// micro-batch's dropout key (needed with dropout).
pub fn forward<T: Float>(par: &dyn Parallel, a: Forward<&mut [T], &[T]>, scratch: &mut [T], key: Option<DropoutKey>) {
    let Forward { out, lse, qkv, shape: s, dropout } = a;
    let mask = mask(dropout, key);
    let (t, hs, c) = (s.seq, s.head_size, s.c());
    assert!(qkv.len() == s.batch * t * 3 * c && out.len() == s.batch * t * c && lse.len() == s.batch * s.heads * t);
    assert!(scratch.len() >= s.scratch_len());
    let scale = T::from_f64(1.0 / (hs as f64).sqrt());
    let (out_p, lse_p, scratch_p) = (SharedMut(out.as_mut_ptr()), SharedMut(lse.as_mut_ptr()), SharedMut(scratch.as_mut_ptr()));
    par.run(s.batch * s.heads, &|task| {
        let head = Head { qkv, s, b: task / s.heads, h: task % s.heads };
        // SAFETY: task (b, h) owns its scratch, lse[b, h, :] and head h's output columns.
        let (kt, p, lse) = unsafe {
            let mine = scratch_p.slice(task * s.task_scratch(), s.task_scratch());
            let (kt, rest) = mine.split_at_mut(hs * t);
            (kt, &mut rest[hs * t..], lse_p.slice(task * t, t))
        };
        transpose(&qkv[head.off(0, 1)..], t, hs, 3 * c, kt);
        let qb = s.query_block::<T>();
        for q0 in (0..t).step_by(qb) {
            let rows = q0..(q0 + qb).min(t);
            let keys = rows.end;
            // SAFETY: the operands are the block's rows of q, Kᵀ's first columns (at most t),
            // the block's rows of p (stride t), and of this head's output (stride C).
            unsafe {
                let scores = RowsMut { ptr: p.as_mut_ptr(), ld: t };
                gemm(Shape { m: rows.len(), n: s.scored_keys::<T>(keys), k: hs }, head.part(q0, 0), Rows { ptr: kt.as_ptr(), ld: t }, T::ZERO, scores);
                causal_softmax(p, t, rows.clone(), scale, lse);
                drop_rows(mask, p, t, rows.clone(), task);
                let probs = Strided { ptr: p.as_ptr(), rs: t, cs: 1 };
                let o = RowsMut { ptr: out_p.ptr().add((head.b * t + q0) * c + head.h * hs), ld: c };
                // Query q0 + r sees keys ..q0 + r + 1: the rest of its row of P is zero.
                let product = Shape { m: rows.len(), n: hs, k: keys };
                gemm_banded(product, probs, head.part(0, 2).rows(), T::ZERO, o, Band::Below(q0 + 1));
            }
        }
    });
}

/// Backward: writes (overwrites) `dqkv [B, T, 3C]` from `dout [B, T, C]`, using the forward's
/// `out` and `lse` (and forward's dropout `key`). Each (batch, head) pair is one task, so no
/// two tasks touch one element.
pub fn backward<T: Float>(par: &dyn Parallel, a: Backward<&mut [T], &[T]>, scratch: &mut [T], key: Option<DropoutKey>) {
    let Backward { dqkv, dout, qkv, out, lse, shape: s, dropout } = a;
    let mask = mask(dropout, key);
    let (t, hs, c) = (s.seq, s.head_size, s.c());
    assert!(dqkv.len() == qkv.len() && dout.len() == out.len() && qkv.len() == s.batch * t * 3 * c);
    assert!(scratch.len() >= s.scratch_len());
    let scale = T::from_f64(1.0 / (hs as f64).sqrt());
    let (d_p, scratch_p) = (SharedMut(dqkv.as_mut_ptr()), SharedMut(scratch.as_mut_ptr()));
    par.run(s.batch * s.heads, &|task| {
        let head = Head { qkv, s, b: task / s.heads, h: task % s.heads };
        let qb = s.query_block::<T>();
        // SAFETY: task (b, h) owns its scratch and head h's columns of dqkv in batch b.
        let (kt, vt, p, dp) = unsafe {
            let mine = scratch_p.slice(task * s.task_scratch(), s.task_scratch());
            let (kt, rest) = mine.split_at_mut(hs * t);
            let (vt, rest) = rest.split_at_mut(hs * t);
            let (p, dp) = rest.split_at_mut(qb * t);
            (kt, vt, p, dp)
        };
        transpose(&qkv[head.off(0, 1)..], t, hs, 3 * c, kt);
        transpose(&qkv[head.off(0, 2)..], t, hs, 3 * c, vt);
        let d_at = |i: usize, part: usize| RowsMut { ptr: d_p.ptr().wrapping_add(head.off(i, part)), ld: 3 * c };
        // Last block first: it sees every key, so it writes all of dK and dV (nothing to
        // clear beforehand) and earlier blocks add to them.
        for q0 in (0..t).step_by(qb).rev() {
            let rows = q0..(q0 + qb).min(t);
            let (n, keys) = (rows.len(), rows.end);
            let beta_kv = if keys == t { T::ZERO } else { T::ONE };
            let d_o = Strided { ptr: dout[(head.b * t + q0) * c + head.h * hs..].as_ptr(), rs: c, cs: 1 };
            // SAFETY: operands as in forward; dp rows have stride t; dq/dk/dv are this head's
            // columns of dqkv (stride 3C), disjoint from everything read.
            unsafe {
                let scored = s.scored_keys::<T>(keys);
                let scores = Shape { m: n, n: scored, k: hs };
                gemm(scores, head.part(q0, 0), Rows { ptr: kt.as_ptr(), ld: t }, T::ZERO, RowsMut { ptr: p.as_mut_ptr(), ld: t });
                causal_softmax_recompute(p, t, rows.clone(), scale, &lse[task * t..(task + 1) * t]);
                gemm(scores, d_o, Rows { ptr: vt.as_ptr(), ld: t }, T::ZERO, RowsMut { ptr: dp.as_mut_ptr(), ld: t });
                // With dropout that is the gradient of the dropped probabilities: through the
                // mask to the probabilities', and P itself dropped for dV (dS needs it whole).
                drop_rows(mask, dp, t, rows.clone(), task);
                let o0 = (head.b * t + q0) * c + head.h * hs;
                let outputs = HeadRows { d_o: &dout[o0..o0 + (n - 1) * c + hs], o: &out[o0..o0 + (n - 1) * c + hs], stride: c, hs };
                softmax_grad(&mut dp[..n * t], p, t, keys, outputs, scale);
                drop_rows(mask, p, t, rows.clone(), task);
                let p_t = Strided { ptr: p.as_ptr(), rs: 1, cs: t };
                let ds_t = Strided { ptr: dp.as_ptr(), rs: 1, cs: t };
                let ds = Strided { ptr: dp.as_ptr(), rs: t, cs: 1 };
                // dV[..keys] (+)= Pᵀ · dO;  dK[..keys] (+)= dSᵀ · Q;  dQ[rows] = dS · K. P and
                // dS are zero past each query's keys: key j takes no query before it.
                let (seen_from, sees) = (Band::Above(q0), Band::Below(q0 + 1));
                let (by_key, by_query) = (Shape { m: keys, n: hs, k: n }, Shape { m: n, n: hs, k: keys });
                gemm_banded(by_key, p_t, d_o.rows(), beta_kv, d_at(0, 2), seen_from);
                gemm_banded(by_key, ds_t, head.part(q0, 0).rows(), beta_kv, d_at(0, 1), seen_from);
                gemm_banded(by_query, ds, head.part(0, 1).rows(), T::ZERO, d_at(q0, 0), sees);
            }
        }
    });
}

/// One layer's key/value cache for decoding: keys then values, `[2, T, C]` (heads side by
/// side in each row, as in qkv).
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
/// same function of the same keys and values, summed in another order.
pub fn decode<T: Float>(par: &dyn Parallel, a: Forward<&mut [T], &[T]>, cache: KvCache<'_, T>, pos: usize) {
    let Forward { out, lse, qkv, shape: s, .. } = a;
    let (hs, c) = (s.head_size, s.c());
    assert!(s.batch == 1 && s.seq == 1 && qkv.len() == 3 * c && cache.rows.len() == 2 * cache.len * c && pos < cache.len);
    let (keys, values) = cache.rows.split_at_mut(cache.len * c);
    keys[pos * c..(pos + 1) * c].copy_from_slice(&qkv[c..2 * c]);
    values[pos * c..(pos + 1) * c].copy_from_slice(&qkv[2 * c..]);
    let (keys, values): (&[T], &[T]) = (keys, values);
    let scale = T::from_f64(1.0 / (hs as f64).sqrt());
    let (out_p, lse_p) = (SharedMut(out.as_mut_ptr()), SharedMut(lse.as_mut_ptr()));
    par.run(s.heads, &|h| {
        let q = &qkv[h * hs..(h + 1) * hs];
        // SAFETY: head h owns its columns of the output and its log-sum-exp.
        let (o, lse) = unsafe { (out_p.slice(h * hs, hs), lse_p.slice(h, 1)) };
        o.fill(T::ZERO);
        let (mut max, mut sum) = (T::from_f64(f64::NEG_INFINITY), T::ZERO);
        for j in 0..=pos {
            let at = j * c + h * hs;
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

    const SHAPE: AttentionShape = AttentionShape { batch: 2, seq: 5, heads: 3, head_size: 2 };
    /// Longer than one query block of any kernel, so later blocks see keys of earlier ones.
    const LONG: AttentionShape = AttentionShape { batch: 1, seq: MAX_QUERY_BLOCK + 7, heads: 2, head_size: 3 };
    /// Dropout on the probabilities, and its key.
    const DROPOUT: Option<Site> = Some(Site { id: 4, threshold: 1 << 30 });
    const KEY: Option<DropoutKey> = Some(DropoutKey { seed: 11, draw: 3 });

    #[test]
    fn gradients_match_finite_differences() {
        for dropout in [None, DROPOUT] {
            check_gradients(SHAPE, dropout);
            check_gradients(LONG, dropout);
        }
    }

    #[test]
    fn matches_explicit_softmax_and_is_causal() {
        for dropout in [None, DROPOUT] {
            check_against_explicit_softmax(SHAPE, dropout);
            check_against_explicit_softmax(LONG, dropout);
        }
    }

    /// The f32 build (this CPU's GEMM kernel, whose query blocks and scored key panels
    /// differ from the portable f64 kernel's) computes what the f64 build does, to f32
    /// rounding, over three query blocks of any kernel.
    #[test]
    fn f32_kernel_matches_f64() {
        let s = AttentionShape { batch: 2, seq: 2 * MAX_QUERY_BLOCK + 5, heads: 2, head_size: 8 };
        let (n, c) = (s.batch * s.seq, s.c());
        let mut rng = Rng::new(9);
        // Inputs that f32 holds exactly, so only the arithmetic differs.
        let mut random32 = |len, scale| random(&mut rng, len, scale).into_iter().map(|x| x as f32).collect::<Vec<f32>>();
        let (qkv, g) = (random32(n * 3 * c, 1.5), random32(n * c, 1.0));
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
        let (n, c) = (s.batch * s.seq, s.c());
        let (mut out, mut lse, mut dqkv) = (vec![T::ZERO; n * c], vec![T::ZERO; s.batch * s.heads * s.seq], vec![T::from_f64(7.0); n * 3 * c]);
        forward(&Serial, Forward { out: &mut out, lse: &mut lse, qkv, shape: s, dropout }, &mut vec![T::ZERO; s.scratch_len()], KEY);
        let a = Backward { dqkv: &mut dqkv[..], dout: g, qkv, out: &out, lse: &lse, shape: s, dropout };
        backward(&Serial, a, &mut vec![T::ZERO; s.scratch_len()], KEY);
        (out, dqkv)
    }

    fn check_gradients(s: AttentionShape, dropout: Option<Site>) {
        let (n, c) = (s.batch * s.seq, s.c());
        let mut rng = Rng::new(5);
        let mut qkv = random(&mut rng, n * 3 * c, 1.5);
        let g = random(&mut rng, n * c, 1.0);
        let (_, dqkv) = run_both_passes(s, &qkv, &g, dropout);
        let (mut out, mut lse) = (vec![0.0; n * c], vec![0.0; s.batch * s.heads * s.seq]);
        let numeric = numeric_grad(&mut qkv, |x| {
            forward(&Serial, Forward { out: &mut out, lse: &mut lse, qkv: x, shape: s, dropout }, &mut vec![0.0; s.scratch_len()], KEY);
            weighted_sum(&out, &g)
        });
        assert_close("dqkv", &dqkv, &numeric);
    }

    /// Decoding position by position against a cache gives what the whole sequence's forward
    /// gives at each position.
    #[test]
    fn decoding_with_a_cache_matches_the_forward() {
        let s = AttentionShape { batch: 1, seq: MAX_QUERY_BLOCK + 5, heads: 3, head_size: 4 };
        let (t, c) = (s.seq, s.c());
        let qkv = random(&mut Rng::new(12), t * 3 * c, 2.0);
        let (mut out, mut lse) = (vec![0.0; t * c], vec![0.0; s.heads * t]);
        forward(&Serial, Forward { out: &mut out, lse: &mut lse, qkv: &qkv, shape: s, dropout: None }, &mut vec![0.0; s.scratch_len()], None);
        let mut cache = vec![f64::NAN; 2 * t * c];
        let one = AttentionShape { seq: 1, ..s };
        for pos in 0..t {
            let (mut o, mut l) = (vec![0.0; c], vec![0.0; s.heads]);
            let a = Forward { out: &mut o[..], lse: &mut l[..], qkv: &qkv[pos * 3 * c..(pos + 1) * 3 * c], shape: one, dropout: None };
            decode(&Serial, a, KvCache { rows: &mut cache, len: t }, pos);
            for (j, (x, y)) in o.iter().zip(&out[pos * c..(pos + 1) * c]).enumerate() {
                assert!((x - y).abs() < 1e-12, "position {pos}, column {j}: {x} vs {y}");
            }
            for h in 0..s.heads {
                assert!((l[h] - lse[h * t + pos]).abs() < 1e-12);
            }
        }
    }

    /// Against the textbook formula, each probability dropped by its own element's mask.
    fn check_against_explicit_softmax(s: AttentionShape, dropout: Option<Site>) {
        let (t, hs, c) = (s.seq, s.head_size, s.c());
        let mut rng = Rng::new(6);
        let qkv = random(&mut rng, s.batch * t * 3 * c, 2.0);
        let (mut out, mut lse) = (vec![0.0; s.batch * t * c], vec![0.0; s.batch * s.heads * t]);
        forward(&Serial, Forward { out: &mut out, lse: &mut lse, qkv: &qkv, shape: s, dropout }, &mut vec![0.0; s.scratch_len()], KEY);
        let kept = |b: usize, h: usize, i: usize, j: usize| match mask(dropout, KEY) {
            Some(m) if m.keeps((((b * s.heads + h) * t + i) * t + j) as u64) => m.site.scale(),
            Some(_) => 0.0,
            None => 1.0,
        };
        for b in 0..s.batch {
            for h in 0..s.heads {
                for i in 0..t {
                    let at = |r: usize, part: usize, d: usize| qkv[(b * t + r) * 3 * c + part * c + h * hs + d];
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
