// Token + position embedding: forward, and the gradients of both tables, each element summed
// by one thread in row order (deterministic, the CPU's order).
// CPU twin: core/src/ops/embedding.rs.

@group(0) @binding(1) var<storage, read_write> em_out: array<f32>;
@group(0) @binding(2) var<storage, read_write> em_tokens: array<u32>;
@group(0) @binding(3) var<storage, read_write> em_wte: array<f32>;
@group(0) @binding(4) var<storage, read_write> em_wpe: array<f32>;
// The batch slot's words: decoding, the token's position (4).
@group(0) @binding(5) var<storage, read_write> em_words: array<u32>;

// out[i, :] = wte[tokens[i], :] + wpe[i % T + offset, :] for the rows whose token is in the
// piece of the table bound, tokens v0 .. v1 (wte's row 0 is token v0). Words: rows, C, T, 1
// where the position offset is words[4] (decoding one token) else 0, v0, v1, 1 where the
// model has a position table (the Llama family has none: out is the token's row).
// Grid: (C / 64, rows over y and z).
@compute @workgroup_size(64)
fn embedding_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let i = grid_row(wid, groups);
    let c = word(1u);
    let j = wid.x * 64u + lid;
    if (i >= word(0u) || j >= c) {
        return;
    }
    let token = em_tokens[i];
    if (token < word(4u) || token >= word(5u)) {
        return;
    }
    var offset = 0u;
    if (word(3u) == 1u) {
        offset = em_words[4];
    }
    var x = em_wte[(token - word(4u)) * c + j];
    if (word(6u) == 1u) {
        x += em_wpe[(i % word(2u) + offset) * c + j];
    }
    em_out[i * c + j] = x;
}

@group(0) @binding(1) var<storage, read_write> eb_dwte: array<f32>;
@group(0) @binding(2) var<storage, read_write> eb_order: array<u32>;
@group(0) @binding(3) var<storage, read_write> eb_starts: array<u32>;
@group(0) @binding(4) var<storage, read_write> eb_dout: array<f32>;

// dwte[v, j] += dout[i, j] over the rows i holding token v0 + v, in increasing i, for the
// piece of the table bound (its row 0 is token v0): order lists the rows grouped by token
// (rows of token t are order[starts[t]..starts[t + 1]]). A character model's commonest token
// holds thousands of rows: their loads go eight at a time ahead of the sums (still added
// one by one in order), so that the chain waits on memory once per eight rows, not twice
// per row.
// Words: rows of the piece, C, v0. Grid: (C / 64, rows over y and z).
@compute @workgroup_size(64)
fn embedding_backward_wte(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    let v = grid_row(wid, groups);
    let c = word(1u);
    let j = wid.x * 64u + lid;
    if (v >= word(0u) || j >= c) {
        return;
    }
    var acc = eb_dwte[v * c + j];
    let t = v + word(2u);
    let end = eb_starts[t + 1u];
    var k = eb_starts[t];
    for (; k + 8u <= end; k += 8u) {
        let r0 = vec4<u32>(eb_order[k], eb_order[k + 1u], eb_order[k + 2u], eb_order[k + 3u]) * c + j;
        let r1 = vec4<u32>(eb_order[k + 4u], eb_order[k + 5u], eb_order[k + 6u], eb_order[k + 7u]) * c + j;
        let x0 = vec4<f32>(eb_dout[r0.x], eb_dout[r0.y], eb_dout[r0.z], eb_dout[r0.w]);
        let x1 = vec4<f32>(eb_dout[r1.x], eb_dout[r1.y], eb_dout[r1.z], eb_dout[r1.w]);
        acc = add_in_order(add_in_order(acc, x0), x1);
    }
    for (; k < end; k++) {
        acc += eb_dout[eb_order[k] * c + j];
    }
    eb_dwte[v * c + j] = acc;
}

@group(0) @binding(1) var<storage, read_write> ep_dwpe: array<f32>;
@group(0) @binding(2) var<storage, read_write> ep_dout: array<f32>;

// dwpe[t, j] += dout[b*T + t, j] over b in order, four rows' loads ahead of their sums.
// Words: T, C, batch. Grid: (C / 64, T).
@compute @workgroup_size(64)
fn embedding_backward_wpe(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    let t = grid_row(wid, groups);
    let seq = word(0u);
    let c = word(1u);
    let j = wid.x * 64u + lid;
    if (t >= seq || j >= c) {
        return;
    }
    var acc = ep_dwpe[t * c + j];
    let batch = word(2u);
    let row = seq * c;
    var b = 0u;
    for (; b + 4u <= batch; b += 4u) {
        let at = (b * seq + t) * c + j;
        acc = add_in_order(acc, vec4<f32>(ep_dout[at], ep_dout[at + row], ep_dout[at + 2u * row], ep_dout[at + 3u * row]));
    }
    for (; b < batch; b++) {
        acc += ep_dout[(b * seq + t) * c + j];
    }
    ep_dwpe[t * c + j] = acc;
}
