// RMSNorm over rows of C with a weight and no bias (the Llama family): forward, the input
// gradient, and per-row-block weight gradient partials (finished by add_partials).
// CPU twin: core/src/ops/rmsnorm.rs.

// The forward's output is f16 where the dispatch stores it so (see kernels.rs: `ElemN`).
@group(0) @binding(1) var<storage, read_write> rms_1: array<Elem1>;
@group(0) @binding(2) var<storage, read_write> rms_2: array<f32>;
@group(0) @binding(3) var<storage, read_write> rms_3: array<f32>;
@group(0) @binding(4) var<storage, read_write> rms_4: array<f32>;
@group(0) @binding(5) var<storage, read_write> rms_5: array<f32>;

// out = x · rsqrt(mean(x²) + eps) · weight, one workgroup per row. Words: rows, C, eps (f32).
// Bindings: 1 out [N, C], 2 rstd [N], 3 x [N, C], 4 weight [C].
@compute @workgroup_size(64)
fn rmsnorm_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let r = wide_row(wid, groups);
    if (!r.valid) {
        return;
    }
    var q = 0.0;
    for (var j = lid; j < r.c; j += 64u) {
        let x = rms_3[r.base + j];
        q += x * x;
    }
    let rstd = 1.0 / sqrt(workgroup_sum(q, lid) / f32(r.c) + wordf(2u));
    for (var j = lid; j < r.c; j += 64u) {
        rms_1[r.base + j] = to_elem1(rms_3[r.base + j] * rstd * rms_4[j]);
    }
    if (lid == 0u) {
        rms_2[r.row] = rstd;
    }
}

// dx += rstd (dout·w - x̂ mean(dout·w·x̂)), one workgroup per row.
// Words: rows, C. Bindings: 1 dx, 2 dout, 3 x, 4 rstd, 5 weight.
@compute @workgroup_size(64)
fn rmsnorm_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let r = wide_row(wid, groups);
    if (!r.valid) {
        return;
    }
    let rstd = rms_4[r.row];
    var b = 0.0;
    for (var j = lid; j < r.c; j += 64u) {
        b += rms_2[r.base + j] * rms_5[j] * rms_3[r.base + j] * rstd;
    }
    let dnorm_xhat_mean = workgroup_sum(b, lid) / f32(r.c);
    for (var j = lid; j < r.c; j += 64u) {
        let xhat = rms_3[r.base + j] * rstd;
        rms_1[r.base + j] = to_elem1(f32(rms_1[r.base + j]) + (rms_2[r.base + j] * rms_5[j] - xhat * dnorm_xhat_mean) * rstd);
    }
}

// Per block of 64 rows: partials[block, j] = Σ dout·x̂, in row order.
// Words: rows, C. Bindings: 1 partials [blocks, C], 2 dout, 3 x, 4 rstd.
// Grid: (C / 64, row blocks).
@compute @workgroup_size(64)
fn rmsnorm_weight_partials(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let rows = word(0u);
    let c = word(1u);
    let j = wid.x * 64u + lid;
    if (j >= c) {
        return;
    }
    let block = wid.y;
    var dw = 0.0;
    let end = min(rows, (block + 1u) * 64u);
    var r = block * 64u;
    for (; r + 4u <= end; r += 4u) {
        let at = vec4<u32>(r, r + 1u, r + 2u, r + 3u) * c + j;
        let g = vec4<f32>(rms_2[at.x], rms_2[at.y], rms_2[at.z], rms_2[at.w]);
        let x = vec4<f32>(rms_3[at.x], rms_3[at.y], rms_3[at.z], rms_3[at.w]);
        let rstd = vec4<f32>(rms_4[r], rms_4[r + 1u], rms_4[r + 2u], rms_4[r + 3u]);
        dw = add_in_order(dw, g * x * rstd);
    }
    for (; r < end; r++) {
        dw += rms_2[r * c + j] * rms_3[r * c + j] * rms_4[r];
    }
    rms_1[block * c + j] = to_elem1(dw);
}
