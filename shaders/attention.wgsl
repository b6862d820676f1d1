// Fused causal multi-head attention over fused QKV (FlashAttention style): forward with an
// online softmax over key tiles, saving each row's log-sum-exp; backward recomputes the
// probabilities from it (a row-delta pass, then dQ per block of queries and dK, dV per block
// of keys). CPU twin: core/src/ops/attention.rs.
//
// Layout: qkv [B, T, 3C] with q, k, v side by side, head h at columns h*HS..(h+1)*HS of
// each; out [B, T, C]; lse and delta [B, NH, T]. alpha-gpu prepends `const HS` (head size)
// and `const FORWARD_KT` (rows per shared tile in the forward) for the model being compiled.
// Words: 0 unused, 1 T, 2 NH, 3 scale (f32), and for dropout on the probabilities 4 site,
// 5 threshold (0: none), 6 the kept ones' scale (f32). Grid: (T / 64, B * NH): 64 rows per
// workgroup; the backward kernels' z the head's blocks of 64 dimensions. The forward gives
// each row one thread; the backward kernels work on 64 x 64 blocks of (query, key) pairs,
// each thread a 4 x 4 block of them.

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

// Head rows as HS4 = ceil(HS / 4) vec4s (zeros past HS). The forward holds its row's q and
// output as private arrays, each step a vector operation; they are `var`s and functions take
// them by pointer: indexing an array value (a `let`, a by-value argument) copies it whole
// first, on each access.
const HS4: u32 = (HS + 3u) / 4u;

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

