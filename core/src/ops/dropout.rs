//! Dropout (nanoGPT's `nn.Dropout`: zero each element with probability `p`, scale the rest by
//! `1 / (1 - p)`) with masks from a counter-based generator, so that every backend draws the
//! same mask and a backward regenerates it instead of storing it.
//!
//! Element `idx` of dropout site `site` in micro-batch `draw` of a run keyed `seed` is kept
//! when word `idx % 4` of Philox4x32-10 (Salmon et al., Random123) at counter
//! `[idx / 4, site, draw_lo, draw_hi]` and key `[seed_lo, seed_hi]` is at least
//! `round(p * 2^32)`: an integer comparison, the same on the CPU, the GPU and in the page.
//! Sites: 0 the embedding, `3l + 1` block `l`'s attention probabilities (element
//! `((b * NH + h) * T + i) * T + j`), `3l + 2` its attention projection and `3l + 3` its MLP
//! projection before the residual adds (element `row * C + col`).
//!
//! ```
//! use alpha_core::ops::dropout::{DropoutKey, Mask, Site};
//!
//! let mask = Mask { site: Site::new(0, 0.5), key: DropoutKey { seed: 7, draw: 0 } };
//! let kept = (0..4000).filter(|&i| mask.keeps(i)).count();
//! assert!((1800..2200).contains(&kept));
//! assert_eq!(mask.site.scale(), 2.0);
//! ```

use crate::float::Float;
use crate::parallel::{split_range, Parallel, SharedMut};

/// One dropout site of the tape: which one, and how often it drops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Site {
    /// The site's number (see the module docs).
    pub id: u32,
    /// Elements whose random word is below this are dropped: `round(p * 2^32)`.
    pub threshold: u32,
}

impl Site {
    /// Site `id` dropping with probability `p` (in `[0, 1)`).
    pub fn new(id: u32, p: f64) -> Site {
        Site { id, threshold: threshold(p) }
    }

    /// The drop probability.
    pub fn p(&self) -> f64 {
        self.threshold as f64 / 4_294_967_296.0
    }

    /// What kept elements are multiplied by: `1 / (1 - p)`.
    pub fn scale(&self) -> f64 {
        1.0 / (1.0 - self.p())
    }
}

/// `round(p * 2^32)` for `p` in `[0, 1)`, at most `u32::MAX`.
pub fn threshold(p: f64) -> u32 {
    libm::round(p.clamp(0.0, 1.0) * 4_294_967_296.0).min(u32::MAX as f64) as u32
}

/// What makes one micro-batch's masks differ from another's: the run's dropout seed and the
/// micro-batch's number over the run (`step * grad_accum + micro`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropoutKey {
    /// The run's dropout seed.
    pub seed: u64,
    /// The micro-batch's number.
    pub draw: u64,
}

impl DropoutKey {
    /// The key as four 32-bit words (seed low, high, draw low, high), as the GPU reads it.
    pub fn words(&self) -> [u32; 4] {
        [self.seed as u32, (self.seed >> 32) as u32, self.draw as u32, (self.draw >> 32) as u32]
    }
}

/// Philox4x32-10: four random words from a 128-bit counter and a 64-bit key.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    const M0: u64 = 0xD251_1F53;
    const M1: u64 = 0xCD9E_8D57;
    const W0: u32 = 0x9E37_79B9;
    const W1: u32 = 0xBB67_AE85;
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        let p0 = M0 * c[0] as u64;
        let p1 = M1 * c[2] as u64;
        c = [(p1 >> 32) as u32 ^ c[1] ^ k[0], p1 as u32, (p0 >> 32) as u32 ^ c[3] ^ k[1], p0 as u32];
    }
    c
}

/// One site's mask in one micro-batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mask {
    /// The site.
    pub site: Site,
    /// The micro-batch.
    pub key: DropoutKey,
}

impl Mask {
    /// The random words of elements `4 * block .. 4 * block + 4`.
    fn words(&self, block: u64) -> [u32; 4] {
        let [s0, s1, d0, d1] = self.key.words();
        philox4x32_10([block as u32, self.site.id, d0, d1], [s0, s1])
    }

    /// Whether element `idx` is kept.
    pub fn keeps(&self, idx: u64) -> bool {
        self.words(idx / 4)[(idx % 4) as usize] >= self.site.threshold
    }

    /// Calls `f(i, kept)` for the consecutive elements `first .. first + len` of the site,
    /// one Philox call per block of four.
    #[inline(always)]
    fn each(&self, first: u64, len: usize, mut f: impl FnMut(usize, bool)) {
        let mut words = self.words(first / 4);
        for i in 0..len {
            let idx = first + i as u64;
            if idx.is_multiple_of(4) && i > 0 {
                words = self.words(idx / 4);
            }
            f(i, words[(idx % 4) as usize] >= self.site.threshold);
        }
    }

    /// `out[i] = residual[i] + mask(first + i) * scale * y[i]` (no residual: 0) for the
    /// consecutive elements `first ..` of the site.
    pub fn apply<T: Float>(&self, out: &mut [T], y: &[T], residual: Option<&[T]>, first: u64) {
        let scale = T::from_f64(self.site.scale());
        self.each(first, out.len(), |i, kept| {
            let dropped = if kept { y[i] * scale } else { T::ZERO };
            out[i] = residual.map_or(dropped, |r| r[i] + dropped);
        });
    }

    /// [`Mask::apply`] in place, without a residual.
    pub fn apply_in_place<T: Float>(&self, x: &mut [T], first: u64) {
        let scale = T::from_f64(self.site.scale());
        self.each(first, x.len(), |i, kept| x[i] = if kept { x[i] * scale } else { T::ZERO });
    }
}

