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

/// The row a thread handles (grid (T / 64, B * NH)): batch `b`, head `h`, row `i`; past T
/// `valid` is false and `safe` (T - 1) stands in for `i` in loads.
struct HeadRow { b: u32, h: u32, i: u32, valid: bool, safe: u32 }

fn head_row(wid: vec3<u32>, lid: u32) -> HeadRow {
    let nh = word(2u);
    let i = wid.x * 64u + lid;
    return HeadRow(wid.y / nh, wid.y % nh, i, i < word(1u), min(i, word(1u) - 1u));
}

/// Element `d` of row `r` of head `h` in source `src`: 0 q, 1 k, 2 v (qkv, binding 2) or
/// 3 dout (binding 3, backward only).
fn head_elem(src: u32, b: u32, r: u32, h: u32, d: u32) -> f32 {
    if (src == 3u) {
        return at_3[row_at(b, r, h) + d];
    }
    return at_2[qkv_at(b, r, src, h) + d];
}

/// Row `r` of head `h` in source `src` (see head_elem), in registers.
fn head_vec(src: u32, b: u32, r: u32, h: u32) -> array<f32, HS> {
    var x: array<f32, HS>;
    for (var d = 0u; d < HS; d++) {
        x[d] = head_elem(src, b, r, h, d);
    }
    return x;
}

/// Loads rows r0 .. r0 + KT of head `h` from sources `src_a` and `src_b` into tile_a and
/// tile_b (zeros past T); all threads of the workgroup must call it.
fn load_tiles(src_a: u32, src_b: u32, b: u32, h: u32, r0: u32, lid: u32) {
    for (var e = lid; e < KT * HS; e += 64u) {
        let r = r0 + e / HS;
        let d = e % HS;
        var x = 0.0;
        var y = 0.0;
        if (r < word(1u)) {
            x = head_elem(src_a, b, r, h, d);
            y = head_elem(src_b, b, r, h, d);
        }
        tile_a[e] = x;
        tile_b[e] = y;
    }
}

/// (x · tile_a row `r`, y · tile_b row `r`): the score and dout·v terms both backward
/// kernels recompute (one function, so they agree bit for bit).
fn tile_dots(x: array<f32, HS>, y: array<f32, HS>, r: u32) -> vec2<f32> {
    var s = 0.0;
    var dp = 0.0;
    for (var d = 0u; d < HS; d++) {
        s = fma(x[d], tile_a[r * HS + d], s);
        dp = fma(y[d], tile_b[r * HS + d], dp);
    }
    return vec2<f32>(s, dp);
}

// Bindings: 1 out [B, T, C], 2 qkv, 3 lse [B, NH, T].
@compute @workgroup_size(64)
fn attention_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let seq = word(1u);
    let scale = wordf(3u);
    let row = head_row(wid, lid);
    let i = row.i;
    let q = head_vec(0u, row.b, row.safe, row.h);
    var o: array<f32, HS>;
    var m = MASKED;
    var l = 0.0;
    let keys = min(seq, wid.x * 64u + 64u);
    for (var j0 = 0u; j0 < keys; j0 += KT) {
        load_tiles(1u, 2u, row.b, row.h, j0, lid);
        workgroupBarrier();
        if (row.valid && j0 <= i) {
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
    if (row.valid) {
        let inv = 1.0 / l;
        for (var d = 0u; d < HS; d++) {
            at_1[row_at(row.b, i, row.h) + d] = o[d] * inv;
        }
        at_3[wid.y * seq + i] = m + log(l);
    }
}

// delta[b, h, i] = Σ_d dout·out over the head's columns. Bindings: 1 delta, 2 dout, 3 out.
@compute @workgroup_size(64)
fn attention_delta(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = head_row(wid, lid);
    if (!row.valid) {
        return;
    }
    let at = row_at(row.b, row.i, row.h);
    var s = 0.0;
    for (var d = 0u; d < HS; d++) {
        s = fma(at_2[at + d], at_3[at + d], s);
    }
    at_1[wid.y * word(1u) + row.i] = s;
}

// dQ of each query row (written to the q part of dqkv).
// Bindings: 1 dqkv, 2 qkv, 3 dout [B, T, C], 4 lse, 5 delta.
@compute @workgroup_size(64)
fn attention_backward_q(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let seq = word(1u);
    let scale = wordf(3u);
    let row = head_row(wid, lid);
    let i = row.i;
    let q = head_vec(0u, row.b, row.safe, row.h);
    let g = head_vec(3u, row.b, row.safe, row.h);
    var dq: array<f32, HS>;
    let lse = at_4[wid.y * seq + row.safe];
    let delta = at_5[wid.y * seq + row.safe];
    let keys = min(seq, wid.x * 64u + 64u);
    for (var j0 = 0u; j0 < keys; j0 += KT) {
        load_tiles(1u, 2u, row.b, row.h, j0, lid);
        workgroupBarrier();
        if (row.valid && j0 <= i) {
            for (var jj = 0u; jj < KT; jj++) {
                if (j0 + jj <= i) {
                    let t = tile_dots(q, g, jj);
                    let ds = exp(t.x * scale - lse) * (t.y - delta);
                    for (var d = 0u; d < HS; d++) {
                        dq[d] = fma(ds, tile_a[jj * HS + d], dq[d]);
                    }
                }
            }
        }
        workgroupBarrier();
    }
    if (row.valid) {
        for (var d = 0u; d < HS; d++) {
            at_1[qkv_at(row.b, i, 0u, row.h) + d] = dq[d] * scale;
        }
    }
}

// dK and dV of each key row (written to the k and v parts of dqkv).
// Bindings: 1 dqkv, 2 qkv, 3 dout [B, T, C], 4 lse, 5 delta.
@compute @workgroup_size(64)
fn attention_backward_kv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let seq = word(1u);
    let scale = wordf(3u);
    let row = head_row(wid, lid);
    let j = row.i;
    let k = head_vec(1u, row.b, row.safe, row.h);
    let v = head_vec(2u, row.b, row.safe, row.h);
    var dk: array<f32, HS>;
    var dv: array<f32, HS>;
    for (var i0 = wid.x * 64u; i0 < seq; i0 += KT) {
        // Query rows i0 .. i0 + KT: q in tile_a, dout in tile_b, (lse, delta) in tile_rows.
        load_tiles(0u, 3u, row.b, row.h, i0, lid);
        for (var r = lid; r < KT; r += 64u) {
            var stats = vec2<f32>(0.0, 0.0);
            if (i0 + r < seq) {
                stats = vec2<f32>(at_4[wid.y * seq + i0 + r], at_5[wid.y * seq + i0 + r]);
            }
            tile_rows[r] = stats;
        }
        workgroupBarrier();
        if (row.valid) {
            for (var r = 0u; r < KT; r++) {
                let i = i0 + r;
                if (i < seq && i >= j) {
                    let t = tile_dots(k, v, r);
                    let p = exp(t.x * scale - tile_rows[r].x);
                    let ds = p * (t.y - tile_rows[r].y);
                    for (var d = 0u; d < HS; d++) {
                        dv[d] = fma(p, tile_b[r * HS + d], dv[d]);
                        dk[d] = fma(ds, tile_a[r * HS + d], dk[d]);
                    }
                }
            }
        }
        workgroupBarrier();
    }
    if (row.valid) {
        for (var d = 0u; d < HS; d++) {
            at_1[qkv_at(row.b, j, 1u, row.h) + d] = dk[d] * scale;
            at_1[qkv_at(row.b, j, 2u, row.h) + d] = dv[d];
        }
    }
}
