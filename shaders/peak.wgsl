// The device's arithmetic limit: every thread runs eight independent chains of vec4 fused
// multiply-adds on registers (no memory traffic), `reps` rounds each. Each step squares its
// value (x -> x * x + c), which no compiler can fold across rounds, and every lane of every
// chain feeds the result. alpha-gpu prepends
// `alias real = f32;` or, where the device has shader-f16, `enable f16; alias real = f16;`.
// CPU twin: native/src/peak.rs (fma_limit).
// Bindings: 0 uniform (x: reps), 1 sink (written only if a sum comes out -1: never, but the
// compiler cannot know, so the chains are not optimised away). Grid: (workgroups, 1, 1).

@group(0) @binding(0) var<uniform> peak_reps: vec4<u32>;
@group(0) @binding(1) var<storage, read_write> peak_sink: array<f32>;

@compute @workgroup_size(256)
fn fma_peak(@builtin(global_invocation_id) gid: vec3<u32>) {
    // Each chain rises towards 0.5 (x -> x² + 0.25) from its own start below it: finite in
    // f16 too.
    let c = vec4<real>(real(0.25));
    let seed = real(f32(gid.x & 255u) * 0.001);
    var a0 = vec4<real>(seed);
    var a1 = a0 + real(0.01);
    var a2 = a0 + real(0.02);
    var a3 = a0 + real(0.03);
    var a4 = a0 + real(0.04);
    var a5 = a0 + real(0.05);
    var a6 = a0 + real(0.06);
    var a7 = a0 + real(0.07);
    for (var i = 0u; i < peak_reps.x; i++) {
        a0 = fma(a0, a0, c);
        a1 = fma(a1, a1, c);
        a2 = fma(a2, a2, c);
        a3 = fma(a3, a3, c);
        a4 = fma(a4, a4, c);
        a5 = fma(a5, a5, c);
        a6 = fma(a6, a6, c);
        a7 = fma(a7, a7, c);
    }
    // Every lane of every chain feeds the test: a compiler drops a lane no result reads, and
    // the probe would then report more than the device can do.
    let s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    let total = f32(s.x + s.y + s.z + s.w);
    if (total == -1.0) {
        peak_sink[gid.x] = total;
    }
}
