//! Fused causal multi-head self-attention over a fused QKV tensor.
//!
//! `qkv [B, T, 3C]` holds q, k, v side by side; head `h` uses columns `h*HS..(h+1)*HS` of
//! each. Forward is online softmax per query row over chunks of keys (FlashAttention
//! style): at most one chunk of scores is held, on the stack; only the output `[B, T, C]` (heads concatenated, as PyTorch's
//! `transpose(1, 2).view(B, T, C)`) and each row's log-sum-exp `lse [B, NH, T]`. Backward
//! recomputes each score from q, k and the saved log-sum-exp.

use crate::float::{axpy, dot, Float};
use crate::parallel::{Parallel, SharedMut};

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

/// Keys processed together: their scores live in a stack buffer, so max, exp and the
/// softmax weights run as vector loops (online softmax across chunks).
const KEY_CHUNK: usize = 64;

/// Forward: `out = softmax(q·kᵀ / sqrt(HS) + causal mask) · v` per head; saves `lse`.
pub fn forward<T: Float>(par: &dyn Parallel, out: &mut [T], lse: &mut [T], qkv: &[T], s: AttentionShape) {
    let (t, hs, c) = (s.seq, s.head_size, s.c());
    assert!(qkv.len() == s.batch * t * 3 * c && out.len() == s.batch * t * c && lse.len() == s.batch * s.heads * t);
    let scale = T::from_f64(1.0 / (hs as f64).sqrt());
    let (out_p, lse_p) = (SharedMut(out.as_mut_ptr()), SharedMut(lse.as_mut_ptr()));
    par.run(s.batch * s.heads, &|task| {
        let (b, h) = (task / s.heads, task % s.heads);
        let at = |i: usize, part: usize| &qkv[(b * t + i) * 3 * c + part * c + h * hs..][..hs];
        let mut w = [T::ZERO; KEY_CHUNK];
        for i in 0..t {
            let q = at(i, 0);
            // SAFETY: task (b, h) owns columns of head h in rows of batch b, and lse[b, h, :].
            let (o, l_out) = unsafe { (out_p.slice((b * t + i) * c + h * hs, hs), lse_p.slice(task * t + i, 1)) };
            o.fill(T::ZERO);
            let (mut max, mut sum) = (T::ZERO, T::ZERO);
            for j0 in (0..=i).step_by(KEY_CHUNK) {
                let w = &mut w[..KEY_CHUNK.min(i + 1 - j0)];
                for (jj, x) in w.iter_mut().enumerate() {
                    *x = dot(q, at(j0 + jj, 1)) * scale;
                }
                let chunk_max = w.iter().fold(w[0], |m, &x| m.max(x));
                if j0 == 0 || chunk_max > max {
                    let correction = if j0 == 0 { T::ZERO } else { (max - chunk_max).exp() };
                    for x in o.iter_mut() {
                        *x *= correction;
                    }
                    sum *= correction;
                    max = chunk_max;
                }
                for x in w.iter_mut() {
                    *x = (*x - max).exp();
                }
                for (jj, &p) in w.iter().enumerate() {
                    sum += p;
                    axpy(p, at(j0 + jj, 2), o);
                }
            }
            let inv = T::ONE / sum;
            for x in o.iter_mut() {
                *x *= inv;
            }
            l_out[0] = max + sum.ln();
        }
    });
}

