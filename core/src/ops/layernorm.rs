//! LayerNorm over the last dimension with weight and bias, eps 1e-5 (PyTorch's default).

use super::row_blocks;
use crate::float::{sum_map, sum_map2, sum_map3, Float};
use crate::parallel::{split_range, Parallel, SharedMut};
use crate::simd::wide_dispatch;

/// PyTorch's `nn.LayerNorm` epsilon.
pub const EPS: f64 = 1e-5;

/// Forward's tensors, `W` written and `R` read (slices here, device views on the GPU).
pub struct Forward<W, R> {
    /// Output `[N, C]`.
    pub out: W,
    /// Row means `[N]`, saved for backward.
    pub mean: W,
    /// Row reciprocal standard deviations `[N]`, saved for backward.
    pub rstd: W,
    /// Input `[N, C]`.
    pub x: R,
    /// Weight `[C]`.
    pub weight: R,
    /// Bias `[C]`.
    pub bias: R,
}

/// Backward's tensors, `W` written and `R` read.
pub struct Backward<W, R> {
    /// Gradient of `x` `[N, C]` (accumulated).
    pub dx: W,
    /// Gradient of the weight `[C]` (accumulated).
    pub dweight: W,
    /// Gradient of the bias `[C]` (accumulated).
    pub dbias: W,
    /// Gradient of the output `[N, C]`.
    pub dout: R,
    /// Forward's input `[N, C]`.
    pub x: R,
    /// Forward's saved means `[N]`.
    pub mean: R,
    /// Forward's saved reciprocal standard deviations `[N]`.
    pub rstd: R,
    /// Weight `[C]`.
    pub weight: R,
}

/// Forward: `out = (x - mean) * rstd * weight + bias` row by row, saving `mean` and `rstd`.
pub fn forward<T: Float>(par: &dyn Parallel, a: Forward<&mut [T], &[T]>) {
    let Forward { out, mean, rstd, x, weight: w, bias: b } = a;
    let (n, c) = (mean.len(), w.len());
    let tasks = par.threads().min(n);
    let (out_p, mean_p, rstd_p) = (SharedMut(out.as_mut_ptr()), SharedMut(mean.as_mut_ptr()), SharedMut(rstd.as_mut_ptr()));
    par.run(tasks, &|task| {
        let rows = split_range(n, tasks, task);
        // SAFETY: tasks own disjoint rows.
        let (o, mo, ro) = unsafe { (out_p.slice(rows.start * c, rows.len() * c), mean_p.slice(rows.start, rows.len()), rstd_p.slice(rows.start, rows.len())) };
        forward_rows(o, mo, ro, &x[rows.start * c..rows.end * c], w, b, c);
    });
}

#[inline(always)]
fn forward_rows_body<T: Float>(out: &mut [T], mean: &mut [T], rstd: &mut [T], x: &[T], w: &[T], b: &[T], c: usize) {
    let inv_c = T::from_f64(1.0 / c as f64);
    let eps = T::from_f64(EPS);
    for (((xr, o), m_out), r_out) in x.chunks_exact(c).zip(out.chunks_exact_mut(c)).zip(mean.iter_mut()).zip(rstd.iter_mut()) {
        let m = sum_map(xr, |x| x) * inv_c;
        let var = sum_map(xr, |x| (x - m) * (x - m));
        let s = T::ONE / (var * inv_c + eps).sqrt();
        for (((o, &v), &wi), &bi) in o.iter_mut().zip(xr).zip(w).zip(b) {
            *o = (v - m) * s * wi + bi;
        }
        *m_out = m;
        *r_out = s;
    }
}

wide_dispatch!(
    /// LayerNorm of the rows of `x` (`C` wide) into `out`, saving `mean` and `rstd`.
    fn forward_rows<T>(out: &mut [T], mean: &mut [T], rstd: &mut [T], x: &[T], w: &[T], b: &[T], c: usize) => forward_rows_body
);

/// Backward: accumulates `dx += d(out)/dx · dout`, `dweight`, `dbias`. `partials` is scratch
/// of at least [`row_blocks::blocks`]`(N) * 2C` elements.
pub fn backward<T: Float>(par: &dyn Parallel, a: Backward<&mut [T], &[T]>, partials: &mut [T]) {
    let Backward { dx, dweight: dw, dbias: db, dout, x, mean, rstd, weight: w } = a;
    let (n, c) = (mean.len(), w.len());
    assert!(dx.len() == n * c && dout.len() == n * c && x.len() == n * c && w.len() == c);
    let dx_p = SharedMut(dx.as_mut_ptr());
    row_blocks::for_each_block(par, n, partials, 2 * c, &|rows, partial| {
        let (r0, r1) = (rows.start * c, rows.end * c);
        // SAFETY: blocks own disjoint rows.
        let dxr = unsafe { dx_p.slice(r0, r1 - r0) };
        block_grads(dxr, partial, &dout[r0..r1], &x[r0..r1], &mean[rows.clone()], &rstd[rows], w);
    });
    row_blocks::add_partials(par, n, partials, 2 * c, 0, dw);
    row_blocks::add_partials(par, n, partials, 2 * c, c, db);
}

