//! Allocation-free GEMM: `C = A·B + beta·C` with `C` and `B` row-major (unit column stride)
//! and `A` arbitrarily strided, so transposed operands need no copy except `B`'s.
//!
//! Loop order (per call, single-threaded; callers split rows across tasks): K blocks of
//! [`KC`] → row blocks of [`MR`], each packed contiguously on the stack → column panels of
//! the kernel's width → micro-kernel, which keeps an `MR x NR` tile of C in registers and
//! broadcasts one packed element of A against NR elements of B per step. The f32 kernels use
//! AVX-512 (`NR = 32`) or AVX2 + FMA (`NR = 16`) on x86-64, detected at run time with `std`
//! and at compile time without; edge tiles, f64 and other CPUs use the portable kernel.

use crate::float::Float;

/// Rows of C per micro-tile.
pub const MR: usize = 6;
/// Widest micro-tile of any kernel.
pub const MAX_NR: usize = 32;
/// Depth of one K block.
pub const KC: usize = 256;

/// A strided read-only matrix: element `(i, j)` is at `ptr + i*rs + j*cs`.
#[derive(Clone, Copy)]
pub struct Strided<T> {
    /// Element (0, 0).
    pub ptr: *const T,
    /// Row stride.
    pub rs: usize,
    /// Column stride.
    pub cs: usize,
}

// SAFETY: a Strided is a read-only view; sharing it between tasks that only read is sound.
unsafe impl<T: Sync> Sync for Strided<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Send for Strided<T> {}

/// A full-tile micro-kernel: `(kc, packed_a, b, ldb, beta, c, ldc)`, where `packed_a` holds
/// `kc` groups of [`MR`] consecutive values (column `p` of the row block).
pub type KernelFn<T> = unsafe fn(usize, *const T, *const T, usize, T, *mut T, usize);

/// A micro-kernel and the width of the tile it computes.
#[derive(Clone, Copy)]
pub struct Kernel<T> {
    /// Columns of C per call (at most [`MAX_NR`]).
    pub nr: usize,
    /// The kernel.
    pub run: KernelFn<T>,
}

/// `C[m x n] = A[m x k] · B[k x n] + beta · C`; `B` has row stride `ldb` and unit column
/// stride, `C` row stride `ldc` and unit column stride. With `beta == 0`, C is only written.
///
/// # Safety
/// Every element reached through the shapes and strides must be valid; `c` must not
/// overlap `a` or `b`, and no other thread may access the written part of `c`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm<T: Float>(m: usize, n: usize, k: usize, a: Strided<T>, b: *const T, ldb: usize, beta: T, c: *mut T, ldc: usize) {
    // SAFETY: forwarded.
    unsafe { gemm_with(T::fast_kernel(), m, n, k, a, b, ldb, beta, c, ldc) }
}

/// [`gemm`] with an explicit full-tile kernel (`None`: portable only).
///
/// # Safety
/// As [`gemm`]; the kernel must run on this CPU.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_with<T: Float>(
    fast: Option<Kernel<T>>,
    m: usize,
    n: usize,
    k: usize,
    a: Strided<T>,
    b: *const T,
    ldb: usize,
    beta: T,
    c: *mut T,
    ldc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    let nr = fast.map_or(16, |f| f.nr);
    let mut packed = [T::ZERO; MR * KC];
    if k == 0 {
        // C = beta·C: a zero-depth product through the portable kernel.
        for ic in (0..m).step_by(MR) {
            for jc in (0..n).step_by(nr) {
                // SAFETY: the tile is inside C (caller).
                unsafe { portable_kernel(MR.min(m - ic), nr.min(n - jc), 0, packed.as_ptr(), b, ldb, beta, c.add(ic * ldc + jc), ldc) };
            }
        }
        return;
    }
    for pc in (0..k).step_by(KC) {
        let kc = KC.min(k - pc);
        let beta_pc = if pc == 0 { beta } else { T::ONE };
        for ic in (0..m).step_by(MR) {
            let mr = MR.min(m - ic);
            // SAFETY: rows ic..ic+mr, columns pc..pc+kc are inside A (caller).
            unsafe { pack_a(&mut packed, a, ic, mr, pc, kc) };
            for jc in (0..n).step_by(nr) {
                let w = nr.min(n - jc);
                // SAFETY: the tile (ic.., jc..) with depth pc..pc+kc is inside the operands.
                unsafe {
                    let bt = b.add(pc * ldb + jc);
                    let ct = c.add(ic * ldc + jc);
                    match fast {
                        Some(f) if mr == MR && w == nr => (f.run)(kc, packed.as_ptr(), bt, ldb, beta_pc, ct, ldc),
                        Some(f) => edge_tile(f, mr, w, kc, packed.as_ptr(), bt, ldb, beta_pc, ct, ldc),
                        None => portable_kernel(mr, w, kc, packed.as_ptr(), bt, ldb, beta_pc, ct, ldc),
                    }
                }
            }
        }
    }
}