/// The sum of a vec4 of partial dot products (lane t: the head dimensions 4 n + t), in one
/// order everywhere. The forward's dot products accumulate lane-wise, `fma(x, y, acc)` over
/// the row's vec4s: four independent chains of HS / 4 multiply-adds each, where one chain of
/// HS waited on each multiply-add's result before the next.
fn lanes_sum(acc: vec4<f32>) -> f32 {
    return (acc.x + acc.y) + (acc.z + acc.w);
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
// registers; keys and values pass through workgroup memory FORWARD_KT rows at a time, every
// thread forming its own scores with all of them: two barriers per tile and no partial sums
// to share.
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

// The backward kernels work on 64 x 64 blocks of (query, key) pairs, as a tiled GEMM does:
// 256 threads in a 16 x 16 grid, thread t = (lid % 16, lid / 16) holding a 4 x 4 block of
// each pairwise quantity, its rows 4 t.y ..+4 of the block's rows (the keys in dK/dV, the
// queries in dQ) and its columns 4 t.x ..+4 (the other side). Each value read from
// workgroup memory feeds four multiply-adds of a thread's block, where a thread per row
// (the kernels before) fed one: there every vec4 read from workgroup memory fed a vec4 of
// multiply-adds, which caps a kernel at a quarter of the FMA peak on NVIDIA (a subgroup's
// 128-bit load takes four of the shared-memory pipe's clocks, its four vec4 FMAs one of the
// four schedulers' each; docs/performance.md). Rows past T and head dimensions past HS are
// zeros; each workgroup takes 64 of the head's dimensions (grid z), recomputing the pairwise
// blocks where HS is larger.

// Workgroup memory of the backward kernels, 16 KiB (WebGPU's default), used by the two
// phases in turn: `pair_blocks` stages four chunks of 16 depths of 64 head rows,
// [depth][row / 4] vec4s (the four rows of a vec4 side by side) from 0, 256, 512 and 768;
// `block_accumulate` a thread block's matrix, 32 of its columns, [column][row / 4] from 0,
// and 32 head rows' 64 dimensions, [row][dimension / 4], from 512.
var<workgroup> blocks: array<vec4<f32>, 1024>;

// A thread's 4 x 4 block: rN its row N's four columns.
struct Block4 { r0: vec4<f32>, r1: vec4<f32>, r2: vec4<f32>, r3: vec4<f32> }

/// c += x ⊗ y: the four rows' values `x` times the four columns' `y`.
fn block_fma(c: ptr<function, Block4>, x: vec4<f32>, y: vec4<f32>) {
    (*c).r0 = fma(vec4<f32>(x.x), y, (*c).r0);
    (*c).r1 = fma(vec4<f32>(x.y), y, (*c).r1);
    (*c).r2 = fma(vec4<f32>(x.z), y, (*c).r2);
    (*c).r3 = fma(vec4<f32>(x.w), y, (*c).r3);
}

/// Stages depths d0 .. d0 + 16 of head rows r0 .. r0 + 64 of source `src` (see head_elem)
/// into `blocks` from `base`, [depth][row / 4]: each thread loads four depths of one row.
fn stage_depths(src: u32, b: u32, h: u32, r0: u32, d0: u32, base: u32, lid: u32) {
    let row = lid / 4u;
    let d4 = d0 / 4u + lid % 4u;
    var v = vec4<f32>(0.0);
    if (r0 + row < word(1u) && d4 < HS4) {
        v = head_elem4(src, b, r0 + row, h, d4);
    }
    let at = base + 4u * (lid % 4u) * 16u + row / 4u;
    let lane = row % 4u;
    blocks[at][lane] = v.x;
    blocks[at + 16u][lane] = v.y;
    blocks[at + 32u][lane] = v.z;
    blocks[at + 48u][lane] = v.w;
}

/// Depth `d` of the four staged chunks into the thread's blocks of x1·y1ᵀ (`s`) and x2·y2ᵀ
/// (`t`).
fn pair_depth(s: ptr<function, Block4>, t: ptr<function, Block4>, d: u32, tb: vec2<u32>) {
    block_fma(s, blocks[d * 16u + tb.y], blocks[256u + d * 16u + tb.x]);
    block_fma(t, blocks[512u + d * 16u + tb.y], blocks[768u + d * 16u + tb.x]);
}

/// The thread's blocks of two products over the head, s = x1·y1ᵀ and t = x2·y2ᵀ: the rows
/// are head rows r0 .. r0 + 64 of sources x1 and x2, the columns rows c0 .. c0 + 64 of y1
/// and y2 (see head_elem). All threads of the workgroup must call it.
fn pair_blocks(s: ptr<function, Block4>, t: ptr<function, Block4>, x1: u32, y1: u32, x2: u32, y2: u32, b: u32, h: u32, r0: u32, c0: u32, tb: vec2<u32>, lid: u32) {
    for (var d0 = 0u; d0 < HS; d0 += 16u) {
        workgroupBarrier();
        stage_depths(x1, b, h, r0, d0, 0u, lid);
        stage_depths(y1, b, h, c0, d0, 256u, lid);
        stage_depths(x2, b, h, r0, d0, 512u, lid);
        stage_depths(y2, b, h, c0, d0, 768u, lid);
        workgroupBarrier();
        // Written out four depths at a time (NVIDIA's compiler does not unroll such loops).
        for (var d = 0u; d < 16u; d += 4u) {
            pair_depth(s, t, d, tb);
            pair_depth(s, t, d + 1u, tb);
            pair_depth(s, t, d + 2u, tb);
            pair_depth(s, t, d + 3u, tb);
        }
    }
}

/// acc += m·z over the block's 64 columns: `m` the thread's block of a 64 x 64 matrix in
/// registers (its rows 4 t.y.., columns 4 t.x..), z head rows c0 .. c0 + 64 of source `src`,
/// dimensions 64 `db` .. + 64, so that acc is the thread's rows by dimensions 64 db + 4 t.x
/// ..+4. m passes through workgroup memory 32 columns at a time. All threads of the
/// workgroup must call it.
fn block_accumulate(acc: ptr<function, Block4>, m: ptr<function, Block4>, src: u32, b: u32, h: u32, c0: u32, db: u32, tb: vec2<u32>, lid: u32) {
    for (var half = 0u; half < 2u; half++) {
        workgroupBarrier();
        if (tb.x / 8u == half) {
            let col = 4u * (tb.x % 8u);
            blocks[col * 16u + tb.y] = vec4<f32>((*m).r0.x, (*m).r1.x, (*m).r2.x, (*m).r3.x);
            blocks[(col + 1u) * 16u + tb.y] = vec4<f32>((*m).r0.y, (*m).r1.y, (*m).r2.y, (*m).r3.y);
            blocks[(col + 2u) * 16u + tb.y] = vec4<f32>((*m).r0.z, (*m).r1.z, (*m).r2.z, (*m).r3.z);
            blocks[(col + 3u) * 16u + tb.y] = vec4<f32>((*m).r0.w, (*m).r1.w, (*m).r2.w, (*m).r3.w);
        }
        for (var e = lid; e < 512u; e += 256u) {
            let r = c0 + 32u * half + e / 16u;
            let d4 = 16u * db + e % 16u;
            var v = vec4<f32>(0.0);
            if (r < word(1u) && d4 < HS4) {
                v = head_elem4(src, b, r, h, d4);
            }
            blocks[512u + e] = v;
        }
        workgroupBarrier();
        for (var col = 0u; col < 32u; col += 4u) {
            block_fma(acc, blocks[col * 16u + tb.y], blocks[512u + col * 16u + tb.x]);
            block_fma(acc, blocks[(col + 1u) * 16u + tb.y], blocks[512u + (col + 1u) * 16u + tb.x]);
            block_fma(acc, blocks[(col + 2u) * 16u + tb.y], blocks[512u + (col + 2u) * 16u + tb.x]);
            block_fma(acc, blocks[(col + 3u) * 16u + tb.y], blocks[512u + (col + 3u) * 16u + tb.x]);
        }
    }
}

/// Writes row `r` of a thread's block of dimensions (64 db + 4 t.x ..+4), times `scale`, to
/// `at_1[at ..]` (the row's first element), up to HS.
fn store_block_row(x: vec4<f32>, at: u32, db: u32, tx: u32, scale: f32) {
    for (var t = 0u; t < 4u; t++) {
        let d = 64u * db + 4u * tx + t;
        if (d < HS) {
            at_1[at + d] = to_elem1(x[t] * scale);
        }
    }
}

/// One row of a thread's pairwise blocks: probabilities (times dropout's factor: what dV
/// takes) and score gradients (before the scale), from the scores `s` and dout·v `dp` of the
/// pairs (i, j) with `i` the queries, `j` the keys (one of them the same for the row), the
/// queries' log-sum-exps and deltas. Zero outside the causal mask and past T.
struct PairRow { p: vec4<f32>, ds: vec4<f32> }

fn pair_row(s: vec4<f32>, dp: vec4<f32>, i: vec4<u32>, j: vec4<u32>, lse: vec4<f32>, delta: vec4<f32>, bh: u32, scale: f32) -> PairRow {
    let seq = vec4<u32>(word(1u));
    let valid = (j <= i) & (i < seq);
    let p = select(vec4<f32>(0.0), exp(s * scale - lse), valid);
    let drop = vec4<f32>(dropped(bh, i.x, j.x), dropped(bh, i.y, j.y), dropped(bh, i.z, j.z), dropped(bh, i.w, j.w));
    return PairRow(p * drop, p * (dp * drop - delta));
}

// dQ of each query block: over the key blocks up to it, the scores and dout·v recomputed
// (rows the queries, columns the keys), then dQ += dS·K.
// Bindings: 1 dqkv, 2 qkv, 3 dout [B, T, C], 4 lse, 5 delta, 6 dropout key.
// Grid: (T / 64, B * NH, HS / 64).
@compute @workgroup_size(256)
fn attention_backward_q(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let seq = word(1u);
    let nh = word(2u);
    let scale = wordf(3u);
    let b = wid.y / nh;
    let h = wid.y % nh;
    let i0 = wid.x * 64u;
    let tb = vec2<u32>(lid % 16u, lid / 16u);
    // The thread's four queries (its rows) and their statistics.
    let iv = i0 + 4u * tb.y + vec4<u32>(0u, 1u, 2u, 3u);
    let safe = min(iv, vec4<u32>(seq - 1u)) + wid.y * seq;
    let lse = vec4<f32>(at_4[safe.x], at_4[safe.y], at_4[safe.z], at_4[safe.w]);
    let delta = vec4<f32>(at_5[safe.x], at_5[safe.y], at_5[safe.z], at_5[safe.w]);
    let zero = vec4<f32>(0.0);
    var dq = Block4(zero, zero, zero, zero);
    let keys = min(seq, i0 + 64u);
    for (var j0 = 0u; j0 < keys; j0 += 64u) {
        var s = Block4(zero, zero, zero, zero);
        var dp = Block4(zero, zero, zero, zero);
        pair_blocks(&s, &dp, 0u, 1u, 3u, 2u, b, h, i0, j0, tb, lid);
        let jv = j0 + 4u * tb.x + vec4<u32>(0u, 1u, 2u, 3u);
        var ds: Block4;
        ds.r0 = pair_row(s.r0, dp.r0, vec4<u32>(iv.x), jv, vec4<f32>(lse.x), vec4<f32>(delta.x), wid.y, scale).ds;
        ds.r1 = pair_row(s.r1, dp.r1, vec4<u32>(iv.y), jv, vec4<f32>(lse.y), vec4<f32>(delta.y), wid.y, scale).ds;
        ds.r2 = pair_row(s.r2, dp.r2, vec4<u32>(iv.z), jv, vec4<f32>(lse.z), vec4<f32>(delta.z), wid.y, scale).ds;
        ds.r3 = pair_row(s.r3, dp.r3, vec4<u32>(iv.w), jv, vec4<f32>(lse.w), vec4<f32>(delta.w), wid.y, scale).ds;
        block_accumulate(&dq, &ds, 1u, b, h, j0, wid.z, tb, lid);
    }
    if (iv.x < seq) { store_block_row(dq.r0, qkv_at(b, iv.x, 0u, h), wid.z, tb.x, scale); }
    if (iv.y < seq) { store_block_row(dq.r1, qkv_at(b, iv.y, 0u, h), wid.z, tb.x, scale); }
    if (iv.z < seq) { store_block_row(dq.r2, qkv_at(b, iv.z, 0u, h), wid.z, tb.x, scale); }
    if (iv.w < seq) { store_block_row(dq.r3, qkv_at(b, iv.w, 0u, h), wid.z, tb.x, scale); }
}

// dK and dV of each key block: over the query blocks from it, the scores and dout·v
// recomputed (rows the keys, columns the queries), then dV += Pᵀ·dout and dK += dSᵀ·Q.
// Bindings: 1 dqkv, 2 qkv, 3 dout [B, T, C], 4 lse, 5 delta, 6 dropout key.
// Grid: (T / 64, B * NH, HS / 64).
@compute @workgroup_size(256)
fn attention_backward_kv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let seq = word(1u);
    let nh = word(2u);
    let scale = wordf(3u);
    let b = wid.y / nh;
    let h = wid.y % nh;
    let j0 = wid.x * 64u;
    let tb = vec2<u32>(lid % 16u, lid / 16u);
    // The thread's four keys (its rows).
    let jv = j0 + 4u * tb.y + vec4<u32>(0u, 1u, 2u, 3u);
    let zero = vec4<f32>(0.0);
    var dk = Block4(zero, zero, zero, zero);
    var dv = Block4(zero, zero, zero, zero);
    for (var i0 = j0; i0 < seq; i0 += 64u) {
        var s = Block4(zero, zero, zero, zero);
        var dp = Block4(zero, zero, zero, zero);
        pair_blocks(&s, &dp, 1u, 0u, 2u, 3u, b, h, j0, i0, tb, lid);
        // The block's queries (its columns) and their statistics.
        let iv = i0 + 4u * tb.x + vec4<u32>(0u, 1u, 2u, 3u);
        let safe = min(iv, vec4<u32>(seq - 1u)) + wid.y * seq;
        let lse = vec4<f32>(at_4[safe.x], at_4[safe.y], at_4[safe.z], at_4[safe.w]);
        let delta = vec4<f32>(at_5[safe.x], at_5[safe.y], at_5[safe.z], at_5[safe.w]);
        let r0 = pair_row(s.r0, dp.r0, iv, vec4<u32>(jv.x), lse, delta, wid.y, scale);
        let r1 = pair_row(s.r1, dp.r1, iv, vec4<u32>(jv.y), lse, delta, wid.y, scale);
        let r2 = pair_row(s.r2, dp.r2, iv, vec4<u32>(jv.z), lse, delta, wid.y, scale);
        let r3 = pair_row(s.r3, dp.r3, iv, vec4<u32>(jv.w), lse, delta, wid.y, scale);
        var p = Block4(r0.p, r1.p, r2.p, r3.p);
        var ds = Block4(r0.ds, r1.ds, r2.ds, r3.ds);
        block_accumulate(&dv, &p, 3u, b, h, i0, wid.z, tb, lid);
        block_accumulate(&dk, &ds, 0u, b, h, i0, wid.z, tb, lid);
    }
    if (jv.x < seq) {
        store_block_row(dk.r0, qkv_at(b, jv.x, 1u, h), wid.z, tb.x, scale);
        store_block_row(dv.r0, qkv_at(b, jv.x, 2u, h), wid.z, tb.x, 1.0);
    }
    if (jv.y < seq) {
        store_block_row(dk.r1, qkv_at(b, jv.y, 1u, h), wid.z, tb.x, scale);
        store_block_row(dv.r1, qkv_at(b, jv.y, 2u, h), wid.z, tb.x, 1.0);
    }
    if (jv.z < seq) {
        store_block_row(dk.r2, qkv_at(b, jv.z, 1u, h), wid.z, tb.x, scale);
        store_block_row(dv.r2, qkv_at(b, jv.z, 2u, h), wid.z, tb.x, 1.0);
    }
    if (jv.w < seq) {
        store_block_row(dk.r3, qkv_at(b, jv.w, 1u, h), wid.z, tb.x, scale);
        store_block_row(dv.r3, qkv_at(b, jv.w, 2u, h), wid.z, tb.x, 1.0);
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
