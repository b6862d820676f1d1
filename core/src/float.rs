//! The element type of every arena: `f32` for training, `f64` for the gradient checks.
//!
//! Unstable: public for the kernels and the gradient checks; it changes with any release (see
//! the crate's Stability section).
//!
//! Kernels are written once, generic over [`Float`], so the finite-difference tests run the
//! very same code in double precision.

use core::fmt::Debug;
use core::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

/// A floating-point element type the kernels can run on.
pub trait Float:
    Copy
    + Debug
    + Default
    + PartialOrd
    + Send
    + Sync
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + 'static
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// Converts from `f64` (rounding).
    fn from_f64(x: f64) -> Self;
    /// Converts to `f64` (exact).
    fn to_f64(self) -> f64;
    /// e^x.
    fn exp(self) -> Self;
    /// e^x of every lane, each as [`Float::exp`] computes it (f32: one step at a time
    /// across the lanes, so their dependency chains overlap).
    #[inline(always)]
    fn exp_lanes<const N: usize>(mut x: [Self; N]) -> [Self; N] {
        for x in &mut x {
            *x = x.exp();
        }
        x
    }
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// The larger of two values.
    fn max(self, other: Self) -> Self {
        if other > self {
            other
        } else {
            self
        }
    }
}

impl Float for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    #[inline(always)]
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn exp(self) -> Self {
        exp_f32(self)
    }
    #[inline(always)]
    fn exp_lanes<const N: usize>(x: [Self; N]) -> [Self; N] {
        exp_f32_lanes(x)
    }
    #[inline(always)]
    fn ln(self) -> Self {
        libm::logf(self)
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        // std's is an LLVM intrinsic and vectorises; libm's is a scalar call. Both are exact.
        #[cfg(feature = "std")]
        return <f32>::sqrt(self);
        #[cfg(not(feature = "std"))]
        return libm::sqrtf(self);
    }
}

impl Float for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    #[inline(always)]
    fn from_f64(x: f64) -> Self {
        x
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn exp(self) -> Self {
        libm::exp(self)
    }
    #[inline(always)]
    fn ln(self) -> Self {
        libm::log(self)
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        libm::sqrt(self)
    }
}

/// `Σ term(a[i], b[i], c[i])` over 16 independent partial sums combined pairwise: the loop
/// vectorises (a plain running sum is one long dependency chain) and the order is fixed, so
/// the result is deterministic. The slices must have equal lengths.
#[inline(always)]
pub fn sum_map3<T: Float>(a: &[T], b: &[T], c: &[T], term: impl Fn(T, T, T) -> T) -> T {
    const LANES: usize = 16;
    let n = a.len();
    debug_assert!(b.len() == n && c.len() == n);
    let (b, c) = (&b[..n], &c[..n]);
    let mut acc = [T::ZERO; LANES];
    for ((ca, cb), cc) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)).zip(c.chunks_exact(LANES)) {
        for (l, s) in acc.iter_mut().enumerate() {
            *s += term(ca[l], cb[l], cc[l]);
        }
    }
    let mut tail = T::ZERO;
    for i in n / LANES * LANES..n {
        tail += term(a[i], b[i], c[i]);
    }
    sum_lanes(acc) + tail
}

/// The lanes of [`sum_map3`]'s accumulator added pairwise (`l + 8` to `l`, then `l + 4`, ...).
/// Kept out of line: inlined, this tree makes LLVM split the accumulator into eight 2-lane
/// vectors in the main loop instead of one 16-lane one. Each level is a new array of fixed
/// length: updating `acc` in place by a loop over halving widths compiled to partial stores
/// and wider loads of the same bytes, which stalled store forwarding (~16 ns a call here).
#[inline(never)]
pub(crate) fn sum_lanes<T: Float>(acc: [T; 16]) -> T {
    let mut half = [T::ZERO; 8];
    for l in 0..8 {
        half[l] = acc[l] + acc[l + 8];
    }
    let mut quarter = [T::ZERO; 4];
    for l in 0..4 {
        quarter[l] = half[l] + half[l + 4];
    }
    (quarter[0] + quarter[2]) + (quarter[1] + quarter[3])
}

/// `Σ term(a[i], b[i])` in [`sum_map3`]'s order.
#[inline(always)]
pub fn sum_map2<T: Float>(a: &[T], b: &[T], term: impl Fn(T, T) -> T) -> T {
    sum_map3(a, b, b, |x, y, _| term(x, y))
}

/// `Σ term(a[i])` in [`sum_map3`]'s order.
#[inline(always)]
pub fn sum_map<T: Float>(a: &[T], term: impl Fn(T) -> T) -> T {
    sum_map3(a, a, a, |x, _, _| term(x))
}

/// The largest element of a non-empty slice, over 16 lanes so the loop vectorises.
#[inline(always)]
pub fn max_of<T: Float>(a: &[T]) -> T {
    max_of_first(a, a.len())
}

