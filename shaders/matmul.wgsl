// Matmul family: the tiled GEMM with its fused epilogues (forward, and with transposed
// operands both backward products), and the bias gradient with GELU backward folded in.
// CPU twin: core/src/ops/matmul.rs.

// a, b and c are f16 where the dispatch stores them so (see kernels.rs: `ElemN`).
@group(0) @binding(1) var<storage, read_write> mm_a: array<Elem1>;
@group(0) @binding(2) var<storage, read_write> mm_b: array<Elem2>;
@group(0) @binding(3) var<storage, read_write> mm_c: array<Elem3>;
@group(0) @binding(4) var<storage, read_write> mm_bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> mm_aux: array<f32>;
// a and b as vec4s, for the 128 x 128-tile kernels' staging (matmul_wide, matmul_tensor): four
// consecutive elements in one load. A binding of vec4s reaches its last elements because
// alpha-gpu binds whole 16-byte vec4s (`View::binding_len`); an entry point reads a and b
// either as these or as mm_a and mm_b, never both.
@group(0) @binding(1) var<storage, read_write> mm_a4: array<vec4<Elem1>>;
@group(0) @binding(2) var<storage, read_write> mm_b4: array<vec4<Elem2>>;

const TILE: u32 = 64u;
const BK: u32 = 16u;
// Row pitch of the shared tiles: TILE + 1, so that a tile loaded along k (16 threads, one k
// each) writes 16 different banks.
const PITCH: u32 = 65u;
const EPI_ACCUMULATE: u32 = 1u;
const EPI_BIAS: u32 = 2u;
const EPI_GELU: u32 = 4u;
const EPI_RESIDUAL: u32 = 8u;
const EPI_GELU_SLOPE: u32 = 16u;
// Not an epilogue: the operands are rounded to f16 as they are loaded (`--precision f16`).
const F16_OPERANDS: u32 = 32u;

var<workgroup> a_tile: array<f32, 1040>; // [BK][PITCH]
var<workgroup> b_tile: array<f32, 1040>; // [BK][PITCH]

// The product's words (see `matmul` below) and workgroup z's part of it: its depth chunk
// k_begin .. k_end and the slice of c it writes from.
struct Product { rows: u32, cols: u32, a_rs: u32, a_cs: u32, b_rs: u32, b_cs: u32, k_begin: u32, k_end: u32, slice: u32 }

// An operand as the product uses it: rounded to f16 under F16_OPERANDS, unless it is stored
// as f16 (`half`: its binding's HALFn) and so is one already.
fn operand(x: f32, half: bool) -> f32 {
    if (!half && (word(3u) & F16_OPERANDS) != 0u) {
        return round_f16(x);
    }
    return x;
}

fn product(z: u32) -> Product {
    let k_begin = z * word(8u);
    return Product(word(0u), word(1u), word(4u), word(5u), word(6u), word(7u), k_begin, min(word(2u), k_begin + word(8u)), z * word(0u) * word(9u));
}

