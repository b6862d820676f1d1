// Fused causal multi-head attention over fused QKV (FlashAttention style): forward with an
// online softmax over key tiles, saving each row's log-sum-exp; backward recomputes the
// probabilities from it (a row-delta pass, then dQ per query row and dK, dV per key row).
// CPU twin: core/src/ops/attention.rs.
//
// Layout: qkv [B, T, 3C] with q, k, v side by side, head h at columns h*HS..(h+1)*HS of
// each; out [B, T, C]; lse and delta [B, NH, T]. alpha-gpu prepends `const HS` (head size),
// `const FORWARD_KT` and `const KT` (rows per shared tile in the forward and in the backward
// kernels) and `const PARTS` (the backward kernels' threads per row) for the model being
// compiled.
// Words: 0 unused, 1 T, 2 NH, 3 scale (f32), and for dropout on the probabilities 4 site,
// 5 threshold (0: none), 6 the kept ones' scale (f32). Grid: (T / 64, B * NH): 64 rows per
// workgroup. The forward gives each row one thread. The two backward kernels give each row
// PARTS threads, each holding a slice of the row's head vectors (a whole row per thread, four
// of them in the kV kernel, overflowed the registers at head size 64); the slices' partial
// dot products meet in workgroup memory once per tile.

// The output (written by the forward at 1, read by the delta pass at 3) and qkv (at 2) are
// f16 where the dispatch stores them so (see kernels.rs: `ElemN`).
@group(0) @binding(1) var<storage, read_write> at_1: array<Elem1>;
@group(0) @binding(2) var<storage, read_write> at_2: array<Elem2>;
@group(0) @binding(3) var<storage, read_write> at_3: array<Elem3>;
@group(0) @binding(4) var<storage, read_write> at_4: array<f32>;
@group(0) @binding(5) var<storage, read_write> at_5: array<f32>;
// The micro-batch's words: the dropout key (0..4, see common.wgsl), bound where the model has
// dropout; decoding, the token's position (4).
@group(0) @binding(6) var<storage, read_write> at_words: array<u32>;

// Head rows as HS4 = ceil(HS / 4) vec4s (zeros past HS), whole in the forward, in the
// backward kernels each thread's slice HSP4 of them: private arrays, each step a vector
// operation. They are `var`s and functions take them by pointer: indexing an array value (a
// `let`, a by-value argument) copies it whole first, on each access.
const HS4: u32 = (HS + 3u) / 4u;
const HSP4: u32 = (HS4 + PARTS - 1u) / PARTS;
const ROWS: u32 = 64u;
const THREADS: u32 = ROWS * PARTS;

// The backward kernels' tiles: KT rows of two sources.
var<workgroup> tile_a: array<vec4<f32>, KT * HS4>;
var<workgroup> tile_b: array<vec4<f32>, KT * HS4>;
var<workgroup> tile_rows: array<vec2<f32>, KT>;
// Each slice's (x · tile_a row, y · tile_b row) for every row of the workgroup and of the
// tile: [tile row][part][row] (see partial_at).
var<workgroup> partials: array<vec2<f32>, ROWS * KT * PARTS>;

// The forward's tiles: FORWARD_KT rows of the keys and of the values.
var<workgroup> forward_k: array<vec4<f32>, FORWARD_KT * HS4>;
var<workgroup> forward_v: array<vec4<f32>, FORWARD_KT * HS4>;

const MASKED: f32 = -3.0e38;

/// What dropout multiplies probability (i, j) of (batch, head) `bh` by: 0, or the kept
/// ones' scale (1 without dropout). Element ((b * NH + h) * T + i) * T + j of the site.
fn dropped(bh: u32, i: u32, j: u32) -> f32 {
    if (word(5u) == 0u) {
        return 1.0;
    }
    let key = vec4<u32>(at_words[0], at_words[1], at_words[2], at_words[3]);
    let seq = word(1u);
    return select(0.0, wordf(6u), dropout_keeps(key, word(4u), word(5u), (bh * seq + i) * seq + j));
}

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
        return f32(at_3[row_at(b, r, h) + d]);
    }
    return f32(at_2[qkv_at(b, r, src, h) + d]);
}

