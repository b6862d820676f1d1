// attention_tensor: attention.wgsl's forward, dQ and dK/dV kernels (same bindings, words, grid
// and results to f16 rounding) with their products on the tensor cores, through cooperative
// matrices. Compiled after attention.wgsl and tensor_common.wgsl with `enable f16; enable
// wgpu_cooperative_matrix;` in front, on a device opened with tensor cores, for head sizes 16,
// 32, 48 and 64 (HS16 16 x 16 blocks of head dimensions; alpha-gpu keeps the SIMT kernels for
// others).
//
// Each workgroup (64 threads: two groups of 32, lid / 32, a subgroup each on the GPUs this
// runs on; see matmul_tensor.wgsl) takes its grid row's 64 rows 32 at a time, each group 16
// of them, and meets the other side's rows TA_TILE at a time: every operand staged as f16 in
// workgroup memory ([row][head dimension]), every product 16 x 16 x 16 f16 blocks summed in
// f32. Scores and the dout · v products go through workgroup memory as f32; the softmax, the
// causal mask and dropout run there on the threads (two a row, 16 columns each), and the
// probabilities and score gradients come back as f16 operands. The forward makes two passes
// over the keys: the first finds each row's log-sum-exp, the second sums exact probabilities
// times values, so that no accumulator needs rescaling (cooperative matrices have no element
// access).

// qkv (binding 2) and binding 3 (dout; the forward's lse) read and written as vec4s: with HS a
// multiple of 16 every head row starts on a vec4, so a staged row's four consecutive head
// dimensions are one load. These kernels reach the two bindings only through these: an entry
// point may not use a binding under two declarations.
@group(0) @binding(2) var<storage, read_write> ta_qkv4: array<vec4<Elem2>>;
@group(0) @binding(3) var<storage, read_write> ta_3v: array<vec4<Elem3>>;

const HS16: u32 = HS / 16u;
const TA_TILE: u32 = 32u;
// A staged row: HS f16s and 8 more, so that the rows a cooperative load reads at once start
// in different banks.
const TA_PITCH: u32 = HS + 8u;
// The 32 rows the workgroup takes: q (forward, dQ) or k (dK/dV), and dout (dQ) or v (dK/dV).
var<workgroup> ta_rows_a: array<f16, 32u * TA_PITCH>;
var<workgroup> ta_rows_b: array<f16, 32u * TA_PITCH>;
// The tile of the other side: k (forward, dQ) or q (dK/dV), and v (forward, dQ) or dout.
var<workgroup> ta_tile_a: array<f16, TA_TILE * TA_PITCH>;
var<workgroup> ta_tile_b: array<f16, TA_TILE * TA_PITCH>;
// Each group's 16 x TA_TILE block ([group][row][tile row]): rows_a · tile_aᵀ (scores),
// rows_b · tile_bᵀ (dout · v), and as f16 the probabilities (times dropout's mask) and the
// score gradients.
var<workgroup> ta_s: array<f32, 32u * TA_TILE>;
var<workgroup> ta_dp: array<f32, 32u * TA_TILE>;
var<workgroup> ta_p: array<f16, 32u * TA_TILE>;
var<workgroup> ta_ds: array<f16, 32u * TA_TILE>;
// The forward's (running max, sum) of each thread's columns; the dK/dV kernel's (lse,
// delta) of the tile's rows.
var<workgroup> ta_stats: array<vec2<f32>, 64>;

// T, read from the uniform block itself so that naga knows the loops it bounds uniform.
fn ta_seq() -> u32 {
    return u.w[0].y;
}

// Step c of a thread's walk over its 16 columns of a group's block (thread rr of the 16 rows,
// columns c0 ..+16): the columns in an order rotated by the row, so that at each step the 32
// threads of a group touch 32 different banks of ta_s, ta_dp, ta_p and ta_ds (in column order
// the 16 threads of each half met in one bank: rows of 32 elements).
fn ta_col(c: u32, rr: u32) -> u32 {
    return (c + rr) % 16u;
}

