// AdamW (PyTorch's operation order, decoupled weight decay) with the gradient clip factor
// and the loss scale's inverse folded in; the update is skipped (and counted) when the step's
// loss or gradient norm is not finite. Then, under `--precision f16`, the loss scale's update
// and the f16 copy of the weights. CPU twin: core/src/optim.rs.

// The step's statistics; the parameters as `half_weights` reads them.
@group(0) @binding(5) var<storage, read_write> ad_stats: array<f32>;
@group(0) @binding(1) var<storage, read_write> ad_params: array<f32>;
// The parameters, gradients and moments as `adamw` reads them: four elements a thread (the
// bindings are whole vec4s, see `View::binding_len`).
@group(0) @binding(1) var<storage, read_write> ad_params4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> ad_grads4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> ad_m4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> ad_v4: array<vec4<f32>>;

// Words: 0 len, 1 decay_end (elements before it are weight-decayed), 2 step_size (lr / bc1),
// 3 decay (1 - lr wd), 4 1 - beta1, 5 beta2, 6 1 - beta2, 7 sqrt(bc2), 8 eps, 9 max_norm (0:
// no clipping), 10 stats slot of the loss sum, 11 stats slot of Σ grad², 12 stats slot of
// the count of skipped steps (element 0's thread adds one where word 13 is 1: the first of an
// arena's pieces), 14 stats slot of the loss scale S (the gradients are S times the loss's:
// the norm and the update divide it out). One thread per four elements of the piece bound,
// each element's arithmetic as the scalar loop's; grid (x, y) of 64-thread workgroups, vec4
// q = (y * groups.x + x) * 64 + lid, elements 4q .. 4q + 3 (those below len).
@compute @workgroup_size(64)
fn adamw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let q = (wid.y * groups.x + wid.x) * 64u + lid;
    let i = 4u * q;
    let len = word(0u);
    if (i >= len) {
        return;
    }
    let loss = ad_stats[word(10u)];
    let scale = ad_stats[word(14u)];
    let norm = sqrt(ad_stats[word(11u)]) / scale;
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
    let g = ad_grads4[q] * (clip / scale);
    let p0 = ad_params4[q];
    let p = select(p0, p0 * wordf(3u), vec4<u32>(i, i + 1u, i + 2u, i + 3u) < vec4<u32>(word(1u)));
    var m = ad_m4[q];
    m += (g - m) * wordf(4u);
    let v = ad_v4[q] * wordf(5u) + wordf(6u) * g * g;
    let denom = sqrt(v) / wordf(7u) + wordf(8u);
    let updated = p - wordf(2u) * m / denom;
    if (i + 3u < len) {
        ad_params4[q] = updated;
        ad_m4[q] = m;
        ad_v4[q] = v;
        return;
    }
    for (var u = 0u; i + u < len; u++) {
        ad_params4[q][u] = updated[u];
        ad_m4[q][u] = m[u];
        ad_v4[q][u] = v[u];
    }
}

@group(0) @binding(1) var<storage, read_write> ls_stats: array<f32>;

// Dynamic loss scaling (PyTorch's GradScaler), one thread after the step's AdamW: the scale S
// the step used goes to stats[used]; a step whose gradient norm was not finite (its update
// was skipped: an f16 operand overflowed) halves S and restarts the count of good steps,
// whose count reaching `growth_interval` doubles S; a non-finite loss is counted apart (it is
// a divergence, not an overflow). Words: 0 slot of S, 1 used, 2 Σ grad², 3 good steps,
// 4 growth_interval, 5 loss sum, 6 count of non-finite losses.
@compute @workgroup_size(1)
fn loss_scale_update() {
    let scale = ls_stats[word(0u)];
    ls_stats[word(1u)] = scale;
    if (non_finite(ls_stats[word(5u)])) {
        ls_stats[word(6u)] += 1.0;
    }
    if (non_finite(ls_stats[word(2u)])) {
        ls_stats[word(0u)] = scale * 0.5;
        ls_stats[word(3u)] = 0.0;
        return;
    }
    let good = ls_stats[word(3u)] + 1.0;
    if (good >= f32(word(4u))) {
        ls_stats[word(0u)] = scale * 2.0;
        ls_stats[word(3u)] = 0.0;
    } else {
        ls_stats[word(3u)] = good;
    }
}

@group(0) @binding(2) var<storage, read_write> hw_copy: array<Elem2>;

// Under f16 precision, the f16 copy of the weights that the products read: copy[i] =
// params[i] rounded to f16, after each AdamW and each upload. Words: 0 len. Bindings: 1
// params, 2 copy (f16). Grid as adamw's.
@compute @workgroup_size(64)
fn half_weights(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * groups.x + wid.x) * 64u + lid;
    if (i < word(0u)) {
        hw_copy[i] = to_elem2(ad_params[i]);
    }
}