/// Packs rows `i0..i0+mr`, columns `p0..p0+kc` of `a` into `packed` as `kc` groups of
/// [`MR`] values (rows past `mr` are zero), with a contiguous fast path for each of the two
/// layouts the model uses (row-major A, and transposed A with unit row stride).
///
/// # Safety
/// The block must be inside `a`.
unsafe fn pack_a<T: Float>(packed: &mut [T; MR * KC], a: Strided<T>, i0: usize, mr: usize, p0: usize, kc: usize) {
    let groups = &mut packed[..kc * MR];
    if mr < MR {
        groups.fill(T::ZERO);
    }
    // SAFETY (all reads): inside the block (caller).
    unsafe {
        if a.cs == 1 {
            for i in 0..mr {
                let row = core::slice::from_raw_parts(a.ptr.add((i0 + i) * a.rs + p0), kc);
                for (g, &x) in groups.chunks_exact_mut(MR).zip(row) {
                    g[i] = x;
                }
            }
        } else if a.rs == 1 && mr == MR {
            for (p, g) in groups.chunks_exact_mut(MR).enumerate() {
                g.copy_from_slice(core::slice::from_raw_parts(a.ptr.add(i0 + (p0 + p) * a.cs), MR));
            }
        } else {
            for (p, g) in groups.chunks_exact_mut(MR).enumerate() {
                for (i, x) in g.iter_mut().enumerate().take(mr) {
                    *x = *a.ptr.add((i0 + i) * a.rs + (p0 + p) * a.cs);
                }
            }
        }
    }
}

/// A partial tile through the full-tile kernel, on zero-padded stack copies of B and C, so
/// every element of C sees the same arithmetic (FMA and order) wherever tile edges fall:
/// results do not depend on how callers split rows across tasks.
#[allow(clippy::too_many_arguments)]
unsafe fn edge_tile<T: Float>(f: Kernel<T>, mr: usize, w: usize, kc: usize, a: *const T, b: *const T, ldb: usize, beta: T, c: *mut T, ldc: usize) {
    let nr = f.nr;
    // Only the kc x nr part the kernel reads is written; zeroing all 32 KB per tile cost more
    // than the tile.
    let mut bpad = core::mem::MaybeUninit::<[T; KC * MAX_NR]>::uninit();
    let bp = bpad.as_mut_ptr().cast::<T>();
    for p in 0..kc {
        // SAFETY: row p of the B panel has w valid columns (caller); bp has room for kc x nr.
        unsafe {
            core::ptr::copy_nonoverlapping(b.add(p * ldb), bp.add(p * nr), w);
            for j in w..nr {
                bp.add(p * nr + j).write(T::ZERO);
            }
        }
    }
    let mut cpad = [T::ZERO; MR * MAX_NR];
    for i in 0..mr {
        for j in 0..w {
            // SAFETY: (i, j) is inside the tile.
            cpad[i * nr + j] = unsafe { *c.add(i * ldc + j) };
        }
    }
    // SAFETY: the padded buffers hold a full MR x nr tile of depth kc.
    unsafe { (f.run)(kc, a, bp, nr, beta, cpad.as_mut_ptr(), nr) };
    for i in 0..mr {
        for j in 0..w {
            // SAFETY: (i, j) is inside the tile.
            unsafe { *c.add(i * ldc + j) = cpad[i * nr + j] };
        }
    }
}

/// Any tile up to `MR x MAX_NR`, plain Rust.
#[allow(clippy::too_many_arguments)]
unsafe fn portable_kernel<T: Float>(mr: usize, nr: usize, kc: usize, a: *const T, b: *const T, ldb: usize, beta: T, c: *mut T, ldc: usize) {
    let mut acc = [[T::ZERO; MAX_NR]; MR];
    for p in 0..kc {
        // SAFETY: inside the tile (caller).
        let brow = unsafe { core::slice::from_raw_parts(b.add(p * ldb), nr) };
        for (i, row) in acc.iter_mut().enumerate().take(mr) {
            // SAFETY: the packed panel holds kc groups of MR.
            let aip = unsafe { *a.add(p * MR + i) };
            for (x, &bj) in row.iter_mut().zip(brow) {
                *x += aip * bj;
            }
        }
    }
    for (i, row) in acc.iter().enumerate().take(mr) {
        for (j, &x) in row.iter().enumerate().take(nr) {
            // SAFETY: inside the tile (caller).
            unsafe {
                let cij = c.add(i * ldc + j);
                *cij = if beta == T::ZERO { x } else { x + beta * *cij };
            }
        }
    }
}

