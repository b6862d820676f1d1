//! bf16 products: `C = A·B + beta·C` with A's and B's values rounded to bfloat16 as they are
//! packed and their products summed in f32, on AVX512-BF16's `VDPBF16PS` (one instruction
//! multiplies 16 lanes' pairs of bf16 along the depth and adds both products to the lane's
//! f32 sum: twice the multiply-adds of an f32 FMA of the same width).
//!
//! Rounding is to nearest even by `VCVTNE2PS2BF16` as the operands are packed, with denormal
//! inputs taken as zero (the unit's handling of them); [`round_bf16`] is the same rounding in
//! scalar code, for references.
//!
//! Blocking (single-threaded; callers split rows across tasks, as for [`super::gemm`]): K
//! blocks of [`KC`] → row blocks of A ([`super::MC`] rows), packed once as depth pairs per
//! micro-panel of [`MR`] rows → column panels of [`NR`] columns of B, packed as depth pairs →
//! the micro-kernel, which keeps an `MR x NR` tile of C in 24 registers and broadcasts one
//! pair of A against 32 columns of B per step. A B that many products read (a layer's weight,
//! read by every block of rows) is packed once by [`pack_panels`] instead
//! ([`BOperand::Panels`]). Edge tiles run the whole tile on zero-padded operands and store
//! only their rows and columns, so a value of C does not depend on where tile edges fall.

use super::{Band, RowsMut, Shape, Strided};
use crate::float::Float;

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
    // SAFETY (the closure): product_peak passes valid, non-overlapping operands, and the CPU
    // has the kernel.
    has_avx512_bf16().then(|| {
        super::product_peak(par, now, |shape, a, b, c| unsafe {
            gemm_bf16(shape, a, BOperand::Values(Strided { ptr: b.ptr, rs: b.ld, cs: 1 }), 0.0, core::ptr::null(), c)
        })
    })
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

/// B of a [`gemm_bf16`] product.
#[derive(Clone, Copy)]
pub enum BOperand {
    /// f32 values with a unit stride, rounded and packed by the product itself.
    Values(Strided<f32>),
    /// Bf16 panels [`pack_panels`] packed once, from the product's first column on
    /// ([`panels_at`]).
    Panels {
        /// The product's first column's panel.
        ptr: *const u32,
        /// The depth they were packed for: the product's, or more (it reads the first).
        depth: usize,
    },
}

/// Words [`pack_panels`] writes for a `k x n` B: per [`NR`] columns, `k.div_ceil(2)` depth
/// pairs of `NR` words (the columns past `n` zero).
pub fn panels_len(k: usize, n: usize) -> usize {
    k.div_ceil(2) * n.next_multiple_of(NR)
}

/// Where column `col` (a multiple of [`NR`]) of a `k`-deep B starts in the words `panels`
/// [`pack_panels`] wrote.
///
/// # Panics
/// If `col` is not a multiple of [`NR`].
pub fn panels_at(panels: *const u32, k: usize, col: usize) -> *const u32 {
    assert_eq!(col % NR, 0, "bf16 panels start every {NR} columns");
    panels.wrapping_add(col / NR * k.div_ceil(2) * NR)
}

/// Packs B `[k x n]` (f32, a unit stride) into the bf16 panels [`gemm_bf16`]'s micro-kernel
/// reads, rounded as a product rounds its own B (the same bits), for a B that many products
/// read; the panels split across `par`'s threads.
///
/// # Panics
/// If the CPU has no bf16 kernel, or B has no unit stride.
///
/// # Safety
/// B's `k x n` values must be valid; `out` must hold [`panels_len`]`(k, n)` words, which
/// nothing else accesses meanwhile.
pub unsafe fn pack_panels(par: &dyn super::Parallel, b: Strided<f32>, k: usize, n: usize, out: *mut u32) {
    assert!(has_avx512_bf16(), "bf16 pack_panels: this CPU has no bf16 kernel (AVX512-BF16)");
    assert!(b.cs == 1 || b.rs == 1, "bf16 pack_panels: B needs a unit stride");
    let panels = n.div_ceil(NR);
    let tasks = par.threads().min(panels);
    let out = crate::parallel::SharedMut(out);
    par.run(tasks, &|task| {
        for j in crate::parallel::split_range(panels, tasks, task) {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU has the features (checked); columns j·NR.. of B's depth are
            // inside B, and panel j inside `out`, this task's alone (caller).
            unsafe {
                avx512::pack_b(b, 0..k, j * NR, NR.min(n - j * NR), out.ptr().add(j * k.div_ceil(2) * NR))
            };
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (b, j, k, &out);
        }
    });
}

