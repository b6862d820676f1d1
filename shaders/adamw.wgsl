// AdamW (PyTorch's operation order, decoupled weight decay) with the gradient clip factor
// folded in; the update is skipped (and counted) when the step's loss or gradient norm is
// not finite.
// CPU twin: core/src/optim.rs.

@group(0) @binding(1) var<storage, read_write> ad_params: array<f32>;
@group(0) @binding(2) var<storage, read_write> ad_grads: array<f32>;
@group(0) @binding(3) var<storage, read_write> ad_m: array<f32>;
@group(0) @binding(4) var<storage, read_write> ad_v: array<f32>;
@group(0) @binding(5) var<storage, read_write> ad_stats: array<f32>;

// Words: 0 len, 1 decay_end (elements before it are weight-decayed), 2 step_size (lr / bc1),
// 3 decay (1 - lr wd), 4 1 - beta1, 5 beta2, 6 1 - beta2, 7 sqrt(bc2), 8 eps, 9 max_norm (0:
// no clipping), 10 stats slot of the loss sum, 11 stats slot of Σ grad², 12 stats slot of
// the count of skipped steps (element 0's thread adds one where word 13 is 1: the first of an
// arena's pieces). One thread per element of the piece bound; grid (x, y) of 64-thread
// workgroups, element = (y * groups.x + x) * 64 + lid.
@compute @workgroup_size(64)
fn adamw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * groups.x + wid.x) * 64u + lid;
    if (i >= word(0u)) {
        return;
    }
    let loss = ad_stats[word(10u)];
    let norm = sqrt(ad_stats[word(11u)]);
    if (non_finite(loss) || non_finite(norm)) {
        if (i == 0u && word(13u) == 1u) {
            ad_stats[word(12u)] += 1.0;
        }
        return;
    }
    var clip = 1.0;
    let max_norm = wordf(9u);
    if (max_norm > 0.0) {
        clip = min(1.0, max_norm / (norm + 1e-6));
    }
    let g = ad_grads[i] * clip;
    var p = ad_params[i];
    if (i < word(1u)) {
        p *= wordf(3u);
    }
    var m = ad_m[i];
    m += (g - m) * wordf(4u);
    let v = ad_v[i] * wordf(5u) + wordf(6u) * g * g;
    let denom = sqrt(v) / wordf(7u) + wordf(8u);
    ad_params[i] = p - wordf(2u) * m / denom;
    ad_m[i] = m;
    ad_v[i] = v;
}