// c[rows, cols] = epilogue(a·b): a[i, k] at i*a_rs + k*a_cs, b[k, j] at k*b_rs + j*b_cs,
// c[i, j] (and aux[i, j]) at i*c_rs + j.
// Words: rows, cols, depth, flags (EPI_*), a_rs, a_cs, b_rs, b_cs, chunk, c_rs. Workgroup z
// sums depth chunk z (k in z*chunk .. (z+1)*chunk) into slice z of c (rows*c_rs each); split
// products (more than one chunk) have no epilogue and are summed by add_partials.
// With F16_OPERANDS in the flags, every operand is rounded to f16 as it is loaded (the sums
// stay f32). Epilogue order: (+ c if ACCUMULATE) (+ bias[j]) (GELU: aux = pre-activation, or with
// GELU_SLOPE gelu'(pre-activation), for backward) (+ aux[i, j] if RESIDUAL).
// Grid: (cols / 64, rows / 64, depth / chunk), workgroup 16x16, each thread a 4x4 block:
// rows l.y + 16i, columns l.x + 16j, accumulated in four vec4s (no indexed arrays: they stay
// in registers).
@compute @workgroup_size(16, 16)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let p = product(wid.z);
    let row0 = wid.y * TILE;
    let col0 = wid.x * TILE;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var k0 = p.k_begin; k0 < p.k_end; k0 += BK) {
        for (var e = lid; e < BK * TILE; e += 256u) {
            // Walk memory contiguously: along k when a's rows are contiguous, else along rows.
            var k = e / TILE;
            var r = e % TILE;
            if (p.a_cs == 1u) {
                k = e % BK;
                r = e / BK;
            }
            var x = 0.0;
            if (row0 + r < p.rows && k0 + k < p.k_end) {
                x = operand(f32(mm_a[(row0 + r) * p.a_rs + (k0 + k) * p.a_cs]), HALF1);
            }
            a_tile[k * PITCH + r] = x;
            var kb = e / TILE;
            var c = e % TILE;
            if (p.b_cs != 1u) {
                kb = e % BK;
                c = e / BK;
            }
            var y = 0.0;
            if (col0 + c < p.cols && k0 + kb < p.k_end) {
                y = operand(f32(mm_b[(k0 + kb) * p.b_rs + (col0 + c) * p.b_cs]), HALF2);
            }
            b_tile[kb * PITCH + c] = y;
        }
        workgroupBarrier();
        for (var k = 0u; k < BK; k++) {
            let ai = k * PITCH + l.y;
            let bi = k * PITCH + l.x;
            let a = vec4<f32>(a_tile[ai], a_tile[ai + 16u], a_tile[ai + 32u], a_tile[ai + 48u]);
            let b = vec4<f32>(b_tile[bi], b_tile[bi + 16u], b_tile[bi + 32u], b_tile[bi + 48u]);
            acc0 = fma(vec4<f32>(a.x), b, acc0);
            acc1 = fma(vec4<f32>(a.y), b, acc1);
            acc2 = fma(vec4<f32>(a.z), b, acc2);
            acc3 = fma(vec4<f32>(a.w), b, acc3);
        }
        workgroupBarrier();
    }
    let c0 = col0 + l.x;
    store_row(row0 + l.y, c0, 16u, p.slice, acc0);
    store_row(row0 + l.y + 16u, c0, 16u, p.slice, acc1);
    store_row(row0 + l.y + 32u, c0, 16u, p.slice, acc2);
    store_row(row0 + l.y + 48u, c0, 16u, p.slice, acc3);
}

// matmul_wide: the same product, words and epilogues as `matmul` over 128 x 128 tiles of c
// for large products: 256 threads in a 16 x 16 grid of 8 x 8 blocks (thread t's rows
// 4 t.y + i and 64 + 4 t.y + i, columns 4 t.x + j and 64 + 4 t.x + j; see wide_block), in
// sixteen vec4 accumulators; each step of the depth loop reads two vec4s of a's tile and two
// of b's from workgroup memory for 64 FMAs (matmul's 4 x 4 blocks read eight scalars for 16;
// see wide_depth). The next depth block is loaded and stored into the other of two tile
// buffers before this one is multiplied: one barrier per depth block.
// The sums run over k in order, as matmul's: the two kernels give the same bits.
// Grid: (cols / 128, rows / 128, depth / chunk).
const WIDE: u32 = 128u;
const WIDE_BK: u32 = 8u;

// Two buffers of WIDE_BUFFER vec4s, each the tiles of a (from 0) and b (from WIDE_B) of one
// depth block, [WIDE_BK][WIDE_PITCH] vec4s each: element
// (k, i) of a tile at [k * WIDE_PITCH + i / 4][i % 4]. The vec4 of padding per depth puts
// depths k and k + 4 of 16 lines, which a subgroup's staging stores at once where the depth
// is contiguous, in different banks.
const WIDE_PITCH: u32 = 33u;
const WIDE_B: u32 = 264u; // WIDE_BK * WIDE_PITCH
const WIDE_BUFFER: u32 = 528u; // 2 * WIDE_B
var<workgroup> wide_tiles: array<vec4<f32>, 1056>; // 2 * WIDE_BUFFER

// Element `idx` of a staged tile of `depths` depths by WIDE lines (a's rows or b's columns)
// as (line, depth), in an order that runs along the depth where it is contiguous in memory
// (`along_k`), else along the lines. Staging takes the elements four at a time (4n .. 4n + 3:
// four consecutive elements of memory, since 4 divides `depths` and WIDE), so that each
// thread loads a vec4 and a subgroup's 32 loads read whole sectors. Shared by matmul_wide
// and matmul_tensor.
fn staged_at(idx: u32, depths: u32, along_k: bool) -> vec2<u32> {
    if (along_k) {
        return vec2<u32>(idx / depths, idx % depths);
    }
    return vec2<u32>(idx % WIDE, idx / WIDE);
}

