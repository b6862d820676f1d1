//! AdamW (PyTorch's formulation, decoupled weight decay on matrices only) with the gradient
//! clip factor folded in, and nanoGPT's warmup + cosine learning-rate schedule.

use crate::float::Float;
use crate::parallel::{split_range, Parallel, SharedMut};
use crate::plan::Plan;
use crate::simd::wide_dispatch;

/// AdamW hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay, applied to 2-D weights only.
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    /// nanoGPT's Shakespeare-char settings: betas (0.9, 0.99), eps 1e-8, weight decay 0.1.
    fn default() -> Self {
        AdamWConfig { beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.1 }
    }
}

/// Warmup then cosine decay (nanoGPT's `get_lr`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrSchedule {
    /// Peak learning rate.
    pub max_lr: f64,
    /// Floor reached at `decay_iters`.
    pub min_lr: f64,
    /// Linear warmup steps.
    pub warmup_iters: u64,
    /// Step at which the cosine reaches `min_lr`.
    pub decay_iters: u64,
}

impl LrSchedule {
    /// Learning rate for step `it` (0-based).
    pub fn at(&self, it: u64) -> f64 {
        if it < self.warmup_iters {
            // In f64: `warmup_iters + 1` overflows u64 for the largest warmups.
            return self.max_lr * (it as f64 + 1.0) / (self.warmup_iters as f64 + 1.0);
        }
        if it > self.decay_iters || self.decay_iters <= self.warmup_iters {
            return self.min_lr;
        }
        let ratio = (it - self.warmup_iters) as f64 / (self.decay_iters - self.warmup_iters) as f64;
        let coeff = 0.5 * (1.0 + libm::cos(core::f64::consts::PI * ratio));
        self.min_lr + coeff * (self.max_lr - self.min_lr)
    }
}

/// The per-step constants of [`adamw_step`]'s inner loop.
#[derive(Clone, Copy)]
struct AdamConsts<T> {
    scale: T,
    decay: T,
    one_m_b1: T,
    b2: T,
    one_m_b2: T,
    bc2_sqrt: T,
    eps: T,
    step_size: T,
}

#[inline(always)]
fn adamw_elements<T: Float>(p: &mut [T], m: &mut [T], v: &mut [T], g: &[T], k: AdamConsts<T>) {
    for (((p, m), v), &g) in p.iter_mut().zip(m.iter_mut()).zip(v.iter_mut()).zip(g) {
        let g = g * k.scale;
        *p *= k.decay;
        *m += (g - *m) * k.one_m_b1;
        *v = *v * k.b2 + k.one_m_b2 * g * g;
        let denom = v.sqrt() / k.bc2_sqrt + k.eps;
        *p -= k.step_size * *m / denom;
    }
}

wide_dispatch!(
    /// AdamW on one slice of parameters (PyTorch's operation order).
    fn adamw_update<T>(p: &mut [T], m: &mut [T], v: &mut [T], g: &[T], k: AdamConsts<T>) => adamw_elements
);

/// The tensors of one AdamW update, each `plan.params_len()` long, in plan order.
pub struct AdamWTensors<'a, T> {
    /// Parameters (updated).
    pub params: &'a mut [T],
    /// Their gradients (read).
    pub grads: &'a [T],
    /// First moments (updated) of the parameters from `shard_start` on.
    pub m: &'a mut [T],
    /// Second moments (updated), as many as `m`.
    pub v: &'a mut [T],
    /// The first parameter the moments belong to: 0 (all of them), or where a ZeRO-1 rank's
    /// shard starts. Only the parameters the moments cover are updated.
    pub shard_start: usize,
}

