//! RMSNorm over the last dimension with a weight and no bias (Hugging Face's `LlamaRMSNorm`):
//! `out = x · rsqrt(mean(x²) + eps) · weight`. Backward in one pass over each row.

use super::row_blocks;
use crate::float::{sum_map, sum_map3, Float};
use crate::parallel::{split_range, Parallel, SharedMut};
use crate::simd::wide_dispatch;

/// Forward's tensors, `W` written and `R` read (slices here, device views on the GPU).
pub struct Forward<W, R> {
    /// Output `[N, C]`.
    pub out: W,
    /// Row reciprocal root mean squares `[N]`, saved for backward.
    pub rstd: W,
    /// Input `[N, C]`.
    pub x: R,
    /// Weight `[C]`.
    pub weight: R,
    /// Added to the mean square (`rms_norm_eps`).
    pub eps: f64,
}

/// Backward's tensors, `W` written and `R` read.
pub struct Backward<W, R> {
    /// Gradient of `x` `[N, C]` (accumulated).
    pub dx: W,
    /// Gradient of the weight `[C]` (accumulated).
    pub dweight: W,
    /// Gradient of the output `[N, C]`.
    pub dout: R,
    /// Forward's input `[N, C]`.
    pub x: R,
    /// Forward's saved reciprocal root mean squares `[N]`.
    pub rstd: R,
    /// Weight `[C]`.
    pub weight: R,
}

/// Forward: `out = (x · rstd) · weight` row by row, saving `rstd`.
pub fn forward<T: Float>(par: &dyn Parallel, a: Forward<&mut [T], &[T]>) {
    let Forward { out, rstd, x, weight: w, eps } = a;
    let (n, c) = (rstd.len(), w.len());
    assert!(out.len() == n * c && x.len() == n * c, "rmsnorm forward: shape mismatch");
    let tasks = par.threads().min(n);
    let (out_p, rstd_p) = (SharedMut(out.as_mut_ptr()), SharedMut(rstd.as_mut_ptr()));
    par.run(tasks, &|task| {
        let rows = split_range(n, tasks, task);
        // SAFETY: tasks own disjoint rows.
        let (o, ro) = unsafe { (out_p.slice(rows.start * c, rows.len() * c), rstd_p.slice(rows.start, rows.len())) };
        forward_rows(o, ro, &x[rows.start * c..rows.end * c], w, T::from_f64(eps));
    });
}

#[inline(always)]
fn forward_rows_body<T: Float>(out: &mut [T], rstd: &mut [T], x: &[T], w: &[T], eps: T) {
    let c = w.len();
    let inv_c = T::from_f64(1.0 / c as f64);
    for ((xr, o), r_out) in x.chunks_exact(c).zip(out.chunks_exact_mut(c)).zip(rstd.iter_mut()) {
        let s = T::ONE / (sum_map(xr, |x| x * x) * inv_c + eps).sqrt();
        for ((o, &v), &wi) in o.iter_mut().zip(xr).zip(w) {
            *o = v * s * wi;
        }
        *r_out = s;
    }
}

wide_dispatch!(
    /// RMSNorm of the rows of `x` (`C = w.len()` wide) into `out`, saving `rstd`.
    fn forward_rows<T>(out: &mut [T], rstd: &mut [T], x: &[T], w: &[T], eps: T) => forward_rows_body
);

/// Backward: accumulates `dx += d(out)/dx · dout` and `dweight`. `partials` is scratch of
/// at least [`row_blocks::blocks`]`(N) * C` elements.
pub fn backward<T: Float>(par: &dyn Parallel, a: Backward<&mut [T], &[T]>, partials: &mut [T]) {
    let Backward { dx, dweight: dw, dout, x, rstd, weight: w } = a;
    let (n, c) = (rstd.len(), w.len());
    assert!(dx.len() == n * c && dout.len() == n * c && x.len() == n * c && dw.len() == c, "rmsnorm backward: shape mismatch");
    let dx_p = SharedMut(dx.as_mut_ptr());
    row_blocks::for_each_block(par, n, partials, c, &|rows, partial| {
        let (r0, r1) = (rows.start * c, rows.end * c);
        // SAFETY: blocks own disjoint rows.
        let dxr = unsafe { dx_p.slice(r0, r1 - r0) };
        block_grads(dxr, partial, &dout[r0..r1], &x[r0..r1], &rstd[rows], w);
    });
    row_blocks::add_partials(par, n, partials, c, 0, dw);
}

