// Fused softmax cross-entropy: per-row loss and, in training, the logits' gradient written
// over the logits in the same pass; and the loss sum for the step's statistics.
// CPU twin: core/src/ops/cross_entropy.rs.

@group(0) @binding(1) var<storage, read_write> ce_logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> ce_losses: array<f32>;
@group(0) @binding(3) var<storage, read_write> ce_targets: array<u32>;
@group(0) @binding(4) var<storage, read_write> ce_stats: array<f32>;

// One workgroup per row. Words: rows, V, grad (0/1), grad_scale (f32), classes (the logits in
// use; the rest of the row is padding), loss_scale_slot. With grad, the row becomes
// grad_scale * S * (softmax(row[..classes]) - onehot(target)), zero on the padding, where S is
// the loss scale in stats[loss_scale_slot] (1 unless the products run in f16).
// Bindings: 1 logits [N, V], 2 losses [N], 3 targets [N], 4 the step's statistics.
@compute @workgroup_size(64)
fn cross_entropy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let row = grid_row(wid, groups);
    let v = word(1u);
    if (row >= word(0u)) {
        return;
    }
    let base = row * v;
    let classes = word(4u);
    var m = ce_logits[base];
    for (var j = lid; j < classes; j += 64u) {
        m = max(m, ce_logits[base + j]);
    }
    let row_max = workgroup_max(m, lid);
    var s = 0.0;
    for (var j = lid; j < classes; j += 64u) {
        s += exp(ce_logits[base + j] - row_max);
    }
    let lse = row_max + log(workgroup_sum(s, lid));
    let tgt = ce_targets[row];
    if (lid == 0u) {
        ce_losses[row] = lse - ce_logits[base + tgt];
    }
    if (word(2u) != 0u) {
        // Every thread has read what it needs (the sums above ended in barriers).
        workgroupBarrier();
        let scale = wordf(3u) * ce_stats[word(5u)];
        for (var j = lid; j < v; j += 64u) {
            var g = exp(ce_logits[base + j] - lse) * scale;
            if (j == tgt) {
                g -= scale;
            }
            if (j >= classes) {
                g = 0.0;
            }
            ce_logits[base + j] = g;
        }
    }
}

@group(0) @binding(1) var<storage, read_write> sl_losses: array<f32>;
@group(0) @binding(2) var<storage, read_write> sl_stats: array<f32>;

// stats[slot] += Σ losses, one workgroup, each thread's rows four loads ahead of their sums
// (16384 rows: 256 a thread). Words: n, slot.
@compute @workgroup_size(64)
fn sum_losses(@builtin(local_invocation_index) lid: u32) {
    let n = word(0u);
    var s = 0.0;
    var i = lid;
    for (; i + 192u < n; i += 256u) {
        s = add_in_order(s, vec4<f32>(sl_losses[i], sl_losses[i + 64u], sl_losses[i + 128u], sl_losses[i + 192u]));
    }
    for (; i < n; i += 64u) {
        s += sl_losses[i];
    }
    let total = workgroup_sum(s, lid);
    if (lid == 0u) {
        sl_stats[word(1u)] += total;
    }
}
