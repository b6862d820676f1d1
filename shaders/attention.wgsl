// Fused causal multi-head attention over fused QKV (FlashAttention style): forward with an
// online softmax over key tiles, saving each row's log-sum-exp; backward recomputes the
// probabilities from it (a row-delta pass, then dQ per block of queries and dK, dV per block
// of keys), and with RoPE rotates dQ and dK back. CPU twin: core/src/ops/attention.rs.
//
// Layout: qkv [B, T, W] with q (NH heads), k and v (KVH heads each) side by side, W = (NH +
// 2 KVH) HS; query head h reads key/value head h / (NH / KVH) (GPT-2: KVH = NH); out
// [B, T, C]; lse and delta [B, NH, T]. With RoPE (the Llama family), q and k are rotated as
// they are read (Hugging Face's rotate-half: pair d, d + HS/2 by the angle of the row's
// position in the table at binding 7, [T, HS]: the cosines, then the sines). alpha-gpu
// prepends `const HS` (head size) for the model being compiled.
// Words: 0 unused, 1 T, 2 NH, 3 scale (f32), and for dropout on the probabilities 4 site,
// 5 threshold (0: none), 6 the kept ones' scale (f32); 7 KVH, 8 RoPE (0/1). Grid: (T / 64,
// B * NH): 64 rows per workgroup (dK and dV's: B * KVH, each summing its query heads); the
// forward's and the backward's z the head's blocks of 64 dimensions. They work on 64 x 64
// blocks of (query, key) pairs, each thread a 4 x 4 block of them; the delta pass gives each
// row a thread.

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
// With RoPE, the rotary table [T, HS] (bound where the model has one).
@group(0) @binding(7) var<storage, read_write> at_rope: array<f32>;

// Head rows as HS4 = ceil(HS / 4) vec4s (zeros past HS).
const HS4: u32 = (HS + 3u) / 4u;
// RoPE's pairs (d, d + HALF_HS) of a head (HS is even with RoPE; at least 1, so that a
// one-dimension head's module still divides by it).
const HALF_HS: u32 = max(HS / 2u, 1u);

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

/// Offset of row `i` of batch `b`, part `part` (0 q, 1 k, 2 v) of query head `h` in qkv
/// (k and v: its key/value head's).
fn qkv_at(b: u32, i: u32, part: u32, h: u32) -> u32 {
    let nh = word(2u);
    let kvh = word(7u);
    let c = nh * HS;
    let row = (b * word(1u) + i) * (nh + 2u * kvh) * HS;
    if (part == 0u) {
        return row + h * HS;
    }
    return row + c + (part - 1u) * kvh * HS + (h / (nh / kvh)) * HS;
}

/// Element `d` of a head row of q or k at `at` (its element 0) rotated as position `pos`
/// (RoPE), or as it is without.
fn rotated(at: u32, pos: u32, d: u32) -> f32 {
    let x = f32(at_2[at + d]);
    if (word(8u) == 0u) {
        return x;
    }
    let half = HALF_HS;
    let i = d % half;
    let cos = at_rope[pos * HS + i];
    let sin = at_rope[pos * HS + half + i];
    if (d < half) {
        return x * cos - f32(at_2[at + d + half]) * sin;
    }
    return x * cos + f32(at_2[at + d - half]) * sin;
}

/// Offset of row `i` of batch `b`, head `h` in a [B, T, C] tensor.
fn row_at(b: u32, i: u32, h: u32) -> u32 {
    return (b * word(1u) + i) * word(2u) * HS + h * HS;
}

/// The row a thread of the delta pass handles (grid (T / 64, B * NH)): batch `b`, head `h`,
/// row `i`; `valid` false past T.
struct HeadRow { b: u32, h: u32, i: u32, valid: bool }

fn head_row(wid: vec3<u32>, lid: u32) -> HeadRow {
    let nh = word(2u);
    let i = wid.x * 64u + lid;
    return HeadRow(wid.y / nh, wid.y % nh, i, i < word(1u));
}

