//! Allocation-free GEMM: `C = A·B + beta·C` with `C` and `B` row-major (unit column stride)
//! and `A` row-major or column-major (a unit stride either way), so transposed operands need
//! no copy.
//!
//! Unstable: public for the CPU kernels, the benchmarks and the tests; it changes with any
//! release (see the crate's Stability section).
//!
//! Loop order (per call, single-threaded; callers split rows across tasks), as in BLIS:
//! K blocks of the kernel's depth ([`Kernel::kc`]) → row blocks of A (equal, at most [`MC`]
//! rows) → column panels of `NR` columns of B, packed contiguously and zero-padded (the panel
//! stays in L1 or L2 while every micro-panel of A streams past it; a whole panel for a
//! product of at most `MC / 2` rows is read in place instead, where packing it costs more
//! than it saves (attention's blocks of query rows); a B that many calls share, a layer's weight, is packed into panels once by [`pack_panels`] and read by
//! [`gemm_packed`]) → micro-kernel, which keeps an `MR x NR` tile of C in registers and
//! broadcasts one element of A against `NR` elements of B per step, then stores the tile
//! (adding `beta·C` and, for [`gemm_packed`], a bias row).
//! K blocks are deep ([`KC`]) because C is read and written once per K block (a large C
//! streams through memory once per block), and 512 takes nanoGPT's K = 512 products in one
//! block (a 16-column B panel of 512 rows, 32 KiB, is a whole L1). AVX-512's are shallower,
//! so that its wider B panel stays in L1. Measured: (docs/performance.md, "Kernel choices").
//!
//! A is read where it lies (packing row-major A would copy every row through L1): row-major A as `MR` rows, transposed (column-major) A as `kc` groups of
//! `MR` consecutive values, one group per step, where a K block of its columns spans little
//! enough memory (see `IN_PLACE_GROUP_SPAN`; else it is packed a row block at a time). A last
//! micro-tile of fewer rows (an edge) runs a kernel compiled for that many rows, which reads
//! only those rows of A and writes only those of C. The kernel reads both layouts with one
//! broadcast per row and step; it is compiled for each.
//!
//! The f32 kernels use AVX-512 (12 x 32) or AVX2 + FMA (6 x 16) on x86-64, detected at run
//! time with `std` and at compile time without, and the whole blocked loop is compiled with
//! the same features; WebAssembly builds with `simd128` use a 4 x 8 `v128` kernel (fused
//! multiply-add where the build also enables `relaxed-simd`) that reads A and B in place and
//! packs only edge panels of B; f64 and other CPUs use the portable kernel. Edge tiles run the
//! same arithmetic per element (their missing columns on a zero-padded copy of C), so results
//! do not depend on where tile edges fall, nor on how callers split rows across tasks.
//!
//! A product whose A is zero outside a band (attention's causal ones: [`gemm_banded`]) runs
//! each micro-tile over only the depth some row of it needs.
//!
//! Each layout of A (row-major, groups in place, packed groups) has its own compiled loops
//! and stack frame: `NR x depth` elements (32 KiB for f32 with AVX2, 24 KiB with AVX-512), or
//! `(MC + NR) x depth` for packed groups (224 KiB with AVX2).

//!
//! Files: this one the blocking and packing driver and the kernel choice; one file per
//! micro-kernel family: `portable` (any element type), `x86` (AVX2 + FMA and AVX-512, one
//! macro), `wasm` (SIMD128 and relaxed SIMD); and the SIMD transposes ([`transpose()`]).

pub mod bf16;
mod portable;
mod transpose;
mod wasm;
mod x86;

use crate::float::Float;
use crate::parallel::{split_range, Parallel, SharedMut};
use core::any::Any;
use core::mem::MaybeUninit;
use core::ops::Range;
pub use transpose::transpose;
pub(crate) use transpose::transpose_strided;

/// Most rows of C per row block of A (a multiple of every kernel's `MR`).
pub const MC: usize = 96;
/// Widest micro-tile of any kernel.
pub const MAX_NR: usize = 32;
/// Most rows of any micro-tile.
pub const MAX_MR: usize = 12;
/// Depth of one K block: the deepest any kernel takes (see [`Kernel::kc`]).
pub const KC: usize = 512;
/// Depth of the AVX-512 kernel's K blocks: its 32-column B panel of a 384-deep block is
/// 48 KiB, an L1 cache's worth on the CPUs that have it; 192 (24 KiB) leaves room beside it
/// for the tile's A and C (docs/performance.md, "Kernel choices").
#[cfg(all(target_arch = "x86_64", any(feature = "std", target_feature = "avx2")))]
const AVX512_KC: usize = 192;

/// Rows per row block of A in a product of `m` rows on a kernel of `mr`-row tiles: blocks of
/// equal size (whole micro-panels, at most [`MC`]), since a short last block would pack every
/// B panel for a few tiles. The weight gradients split their rows across tasks at these blocks: the same
/// work as one product.
pub fn row_block(m: usize, mr: usize) -> usize {
    m.div_ceil(m.div_ceil(MC)).next_multiple_of(mr)
}

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

impl<T> Strided<T> {
    /// The same view as [`Rows`].
    ///
    /// # Panics
    /// If the column stride is not 1.
    pub fn rows(self) -> Rows<T> {
        assert_eq!(self.cs, 1, "gemm: B and C need adjacent columns");
        Rows { ptr: self.ptr, ld: self.rs }
    }

    /// The transpose, in place: element `(i, j)` is this view's `(j, i)`.
    pub fn t(self) -> Self {
        Strided { ptr: self.ptr, rs: self.cs, cs: self.rs }
    }
}

/// A read-only matrix whose columns are adjacent: row `i` starts at `ptr + i * ld`. (In a
/// micro-kernel's A read as groups, a "row" is a group: the tile's values of one column.)
#[derive(Clone, Copy)]
pub struct Rows<T> {
    /// Element (0, 0).
    pub ptr: *const T,
    /// Row stride.
    pub ld: usize,
}

/// [`Rows`], written: the C of a product.
#[derive(Clone, Copy)]
pub struct RowsMut<T> {
    /// Element (0, 0).
    pub ptr: *mut T,
    /// Row stride.
    pub ld: usize,
}