// Stages 32 rows from r0 of head `h` of source `src` (see head_elem; zeros past T) as f16
// into `slot`: 0 ta_rows_a, 1 ta_rows_b, 2 ta_tile_a, 3 ta_tile_b, a vec4 load per four
// head dimensions. A source stored as f16 converts back exactly, without rounding. All
// threads call it.
fn ta_stage(slot: u32, src: u32, b: u32, h: u32, r0: u32, lid: u32) {
    let stored_half = select(HALF2, HALF3, src == 3u);
    for (var e = lid; e < 32u * HS4; e += 64u) {
        let r = r0 + e / HS4;
        var x = vec4<f32>(0.0);
        if (r < ta_seq()) {
            if (src == 3u) {
                x = vec4<f32>(ta_3v[row_at(b, r, h) / 4u + e % HS4]);
            } else {
                x = vec4<f32>(ta_qkv4[qkv_at(b, r, src, h) / 4u + e % HS4]);
            }
        }
        let at = (e / HS4) * TA_PITCH + 4u * (e % HS4);
        for (var t = 0u; t < 4u; t++) {
            let v = f16_operand(x[t], stored_half);
            if (slot == 0u) {
                ta_rows_a[at + t] = v;
            } else if (slot == 1u) {
                ta_rows_b[at + t] = v;
            } else if (slot == 2u) {
                ta_tile_a[at + t] = v;
            } else {
                ta_tile_b[at + t] = v;
            }
        }
    }
}

// Group g's scores: its 16 rows of ta_rows_a times the tile's rows of ta_tile_a, into ta_s.
fn ta_products_a(g: u32) {
    for (var cb = 0u; cb < TA_TILE; cb += 16u) {
        var acc = coop_mat16x16<f32, C>();
        for (var d = 0u; d < HS; d += 16u) {
            let x = coopLoadT<coop_mat16x16<f16, A>>(&ta_rows_a[16u * g * TA_PITCH + d], TA_PITCH);
            let y = coopLoad<coop_mat16x16<f16, B>>(&ta_tile_a[cb * TA_PITCH + d], TA_PITCH);
            acc = coopMultiplyAdd(x, y, acc);
        }
        coopStoreT(acc, &ta_s[g * 16u * TA_TILE + cb], TA_TILE);
    }
}

// Group g's dout · v: its 16 rows of ta_rows_b times the tile's rows of ta_tile_b, into ta_dp.
fn ta_products_b(g: u32) {
    for (var cb = 0u; cb < TA_TILE; cb += 16u) {
        var acc = coop_mat16x16<f32, C>();
        for (var d = 0u; d < HS; d += 16u) {
            let x = coopLoadT<coop_mat16x16<f16, A>>(&ta_rows_b[16u * g * TA_PITCH + d], TA_PITCH);
            let y = coopLoad<coop_mat16x16<f16, B>>(&ta_tile_b[cb * TA_PITCH + d], TA_PITCH);
            acc = coopMultiplyAdd(x, y, acc);
        }
        coopStoreT(acc, &ta_dp[g * 16u * TA_TILE + cb], TA_TILE);
    }
}

// acc + group g's probabilities (ta_p) times head dimensions d ..+16 of ta_tile_b's rows.
fn ta_p_times_tile_b(acc: coop_mat16x16<f32, C>, g: u32, d: u32) -> coop_mat16x16<f32, C> {
    var sum = acc;
    for (var kb = 0u; kb < TA_TILE; kb += 16u) {
        let x = coopLoadT<coop_mat16x16<f16, A>>(&ta_p[g * 16u * TA_TILE + kb], TA_TILE);
        let y = coopLoadT<coop_mat16x16<f16, B>>(&ta_tile_b[kb * TA_PITCH + d], TA_PITCH);
        sum = coopMultiplyAdd(x, y, sum);
    }
    return sum;
}

// acc + group g's score gradients (ta_ds) times head dimensions d ..+16 of ta_tile_a's rows.
fn ta_ds_times_tile_a(acc: coop_mat16x16<f32, C>, g: u32, d: u32) -> coop_mat16x16<f32, C> {
    var sum = acc;
    for (var kb = 0u; kb < TA_TILE; kb += 16u) {
        let x = coopLoadT<coop_mat16x16<f16, A>>(&ta_ds[g * 16u * TA_TILE + kb], TA_TILE);
        let y = coopLoadT<coop_mat16x16<f16, B>>(&ta_tile_a[kb * TA_PITCH + d], TA_PITCH);
        sum = coopMultiplyAdd(x, y, sum);
    }
    return sum;
}

