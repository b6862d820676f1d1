//! bf16 products: `C = A·B + beta·C` with A's and B's values rounded to bfloat16 as they are
//! packed and their products summed in f32, on AVX512-BF16's `VDPBF16PS` (one instruction
//! multiplies 16 lanes' pairs of bf16 along the depth and adds both products to the lane's
//! f32 sum: twice the multiply-adds of an f32 FMA of the same width).
//!
//! Rounding is to nearest even, as `VCVTNE2PS2BF16` rounds, with denormal inputs taken as zero
//! (the unit's handling of them); [`round_bf16`] is the same rounding in scalar code, for the
//! depth-paired packing of A and for references.
//!
//! Blocking (single-threaded; callers split rows across tasks, as for [`super::gemm`]): K
//! blocks of [`KC`] → row blocks of A ([`super::MC`] rows), packed once as depth pairs per
//! micro-panel of [`MR`] rows → column panels of [`NR`] columns of B, packed as depth pairs
//! (two rows converted and interleaved per vector) → the micro-kernel, which keeps an
//! `MR x NR` tile of C in 24 registers and broadcasts one pair of A against 32 columns of B per
//! step. Edge tiles run the whole tile on zero-padded operands and store only their rows and
//! columns, so a value of C does not depend on where tile edges fall.

use super::{Rows, RowsMut, Shape, Strided};

/// Rows of C per micro-tile.
pub const MR: usize = 12;
/// Columns of C per micro-tile.
pub const NR: usize = 32;
/// Depth of a K block (even): a 32-column B panel of it is 24 KiB of bf16 pairs, half an L1.
pub const KC: usize = 384;

/// `x` rounded to bfloat16 (its bits), to nearest even, a denormal taken as zero (keeping
/// its sign), a NaN kept quiet.
#[inline]
pub fn round_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if bits & 0x7f80_0000 == 0 {
        return (bits >> 16) as u16 & 0x8000;
    }
    if x.is_nan() {
        return (bits >> 16) as u16 | 0x0040;
    }
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// The f32 value of bfloat16 bits `b`.
#[inline]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// The bf16 micro-kernel this CPU runs, if any: `avx512-bf16` where it has AVX512-BF16 (with
/// AVX-512 F and BW), detected at run time (with `std`, less what `ALPHA_CPU_MASK` masks:
/// [`crate::simd::masked`]; without it, where the build enables them).
pub fn bf16_kernel_name() -> Option<&'static str> {
    has_avx512_bf16().then_some("avx512-bf16")
}

/// The bf16 GEMM's peak GFLOP/s on every thread of `par` together, measured as
/// [`super::peak_gflops`] measures the f32 one (the figure MFU in bf16 is taken against);
/// `None` where the CPU has no bf16 kernel.
#[cfg(feature = "alloc")]
pub fn peak_gflops(par: &dyn super::Parallel, now: &dyn Fn() -> f64) -> Option<f64> {
    has_avx512_bf16().then(|| super::product_peak(par, now, gemm_bf16))
}

fn has_avx512_bf16() -> bool {
    #[cfg(all(target_arch = "x86_64", feature = "std"))]
    {
        use crate::simd::masked;
        use std::is_x86_feature_detected as has;
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| has!("avx512f") && has!("avx512bw") && has!("avx512bf16") && !["avx512f", "avx512bw", "avx512bf16"].iter().any(|f| masked(f)))
    }
    #[cfg(not(all(target_arch = "x86_64", feature = "std")))]
    {
        cfg!(all(target_arch = "x86_64", target_feature = "avx512f", target_feature = "avx512bw", target_feature = "avx512bf16"))
    }
}