// Element `at` of operand `op` (0: a, 1: b).
fn operand_elem(op: u32, at: u32) -> f32 {
    if (op == 0u) {
        return f32(mm_a4[at / 4u][at % 4u]);
    }
    return f32(mm_b4[at / 4u][at % 4u]);
}

// Elements t, t + s, t + 2s, t + 3s (t = (line, depth), s one depth if `along_k`, else one
// line) of a tile of operand `op` (0: a, its rows; 1: b, its columns) from line i0 and depth
// k0, as stored: zero outside the product (lines from `limit`) or the chunk (depths from
// k_end); lines `i_stride` apart, depths `k_stride` apart. Where the four are consecutive
// and whole in memory (the usual case), one vec4 load. Shared by matmul_wide and
// matmul_tensor.
fn tile_vec4(op: u32, t: vec2<u32>, along_k: bool, i0: u32, limit: u32, i_stride: u32, k_stride: u32, k0: u32, k_end: u32) -> vec4<f32> {
    let line = i0 + t.x;
    let depth = k0 + t.y;
    let at = line * i_stride + depth * k_stride;
    let step = select(i_stride, k_stride, along_k);
    let last = select(vec2<u32>(line + 3u, depth), vec2<u32>(line, depth + 3u), along_k);
    if (step == 1u && at % 4u == 0u && last.x < limit && last.y < k_end) {
        if (op == 0u) {
            return vec4<f32>(mm_a4[at / 4u]);
        }
        return vec4<f32>(mm_b4[at / 4u]);
    }
    var v = vec4<f32>(0.0);
    for (var u = 0u; u < 4u; u++) {
        let e = select(vec2<u32>(line + u, depth), vec2<u32>(line, depth + u), along_k);
        if (e.x < limit && e.y < k_end) {
            v[u] = operand_elem(op, at + u * step);
        }
    }
    return v;
}

// Whether depths k0 .. k0 + depths of a tile of lines i0 .. i0 + 128 (see tile_vec4) lie
// whole in the product and the chunk, in runs of four aligned elements (a vec4 of the
// binding each): staged then by `whole_vec4`, without tile_vec4's checks. Uniform over a
// workgroup.
fn whole_block(i0: u32, limit: u32, i_stride: u32, k_stride: u32, k0: u32, k_end: u32, depths: u32) -> bool {
    let along_k = k_stride == 1u;
    let across = select(k_stride, i_stride, along_k);
    return (along_k || i_stride == 1u) && across % 4u == 0u && (!along_k || k0 % 4u == 0u) && i0 + WIDE <= limit && k0 + depths <= k_end;
}

// tile_vec4's elements of a whole block (see whole_block): one vec4 load with no checks, so
// that a block's loads have no branches between them and issue back to back
// (docs/performance.md, "Kernel choices").
fn whole_vec4(op: u32, t: vec2<u32>, i0: u32, i_stride: u32, k_stride: u32, k0: u32) -> vec4<f32> {
    let at = (i0 + t.x) * i_stride + (k0 + t.y) * k_stride;
    if (op == 0u) {
        return vec4<f32>(mm_a4[at / 4u]);
    }
    return vec4<f32>(mm_b4[at / 4u]);
}

// One thread's staged elements of a's tile and of b's, between their load and their store.
struct WidePair { a: vec4<f32>, b: vec4<f32> }

// The elements thread `lid` stages of depth block k0 of a's tile and of b's, as stored in
// memory (wide_store rounds them): elements 4 lid .. 4 lid + 3 of each tile in `staged_at`'s
// order; where both blocks are whole (`whole_block`), by unchecked loads issued together.
fn wide_loads(p: Product, row0: u32, col0: u32, k0: u32, lid: u32) -> WidePair {
    let a_along_k = p.a_cs == 1u;
    let b_along_k = p.b_rs == 1u;
    let ta = staged_at(4u * lid, WIDE_BK, a_along_k);
    let tb = staged_at(4u * lid, WIDE_BK, b_along_k);
    if (whole_block(row0, p.rows, p.a_rs, p.a_cs, k0, p.k_end, WIDE_BK) && whole_block(col0, p.cols, p.b_cs, p.b_rs, k0, p.k_end, WIDE_BK)) {
        return WidePair(whole_vec4(0u, ta, row0, p.a_rs, p.a_cs, k0), whole_vec4(1u, tb, col0, p.b_cs, p.b_rs, k0));
    }
    return WidePair(tile_vec4(0u, ta, a_along_k, row0, p.rows, p.a_rs, p.a_cs, k0, p.k_end),
                    tile_vec4(1u, tb, b_along_k, col0, p.cols, p.b_cs, p.b_rs, k0, p.k_end));
}

