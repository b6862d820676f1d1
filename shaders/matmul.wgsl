// Matmul family: the tiled GEMM with its fused epilogues (forward, and with transposed
// operands both backward products), and the bias gradient with GELU backward folded in.
// CPU twin: core/src/ops/matmul.rs.

@group(0) @binding(1) var<storage, read_write> mm_a: array<f32>;
@group(0) @binding(2) var<storage, read_write> mm_b: array<f32>;
@group(0) @binding(3) var<storage, read_write> mm_c: array<f32>;
@group(0) @binding(4) var<storage, read_write> mm_bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> mm_aux: array<f32>;

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

var<workgroup> a_tile: array<f32, 1040>; // [BK][PITCH]
var<workgroup> b_tile: array<f32, 1040>; // [BK][PITCH]

// c[rows, cols] = epilogue(a·b): a[i, k] at i*a_rs + k*a_cs, b[k, j] at k*b_rs + j*b_cs,
// c[i, j] (and aux[i, j]) at i*c_rs + j.
// Words: rows, cols, depth, flags (EPI_*), a_rs, a_cs, b_rs, b_cs, chunk, c_rs. Workgroup z
// sums depth chunk z (k in z*chunk .. (z+1)*chunk) into slice z of c (rows*c_rs each); split
// products (more than one chunk) have no epilogue and are summed by add_partials.
// Epilogue order: (+ c if ACCUMULATE) (+ bias[j]) (GELU: aux = pre-activation, or with
// GELU_SLOPE gelu'(pre-activation), for backward) (+ aux[i, j] if RESIDUAL).
// Grid: (cols / 64, rows / 64, depth / chunk), workgroup 16x16, each thread a 4x4 block:
// rows l.y + 16i, columns l.x + 16j, accumulated in four vec4s (no indexed arrays: they stay
// in registers).
@compute @workgroup_size(16, 16)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let rows = word(0u);
    let cols = word(1u);
    let depth = word(2u);
    let a_rs = word(4u);
    let a_cs = word(5u);
    let b_rs = word(6u);
    let b_cs = word(7u);
    let k_begin = wid.z * word(8u);
    let k_end = min(depth, k_begin + word(8u));
    let row0 = wid.y * TILE;
    let col0 = wid.x * TILE;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var k0 = k_begin; k0 < k_end; k0 += BK) {
        for (var e = lid; e < BK * TILE; e += 256u) {
            // Walk memory contiguously: along k when a's rows are contiguous, else along rows.
            var k = e / TILE;
            var r = e % TILE;
            if (a_cs == 1u) {
                k = e % BK;
                r = e / BK;
            }
            var x = 0.0;
            if (row0 + r < rows && k0 + k < k_end) {
                x = mm_a[(row0 + r) * a_rs + (k0 + k) * a_cs];
            }
            a_tile[k * PITCH + r] = x;
            var kb = e / TILE;
            var c = e % TILE;
            if (b_cs != 1u) {
                kb = e % BK;
                c = e / BK;
            }
            var y = 0.0;
            if (col0 + c < cols && k0 + kb < k_end) {
                y = mm_b[(k0 + kb) * b_rs + (col0 + c) * b_cs];
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
    let slice = wid.z * rows * word(9u);
    store_row(row0 + l.y, c0, slice, acc0);
    store_row(row0 + l.y + 16u, c0, slice, acc1);
    store_row(row0 + l.y + 32u, c0, slice, acc2);
    store_row(row0 + l.y + 48u, c0, slice, acc3);
}

// One thread's four results of row `r` (columns c0 + 16j) through the epilogue into c, at
// `slice` onwards.
fn store_row(r: u32, c0: u32, slice: u32, acc: vec4<f32>) {
    let rows = word(0u);
    let cols = word(1u);
    let flags = word(3u);
    if (r >= rows) {
        return;
    }
    for (var j = 0u; j < 4u; j++) {
        let c = c0 + 16u * j;
        if (c < cols) {
            let idx = slice + r * word(9u) + c;
            var v = acc[j];
            if ((flags & EPI_ACCUMULATE) != 0u) {
                v = mm_c[idx] + v;
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
            mm_c[idx] = v;
        }
    }
}

// Backward of the epilogue: with GELU, dout[rows, cols] *= slope (gelu'(pre), what the
// training forward left in its aux) in place; then the column sums of dout over each block of
// 64 rows into partials[block, cols] (the bias gradient, finished by add_partials).
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
    for (var r = block * 64u; r < end; r++) {
        let idx = r * cols + j;
        var g = mm_a[idx];
        if (gelu != 0u) {
            g = g * mm_b[idx];
            mm_a[idx] = g;
        }
        sum += g;
    }
    mm_c[block * cols + j] = sum;
}
