// The tensor cores' limit: every group of 32 invocations (lid / 32: a subgroup, as in
// matmul_tensor.wgsl, on the GPUs it runs on) runs eight independent chains of 16 x 16 x 16
// cooperative-matrix products (f16 operands, f32 sums: what `matmul_tensor` runs), `reps`
// rounds each, on operands loaded once from workgroup memory (no memory traffic in the loop).
// Each step feeds its sum back (c -> a·b + c), which no compiler can fold across rounds, and
// every chain's result is stored. Compiled on its own with `enable f16; enable
// wgpu_cooperative_matrix;` in front, on a device opened with tensor cores (subgroups of 32).
// Bindings: 0 uniform (x: reps), 1 sink (written only if a sum comes out -1: never, but the
// compiler cannot know). Grid: (workgroups, 1, 1).

@group(0) @binding(0) var<uniform> peak_reps: vec4<u32>;
@group(0) @binding(1) var<storage, read_write> peak_sink: array<f32>;

var<workgroup> operands: array<f16, 256>;
// Each group's 16 x 16 result on its way to the sum.
var<workgroup> results: array<f32, 2048>;

// The sum of this lane's eight elements of a group's 16 x 16 result `c`.
fn observe(c: coop_mat16x16<f32, C>, group: u32, lane: u32) -> f32 {
    coopStoreT(c, &results[group * 256u], 16u);
    workgroupBarrier();
    var s = 0.0;
    for (var e = 0u; e < 8u; e++) {
        s += results[group * 256u + lane * 8u + e];
    }
    workgroupBarrier();
    return s;
}

@compute @workgroup_size(256)
fn tensor_peak(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let group = lid / 32u;
    let lane = lid % 32u;
    // Small operands (at most 0.06): the sums grow by at most 16 * 0.0036 a round, finite for
    // any number of rounds the probe runs.
    operands[lid] = f16(f32(lid % 7u) * 0.01);
    workgroupBarrier();
    let a = coopLoadT<coop_mat16x16<f16, A>>(&operands[0], 16u);
    let b = coopLoadT<coop_mat16x16<f16, B>>(&operands[0], 16u);
    var c0 = coop_mat16x16<f32, C>(); var c1 = coop_mat16x16<f32, C>();
    var c2 = coop_mat16x16<f32, C>(); var c3 = coop_mat16x16<f32, C>();
    var c4 = coop_mat16x16<f32, C>(); var c5 = coop_mat16x16<f32, C>();
    var c6 = coop_mat16x16<f32, C>(); var c7 = coop_mat16x16<f32, C>();
    for (var i = 0u; i < peak_reps.x; i++) {
        c0 = coopMultiplyAdd(a, b, c0); c1 = coopMultiplyAdd(a, b, c1);
        c2 = coopMultiplyAdd(a, b, c2); c3 = coopMultiplyAdd(a, b, c3);
        c4 = coopMultiplyAdd(a, b, c4); c5 = coopMultiplyAdd(a, b, c5);
        c6 = coopMultiplyAdd(a, b, c6); c7 = coopMultiplyAdd(a, b, c7);
    }
    let total = observe(c0, group, lane) + observe(c1, group, lane) + observe(c2, group, lane) + observe(c3, group, lane)
        + observe(c4, group, lane) + observe(c5, group, lane) + observe(c6, group, lane) + observe(c7, group, lane);
    if (total == -1.0) {
        peak_sink[gid.x] = total;
    }
}