// Staged values `v` of a's tile (op 0) or b's into the tile buffer from `base` of wide_tiles,
// rounded as the product uses them (`operand`), in wide_loads' order (`along_k` where the
// depth was contiguous): one vec4 along the lines, else four depths of one line.
fn wide_store(op: u32, base: u32, along_k: bool, v_in: vec4<f32>, lid: u32) {
    let half = select(HALF2, HALF1, op == 0u);
    let v = vec4<f32>(operand(v_in.x, half), operand(v_in.y, half), operand(v_in.z, half), operand(v_in.w, half));
    let t = staged_at(4u * lid, WIDE_BK, along_k);
    if (!along_k) {
        wide_tiles[base + t.y * WIDE_PITCH + t.x / 4u] = v;
        return;
    }
    let at = base + t.y * WIDE_PITCH + t.x / 4u;
    let lane = t.x % 4u;
    wide_tiles[at][lane] = v.x;
    wide_tiles[at + WIDE_PITCH][lane] = v.y;
    wide_tiles[at + 2u * WIDE_PITCH][lane] = v.z;
    wide_tiles[at + 3u * WIDE_PITCH][lane] = v.w;
}

// Thread t's 8 x 8 block of c: rN0 row N's columns 4 t.x ..+4, rN1 its columns
// 64 + 4 t.x ..+4 (rows 0..3: 4 t.y + N; rows 4..7: 64 + 4 t.y + N - 4).
struct WideBlock {
    r00: vec4<f32>, r01: vec4<f32>, r10: vec4<f32>, r11: vec4<f32>,
    r20: vec4<f32>, r21: vec4<f32>, r30: vec4<f32>, r31: vec4<f32>,
    r40: vec4<f32>, r41: vec4<f32>, r50: vec4<f32>, r51: vec4<f32>,
    r60: vec4<f32>, r61: vec4<f32>, r70: vec4<f32>, r71: vec4<f32>,
}

// Thread `lid`'s place t in the 16 x 16 grid of blocks. Each subgroup of 32 takes 8 x 4 of
// them (32 rows by 64 columns of c), so that at each depth its reads of a's tile touch 4 vec4s
// and of b's 8, one pass over the banks each, where a row of 16 blocks reads 2 and 16.
fn wide_block(lid: u32) -> vec2<u32> {
    return vec2<u32>((lid & 7u) | (((lid >> 5u) & 1u) << 3u), ((lid >> 3u) & 3u) | ((lid >> 6u) << 2u));
}

// Depth `k` of the tiles in buffer `buf` (0 or WIDE_BUFFER) into thread t's block: two vec4s
// of a's tile and two of b's for 64 FMAs. matmul_wide calls it once per depth with `k`
// written out: NVIDIA's Vulkan compiler does not unroll the loop over a block's depths
// (docs/performance.md, "Kernel choices").
fn wide_depth(c: ptr<function, WideBlock>, buf: u32, k: u32, t: vec2<u32>) {
    let a0 = wide_tiles[buf + k * WIDE_PITCH + t.y];
    let a1 = wide_tiles[buf + k * WIDE_PITCH + 16u + t.y];
    let b0 = wide_tiles[buf + WIDE_B + k * WIDE_PITCH + t.x];
    let b1 = wide_tiles[buf + WIDE_B + k * WIDE_PITCH + 16u + t.x];
    (*c).r00 = fma(vec4<f32>(a0.x), b0, (*c).r00); (*c).r01 = fma(vec4<f32>(a0.x), b1, (*c).r01);
    (*c).r10 = fma(vec4<f32>(a0.y), b0, (*c).r10); (*c).r11 = fma(vec4<f32>(a0.y), b1, (*c).r11);
    (*c).r20 = fma(vec4<f32>(a0.z), b0, (*c).r20); (*c).r21 = fma(vec4<f32>(a0.z), b1, (*c).r21);
    (*c).r30 = fma(vec4<f32>(a0.w), b0, (*c).r30); (*c).r31 = fma(vec4<f32>(a0.w), b1, (*c).r31);
    (*c).r40 = fma(vec4<f32>(a1.x), b0, (*c).r40); (*c).r41 = fma(vec4<f32>(a1.x), b1, (*c).r41);
    (*c).r50 = fma(vec4<f32>(a1.y), b0, (*c).r50); (*c).r51 = fma(vec4<f32>(a1.y), b1, (*c).r51);
    (*c).r60 = fma(vec4<f32>(a1.z), b0, (*c).r60); (*c).r61 = fma(vec4<f32>(a1.z), b1, (*c).r61);
    (*c).r70 = fma(vec4<f32>(a1.w), b0, (*c).r70); (*c).r71 = fma(vec4<f32>(a1.w), b1, (*c).r71);
}