/// Element `d` of row `r` of head `h` in source `src`: 0 q, 1 k (both rotated with RoPE),
/// 2 v (qkv, binding 2) or 3 dout (binding 3, backward only).
fn head_elem(src: u32, b: u32, r: u32, h: u32, d: u32) -> f32 {
    if (src == 3u) {
        return f32(at_3[row_at(b, r, h) + d]);
    }
    if (src == 2u) {
        return f32(at_2[qkv_at(b, r, src, h) + d]);
    }
    return rotated(qkv_at(b, r, src, h), r, d);
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

/// The sum of a vec4's four values in one order everywhere: a thread's share of a row's
/// exponentials in the forward, a row's parts in `rows_reduce`.
fn lanes_sum(acc: vec4<f32>) -> f32 {
    return (acc.x + acc.y) + (acc.z + acc.w);
}

// The forward and backward kernels work on 64 x 64 blocks of (query, key) pairs, as a tiled GEMM
// does: 256 threads in a 16 x 16 grid, thread t = (lid % 16, lid / 16) holding a 4 x 4 block of
// each pairwise quantity, its rows 4 t.y ..+4 of the block's rows (the keys in dK/dV, the queries
// in dQ) and its columns 4 t.x ..+4 (the other side). Two vec4s read from workgroup memory feed 16
// multiply-adds of a thread's block; with a thread per row (the kernels before) one vec4 fed four,
// which caps a kernel at a quarter of the FMA peak on NVIDIA (a subgroup's 128-bit load holds the
// shared-memory pipe four clocks, in which the four schedulers could issue sixteen FMA
// instructions; docs/performance.md, "Kernel choices"). Rows past T and head dimensions past HS are zeros; each
// workgroup takes 64 of the head's dimensions (grid z), recomputing the pairwise blocks where HS
// is larger.

// Workgroup memory of the block kernels, 16 KiB (WebGPU's default), used by their phases in
// turn: `pair_blocks` stages four chunks of 16 depths of 64 head rows, [depth][row / 4] vec4s
// (the four rows of a vec4 side by side) from 0, 256, 512 and 768; `block_accumulate` a
// thread block's matrix, 32 of its columns, [column][row / 4] (swizzled) from 0, and 32 head
// rows' 64 dimensions, [row][dimension / 4], from 512; `rows_reduce` each row's 16 parts from 0.
var<workgroup> blocks: array<vec4<f32>, 1024>;

// A thread's 4 x 4 block: rN its row N's four columns.
struct Block4 { r0: vec4<f32>, r1: vec4<f32>, r2: vec4<f32>, r3: vec4<f32> }

/// A block kernel's workgroup (grid (T / 64, B * NH, HS / 64)): batch `b`, head `h`, their
/// index `bh` in [B, NH], the first of its 64 rows `r0` (queries or keys) and the head's block
/// of 64 dimensions `db`. From the workgroup's id alone, so that WGSL's uniformity analysis
/// takes loops bounded by it as uniform (their barriers need that).
struct BlockGroup { b: u32, h: u32, bh: u32, r0: u32, db: u32 }

fn block_group(wid: vec3<u32>) -> BlockGroup {
    let nh = word(2u);
    return BlockGroup(wid.y / nh, wid.y % nh, wid.y, wid.x * 64u, wid.z);
}

/// Thread `lid`'s place t = (lid % 16, lid / 16) in the 16 x 16 grid of 4 x 4 blocks.
fn block_place(lid: u32) -> vec2<u32> {
    return vec2<u32>(lid % 16u, lid / 16u);
}

/// The thread's four rows of the block whose rows start at r0.
fn block_rows(r0: u32, tb: vec2<u32>) -> vec4<u32> {
    return r0 + 4u * tb.y + vec4<u32>(0u, 1u, 2u, 3u);
}

/// The thread's four columns of the block whose columns start at c0.
fn block_cols(c0: u32, tb: vec2<u32>) -> vec4<u32> {
    return c0 + 4u * tb.x + vec4<u32>(0u, 1u, 2u, 3u);
}

/// c += x ⊗ y: the four rows' values `x` times the four columns' `y`.
fn block_fma(c: ptr<function, Block4>, x: vec4<f32>, y: vec4<f32>) {
    (*c).r0 = fma(vec4<f32>(x.x), y, (*c).r0);
    (*c).r1 = fma(vec4<f32>(x.y), y, (*c).r1);
    (*c).r2 = fma(vec4<f32>(x.z), y, (*c).r2);
    (*c).r3 = fma(vec4<f32>(x.w), y, (*c).r3);
}

/// Stages depths d0 .. d0 + 16 of head rows r0 .. r0 + 64 of source `src` (see head_elem)
/// into `blocks` from `base`, [depth][row / 4]: each thread loads four depths of one row, a
/// subgroup's 32 threads the same depths of 32 rows, so that its stores of each depth fill
/// the 32 banks once (four threads a row put a subgroup's stores in 8 banks, 4 to each).
fn stage_depths(src: u32, b: u32, h: u32, r0: u32, d0: u32, base: u32, lid: u32) {
    let row = lid % 64u;
    let d4 = d0 / 4u + lid / 64u;
    var v = vec4<f32>(0.0);
    if (r0 + row < word(1u) && d4 < HS4) {
        v = head_elem4(src, b, r0 + row, h, d4);
    }
    let at = base + 4u * (lid / 64u) * 16u + row / 4u;
    let lane = row % 4u;
    blocks[at][lane] = v.x;
    blocks[at + 16u][lane] = v.y;
    blocks[at + 32u][lane] = v.z;
    blocks[at + 48u][lane] = v.w;
}

/// Depths d .. d + 4 of the staged chunks from `base` (rows) and `base` + 256 (columns) into
/// the thread's block `c`, written out (NVIDIA's compiler does not unroll such loops).
fn depths4(c: ptr<function, Block4>, base: u32, d: u32, tb: vec2<u32>) {
    block_fma(c, blocks[base + d * 16u + tb.y], blocks[base + 256u + d * 16u + tb.x]);
    block_fma(c, blocks[base + (d + 1u) * 16u + tb.y], blocks[base + 256u + (d + 1u) * 16u + tb.x]);
    block_fma(c, blocks[base + (d + 2u) * 16u + tb.y], blocks[base + 256u + (d + 2u) * 16u + tb.x]);
    block_fma(c, blocks[base + (d + 3u) * 16u + tb.y], blocks[base + 256u + (d + 3u) * 16u + tb.x]);
}

/// Sources of `pair_blocks`' second product where the forward takes only the first.
const NO_SOURCE: u32 = 4u;

/// The thread's blocks of products over the head, s = x1·y1ᵀ and, unless `src.z` is
/// NO_SOURCE, t = x2·y2ᵀ, with (x1, y1, x2, y2) = `src` (see head_elem): the rows are the
/// group's head rows g.r0 .. + 64 of x1 and x2, the columns rows c0 .. c0 + 64 of y1 and y2.
/// All threads of the workgroup must call it.
fn pair_blocks(s: ptr<function, Block4>, t: ptr<function, Block4>, src: vec4<u32>, g: BlockGroup, c0: u32, lid: u32) {
    let tb = block_place(lid);
    let two = src.z != NO_SOURCE;
    for (var d0 = 0u; d0 < HS; d0 += 16u) {
        workgroupBarrier();
        stage_depths(src.x, g.b, g.h, g.r0, d0, 0u, lid);
        stage_depths(src.y, g.b, g.h, c0, d0, 256u, lid);
        if (two) {
            stage_depths(src.z, g.b, g.h, g.r0, d0, 512u, lid);
            stage_depths(src.w, g.b, g.h, c0, d0, 768u, lid);
        }
        workgroupBarrier();
        if (two) {
            for (var d = 0u; d < 16u; d += 4u) {
                depths4(s, 0u, d, tb);
                depths4(t, 512u, d, tb);
            }
        } else {
            for (var d = 0u; d < 16u; d += 4u) {
                depths4(s, 0u, d, tb);
            }
        }
    }
}

/// acc += m·z over the block's 64 columns: `m` the thread's block of a 64 x 64 matrix in
/// registers (its rows 4 t.y.., columns 4 t.x..), z head rows c0 .. c0 + 64 of source `src`,
/// the group's dimensions 64 g.db .. + 64, so that acc is the thread's rows by dimensions
/// 64 g.db + 4 t.x ..+4. m passes through workgroup memory 32 columns at a time. All threads
/// of the workgroup must call it.
fn block_accumulate(acc: ptr<function, Block4>, m: ptr<function, Block4>, src: u32, g: BlockGroup, c0: u32, lid: u32) {
    let tb = block_place(lid);
    for (var half = 0u; half < 2u; half++) {
        workgroupBarrier();
        // Column `col` of m lies at col * 16 + (row / 4 ^ col / 4): the eight threads of a
        // subgroup that store the same column of their blocks (columns 16 vec4s apart) then
        // reach different banks.
        if (tb.x / 8u == half) {
            let col = 4u * (tb.x % 8u);
            let row = tb.y ^ (tb.x % 8u);
            blocks[col * 16u + row] = vec4<f32>((*m).r0.x, (*m).r1.x, (*m).r2.x, (*m).r3.x);
            blocks[(col + 1u) * 16u + row] = vec4<f32>((*m).r0.y, (*m).r1.y, (*m).r2.y, (*m).r3.y);
            blocks[(col + 2u) * 16u + row] = vec4<f32>((*m).r0.z, (*m).r1.z, (*m).r2.z, (*m).r3.z);
            blocks[(col + 3u) * 16u + row] = vec4<f32>((*m).r0.w, (*m).r1.w, (*m).r2.w, (*m).r3.w);
        }
        for (var e = lid; e < 512u; e += 256u) {
            let r = c0 + 32u * half + e / 16u;
            let d4 = 16u * g.db + e % 16u;
            var v = vec4<f32>(0.0);
            if (r < word(1u) && d4 < HS4) {
                v = head_elem4(src, g.b, r, g.h, d4);
            }
            blocks[512u + e] = v;
        }
        workgroupBarrier();
        for (var col = 0u; col < 32u; col += 4u) {
            let row = tb.y ^ (col / 4u);
            block_fma(acc, blocks[col * 16u + row], blocks[512u + col * 16u + tb.x]);
            block_fma(acc, blocks[(col + 1u) * 16u + row], blocks[512u + (col + 1u) * 16u + tb.x]);
            block_fma(acc, blocks[(col + 2u) * 16u + row], blocks[512u + (col + 2u) * 16u + tb.x]);
            block_fma(acc, blocks[(col + 3u) * 16u + row], blocks[512u + (col + 3u) * 16u + tb.x]);
        }
    }
}

/// Log-sum-exps (binding 4) and deltas (binding 5) of four queries (clamped to T - 1).
struct RowStats { lse: vec4<f32>, delta: vec4<f32> }

fn row_stats(i: vec4<u32>, bh: u32) -> RowStats {
    let seq = word(1u);
    let at = min(i, vec4<u32>(seq - 1u)) + bh * seq;
    return RowStats(vec4<f32>(at_4[at.x], at_4[at.y], at_4[at.z], at_4[at.w]), vec4<f32>(at_5[at.x], at_5[at.y], at_5[at.z], at_5[at.w]));
}

/// Where block stores go: the output [B, T, C] rather than a part of dqkv (0 q, 1 k, 2 v).
const OUT_ROWS: u32 = 3u;

/// Writes row `i` of a thread's block, `x` (dimensions 64 db + 4 t.x ..+4) times `scale`, to
/// at_1: part `part` of dqkv or the output (OUT_ROWS), up to HS; nothing past T.
fn store_block_row(x: vec4<f32>, i: u32, part: u32, g: BlockGroup, tx: u32, scale: f32) {
    if (i >= word(1u)) {
        return;
    }
    let at = select(qkv_at(g.b, i, part, g.h), row_at(g.b, i, g.h), part == OUT_ROWS);
    for (var t = 0u; t < 4u; t++) {
        let d = 64u * g.db + 4u * tx + t;
        if (d < HS) {
            at_1[at + d] = to_elem1(x[t] * scale);
        }
    }
}

/// Writes thread `lid`'s block `x`, row a times scale[a] (see store_block_row).
fn store_block(x: ptr<function, Block4>, part: u32, g: BlockGroup, lid: u32, scale: vec4<f32>) {
    let tb = block_place(lid);
    let rows = block_rows(g.r0, tb);
    store_block_row((*x).r0, rows.x, part, g, tb.x, scale.x);
    store_block_row((*x).r1, rows.y, part, g, tb.x, scale.y);
    store_block_row((*x).r2, rows.z, part, g, tb.x, scale.z);
    store_block_row((*x).r3, rows.w, part, g, tb.x, scale.w);
}

/// The maxima (`largest`) or sums over the 16 threads of a row group (the same t.y) of each
/// of the thread's four rows' values `v` (its part of each row): every thread of the group
/// gets the same four, summed in one order. All threads of the workgroup must call it.
fn rows_reduce(v: vec4<f32>, largest: bool, tb: vec2<u32>) -> vec4<f32> {
    // [row][t.x]: row 4 t.y + a's 16 parts in four vec4s from 16 t.y + 4 a.
    let at = 16u * tb.y + tb.x / 4u;
    let lane = tb.x % 4u;
    workgroupBarrier();
    blocks[at][lane] = v.x;
    blocks[at + 4u][lane] = v.y;
    blocks[at + 8u][lane] = v.z;
    blocks[at + 12u][lane] = v.w;
    workgroupBarrier();
    var r: vec4<f32>;
    for (var a = 0u; a < 4u; a++) {
        let row = 16u * tb.y + 4u * a;
        let q0 = blocks[row];
        let q1 = blocks[row + 1u];
        let q2 = blocks[row + 2u];
        let q3 = blocks[row + 3u];
        if (largest) {
            r[a] = max4(max(max(q0, q1), max(q2, q3)));
        } else {
            r[a] = lanes_sum((q0 + q1) + (q2 + q3));
        }
    }
    return r;
}

/// The largest of a vec4's four values.
fn max4(x: vec4<f32>) -> f32 {
    return max(max(x.x, x.y), max(x.z, x.w));
}

/// One row of the forward's scores, `s` times `scale`, where key j may be seen from query
/// i (j <= i, and both within T), else MASKED.
fn masked_row(s: vec4<f32>, i: u32, j: vec4<u32>, scale: f32) -> vec4<f32> {
    return select(vec4<f32>(MASKED), s * scale, (j <= vec4<u32>(i)) & (vec4<u32>(i) < vec4<u32>(word(1u))));
}

/// Probabilities `p` of query i with keys j times dropout's factors.
fn kept_row(p: vec4<f32>, i: u32, j: vec4<u32>, bh: u32) -> vec4<f32> {
    return p * vec4<f32>(dropped(bh, i, j.x), dropped(bh, i, j.y), dropped(bh, i, j.z), dropped(bh, i, j.w));
}

// The forward of each query block: over the key blocks up to it, the scores (rows the
// queries, columns the keys), each block a step of the online softmax (the rows' maxima met
// over each row's 16 threads), then out += P·V. Each thread sums its own columns' share of
// each row's exponentials; the shares meet at the end.
// Bindings: 1 out [B, T, C], 2 qkv, 3 lse [B, NH, T], 6 dropout key.
// Grid: (T / 64, B * NH, HS / 64).
@compute @workgroup_size(256)
fn attention_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let seq = word(1u);
    let scale = wordf(3u);
    // The thread's rows are queries.
    let g = block_group(wid);
    let tb = block_place(lid);
    let iv = block_rows(g.r0, tb);
    let zero = vec4<f32>(0.0);
    var o = Block4(zero, zero, zero, zero);
    var m = vec4<f32>(MASKED);
    var l = zero;
    let keys = min(seq, g.r0 + 64u);
    for (var j0 = 0u; j0 < keys; j0 += 64u) {
        var s = Block4(zero, zero, zero, zero);
        var unused: Block4;
        pair_blocks(&s, &unused, vec4<u32>(0u, 1u, NO_SOURCE, NO_SOURCE), g, j0, lid);
        let jv = block_cols(j0, tb);
        let x0 = masked_row(s.r0, iv.x, jv, scale);
        let x1 = masked_row(s.r1, iv.y, jv, scale);
        let x2 = masked_row(s.r2, iv.z, jv, scale);
        let x3 = masked_row(s.r3, iv.w, jv, scale);
        // Masked scores weigh exp(MASKED - m_new) = 0; a row past T stays all MASKED.
        let m_new = max(m, rows_reduce(vec4<f32>(max4(x0), max4(x1), max4(x2), max4(x3)), true, tb));
        let corr = exp(m - m_new);
        let p0 = exp(x0 - m_new.x);
        let p1 = exp(x1 - m_new.y);
        let p2 = exp(x2 - m_new.z);
        let p3 = exp(x3 - m_new.w);
        l = l * corr + vec4<f32>(lanes_sum(p0), lanes_sum(p1), lanes_sum(p2), lanes_sum(p3));
        var kept = Block4(kept_row(p0, iv.x, jv, g.bh), kept_row(p1, iv.y, jv, g.bh), kept_row(p2, iv.z, jv, g.bh), kept_row(p3, iv.w, jv, g.bh));
        o = Block4(o.r0 * corr.x, o.r1 * corr.y, o.r2 * corr.z, o.r3 * corr.w);
        block_accumulate(&o, &kept, 2u, g, j0, lid);
        m = m_new;
    }
    let sum = rows_reduce(l, false, tb);
    store_block(&o, OUT_ROWS, g, lid, 1.0 / sum);
    if (tb.x == 0u && g.db == 0u) {
        let lse = m + log(sum);
        for (var a = 0u; a < 4u; a++) {
            if (iv[a] < seq) {
                at_3[g.bh * seq + iv[a]] = to_elem3(lse[a]);
            }
        }
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
    let scale = wordf(3u);
    // The thread's rows are queries.
    let g = block_group(wid);
    let tb = block_place(lid);
    let iv = block_rows(g.r0, tb);
    let stats = row_stats(iv, g.bh);
    let zero = vec4<f32>(0.0);
    var dq = Block4(zero, zero, zero, zero);
    let keys = min(word(1u), g.r0 + 64u);
    for (var j0 = 0u; j0 < keys; j0 += 64u) {
        var s = Block4(zero, zero, zero, zero);
        var dp = Block4(zero, zero, zero, zero);
        pair_blocks(&s, &dp, vec4<u32>(0u, 1u, 3u, 2u), g, j0, lid);
        let jv = block_cols(j0, tb);
        var ds: Block4;
        ds.r0 = pair_row(s.r0, dp.r0, vec4<u32>(iv.x), jv, vec4<f32>(stats.lse.x), vec4<f32>(stats.delta.x), g.bh, scale).ds;
        ds.r1 = pair_row(s.r1, dp.r1, vec4<u32>(iv.y), jv, vec4<f32>(stats.lse.y), vec4<f32>(stats.delta.y), g.bh, scale).ds;
        ds.r2 = pair_row(s.r2, dp.r2, vec4<u32>(iv.z), jv, vec4<f32>(stats.lse.z), vec4<f32>(stats.delta.z), g.bh, scale).ds;
        ds.r3 = pair_row(s.r3, dp.r3, vec4<u32>(iv.w), jv, vec4<f32>(stats.lse.w), vec4<f32>(stats.delta.w), g.bh, scale).ds;
        block_accumulate(&dq, &ds, 1u, g, j0, lid);
    }
    store_block(&dq, 0u, g, lid, vec4<f32>(scale));
}

// dK and dV of each key block of a key/value head: over its query heads in order and the
// query blocks from the key block, the scores and dout·v recomputed (rows the keys, columns
// the queries), then dV += Pᵀ·dout and dK += dSᵀ·Q (with RoPE, dK in the rotated space,
// which attention_rope_backward undoes).
// Bindings: 1 dqkv, 2 qkv, 3 dout [B, T, C], 4 lse, 5 delta, 6 dropout key, 7 rotary table.
// Grid: (T / 64, B * KVH, HS / 64).
@compute @workgroup_size(256)
fn attention_backward_kv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let scale = wordf(3u);
    let nh = word(2u);
    let kvh = word(7u);
    let group = nh / kvh;
    // The thread's rows are keys.
    let tb = block_place(lid);
    let r0 = wid.x * 64u;
    let jv = block_rows(r0, tb);
    let zero = vec4<f32>(0.0);
    var dk = Block4(zero, zero, zero, zero);
    var dv = Block4(zero, zero, zero, zero);
    let b = wid.y / kvh;
    let first = (wid.y % kvh) * group;
    for (var n = 0u; n < group; n++) {
        let g = BlockGroup(b, first + n, b * nh + first + n, r0, wid.z);
        for (var i0 = g.r0; i0 < word(1u); i0 += 64u) {
            var s = Block4(zero, zero, zero, zero);
            var dp = Block4(zero, zero, zero, zero);
            pair_blocks(&s, &dp, vec4<u32>(1u, 0u, 2u, 3u), g, i0, lid);
            // The block's queries (its columns) and their statistics.
            let iv = block_cols(i0, tb);
            let stats = row_stats(iv, g.bh);
            let r0 = pair_row(s.r0, dp.r0, iv, vec4<u32>(jv.x), stats.lse, stats.delta, g.bh, scale);
            let r1 = pair_row(s.r1, dp.r1, iv, vec4<u32>(jv.y), stats.lse, stats.delta, g.bh, scale);
            let r2 = pair_row(s.r2, dp.r2, iv, vec4<u32>(jv.z), stats.lse, stats.delta, g.bh, scale);
            let r3 = pair_row(s.r3, dp.r3, iv, vec4<u32>(jv.w), stats.lse, stats.delta, g.bh, scale);
            var p = Block4(r0.p, r1.p, r2.p, r3.p);
            var ds = Block4(r0.ds, r1.ds, r2.ds, r3.ds);
            block_accumulate(&dv, &p, 3u, g, i0, lid);
            block_accumulate(&dk, &ds, 0u, g, i0, lid);
        }
    }
    // The key/value head's columns (any of its query heads names them).
    let g = BlockGroup(b, first, b * nh + first, r0, wid.z);
    store_block(&dk, 1u, g, lid, vec4<f32>(scale));
    store_block(&dv, 2u, g, lid, vec4<f32>(1.0));
}