/// Generates an x86-64 f32 micro-kernel for a vector type: `MR` rows of `$vecs` registers.
macro_rules! x86_kernel {
    ($name:ident, $feature:literal, $vec:ty, $lanes:expr, $vecs:expr,
     $zero:ident, $load:ident, $store:ident, $bcast:ident, $fma:ident, $set1:ident) => {
        /// An f32 micro-kernel (see the module docs).
        ///
        /// # Safety
        /// The CPU must have the target feature; the tile must be inside the operands.
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feature)]
        pub(crate) unsafe fn $name(kc: usize, a: *const f32, b: *const f32, ldb: usize, beta: f32, c: *mut f32, ldc: usize) {
            use core::arch::x86_64::*;
            // SAFETY: features enabled by the attribute; pointers inside the tile (caller).
            unsafe {
                let mut acc: [[$vec; $vecs]; MR] = [[$zero(); $vecs]; MR];
                for p in 0..kc {
                    let bp = b.add(p * ldb);
                    let mut bv: [$vec; $vecs] = [$zero(); $vecs];
                    for (h, v) in bv.iter_mut().enumerate() {
                        *v = $load(bp.add(h * $lanes));
                    }
                    let ap = a.add(p * MR);
                    for (i, row) in acc.iter_mut().enumerate() {
                        let ai = $bcast(*ap.add(i));
                        for (x, &bh) in row.iter_mut().zip(&bv) {
                            *x = $fma(ai, bh, *x);
                        }
                    }
                }
                let vbeta = $set1(beta);
                for (i, row) in acc.iter().enumerate() {
                    for (h, &v) in row.iter().enumerate() {
                        let cp = c.add(i * ldc + h * $lanes);
                        let out = if beta == 0.0 { v } else { $fma(vbeta, $load(cp), v) };
                        $store(cp, out);
                    }
                }
            }
        }
    };
}

x86_kernel!(kernel_avx2, "avx2,fma", __m256, 8, 2, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_set1_ps);
x86_kernel!(kernel_avx512, "avx512f", __m512, 16, 2, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_set1_ps);

/// Name of the f32 micro-kernel [`gemm`] uses on this CPU: `avx512`, `avx2+fma` or `portable`.
pub fn f32_kernel_name() -> &'static str {
    match fast_f32_kernel().map(|k| k.nr) {
        Some(32) => "avx512",
        Some(_) => "avx2+fma",
        None => "portable",
    }
}

/// The fastest f32 kernel this CPU runs, if any.
pub(crate) fn fast_f32_kernel() -> Option<Kernel<f32>> {
    #[cfg(all(target_arch = "x86_64", feature = "std"))]
    {
        if std::is_x86_feature_detected!("avx512f") {
            return Some(Kernel { nr: 32, run: kernel_avx512 });
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return Some(Kernel { nr: 16, run: kernel_avx2 });
        }
    }
    #[cfg(all(target_arch = "x86_64", not(feature = "std"), target_feature = "avx512f"))]
    return Some(Kernel { nr: 32, run: kernel_avx512 });
    #[cfg(all(target_arch = "x86_64", not(feature = "std"), not(target_feature = "avx512f"), target_feature = "avx2", target_feature = "fma"))]
    return Some(Kernel { nr: 16, run: kernel_avx2 });
    #[allow(unreachable_code)]
    None
}

