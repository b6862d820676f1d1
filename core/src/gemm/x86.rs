//! The x86-64 f32 micro-kernels, AVX2 + FMA (6 x 16) and AVX-512 (12 x 32): one macro
//! generates both from a line of parameters each.

#[allow(unused_imports)]
use super::*;

/// Generates, as module `$name`, an x86-64 f32 micro-kernel for a vector type (`$mr` rows of
/// `$vecs` registers; edge tiles of each of `$edge_rows` rows) and the blocked GEMM on it
/// (K blocks `$kc` deep), all compiled with `$feature` (without `std` only where the build
/// enables AVX2 or more: there is no run-time detection then). `$spread_prefetch`: whether
/// the tile's rows of C are prefetched one per step of its first `$mr` steps rather than all
/// before the first (see the kernel).
macro_rules! x86_kernel {
    ($name:ident, $feature:literal, $vec:ty, $lanes:expr, $mr:expr, [$($edge_rows:literal)*], $vecs:expr, $kc:expr, $spread_prefetch:expr,
     $zero:ident, $load:ident, $store:ident, $set1:ident, $add:ident, $fma:ident) => {
        /// The micro-kernel for one x86-64 instruction set and the GEMM on it.
        #[cfg(all(target_arch = "x86_64", any(feature = "std", target_feature = "avx2")))]
        pub(super) mod $name {
            use super::*;
            use core::arch::x86_64::*;

            /// The micro-kernel (a [`TileFn`] for `R == $mr`; see the module docs) for `R` rows.
            ///
            /// # Safety
            /// The CPU must have the target feature; the tile must be inside the operands.
            #[target_feature(enable = $feature)]
            #[inline]
            unsafe fn tile<const GROUPS: bool, const R: usize>(kc: usize, a: Rows<f32>, b: Rows<f32>, beta: f32, bias: *const f32, c: RowsMut<f32>) {
                let (rs, cs) = if GROUPS { (1, a.ld) } else { (a.ld, 1) };
                let (a, b, b_stride, ldc, c) = (a.ptr, b.ptr, b.ld, c.ld, c.ptr);
                // SAFETY: features enabled by the attribute; pointers inside the tile (caller).
                unsafe {
                    // The tile's lines of C are fetched while the loop runs, not when it stores:
                    // a training step's C is rarely in L1. AVX-512's 36 lines are fetched one
                    // row per step of the first R steps (all at once stalled the tile's start);
                    // AVX2's 12 at once. Measured: docs/performance.md, "Kernel choices".
                    let prefetch_row = |i: usize| {
                        let row = c.add(i * ldc);
                        for j in (0..$vecs * $lanes).step_by(16) {
                            _mm_prefetch::<_MM_HINT_T0>(row.add(j).cast());
                        }
                        _mm_prefetch::<_MM_HINT_T0>(row.add($vecs * $lanes - 1).cast());
                    };
                    let mut acc: [[$vec; $vecs]; R] = [[$zero(); $vecs]; R];
                    let step = |acc: &mut [[$vec; $vecs]; R], p: usize| {
                        let bp = b.add(p * b_stride);
                        let mut bv: [$vec; $vecs] = [$zero(); $vecs];
                        for (h, v) in bv.iter_mut().enumerate() {
                            *v = $load(bp.add(h * $lanes));
                        }
                        for (i, row) in acc.iter_mut().enumerate() {
                            let ai = $set1(*a.add(i * rs + p * cs));
                            for (x, &bh) in row.iter_mut().zip(&bv) {
                                *x = $fma(ai, bh, *x);
                            }
                        }
                    };
                    let head = if $spread_prefetch { R.min(kc) } else { 0 };
                    for p in 0..head {
                        prefetch_row(p);
                        step(&mut acc, p);
                    }
                    for i in head..R {
                        prefetch_row(i);
                    }
                    for p in head..kc {
                        step(&mut acc, p);
                    }
                    let vbeta = $set1(beta);
                    for (i, row) in acc.iter().enumerate() {
                        for (h, &v) in row.iter().enumerate() {
                            let cp = c.add(i * ldc + h * $lanes);
                            let out = match (beta == 0.0, bias.is_null()) {
                                (true, true) => v,
                                (false, true) => $fma(vbeta, $load(cp), v),
                                (true, false) => $add(v, $load(bias.add(h * $lanes))),
                                (false, false) => $add(v, $fma(vbeta, $load(cp), $load(bias.add(h * $lanes)))),
                            };
                            $store(cp, out);
                        }
                    }
                }
            }

            /// [`tile`] for an edge tile (an [`EdgeTileFn`]).
            ///
            /// # Safety
            /// As [`tile`].
            #[target_feature(enable = $feature)]
            unsafe fn edge_tile<const GROUPS: bool>(rows: usize, kc: usize, a: Rows<f32>, b: Rows<f32>, beta: f32, bias: *const f32, c: RowsMut<f32>) {
                // SAFETY: forwarded.
                with_rows!(rows, [$($edge_rows)*], |R| unsafe { tile::<GROUPS, R>(kc, a, b, beta, bias, c) })
            }

            /// The blocked loops on the kernel above for one layout of A (compiled apart: see
            /// [`dispatch_layout`]).
            ///
            /// # Safety
            /// As [`gemm`]; the CPU must have the target feature; A's layout must be `LAYOUT`.
            #[target_feature(enable = $feature)]
            unsafe fn loops<const LAYOUT: usize>(p: Product<f32>) {
                let (tile, edge_tile): (TileFn<f32>, EdgeTileFn<f32>) =
                    if LAYOUT == ROWS { (tile::<false, $mr>, edge_tile::<false>) } else { (tile::<true, $mr>, edge_tile::<true>) };
                // SAFETY: forwarded; the caller checked the features.
                unsafe { gemm_blocked::<f32, $mr, { $vecs * $lanes }, $kc, LAYOUT>(tile, edge_tile, p) }
            }

            /// The blocked GEMM on the kernel above.
            ///
            /// # Safety
            /// As [`gemm`]; the CPU must have the target feature.
            pub(super) unsafe fn gemm(p: Product<f32>) {
                let loops: [GemmFn<f32>; 3] = [loops::<ROWS>, loops::<GROUPS_IN_PLACE>, loops::<GROUPS_PACKED>];
                // SAFETY: forwarded; the caller checked the features.
                unsafe { dispatch_layout(loops, $kc, p) }
            }

            /// The kernel's tile, K block depth and GEMM.
            pub(in crate::gemm) const KERNEL: Kernel<f32> = Kernel { mr: $mr, nr: $vecs * $lanes, kc: $kc, gemm };
        }
    };
}

// One line per kernel, as a table.
#[rustfmt::skip]
x86_kernel!(avx2, "avx2,fma", __m256, 8, 6, [1 2 3 4 5], 2, KC, false, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_set1_ps, _mm256_add_ps, _mm256_fmadd_ps);
#[rustfmt::skip]
x86_kernel!(avx512, "avx512f", __m512, 16, 12, [1 2 3 4 5 6 7 8 9 10 11], 2, AVX512_KC, true, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_set1_ps, _mm512_add_ps, _mm512_fmadd_ps);