// A group's 16 rows of a head vector (out, dQ, dK or dV) are HS16 16 x 16 f32 blocks of head
// dimensions, d0 .. d3 (blocks past HS16 stay unused), passed by pointer: Mesa's lavapipe
// crashes compiling cooperative matrices held in a struct.
alias Block = ptr<function, coop_mat16x16<f32, C>>;

// d + group g's probabilities (ta_p) times ta_tile_b's rows, block by block.
fn ta_add_p_times_tile_b(d0: Block, d1: Block, d2: Block, d3: Block, g: u32) {
    *d0 = ta_p_times_tile_b(*d0, g, 0u);
    if (HS16 > 1u) {
        *d1 = ta_p_times_tile_b(*d1, g, 16u);
    }
    if (HS16 > 2u) {
        *d2 = ta_p_times_tile_b(*d2, g, 32u);
    }
    if (HS16 > 3u) {
        *d3 = ta_p_times_tile_b(*d3, g, 48u);
    }
}

// d + group g's score gradients (ta_ds) times ta_tile_a's rows, block by block.
fn ta_add_ds_times_tile_a(d0: Block, d1: Block, d2: Block, d3: Block, g: u32) {
    *d0 = ta_ds_times_tile_a(*d0, g, 0u);
    if (HS16 > 1u) {
        *d1 = ta_ds_times_tile_a(*d1, g, 16u);
    }
    if (HS16 > 2u) {
        *d2 = ta_ds_times_tile_a(*d2, g, 32u);
    }
    if (HS16 > 3u) {
        *d3 = ta_ds_times_tile_a(*d3, g, 48u);
    }
}

// Group g's blocks, times `scale`, to rows r0 ..+16 (those before T) of at_1 (see ta_write);
// all threads call it.
fn ta_write_blocks(d0: Block, d1: Block, d2: Block, d3: Block, g: u32, lane: u32, b: u32, h: u32, r0: u32, part: u32, scale: f32) {
    ta_write(*d0, g, lane, b, h, r0, part, 0u, scale);
    if (HS16 > 1u) {
        ta_write(*d1, g, lane, b, h, r0, part, 16u, scale);
    }
    if (HS16 > 2u) {
        ta_write(*d2, g, lane, b, h, r0, part, 32u, scale);
    }
    if (HS16 > 3u) {
        ta_write(*d3, g, lane, b, h, r0, part, 48u, scale);
    }
}

// Group g's 16 x 16 block `acc` of head dimensions d ..+16, times `scale`, to rows r0 ..+16
// (those before T) of at_1: part 0, 1, 2 of dqkv, or 3 the output [B, T, C]. Through ta_s,
// whose group part it overwrites; all threads call it.
fn ta_write(acc: coop_mat16x16<f32, C>, g: u32, lane: u32, b: u32, h: u32, r0: u32, part: u32, d: u32, scale: f32) {
    coopStoreT(acc, &ta_s[g * 16u * TA_TILE], 16u);
    workgroupBarrier();
    for (var e = lane; e < 256u; e += 32u) {
        let r = r0 + e / 16u;
        if (r < ta_seq()) {
            let at = select(qkv_at(b, r, part, h), row_at(b, r, h), part == 3u);
            at_1[at + d + e % 16u] = to_elem1(ta_s[g * 16u * TA_TILE + e] * scale);
        }
    }
    workgroupBarrier();
}