/// Elements 4 * d4 .. 4 * d4 + 4 of row `r` of head `h` in `src` (see head_elem), zeros past HS.
fn head_elem4(src: u32, b: u32, r: u32, h: u32, d4: u32) -> vec4<f32> {
    var x = vec4<f32>(0.0);
    for (var t = 0u; t < 4u; t++) {
        if (4u * d4 + t < HS) {
            x[t] = head_elem(src, b, r, h, 4u * d4 + t);
        }
    }
    return x;
}

/// Slice `part` of row `r` of head `h` in source `src` (see head_elem), in registers: vec4s
/// part * HSP4 .. (part + 1) * HSP4 of the row (zeros past it).
fn head_slice(src: u32, b: u32, r: u32, h: u32, part: u32) -> array<vec4<f32>, HSP4> {
    var x: array<vec4<f32>, HSP4>;
    for (var e = 0u; e < HSP4; e++) {
        let d4 = part * HSP4 + e;
        if (d4 < HS4) {
            x[e] = head_elem4(src, b, r, h, d4);
        }
    }
    return x;
}

/// acc + x · y over the four lanes in order: the backward kernels' dot products, one chain of
/// multiply-adds. Lane-wise sums, as the forward's, need registers: at 167 (dK/dV) and 128
/// (dQ) on an H200, either kernel would lose a workgroup per multiprocessor for them.
fn dot4(x: vec4<f32>, y: vec4<f32>, acc: f32) -> f32 {
    return fma(x.w, y.w, fma(x.z, y.z, fma(x.y, y.y, fma(x.x, y.x, acc))));
}

/// The sum of a vec4 of partial dot products (lane t: the head dimensions 4 n + t), in one
/// order everywhere. The forward's dot products accumulate lane-wise, `fma(x, y, acc)` over
/// the row's vec4s: four independent chains of HS / 4 multiply-adds each, where one chain of
/// HS waited on each multiply-add's result before the next.
fn lanes_sum(acc: vec4<f32>) -> f32 {
    return (acc.x + acc.y) + (acc.z + acc.w);
}

/// Writes slice `part` of a row (see head_slice), times `scale`, to `at_1[at ..]` (the
/// row's first element), up to HS.
fn store_slice(x: ptr<function, array<vec4<f32>, HSP4>>, part: u32, at: u32, scale: f32) {
    for (var e = 0u; e < HSP4; e++) {
        for (var t = 0u; t < 4u; t++) {
            let d = 4u * (part * HSP4 + e) + t;
            if (d < HS) {
                at_1[at + d] = to_elem1((*x)[e][t] * scale);
            }
        }
    }
}

/// Vec4 `e % HS4` of row r0 + e / HS4 of head `h` in `src` (see head_elem): element `e` of a
/// tile of rows from r0; zeros past T.
fn tile_elem4(src: u32, b: u32, h: u32, r0: u32, e: u32) -> vec4<f32> {
    let r = r0 + e / HS4;
    if (r >= word(1u)) {
        return vec4<f32>(0.0);
    }
    return head_elem4(src, b, r, h, e % HS4);
}

/// Loads rows r0 .. r0 + KT of head `h` from sources `src_a` and `src_b` into tile_a and
/// tile_b (zeros past T); all threads of the workgroup must call it.
fn load_tiles(src_a: u32, src_b: u32, b: u32, h: u32, r0: u32, lid: u32) {
    for (var e = lid; e < KT * HS4; e += THREADS) {
        tile_a[e] = tile_elem4(src_a, b, h, r0, e);
        tile_b[e] = tile_elem4(src_b, b, h, r0, e);
    }
}

/// Vec4 `e` of slice `part` of row `r` of tile `tile` (0 tile_a, 1 tile_b); zeros past HS4.
fn tile_slice(tile: u32, r: u32, part: u32, e: u32) -> vec4<f32> {
    let d4 = part * HSP4 + e;
    if (d4 >= HS4) {
        return vec4<f32>(0.0);
    }
    if (tile == 0u) {
        return tile_a[r * HS4 + d4];
    }
    return tile_b[r * HS4 + d4];
}