/// The largest of the first `live` elements of `a` (`1 <= live <= a.len()`), over 16 lanes.
/// A last partial chunk is read whole where `a` extends that far, with the lanes past `live`
/// masked, so a causal row padded to a multiple of 16 has no scalar tail. The lanes are
/// combined pairwise (max is exact: any order gives the same value).
#[inline(always)]
pub fn max_of_first<T: Float>(a: &[T], live: usize) -> T {
    let first = a[0];
    let mut lanes = [first; 16];
    let whole = live / 16 * 16;
    for chunk in a[..whole].chunks_exact(16) {
        for (l, &x) in lanes.iter_mut().zip(chunk) {
            *l = l.max(x);
        }
    }
    let mut tail = first;
    if live > whole && a.len() >= whole + 16 {
        for (j, (l, &x)) in lanes.iter_mut().zip(&a[whole..whole + 16]).enumerate() {
            *l = l.max(if whole + j < live { x } else { first });
        }
    } else {
        tail = a[whole..live].iter().fold(first, |m, &x| m.max(x));
    }
    let mut width = lanes.len();
    while width > 1 {
        width /= 2;
        for l in 0..width {
            lanes[l] = lanes[l].max(lanes[l + width]);
        }
    }
    lanes[0].max(tail)
}

/// Dot product in [`sum_map3`]'s order.
#[inline(always)]
pub fn dot<T: Float>(a: &[T], b: &[T]) -> T {
    sum_map2(a, b, |x, y| x * y)
}

/// e^x for f32 without branches or table lookups (Cephes `expf` polynomial, evaluated in
/// Estrin's scheme: three independent pairs, a shorter dependency chain than Horner's), so it
/// inlines and vectorises. Inputs are clamped to [-87, 88]: below, the result is the smallest
/// value e^-87 ≈ 1.6e-38 instead of a subnormal; within 1 ulp elsewhere (tested below).
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    exp_f32_lanes([x])[0]
}

/// [`exp_f32`] of every lane, one step (one loop over the lanes) at a time: one exp is a
/// chain of ~20 dependent operations, and the lanes' chains overlap only where their steps
/// are interleaved (GELU's forward took a third less time on 32 lanes than one by one).
/// Explicit loops rather than `map` or `from_fn`, which were not always inlined.
#[inline(always)]
pub fn exp_f32_lanes<const N: usize>(x: [f32; N]) -> [f32; N] {
    const LOG2E: f32 = core::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer in the FPU.
    const ROUND: f32 = 12_582_912.0;
    let (mut t, mut n, mut r, mut r2, mut p) = ([0.0; N], [0.0; N], [0.0; N], [0.0; N], [0.0; N]);
    let mut x = x;
    for x in &mut x {
        *x = x.clamp(-87.0, 88.0);
    }
    // t = ROUND + n exactly, so t's low mantissa bits hold the integer n: 2^n comes from
    // integer arithmetic on those bits (no float-to-int conversion, which does not vectorise).
    for i in 0..N {
        t[i] = x[i] * LOG2E + ROUND;
    }
    for i in 0..N {
        n[i] = t[i] - ROUND;
    }
    for i in 0..N {
        r[i] = x[i] - n[i] * LN2_HI - n[i] * LN2_LO;
    }
    for i in 0..N {
        r2[i] = r[i] * r[i];
    }
    for i in 0..N {
        let q0 = 1.666_666_5e-1 * r[i] + 0.5; // Cephes: 5.0000001e-1, which is 0.5 in f32
        let q1 = 8.333_452e-3 * r[i] + 4.166_579_6e-2;
        let q2 = 1.987_569_1e-4 * r[i] + 1.398_199_9e-3;
        p[i] = q0 + r2[i] * (q1 + r2[i] * q2);
    }
    for i in 0..N {
        let two_n = f32::from_bits(t[i].to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23);
        x[i] = two_n * (p[i] * r2[i] + r[i] + 1.0);
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    fn max_relative_error(f: impl Fn(f32) -> f32, exact: impl Fn(f64) -> f64, lo: f32, hi: f32) -> f64 {
        let n = 400_000;
        (0..=n)
            .map(|i| {
                let x = lo + (hi - lo) * i as f32 / n as f32;
                let e = exact(x as f64);
                (f(x) as f64 - e).abs() / e.abs()
            })
            .fold(0.0, f64::max)
    }

    /// `max_of_first` finds the largest of the live elements wherever it lies, whatever the
    /// elements past `live` hold.
    #[test]
    fn max_of_first_ignores_masked_elements() {
        for len in [1, 5, 16, 17, 40, 64] {
            for live in 1..=len {
                for at in 0..live {
                    let mut a: Vec<f32> = (0..len).map(|i| -((i * 7 % 5) as f32)).collect();
                    a[at] = 3.0;
                    a[live..].fill(9.0);
                    assert_eq!(max_of_first(&a, live), 3.0, "len {len} live {live} at {at}");
                }
            }
        }
    }

    #[test]
    fn exp_is_within_one_ulp() {
        // One f32 ulp is at most 2^-23 ≈ 1.19e-7 relative.
        let worst = max_relative_error(exp_f32, libm::exp, -87.0, 88.0);
        assert!(worst < 1.2e-7, "max relative error {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
    }
}