// Bindings: 1 out [B, T, C], 2 qkv, 3 lse [B, NH, T], 6 dropout key.
@compute @workgroup_size(64)
fn attention_forward_tensor(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let seq = ta_seq();
    let scale = wordf(3u);
    let g = lid / 32u;
    let lane = lid % 32u;
    let row = head_row(wid, 0u);
    // This thread's row of its group's 16, and its 16 columns of each tile.
    let rr = lane / 2u;
    let c0 = 16u * (lane % 2u);
    for (var r0 = wid.x * 64u; r0 < min(seq, wid.x * 64u + 64u); r0 += 32u) {
        let i = r0 + 16u * g + rr;
        let keys = min(seq, r0 + 32u);
        ta_stage(0u, 0u, row.b, row.h, r0, lid);
        // First pass: each thread's running (max, sum) of exp over its columns.
        var m = MASKED;
        var l = 0.0;
        for (var j0 = 0u; j0 < keys; j0 += TA_TILE) {
            ta_stage(2u, 1u, row.b, row.h, j0, lid);
            workgroupBarrier();
            ta_products_a(g);
            workgroupBarrier();
            var m_new = m;
            for (var c = 0u; c < 16u; c++) {
                let cc = ta_col(c, rr);
                let j = j0 + c0 + cc;
                if (j <= i && j < seq) {
                    m_new = max(m_new, ta_s[(16u * g + rr) * TA_TILE + c0 + cc] * scale);
                }
            }
            var sum = 0.0;
            for (var c = 0u; c < 16u; c++) {
                let cc = ta_col(c, rr);
                let j = j0 + c0 + cc;
                if (j <= i && j < seq) {
                    sum += exp(ta_s[(16u * g + rr) * TA_TILE + c0 + cc] * scale - m_new);
                }
            }
            l = l * exp(m - m_new) + sum;
            m = m_new;
            workgroupBarrier();
        }
        // The row's two threads' sums, combined in one order by both.
        ta_stats[lid] = vec2<f32>(m, l);
        workgroupBarrier();
        let s0 = ta_stats[lid & ~1u];
        let s1 = ta_stats[lid | 1u];
        let m_row = max(s0.x, s1.x);
        let lse = m_row + log(s0.y * exp(s0.x - m_row) + s1.y * exp(s1.x - m_row));
        // Second pass: out = Σ_j exp(score - lse) (dropout's mask applied) v_j.
        var o0 = coop_mat16x16<f32, C>();
        var o1 = coop_mat16x16<f32, C>();
        var o2 = coop_mat16x16<f32, C>();
        var o3 = coop_mat16x16<f32, C>();
        for (var j0 = 0u; j0 < keys; j0 += TA_TILE) {
            ta_stage(2u, 1u, row.b, row.h, j0, lid);
            ta_stage(3u, 2u, row.b, row.h, j0, lid);
            workgroupBarrier();
            ta_products_a(g);
            workgroupBarrier();
            for (var c = 0u; c < 16u; c++) {
                let cc = ta_col(c, rr);
                let j = j0 + c0 + cc;
                let at = (16u * g + rr) * TA_TILE + c0 + cc;
                var p = 0.0;
                if (j <= i && j < seq) {
                    p = exp(ta_s[at] * scale - lse) * dropped(wid.y, i, j);
                }
                ta_p[at] = f16_operand(p, false);
            }
            workgroupBarrier();
            ta_add_p_times_tile_b(&o0, &o1, &o2, &o3, g);
            workgroupBarrier();
        }
        ta_write_blocks(&o0, &o1, &o2, &o3, g, lane, row.b, row.h, r0 + 16u * g, 3u, 1.0);
        if (lane % 2u == 0u && i < seq) {
            let at = wid.y * seq + i;
            ta_3v[at / 4u][at % 4u] = to_elem3(lse);
        }
    }
}

// dQ of each query row. Bindings: 1 dqkv, 2 qkv, 3 dout [B, T, C], 4 lse, 5 delta, 6 dropout
// key.
@compute @workgroup_size(64)
fn attention_backward_q_tensor(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let seq = ta_seq();
    let scale = wordf(3u);
    let g = lid / 32u;
    let lane = lid % 32u;
    let row = head_row(wid, 0u);
    let rr = lane / 2u;
    let c0 = 16u * (lane % 2u);
    for (var r0 = wid.x * 64u; r0 < min(seq, wid.x * 64u + 64u); r0 += 32u) {
        let i = r0 + 16u * g + rr;
        let safe = min(i, seq - 1u);
        let lse = at_4[wid.y * seq + safe];
        let delta = at_5[wid.y * seq + safe];
        let keys = min(seq, r0 + 32u);
        ta_stage(0u, 0u, row.b, row.h, r0, lid);
        ta_stage(1u, 3u, row.b, row.h, r0, lid);
        var q0 = coop_mat16x16<f32, C>();
        var q1 = coop_mat16x16<f32, C>();
        var q2 = coop_mat16x16<f32, C>();
        var q3 = coop_mat16x16<f32, C>();
        for (var j0 = 0u; j0 < keys; j0 += TA_TILE) {
            ta_stage(2u, 1u, row.b, row.h, j0, lid);
            ta_stage(3u, 2u, row.b, row.h, j0, lid);
            workgroupBarrier();
            ta_products_a(g);
            ta_products_b(g);
            workgroupBarrier();
            for (var c = 0u; c < 16u; c++) {
                let cc = ta_col(c, rr);
                let j = j0 + c0 + cc;
                let at = (16u * g + rr) * TA_TILE + c0 + cc;
                var ds = 0.0;
                if (j <= i && j < seq) {
                    let p = exp(ta_s[at] * scale - lse);
                    ds = p * (ta_dp[at] * dropped(wid.y, i, j) - delta);
                }
                ta_ds[at] = f16_operand(ds, false);
            }
            workgroupBarrier();
            ta_add_ds_times_tile_a(&q0, &q1, &q2, &q3, g);
            workgroupBarrier();
        }
        ta_write_blocks(&q0, &q1, &q2, &q3, g, lane, row.b, row.h, r0 + 16u * g, 0u, scale);
    }
}

