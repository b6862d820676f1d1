//! Fused causal multi-head self-attention over a fused QKV tensor.
//!
//! `qkv [B, T, 3C]` holds q, k, v side by side; head `h` uses columns `h*HS..(h+1)*HS` of
//! each. Forward is one pass of online softmax per query row (FlashAttention style): the
//! scores are never stored, only the output `[B, T, C]` (heads concatenated, as PyTorch's
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

/// Forward: `out = softmax(q·kᵀ / sqrt(HS) + causal mask) · v` per head; saves `lse`.
pub fn forward<T: Float>(par: &dyn Parallel, out: &mut [T], lse: &mut [T], qkv: &[T], s: AttentionShape) {
    let (t, hs, c) = (s.seq, s.head_size, s.c());
    assert!(qkv.len() == s.batch * t * 3 * c && out.len() == s.batch * t * c && lse.len() == s.batch * s.heads * t);
    let scale = T::from_f64(1.0 / (hs as f64).sqrt());
    let (out_p, lse_p) = (SharedMut(out.as_mut_ptr()), SharedMut(lse.as_mut_ptr()));
    par.run(s.batch * s.heads, &|task| {
        let (b, h) = (task / s.heads, task % s.heads);
        let row = |i: usize| (b * t + i) * 3 * c;
        for i in 0..t {
            let q = &qkv[row(i) + h * hs..row(i) + (h + 1) * hs];
            // SAFETY: task (b, h) owns columns of head h in rows of batch b, and lse[b, h, :].
            let (o, l_out) = unsafe { (out_p.slice((b * t + i) * c + h * hs, hs), lse_p.slice(task * t + i, 1)) };
            o.fill(T::ZERO);
            let (mut max, mut sum) = (T::ZERO, T::ZERO);
            for j in 0..=i {
                let k = &qkv[row(j) + c + h * hs..row(j) + c + (h + 1) * hs];
                let v = &qkv[row(j) + 2 * c + h * hs..row(j) + 2 * c + (h + 1) * hs];
                let score = dot(q, k) * scale;
                if j == 0 || score > max {
                    let correction = if j == 0 { T::ZERO } else { (max - score).exp() };
                    for x in o.iter_mut() {
                        *x *= correction;
                    }
                    sum *= correction;
                    max = score;
                }
                let p = (score - max).exp();
                sum += p;
                axpy(p, v, o);
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
        let row = |i: usize| (b * t + i) * 3 * c;
        // Column ranges of q, k, v for head h in a row of qkv.
        let (qc, kc, vc) = (h * hs, c + h * hs, 2 * c + h * hs);
        for i in 0..t {
            for off in [qc, kc, vc] {
                // SAFETY: task (b, h) owns head h's columns in rows of batch b.
                unsafe { d_p.slice(row(i) + off, hs) }.fill(T::ZERO);
            }
        }
        for i in 0..t {
            let q = &qkv[row(i) + qc..row(i) + qc + hs];
            let o_row = (b * t + i) * c + h * hs;
            let (d_o, o) = (&dout[o_row..o_row + hs], &out[o_row..o_row + hs]);
            let delta = dot(d_o, o);
            let l = lse[task * t + i];
            for j in 0..=i {
                let k = &qkv[row(j) + kc..row(j) + kc + hs];
                let v = &qkv[row(j) + vc..row(j) + vc + hs];
                let p = (dot(q, k) * scale - l).exp();
                let ds = p * (dot(d_o, v) - delta) * scale;
                // SAFETY: as above; dq_i, dk_j and dv_j are disjoint column ranges.
                let (dq, dk, dv) = unsafe { (d_p.slice(row(i) + qc, hs), d_p.slice(row(j) + kc, hs), d_p.slice(row(j) + vc, hs)) };
                axpy(p, d_o, dv);
                axpy(ds, k, dq);
                axpy(ds, q, dk);
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

    #[test]
    fn gradients_match_finite_differences() {
        let (n, c) = (SHAPE.batch * SHAPE.seq, SHAPE.c());
        let mut rng = Rng::new(5);
        let mut qkv = random(&mut rng, n * 3 * c, 1.5);
        let g = random(&mut rng, n * c, 1.0);
        let (mut out, mut lse) = (vec![0.0; n * c], vec![0.0; SHAPE.batch * SHAPE.heads * SHAPE.seq]);
        forward(&Serial, &mut out, &mut lse, &qkv, SHAPE);
        let mut dqkv = vec![7.0; n * 3 * c];
        backward(&Serial, &mut dqkv, &g, &qkv, &out, &lse, SHAPE);
        let numeric = numeric_grad(&mut qkv, |x| {
            forward(&Serial, &mut out, &mut lse, x, SHAPE);
            weighted_sum(&out, &g)
        });
        assert_close("dqkv", &dqkv, &numeric);
    }

    #[test]
    fn matches_explicit_softmax_and_is_causal() {
        let (t, hs, c) = (SHAPE.seq, SHAPE.head_size, SHAPE.c());
        let mut rng = Rng::new(6);
        let qkv = random(&mut rng, SHAPE.batch * t * 3 * c, 2.0);
        let (mut out, mut lse) = (vec![0.0; SHAPE.batch * t * c], vec![0.0; SHAPE.batch * SHAPE.heads * t]);
        forward(&Serial, &mut out, &mut lse, &qkv, SHAPE);
        for b in 0..SHAPE.batch {
            for h in 0..SHAPE.heads {
                for i in 0..t {
                    let at = |r: usize, part: usize, d: usize| qkv[(b * t + r) * 3 * c + part * c + h * hs + d];
                    let scores: Vec<f64> =
                        (0..=i).map(|j| (0..hs).map(|d| at(i, 0, d) * at(j, 1, d)).sum::<f64>() / (hs as f64).sqrt()).collect();
                    let z: f64 = scores.iter().map(|s| s.exp()).sum();
                    assert!((lse[(b * SHAPE.heads + h) * t + i] - z.ln()).abs() < 1e-12);
                    for d in 0..hs {
                        let expect: f64 = scores.iter().enumerate().map(|(j, s)| s.exp() / z * at(j, 2, d)).sum();
                        assert!((out[(b * t + i) * c + h * hs + d] - expect).abs() < 1e-12);
                    }
                }
            }
        }
    }
}