/// One AdamW update of every parameter the moments cover (all, or a ZeRO-1 shard). `step` is
/// 1-based (bias correction); `grad_scale` multiplies every gradient first (the clip factor).
/// Moments and parameters are updated in one pass; gradients are left as they were.
pub fn adamw_step<T: Float>(par: &dyn Parallel, plan: &Plan, t: AdamWTensors<'_, T>, cfg: &AdamWConfig, lr: f64, step: u64, grad_scale: f64) {
    let AdamWTensors { params, grads, m, v, shard_start } = t;
    let len = m.len();
    assert!(params.len() == plan.params_len() && grads.len() == params.len() && v.len() == len && shard_start + len <= params.len());
    let bc1 = 1.0 - libm::pow(cfg.beta1, step as f64);
    let bc2_sqrt = libm::sqrt(1.0 - libm::pow(cfg.beta2, step as f64));
    let b2 = T::from_f64(cfg.beta2);
    let (one_m_b1, one_m_b2) = (T::from_f64(1.0 - cfg.beta1), T::from_f64(1.0 - cfg.beta2));
    let step_size = T::from_f64(lr / bc1);
    let (bc2_sqrt, eps, scale) = (T::from_f64(bc2_sqrt), T::from_f64(cfg.eps), T::from_f64(grad_scale));
    let decay = T::from_f64(1.0 - lr * cfg.weight_decay);
    let tasks = par.threads() * 4;
    let (p_ptr, m_ptr, v_ptr) = (SharedMut(params.as_mut_ptr()), SharedMut(m.as_mut_ptr()), SharedMut(v.as_mut_ptr()));
    par.run(tasks, &|task| {
        let mine = split_range(len, tasks, task);
        let mine = shard_start + mine.start..shard_start + mine.end;
        for info in plan.params() {
            let lo = info.span.offset.max(mine.start);
            let hi = info.span.end().min(mine.end);
            if lo >= hi {
                continue;
            }
            // SAFETY: tasks own disjoint element ranges.
            let (p, mm, vv) = unsafe { (p_ptr.slice(lo, hi - lo), m_ptr.slice(lo - shard_start, hi - lo), v_ptr.slice(lo - shard_start, hi - lo)) };
            let decay = if info.kind.is_matrix() { decay } else { T::ONE };
            let k = AdamConsts { scale, decay, one_m_b1, b2, one_m_b2, bc2_sqrt, eps, step_size };
            adamw_update(p, mm, vv, &grads[lo..hi], k);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_matches_nanogpt() {
        let s = LrSchedule { max_lr: 1e-3, min_lr: 1e-4, warmup_iters: 100, decay_iters: 2000 };
        assert!((s.at(0) - 1e-3 / 101.0).abs() < 1e-18);
        assert!((s.at(99) - 1e-3 * 100.0 / 101.0).abs() < 1e-18);
        assert!((s.at(100) - 1e-3).abs() < 1e-18);
        assert!((s.at(1050) - 5.5e-4).abs() < 1e-12);
        assert!((s.at(2000) - 1e-4).abs() < 1e-18);
        assert_eq!(s.at(5000), 1e-4);
    }
}

#[cfg(test)]
mod adamw_tests {
    use super::*;
    use crate::config::GptConfig;
    use crate::parallel::Serial;

    /// The widest build of the update this CPU runs (AVX-512 or AVX2) equals the baseline bit for bit.
    #[test]
    fn wide_update_matches_baseline() {
        let n = 999;
        let g: Vec<f32> = (0..n).map(|i| (i as f32 * 0.77).sin()).collect();
        let start: Vec<f32> = (0..n).map(|i| (i as f32 * 0.31).cos()).collect();
        let k = AdamConsts { scale: 0.7f32, decay: 0.999, one_m_b1: 0.1, b2: 0.99, one_m_b2: 0.01, bc2_sqrt: 0.3, eps: 1e-8, step_size: 0.01 };
        let (mut p1, mut m1, mut v1) = (start.clone(), start.clone(), start.iter().map(|x| x * x).collect::<Vec<_>>());
        let (mut p2, mut m2, mut v2) = (p1.clone(), m1.clone(), v1.clone());
        adamw_update(&mut p1, &mut m1, &mut v1, &g, k);
        adamw_elements(&mut p2, &mut m2, &mut v2, &g, k);
        assert_eq!((p1, m1, v1), (p2, m2, v2));
    }

    /// Two steps against the formula in PyTorch's `torch.optim.AdamW` docs, element by element.
    #[test]
    fn matches_the_reference_update_and_decays_only_matrices() {
        let plan = Plan::new(GptConfig::gpt2(3, 2, 1, 1, 2), 1, 1).unwrap();
        let n = plan.params_len();
        let cfg = AdamWConfig { beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.1 };
        let mut p: Vec<f64> = (0..n).map(|i| (i as f64 * 0.37).sin()).collect();
        let (mut m, mut v) = (vec![0.0; n], vec![0.0; n]);
        let (mut rp, mut rm, mut rv) = (p.clone(), m.clone(), v.clone());
        let (lr, clip) = (0.01, 0.5);
        for step in 1..=2u64 {
            let g: Vec<f64> = (0..n).map(|i| ((i + step as usize) as f64 * 0.91).cos()).collect();
            adamw_step(&Serial, &plan, AdamWTensors { params: &mut p, grads: &g, m: &mut m, v: &mut v, shard_start: 0 }, &cfg, lr, step, clip);
            for info in plan.params() {
                for i in info.span.range() {
                    let gi = g[i] * clip;
                    if info.kind.is_matrix() {
                        rp[i] *= 1.0 - lr * cfg.weight_decay;
                    }
                    rm[i] = cfg.beta1 * rm[i] + (1.0 - cfg.beta1) * gi;
                    rv[i] = cfg.beta2 * rv[i] + (1.0 - cfg.beta2) * gi * gi;
                    let mhat = rm[i] / (1.0 - cfg.beta1.powi(step as i32));
                    let vhat = rv[i] / (1.0 - cfg.beta2.powi(step as i32));
                    rp[i] -= lr * mhat / (vhat.sqrt() + cfg.eps);
                }
            }
        }
        for i in 0..n {
            assert!((p[i] - rp[i]).abs() < 1e-12, "param {i}: {} vs {}", p[i], rp[i]);
        }
    }

    /// ZeRO-1: updating the shards one by one, each with its part of the moments, is the
    /// whole update bit for bit (and a shard leaves the other parameters alone).
    #[test]
    fn shards_update_as_the_whole() {
        let plan = Plan::new(GptConfig::gpt2(5, 3, 2, 1, 4), 1, 1).unwrap();
        let n = plan.params_len();
        let cfg = AdamWConfig { beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.1 };
        let g: Vec<f32> = (0..n).map(|i| (i as f32 * 0.91).cos()).collect();
        let start: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let (mut whole, mut m, mut v) = (start.clone(), vec![0.1f32; n], vec![0.2f32; n]);
        adamw_step(&Serial, &plan, AdamWTensors { params: &mut whole, grads: &g, m: &mut m, v: &mut v, shard_start: 0 }, &cfg, 0.01, 3, 0.5);
        let mut sharded = start.clone();
        for rank in 0..3 {
            let s = crate::parallel::shard(n, 3, rank);
            let (mut sm, mut sv) = (vec![0.1f32; s.len()], vec![0.2f32; s.len()]);
            let before = sharded.clone();
            let t = AdamWTensors { params: &mut sharded, grads: &g, m: &mut sm, v: &mut sv, shard_start: s.start };
            adamw_step(&Serial, &plan, t, &cfg, 0.01, 3, 0.5);
            assert_eq!((&sm[..], &sv[..]), (&m[s.clone()], &v[s.clone()]));
            assert!((0..n).filter(|i| !s.contains(i)).all(|i| sharded[i] == before[i]));
        }
        assert_eq!(sharded, whole);
    }
}
