// LayerNorm over rows of C with weight and bias, eps 1e-5: forward, the input gradient, and
// per-row-block weight/bias gradient partials (finished by add_partials).
// CPU twin: core/src/ops/layernorm.rs.

// The forward's output is f16 where the dispatch stores it so (see kernels.rs: `ElemN`).
@group(0) @binding(1) var<storage, read_write> ln_1: array<Elem1>;
@group(0) @binding(2) var<storage, read_write> ln_2: array<f32>;
@group(0) @binding(3) var<storage, read_write> ln_3: array<f32>;
@group(0) @binding(4) var<storage, read_write> ln_4: array<f32>;
@group(0) @binding(5) var<storage, read_write> ln_5: array<f32>;
@group(0) @binding(6) var<storage, read_write> ln_6: array<f32>;

// One workgroup per row. Words: rows, C.
// Bindings: 1 out [N, C], 2 mean [N], 3 rstd [N], 4 x [N, C], 5 weight [C], 6 bias [C].
@compute @workgroup_size(64)
fn layernorm_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let r = wide_row(wid, groups);
    if (!r.valid) {
        return;
    }
    var s = 0.0;
    for (var j = lid; j < r.c; j += 64u) {
        s += ln_4[r.base + j];
    }
    let mean = workgroup_sum(s, lid) / f32(r.c);
    var q = 0.0;
    for (var j = lid; j < r.c; j += 64u) {
        let d = ln_4[r.base + j] - mean;
        q += d * d;
    }
    let rstd = 1.0 / sqrt(workgroup_sum(q, lid) / f32(r.c) + 1e-5);
    for (var j = lid; j < r.c; j += 64u) {
        ln_1[r.base + j] = to_elem1((ln_4[r.base + j] - mean) * rstd * ln_5[j] + ln_6[j]);
    }
    if (lid == 0u) {
        ln_2[r.row] = mean;
        ln_3[r.row] = rstd;
    }
}

// dx += rstd (dout·w - mean(dout·w) - x̂ mean(dout·w·x̂)), one workgroup per row.
// Words: rows, C. Bindings: 1 dx, 2 dout, 3 x, 4 mean, 5 rstd, 6 weight.
@compute @workgroup_size(64)
fn layernorm_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let r = wide_row(wid, groups);
    if (!r.valid) {
        return;
    }
    let mean = ln_4[r.row];
    let rstd = ln_5[r.row];
    var a = 0.0;
    var b = 0.0;
    for (var j = lid; j < r.c; j += 64u) {
        let g = ln_2[r.base + j] * ln_6[j];
        a += g;
        b += g * (ln_3[r.base + j] - mean) * rstd;
    }
    let dnorm_mean = workgroup_sum(a, lid) / f32(r.c);
    let dnorm_xhat_mean = workgroup_sum(b, lid) / f32(r.c);
    for (var j = lid; j < r.c; j += 64u) {
        let xhat = (ln_3[r.base + j] - mean) * rstd;
        ln_1[r.base + j] = to_elem1(f32(ln_1[r.base + j]) + (ln_2[r.base + j] * ln_6[j] - dnorm_mean - xhat * dnorm_xhat_mean) * rstd);
    }
}

// Per block of 64 rows: partials[block, j] = Σ dout·x̂ and partials[block, C + j] = Σ dout,
// four rows' loads ahead of their sums (in row order).
// Words: rows, C. Bindings: 1 partials [blocks, 2C], 2 dout, 3 x, 4 mean, 5 rstd.
// Grid: (C / 64, row blocks).
@compute @workgroup_size(64)
fn layernorm_param_partials(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let rows = word(0u);
    let c = word(1u);
    let j = wid.x * 64u + lid;
    if (j >= c) {
        return;
    }
    let block = wid.y;
    var dw = 0.0;
    var db = 0.0;
    let end = min(rows, (block + 1u) * 64u);
    var r = block * 64u;
    for (; r + 4u <= end; r += 4u) {
        let at = vec4<u32>(r, r + 1u, r + 2u, r + 3u) * c + j;
        let g = vec4<f32>(ln_2[at.x], ln_2[at.y], ln_2[at.z], ln_2[at.w]);
        let x = vec4<f32>(ln_3[at.x], ln_3[at.y], ln_3[at.z], ln_3[at.w]);
        let mean = vec4<f32>(ln_4[r], ln_4[r + 1u], ln_4[r + 2u], ln_4[r + 3u]);
        let rstd = vec4<f32>(ln_5[r], ln_5[r + 1u], ln_5[r + 2u], ln_5[r + 3u]);
        dw = add_in_order(dw, g * (x - mean) * rstd);
        db = add_in_order(db, g);
    }
    for (; r < end; r++) {
        let g = ln_2[r * c + j];
        dw += g * (ln_3[r * c + j] - ln_4[r]) * ln_5[r];
        db += g;
    }
    ln_1[block * 2u * c + j] = to_elem1(dw);
    ln_1[block * 2u * c + c + j] = to_elem1(db);
}