impl<T> RowsMut<T> {
    /// The block whose element (0, 0) is element `(i, j)` of this one.
    ///
    /// # Safety
    /// The element must be inside the allocation (as [`pointer::add`]).
    #[inline(always)]
    unsafe fn at(self, i: usize, j: usize) -> Self {
        // SAFETY: forwarded.
        RowsMut { ptr: unsafe { self.ptr.add(i * self.ld + j) }, ld: self.ld }
    }
}

/// The sizes of a product: `C [m x n] = A [m x k] · B [k x n]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// Depth: columns of A, rows of B.
    pub k: usize,
}

/// The B operand of a GEMM.
#[derive(Clone, Copy)]
pub enum BOperand<T> {
    /// Row-major: the loops pack its panels as they need them.
    Rows(Rows<T>),
    /// Whole panels already packed by [`pack_panels`] for this kernel.
    Panels(*const T),
}

impl<T: Float> BOperand<T> {
    /// Rows `depth` of columns `cols` (`NR` columns from a multiple of `NR`, or fewer at B's
    /// right edge) as a kernel reads them: in the packed panels; where they lie, for a whole
    /// panel and `in_place`; else packed into `buf` (`depth.len() x NR`).
    ///
    /// # Safety
    /// The rows and columns must be inside B (of depth `k`); `buf` must be valid for writes.
    #[inline(always)]
    unsafe fn panel<const NR: usize>(self, k: usize, depth: Range<usize>, cols: Range<usize>, in_place: bool, buf: *mut T) -> Rows<T> {
        // SAFETY (all): inside B or its panels (caller).
        match self {
            BOperand::Panels(ptr) => Rows { ptr: unsafe { ptr.add(cols.start * k + depth.start * NR) }, ld: NR },
            BOperand::Rows(b) if in_place && cols.len() == NR => Rows { ptr: unsafe { b.ptr.add(depth.start * b.ld + cols.start) }, ld: b.ld },
            BOperand::Rows(b) => {
                unsafe { pack_b::<T, NR>(buf, b, depth, cols) };
                Rows { ptr: buf.cast_const(), ld: NR }
            }
        }
    }
}

/// The part of the depth each row of C needs, where A is zero outside a band (attention's
/// causal products): the micro-tiles skip the rest, a tile of rows `i0..i1` the depth that
/// none of its rows needs. Skipped terms are exact zeros, so the sums are unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Band {
    /// Every row needs the whole depth.
    Full,
    /// Row `i` needs depth `..i + d` (`P·V`: query `i` sees keys up to itself).
    Below(usize),
    /// Row `i` needs depth `i - d..` (saturating; `Pᵀ·dO`: key `i` is seen from query `i`).
    Above(usize),
}

impl Band {
    /// The depth rows `rows` need, within the K block `pc..pc + kc`, as an offset into the
    /// block and a length (zero where they need none of it).
    #[inline(always)]
    fn depth(self, rows: Range<usize>, pc: usize, kc: usize) -> (usize, usize) {
        let (start, end) = match self {
            Band::Full => return (0, kc),
            Band::Below(d) => (pc, (rows.end - 1 + d).min(pc + kc)),
            Band::Above(d) => (rows.start.saturating_sub(d).max(pc), pc + kc),
        };
        let start = start.min(pc + kc);
        (start - pc, end.saturating_sub(start))
    }
}

/// One product `C [m x n] = A [m x k] · B [k x n] + (beta·C + bias)`, as it is passed down
/// from the public entries through a kernel's layers (dispatch, blocking, loops).
#[derive(Clone, Copy)]
pub struct Product<T> {
    /// The sizes.
    pub shape: Shape,
    /// A, with a unit row or column stride.
    pub a: Strided<T>,
    /// B, row-major or packed into panels.
    pub b: BOperand<T>,
    /// Factor on C's old value; with 0, C is only written.
    pub beta: T,
    /// `n` values added to every row of C, or null: none.
    pub bias: *const T,
    /// C.
    pub c: RowsMut<T>,
    /// The depth each row of C needs.
    pub band: Band,
}

/// A whole GEMM for one micro-kernel, as [`gemm_packed`] computes it. Safety as [`gemm`],
/// and A must have a unit stride (the callers check).
pub type GemmFn<T> = unsafe fn(Product<T>);

/// A micro-kernel's tile and the blocked GEMM built on it.
#[derive(Clone, Copy)]
pub struct Kernel<T> {
    /// Rows of C per micro-tile.
    pub mr: usize,
    /// Columns of C per micro-tile.
    pub nr: usize,
    /// Depth of its K blocks (at most [`KC`]): C is read and written once per block.
    pub kc: usize,
    /// The GEMM.
    pub gemm: GemmFn<T>,
}

/// A micro-kernel: `(kc, a, b, beta, bias, c)` computes the tile
/// `C[MR x NR] = A·B + (beta·C + bias)`, where element `(i, p)` of A is at
/// `i * a.ld + p` (rows) or at `i + p * a.ld` (groups of `MR` values), `b` holds `kc` rows
/// of `NR` values and `bias` `NR` values added to every row (or is null: none). With
/// `beta == 0`, C is only written. (Each operand is a pointer and a stride, passed in two
/// registers as before they were grouped.)
type TileFn<T> = unsafe fn(usize, Rows<T>, Rows<T>, T, *const T, RowsMut<T>);

/// A micro-kernel for an edge tile: `(rows, kc, ...)` as [`TileFn`] for the top `rows`
/// (fewer than `MR`) rows of the tile, reading only those rows of A and writing only those
/// of C, with the same arithmetic per element.
type EdgeTileFn<T> = unsafe fn(usize, usize, Rows<T>, Rows<T>, T, *const T, RowsMut<T>);

/// `$body` with the const `$r` set to the run-time `$rows`, one of `$each`: the micro-kernels
/// are compiled for each row count of an edge tile.
macro_rules! with_rows {
    ($rows:expr, [$($each:literal)*], |$r:ident| $body:expr) => {
        match $rows {
            $($each => {
                const $r: usize = $each;
                $body
            })*
            _ => unreachable!("an edge tile has fewer rows than a whole one"),
        }
    };
}
use with_rows;

/// Storage aligned to a cache line.
#[repr(C, align(64))]
struct Aligned<A>(A);