@compute @workgroup_size(256)
fn matmul_wide(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let p = product(wid.z);
    let row0 = wid.y * WIDE;
    let col0 = wid.x * WIDE;
    let t = wide_block(lid);
    let zero = vec4<f32>(0.0);
    var c = WideBlock(zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero);
    let first = wide_loads(p, row0, col0, p.k_begin, lid);
    wide_store(0u, 0u, p.a_cs == 1u, first.a, lid);
    wide_store(1u, WIDE_B, p.b_rs == 1u, first.b, lid);
    workgroupBarrier();
    var buf = 0u;
    for (var k0 = p.k_begin; k0 < p.k_end; k0 += WIDE_BK) {
        let other = WIDE_BUFFER - buf;
        // The next depth block goes into the other buffer before this one is multiplied:
        // nothing is held in registers across the multiply-adds (docs/performance.md,
        // "Kernel choices").
        if (k0 + WIDE_BK < p.k_end) {
            let next = wide_loads(p, row0, col0, k0 + WIDE_BK, lid);
            wide_store(0u, other, p.a_cs == 1u, next.a, lid);
            wide_store(1u, other + WIDE_B, p.b_rs == 1u, next.b, lid);
        }
        // WIDE_BK (8) depths.
        wide_depth(&c, buf, 0u, t); wide_depth(&c, buf, 1u, t); wide_depth(&c, buf, 2u, t); wide_depth(&c, buf, 3u, t);
        wide_depth(&c, buf, 4u, t); wide_depth(&c, buf, 5u, t); wide_depth(&c, buf, 6u, t); wide_depth(&c, buf, 7u, t);
        buf = other;
        workgroupBarrier();
    }
    let top = row0 + 4u * t.y;
    let bottom = row0 + 64u + 4u * t.y;
    let left = col0 + 4u * t.x;
    let right = col0 + 64u + 4u * t.x;
    store_row(top, left, 1u, p.slice, c.r00); store_row(top, right, 1u, p.slice, c.r01);
    store_row(top + 1u, left, 1u, p.slice, c.r10); store_row(top + 1u, right, 1u, p.slice, c.r11);
    store_row(top + 2u, left, 1u, p.slice, c.r20); store_row(top + 2u, right, 1u, p.slice, c.r21);
    store_row(top + 3u, left, 1u, p.slice, c.r30); store_row(top + 3u, right, 1u, p.slice, c.r31);
    store_row(bottom, left, 1u, p.slice, c.r40); store_row(bottom, right, 1u, p.slice, c.r41);
    store_row(bottom + 1u, left, 1u, p.slice, c.r50); store_row(bottom + 1u, right, 1u, p.slice, c.r51);
    store_row(bottom + 2u, left, 1u, p.slice, c.r60); store_row(bottom + 2u, right, 1u, p.slice, c.r61);
    store_row(bottom + 3u, left, 1u, p.slice, c.r70); store_row(bottom + 3u, right, 1u, p.slice, c.r71);
}

// One thread's four results of row `r` (columns c0 + step * j) through the epilogue into c,
// at `slice` onwards.
fn store_row(r: u32, c0: u32, step: u32, slice: u32, acc: vec4<f32>) {
    store_one(r, c0, slice, acc.x);
    store_one(r, c0 + step, slice, acc.y);
    store_one(r, c0 + 2u * step, slice, acc.z);
    store_one(r, c0 + 3u * step, slice, acc.w);
}

// Element (r, c) of the product, `v`, through the epilogue into c at `slice` onwards (nothing
// outside the product).
fn store_one(r: u32, c: u32, slice: u32, v_in: f32) {
    let flags = word(3u);
    if (r >= word(0u) || c >= word(1u)) {
        return;
    }
    let idx = slice + r * word(9u) + c;
    var v = v_in;
    if ((flags & EPI_ACCUMULATE) != 0u) {
        v = f32(mm_c[idx]) + v;
    }
    if ((flags & EPI_BIAS) != 0u) {
        v += mm_bias[c];
    }
    if ((flags & EPI_GELU) != 0u) {
        let s = gelu_gate(v);
        mm_aux[idx] = select(v, gelu_slope(v, s), (flags & EPI_GELU_SLOPE) != 0u);
        v = v * s;
    }
    if ((flags & EPI_RESIDUAL) != 0u) {
        v += mm_aux[idx];
    }
    mm_c[idx] = to_elem3(v);
}