/// Forward's tensors, `W` written and `R` read: `out = residual + dropout(y)`.
pub struct Forward<W, R> {
    /// Output `[N, C]`.
    pub out: W,
    /// What is dropped `[N, C]`.
    pub y: R,
    /// Added after the dropout (the residual stream), if any.
    pub residual: Option<R>,
    /// The site.
    pub site: Site,
}

/// Backward's tensors: `dy = dropout(dout)` with forward's mask (a residual's gradient is
/// `dout` itself).
pub struct Backward<W, R> {
    /// Gradient of `y` (overwritten).
    pub dy: W,
    /// Gradient of the output.
    pub dout: R,
    /// The site.
    pub site: Site,
}

/// Elements per task chunk: whole Philox blocks (a multiple of 4), and enough work per task.
const CHUNK: usize = 4096;

/// Forward: `out = residual + mask * scale * y` in micro-batch `key`.
pub fn forward<T: Float>(par: &dyn Parallel, a: Forward<&mut [T], &[T]>, key: DropoutKey) {
    let Forward { out, y, residual, site } = a;
    assert!(y.len() == out.len() && residual.is_none_or(|r| r.len() == out.len()), "dropout: shape mismatch");
    let mask = Mask { site, key };
    let (len, out_p) = (out.len(), SharedMut(out.as_mut_ptr()));
    let tasks = len.div_ceil(CHUNK).min(par.threads() * 4).max(1);
    par.run(tasks, &|task| {
        // Whole chunks per task, so that each starts on a Philox block.
        let chunks = split_range(len.div_ceil(CHUNK), tasks, task);
        let r = chunks.start * CHUNK..(chunks.end * CHUNK).min(len);
        // SAFETY: tasks own disjoint ranges of `out`.
        let o = unsafe { out_p.slice(r.start, r.len()) };
        mask.apply(o, &y[r.clone()], residual.map(|res| &res[r.clone()]), r.start as u64);
    });
}

/// Backward: `dy = mask * scale * dout` in micro-batch `key`.
pub fn backward<T: Float>(par: &dyn Parallel, a: Backward<&mut [T], &[T]>, key: DropoutKey) {
    let Backward { dy, dout, site } = a;
    forward(par, Forward { out: dy, y: dout, residual: None, site }, key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::*;
    use crate::parallel::{ReversedThreads, Serial};
    use crate::rng::Rng;

    /// Random123's known answers for Philox4x32-10 (its `kat_vectors`).
    #[test]
    fn philox_matches_random123() {
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
        assert_eq!(philox4x32_10([u32::MAX; 4], [u32::MAX; 2]), [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]);
        let pi = philox4x32_10([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]);
        assert_eq!(pi, [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]);
    }

    /// The drop rate is `p`, masks differ between sites and draws, and `p = 0` keeps all.
    #[test]
    fn masks_drop_p_and_differ_by_site_and_draw() {
        let key = DropoutKey { seed: 3, draw: 5 };
        let n = 100_000u64;
        let rate = |m: Mask| (0..n).filter(|&i| !m.keeps(i)).count() as f64 / n as f64;
        let m = Mask { site: Site::new(4, 0.2), key };
        assert!((rate(m) - 0.2).abs() < 0.005, "{}", rate(m));
        assert_eq!(rate(Mask { site: Site::new(4, 0.0), ..m }), 0.0);
        let same = |a: Mask, b: Mask| (0..1000).filter(|&i| a.keeps(i) == b.keeps(i)).count();
        // Independent masks at p = 0.2 agree on about 68% of elements.
        assert!(same(m, Mask { site: Site::new(5, 0.2), ..m }) < 800);
        assert!(same(m, Mask { key: DropoutKey { draw: 6, ..key }, ..m }) < 800);
        assert!(same(m, Mask { key: DropoutKey { seed: 4, ..key }, ..m }) < 800);
    }

    /// The kernel's chunks give every element the mask of its own index, on any thread count.
    #[test]
    fn forward_matches_the_mask_on_any_thread_count() {
        let (len, site, key) = (3 * CHUNK + 37, Site::new(2, 0.3), DropoutKey { seed: 1, draw: 2 });
        let y: Vec<f32> = (0..len).map(|i| i as f32 * 0.5 + 1.0).collect();
        let res: Vec<f32> = (0..len).map(|i| -(i as f32)).collect();
        let mask = Mask { site, key };
        for par in [&Serial as &dyn Parallel, &ReversedThreads(3)] {
            let mut out = vec![0f32; len];
            forward(par, Forward { out: &mut out, y: &y, residual: Some(&res), site }, key);
            for i in 0..len {
                let want = res[i] + if mask.keeps(i as u64) { y[i] * (1.0 / 0.7f64) as f32 } else { 0.0 };
                assert_eq!(out[i], want, "element {i}");
            }
        }
    }

    #[test]
    fn gradients_match_finite_differences() {
        let (len, site, key) = (203, Site::new(1, 0.4), DropoutKey { seed: 9, draw: 1 });
        let mut rng = Rng::new(4);
        let mut y = random(&mut rng, len, 1.0);
        let (res, g) = (random(&mut rng, len, 1.0), random(&mut rng, len, 1.0));
        let mut dy = vec![0.0; len];
        backward(&Serial, Backward { dy: &mut dy, dout: &g, site }, key);
        let mut out = vec![0.0; len];
        let numeric = numeric_grad(&mut y, |y| {
            forward(&Serial, Forward { out: &mut out, y, residual: Some(&res), site }, key);
            weighted_sum(&out, &g)
        });
        assert_close("dy", &dy, &numeric);
    }
}