/// Stores this thread's (x · tile_a row r, y · tile_b row r) over its slices for every row r
/// of the tile; then, after a barrier, `combine` gives the whole rows' dot products. All
/// threads of the workgroup must call it.
fn share_partials(x: ptr<function, array<vec4<f32>, HSP4>>, y: ptr<function, array<vec4<f32>, HSP4>>, row: u32, part: u32) {
    for (var r = 0u; r < KT; r++) {
        var s = 0.0;
        var dp = 0.0;
        for (var e = 0u; e < HSP4; e++) {
            s = dot4((*x)[e], tile_slice(0u, r, part, e), s);
            dp = dot4((*y)[e], tile_slice(1u, r, part, e), dp);
        }
        partials[partial_at(row, r, part)] = vec2<f32>(s, dp);
    }
}

/// Where slice `part` of workgroup row `row` keeps its partials with tile row `r`. The rows
/// run innermost, so that a subgroup's threads (consecutive rows, the parts of each side by
/// side) store into and read from consecutive vec2s: with the rows outermost, rows
/// 8 * KT * PARTS bytes apart met in the same banks (8-way conflicts at head size 64).
fn partial_at(row: u32, r: u32, part: u32) -> u32 {
    return (r * PARTS + part) * ROWS + row;
}

/// Workgroup row `row`'s two dot products with tile row `r`: its slices' partials summed in
/// slice order (the same in every thread of the row, so they agree bit for bit).
fn combine(row: u32, r: u32) -> vec2<f32> {
    var t = vec2<f32>(0.0);
    for (var part = 0u; part < PARTS; part++) {
        t += partials[partial_at(row, r, part)];
    }
    return t;
}

// q · k of the four keys jj .. jj + 3 of the forward's tile: sixteen independent chains of
// multiply-adds (see lanes_sum), each vec4 of q read once for four keys.
fn key_scores(q: ptr<function, array<vec4<f32>, HS4>>, jj: u32) -> vec4<f32> {
    var d0 = vec4<f32>(0.0);
    var d1 = vec4<f32>(0.0);
    var d2 = vec4<f32>(0.0);
    var d3 = vec4<f32>(0.0);
    for (var d4 = 0u; d4 < HS4; d4++) {
        let x = (*q)[d4];
        d0 = fma(x, forward_k[jj * HS4 + d4], d0);
        d1 = fma(x, forward_k[(jj + 1u) * HS4 + d4], d1);
        d2 = fma(x, forward_k[(jj + 2u) * HS4 + d4], d2);
        d3 = fma(x, forward_k[(jj + 3u) * HS4 + d4], d3);
    }
    return vec4<f32>(lanes_sum(d0), lanes_sum(d1), lanes_sum(d2), lanes_sum(d3));
}

// One thread per query row (64 per workgroup), holding the row's whole q and output in
// registers (it needs two head vectors, where the backward kernels need three and four, so
// it is not split into slices); keys and values pass through workgroup memory FORWARD_KT rows
// at a time, every thread forming its own scores with all of them: two barriers per tile and
// no partial sums to share.
// Bindings: 1 out [B, T, C], 2 qkv, 3 lse [B, NH, T], 6 dropout key.
@compute @workgroup_size(64)
fn attention_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let seq = word(1u);
    let scale = wordf(3u);
    let row = head_row(wid, lid);
    let i = row.i;
    var q: array<vec4<f32>, HS4>;
    for (var d4 = 0u; d4 < HS4; d4++) {
        q[d4] = head_elem4(0u, row.b, row.safe, row.h, d4);
    }
    var o: array<vec4<f32>, HS4>;
    var m = MASKED;
    var l = 0.0;
    let keys = min(seq, wid.x * 64u + 64u);
    for (var j0 = 0u; j0 < keys; j0 += FORWARD_KT) {
        for (var e = lid; e < FORWARD_KT * HS4; e += 64u) {
            forward_k[e] = tile_elem4(1u, row.b, row.h, j0, e);
            forward_v[e] = tile_elem4(2u, row.b, row.h, j0, e);
        }
        workgroupBarrier();
        if (row.valid && j0 <= i) {
            // Four keys at a time, each four a step of the online softmax (keys past i score
            // MASKED and weigh exp(MASKED - m_new) = 0).
            for (var jj = 0u; jj < FORWARD_KT; jj += 4u) {
                let js = j0 + jj + vec4<u32>(0u, 1u, 2u, 3u);
                let x = select(vec4<f32>(MASKED), key_scores(&q, jj) * scale, js <= vec4<u32>(i));
                let m_new = max(m, max(max(x.x, x.y), max(x.z, x.w)));
                let corr = exp(m - m_new);
                let p = exp(x - m_new);
                l = l * corr + lanes_sum(p);
                let kept = p * vec4<f32>(dropped(wid.y, i, js.x), dropped(wid.y, i, js.y), dropped(wid.y, i, js.z), dropped(wid.y, i, js.w));
                let v = jj * HS4;
                for (var d4 = 0u; d4 < HS4; d4++) {
                    let o0 = fma(vec4<f32>(kept.x), forward_v[v + d4], o[d4] * corr);
                    let o1 = fma(vec4<f32>(kept.y), forward_v[v + HS4 + d4], o0);
                    let o2 = fma(vec4<f32>(kept.z), forward_v[v + 2u * HS4 + d4], o1);
                    o[d4] = fma(vec4<f32>(kept.w), forward_v[v + 3u * HS4 + d4], o2);
                }
                m = m_new;
            }
        }
        workgroupBarrier();
    }
    if (row.valid) {
        let at = row_at(row.b, i, row.h);
        let inv = 1.0 / l;
        for (var d = 0u; d < HS; d++) {
            at_1[at + d] = to_elem1(o[d / 4u][d % 4u] * inv);
        }
        at_3[wid.y * seq + i] = to_elem3(m + log(l));
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
        s = fma(f32(at_2[at + d]), f32(at_3[at + d]), s);
    }
    at_1[wid.y * word(1u) + row.i] = to_elem1(s);
}

