//! The WebAssembly f32 micro-kernel (`simd128`, with `relaxed-simd`'s multiply-add where the
//! build enables it).

#[allow(unused_imports)]
use super::*;

/// Rows and columns of the WebAssembly SIMD kernel's tile. Engines keep v128 values in
/// x86-64's 16 vector registers (V8 allocates 15), and LLVM's wasm output holds every
/// broadcast of A live across the B vectors: 8 accumulators, two B vectors and four
/// broadcasts fit; 6 x 8 spills (docs/performance.md, "Kernel choices").
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
const WASM_MR: usize = 4;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
const WASM_NR: usize = 8;

/// The f32 micro-kernel for WebAssembly with SIMD (`simd128`, enabled for the whole build:
/// wasm has no run-time detection) for `R` rows, reading A and B where they lie: element
/// `(i, p)` of A at `a.ptr + i * a.rs + p * a.cs`, row `p` of B at `b.ptr + p * b.ld`. Multiply then
/// add, as the portable kernel; builds that also enable `relaxed-simd` use its multiply-add,
/// which engines compile to a fused multiply-add where the CPU has one (as the x86-64
/// kernels).
///
/// # Safety
/// The tile must be inside the operands.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[inline(always)]
unsafe fn tile_wasm<const R: usize>(kc: usize, a: Strided<f32>, b: Rows<f32>, beta: f32, bias: *const f32, c: RowsMut<f32>) {
    use core::arch::wasm32::*;
    let (a, a_rs, a_cs, b, ldb, c, ldc) = (a.ptr, a.rs, a.cs, b.ptr, b.ld, c.ptr, c.ld);
    const VECS: usize = WASM_NR / 4;
    // SAFETY: pointers inside the operands and the tile (caller); v128 loads and stores are
    // unaligned.
    unsafe {
        let mut acc = [[f32x4_splat(0.0); VECS]; R];
        let rows: [*const f32; R] = core::array::from_fn(|i| a.add(i * a_rs));
        for p in 0..kc {
            let bp = b.add(p * ldb);
            let bv: [v128; VECS] = core::array::from_fn(|h| v128_load(bp.add(h * 4).cast()));
            for (row, &ar) in acc.iter_mut().zip(&rows) {
                let ai = f32x4_splat(*ar.add(p * a_cs));
                for (x, &bh) in row.iter_mut().zip(&bv) {
                    #[cfg(target_feature = "relaxed-simd")]
                    {
                        *x = f32x4_relaxed_madd(ai, bh, *x);
                    }
                    #[cfg(not(target_feature = "relaxed-simd"))]
                    {
                        *x = f32x4_add(*x, f32x4_mul(ai, bh));
                    }
                }
            }
        }
        let vbeta = f32x4_splat(beta);
        for (i, row) in acc.iter().enumerate() {
            for (h, &v) in row.iter().enumerate() {
                let cp = c.add(i * ldc + h * 4);
                let scaled_c = || f32x4_mul(vbeta, v128_load(cp.cast()));
                let out = match (beta == 0.0, bias.is_null()) {
                    (true, true) => v,
                    (false, true) => f32x4_add(v, scaled_c()),
                    (true, false) => f32x4_add(v, v128_load(bias.add(h * 4).cast())),
                    (false, false) => f32x4_add(v, f32x4_add(scaled_c(), v128_load(bias.add(h * 4).cast()))),
                };
                v128_store(cp.cast(), out);
            }
        }
    }
}

/// The GEMM on the WebAssembly SIMD kernel. Unlike [`gemm_blocked`] it packs only edge panels
/// of B (zero-padded): the products a browser trains stay in cache as they lie, so packing them
/// costs more than it saves (docs/performance.md, "Kernel choices").
/// K blocks as in [`gemm_blocked`], so both sum in the same order.
///
/// # Safety
/// As [`gemm`].
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
unsafe fn gemm_wasm(p: Product<f32>) {
    let Product { shape: Shape { m, n, k }, a, b, beta, bias, c, band } = p;
    if k == 0 {
        // SAFETY: forwarded.
        return unsafe { scale_c(p) };
    }
    let mut b_edge = MaybeUninit::<Aligned<[f32; KC * WASM_NR]>>::uninit();
    let mut c_edge = MaybeUninit::<Aligned<[f32; WASM_MR * WASM_NR]>>::uninit();
    let mut bias_edge = [0f32; WASM_NR];
    let be = b_edge.as_mut_ptr().cast::<f32>();
    for pc in (0..k).step_by(KC) {
        let kc = KC.min(k - pc);
        let (beta_pc, bias_pc) = if pc == 0 { (beta, bias) } else { (1.0, core::ptr::null()) };
        for jc in (0..n).step_by(WASM_NR) {
            let w = WASM_NR.min(n - jc);
            // SAFETY (all accesses): rows pc..pc+kc and columns jc..jc+w of B, and rows
            // ir..ir+rows of A, are inside the operands (caller); the edge buffer holds a
            // packed panel of B.
            unsafe {
                let bias_panel = bias_panel::<f32, WASM_NR>(bias_pc, jc, w, &mut bias_edge);
                let panel = b.panel::<WASM_NR>(k, pc..pc + kc, jc..jc + w, true, be);
                for ir in (0..m).step_by(WASM_MR) {
                    let rows = WASM_MR.min(m - ir);
                    let (skip, depth) = band.depth(ir..ir + rows, pc, kc);
                    let ap = Strided { ptr: a.ptr.add(ir * a.rs + (pc + skip) * a.cs), ..a };
                    let bp = Rows { ptr: panel.ptr.add(skip * panel.ld), ..panel };
                    let whole = |c| tile_wasm::<WASM_MR>(depth, ap, bp, beta_pc, bias_panel, c);
                    let edge = |rows, c| {
                        const { assert!(WASM_MR == 4) };
                        with_rows!(rows, [1 2 3], |R| tile_wasm::<R>(depth, ap, bp, beta_pc, bias_panel, c))
                    };
                    run_tile::<f32, WASM_MR, WASM_NR>(whole, edge, rows, w, c.at(ir, jc), c_edge.as_mut_ptr().cast());
                }
            }
        }
    }
}

/// The WebAssembly SIMD kernel's tile, K block depth and GEMM.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub(super) const KERNEL: Kernel<f32> = Kernel { mr: WASM_MR, nr: WASM_NR, kc: KC, gemm: gemm_wasm };