#[inline(always)]
fn block_grads_body<T: Float>(dx: &mut [T], partial: &mut [T], dout: &[T], x: &[T], mean: &[T], rstd: &[T], w: &[T]) {
    let c = w.len();
    let inv_c = T::from_f64(1.0 / c as f64);
    let (dw, db) = partial.split_at_mut(c);
    dw.fill(T::ZERO);
    db.fill(T::ZERO);
    for (((dxr, dr), xr), (&m, &s)) in dx.chunks_exact_mut(c).zip(dout.chunks_exact(c)).zip(x.chunks_exact(c)).zip(mean.iter().zip(rstd)) {
        let dnorm_mean = sum_map2(dr, w, |g, wi| g * wi) * inv_c;
        let dnorm_xhat_mean = sum_map3(dr, w, xr, |g, wi, xv| g * wi * ((xv - m) * s)) * inv_c;
        for (((((d, &xv), &g), &wi), a), bb) in dxr.iter_mut().zip(xr).zip(dr).zip(w).zip(dw.iter_mut()).zip(db.iter_mut()) {
            let xhat = (xv - m) * s;
            *d += (g * wi - dnorm_mean - xhat * dnorm_xhat_mean) * s;
            *a += g * xhat;
            *bb += g;
        }
    }
}

wide_dispatch!(
    /// For a block of rows (`C = w.len()` wide): `dx += ∂out/∂x · dout`, and the block's
    /// `Σ dout · x̂` and `Σ dout` into `partial [2C]`.
    fn block_grads<T>(dx: &mut [T], partial: &mut [T], dout: &[T], x: &[T], mean: &[T], rstd: &[T], w: &[T]) => block_grads_body
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::*;
    use crate::parallel::Serial;
    use crate::rng::Rng;

    #[test]
    fn gradients_match_finite_differences() {
        let (n, c) = (70, 7); // two row blocks
        let mut rng = Rng::new(2);
        let mut x = random(&mut rng, n * c, 2.0);
        let mut w = random(&mut rng, c, 1.0);
        let mut b = random(&mut rng, c, 1.0);
        let g = random(&mut rng, n * c, 1.0);
        let (mut out, mut mean, mut rstd) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
        forward(&Serial, Forward { out: &mut out, mean: &mut mean, rstd: &mut rstd, x: &x, weight: &w, bias: &b });
        let (mut dx, mut dw, mut db) = (vec![0.0; n * c], vec![0.0; c], vec![0.0; c]);
        let mut partials = vec![0.0; crate::ops::row_blocks::blocks(n) * 2 * c];
        let grads =
            Backward { dx: &mut dx[..], dweight: &mut dw[..], dbias: &mut db[..], dout: &g[..], x: &x[..], mean: &mean[..], rstd: &rstd[..], weight: &w[..] };
        backward(&Serial, grads, &mut partials);
        let mut loss = |x: &[f64], weight: &[f64], bias: &[f64]| {
            forward(&Serial, Forward { out: &mut out, mean: &mut mean, rstd: &mut rstd, x, weight, bias });
            weighted_sum(&out, &g)
        };
        let (w0, b0, x0) = (w.clone(), b.clone(), x.clone());
        assert_close("dx", &dx, &numeric_grad(&mut x, |x| loss(x, &w0, &b0)));
        assert_close("dw", &dw, &numeric_grad(&mut w, |w| loss(&x0, w, &b0)));
        assert_close("db", &db, &numeric_grad(&mut b, |b| loss(&x0, &w0, b)));
    }

    #[test]
    fn matches_the_definition() {
        let x = [1.0f32, 2.0, 3.0, 6.0];
        let (mut out, mut mean, mut rstd) = ([0.0f32; 4], [0.0f32], [0.0f32]);
        forward(&Serial, Forward { out: &mut out, mean: &mut mean, rstd: &mut rstd, x: &x, weight: &[1.0; 4], bias: &[0.5; 4] });
        let var: f32 = x.iter().map(|v| (v - 3.0) * (v - 3.0)).sum::<f32>() / 4.0;
        for (o, v) in out.iter().zip(x) {
            assert!((o - ((v - 3.0) / (var + 1e-5).sqrt() + 0.5)).abs() < 1e-6);
        }
    }
}