/// `C[m x n] = A[m x k] · B[k x n] + beta · C`; `A` has a unit column stride (row-major) or
/// a unit row stride (column-major); B and C are row-major. With `beta == 0`, C is only
/// written.
///
/// # Panics
/// If A has no unit stride.
///
/// # Safety
/// Every element reached through the shapes and strides must be valid; `c` must not
/// overlap `a` or `b`, and no other thread may access the written part of `c`.
pub unsafe fn gemm<T: Float>(shape: Shape, a: Strided<T>, b: Rows<T>, beta: T, c: RowsMut<T>) {
    // SAFETY: forwarded.
    unsafe { gemm_banded(shape, a, b, beta, c, Band::Full) }
}

/// [`gemm`] for an A that is zero outside `band`: the depth no row needs is skipped (bits as
/// [`gemm`]'s wherever B is finite there).
///
/// # Panics
/// If A has no unit stride.
///
/// # Safety
/// As [`gemm`].
pub unsafe fn gemm_banded<T: Float>(shape: Shape, a: Strided<T>, b: Rows<T>, beta: T, c: RowsMut<T>, band: Band) {
    assert_unit_stride(a);
    // SAFETY: forwarded.
    unsafe { (kernel::<T>().gemm)(Product { shape, a, b: BOperand::Rows(b), beta, bias: core::ptr::null(), c, band }) }
}

/// Elements [`pack_panels`] may write for a `k x n` B, whatever the kernel: `k` rows of `n`
/// columns rounded up to whole panels of the widest kernel.
pub fn panels_len(n: usize, k: usize) -> usize {
    k * n.next_multiple_of(MAX_NR)
}

/// How the B given to [`pack_panels`] lies in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BLayout {
    /// B `[k x n]` row-major (a weight in `nn.Linear` layout, for `dout·w`).
    Rows,
    /// Bᵀ `[n x k]` row-major (a weight in `nn.Linear` layout, for `x·wᵀ`).
    Transposed,
}

/// Packs B `[k x n]` into the panels this CPU's kernel reads: for every `NR` columns of B,
/// `k` rows of `NR` values (zero past `n`). A B that many products use (every row block of
/// a layer's tokens) is packed once instead of once per product; [`gemm_packed`] reads it.
/// The panels are split across `par`'s threads (packing is a step's work too); the bits do
/// not depend on the split.
///
/// # Panics
/// If `b` holds fewer than `k * n` or `dst` fewer than [`panels_len`]`(n, k)` elements.
pub fn pack_panels<T: Float>(par: &dyn Parallel, b: &[T], layout: BLayout, k: usize, n: usize, dst: &mut [T]) {
    pack_panels_for(par, kernel::<T>().nr, b, layout, k, n, dst);
}

/// [`pack_panels`] for a kernel `nr` columns wide.
fn pack_panels_for<T: Float>(par: &dyn Parallel, nr: usize, b: &[T], layout: BLayout, k: usize, n: usize, dst: &mut [T]) {
    assert!(b.len() >= k * n && dst.len() >= k * n.next_multiple_of(nr), "pack_panels: buffers too short");
    let panels = n.div_ceil(nr);
    let tasks = par.threads().min(panels);
    let dst_p = SharedMut(dst.as_mut_ptr());
    par.run(tasks, &|task| {
        let mine = split_range(panels, tasks, task);
        // SAFETY: panel j is dst[j * nr * k..(j + 1) * nr * k]; tasks own disjoint ranges of
        // panels, inside dst (checked above).
        let dst = unsafe { dst_p.slice(mine.start * nr * k, mine.len() * nr * k) };
        // The kernels' widths (WebAssembly's, AVX2's and the portable one's, AVX-512's).
        match nr {
            8 => pack_panels_nr::<T, 8>(b, layout, k, n, mine, dst),
            16 => pack_panels_nr::<T, 16>(b, layout, k, n, mine, dst),
            32 => pack_panels_nr::<T, 32>(b, layout, k, n, mine, dst),
            _ => unreachable!("no GEMM kernel is {nr} columns wide"),
        }
    });
}

/// Panels `panels` of [`pack_panels_for`] into `dst` (which starts at the first of them),
/// with the width a constant, so that B's rows are copied as fixed-size moves (copies of a
/// run-time length are a `memmove` call per row).
fn pack_panels_nr<T: Float, const NR: usize>(b: &[T], layout: BLayout, k: usize, n: usize, panels: Range<usize>, dst: &mut [T]) {
    let width = |j: usize| NR.min(n - j * NR);
    match layout {
        // Row by row, each row of B read in order into its place in every panel: a weight
        // gradient's `x`, written long before, comes from L3 or memory, where reading it a
        // panel (a strip of columns) at a time runs at half the speed (docs/performance.md,
        // "Kernel choices").
        BLayout::Rows => {
            for p in 0..k {
                for (j, panel) in panels.clone().zip(dst.chunks_exact_mut(NR * k)) {
                    // SAFETY: row p, columns j·NR.. of the panel's width are inside B (k x n,
                    // checked by the caller); the panel holds k x NR.
                    unsafe { pack_b::<T, NR>(panel[p * NR..].as_mut_ptr(), Rows { ptr: b.as_ptr(), ld: n }, p..p + 1, j * NR..j * NR + width(j)) };
                }
            }
        }
        // The panel's columns are rows j·NR.. of Bᵀ: their transpose, rows NR apart.
        BLayout::Transposed => {
            for (j, panel) in panels.zip(dst.chunks_exact_mut(NR * k)) {
                transpose_strided(&b[j * NR * k..], width(j), k, k, panel, NR);
                if width(j) < NR {
                    for row in panel.chunks_exact_mut(NR) {
                        row[width(j)..].fill(T::ZERO);
                    }
                }
            }
        }
    }
}

/// [`gemm`] with B `[k x n]` as [`pack_panels`] left it (same bits as from B row-major),
/// plus an optional row vector: `C = A·B + (beta·C + bias)`, with `bias [n]` added to every
/// row as the micro-kernel stores its tile (a bias with no pass of its own over C). Bits as
/// if C had held `beta·C + bias` (rounded) before a GEMM with `beta = 1`.
///
/// # Panics
/// If A has no unit stride, the panels hold fewer than `k x n` in whole panels, or the bias
/// is not `n` long.
///
/// # Safety
/// As [`gemm`].
pub unsafe fn gemm_packed<T: Float>(shape: Shape, a: Strided<T>, panels: &[T], beta: T, bias: Option<&[T]>, c: RowsMut<T>) {
    // SAFETY: forwarded.
    unsafe { gemm_packed_on(kernel::<T>(), shape, a, panels, beta, bias, c) }
}