// dQ of each query row (written to the q part of dqkv).
// Bindings: 1 dqkv, 2 qkv, 3 dout [B, T, C], 4 lse, 5 delta, 6 dropout key.
@compute @workgroup_size(THREADS)
fn attention_backward_q(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let seq = word(1u);
    let scale = wordf(3u);
    let part = lid % PARTS;
    let row = head_row(wid, lid / PARTS);
    let i = row.i;
    var q = head_slice(0u, row.b, row.safe, row.h, part);
    var g = head_slice(3u, row.b, row.safe, row.h, part);
    var dq: array<vec4<f32>, HSP4>;
    let lse = at_4[wid.y * seq + row.safe];
    let delta = at_5[wid.y * seq + row.safe];
    let keys = min(seq, wid.x * 64u + 64u);
    for (var j0 = 0u; j0 < keys; j0 += KT) {
        load_tiles(1u, 2u, row.b, row.h, j0, lid);
        workgroupBarrier();
        share_partials(&q, &g, lid / PARTS, part);
        workgroupBarrier();
        if (row.valid && j0 <= i) {
            for (var jj = 0u; jj < KT; jj++) {
                if (j0 + jj <= i) {
                    let t = combine(lid / PARTS, jj);
                    let ds = exp(t.x * scale - lse) * (t.y * dropped(wid.y, i, j0 + jj) - delta);
                    for (var e = 0u; e < HSP4; e++) {
                        dq[e] = fma(vec4<f32>(ds), tile_slice(0u, jj, part, e), dq[e]);
                    }
                }
            }
        }
        workgroupBarrier();
    }
    if (row.valid) {
        store_slice(&dq, part, qkv_at(row.b, i, 0u, row.h), scale);
    }
}

