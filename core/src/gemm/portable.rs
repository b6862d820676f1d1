//! The portable micro-kernel: plain Rust for any element type (`f64` in the gradient checks,
//! `f32` on CPUs without the SIMD the other kernels need).

use super::*;

/// Rows of the portable kernel's tile.
const PORTABLE_MR: usize = 4;
/// Columns of the portable kernel's tile.
const PORTABLE_NR: usize = 16;

/// The portable micro-kernel for edge tiles (an [`EdgeTileFn`]).
unsafe fn portable_edge_tile<T: Float, const GROUPS: bool>(rows: usize, kc: usize, a: Rows<T>, b: Rows<T>, beta: T, bias: *const T, c: RowsMut<T>) {
    const { assert!(PORTABLE_MR == 4) };
    // SAFETY: forwarded.
    with_rows!(rows, [1 2 3], |R| unsafe { portable_tile::<T, GROUPS, R>(kc, a, b, beta, bias, c) })
}

/// The portable micro-kernel (a [`TileFn`] for `R == PORTABLE_MR`, `PORTABLE_NR` columns)
/// for `R` rows, plain Rust; `GROUPS`: A as groups `a.ld` apart, else rows `a.ld` apart.
#[inline(always)]
unsafe fn portable_tile<T: Float, const GROUPS: bool, const R: usize>(kc: usize, a: Rows<T>, b: Rows<T>, beta: T, bias: *const T, c: RowsMut<T>) {
    let (rs, cs) = if GROUPS { (1, a.ld) } else { (a.ld, 1) };
    let (a, b, b_stride, ldc, c) = (a.ptr, b.ptr, b.ld, c.ld, c.ptr);
    let mut acc = [[T::ZERO; PORTABLE_NR]; R];
    for p in 0..kc {
        // SAFETY: B holds kc rows of PORTABLE_NR values (caller).
        let brow = unsafe { &*b.add(p * b_stride).cast::<[T; PORTABLE_NR]>() };
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: as above.
            let ai = unsafe { *a.add(i * rs + p * cs) };
            for (x, &bj) in row.iter_mut().zip(brow) {
                *x += ai * bj;
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (j, &x) in row.iter().enumerate() {
            // SAFETY: inside the tile and the bias (caller).
            unsafe {
                let cij = c.add(i * ldc + j);
                *cij = match (beta == T::ZERO, bias.is_null()) {
                    (true, true) => x,
                    (false, true) => x + beta * *cij,
                    (true, false) => x + *bias.add(j),
                    (false, false) => x + (beta * *cij + *bias.add(j)),
                };
            }
        }
    }
}

/// The portable GEMM's loops for one layout of A (compiled apart: see [`dispatch_layout`]).
#[inline(never)]
unsafe fn portable_loops<T: Float, const LAYOUT: usize>(p: Product<T>) {
    let (tile, edge_tile): (TileFn<T>, EdgeTileFn<T>) = if LAYOUT == ROWS {
        (portable_tile::<T, false, PORTABLE_MR>, portable_edge_tile::<T, false>)
    } else {
        (portable_tile::<T, true, PORTABLE_MR>, portable_edge_tile::<T, true>)
    };
    // SAFETY: forwarded; plain Rust runs anywhere.
    unsafe { gemm_blocked::<T, PORTABLE_MR, PORTABLE_NR, KC, LAYOUT>(tile, edge_tile, p) }
}

/// The portable GEMM.
unsafe fn portable_gemm<T: Float>(p: Product<T>) {
    let loops: [GemmFn<T>; 3] = [portable_loops::<T, ROWS>, portable_loops::<T, GROUPS_IN_PLACE>, portable_loops::<T, GROUPS_PACKED>];
    // SAFETY: forwarded.
    unsafe { dispatch_layout(loops, KC, p) }
}

/// The portable kernel for any element type.
pub(super) fn portable<T: Float>() -> Kernel<T> {
    Kernel { mr: PORTABLE_MR, nr: PORTABLE_NR, kc: KC, gemm: portable_gemm::<T> }
}