// Backward of the epilogue: with GELU, dout[rows, cols] *= slope (gelu'(pre), what the
// training forward left in its aux) in place; then the column sums of dout over each block of
// 64 rows into partials[block, cols] (the bias gradient, finished by add_partials), four
// rows' loads ahead of their sums (in row order).
// Words: rows, cols, gelu (0/1).
// Bindings: 1 dout, 2 slope, 3 partials. Grid: (cols / 64, row blocks).
@compute @workgroup_size(64)
fn bias_grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let rows = word(0u);
    let cols = word(1u);
    let gelu = word(2u);
    let j = wid.x * 64u + lid;
    if (j >= cols) {
        return;
    }
    let block = wid.y;
    let end = min(rows, (block + 1u) * 64u);
    var sum = 0.0;
    var r = block * 64u;
    for (; r + 4u <= end; r += 4u) {
        let idx = vec4<u32>(r, r + 1u, r + 2u, r + 3u) * cols + j;
        var g = vec4<f32>(f32(mm_a[idx.x]), f32(mm_a[idx.y]), f32(mm_a[idx.z]), f32(mm_a[idx.w]));
        if (gelu != 0u) {
            g *= vec4<f32>(f32(mm_b[idx.x]), f32(mm_b[idx.y]), f32(mm_b[idx.z]), f32(mm_b[idx.w]));
            for (var u = 0u; u < 4u; u++) {
                mm_a[idx[u]] = to_elem1(g[u]);
            }
        }
        sum = add_in_order(sum, g);
    }
    for (; r < end; r++) {
        let idx = r * cols + j;
        var g = f32(mm_a[idx]);
        if (gelu != 0u) {
            g = g * f32(mm_b[idx]);
            mm_a[idx] = to_elem1(g);
        }
        sum += g;
    }
    mm_c[block * cols + j] = to_elem3(sum);
}

/// A SwiGLU thread's element (words: rows, I; grid (I / 64, rows over y and z)): the half
/// width I, the gate's offset in pre [N, 2I] (the up's is I past it) and the output's in
/// [N, I]; `valid` is false past them.
struct SwiGluAt { half: u32, gate: u32, out: u32, valid: bool }

fn swiglu_at(wid: vec3<u32>, groups: vec3<u32>, lid: u32) -> SwiGluAt {
    let row = grid_row(wid, groups);
    let half = word(1u);
    let j = wid.x * 64u + lid;
    return SwiGluAt(half, row * 2u * half + j, row * half + j, row < word(0u) && j < half);
}

// SwiGLU after the gate and up product (the Llama family's MLP): out[r, j] = silu(g) · u with
// g = pre[r, j], u = pre[r, I + j], silu(g) = g·σ(g); with slopes, pre becomes
// [u·σ(g)·(1 + g·(1 − σ(g))), silu(g)], all backward needs.
// Words: rows, I, slopes (0/1). Bindings: 1 out [N, I], 2 pre [N, 2I].
// Grid: (I / 64, rows spread over y and z).
@compute @workgroup_size(64)
fn swiglu_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let e = swiglu_at(wid, groups, lid);
    if (!e.valid) {
        return;
    }
    let g = f32(mm_b[e.gate]);
    let up = f32(mm_b[e.gate + e.half]);
    let s = 1.0 / (1.0 + exp(-g));
    let silu = g * s;
    mm_a[e.out] = to_elem1(silu * up);
    if (word(2u) != 0u) {
        mm_b[e.gate] = to_elem2(up * s * (1.0 + g * (1.0 - s)));
        mm_b[e.gate + e.half] = to_elem2(silu);
    }
}

// SwiGLU's backward in place: both halves of the slopes d = [N, 2I] times dh [N, I], the
// output's gradient, giving the product's.
// Words: rows, I. Bindings: 1 d [N, 2I], 2 dh [N, I]. Grid: (I / 64, rows over y and z).
@compute @workgroup_size(64)
fn swiglu_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let e = swiglu_at(wid, groups, lid);
    if (!e.valid) {
        return;
    }
    let dh = f32(mm_b[e.out]);
    mm_a[e.gate] = to_elem1(f32(mm_a[e.gate]) * dh);
    mm_a[e.gate + e.half] = to_elem1(f32(mm_a[e.gate + e.half]) * dh);
}