// dK and dV of each key row (written to the k and v parts of dqkv).
// Bindings: 1 dqkv, 2 qkv, 3 dout [B, T, C], 4 lse, 5 delta, 6 dropout key.
@compute @workgroup_size(THREADS)
fn attention_backward_kv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let seq = word(1u);
    let scale = wordf(3u);
    let part = lid % PARTS;
    let row = head_row(wid, lid / PARTS);
    let j = row.i;
    var k = head_slice(1u, row.b, row.safe, row.h, part);
    var v = head_slice(2u, row.b, row.safe, row.h, part);
    var dk: array<vec4<f32>, HSP4>;
    var dv: array<vec4<f32>, HSP4>;
    for (var i0 = wid.x * 64u; i0 < seq; i0 += KT) {
        // Query rows i0 .. i0 + KT: q in tile_a, dout in tile_b, (lse, delta) in tile_rows.
        load_tiles(0u, 3u, row.b, row.h, i0, lid);
        if (lid < KT) {
            var stats = vec2<f32>(0.0, 0.0);
            if (i0 + lid < seq) {
                stats = vec2<f32>(at_4[wid.y * seq + i0 + lid], at_5[wid.y * seq + i0 + lid]);
            }
            tile_rows[lid] = stats;
        }
        workgroupBarrier();
        share_partials(&k, &v, lid / PARTS, part);
        workgroupBarrier();
        if (row.valid) {
            for (var r = 0u; r < KT; r++) {
                let i = i0 + r;
                if (i < seq && i >= j) {
                    let t = combine(lid / PARTS, r);
                    let p = exp(t.x * scale - tile_rows[r].x);
                    let drop = dropped(wid.y, i, j);
                    let ds = p * (t.y * drop - tile_rows[r].y);
                    for (var e = 0u; e < HSP4; e++) {
                        dv[e] = fma(vec4<f32>(p * drop), tile_slice(1u, r, part, e), dv[e]);
                        dk[e] = fma(vec4<f32>(ds), tile_slice(0u, r, part, e), dk[e]);
                    }
                }
            }
        }
        workgroupBarrier();
    }
    if (row.valid) {
        store_slice(&dk, part, qkv_at(row.b, j, 1u, row.h), scale);
        store_slice(&dv, part, qkv_at(row.b, j, 2u, row.h), 1.0);
    }
}

// One new token (batch 1, sequence 1) at position p = words[4] against the KV cache: its key
// and value written at row p, then each head's softmax over keys ..= p times the values, 64
// keys at a time with a running maximum: each thread scores one key of the chunk, the
// chunk's probabilities meet in workgroup memory, and each thread sums its head dimensions
// (d = lid, lid + 64, ...) over them, reading the values' rows whole across the threads.
// Bindings: 1 out [C], 2 qkv [3C], 3 lse [NH], 4 keys [T, C], 5 values [T, C], 6 words.
// Words: 2 NH, 3 scale (f32). Grid: (NH, 1, 1).
var<workgroup> decode_p: array<f32, 64>;
// The position, made uniform (the chunks' loop holds barriers).
var<workgroup> decode_pos: u32;

@compute @workgroup_size(64)
fn attention_decode(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let c = word(2u) * HS;
    if (lid == 0u) {
        decode_pos = at_words[4];
    }
    let pos = workgroupUniformLoad(&decode_pos);
    for (var d = lid; d < HS; d += 64u) {
        at_4[pos * c + h * HS + d] = f32(at_2[c + h * HS + d]);
        at_5[pos * c + h * HS + d] = f32(at_2[2u * c + h * HS + d]);
    }
    storageBarrier();
    // This thread's output dimensions lid + 64 k (HS is at most 256).
    var o = vec4<f32>(0.0);
    var m = MASKED;
    var l = 0.0;
    for (var j0 = 0u; j0 <= pos; j0 += 64u) {
        let j = j0 + lid;
        var s = MASKED;
        if (j <= pos) {
            var dot = 0.0;
            for (var d = 0u; d < HS; d++) {
                dot = fma(f32(at_2[h * HS + d]), at_4[j * c + h * HS + d], dot);
            }
            s = dot * wordf(3u);
        }
        // Keys past p score MASKED and weigh exp(MASKED - m_new) = 0.
        let m_new = max(m, workgroup_max(s, lid));
        let p = exp(s - m_new);
        decode_p[lid] = p;
        let corr = exp(m - m_new);
        l = l * corr + workgroup_sum(p, lid);
        let keys = min(64u, pos + 1u - j0);
        for (var k = 0u; k < 4u; k++) {
            let d = lid + 64u * k;
            if (d < HS) {
                var acc = o[k] * corr;
                for (var jj = 0u; jj < keys; jj++) {
                    acc = fma(decode_p[jj], at_5[(j0 + jj) * c + h * HS + d], acc);
                }
                o[k] = acc;
            }
        }
        m = m_new;
        // Every thread has read the chunk's probabilities before the next chunk's.
        workgroupBarrier();
    }
    for (var k = 0u; k < 4u; k++) {
        let d = lid + 64u * k;
        if (d < HS) {
            at_1[h * HS + d] = to_elem1(o[k] / l);
        }
    }
    if (lid == 0u) {
        at_3[h] = to_elem3(m + log(l));
    }
}
