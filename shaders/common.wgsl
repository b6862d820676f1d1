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

/// True for infinities and NaNs (WGSL may assume floats are finite, so test the bits).
fn non_finite(x: f32) -> bool { return (bitcast<u32>(x) & 0x7f800000u) == 0x7f800000u; }

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

// Workgroup reductions for 64-thread workgroups, in a fixed tree order (deterministic).
var<workgroup> reduce_buf: array<f32, 64>;

/// The sum of `v` over the 64 threads of the workgroup (every thread gets it).
fn workgroup_sum(v: f32, lid: u32) -> f32 {
    reduce_buf[lid] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            reduce_buf[lid] += reduce_buf[lid + s];
        }
        workgroupBarrier();
    }
    let r = reduce_buf[0];
    workgroupBarrier();
    return r;
}

/// The maximum of `v` over the 64 threads of the workgroup (every thread gets it).
fn workgroup_max(v: f32, lid: u32) -> f32 {
    reduce_buf[lid] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lid < s) {
            reduce_buf[lid] = max(reduce_buf[lid], reduce_buf[lid + s]);
        }
        workgroupBarrier();
    }
    let r = reduce_buf[0];
    workgroupBarrier();
    return r;
}