/// `C[m x n] = A[m x k] · B[k x n] + beta · C` with A and B rounded to bf16 and the sums in
/// f32 (see the module docs); A has any strides, B and C are row-major. With `beta == 0`, C
/// is only written.
///
/// # Panics
/// If the CPU has no bf16 kernel ([`bf16_kernel_name`] is `None`), or A has no unit stride.
///
/// # Safety
/// As [`super::gemm`]: every element reached through the shapes and strides must be valid; `c`
/// must not overlap `a` or `b`, and no other thread may access the written part of `c`.
pub unsafe fn gemm_bf16(shape: Shape, a: Strided<f32>, b: Rows<f32>, beta: f32, c: RowsMut<f32>) {
    assert!(has_avx512_bf16(), "gemm_bf16: this CPU has no bf16 kernel (AVX512-BF16)");
    assert!(a.cs == 1 || a.rs == 1, "gemm_bf16: A needs a unit stride");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has the features (checked); the operands as the caller guarantees.
    unsafe {
        avx512::gemm(shape, a, b, beta, c)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (shape, b, beta, c);
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::super::{Aligned, MC};
    use super::*;
    use core::arch::x86_64::*;
    use core::mem::{transmute, MaybeUninit};
    use core::ops::Range;

    /// See [`super::gemm_bf16`].
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, BW and BF16; the operands as [`super::gemm_bf16`]'s.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn gemm(shape: Shape, a: Strided<f32>, b: Rows<f32>, beta: f32, c: RowsMut<f32>) {
        let Shape { m, n, k } = shape;
        if m == 0 || n == 0 {
            return;
        }
        // Written by the packing before the tiles read them.
        let mut a_pack = Aligned([MaybeUninit::<u32>::uninit(); MC * KC / 2]);
        let mut b_pack = Aligned([MaybeUninit::<u32>::uninit(); NR * KC / 2]);
        if k == 0 {
            // SAFETY: inside C (caller).
            unsafe { scale_c(m, n, beta, c) };
            return;
        }
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            let pairs = kc.div_ceil(2);
            // C's old value counts once, in the first K block; later blocks add to it.
            let beta = if pc == 0 { beta } else { 1.0 };
            for ic in (0..m).step_by(MC) {
                let mc = MC.min(m - ic);
                // SAFETY: inside A; the buffer holds MC rows of KC / 2 pairs.
                unsafe { pack_a(a, ic..ic + mc, pc..pc + kc, a_pack.0.as_mut_ptr().cast()) };
                for jc in (0..n).step_by(NR) {
                    let nc = NR.min(n - jc);
                    // SAFETY: inside B; the buffer holds KC / 2 pairs of NR columns.
                    unsafe { pack_b(b, pc..pc + kc, jc, nc, b_pack.0.as_mut_ptr().cast()) };
                    for (t, i0) in (0..mc).step_by(MR).enumerate() {
                        let rows = MR.min(mc - i0);
                        // SAFETY: the packed panels hold `pairs` steps; the tile's rows and
                        // columns are inside C.
                        unsafe {
                            let c = RowsMut { ptr: c.ptr.add((ic + i0) * c.ld + jc), ld: c.ld };
                            tile(pairs, a_pack.0.as_ptr().cast::<u32>().add(t * pairs * MR), b_pack.0.as_ptr().cast(), beta, c, rows, nc)
                        };
                    }
                }
            }
        }
    }

    /// `C = beta · C` (a product of no depth); with `beta == 0`, zeros.
    #[target_feature(enable = "avx512f")]
    unsafe fn scale_c(m: usize, n: usize, beta: f32, c: RowsMut<f32>) {
        for i in 0..m {
            for j in 0..n {
                // SAFETY: inside C (caller).
                unsafe {
                    let x = c.ptr.add(i * c.ld + j);
                    *x = if beta == 0.0 { 0.0 } else { beta * *x };
                }
            }
        }
    }

    /// The 16-bit lanes' order that interleaves two rows' 16 bf16 values (lanes 0-15 and
    /// 16-31 of a conversion) into 16 depth pairs.
    const INTERLEAVE: [i16; 32] = {
        let mut idx = [0i16; 32];
        let mut j = 0;
        while j < 16 {
            idx[2 * j] = j as i16;
            idx[2 * j + 1] = 16 + j as i16;
            j += 1;
        }
        idx
    };

    /// Two vectors' 16 values each rounded to bf16 and interleaved into 16 pairs (`lo[j]` in
    /// the low half of word `j`, `hi[j]` in the high half).
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn interleaved(lo: __m512, hi: __m512) -> __m512i {
        // SAFETY: features enabled by the attribute; INTERLEAVE is 64 bytes.
        unsafe {
            let both: __m512i = transmute(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_permutexvar_epi16(_mm512_loadu_si512(INTERLEAVE.as_ptr().cast()), both)
        }
    }

    /// The `len` (at most 16) values from `ptr` as a vector, zeros after them; zeros where
    /// `len` is 0.
    #[target_feature(enable = "avx512f")]
    unsafe fn load(ptr: *const f32, len: usize) -> __m512 {
        // SAFETY: a masked load reads only the `len` values (caller: inside the operand).
        unsafe {
            if len == 0 {
                _mm512_setzero_ps()
            } else {
                _mm512_maskz_loadu_ps(((1u32 << len.min(16)) - 1) as u16, ptr)
            }
        }
    }

    /// Packs rows `rows` and depth `depth` of A as the micro-kernel reads them: per micro-panel
    /// of [`MR`] rows (the last zero-padded), `pairs` steps of [`MR`] words, word `(p, i)` the
    /// bf16 pair (`A[i][2p]` low, `A[i][2p + 1]` high; zero past the depth). Row-major A: 32
    /// values of a row converted at once and spread over 16 steps; transposed A: a step's two
    /// columns of the panel's rows (adjacent) converted and interleaved.
    ///
    /// # Safety
    /// The rows and depth must be inside A, which has a unit stride; `out` must hold
    /// `rows.len().div_ceil(MR) * MR * depth.len().div_ceil(2)` words.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn pack_a(a: Strided<f32>, rows: Range<usize>, depth: Range<usize>, out: *mut u32) {
        let pairs = depth.len().div_ceil(2);
        // SAFETY: loads inside A's rows and depth (masked; caller); stores inside `out`.
        unsafe {
            for (t, i0) in rows.clone().step_by(MR).enumerate() {
                let panel = out.add(t * pairs * MR);
                let in_panel = MR.min(rows.end - i0);
                if a.cs == 1 {
                    let mut words = Aligned([0u32; 16]);
                    for i in 0..MR {
                        for p0 in (0..pairs).step_by(16) {
                            if i < in_panel {
                                let row = a.ptr.add((i0 + i) * a.rs + depth.start + 2 * p0);
                                let left = depth.len() - 2 * p0;
                                let (lo, hi) = (load(row, left), load(row.add(16), left.saturating_sub(16)));
                                // The 32 values in order are 16 pairs: round both halves, no interleave.
                                let both: __m512i = transmute(_mm512_cvtne2ps_pbh(hi, lo));
                                _mm512_store_si512(words.0.as_mut_ptr().cast(), both);
                            }
                            for q in 0..16.min(pairs - p0) {
                                *panel.add((p0 + q) * MR + i) = if i < in_panel { words.0[q] } else { 0 };
                            }
                        }
                    }
                } else {
                    for p in 0..pairs {
                        let k = depth.start + 2 * p;
                        let column = |k: usize| if k < depth.end { load(a.ptr.add(k * a.cs + i0), in_panel) } else { _mm512_setzero_ps() };
                        let mut words = Aligned([0u32; 16]);
                        _mm512_store_si512(words.0.as_mut_ptr().cast(), interleaved(column(k), column(k + 1)));
                        core::ptr::copy_nonoverlapping(words.0.as_ptr(), panel.add(p * MR), MR);
                    }
                }
            }
        }
    }

    /// Packs depth `depth` of B's columns `jc..jc + nc` (at most [`NR`]) as `pairs` steps of
    /// [`NR`] words, word `(p, j)` the bf16 pair (`B[2p][j]` low, `B[2p + 1][j]` high), zero
    /// past the depth and the columns.
    ///
    /// # Safety
    /// The depth and columns must be inside B; `out` must hold `pairs * NR` words.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn pack_b(b: Rows<f32>, depth: Range<usize>, jc: usize, nc: usize, out: *mut u32) {
        // SAFETY: loads masked to B's columns and rows inside the depth (caller); stores inside `out`.
        unsafe {
            for (p, k) in depth.clone().step_by(2).enumerate() {
                for half in 0..2 {
                    let cols = nc.saturating_sub(16 * half).min(16);
                    let row = |r: usize| if r < depth.end { load(b.ptr.add(r * b.ld + jc + 16 * half), cols) } else { _mm512_setzero_ps() };
                    _mm512_storeu_si512(out.add(p * NR + 16 * half).cast(), interleaved(row(k), row(k + 1)));
                }
            }
        }
    }

    /// The micro-kernel: the `rows x cols` top-left part of `C[MR x NR] = A·B + beta·C` from
    /// `pairs` steps of packed A (`MR` words each) and B (`NR` words each). With `beta == 0`,
    /// C is only written.
    ///
    /// # Safety
    /// The packed operands must hold `pairs` steps; the part of C must be inside it.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn tile(pairs: usize, a: *const u32, b: *const u32, beta: f32, c: RowsMut<f32>, rows: usize, cols: usize) {
        // SAFETY: reads inside the packed panels; C's writes masked to the tile's part (caller).
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 2]; MR];
            for p in 0..pairs {
                let b0: __m512bh = transmute(_mm512_loadu_si512(b.add(p * NR).cast()));
                let b1: __m512bh = transmute(_mm512_loadu_si512(b.add(p * NR + 16).cast()));
                for (i, row) in acc.iter_mut().enumerate() {
                    let ai: __m512bh = transmute(_mm512_set1_epi32(*a.add(p * MR + i) as i32));
                    row[0] = _mm512_dpbf16_ps(row[0], ai, b0);
                    row[1] = _mm512_dpbf16_ps(row[1], ai, b1);
                }
            }
            let masks: [__mmask16; 2] = [((1u32 << cols.min(16)) - 1) as u16, ((1u32 << cols.saturating_sub(16)) - 1) as u16];
            let beta_v = _mm512_set1_ps(beta);
            for (i, row) in acc.iter().enumerate().take(rows) {
                for (h, (&sum, &mask)) in row.iter().zip(&masks).enumerate() {
                    let at = c.ptr.add(i * c.ld + 16 * h);
                    let out = if beta == 0.0 { sum } else { _mm512_fmadd_ps(beta_v, _mm512_maskz_loadu_ps(mask, at), sum) };
                    _mm512_mask_storeu_ps(at, mask, out);
                }
            }
        }
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;

    /// `C = A·B + beta·C` in f64 on A's and B's values rounded to bf16 as [`round_bf16`]
    /// rounds (the kernel's operands), A row-major or transposed.
    fn reference(shape: Shape, a: &[f32], a_rows: bool, b: &[f32], beta: f32, c: &[f32]) -> Vec<f64> {
        let Shape { m, n, k } = shape;
        let r = |x: f32| f64::from(bf16_to_f32(round_bf16(x)));
        let mut out = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                let sum: f64 = (0..k).map(|p| r(if a_rows { a[i * k + p] } else { a[p * m + i] }) * r(b[p * n + j])).sum();
                out[i * n + j] = sum + if beta == 0.0 { 0.0 } else { f64::from(beta) * f64::from(c[i * n + j]) };
            }
        }
        out
    }

    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut rng = crate::Rng::new(seed);
        (0..len).map(|_| rng.normal() as f32).collect()
    }

    #[test]
    fn rounding_is_to_nearest_even_with_denormals_as_zero() {
        assert_eq!(round_bf16(1.0), 0x3f80);
        // Halfway between 1.0 and the next bf16 (1 + 2^-7): to the even one, 1.0.
        assert_eq!(round_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        // Halfway above an odd one: up to the even one.
        assert_eq!(round_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(round_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(round_bf16(-f32::from_bits(1)), 0x8000);
        assert_eq!(round_bf16(f32::MIN_POSITIVE), 0x0080);
        assert_eq!(round_bf16(f32::MAX), 0x7f80, "beyond bf16's largest: infinity");
        assert!(bf16_to_f32(round_bf16(f32::NAN)).is_nan());
    }

    /// Every edge (rows, columns, an odd depth, several K and row blocks), both layouts of
    /// A, beta 0 and not: within 1e-5 relative in norm of the f64 reference on the rounded
    /// operands, and C outside the product untouched.
    #[test]
    fn gemm_bf16_matches_the_reference_on_rounded_operands() {
        if bf16_kernel_name().is_none() {
            println!("skipped: this CPU has no AVX512-BF16");
            return;
        }
        for &(m, n, k) in &[(1, 1, 1), (12, 32, 2), (13, 33, 7), (5, 70, 385), (100, 17, 800), (97, 64, 64)] {
            for a_rows in [true, false] {
                for beta in [0.0f32, 0.5] {
                    let shape = Shape { m, n, k };
                    let a = values(m * k, 1);
                    let b = values(k * n, 2);
                    // C in a wider buffer: its last column must stay as it was.
                    let ldc = n + 1;
                    let mut c: Vec<f32> = values(m * ldc, 3);
                    let before = c.clone();
                    let c_in: Vec<f32> = (0..m * n).map(|x| c[x / n * ldc + x % n]).collect();
                    let a_view = if a_rows { Strided { ptr: a.as_ptr(), rs: k, cs: 1 } } else { Strided { ptr: a.as_ptr(), rs: 1, cs: m } };
                    // SAFETY: the views are inside the buffers; C does not overlap them.
                    unsafe { gemm_bf16(shape, a_view, Rows { ptr: b.as_ptr(), ld: n }, beta, RowsMut { ptr: c.as_mut_ptr(), ld: ldc }) };
                    let want = reference(shape, &a, a_rows, &b, beta, &c_in);
                    let (mut err, mut norm) = (0f64, 0f64);
                    for i in 0..m {
                        for j in 0..n {
                            let w = want[i * n + j];
                            err += (f64::from(c[i * ldc + j]) - w).powi(2);
                            norm += w * w;
                        }
                        assert_eq!(c[i * ldc + n].to_bits(), before[i * ldc + n].to_bits(), "{m}x{n}x{k}: C's row {i} past the product changed");
                    }
                    let rel = (err / norm).sqrt();
                    assert!(rel < 1e-5, "{m}x{n}x{k}, A rows {a_rows}, beta {beta}: relative error {rel:e}");
                }
            }
        }
    }

    /// The conversion unit rounds as [`round_bf16`] does, denormals included: B's packing (the
    /// vector conversion) and A's (the scalar one) give the same operands.
    #[test]
    fn packed_b_is_rounded_as_round_bf16_rounds() {
        if bf16_kernel_name().is_none() {
            println!("skipped: this CPU has no AVX512-BF16");
            return;
        }
        let special = [
            f32::from_bits(1),
            -f32::from_bits(0x007f_ffff),
            f32::MIN_POSITIVE,
            f32::from_bits(0x3f80_8000),
            f32::from_bits(0x3f81_8000),
            f32::MAX,
            -0.0,
            1e-40,
        ];
        let b: Vec<f32> = special.iter().copied().chain(values(2 * NR - special.len(), 4)).collect();
        let mut packed = [0u32; NR];
        // SAFETY: B is 2 x NR; the buffer holds one pair of NR columns.
        unsafe { avx512_pack_b(Rows { ptr: b.as_ptr(), ld: NR }, 0..2, 0, NR, packed.as_mut_ptr()) };
        for (j, &w) in packed.iter().enumerate() {
            assert_eq!(w as u16, round_bf16(b[j]), "row 0, column {j}: {:e}", b[j]);
            assert_eq!((w >> 16) as u16, round_bf16(b[NR + j]), "row 1, column {j}: {:e}", b[NR + j]);
        }
    }

    /// The AVX-512 B packing, for the test above.
    unsafe fn avx512_pack_b(b: Rows<f32>, depth: core::ops::Range<usize>, jc: usize, nc: usize, out: *mut u32) {
        // SAFETY: forwarded; the CPU has the features (the caller checked).
        unsafe { super::avx512::pack_b(b, depth, jc, nc, out) }
    }
}