/// `C[m x n] = A[m x k] · B[k x n] + (beta · C + bias)` with A and B rounded to bf16 and the
/// sums in f32 (see the module docs); A row-major or transposed (a unit stride either way), B
/// the same ([`BOperand::Values`]: a weight `W [n, k]` is `B = Wᵀ` in place) or packed
/// ([`BOperand::Panels`]), C row-major; `bias` is `n` values added to every row, or null
/// (none). With `beta == 0`, C is only written. The bits do not depend on how B is given.
///
/// # Panics
/// If the CPU has no bf16 kernel ([`bf16_kernel_name`] is `None`), or A or B has no unit
/// stride.
///
/// # Safety
/// As [`super::gemm`]: every element reached through the shapes and strides must be valid (B's
/// panels: the product's columns' panels, of their depth); `c` must not overlap `a` or `b`,
/// and no other thread may access the written part of `c`.
pub unsafe fn gemm_bf16(shape: Shape, a: Strided<f32>, b: BOperand, beta: f32, bias: *const f32, c: RowsMut<f32>) {
    // SAFETY: forwarded.
    unsafe { product(shape, a, b, beta, bias, c, Band::Full) }
}

/// [`gemm_bf16`] (without a bias) for an A that is zero outside `band` (attention's causal
/// products): the depth pairs no row needs are skipped (bits as [`gemm_bf16`]'s wherever B
/// is finite there), as [`super::gemm_banded`] skips f32 depth.
///
/// # Panics
/// As [`gemm_bf16`].
///
/// # Safety
/// As [`gemm_bf16`].
pub unsafe fn gemm_bf16_banded(shape: Shape, a: Strided<f32>, b: BOperand, beta: f32, c: RowsMut<f32>, band: Band) {
    // SAFETY: forwarded.
    unsafe { product(shape, a, b, beta, core::ptr::null(), c, band) }
}

