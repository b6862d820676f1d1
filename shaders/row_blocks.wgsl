// Finishing column sums from per-row-block partials (CPU twin: core/src/ops/row_blocks.rs).

@group(0) @binding(1) var<storage, read_write> rb_partials: array<f32>;
@group(0) @binding(2) var<storage, read_write> rb_out: array<f32>;

// out[j] += sum over blocks b of partials[b * stride + offset + j], in block order.
// Words: blocks, width, stride, offset. Grid: (width / 64).
@compute @workgroup_size(64)
fn add_partials(@builtin(global_invocation_id) gid: vec3<u32>) {
    let blocks = word(0u);
    let width = word(1u);
    let stride = word(2u);
    let offset = word(3u);
    let j = gid.x;
    if (j >= width) {
        return;
    }
    var s = rb_out[j];
    for (var b = 0u; b < blocks; b++) {
        s += rb_partials[b * stride + offset + j];
    }
    rb_out[j] = s;
}
