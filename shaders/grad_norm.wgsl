// Global gradient norm: Σ x² over the whole gradient arena in fixed chunks, then the chunks
// in order (deterministic). CPU twin: core/src/ops/grad_norm.rs.

@group(0) @binding(1) var<storage, read_write> gn_x: array<f32>;
@group(0) @binding(2) var<storage, read_write> gn_partials: array<f32>;

// partials[g] = Σ x² over elements g*chunk .. (g+1)*chunk. Words: len, chunk. Grid: (chunks).
@compute @workgroup_size(64)
fn sum_squares_partials(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let len = word(0u);
    let chunk = word(1u);
    let start = wid.x * chunk;
    let end = min(len, start + chunk);
    var s = 0.0;
    for (var i = start + lid; i < end; i += 64u) {
        let x = gn_x[i];
        s = fma(x, x, s);
    }
    let total = workgroup_sum(s, lid);
    if (lid == 0u) {
        gn_partials[wid.x] = total;
    }
}

@group(0) @binding(1) var<storage, read_write> gf_partials: array<f32>;
@group(0) @binding(2) var<storage, read_write> gf_stats: array<f32>;

// stats[slot] = Σ partials[0..count], one workgroup. Words: count, slot.
@compute @workgroup_size(64)
fn sum_squares_finish(@builtin(local_invocation_index) lid: u32) {
    var s = 0.0;
    for (var i = lid; i < word(0u); i += 64u) {
        s += gf_partials[i];
    }
    let total = workgroup_sum(s, lid);
    if (lid == 0u) {
        gf_stats[word(1u)] = total;
    }
}