// dK and dV of each key row: the transposed products (rows are keys, tile rows queries).
// Bindings: 1 dqkv, 2 qkv, 3 dout [B, T, C], 4 lse, 5 delta, 6 dropout key.
@compute @workgroup_size(64)
fn attention_backward_kv_tensor(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let seq = ta_seq();
    let scale = wordf(3u);
    let g = lid / 32u;
    let lane = lid % 32u;
    let row = head_row(wid, 0u);
    let rr = lane / 2u;
    let c0 = 16u * (lane % 2u);
    for (var r0 = wid.x * 64u; r0 < min(seq, wid.x * 64u + 64u); r0 += 32u) {
        let j = r0 + 16u * g + rr;
        ta_stage(0u, 1u, row.b, row.h, r0, lid);
        ta_stage(1u, 2u, row.b, row.h, r0, lid);
        var k0 = coop_mat16x16<f32, C>();
        var k1 = coop_mat16x16<f32, C>();
        var k2 = coop_mat16x16<f32, C>();
        var k3 = coop_mat16x16<f32, C>();
        var v0 = coop_mat16x16<f32, C>();
        var v1 = coop_mat16x16<f32, C>();
        var v2 = coop_mat16x16<f32, C>();
        var v3 = coop_mat16x16<f32, C>();
        // Queries from the first that sees these keys (a query sees keys up to itself).
        for (var i0 = r0; i0 < seq; i0 += TA_TILE) {
            ta_stage(2u, 0u, row.b, row.h, i0, lid);
            ta_stage(3u, 3u, row.b, row.h, i0, lid);
            if (lid < TA_TILE) {
                let i = min(i0 + lid, seq - 1u);
                ta_stats[lid] = vec2<f32>(at_4[wid.y * seq + i], at_5[wid.y * seq + i]);
            }
            workgroupBarrier();
            ta_products_a(g);
            ta_products_b(g);
            workgroupBarrier();
            for (var c = 0u; c < 16u; c++) {
                let cc = ta_col(c, rr);
                let i = i0 + c0 + cc;
                let at = (16u * g + rr) * TA_TILE + c0 + cc;
                var kept = 0.0;
                var ds = 0.0;
                if (i >= j && i < seq && j < seq) {
                    let stats = ta_stats[c0 + cc];
                    let p = exp(ta_s[at] * scale - stats.x);
                    let drop = dropped(wid.y, i, j);
                    kept = p * drop;
                    ds = p * (ta_dp[at] * drop - stats.y);
                }
                ta_p[at] = f16_operand(kept, false);
                ta_ds[at] = f16_operand(ds, false);
            }
            workgroupBarrier();
            ta_add_p_times_tile_b(&v0, &v1, &v2, &v3, g);
            ta_add_ds_times_tile_a(&k0, &k1, &k2, &k3, g);
            workgroupBarrier();
        }
        ta_write_blocks(&k0, &k1, &k2, &k3, g, lane, row.b, row.h, r0 + 16u * g, 1u, scale);
        ta_write_blocks(&v0, &v1, &v2, &v3, g, lane, row.b, row.h, r0 + 16u * g, 2u, 1.0);
    }
}