/// [`gemm_bf16_banded`] with a bias.
///
/// # Safety
/// As [`gemm_bf16`].
unsafe fn product(shape: Shape, a: Strided<f32>, b: BOperand, beta: f32, bias: *const f32, c: RowsMut<f32>, band: Band) {
    assert!(has_avx512_bf16(), "gemm_bf16: this CPU has no bf16 kernel (AVX512-BF16)");
    let unit = |s: Strided<f32>| s.cs == 1 || s.rs == 1;
    assert!(unit(a) && !matches!(b, BOperand::Values(b) if !unit(b)), "gemm_bf16: A and B need a unit stride");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has the features (checked); the operands as the caller guarantees.
    unsafe {
        avx512::gemm(shape, a, b, beta, bias, c, band)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (shape, b, beta, bias, c, band);
}

/// The ops' products are generic over their float type, and `T` is f32 wherever bf16 products
/// run (the one 4-byte [`Float`]): `m`'s values as f32.
///
/// # Panics
/// If `T` is not 4 bytes wide.
pub(crate) fn as_f32<T: Float>(m: Strided<T>) -> Strided<f32> {
    assert_eq!(core::mem::size_of::<T>(), 4, "bf16 products take f32 operands");
    Strided { ptr: m.ptr.cast(), rs: m.rs, cs: m.cs }
}

/// [`gemm_bf16_banded`] with an optional bias, for an op's `T` (see [`as_f32`]).
///
/// # Safety
/// As [`gemm_bf16`].
pub(crate) unsafe fn product_of<T: Float>(shape: Shape, a: Strided<T>, b: BOperand, beta: T, bias: Option<&[T]>, c: RowsMut<T>, band: Band) {
    let bias = bias.map_or(core::ptr::null(), |b| b.as_ptr().cast::<f32>());
    // SAFETY: T is f32 (as_f32 checks); the operands as the caller guarantees.
    unsafe { product(shape, as_f32(a), b, beta.to_f64() as f32, bias, RowsMut { ptr: c.ptr.cast(), ld: c.ld }, band) }
}

/// [`pack_panels`] of B `[k x n]` (`b`, a unit stride) into `out`'s storage (an op's `T`, see
/// [`as_f32`]); the panels from the first column on.
///
/// # Panics
/// As [`pack_panels`], or if `out` is shorter than [`panels_len`]`(k, n)`.
///
/// # Safety
/// B's `k x n` values must be valid.
pub(crate) unsafe fn pack_panels_of<T: Float>(par: &dyn super::Parallel, b: Strided<T>, k: usize, n: usize, out: &mut [T]) -> BOperand {
    assert!(out.len() >= panels_len(k, n), "bf16 panels: the scratch is too short");
    // SAFETY: B as the caller guarantees; the panels' words fit in `out` (f32's storage, as
    // long and aligned as u32's: checked), which its borrow keeps to this call.
    unsafe { pack_panels(par, as_f32(b), k, n, out.as_mut_ptr().cast()) };
    BOperand::Panels { ptr: out.as_ptr().cast(), depth: k }
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
    pub(super) unsafe fn gemm(shape: Shape, a: Strided<f32>, b: BOperand, beta: f32, bias: *const f32, c: RowsMut<f32>, band: Band) {
        let Shape { m, n, k } = shape;
        if m == 0 || n == 0 {
            return;
        }
        // Written by the packing before the tiles read them.
        let mut a_pack = Aligned([MaybeUninit::<u32>::uninit(); MC * KC / 2]);
        let mut b_pack = Aligned([MaybeUninit::<u32>::uninit(); NR * KC / 2]);
        // At least one K block, empty for a product of no depth: C = beta · C + bias.
        for pc in (0..k.max(1)).step_by(KC) {
            let kc = KC.min(k - pc);
            let pairs = kc.div_ceil(2);
            // C's old value and the bias count once, in the first K block; later blocks add.
            let (beta, bias) = if pc == 0 { (beta, bias) } else { (1.0, core::ptr::null()) };
            for ic in (0..m).step_by(MC) {
                let mc = MC.min(m - ic);
                // SAFETY: inside A; the buffer holds MC rows of KC / 2 pairs.
                unsafe { pack_a(a, ic..ic + mc, pc..pc + kc, a_pack.0.as_mut_ptr().cast()) };
                for jc in (0..n).step_by(NR) {
                    let nc = NR.min(n - jc);
                    let b_panel = match b {
                        BOperand::Values(b) => {
                            // SAFETY: inside B; the buffer holds KC / 2 pairs of NR columns.
                            unsafe { pack_b(b, pc..pc + kc, jc, nc, b_pack.0.as_mut_ptr().cast()) };
                            b_pack.0.as_ptr().cast::<u32>()
                        }
                        // The K block's pairs in the panel of columns jc.. (KC is even).
                        BOperand::Panels { ptr, depth } => panels_at(ptr, depth, jc).wrapping_add(pc / 2 * NR),
                    };
                    for (t, i0) in (0..mc).step_by(MR).enumerate() {
                        let rows = MR.min(mc - i0);
                        // The band's depth, in whole pairs (A is zero in a pair's other half).
                        let (skip, depth) = band.depth(ic + i0..ic + i0 + rows, pc, kc);
                        let first = skip / 2;
                        let end = if depth == 0 { first } else { (skip + depth).div_ceil(2) };
                        // SAFETY: the packed panels hold `pairs` steps; the tile's rows and
                        // columns are inside C.
                        unsafe {
                            let c = RowsMut { ptr: c.ptr.add((ic + i0) * c.ld + jc), ld: c.ld };
                            let bias = if bias.is_null() { bias } else { bias.add(jc) };
                            let a_panel = a_pack.0.as_ptr().cast::<u32>().add(t * pairs * MR + first * MR);
                            tile(end - first, a_panel, b_panel.wrapping_add(first * NR), beta, bias, c, rows, nc)
                        };
                    }
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
    /// `len` is 0 (`ptr` is then not read: the packing and the store compute such addresses,
    /// past an operand's end, with `wrapping_add`).
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

    /// Packs `lines` (at most `W`) lines of `depth` values as `depth.div_ceil(2)` steps of `W`
    /// words, word `(p, i)` the bf16 pair of line `i`'s values `2p` (low) and `2p + 1` (high),
    /// zero past the depth and the lines; line `i`'s values are adjacent from `src + i * ld`.
    /// 32 values of a line are converted at once (16 pairs in order) and spread over 16 steps.
    ///
    /// # Safety
    /// The lines' values must be inside the operand; `out` must hold the steps.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn pack_along_lines<const W: usize>(src: *const f32, ld: usize, lines: usize, depth: usize, out: *mut u32) {
        let pairs = depth.div_ceil(2);
        let mut words = Aligned([0u32; 16]);
        // SAFETY: loads masked to the lines' depth (caller); stores inside `out`.
        unsafe {
            for i in 0..W {
                for p0 in (0..pairs).step_by(16) {
                    if i < lines {
                        let line = src.add(i * ld + 2 * p0);
                        let left = depth - 2 * p0;
                        let both: __m512i = transmute(_mm512_cvtne2ps_pbh(load(line.wrapping_add(16), left.saturating_sub(16)), load(line, left)));
                        _mm512_store_si512(words.0.as_mut_ptr().cast(), both);
                    }
                    for q in 0..16.min(pairs - p0) {
                        *out.add((p0 + q) * W + i) = if i < lines { words.0[q] } else { 0 };
                    }
                }
            }
        }
    }

    /// [`pack_along_lines`]'s words where the lines' values at one depth are adjacent (from
    /// `src + d * ld`): two depths' values converted and interleaved per 16 lines.
    ///
    /// # Safety
    /// As [`pack_along_lines`].
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn pack_across_lines<const W: usize>(src: *const f32, ld: usize, lines: usize, depth: usize, out: *mut u32) {
        let mut words = Aligned([0u32; 16]);
        // SAFETY: loads masked to the lines, inside the depth (caller); stores inside `out`.
        unsafe {
            for (p, d) in (0..depth).step_by(2).enumerate() {
                for first in (0..W).step_by(16) {
                    let len = lines.saturating_sub(first).min(16);
                    let at = |d: usize| if d < depth { load(src.wrapping_add(d * ld + first), len) } else { _mm512_setzero_ps() };
                    _mm512_store_si512(words.0.as_mut_ptr().cast(), interleaved(at(d), at(d + 1)));
                    core::ptr::copy_nonoverlapping(words.0.as_ptr(), out.add(p * W + first), 16.min(W - first));
                }
            }
        }
    }

    /// Packs rows `rows` and depth `depth` of A as the micro-kernel reads them: per micro-panel
    /// of [`MR`] rows (the last zero-padded), `depth.len().div_ceil(2)` steps of [`MR`] words
    /// (see [`pack_along_lines`]).
    ///
    /// # Safety
    /// The rows and depth must be inside A, which has a unit stride; `out` must hold
    /// `rows.len().div_ceil(MR) * MR * depth.len().div_ceil(2)` words.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn pack_a(a: Strided<f32>, rows: Range<usize>, depth: Range<usize>, out: *mut u32) {
        let pairs = depth.len().div_ceil(2);
        for (t, i0) in rows.clone().step_by(MR).enumerate() {
            let lines = MR.min(rows.end - i0);
            // SAFETY: inside A and `out` (caller).
            unsafe {
                let (src, panel) = (a.ptr.wrapping_add(i0 * a.rs + depth.start * a.cs), out.add(t * pairs * MR));
                if a.cs == 1 {
                    pack_along_lines::<MR>(src, a.rs, lines, depth.len(), panel)
                } else {
                    pack_across_lines::<MR>(src, a.cs, lines, depth.len(), panel)
                }
            }
        }
    }

    /// Packs depth `depth` of B's columns `jc..jc + nc` (at most [`NR`]) as
    /// `depth.len().div_ceil(2)` steps of [`NR`] words (see [`pack_along_lines`]; a column is
    /// a line).
    ///
    /// # Safety
    /// The depth and columns must be inside B, which has a unit stride; `out` must hold the
    /// steps.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn pack_b(b: Strided<f32>, depth: Range<usize>, jc: usize, nc: usize, out: *mut u32) {
        // SAFETY: inside B and `out` (caller).
        unsafe {
            let src = b.ptr.add(depth.start * b.rs + jc * b.cs);
            if b.cs == 1 {
                pack_across_lines::<NR>(src, b.rs, nc, depth.len(), out)
            } else {
                pack_along_lines::<NR>(src, b.cs, nc, depth.len(), out)
            }
        }
    }

    /// The micro-kernel: the `rows x cols` top-left part of `C[MR x NR] = A·B + (beta·C +
    /// bias)` from `pairs` steps of packed A (`MR` words each) and B (`NR` words each); `bias`
    /// is `NR` values (read to `cols`) or null. With `beta == 0`, C is only written.
    ///
    /// # Safety
    /// The packed operands must hold `pairs` steps; the part of C (and of the bias) must be
    /// inside it.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile(pairs: usize, a: *const u32, b: *const u32, beta: f32, bias: *const f32, c: RowsMut<f32>, rows: usize, cols: usize) {
        // SAFETY: reads inside the packed panels and the bias; C's writes masked to the tile's
        // part (caller).
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
            let lens = [cols.min(16), cols.saturating_sub(16)];
            let masks: [__mmask16; 2] = lens.map(|len| ((1u32 << len) - 1) as u16);
            let biases = [0, 1].map(|h| if bias.is_null() { _mm512_setzero_ps() } else { load(bias.wrapping_add(16 * h), lens[h]) });
            let beta_v = _mm512_set1_ps(beta);
            for (i, row) in acc.iter().enumerate().take(rows) {
                for h in 0..2 {
                    let at = c.ptr.wrapping_add(i * c.ld + 16 * h);
                    let add = if beta == 0.0 { biases[h] } else { _mm512_fmadd_ps(beta_v, _mm512_maskz_loadu_ps(masks[h], at), biases[h]) };
                    _mm512_mask_storeu_ps(at, masks[h], _mm512_add_ps(row[h], add));
                }
            }
        }
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::super::MC;
    use super::*;

    /// `C = A·B + beta·C + bias` in f64 on A's and B's values rounded to bf16 as
    /// [`round_bf16`] rounds (the kernel's operands), A and B row-major or transposed.
    #[allow(clippy::too_many_arguments)]
    fn reference(shape: Shape, a: &[f32], a_rows: bool, b: &[f32], b_rows: bool, beta: f32, bias: Option<&[f32]>, c: &[f32]) -> Vec<f64> {
        let Shape { m, n, k } = shape;
        let r = |x: f32| f64::from(bf16_to_f32(round_bf16(x)));
        let mut out = vec![0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                let a_at = |p: usize| if a_rows { a[i * k + p] } else { a[p * m + i] };
                let b_at = |p: usize| if b_rows { b[p * n + j] } else { b[j * k + p] };
                let sum: f64 = (0..k).map(|p| r(a_at(p)) * r(b_at(p))).sum();
                let old = if beta == 0.0 { 0.0 } else { f64::from(beta) * f64::from(c[i * n + j]) };
                out[i * n + j] = sum + old + bias.map_or(0.0, |b| f64::from(b[j]));
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

    /// Every edge (rows, columns, an odd depth, several K and row blocks, no depth), both
    /// layouts of A and of B, beta 0 and not, with a bias and without: within 1e-5 relative in
    /// norm of the f64 reference on the rounded operands, and C outside the product untouched.
    #[test]
    fn gemm_bf16_matches_the_reference_on_rounded_operands() {
        if bf16_kernel_name().is_none() {
            println!("skipped: this CPU has no AVX512-BF16");
            return;
        }
        for &(m, n, k) in &[(1, 1, 1), (12, 32, 2), (13, 33, 7), (5, 70, 385), (100, 17, 800), (97, 64, 64), (3, 5, 0)] {
            for (a_rows, b_rows, with_bias) in [(true, true, false), (false, true, true), (true, false, true), (false, false, false)] {
                for beta in [0.0f32, 0.5] {
                    let shape = Shape { m, n, k };
                    let (a, b, bias) = (values(m * k, 1), values(k * n, 2), values(n, 4));
                    // C in a wider buffer: its last column must stay as it was.
                    let ldc = n + 1;
                    let mut c: Vec<f32> = values(m * ldc, 3);
                    let before = c.clone();
                    let c_in: Vec<f32> = (0..m * n).map(|x| c[x / n * ldc + x % n]).collect();
                    let a_view = if a_rows { Strided { ptr: a.as_ptr(), rs: k, cs: 1 } } else { Strided { ptr: a.as_ptr(), rs: 1, cs: m } };
                    let b_view = if b_rows { Strided { ptr: b.as_ptr(), rs: n, cs: 1 } } else { Strided { ptr: b.as_ptr(), rs: 1, cs: k } };
                    let bias_ptr = if with_bias { bias.as_ptr() } else { core::ptr::null() };
                    // SAFETY: the views are inside the buffers; C does not overlap them.
                    unsafe { gemm_bf16(shape, a_view, BOperand::Values(b_view), beta, bias_ptr, RowsMut { ptr: c.as_mut_ptr(), ld: ldc }) };
                    let want = reference(shape, &a, a_rows, &b, b_rows, beta, with_bias.then_some(&bias[..]), &c_in);
                    let (mut err, mut norm) = (0f64, 0f64);
                    for i in 0..m {
                        for j in 0..n {
                            let w = want[i * n + j];
                            err += (f64::from(c[i * ldc + j]) - w).powi(2);
                            norm += w * w;
                        }
                        assert_eq!(c[i * ldc + n].to_bits(), before[i * ldc + n].to_bits(), "{m}x{n}x{k}: C's row {i} past the product changed");
                    }
                    // (A product of nothing into a zeroed C is zero: its error, absolute.)
                    let rel = if norm == 0.0 { err.sqrt() } else { (err / norm).sqrt() };
                    assert!(rel < 1e-5, "{m}x{n}x{k}, A rows {a_rows}, B rows {b_rows}, bias {with_bias}, beta {beta}: relative error {rel:e}");
                }
            }
        }
    }

    /// A B packed once by [`pack_panels`] (its panels split over threads) gives the same bits
    /// as the product packing it, both layouts, several K blocks, an odd depth, a last panel
    /// part full, and a product over B's columns from a panel's start on (as a forward's chunk
    /// of columns).
    #[test]
    fn panels_packed_once_give_the_bits_of_a_product_packing_its_own() {
        if bf16_kernel_name().is_none() {
            println!("skipped: this CPU has no AVX512-BF16");
            return;
        }
        for &(m, n, k) in &[(13, 33, 7), (30, 70, 800), (97, 64, 1), (5, 96, 384)] {
            for b_rows in [true, false] {
                let (a, b) = (values(m * k, 1), values(k * n, 2));
                let b_view = if b_rows { Strided { ptr: b.as_ptr(), rs: n, cs: 1 } } else { Strided { ptr: b.as_ptr(), rs: 1, cs: k } };
                let mut panels = vec![u32::MAX; panels_len(k, n)];
                // SAFETY: B is k x n; the buffer holds its panels.
                unsafe { pack_panels(&crate::parallel::ReversedThreads(3), b_view, k, n, panels.as_mut_ptr()) };
                for col in [0, NR] {
                    let width = n - col;
                    let product = |b: BOperand| {
                        let mut c = vec![0f32; m * width];
                        // SAFETY: A is m x k, B's columns col.. inside it, C m x width.
                        unsafe {
                            gemm_bf16(
                                Shape { m, n: width, k },
                                Strided { ptr: a.as_ptr(), rs: k, cs: 1 },
                                b,
                                0.0,
                                core::ptr::null(),
                                RowsMut { ptr: c.as_mut_ptr(), ld: width },
                            )
                        };
                        c.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
                    };
                    let own = product(BOperand::Values(Strided { ptr: b_view.ptr.wrapping_add(col * b_view.cs), ..b_view }));
                    let packed = product(BOperand::Panels { ptr: panels_at(panels.as_ptr(), k, col), depth: k });
                    assert!(own == packed, "{m}x{n}x{k}, B rows {b_rows}, from column {col}");
                }
            }
        }
    }

    /// With A zero outside a band, the banded product has the bits of the full one: A's two
    /// layouts, B's values and panels, beta 0 and 1, bands ending and starting inside and
    /// past the depth, odd and even, over two K blocks and two row blocks.
    #[test]
    fn banded_product_matches_full() {
        if bf16_kernel_name().is_none() {
            println!("skipped: this CPU has no AVX512-BF16");
            return;
        }
        let (m, n, k) = (MC + 13, 45, KC + 45);
        let b = values(k * n, 1);
        let c0 = values(m * n, 2);
        let mut panels = vec![0u32; panels_len(k, n)];
        // SAFETY: B is k x n row-major; the buffer holds its panels.
        unsafe { pack_panels(&crate::parallel::Serial, Strided { ptr: b.as_ptr(), rs: n, cs: 1 }, k, n, panels.as_mut_ptr()) };
        for band in [Band::Below(1), Band::Below(8), Band::Below(KC + 3), Band::Below(k), Band::Above(0), Band::Above(5), Band::Above(MC)] {
            let needed = |i: usize, p: usize| match band {
                Band::Full => true,
                Band::Below(d) => p < i + d,
                Band::Above(d) => p + d >= i,
            };
            let a: Vec<f32> = values(m * k, 3).iter().enumerate().map(|(x, &v)| if needed(x / k, x % k) { v } else { 0.0 }).collect();
            let a_t: Vec<f32> = (0..k * m).map(|x| a[(x % m) * k + x / m]).collect();
            let a_views = [Strided { ptr: a.as_ptr(), rs: k, cs: 1 }, Strided { ptr: a_t.as_ptr(), rs: 1, cs: m }];
            let b_views = [BOperand::Values(Strided { ptr: b.as_ptr(), rs: n, cs: 1 }), BOperand::Panels { ptr: panels.as_ptr(), depth: k }];
            for (a, b) in a_views.into_iter().flat_map(|a| b_views.map(|b| (a, b))) {
                for beta in [0.0, 1.0] {
                    let run = |band| {
                        let mut c = c0.clone();
                        // SAFETY: A is m x k, B k x n, C m x n.
                        unsafe { gemm_bf16_banded(Shape { m, n, k }, a, b, beta, RowsMut { ptr: c.as_mut_ptr(), ld: n }, band) };
                        c.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
                    };
                    assert!(run(band) == run(Band::Full), "{band:?}, A column stride {}, B panels {}, beta {beta}", a.cs, matches!(b, BOperand::Panels { .. }));
                }
            }
        }
    }

    /// The conversion unit rounds as [`round_bf16`] does, denormals included, so the f64
    /// reference above rounds the operands as the packing does.
    #[test]
    #[cfg(target_arch = "x86_64")]
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
        unsafe { avx512_pack_b(Strided { ptr: b.as_ptr(), rs: NR, cs: 1 }, 0..2, 0, NR, packed.as_mut_ptr()) };
        for (j, &w) in packed.iter().enumerate() {
            assert_eq!(w as u16, round_bf16(b[j]), "row 0, column {j}: {:e}", b[j]);
            assert_eq!((w >> 16) as u16, round_bf16(b[NR + j]), "row 1, column {j}: {:e}", b[NR + j]);
        }
    }

    /// The AVX-512 B packing, for the test above.
    #[cfg(target_arch = "x86_64")]
    unsafe fn avx512_pack_b(b: Strided<f32>, depth: core::ops::Range<usize>, jc: usize, nc: usize, out: *mut u32) {
        // SAFETY: forwarded; the CPU has the features (the caller checked).
        unsafe { super::avx512::pack_b(b, depth, jc, nc, out) }
    }
}