/// [`gemm_packed`] on a given kernel (whose panels [`pack_panels_for`] wrote).
///
/// # Safety
/// As [`gemm`]; the kernel must run on this CPU.
unsafe fn gemm_packed_on<T: Float>(kernel: Kernel<T>, shape: Shape, a: Strided<T>, panels: &[T], beta: T, bias: Option<&[T]>, c: RowsMut<T>) {
    assert_unit_stride(a);
    assert!(panels.len() >= shape.k * shape.n.next_multiple_of(kernel.nr), "gemm_packed: panels too short");
    let bias = match bias {
        Some(bias) => {
            assert_eq!(bias.len(), shape.n, "gemm_packed: one bias per column");
            bias.as_ptr()
        }
        None => core::ptr::null(),
    };
    // SAFETY: forwarded; the panels hold k x n (checked).
    unsafe { (kernel.gemm)(Product { shape, a, b: BOperand::Panels(panels.as_ptr()), beta, bias, c, band: Band::Full }) }
}

fn assert_unit_stride<T>(a: Strided<T>) {
    assert!(a.rs == 1 || a.cs == 1, "gemm: A must be row-major or column-major (strides {} and {})", a.rs, a.cs);
}

/// A is row-major: the loops read `MR` rows per micro-panel.
const ROWS: usize = 0;
/// A is column-major with columns close enough to read `MR`-value groups in place.
const GROUPS_IN_PLACE: usize = 1;
/// A is column-major with columns far apart: groups are packed a row block at a time.
const GROUPS_PACKED: usize = 2;

/// How much memory (bytes) the `kc` groups of one micro-panel of a column-major A may span
/// to be read in place: a group per column, columns `s` bytes apart, so `kc · s` bytes, whose
/// lines fall into only `64 / (s / 64)` of a 32 KiB, 8-way L1's 64 sets (`s` a multiple of
/// 64). Past an L1's worth they evict each other within the micro-panel and every tile reads
/// its A from L2 (docs/performance.md, "Kernel choices"). Attention's `Pᵀ` and `dSᵀ`, a block of 24 query rows deep with columns
/// `T` floats apart, stay in place up to T = 341.
const IN_PLACE_GROUP_SPAN: usize = 32 * 1024;

/// Runs `loops[layout]` for A's layout (see [`ROWS`]; `depth` is the loops' K block depth);
/// an empty or zero-depth product needs none.
/// Each layout's loops are compiled on their own, so a call reserves (and probes, page by
/// page) only the stack its layout uses: one frame for all three was 200 KiB, and probing it
/// took longer than a small product of attention.
///
/// # Safety
/// As [`GemmFn`]; the loops must run on this CPU.
#[inline(always)]
unsafe fn dispatch_layout<T: Float>(loops: [GemmFn<T>; 3], depth: usize, p: Product<T>) {
    let Shape { m, n, k } = p.shape;
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // SAFETY: forwarded.
        return unsafe { scale_c(p) };
    }
    let layout = if p.a.cs == 1 {
        ROWS
    } else if k.min(depth) * p.a.cs * core::mem::size_of::<T>() <= IN_PLACE_GROUP_SPAN {
        GROUPS_IN_PLACE
    } else {
        GROUPS_PACKED
    };
    // SAFETY: forwarded.
    unsafe { loops[layout](p) }
}

/// The blocked loops for an `MR x NR` micro-kernel `tile` (and `edge_tile` for fewer rows)
/// and one `LAYOUT` of A (k > 0), with the buffer for a row block of packed groups where
/// that layout needs one.
///
/// # Safety
/// As [`gemm`]; the kernel must run on this CPU; A's layout must be `LAYOUT`.
#[inline(always)]
unsafe fn gemm_blocked<T: Float, const MR: usize, const NR: usize, const DEPTH: usize, const LAYOUT: usize>(
    tile: TileFn<T>,
    edge_tile: EdgeTileFn<T>,
    p: Product<T>,
) {
    const { assert!(MR <= MAX_MR && MC.is_multiple_of(MR) && NR <= MAX_NR && DEPTH <= KC) };
    if LAYOUT == GROUPS_PACKED {
        let mut a_block = MaybeUninit::<Aligned<[[T; DEPTH]; MC]>>::uninit();
        // SAFETY: forwarded; the buffer holds MC x DEPTH.
        unsafe { blocked_loops::<T, MR, NR, DEPTH, LAYOUT>(tile, edge_tile, a_block.as_mut_ptr().cast(), p) }
    } else {
        // SAFETY: forwarded; A is read in place.
        unsafe { blocked_loops::<T, MR, NR, DEPTH, LAYOUT>(tile, edge_tile, core::ptr::null_mut(), p) }
    }
}

