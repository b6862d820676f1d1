// Fused causal multi-head attention over fused QKV (FlashAttention style): forward with an
// online softmax over key tiles, saving each row's log-sum-exp; backward recomputes the
// probabilities from it (a row-delta pass, then dQ per query row and dK, dV per key row).
// CPU twin: core/src/ops/attention.rs.
//
// Layout: qkv [B, T, 3C] with q, k, v side by side, head h at columns h*HS..(h+1)*HS of
// each; out [B, T, C]; lse and delta [B, NH, T]. alpha-gpu prepends `const HS` (head size)
// and `const KT` (rows per shared tile) for the model being compiled.
// Words: 0 unused, 1 T, 2 NH, 3 scale (f32). Grid: (T / 64, B * NH); one thread per row.

@group(0) @binding(1) var<storage, read_write> at_1: array<f32>;
@group(0) @binding(2) var<storage, read_write> at_2: array<f32>;
@group(0) @binding(3) var<storage, read_write> at_3: array<f32>;
@group(0) @binding(4) var<storage, read_write> at_4: array<f32>;
@group(0) @binding(5) var<storage, read_write> at_5: array<f32>;

var<workgroup> tile_a: array<f32, KT * HS>;
var<workgroup> tile_b: array<f32, KT * HS>;
var<workgroup> tile_rows: array<vec2<f32>, KT>;

const MASKED: f32 = -3.0e38;

/// Offset of row `i` of batch `b`, part `part` (0 q, 1 k, 2 v), head `h` in qkv.
fn qkv_at(b: u32, i: u32, part: u32, h: u32) -> u32 {
    let c = word(2u) * HS;
    return (b * word(1u) + i) * 3u * c + part * c + h * HS;
}

/// Offset of row `i` of batch `b`, head `h` in a [B, T, C] tensor.
fn row_at(b: u32, i: u32, h: u32) -> u32 {
    return (b * word(1u) + i) * word(2u) * HS + h * HS;
}

/// Loads key and value rows j0 .. j0 + KT of this head into tile_a and tile_b
/// (zeros past T) from qkv (binding 2); all threads of the workgroup must call it.
fn load_kv_tiles(b: u32, h: u32, j0: u32, lid: u32) {
    for (var e = lid; e < KT * HS; e += 64u) {
        let j = j0 + e / HS;
        let d = e % HS;
        var x = 0.0;
        var y = 0.0;
        if (j < word(1u)) {
            x = at_2[qkv_at(b, j, 1u, h) + d];
            y = at_2[qkv_at(b, j, 2u, h) + d];
        }
        tile_a[e] = x;
        tile_b[e] = y;
    }
}

// Bindings: 1 out [B, T, C], 2 qkv, 3 lse [B, NH, T].
@compute @workgroup_size(64)
fn attention_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let seq = word(1u);
    let nh = word(2u);
    let scale = wordf(3u);
    let b = wid.y / nh;
    let h = wid.y % nh;
    let i = wid.x * 64u + lid;
    let in_range = i < seq;
    let ii = min(i, seq - 1u);
    var q: array<f32, HS>;
    var o: array<f32, HS>;
    for (var d = 0u; d < HS; d++) {
        q[d] = at_2[qkv_at(b, ii, 0u, h) + d];
    }
    var m = MASKED;
    var l = 0.0;
    let keys = min(seq, wid.x * 64u + 64u);
    for (var j0 = 0u; j0 < keys; j0 += KT) {
        load_kv_tiles(b, h, j0, lid);
        workgroupBarrier();
        if (in_range && j0 <= i) {
            var s: array<f32, KT>;
            var tile_max = m;
            for (var jj = 0u; jj < KT; jj++) {
                var x = MASKED;
                if (j0 + jj <= i) {
                    var dot = 0.0;
                    for (var d = 0u; d < HS; d++) {
                        dot = fma(q[d], tile_a[jj * HS + d], dot);
                    }
                    x = dot * scale;
                }
                s[jj] = x;
                tile_max = max(tile_max, x);
            }
            let corr = exp(m - tile_max);
            l *= corr;
            for (var d = 0u; d < HS; d++) {
                o[d] *= corr;
            }
            for (var jj = 0u; jj < KT; jj++) {
                if (j0 + jj <= i) {
                    let p = exp(s[jj] - tile_max);
                    l += p;
                    for (var d = 0u; d < HS; d++) {
                        o[d] = fma(p, tile_b[jj * HS + d], o[d]);
                    }
                }
            }
            m = tile_max;
        }
        workgroupBarrier();
    }
    if (in_range) {
        let inv = 1.0 / l;
        for (var d = 0u; d < HS; d++) {
            at_1[row_at(b, i, h) + d] = o[d] * inv;
        }
        at_3[wid.y * seq + i] = m + log(l);
    }
}

// delta[b, h, i] = Σ_d dout·out over the head's columns. Bindings: 1 delta, 2 dout, 3 out.
@compute @workgroup_size(64)
fn attention_delta(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let seq = word(1u);
    let nh = word(2u);
    let i = wid.x * 64u + lid;
    if (i >= seq) {
        return;
    }
    let at = row_at(wid.y / nh, i, wid.y % nh);
    var s = 0.0;
    for (var d = 0u; d < HS; d++) {
        s = fma(at_2[at + d], at_3[at + d], s);
    }
    at_1[wid.y * seq + i] = s;
}

