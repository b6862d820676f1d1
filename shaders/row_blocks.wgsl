// Finishing column sums from per-row-block partials (CPU twin: core/src/ops/row_blocks.rs).

@group(0) @binding(1) var<storage, read_write> rb_partials: array<f32>;
@group(0) @binding(2) var<storage, read_write> rb_out: array<f32>;
@group(0) @binding(3) var<storage, read_write> rb_second: array<f32>;

// Column j's sum over blocks b of partials[b * stride + j], in block order, added to out[j]
// for j below `split`, else to second[j - split] (LayerNorm's weight and bias gradients
// from one partials row each block: one dispatch for both). Eight blocks' loads go ahead of
// their sums: few columns run long chains here (a bias over 16384 rows: 256 blocks).
// Words: blocks, width, stride, split. Grid: (width / 64).
@compute @workgroup_size(64)
fn add_partials(@builtin(global_invocation_id) gid: vec3<u32>) {
    let blocks = word(0u);
    let width = word(1u);
    let stride = word(2u);
    let split = word(3u);
    let j = gid.x;
    if (j >= width) {
        return;
    }
    var s: f32;
    if (j < split) {
        s = rb_out[j];
    } else {
        s = rb_second[j - split];
    }
    var b = 0u;
    for (; b + 8u <= blocks; b += 8u) {
        let at = b * stride + j;
        let x0 = vec4<f32>(rb_partials[at], rb_partials[at + stride], rb_partials[at + 2u * stride], rb_partials[at + 3u * stride]);
        let x1 = vec4<f32>(rb_partials[at + 4u * stride], rb_partials[at + 5u * stride], rb_partials[at + 6u * stride], rb_partials[at + 7u * stride]);
        s = add_in_order(add_in_order(s, x0), x1);
    }
    for (; b < blocks; b++) {
        s += rb_partials[b * stride + j];
    }
    if (j < split) {
        rb_out[j] = s;
    } else {
        rb_second[j - split] = s;
    }
}