#[inline(always)]
fn block_grads_body<T: Float>(dx: &mut [T], partial: &mut [T], dout: &[T], x: &[T], rstd: &[T], w: &[T]) {
    let c = w.len();
    let inv_c = T::from_f64(1.0 / c as f64);
    partial.fill(T::ZERO);
    for (((dxr, dr), xr), &s) in dx.chunks_exact_mut(c).zip(dout.chunks_exact(c)).zip(x.chunks_exact(c)).zip(rstd) {
        // With x̂ = x·s: dx = s · (dout·w − x̂ · mean(dout·w·x̂)).
        let dnorm_xhat_mean = sum_map3(dr, w, xr, |g, wi, xv| g * wi * (xv * s)) * inv_c;
        for ((((d, &xv), &g), &wi), a) in dxr.iter_mut().zip(xr).zip(dr).zip(w).zip(partial.iter_mut()) {
            let xhat = xv * s;
            *d += (g * wi - xhat * dnorm_xhat_mean) * s;
            *a += g * xhat;
        }
    }
}

wide_dispatch!(
    /// For a block of rows (`C = w.len()` wide): `dx += ∂out/∂x · dout`, and the block's
    /// `Σ dout · x̂` into `partial [C]`.
    fn block_grads<T>(dx: &mut [T], partial: &mut [T], dout: &[T], x: &[T], rstd: &[T], w: &[T]) => block_grads_body
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::*;
    use crate::parallel::Serial;
    use crate::rng::Rng;

    #[test]
    fn gradients_match_finite_differences() {
        let (n, c, eps) = (70, 7, 1e-5); // two row blocks
        let mut rng = Rng::new(2);
        let mut x = random(&mut rng, n * c, 2.0);
        let mut w = random(&mut rng, c, 1.0);
        let g = random(&mut rng, n * c, 1.0);
        let (mut out, mut rstd) = (vec![0.0; n * c], vec![0.0; n]);
        forward(&Serial, Forward { out: &mut out, rstd: &mut rstd, x: &x, weight: &w, eps });
        // dx accumulates onto what is there.
        let (mut dx, mut dw) = (vec![0.5; n * c], vec![0.0; c]);
        let mut partials = vec![0.0; row_blocks::blocks(n) * c];
        backward(&Serial, Backward { dx: &mut dx[..], dweight: &mut dw[..], dout: &g[..], x: &x[..], rstd: &rstd[..], weight: &w[..] }, &mut partials);
        dx.iter_mut().for_each(|d| *d -= 0.5);
        let mut loss = |x: &[f64], weight: &[f64]| {
            forward(&Serial, Forward { out: &mut out, rstd: &mut rstd, x, weight, eps });
            weighted_sum(&out, &g)
        };
        let (w0, x0) = (w.clone(), x.clone());
        assert_close("dx", &dx, &numeric_grad(&mut x, |x| loss(x, &w0)));
        assert_close("dw", &dw, &numeric_grad(&mut w, |w| loss(&x0, w)));
    }

    #[test]
    fn matches_the_definition() {
        let x = [1.0f32, -2.0, 3.0, 6.0];
        let w = [0.5f32, 1.0, 2.0, -1.0];
        let (mut out, mut rstd) = ([0.0f32; 4], [0.0f32]);
        forward(&Serial, Forward { out: &mut out, rstd: &mut rstd, x: &x, weight: &w, eps: 1e-6 });
        let ms: f32 = x.iter().map(|v| v * v).sum::<f32>() / 4.0;
        for ((o, v), wi) in out.iter().zip(x).zip(w) {
            assert!((o - v / (ms + 1e-6).sqrt() * wi).abs() < 1e-6);
        }
    }
}