// dQ of each query row (written to the q part of dqkv).
// Bindings: 1 dqkv, 2 qkv, 3 dout [B, T, C], 4 lse, 5 delta.
@compute @workgroup_size(64)
fn attention_backward_q(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let seq = word(1u);
    let nh = word(2u);
    let scale = wordf(3u);
    let b = wid.y / nh;
    let h = wid.y % nh;
    let i = wid.x * 64u + lid;
    let in_range = i < seq;
    let ii = min(i, seq - 1u);
    var q: array<f32, HS>;
    var g: array<f32, HS>;
    var dq: array<f32, HS>;
    for (var d = 0u; d < HS; d++) {
        q[d] = at_2[qkv_at(b, ii, 0u, h) + d];
        g[d] = at_3[row_at(b, ii, h) + d];
    }
    let lse = at_4[wid.y * seq + ii];
    let delta = at_5[wid.y * seq + ii];
    let keys = min(seq, wid.x * 64u + 64u);
    for (var j0 = 0u; j0 < keys; j0 += KT) {
        load_kv_tiles(b, h, j0, lid);
        workgroupBarrier();
        if (in_range && j0 <= i) {
            for (var jj = 0u; jj < KT; jj++) {
                if (j0 + jj <= i) {
                    var s = 0.0;
                    var dp = 0.0;
                    for (var d = 0u; d < HS; d++) {
                        s = fma(q[d], tile_a[jj * HS + d], s);
                        dp = fma(g[d], tile_b[jj * HS + d], dp);
                    }
                    let ds = exp(s * scale - lse) * (dp - delta);
                    for (var d = 0u; d < HS; d++) {
                        dq[d] = fma(ds, tile_a[jj * HS + d], dq[d]);
                    }
                }
            }
        }
        workgroupBarrier();
    }
    if (in_range) {
        for (var d = 0u; d < HS; d++) {
            at_1[qkv_at(b, i, 0u, h) + d] = dq[d] * scale;
        }
    }
}

// dK and dV of each key row (written to the k and v parts of dqkv).
// Bindings: 1 dqkv, 2 qkv, 3 dout [B, T, C], 4 lse, 5 delta.
@compute @workgroup_size(64)
fn attention_backward_kv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let seq = word(1u);
    let nh = word(2u);
    let scale = wordf(3u);
    let b = wid.y / nh;
    let h = wid.y % nh;
    let j = wid.x * 64u + lid;
    let in_range = j < seq;
    let jj = min(j, seq - 1u);
    var k: array<f32, HS>;
    var v: array<f32, HS>;
    var dk: array<f32, HS>;
    var dv: array<f32, HS>;
    for (var d = 0u; d < HS; d++) {
        k[d] = at_2[qkv_at(b, jj, 1u, h) + d];
        v[d] = at_2[qkv_at(b, jj, 2u, h) + d];
    }
    for (var i0 = wid.x * 64u; i0 < seq; i0 += KT) {
        // Query rows i0 .. i0 + KT: q in tile_a, dout in tile_b, (lse, delta) in tile_rows.
        for (var e = lid; e < KT * HS; e += 64u) {
            let i = i0 + e / HS;
            let d = e % HS;
            var x = 0.0;
            var y = 0.0;
            if (i < seq) {
                x = at_2[qkv_at(b, i, 0u, h) + d];
                y = at_3[row_at(b, i, h) + d];
            }
            tile_a[e] = x;
            tile_b[e] = y;
        }
        for (var r = lid; r < KT; r += 64u) {
            var stats = vec2<f32>(0.0, 0.0);
            if (i0 + r < seq) {
                stats = vec2<f32>(at_4[wid.y * seq + i0 + r], at_5[wid.y * seq + i0 + r]);
            }
            tile_rows[r] = stats;
        }
        workgroupBarrier();
        if (in_range) {
            for (var r = 0u; r < KT; r++) {
                let i = i0 + r;
                if (i < seq && i >= j) {
                    var s = 0.0;
                    var dp = 0.0;
                    for (var d = 0u; d < HS; d++) {
                        s = fma(tile_a[r * HS + d], k[d], s);
                        dp = fma(tile_b[r * HS + d], v[d], dp);
                    }
                    let p = exp(s * scale - tile_rows[r].x);
                    let ds = p * (dp - tile_rows[r].y);
                    for (var d = 0u; d < HS; d++) {
                        dv[d] = fma(p, tile_b[r * HS + d], dv[d]);
                        dk[d] = fma(ds, tile_a[r * HS + d], dk[d]);
                    }
                }
            }
        }
        workgroupBarrier();
    }
    if (in_range) {
        for (var d = 0u; d < HS; d++) {
            at_1[qkv_at(b, j, 1u, h) + d] = dk[d] * scale;
            at_1[qkv_at(b, j, 2u, h) + d] = dv[d];
        }
    }
}