/// [`gemm_blocked`]'s loops over K blocks `DEPTH` deep; `k > 0`. `ap` holds `MC x DEPTH`
/// elements for [`GROUPS_PACKED`] (else it is not used).
///
/// # Safety
/// As [`gemm`]; the kernel must run on this CPU.
#[inline(always)]
unsafe fn blocked_loops<T: Float, const MR: usize, const NR: usize, const DEPTH: usize, const LAYOUT: usize>(
    tile: TileFn<T>,
    edge_tile: EdgeTileFn<T>,
    ap: *mut T,
    p: Product<T>,
) {
    let Product { shape: Shape { m, n, k }, a, b, beta, bias, c, band } = p;
    let mut b_pack = MaybeUninit::<Aligned<[[T; NR]; DEPTH]>>::uninit();
    let mut c_edge = MaybeUninit::<Aligned<[[T; NR]; MR]>>::uninit();
    let mut bias_edge = [T::ZERO; NR];
    let bp = b_pack.as_mut_ptr().cast::<T>();
    // Stride of A's micro-panels: where they lie, or packed.
    let a_stride = match LAYOUT {
        ROWS => a.rs,
        GROUPS_IN_PLACE => a.cs,
        _ => MR,
    };
    let row_block = row_block(m, MR);
    for pc in (0..k).step_by(DEPTH) {
        let kc = DEPTH.min(k - pc);
        // beta and the bias apply once, in the first K block.
        let (beta_pc, bias_pc) = if pc == 0 { (beta, bias) } else { (T::ONE, core::ptr::null()) };
        for ic in (0..m).step_by(row_block) {
            let mc = row_block.min(m - ic);
            if LAYOUT == GROUPS_PACKED {
                // SAFETY: rows ic..ic+mc, columns pc..pc+kc are inside A (caller); the buffer
                // holds MC x DEPTH.
                unsafe { pack_groups::<T, MR, DEPTH>(ap, a, ic, mc, pc, kc) };
            }
            for jc in (0..n).step_by(NR) {
                let w = NR.min(n - jc);
                // SAFETY: rows pc..pc+kc, columns jc..jc+w are inside B; the buffer holds DEPTH x NR;
                // the bias (when there is one) holds n values. A whole panel that few tiles
                // use is read in place (see the module docs).
                let (b_panel, bias_panel) =
                    unsafe { (b.panel::<NR>(k, pc..pc + kc, jc..jc + w, mc <= MC / 2, bp), bias_panel::<T, NR>(bias_pc, jc, w, &mut bias_edge)) };
                for ir in (0..mc).step_by(MR) {
                    let rows = MR.min(mc - ir);
                    // SAFETY: rows ic+ir.. of A, or micro-panel ir/MR of the packed ones (MR x
                    // DEPTH apart); the tile (ic+ir.., jc..) is inside C; the edge copy holds MR x NR.
                    unsafe {
                        let a_panel = match LAYOUT {
                            GROUPS_PACKED => ap.add(ir * DEPTH).cast_const(),
                            _ => a.ptr.add((ic + ir) * a.rs + pc * a.cs),
                        };
                        // The band's depth: a later start moves along A's rows (or groups)
                        // and B's rows.
                        let (skip, depth) = band.depth(ic + ir..ic + ir + rows, pc, kc);
                        let a_panel = Rows { ptr: a_panel.add(skip * if LAYOUT == ROWS { 1 } else { a_stride }), ld: a_stride };
                        let b_panel = Rows { ptr: b_panel.ptr.add(skip * b_panel.ld), ld: b_panel.ld };
                        let whole = |c| tile(depth, a_panel, b_panel, beta_pc, bias_panel, c);
                        let edge = |rows, c| edge_tile(rows, depth, a_panel, b_panel, beta_pc, bias_panel, c);
                        run_tile::<T, MR, NR>(whole, edge, rows, w, c.at(ic + ir, jc), c_edge.as_mut_ptr().cast());
                    }
                }
            }
        }
    }
}

/// `C = beta·C + bias` (a null bias: none), as the kernels compute a zero-depth product.
///
/// # Safety
/// C must be valid for writes; a bias must hold `n` values.
unsafe fn scale_c<T: Float>(p: Product<T>) {
    let Product { shape: Shape { m, n, .. }, beta, bias, c, .. } = p;
    for i in 0..m {
        for j in 0..n {
            // SAFETY: inside C and the bias (caller).
            unsafe {
                let cij = c.ptr.add(i * c.ld + j);
                let bj = if bias.is_null() { T::ZERO } else { *bias.add(j) };
                *cij = if beta == T::ZERO { T::ZERO + bj } else { T::ZERO + (beta * *cij + bj) };
            }
        }
    }
}

/// The bias values of the column panel `jc..jc+w` as the kernels read them (`NR` values):
/// in place for a whole panel, else copied into `edge` (at least `NR`) and zero-padded; null
/// stays null.
///
/// # Safety
/// A non-null bias must hold at least `jc + w` values.
#[inline(always)]
unsafe fn bias_panel<T: Float, const NR: usize>(bias: *const T, jc: usize, w: usize, edge: &mut [T]) -> *const T {
    if bias.is_null() {
        return bias;
    }
    // SAFETY (both): columns jc..jc+w of the bias (caller).
    if w == NR {
        return unsafe { bias.add(jc) };
    }
    edge[..NR].fill(T::ZERO);
    unsafe { core::ptr::copy_nonoverlapping(bias.add(jc), edge.as_mut_ptr(), w) };
    edge.as_ptr()
}

/// Runs the `rows x w` block `ct` of C of an `MR x NR` tile: `whole(c)` in place for a whole
/// tile, else `edge(rows, c)` (`rows` rows of `NR` columns; `whole` for `MR`) in place where
/// the columns are whole, or on a zero-padded copy in `c_edge` (row stride `NR`), so edge
/// elements see the same arithmetic as the rest. The copy is cleared only when
/// it is used (clearing it once per call costs attention's small products most).
///
/// # Safety
/// The `rows x w` block at `ct` must be inside C; `c_edge` must be valid for `rows x NR`
/// writes.
#[inline(always)]
unsafe fn run_tile<T: Float, const MR: usize, const NR: usize>(
    whole: impl FnOnce(RowsMut<T>),
    edge: impl FnOnce(usize, RowsMut<T>),
    rows: usize,
    w: usize,
    ct: RowsMut<T>,
    c_edge: *mut T,
) {
    // `whole` is called in two places only, so that the loops inline both.
    if w == NR {
        return if rows == MR { whole(ct) } else { edge(rows, ct) };
    }
    // SAFETY: inside C and the edge copy (caller).
    unsafe {
        for i in 0..rows * NR {
            c_edge.add(i).write(T::ZERO);
        }
        for i in 0..rows {
            core::ptr::copy_nonoverlapping(ct.ptr.add(i * ct.ld), c_edge.add(i * NR), w);
        }
        let copy = RowsMut { ptr: c_edge, ld: NR };
        if rows == MR {
            whole(copy)
        } else {
            edge(rows, copy)
        }
        for i in 0..rows {
            core::ptr::copy_nonoverlapping(c_edge.add(i * NR), ct.ptr.add(i * ct.ld), w);
        }
    }
}