/// Transposes `src [rows x cols]` (rows `row_stride` apart, unit column stride) into the
/// contiguous `dst [cols x rows]`, in cache blocks.
pub fn transpose<T: Float>(src: &[T], rows: usize, cols: usize, row_stride: usize, dst: &mut [T]) {
    assert!(rows == 0 || src.len() >= (rows - 1) * row_stride + cols);
    assert!(dst.len() >= rows * cols);
    const BLOCK: usize = 16;
    for r0 in (0..rows).step_by(BLOCK) {
        for c0 in (0..cols).step_by(BLOCK) {
            for c in c0..(c0 + BLOCK).min(cols) {
                for r in r0..(r0 + BLOCK).min(rows) {
                    // SAFETY: r < rows and c < cols, within both bounds asserted above.
                    unsafe { *dst.get_unchecked_mut(c * rows + r) = *src.get_unchecked(r * row_stride + c) };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    fn naive(m: usize, n: usize, k: usize, a: &[f64], rsa: usize, csa: usize, b: &[f64], ldb: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * rsa + p * csa] * b[p * ldb + j]).sum();
            }
        }
        c
    }

    /// Every f32 kernel this CPU can run, and the portable one.
    fn f32_kernels() -> Vec<(&'static str, Option<Kernel<f32>>)> {
        let mut v = vec![("portable", None)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                v.push(("avx2", Some(Kernel { nr: 16, run: kernel_avx2 as KernelFn<f32> })));
            }
            if std::is_x86_feature_detected!("avx512f") {
                v.push(("avx512", Some(Kernel { nr: 32, run: kernel_avx512 as KernelFn<f32> })));
            }
        }
        v
    }

    /// A row's result must not depend on which tile it falls in (full or edge).
    #[test]
    fn rows_are_independent_of_tiling() {
        let (m, n, k) = (13, 37, 70);
        let mut rng = Rng::new(9);
        let a: Vec<f32> = (0..m * k).map(|_| rng.next_f64() as f32 - 0.5).collect();
        let b: Vec<f32> = (0..k * n).map(|_| rng.next_f64() as f32 - 0.5).collect();
        let mut whole = vec![0f32; m * n];
        unsafe { gemm(m, n, k, Strided { ptr: a.as_ptr(), rs: k, cs: 1 }, b.as_ptr(), n, 0.0, whole.as_mut_ptr(), n) };
        for start in 0..m {
            for rows in 1..=(m - start) {
                let mut part = vec![0f32; rows * n];
                let sub = Strided { ptr: a[start * k..].as_ptr(), rs: k, cs: 1 };
                unsafe { gemm(rows, n, k, sub, b.as_ptr(), n, 0.0, part.as_mut_ptr(), n) };
                assert_eq!(part, whole[start * n..(start + rows) * n], "rows {start}..{}", start + rows);
            }
        }
    }

    /// Odd shapes (edge tiles, several K blocks), transposed A, beta 0 and 1, f32 and f64.
    #[test]
    fn matches_naive_product() {
        let mut rng = Rng::new(8);
        for &(m, n, k) in &[(1, 1, 1), (7, 17, 5), (13, 33, 300), (6, 16, 513), (20, 3, 2)] {
            let a: Vec<f64> = (0..m * k).map(|_| rng.next_f64() - 0.5).collect();
            let b: Vec<f64> = (0..k * n).map(|_| rng.next_f64() - 0.5).collect();
            let c0: Vec<f64> = (0..m * n).map(|_| rng.next_f64() - 0.5).collect();
            for transposed in [false, true] {
                // The same A stored row-major (rs = k) or column-major (rs = 1, cs = m).
                let (stored, rs, cs) = if transposed {
                    let mut t = vec![0.0; m * k];
                    transpose(&a, m, k, k, &mut t);
                    (t, 1, m)
                } else {
                    (a.clone(), k, 1)
                };
                let expect = naive(m, n, k, &a, k, 1, &b, n);
                for beta in [0.0, 1.0] {
                    let mut c64 = c0.clone();
                    unsafe { gemm(m, n, k, Strided { ptr: stored.as_ptr(), rs, cs }, b.as_ptr(), n, beta, c64.as_mut_ptr(), n) };
                    let s32: Vec<f32> = stored.iter().map(|&x| x as f32).collect();
                    let b32: Vec<f32> = b.iter().map(|&x| x as f32).collect();
                    for i in 0..m * n {
                        let e = expect[i] + beta * c0[i];
                        assert!((c64[i] - e).abs() < 1e-12, "f64 {m}x{n}x{k} t={transposed} b={beta} [{i}]");
                    }
                    for (name, kernel) in f32_kernels() {
                        let mut c32: Vec<f32> = c0.iter().map(|&x| x as f32).collect();
                        let a32 = Strided { ptr: s32.as_ptr(), rs, cs };
                        unsafe { gemm_with(kernel, m, n, k, a32, b32.as_ptr(), n, beta as f32, c32.as_mut_ptr(), n) };
                        for i in 0..m * n {
                            let e = expect[i] + beta * c0[i];
                            // f32 rounding of k products: a few ulp of sqrt(k)-sized sums.
                            assert!((c32[i] as f64 - e).abs() < 1e-5 * (1.0 + k as f64).sqrt(), "{name} {m}x{n}x{k} [{i}]");
                        }
                    }
                }
            }
        }
    }
}