/// Backward: writes (overwrites) `dqkv [B, T, 3C]` from `dout [B, T, C]`, using the forward's
/// `out` and `lse`. Each (batch, head) pair is one task, so no two tasks touch one element.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: Float>(
    par: &dyn Parallel,
    dqkv: &mut [T],
    dout: &[T],
    qkv: &[T],
    out: &[T],
    lse: &[T],
    s: AttentionShape,
) {
    let (t, hs, c) = (s.seq, s.head_size, s.c());
    assert!(dqkv.len() == qkv.len() && dout.len() == out.len() && qkv.len() == s.batch * t * 3 * c);
    let scale = T::from_f64(1.0 / (hs as f64).sqrt());
    let d_p = SharedMut(dqkv.as_mut_ptr());
    par.run(s.batch * s.heads, &|task| {
        let (b, h) = (task / s.heads, task % s.heads);
        let off = |i: usize, part: usize| (b * t + i) * 3 * c + part * c + h * hs;
        let at = |i: usize, part: usize| &qkv[off(i, part)..][..hs];
        // SAFETY (every `d` call): task (b, h) owns head h's columns in rows of batch b, and
        // the q, k and v column ranges of a row are disjoint.
        let d = |i: usize, part: usize| unsafe { d_p.slice(off(i, part), hs) };
        for i in 0..t {
            for part in 0..3 {
                d(i, part).fill(T::ZERO);
            }
        }
        let (mut p, mut ds) = ([T::ZERO; KEY_CHUNK], [T::ZERO; KEY_CHUNK]);
        for i in 0..t {
            let q = at(i, 0);
            let o_row = (b * t + i) * c + h * hs;
            let (d_o, o) = (&dout[o_row..o_row + hs], &out[o_row..o_row + hs]);
            let delta = dot(d_o, o);
            let l = lse[task * t + i];
            for j0 in (0..=i).step_by(KEY_CHUNK) {
                let n = KEY_CHUNK.min(i + 1 - j0);
                let (p, ds) = (&mut p[..n], &mut ds[..n]);
                for jj in 0..n {
                    p[jj] = dot(q, at(j0 + jj, 1)) * scale - l;
                    ds[jj] = dot(d_o, at(j0 + jj, 2)) - delta;
                }
                for (pj, dsj) in p.iter_mut().zip(ds.iter_mut()) {
                    *pj = pj.exp();
                    *dsj = *pj * *dsj * scale;
                }
                let dq = d(i, 0);
                for jj in 0..n {
                    let j = j0 + jj;
                    axpy(p[jj], d_o, d(j, 2));
                    axpy(ds[jj], at(j, 1), dq);
                    axpy(ds[jj], q, d(j, 1));
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::*;
    use crate::parallel::Serial;
    use crate::rng::Rng;

    const SHAPE: AttentionShape = AttentionShape { batch: 2, seq: 5, heads: 3, head_size: 2 };
    /// Longer than one key chunk, so the online softmax crosses chunks.
    const LONG: AttentionShape = AttentionShape { batch: 1, seq: KEY_CHUNK + 7, heads: 2, head_size: 3 };

    #[test]
    fn gradients_match_finite_differences() {
        check_gradients(SHAPE);
        check_gradients(LONG);
    }

    #[test]
    fn matches_explicit_softmax_and_is_causal() {
        check_against_explicit_softmax(SHAPE);
        check_against_explicit_softmax(LONG);
    }

    fn check_gradients(s: AttentionShape) {
        let (n, c) = (s.batch * s.seq, s.c());
        let mut rng = Rng::new(5);
        let mut qkv = random(&mut rng, n * 3 * c, 1.5);
        let g = random(&mut rng, n * c, 1.0);
        let (mut out, mut lse) = (vec![0.0; n * c], vec![0.0; s.batch * s.heads * s.seq]);
        forward(&Serial, &mut out, &mut lse, &qkv, s);
        let mut dqkv = vec![7.0; n * 3 * c];
        backward(&Serial, &mut dqkv, &g, &qkv, &out, &lse, s);
        let numeric = numeric_grad(&mut qkv, |x| {
            forward(&Serial, &mut out, &mut lse, x, s);
            weighted_sum(&out, &g)
        });
        assert_close("dqkv", &dqkv, &numeric);
    }

    fn check_against_explicit_softmax(s: AttentionShape) {
        let (t, hs, c) = (s.seq, s.head_size, s.c());
        let mut rng = Rng::new(6);
        let qkv = random(&mut rng, s.batch * t * 3 * c, 2.0);
        let (mut out, mut lse) = (vec![0.0; s.batch * t * c], vec![0.0; s.batch * s.heads * t]);
        forward(&Serial, &mut out, &mut lse, &qkv, s);
        for b in 0..s.batch {
            for h in 0..s.heads {
                for i in 0..t {
                    let at = |r: usize, part: usize, d: usize| qkv[(b * t + r) * 3 * c + part * c + h * hs + d];
                    let scores: Vec<f64> =
                        (0..=i).map(|j| (0..hs).map(|d| at(i, 0, d) * at(j, 1, d)).sum::<f64>() / (hs as f64).sqrt()).collect();
                    let z: f64 = scores.iter().map(|s| s.exp()).sum();
                    assert!((lse[(b * s.heads + h) * t + i] - z.ln()).abs() < 1e-12);
                    for d in 0..hs {
                        let expect: f64 = scores.iter().enumerate().map(|(j, s)| s.exp() / z * at(j, 2, d)).sum();
                        assert!((out[(b * t + i) * c + h * hs + d] - expect).abs() < 1e-12);
                    }
                }
            }
        }
    }
}