/// Packs rows `i0..i0+mc`, columns `p0..p0+kc` of a column-major `a` into `dst` as
/// micro-panels of `kc` groups of `MR` values, `MR x DEPTH` elements apart (a last panel's
/// groups hold only its rows).
///
/// # Safety
/// The block must be inside `a`; `dst` must hold `mc.next_multiple_of(MR) x DEPTH` elements.
#[inline(always)]
unsafe fn pack_groups<T: Float, const MR: usize, const DEPTH: usize>(dst: *mut T, a: Strided<T>, i0: usize, mc: usize, p0: usize, kc: usize) {
    for r0 in (0..mc).step_by(MR) {
        let rows = MR.min(mc - r0);
        // SAFETY (all accesses): inside the block and the buffer (caller).
        unsafe {
            let panel = dst.add(r0 * DEPTH);
            let src = a.ptr.add((i0 + r0) * a.rs + p0 * a.cs);
            for p in 0..kc {
                let group = panel.add(p * MR);
                if rows == MR {
                    // Constant-length copies, as in `pack_b`.
                    core::ptr::copy_nonoverlapping(src.add(p * a.cs), group, MR);
                } else {
                    core::ptr::copy_nonoverlapping(src.add(p * a.cs), group, rows);
                }
            }
        }
    }
}

/// Packs rows `depth`, columns `cols` (at most `NR`) of `b` into `dst` as `depth.len()` rows
/// of `NR` (columns past `cols` are zero).
///
/// # Safety
/// The block must be inside `b`; `dst` must hold `depth.len() * NR` elements.
#[inline(always)]
unsafe fn pack_b<T: Float, const NR: usize>(dst: *mut T, b: Rows<T>, depth: Range<usize>, cols: Range<usize>) {
    let (kc, w, ldb) = (depth.len(), cols.len(), b.ld);
    // SAFETY (all accesses): inside the block and the buffer (caller).
    unsafe {
        let src = b.ptr.add(depth.start * ldb + cols.start);
        // Copies of a constant NR values: LLVM emits them as vector moves wherever this is
        // inlined (a `[T; NR]` read was sometimes split into NR scalar moves).
        if w == NR {
            for p in 0..kc {
                core::ptr::copy_nonoverlapping(src.add(p * ldb), dst.add(p * NR), NR);
            }
        } else {
            for p in 0..kc {
                let row = dst.add(p * NR);
                for j in 0..NR {
                    row.add(j).write(if j < w { *src.add(p * ldb + j) } else { T::ZERO });
                }
            }
        }
    }
}

/// Name of the f32 micro-kernel [`gemm`] uses on this CPU: `avx512`, `avx2+fma`,
/// `wasm-relaxed-simd`, `wasm-simd128` or `portable`.
pub fn f32_kernel_name() -> &'static str {
    match (f32_kernel().mr, f32_kernel().nr) {
        (12, 32) => "avx512",
        (6, 16) => "avx2+fma",
        (4, 8) if cfg!(target_feature = "relaxed-simd") => "wasm-relaxed-simd",
        (4, 8) => "wasm-simd128",
        _ => "portable",
    }
}

/// What the products' operands are rounded to (`--precision` on the CPU): nothing (f32), or
/// bf16 with f32 sums ([`bf16::gemm_bf16`], where the CPU has its kernel).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Operands {
    /// f32 operands and sums.
    #[default]
    F32,
    /// bf16 operands (rounded as they are packed), f32 sums.
    Bf16,
}

/// The f32 GEMM's peak GFLOP/s on every thread of `par` together (the figure MFU is taken
/// against on the CPU): each thread multiplies its own 192 x 192 matrices, cache-resident,
/// the best of rounds of about 0.1 s ([`crate::parallel::best_rate`]) on the caller's clock
/// `now` (seconds).
#[cfg(feature = "alloc")]
pub fn peak_gflops(par: &dyn Parallel, now: &dyn Fn() -> f64) -> f64 {
    // SAFETY (the closure): product_peak passes valid, non-overlapping operands.
    product_peak(par, now, |shape, a, b, c| unsafe { gemm(shape, a, b, 0.0, c) })
}

/// The peak GFLOP/s of `product` (a GEMM with [`gemm`]'s contract) on every thread of `par`
/// together: each thread multiplies its own 192 x 192 matrices, cache-resident, so the
/// kernel's arithmetic rate is what is measured; the best of rounds of about 0.1 s
/// ([`crate::parallel::best_rate`], `now` the caller's clock in seconds).
#[cfg(feature = "alloc")]
fn product_peak(par: &dyn Parallel, now: &dyn Fn() -> f64, product: unsafe fn(Shape, Strided<f32>, Rows<f32>, RowsMut<f32>)) -> f64 {
    const N: usize = 192;
    let a = alloc::vec![0.5f32; N * N];
    let b = alloc::vec![0.25f32; N * N];
    let mut out = alloc::vec![0f32; N * N * par.threads()];
    let c = SharedMut(out.as_mut_ptr());
    crate::parallel::best_rate(
        par,
        1,
        2.0 * (N * N * N) as f64,
        &|thread, reps| {
            for _ in 0..reps {
                let c = RowsMut { ptr: c.ptr().wrapping_add(thread * N * N), ld: N };
                // SAFETY: a and b are N x N row-major; each thread writes its own N x N of c.
                unsafe { product(Shape { m: N, n: N, k: N }, Strided { ptr: a.as_ptr(), rs: N, cs: 1 }, Rows { ptr: b.as_ptr(), ld: N }, c) };
            }
        },
        now,
    )
}

/// The fastest f32 kernel this CPU runs (x86-64: the one for [`crate::simd::width`]).
pub(crate) fn f32_kernel() -> Kernel<f32> {
    #[cfg(all(target_arch = "x86_64", any(feature = "std", target_feature = "avx2")))]
    match crate::simd::width() {
        crate::simd::Width::Avx512 => return x86::avx512::KERNEL,
        crate::simd::Width::Avx2 => return x86::avx2::KERNEL,
        crate::simd::Width::Baseline => {}
    }
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    return wasm::KERNEL;
    #[allow(unreachable_code)]
    portable::portable()
}

/// The fastest GEMM micro-kernel this CPU runs for `T`: the one [`f32_kernel_name`] names for
/// `f32`, the portable one for other types (`f64`, in the gradient checks).
pub fn kernel<T: Float>() -> Kernel<T> {
    let fastest: &dyn Any = &f32_kernel();
    fastest.downcast_ref::<Kernel<T>>().copied().unwrap_or_else(portable::portable)
}

