// Dropout before a residual add: out = residual + mask * scale * y, and (without a residual)
// its backward dy = mask * scale * dout. CPU twin: core/src/ops/dropout.rs.

@group(0) @binding(1) var<storage, read_write> dr_out: array<f32>;
@group(0) @binding(2) var<storage, read_write> dr_y: array<f32>;
@group(0) @binding(3) var<storage, read_write> dr_residual: array<f32>;
@group(0) @binding(4) var<storage, read_write> dr_key: array<u32>;

// Words: 0 elements, 1 site, 2 threshold, 3 scale (f32), 4 1 with a residual.
// Grid: (blocks of 4 elements / 64, over y and z); one thread per Philox block.
@compute @workgroup_size(64)
fn dropout(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let block = grid_row(wid, groups) * 64u + lid;
    let len = word(0u);
    if (block * 4u >= len) {
        return;
    }
    let key = vec4<u32>(dr_key[0], dr_key[1], dr_key[2], dr_key[3]);
    let words = dropout_words(key, word(1u), block);
    for (var t = 0u; t < 4u; t++) {
        let i = block * 4u + t;
        if (i < len) {
            var x = 0.0;
            if (words[t] >= word(2u)) {
                x = dr_y[i] * wordf(3u);
            }
            if (word(4u) == 1u) {
                x = dr_residual[i] + x;
            }
            dr_out[i] = x;
        }
    }
}
