// Shared by every kernel file (prepended by alpha-gpu when it compiles a file).
//
// Each dispatch has one uniform block of 16 words, `u.w`, whose meaning each entry point
// documents; tensors are bound one per binding (offset 0 in every array). Row-parallel
// kernels spread rows over the y and z dimensions of the grid (at most 65535 each).

struct Words { w: array<vec4<u32>, 4> }

@group(0) @binding(0) var<uniform> u: Words;

/// Word `i` of the uniform block.
fn word(i: u32) -> u32 { return u.w[i / 4u][i % 4u]; }

/// Word `i` as an f32.
fn wordf(i: u32) -> f32 { return bitcast<f32>(word(i)); }

/// The row a workgroup handles when rows are spread over grid dimensions y and z.
fn grid_row(wid: vec3<u32>, groups: vec3<u32>) -> u32 { return wid.y + wid.z * groups.y; }

/// The row a one-workgroup-per-row kernel handles (words: rows, C): its index, width and first
/// element; `valid` is false for workgroups past the last row.
struct WideRow { row: u32, c: u32, base: u32, valid: bool }

fn wide_row(wid: vec3<u32>, groups: vec3<u32>) -> WideRow {
    let row = grid_row(wid, groups);
    return WideRow(row, word(1u), row * word(1u), row < word(0u));
}

/// True for infinities and NaNs (WGSL may assume floats are finite, so test the bits).
fn non_finite(x: f32) -> bool { return (bitcast<u32>(x) & 0x7f800000u) == 0x7f800000u; }

/// x rounded to f16 (to nearest, as the hardware converts), as an f32: a product's operand
/// under `--precision f16`. Past f16's range (|x| >= 65520 rounds up to 2^16) it is ±inf,
/// which the loss scaling sees in the gradient norm; NaN stays NaN. Needs no shader-f16.
fn round_f16(x: f32) -> f32 {
    let bits = bitcast<u32>(x);
    let magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) {
        return x;
    }
    if (magnitude >= 0x477ff000u) {
        return bitcast<f32>((bits & 0x80000000u) | 0x7f800000u);
    }
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

/// sigmoid(2u) with u = sqrt(2/pi) (x + 0.044715 x^3): GELU(x) = x * gelu_gate(x).
fn gelu_gate(x: f32) -> f32 {
    let u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return 1.0 / (1.0 + exp(-2.0 * u));
}

/// d GELU(x) / dx for the tanh approximation, given s = gelu_gate(x).
fn gelu_slope(x: f32, s: f32) -> f32 {
    let du = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
    return s + 2.0 * x * s * (1.0 - s) * du;
}

// Workgroup reductions for 64-thread workgroups: each thread leaves its value in workgroup
// memory and, after one barrier, every thread combines all 64 in the same fixed order
// (deterministic, the same bits in every thread): two barriers where a tree takes seven.
var<workgroup> reduce_buf: array<vec4<f32>, 16>;

/// acc + x.x + x.y + x.z + x.w, added in that order. Sums in a fixed order (the CPU's) load
/// several terms ahead with it: the chain then waits on memory once per group, not once
/// per term, and keeps its bits.
fn add_in_order(acc: f32, x: vec4<f32>) -> f32 {
    return (((acc + x.x) + x.y) + x.z) + x.w;
}

/// The sum of `v` over the 64 threads of the workgroup (every thread gets it): four running
/// sums over threads 4i + lane, then paired.
fn workgroup_sum(v: f32, lid: u32) -> f32 {
    reduce_buf[lid / 4u][lid % 4u] = v;
    workgroupBarrier();
    var s = vec4<f32>(0.0);
    for (var i = 0u; i < 16u; i++) {
        s += reduce_buf[i];
    }
    workgroupBarrier();
    return (s.x + s.y) + (s.z + s.w);
}

/// The maximum of `v` over the 64 threads of the workgroup (every thread gets it).
fn workgroup_max(v: f32, lid: u32) -> f32 {
    reduce_buf[lid / 4u][lid % 4u] = v;
    workgroupBarrier();
    var m = reduce_buf[0];
    for (var i = 1u; i < 16u; i++) {
        m = max(m, reduce_buf[i]);
    }
    workgroupBarrier();
    return max(max(m.x, m.y), max(m.z, m.w));
}

// Dropout masks (CPU twin: core/src/ops/dropout.rs): element `idx` of a dropout site is kept
// when word idx % 4 of Philox4x32-10 at counter (idx / 4, site, draw) and key seed is at least
// the site's threshold. `key` holds (seed low, seed high, draw low, draw high).

/// (high, low) words of the 64-bit product a * b.
fn mul_hi_lo(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let mid = ((a0 * b0) >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return vec2<u32>(a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u), a * b);
}

/// Philox4x32-10 (Random123).
fn philox(counter: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    var c = counter;
    var k = key;
    for (var round = 0u; round < 10u; round++) {
        if (round > 0u) {
            k += vec2<u32>(0x9E3779B9u, 0xBB67AE85u);
        }
        let p0 = mul_hi_lo(0xD2511F53u, c.x);
        let p1 = mul_hi_lo(0xCD9E8D57u, c.z);
        c = vec4<u32>(p1.x ^ c.y ^ k.x, p1.y, p0.x ^ c.w ^ k.y, p0.y);
    }
    return c;
}

/// The random words of elements 4 * block .. 4 * block + 4 of dropout site `site`.
fn dropout_words(key: vec4<u32>, site: u32, block: u32) -> vec4<u32> {
    return philox(vec4<u32>(block, site, key.z, key.w), key.xy);
}

/// Whether element `idx` of dropout site `site` is kept (always with threshold 0).
fn dropout_keeps(key: vec4<u32>, site: u32, threshold: u32, idx: u32) -> bool {
    return threshold == 0u || dropout_words(key, site, idx / 4u)[idx % 4u] >= threshold;
}