/// Also built for WebAssembly, where they run on its kernel (scripts/test.sh, under node).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::parallel::ReversedThreads;
    use crate::rng::Rng;

    /// `A·B` for row-major `a` and `b`.
    fn naive(shape: Shape, a: &[f64], b: &[f64]) -> Vec<f64> {
        let Shape { m, n, k } = shape;
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    /// Every f32 kernel this CPU can run, and the portable one.
    fn f32_kernels() -> Vec<(&'static str, Kernel<f32>)> {
        #[allow(unused_mut)]
        let mut v = vec![("portable", portable::portable())];
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        v.push(("wasm", wasm::KERNEL));
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                v.push(("avx2", x86::avx2::KERNEL));
            }
            if std::is_x86_feature_detected!("avx512f") {
                v.push(("avx512", x86::avx512::KERNEL));
            }
        }
        v
    }

    /// Whole tiles and ragged edges, with a row stride wider than the rows.
    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn transpose_matches_definition() {
        for &(rows, cols, stride) in &[(1, 1, 1), (8, 8, 8), (19, 27, 30), (64, 32, 96), (3, 17, 17)] {
            let src: Vec<f32> = (0..rows * stride).map(|i| i as f32).collect();
            let mut dst = vec![-1f32; rows * cols];
            transpose(&src, rows, cols, stride, &mut dst);
            let src64: Vec<f64> = src.iter().map(|&x| x as f64).collect();
            let mut dst64 = vec![-1f64; rows * cols];
            transpose(&src64, rows, cols, stride, &mut dst64);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(dst[c * rows + r], src[r * stride + c], "{rows}x{cols} ({r}, {c})");
                    assert_eq!(dst64[c * rows + r], src64[r * stride + c], "f64 {rows}x{cols} ({r}, {c})");
                }
            }
        }
    }

    /// A row's result must not depend on which tile it falls in (whole or edge, of every
    /// kernel), and a product writes no row of C past its own.
    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn rows_are_independent_of_tiling() {
        let (m, n, k) = (13, 37, 70);
        let mut rng = Rng::new(9);
        let a: Vec<f32> = (0..m * k).map(|_| rng.next_f64() as f32 - 0.5).collect();
        let b: Vec<f32> = (0..k * n).map(|_| rng.next_f64() as f32 - 0.5).collect();
        for (name, kernel) in f32_kernels() {
            let product = |start: usize, rows: usize, c: &mut [f32]| unsafe {
                let sub = Strided { ptr: a[start * k..].as_ptr(), rs: k, cs: 1 };
                (kernel.gemm)(Product {
                    shape: Shape { m: rows, n, k },
                    a: sub,
                    b: BOperand::Rows(Rows { ptr: b.as_ptr(), ld: n }),
                    beta: 0.0,
                    bias: core::ptr::null(),
                    c: RowsMut { ptr: c.as_mut_ptr(), ld: n },
                    band: Band::Full,
                })
            };
            // A whole tile's rows more than the product's, which keep their value.
            let padded = |rows: usize| vec![7f32; (rows + MAX_MR) * n];
            let mut whole = padded(m);
            product(0, m, &mut whole);
            for start in 0..m {
                for rows in 1..=(m - start) {
                    let mut part = padded(rows);
                    product(start, rows, &mut part);
                    assert_eq!(part[..rows * n], whole[start * n..(start + rows) * n], "{name}: rows {start}..{}", start + rows);
                    assert!(part[rows * n..].iter().all(|&x| x == 7.0), "{name}: {rows} rows wrote past C");
                }
            }
        }
    }

    /// With A zero outside a band, the banded product has the bits of the full one: every
    /// kernel, every layout of A, beta 0 and 1, bands ending and starting inside and past
    /// the depth, over two K blocks.
    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn banded_product_matches_full() {
        let (m, n, k) = (29, 21, KC + 45);
        let mut rng = Rng::new(11);
        let b: Vec<f32> = (0..k * n).map(|_| rng.next_f64() as f32 - 0.5).collect();
        let c0: Vec<f32> = (0..m * n).map(|_| rng.next_f64() as f32 - 0.5).collect();
        for band in [Band::Below(1), Band::Below(7), Band::Below(KC + 3), Band::Below(k), Band::Above(0), Band::Above(5)] {
            let needed = |i: usize, p: usize| match band {
                Band::Full => true,
                Band::Below(d) => p < i + d,
                Band::Above(d) => p + d >= i,
            };
            let a: Vec<f32> = (0..m * k).map(|x| if needed(x / k, x % k) { rng.next_f64() as f32 - 0.5 } else { 0.0 }).collect();
            // Row-major; column-major with columns close (groups read in place) and far apart
            // (groups packed).
            for col_stride in [0, m, 300] {
                let (stored, rs, cs) = match col_stride {
                    0 => (a.clone(), k, 1),
                    _ => {
                        ((0..col_stride * k).map(|x| if x % col_stride < m { a[(x % col_stride) * k + x / col_stride] } else { 0.0 }).collect(), 1, col_stride)
                    }
                };
                let a = Strided { ptr: stored.as_ptr(), rs, cs };
                for beta in [0.0, 1.0] {
                    for (name, kernel) in f32_kernels() {
                        let run = |band| {
                            let mut c = c0.clone();
                            let (b, c_rows) = (BOperand::Rows(Rows { ptr: b.as_ptr(), ld: n }), RowsMut { ptr: c.as_mut_ptr(), ld: n });
                            unsafe { (kernel.gemm)(Product { shape: Shape { m, n, k }, a, b, beta, bias: core::ptr::null(), c: c_rows, band }) };
                            c
                        };
                        assert_eq!(run(band), run(Band::Full), "{name} {band:?} column stride {col_stride} beta {beta}");
                    }
                }
            }
        }
    }

    #[cfg(not(target_arch = "wasm32"))]
    #[test]
    #[should_panic(expected = "row-major or column-major")]
    fn a_without_unit_stride_is_refused() {
        let (a, b, mut c) = ([1f32; 8], [1f32; 4], [0f32; 4]);
        let a = Strided { ptr: a.as_ptr(), rs: 2, cs: 4 };
        unsafe { gemm(Shape { m: 2, n: 2, k: 2 }, a, Rows { ptr: b.as_ptr(), ld: 2 }, 0.0, RowsMut { ptr: c.as_mut_ptr(), ld: 2 }) };
    }

    /// Odd shapes (edge tiles, several K blocks), A row-major, column-major and column-major
    /// with a leading stride wider than its rows (the last shape's columns are too far apart
    /// to be read in place: packed), beta 0 and 1, with and without a bias row, f32 and f64.
    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn matches_naive_product() {
        let mut rng = Rng::new(8);
        for &(m, n, k) in &[(1, 1, 1), (7, 17, 5), (13, 33, 300), (6, 16, 513), (20, 3, 2), (101, 45, 260), (301, 37, 30)] {
            let shape = Shape { m, n, k };
            let a: Vec<f64> = (0..m * k).map(|_| rng.next_f64() - 0.5).collect();
            let b: Vec<f64> = (0..k * n).map(|_| rng.next_f64() - 0.5).collect();
            let c0: Vec<f64> = (0..m * n).map(|_| rng.next_f64() - 0.5).collect();
            let bias: Vec<f64> = (0..n).map(|_| rng.next_f64() - 0.5).collect();
            let mut row_major_results = Vec::new();
            for layout in ["rows", "columns", "wide columns"] {
                // The same A stored row-major (rs = k), column-major (rs = 1, cs = m) or
                // column-major with three NaNs after every column (cs = m + 3).
                let mut t = vec![0.0; m * k];
                transpose(&a, m, k, k, &mut t);
                let (stored, rs, cs) = match layout {
                    "rows" => (a.clone(), k, 1),
                    "columns" => (t, 1, m),
                    _ => (t.chunks(m).flat_map(|col| col.iter().copied().chain([f64::NAN; 3])).collect(), 1, m + 3),
                };
                let expect = naive(shape, &a, &b);
                for (beta, with_bias) in [(0.0, false), (1.0, false), (0.0, true), (1.0, true)] {
                    let bias_of = |j: usize| if with_bias { bias[j] } else { 0.0 };
                    let mut c64 = c0.clone();
                    unsafe {
                        let a64 = Strided { ptr: stored.as_ptr(), rs, cs };
                        match with_bias {
                            true => (kernel::<f64>().gemm)(Product {
                                shape,
                                a: a64,
                                b: BOperand::Rows(Rows { ptr: b.as_ptr(), ld: n }),
                                beta,
                                bias: bias.as_ptr(),
                                c: RowsMut { ptr: c64.as_mut_ptr(), ld: n },
                                band: Band::Full,
                            }),
                            false => gemm(shape, a64, Rows { ptr: b.as_ptr(), ld: n }, beta, RowsMut { ptr: c64.as_mut_ptr(), ld: n }),
                        }
                    }
                    let s32: Vec<f32> = stored.iter().map(|&x| x as f32).collect();
                    let b32: Vec<f32> = b.iter().map(|&x| x as f32).collect();
                    let bias32: Vec<f32> = bias.iter().map(|&x| x as f32).collect();
                    for i in 0..m * n {
                        let e = expect[i] + beta * c0[i] + bias_of(i % n);
                        assert!((c64[i] - e).abs() < 1e-12, "f64 {m}x{n}x{k} {layout} b={beta} bias={with_bias} [{i}]");
                    }
                    for (name, kernel) in f32_kernels() {
                        let mut c32: Vec<f32> = c0.iter().map(|&x| x as f32).collect();
                        let a32 = Strided { ptr: s32.as_ptr(), rs, cs };
                        let bias_ptr = if with_bias { bias32.as_ptr() } else { core::ptr::null() };
                        unsafe {
                            (kernel.gemm)(Product {
                                shape,
                                a: a32,
                                b: BOperand::Rows(Rows { ptr: b32.as_ptr(), ld: n }),
                                beta: beta as f32,
                                bias: bias_ptr,
                                c: RowsMut { ptr: c32.as_mut_ptr(), ld: n },
                                band: Band::Full,
                            })
                        };
                        for i in 0..m * n {
                            let e = expect[i] + beta * c0[i] + bias_of(i % n);
                            // f32 rounding of k products: a few ulp of sqrt(k)-sized sums.
                            assert!((c32[i] as f64 - e).abs() < 1e-5 * (1.0 + k as f64).sqrt(), "{name} {m}x{n}x{k} {layout} bias={with_bias} [{i}]");
                        }
                        // The bias row is as if C had held beta·C + bias before a GEMM with
                        // beta 1: bit for bit.
                        if with_bias {
                            let mut c_then: Vec<f32> = (0..m * n).map(|i| (beta as f32 * c0[i] as f32) + bias32[i % n]).collect();
                            unsafe {
                                (kernel.gemm)(Product {
                                    shape,
                                    a: a32,
                                    b: BOperand::Rows(Rows { ptr: b32.as_ptr(), ld: n }),
                                    beta: 1.0,
                                    bias: core::ptr::null(),
                                    c: RowsMut { ptr: c_then.as_mut_ptr(), ld: n },
                                    band: Band::Full,
                                })
                            };
                            assert_eq!(c_then, c32, "{name} {m}x{n}x{k} beta={beta}: bias differs from a prefilled C");
                        }
                        // B packed into panels once (from B and from Bᵀ, the panels split
                        // among three threads): the same bits (padding past the panels is NaN:
                        // never read).
                        let mut bt32 = vec![0f32; k * n];
                        transpose(&b32, k, n, n, &mut bt32);
                        for (b_layout, src) in [(BLayout::Rows, &b32), (BLayout::Transposed, &bt32)] {
                            let mut panels = vec![f32::NAN; panels_len(n, k)];
                            pack_panels_for(&ReversedThreads(3), kernel.nr, src, b_layout, k, n, &mut panels);
                            let mut c_packed: Vec<f32> = c0.iter().map(|&x| x as f32).collect();
                            let bias = with_bias.then_some(&bias32[..]);
                            unsafe { gemm_packed_on(kernel, shape, a32, &panels, beta as f32, bias, RowsMut { ptr: c_packed.as_mut_ptr(), ld: n }) };
                            assert_eq!(c_packed, c32, "{name} {m}x{n}x{k} {layout} beta={beta}: B packed from {b_layout:?} differs");
                        }
                        // Every layout of A gets the same arithmetic: bit-identical.
                        let key = (name, beta.to_bits(), with_bias);
                        match row_major_results.iter().find(|(k, _)| *k == key) {
                            Some((_, first)) => assert_eq!(first, &c32, "{name} {m}x{n}x{k}: layouts differ"),
                            None => row_major_results.push((key, c32)),
                        }
                    }
                }
            }
        }
    }
}