// With RoPE, dQ and dK (written in the rotated space by the kernels above) rotated back:
// each thread one pair (d, d + HS/2) of one head row of q or k in dqkv, in place.
// Words: as the other kernels', 0 the rows B * T. Bindings: 1 dqkv, 7 rotary table.
// Grid: ((NH + KVH) * HS / 2 / 64, B * T rows over y and z).
@compute @workgroup_size(64)
fn attention_rope_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
    let row = grid_row(wid, groups);
    let half = HALF_HS;
    let heads = word(2u) + word(7u);
    let e = wid.x * 64u + lid;
    if (row >= word(0u) || e >= heads * half) {
        return;
    }
    let head = e / half;
    let i = e % half;
    let pos = row % word(1u);
    let at = row * (word(2u) + 2u * word(7u)) * HS + head * HS + i;
    let cos = at_rope[pos * HS + i];
    let sin = at_rope[pos * HS + half + i];
    let x = f32(at_1[at]);
    let y = f32(at_1[at + half]);
    at_1[at] = to_elem1(x * cos + y * sin);
    at_1[at + half] = to_elem1(y * cos - x * sin);
}

// One new token (batch 1, sequence 1) at position p = words[4] against the KV cache: its key
// and value written at row p, then each head's softmax over keys ..= p times the values, 64
// keys at a time with a running maximum: each thread scores one key of the chunk, the
// chunk's probabilities meet in workgroup memory, and each thread sums its head dimensions
// (d = lid, lid + 64, ...) over them, reading the values' rows whole across the threads.
// Query head h attends over its key/value head g's cache rows, the keys stored rotated (RoPE).
// Bindings: 1 out [C], 2 qkv [W], 3 lse [NH], 4 keys [T, KVH * HS], 5 values [T, KVH * HS],
// 6 words, 7 rotary table. Words: 2 NH, 3 scale (f32), 7 KVH, 8 RoPE. Grid: (NH, 1, 1).
var<workgroup> decode_p: array<f32, 64>;
// The position, made uniform (the chunks' loop holds barriers).
var<workgroup> decode_pos: u32;

@compute @workgroup_size(64)
fn attention_decode(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let c = word(2u) * HS;
    let kv = word(7u) * HS;
    // This head's key/value head's columns in a cache row.
    let gc = (h / (word(2u) / word(7u))) * HS;
    if (lid == 0u) {
        decode_pos = at_words[4];
    }
    let pos = workgroupUniformLoad(&decode_pos);
    // Every query head of the group writes the same key and value (its own reads need them).
    for (var d = lid; d < HS; d += 64u) {
        at_4[pos * kv + gc + d] = rotated(c + gc, pos, d);
        at_5[pos * kv + gc + d] = f32(at_2[c + kv + gc + d]);
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
                dot = fma(rotated(h * HS, pos, d), at_4[j * kv + gc + d], dot);
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
                    acc = fma(decode_p[jj], at_5[(j0 + jj) * kv + gc + d], acc);
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
