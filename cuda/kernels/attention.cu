// Causal multi-head self-attention over the fused qkv [B, T, W] (core/src/ops/attention.rs,
// shaders/attention.wgsl): q (NH heads), k and v (KVH heads each) side by side, W = (NH + 2
// KVH) HS, query head h reading key/value head h / (NH / KVH). FlashAttention's order on the
// SIMT cores: a block takes up to ROWS query rows of one head (forward, dQ) or of key rows of
// a key/value head (dK and dV, over its query heads in order), and walks the other side in
// tiles staged in shared memory, so that every key (query) row read from memory serves the
// block's rows. A row belongs to `parts` adjacent threads (a power of two), each owning
// up to CHUNKS 4-float chunks of the head's dimensions (chunk part, part + parts, ...): its
// dot products are summed over the row's threads by a fixed butterfly. The softmax is online
// and the probabilities are never stored: backward recomputes them from `lse`. Every output
// element is written by one thread in a fixed order (dQ in its own pass, no atomics). With a
// rotary table `rope` [T, HS] (row p: the cosines of position p's HS/2 angles, then their
// sines; null without RoPE), q and k are rotated as they are read (rotate-half) and
// attention_rope_backward rotates dQ and dK back.

#define ROWS 64      // rows of a block at most, and of a staged tile
#define TILE 4096    // floats of one staged tile (a tile of keys, values, queries or dout)
#define CHUNKS 8     // 4-float chunks of a row per thread: head sizes up to 32 * parts
#define MAX_DIMS 8   // attention_decode's dimensions per lane: head sizes up to 256

// Element d of head row `at` as attention reads it: rotated as position `pos` where `rope`
// is a table (pair d, d + HS/2), else as it is. qkv's elements are f32, or bf16 where a bf16
// run stores them so (the kernels named `*_bf16`, which also write and read `out` in bf16).
template <class T>
__device__ __forceinline__ float rotated(const T* at, int d, int hs, const float* rope, int pos) {
    if (!rope) return as_float(at[d]);
    int half = hs / 2, p = d % half;
    float cs = rope[(long long)pos * hs + p], sn = rope[(long long)pos * hs + half + p];
    return d < half ? as_float(at[d]) * cs - as_float(at[d + half]) * sn : as_float(at[d]) * cs + as_float(at[d - half]) * sn;
}

__device__ __forceinline__ float dropped(Dropout drop, long long bh, int seq, int i, int j) {
    if (!drop.on) return 1.0f;
    return dropout_factor(((unsigned long long)(bh * seq + i)) * seq + j, drop.site, drop.threshold, drop.scale, drop.key);
}

// Threads of a row at head size hs: the power of two that gives each at most 32 dimensions.
__device__ __forceinline__ int row_parts(int hs) {
    int parts = 1;
    while (32 * parts < hs) parts <<= 1;
    return parts;
}

// A block's place: `rows` rows from `first` of head `head` (of `heads`) of batch row `b`
// (blockDim.x / parts rows: the host launches 64 rows, or 256 threads where that is fewer,
// which keeps the backward's registers within a multiprocessor's); this thread's row `r` of
// them and its `part` of the row's dimensions.
struct Place {
    int parts, part, rows, r, b, head, first;
};

__device__ __forceinline__ Place place(int seq, int heads, int hs) {
    Place p;
    p.parts = row_parts(hs);
    p.rows = blockDim.x / p.parts;
    p.part = threadIdx.x % p.parts;
    p.r = threadIdx.x / p.parts;
    int items = (seq + p.rows - 1) / p.rows;
    p.first = (blockIdx.x % items) * p.rows;
    p.head = (blockIdx.x / items) % heads;
    p.b = blockIdx.x / items / heads;
    return p;
}

// The row's sum of a per-thread partial over its `parts` threads (a fixed butterfly).
__device__ __forceinline__ float row_sum(float v, int parts) {
    for (int o = 1; o < parts; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Dimension e (0..3) of chunk k of this thread's share of a row.
__device__ __forceinline__ int dim(Place p, int k, int e) {
    return 4 * (p.part + p.parts * k) + e;
}

// This thread's share of head row `at` (rotated as position `pos` where `rope` is a table),
// zero past the head's `hs` dimensions.
template <class T>
__device__ __forceinline__ void load_share(float (*x)[4], Place p, const T* at, int hs, const float* rope, int pos) {
    for (int k = 0; k < CHUNKS; ++k)
        for (int e = 0; e < 4; ++e) {
            int d = dim(p, k, e);
            x[k][e] = d < hs ? rotated(at, d, hs, rope, pos) : 0.0f;
        }
}

// The dot product of this thread's share `x` with staged row `row`, before the row's threads
// are summed.
__device__ __forceinline__ float dot_share(const float (*x)[4], Place p, const float4* row) {
    float s = 0.0f;
    for (int k = 0; k < CHUNKS; ++k) {
        float4 y = row[p.part + p.parts * k];
        s += x[k][0] * y.x + x[k][1] * y.y + x[k][2] * y.z + x[k][3] * y.w;
    }
    return s;
}

// acc += a * row (this thread's share).
__device__ __forceinline__ void add_share(float (*acc)[4], float a, Place p, const float4* row) {
    for (int k = 0; k < CHUNKS; ++k) {
        float4 y = row[p.part + p.parts * k];
        acc[k][0] += a * y.x;
        acc[k][1] += a * y.y;
        acc[k][2] += a * y.z;
        acc[k][3] += a * y.w;
    }
}

// Stages `count` head rows from `first` (of `seq`) into `tile`, `width` floats each (the
// row's threads' shares: zero past hs, and past the sequence): row j at `base + j * w`,
// rotated as position j where `rope` is a table. Every thread of the block takes part.
template <class T>
__device__ __forceinline__ void stage(float4* tile, const T* base, long long w, int first, int count, int seq, int hs, int width, const float* rope) {
    float* t = (float*)tile;
    for (int e = threadIdx.x; e < count * width; e += blockDim.x) {
        int j = first + e / width, d = e % width;
        t[e] = j < seq && d < hs ? rotated(base + (long long)j * w, d, hs, rope, j) : 0.0f;
    }
}

// Staged rows per tile of `width` floats each.
__device__ __forceinline__ int tile_rows(int width) {
    return TILE / width < ROWS ? TILE / width : ROWS;
}

// A thread's query row i of head `head` (Place) in the forward and dQ passes: its key/value
// head g, qkv's row width w, batch row b's row 0 of qkv `head0`; `valid` where i < seq (the
// last block's spare rows take part in staging and shuffles, and write nothing); the keys it
// reads end before `end`, staged `rows` at a time, `width` floats a row.
template <class T>
struct QueryRow {
    Place p;
    int i, c, g, width, rows, end;
    long long w, bh;
    const T* head0;
    bool valid;
};

template <class T>
__device__ __forceinline__ QueryRow<T> query_row(const T* qkv, int seq, int heads, int kv_heads, int hs) {
    QueryRow<T> q;
    q.p = place(seq, heads, hs);
    q.i = q.p.first + q.p.r;
    q.c = heads * hs;
    q.g = q.p.head / (heads / kv_heads);
    q.width = 4 * CHUNKS * q.p.parts;
    q.rows = tile_rows(q.width);
    q.end = q.p.first + q.p.rows < seq ? q.p.first + q.p.rows : seq;
    q.w = (long long)(heads + 2 * kv_heads) * hs;
    q.bh = (long long)q.p.b * heads + q.p.head;
    q.head0 = qkv + (long long)q.p.b * seq * q.w;
    q.valid = q.i < seq;
    return q;
}

// Stages the tile of keys (rotated) and values of q's key/value head from key k0; the count
// staged.
template <class T>
__device__ __forceinline__ int stage_keys_values(float4* keys, float4* values, QueryRow<T> q, int k0, int seq, int heads, int kv_heads, int hs, const float* rope) {
    int count = q.end - k0 < q.rows ? q.end - k0 : q.rows;
    __syncthreads();
    stage(keys, q.head0 + q.c + q.g * hs, q.w, k0, count, seq, hs, q.width, rope);
    stage(values, q.head0 + q.c + kv_heads * hs + q.g * hs, q.w, k0, count, seq, hs, q.width, 0);
    __syncthreads();
    return count;
}

// out = dropout(softmax(q k^T * scale, causal)) v per head; lse [B, NH, T]. A block per
// Place's rows of queries of a head, the keys up to its last query staged tile by tile.
template <class T>
__device__ void simt_forward(T* out, float* lse, const T* qkv, const float* rope, int seq, int heads, int kv_heads, int hs, float scale, DropoutSite dropout) {
    Dropout drop = load_dropout(dropout);
    __shared__ float4 keys[TILE / 4], values[TILE / 4];
    QueryRow<T> r = query_row(qkv, seq, heads, kv_heads, hs);
    Place p = r.p;
    int i = r.i, at = r.valid ? i : 0;
    float q[CHUNKS][4], o[CHUNKS][4];
    load_share(q, p, r.head0 + at * r.w + p.head * hs, hs, rope, at);
    for (int k = 0; k < CHUNKS; ++k) o[k][0] = o[k][1] = o[k][2] = o[k][3] = 0.0f;
    float m = NEG_INF, l = 0.0f;
    for (int k0 = 0; k0 < r.end; k0 += r.rows) {
        int count = stage_keys_values(keys, values, r, k0, seq, heads, kv_heads, hs, rope);
        for (int jj = 0; jj < count; ++jj) {
            int j = k0 + jj;
            float s = row_sum(dot_share(q, p, keys + jj * r.width / 4), p.parts) * scale;
            if (!(r.valid && j <= i)) continue;
            if (s > m) {
                float corr = expf(m - s);
                l *= corr;
                for (int k = 0; k < CHUNKS; ++k) o[k][0] *= corr, o[k][1] *= corr, o[k][2] *= corr, o[k][3] *= corr;
                m = s;
            }
            float e = expf(s - m);
            l += e;
            add_share(o, e * dropped(drop, r.bh, seq, i, j), p, values + jj * r.width / 4);
        }
    }
    if (!r.valid) return;
    float inv = 1.0f / l;
    T* orow = out + ((long long)p.b * seq + i) * r.c + p.head * hs;
    for (int k = 0; k < CHUNKS; ++k)
        for (int e = 0; e < 4; ++e)
            if (dim(p, k, e) < hs) store(&orow[dim(p, k, e)], o[k][e] * inv);
    if (p.part == 0) lse[r.bh * seq + i] = m + logf(l);
}

// dQ of each query row, and delta = rowsum(dO * O) [B, NH, T] for the key pass: a block per
// Place's rows of queries of a head, the keys and values up to its last query staged tile by tile.
// With RoPE, dQ is left in the rotated space (attention_rope_backward rotates it back).
template <class T>
__device__ void simt_backward_query(float* dqkv, float* delta, const float* dout, const T* qkv, const T* out, const float* lse, const float* rope, int seq,
                                    int heads, int kv_heads, int hs, float scale, DropoutSite dropout) {
    Dropout drop = load_dropout(dropout);
    __shared__ float4 keys[TILE / 4], values[TILE / 4];
    QueryRow<T> r = query_row(qkv, seq, heads, kv_heads, hs);
    Place p = r.p;
    int i = r.i, at = r.valid ? i : 0;
    long long orow = ((long long)p.b * seq + at) * r.c + p.head * hs;
    float q[CHUNKS][4], d_o[CHUNKS][4], o[CHUNKS][4], dq[CHUNKS][4];
    load_share(q, p, r.head0 + at * r.w + p.head * hs, hs, rope, at);
    load_share(d_o, p, dout + orow, hs, 0, 0);
    load_share(o, p, out + orow, hs, 0, 0);
    float dl = 0.0f;
    for (int k = 0; k < CHUNKS; ++k) {
        dl += d_o[k][0] * o[k][0] + d_o[k][1] * o[k][1] + d_o[k][2] * o[k][2] + d_o[k][3] * o[k][3];
        dq[k][0] = dq[k][1] = dq[k][2] = dq[k][3] = 0.0f;
    }
    dl = row_sum(dl, p.parts);
    float li = r.valid ? lse[r.bh * seq + i] : 0.0f;
    for (int k0 = 0; k0 < r.end; k0 += r.rows) {
        int count = stage_keys_values(keys, values, r, k0, seq, heads, kv_heads, hs, rope);
        for (int jj = 0; jj < count; ++jj) {
            int j = k0 + jj;
            float s = row_sum(dot_share(q, p, keys + jj * r.width / 4), p.parts);
            float dp = row_sum(dot_share(d_o, p, values + jj * r.width / 4), p.parts);
            if (!(r.valid && j <= i)) continue;
            float e = expf(s * scale - li);
            float ds = e * (dp * dropped(drop, r.bh, seq, i, j) - dl) * scale;
            add_share(dq, ds, p, keys + jj * r.width / 4);
        }
    }
    if (!r.valid) return;
    float* dqrow = dqkv + ((long long)p.b * seq + i) * r.w + p.head * hs;
    for (int k = 0; k < CHUNKS; ++k)
        for (int e = 0; e < 4; ++e)
            if (dim(p, k, e) < hs) dqrow[dim(p, k, e)] = dq[k][e];
    if (p.part == 0) delta[r.bh * seq + i] = dl;
}

// dK and dV of each key row of a key/value head g, from the queries that see its keys staged
// tile by tile (with their lse and delta). Without `partials` (one query head to each key/value
// head), a block per Place's rows of keys of head g into dqkv; with grouped heads, a block per
// rows of keys of one query head h (of g's), its share into `partials` [B, T, NH, 2, HS] (dK,
// then dV), which attention_sum_key_value adds over g's query heads in order: the group's
// heads spread over more blocks. With RoPE, dK is left in the rotated space.
template <class T>
__device__ void simt_backward_key_value(float* dqkv, float* partials, const float* dout, const T* qkv, const float* lse, const float* delta,
                                        const float* rope, int seq, int heads, int kv_heads, int hs, float scale, DropoutSite dropout) {
    Dropout drop = load_dropout(dropout);
    __shared__ float4 queries[TILE / 4], douts[TILE / 4];
    __shared__ float tile_lse[ROWS], tile_delta[ROWS];
    int group = heads / kv_heads;
    Place p = place(seq, partials ? heads : kv_heads, hs);
    int i = p.first + p.r, g = partials ? p.head / group : p.head, c = heads * hs, width = 4 * CHUNKS * p.parts, rows = tile_rows(width);
    long long w = (long long)(heads + 2 * kv_heads) * hs;
    int kv0 = c + g * hs, v0 = c + kv_heads * hs + g * hs;
    const T* head0 = qkv + (long long)p.b * seq * w;
    bool valid = i < seq;
    int at = valid ? i : 0;
    float kr[CHUNKS][4], vr[CHUNKS][4], dk[CHUNKS][4], dv[CHUNKS][4];
    load_share(kr, p, head0 + at * w + kv0, hs, rope, at);
    load_share(vr, p, head0 + at * w + v0, hs, 0, 0);
    for (int k = 0; k < CHUNKS; ++k) dk[k][0] = dk[k][1] = dk[k][2] = dk[k][3] = dv[k][0] = dv[k][1] = dv[k][2] = dv[k][3] = 0.0f;
    int h_end = partials ? p.head + 1 : (g + 1) * group;
    for (int h = partials ? p.head : g * group; h < h_end; ++h) {
        long long bh = (long long)p.b * heads + h;
        for (int q0 = p.first; q0 < seq; q0 += rows) {
            int count = seq - q0 < rows ? seq - q0 : rows;
            __syncthreads();
            stage(queries, head0 + h * hs, w, q0, count, seq, hs, width, rope);
            stage(douts, dout + (long long)p.b * seq * c + h * hs, c, q0, count, seq, hs, width, 0);
            for (int e = threadIdx.x; e < count; e += blockDim.x) {
                tile_lse[e] = lse[bh * seq + q0 + e];
                tile_delta[e] = delta[bh * seq + q0 + e];
            }
            __syncthreads();
            for (int jj = 0; jj < count; ++jj) {
                int qi = q0 + jj;
                float s = row_sum(dot_share(kr, p, queries + jj * width / 4), p.parts);
                float dp = row_sum(dot_share(vr, p, douts + jj * width / 4), p.parts);
                if (!(valid && qi >= i)) continue;
                float e = expf(s * scale - tile_lse[jj]);
                float f = dropped(drop, bh, seq, qi, i);
                float ds = e * (dp * f - tile_delta[jj]) * scale;
                add_share(dv, e * f, p, douts + jj * width / 4);
                add_share(dk, ds, p, queries + jj * width / 4);
            }
        }
    }
    if (!valid) return;
    float* drow = dqkv + ((long long)p.b * seq + i) * w;
    int k_at = kv0, v_at = v0;
    if (partials) {
        drow = partials + (((long long)p.b * seq + i) * heads + p.head) * 2 * hs;
        k_at = 0;
        v_at = hs;
    }
    for (int k = 0; k < CHUNKS; ++k)
        for (int e = 0; e < 4; ++e) {
            int d = dim(p, k, e);
            if (d < hs) {
                drow[k_at + d] = dk[k][e];
                drow[v_at + d] = dv[k][e];
            }
        }
}

// The SIMT kernels' entry points: `attention_*` over f32 qkv and out, `attention_*_bf16` over
// bf16 ones.
#define SIMT_ATTENTION(SUFFIX, T)                                                                                                                       \
    extern "C" __global__ void attention_forward##SUFFIX(T* out, float* lse, const T* qkv, const float* rope, int batch, int seq, int heads,         \
                                                         int kv_heads, int hs, float scale, DropoutSite dropout) {                                      \
        simt_forward(out, lse, qkv, rope, seq, heads, kv_heads, hs, scale, dropout);                                                                   \
    }                                                                                                                                                   \
    extern "C" __global__ void attention_backward_query##SUFFIX(float* dqkv, float* delta, const float* dout, const T* qkv, const T* out,            \
                                                                const float* lse, const float* rope, int batch, int seq, int heads, int kv_heads,      \
                                                                int hs, float scale, DropoutSite dropout) {                                            \
        simt_backward_query(dqkv, delta, dout, qkv, out, lse, rope, seq, heads, kv_heads, hs, scale, dropout);                                        \
    }                                                                                                                                                   \
    extern "C" __global__ void attention_backward_key_value##SUFFIX(float* dqkv, float* partials, const float* dout, const T* qkv, const float* lse,  \
                                                                    const float* delta, const float* rope, int batch, int seq, int heads,              \
                                                                    int kv_heads, int hs, float scale, DropoutSite dropout) {                          \
        simt_backward_key_value(dqkv, partials, dout, qkv, lse, delta, rope, seq, heads, kv_heads, hs, scale, dropout);                               \
    }

SIMT_ATTENTION(, float)
SIMT_ATTENTION(_bf16, unsigned short)

// Grouped heads' dK and dV: each key/value head's rows summed over its query heads' shares in
// `partials` [B, T, NH, 2, HS] in order, into dqkv [B, T, W]; a thread per (row, key/value
// head, dimension of dK then dV).
extern "C" __global__ void attention_sum_key_value(float* dqkv, const float* partials, int rows, int heads, int kv_heads, int hs) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x, per_row = (long long)kv_heads * 2 * hs;
    if (idx >= rows * per_row) return;
    long long r = idx / per_row;
    int g = (int)(idx % per_row) / (2 * hs), e = (int)(idx % per_row) % (2 * hs), group = heads / kv_heads;
    const float* share = partials + (r * heads + (long long)g * group) * 2 * hs + e;
    float sum = share[0];
    for (int h = 1; h < group; ++h) sum += share[(long long)h * 2 * hs];
    int column = heads * hs + (e < hs ? g * hs + e : kv_heads * hs + g * hs + e - hs);
    dqkv[r * (heads + 2 * kv_heads) * hs + column] = sum;
}

// RoPE's gradient: dQ and dK of every row of dqkv [B, T, W] rotated back in place, one thread
// per pair (d, d + HS/2) of each of the NH + KVH heads of a row.
extern "C" __global__ void attention_rope_backward(float* dqkv, const float* rope, int rows, int seq, int heads, int kv_heads, int hs) {
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int half = hs / 2, pairs = (heads + kv_heads) * half;
    if (e >= (long long)rows * pairs) return;
    int r = (int)(e / pairs), head = (int)(e % pairs) / half, p = (int)(e % pairs) % half, pos = r % seq;
    float* at = dqkv + (long long)r * (heads + 2 * kv_heads) * hs + head * hs + p;
    float cs = rope[(long long)pos * hs + p], sn = rope[(long long)pos * hs + half + p];
    float x = at[0], y = at[half];
    at[0] = x * cs + y * sn;
    at[half] = y * cs - x * sn;
}

// A row's dimensions d = lane + 32k of a warp's lane (attention_decode's layout), rotated as
// position `pos` where `rope` is a table.
__device__ __forceinline__ void load_rotated(float* r, const float* at, int lane, int hs, const float* rope, int pos) {
    for (int k = 0; k < MAX_DIMS; ++k) {
        int d = lane + WARP * k;
        r[k] = d < hs ? rotated(at, d, hs, rope, pos) : 0.0f;
    }
}

// The dot product of a warp's row (load_rotated's layout) with row `at`, in every lane.
__device__ __forceinline__ float dot_dims(const float* r, const float* at, int lane, int hs) {
    float s = 0.0f;
    for (int k = 0; k < MAX_DIMS; ++k) {
        int d = lane + WARP * k;
        if (d < hs) s += r[k] * at[d];
    }
    return warp_sum(s);
}

// One token at position `pos` against a layer's cache (keys then values, [len, KVH * HS]
// each, the keys rotated with RoPE): its key and value are stored at `pos` (by every query
// head of the key/value head, the same values), then each head (one warp) attends over keys
// ..= pos. Each lane reads and writes only its own dimensions, so no lane waits for another.
extern "C" __global__ void attention_decode(float* out, float* lse, float* keys, float* values, const float* qkv, const float* rope, int pos, int heads,
                                            int kv_heads, int hs, float scale) {
    int h = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (h >= heads) return;
    int c = heads * hs, kvc = kv_heads * hs, gc = (h / (heads / kv_heads)) * hs;
    float q[MAX_DIMS], o[MAX_DIMS];
    load_rotated(q, qkv + h * hs, lane, hs, rope, pos);
    for (int k = 0; k < MAX_DIMS; ++k) {
        int d = lane + WARP * k;
        o[k] = 0.0f;
        if (d < hs) {
            keys[(long long)pos * kvc + gc + d] = rotated(qkv + c + gc, d, hs, rope, pos);
            values[(long long)pos * kvc + gc + d] = qkv[c + kvc + gc + d];
        }
    }
    float m = NEG_INF, l = 0.0f;
    for (int j = 0; j <= pos; ++j) {
        float s = dot_dims(q, keys + (long long)j * kvc + gc, lane, hs) * scale;
        float m_new = fmaxf(m, s);
        float corr = expf(m - m_new), p = expf(s - m_new);
        l = l * corr + p;
        const float* vj = values + (long long)j * kvc + gc;
        for (int k = 0; k < MAX_DIMS; ++k) {
            int d = lane + WARP * k;
            if (d < hs) o[k] = o[k] * corr + p * vj[d];
        }
        m = m_new;
    }
    float inv = 1.0f / l;
    for (int k = 0; k < MAX_DIMS; ++k) {
        int d = lane + WARP * k;
        if (d < hs) out[h * hs + d] = o[k] * inv;
    }
    if (lane == 0) lse[h] = m + logf(l);
}

// ---- On the tensor cores: heads of 16 to 64 dimensions in steps of 16 (sm_80 and later) ----
// FlashAttention-2's order with f32 sums: a block of 4 warps takes TC_ROWS query rows of a head
// (forward, dQ) or key rows of a key/value head (dK and dV, over its query heads in order), 16
// rows a warp, and walks the other side in tiles staged in shared memory (q and k rotated as
// they are read). Scores and their gradients stay in registers in the products' accumulator
// layout, which is the next product's A operand (rows g and g + 8 of a warp's 16 in each lane,
// a row's values over the 4 lanes of a quad). Deterministic: every output element is summed by
// one warp in a fixed order; dQ in its own pass, no atomics. Two kinds of operands, the
// kernels' `Op`:
// - Bf16Operands (bf16 runs): tiles staged as bf16, mma.m16n8k16; the probabilities and their
//   gradients rounded to bf16 as the CPU's bf16 attention rounds them (core/src/ops/attention.rs).
// - SplitTf32 (f32 runs): tiles staged as f32, every operand split where it is used into two
//   TF32 parts, x = big + small (big = tf32(x), small = tf32(x - big)), and a · b summed as
//   small · big + big · small + big · big by mma.m16n8k8 ("3xTF32"): within a few f32
//   roundings, as PyTorch's memory-efficient attention runs fp32 from sm_80 (CUTLASS's
//   OpMultiplyAddFastF32).
// A lane (4 g + t) holds the same elements under both: of a 16 x 16 A step, rows g and g + 8 at
// columns 2t, 2t + 1, 2t + 8 and 2t + 9, as `float a[8]` (a[0], a[1]: row g at 2t, 2t + 1;
// a[2], a[3]: row g + 8 there; a[4..8): the same at 2t + 8, 2t + 9); of a 16 x 8 B step, column
// g at rows 2t, 2t + 1, 2t + 8 and 2t + 9 (`b[4]`). mma.m16n8k16 takes exactly these; two
// m16n8k8 steps take them as the columns (2t, 2t + 8) and then (2t + 1, 2t + 9): an order of
// the sum that A and B follow alike.

#define TC_ROWS 64    // rows of a block: 4 warps of 16
#define TC_STEPS 4    // 16-dimension steps of a head at most (head sizes up to 64)

// bf16 operands, f32 sums: mma.m16n8k16.
struct Bf16Operands {
    typedef unsigned short Staged;
    // Rows of a staged tile (of dK and dV's); elements between a tile's rows (64 and 8 of
    // padding: no bank conflicts).
    enum { TILE_ROWS = 64, KEY_VALUE_TILE_ROWS = 64, ROW_STRIDE = 72 };
    struct A {
        unsigned r[4];
    };
    typedef A Ready;  // an A step as the products take it
    struct B {
        unsigned r[2];
    };
    __device__ static Staged stage(float x) { return to_bf16(x); }
    __device__ static A a(const float* x) { return A{{pack_bf16(x[0], x[1]), pack_bf16(x[2], x[3]), pack_bf16(x[4], x[5]), pack_bf16(x[6], x[7])}}; }
    __device__ static Ready ready(const A& a) { return a; }
    __device__ static B b(Staged b0, Staged b1, Staged b2, Staged b3) {
        return B{{(unsigned)b0 | ((unsigned)b1 << 16), (unsigned)b2 | ((unsigned)b3 << 16)}};
    }
    __device__ static void mma(float* d, const Ready& a, const B& b) { mma_bf16(d, a.r, b.r); }
};

// f32 operands split in two TF32 parts each, three mma.m16n8k8 products per step. Smaller tiles
// than the bf16 kernels' (half, a quarter in dK and dV's, whose warps also hold K, V and both
// gradients): an f32 operand takes twice a bf16 one's registers, and past 255 a kernel spills.
struct SplitTf32 {
    typedef float Staged;
    enum { TILE_ROWS = 32, KEY_VALUE_TILE_ROWS = 16, ROW_STRIDE = 72 };
    struct A {
        float x[8];
    };
    struct Ready {
        unsigned big[8], small[8];
    };
    struct B {
        float y[4];
    };
    __device__ static Staged stage(float x) { return x; }
    __device__ static A a(const float* x) {
        A r;
        #pragma unroll
        for (int e = 0; e < 8; ++e) r.x[e] = x[e];
        return r;
    }
    __device__ static void split(float x, unsigned* big, unsigned* small) {
        *big = to_tf32(x);
        *small = to_tf32(x - __uint_as_float(*big));
    }
    __device__ static Ready ready(const A& a) {
        Ready r;
        #pragma unroll
        for (int e = 0; e < 8; ++e) split(a.x[e], &r.big[e], &r.small[e]);
        return r;
    }
    __device__ static B b(Staged b0, Staged b1, Staged b2, Staged b3) { return B{{b0, b1, b2, b3}}; }
    __device__ static void mma(float* d, const Ready& a, const B& b) {
        unsigned big[4], small[4];
        #pragma unroll
        for (int e = 0; e < 4; ++e) split(b.y[e], &big[e], &small[e]);
        #pragma unroll
        for (int s = 0; s < 2; ++s) {
            unsigned a_big[4] = {a.big[s], a.big[2 + s], a.big[4 + s], a.big[6 + s]};
            unsigned a_small[4] = {a.small[s], a.small[2 + s], a.small[4 + s], a.small[6 + s]};
            unsigned b_big[2] = {big[s], big[2 + s]}, b_small[2] = {small[s], small[2 + s]};
            mma_tf32(d, a_small, b_big);
            mma_tf32(d, a_big, b_small);
            mma_tf32(d, a_big, b_big);
        }
    }
};

// Rows [first, first + R) of a head into `tile`: element d of row j at `base + j * w +
// d`, rotated as position j where `rope` is a table; zero past `seq`. Every thread of the block
// takes part.
template <class Op, int R, class T>
__device__ __forceinline__ void stage_tile(typename Op::Staged* tile, const T* base, long long w, int first, int seq, int hs, const float* rope) {
    for (int e = threadIdx.x; e < R * hs; e += blockDim.x) {
        int jj = e / hs, d = e % hs, j = first + jj;
        tile[jj * Op::ROW_STRIDE + d] = Op::stage(j < seq ? rotated(base + (long long)j * w, d, hs, rope, j) : 0.0f);
    }
}

// A warp's A operand for its rows row0 + g and row0 + g + 8 (zero past `seq`) straight from
// memory: element d of row i at `base + i * w + d`, rotated where `rope` is a table; a[kk] holds
// dimensions 16 kk to 16 kk + 15.
template <class Op, class T>
__device__ __forceinline__ void load_rows_a(typename Op::A* a, const T* base, long long w, int row0, int seq, int hs, const float* rope) {
    int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    #pragma unroll
    for (int kk = 0; kk < TC_STEPS; ++kk) {
        float x[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
            int i = row0 + g + 8 * half;
            if (16 * kk < hs && i < seq)
                #pragma unroll
                for (int e = 0; e < 4; ++e)
                    x[2 * half + e % 2 + 4 * (e / 2)] = rotated(base + (long long)i * w, 16 * kk + 2 * t + e % 2 + 8 * (e / 2), hs, rope, i);
        }
        a[kk] = Op::a(x);
    }
}

// The B operand of a product with a staged tile's rows as its columns (`tile` row n0 + g,
// dimensions 16 kk + 2t...): scores against keys, dP against values.
template <class Op>
__device__ __forceinline__ typename Op::B tile_rows_b(const typename Op::Staged* tile, int n0, int kk) {
    int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    const typename Op::Staged* row = tile + (n0 + g) * Op::ROW_STRIDE + 16 * kk + 2 * t;
    return Op::b(row[0], row[1], row[8], row[9]);
}

// The B operand of a product summing over a staged tile's rows (rows 16 kk + 2t..., column
// n0 + g of the head's dimensions): P · V, dS · K, and their transposes' partners.
template <class Op>
__device__ __forceinline__ typename Op::B tile_columns_b(const typename Op::Staged* tile, int kk, int n0) {
    int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    const typename Op::Staged* col = tile + (16 * kk + 2 * t) * Op::ROW_STRIDE + n0 + g;
    return Op::b(col[0], col[Op::ROW_STRIDE], col[8 * Op::ROW_STRIDE], col[9 * Op::ROW_STRIDE]);
}

// acc [16 x 8 tile n] = a · the staged tile's rows 8n... (their dimensions summed): a warp's
// scores (or dP) against R staged rows.
template <class Op, int R>
__device__ __forceinline__ void against_tile(float (*acc)[4], const typename Op::A* a, const typename Op::Staged* tile, int hs) {
    #pragma unroll
    for (int n = 0; n < R / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    #pragma unroll
    for (int kk = 0; kk < TC_STEPS; ++kk)
        if (16 * kk < hs) {
            typename Op::Ready r = Op::ready(a[kk]);
            #pragma unroll
            for (int n = 0; n < R / 8; ++n) Op::mma(acc[n], r, tile_rows_b<Op>(tile, 8 * n, kk));
        }
}

// out [16 x hs] += x · the staged tile (x [16 x R] in the accumulator layout, the A operand as
// it stands: rounded to bf16, or split): P · V, dS · K.
template <class Op, int R>
__device__ __forceinline__ void times_tile(float (*out)[4], const float (*x)[4], const typename Op::Staged* tile, int hs) {
    #pragma unroll
    for (int kk = 0; kk < R / 16; ++kk) {
        const float* lo = x[2 * kk];
        const float* hi = x[2 * kk + 1];
        float step[8] = {lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]};
        typename Op::Ready r = Op::ready(Op::a(step));
        #pragma unroll
        for (int n = 0; n < 2 * TC_STEPS; ++n)
            if (8 * n < hs) Op::mma(out[n], r, tile_columns_b<Op>(tile, kk, 8 * n));
    }
}

// `v` summed (or maxed) over the 4 lanes that hold a row's values (a fixed butterfly).
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// A block's place in the tensor-core kernels: rows [first, first + TC_ROWS) of head `head`
// (of `heads`) of batch row `b`; the warp's rows start at `row0`.
struct TensorPlace {
    int first, head, b, row0;
};

__device__ __forceinline__ TensorPlace tensor_place(int seq, int heads) {
    int items = (seq + TC_ROWS - 1) / TC_ROWS;
    TensorPlace p;
    p.first = (blockIdx.x % items) * TC_ROWS;
    p.head = (blockIdx.x / items) % heads;
    p.b = blockIdx.x / items / heads;
    p.row0 = p.first + 16 * (threadIdx.x / 32);
    return p;
}

// The forward's and dQ's block of query rows (TensorPlace) of head `head`: its key/value head
// `kv`, qkv's row width `w`, batch row b's row 0 of qkv `head0`; the keys it reads end before
// `end`.
template <class T>
struct TensorQueries {
    TensorPlace p;
    int kv, end;
    long long w, bh;
    const T* head0;
};

template <class T>
__device__ __forceinline__ TensorQueries<T> tensor_queries(const T* qkv, int seq, int heads, int kv_heads, int hs) {
    TensorQueries<T> r;
    r.p = tensor_place(seq, heads);
    r.kv = r.p.head / (heads / kv_heads);
    r.end = r.p.first + TC_ROWS < seq ? r.p.first + TC_ROWS : seq;
    r.w = (long long)(heads + 2 * kv_heads) * hs;
    r.bh = (long long)r.p.b * heads + r.p.head;
    r.head0 = qkv + (long long)r.p.b * seq * r.w;
    return r;
}

// Stages the tile of keys (rotated) and values of r's key/value head from key k0.
template <class Op, class T>
__device__ __forceinline__ void stage_key_value_tile(typename Op::Staged* keys, typename Op::Staged* values, TensorQueries<T> r, int k0, int seq,
                                                     int heads, int kv_heads, int hs, const float* rope) {
    const T* keys0 = r.head0 + heads * hs + r.kv * hs;
    __syncthreads();
    stage_tile<Op, Op::TILE_ROWS>(keys, keys0, r.w, k0, seq, hs, rope);
    stage_tile<Op, Op::TILE_ROWS>(values, keys0 + kv_heads * hs, r.w, k0, seq, hs, 0);
    __syncthreads();
}

// As attention_forward, on the tensor cores: a block per TC_ROWS queries of a head; a warp
// skips the key tiles past its last query.
template <class Op, class T>
__device__ void tensor_forward(T* out, float* lse, const T* qkv, const float* rope, int seq, int heads, int kv_heads, int hs, float scale,
                               DropoutSite dropout) {
    Dropout drop = load_dropout(dropout);
    __shared__ typename Op::Staged keys[Op::TILE_ROWS * Op::ROW_STRIDE], values[Op::TILE_ROWS * Op::ROW_STRIDE];
    TensorQueries<T> r = tensor_queries(qkv, seq, heads, kv_heads, hs);
    TensorPlace p = r.p;
    int t = threadIdx.x % 4, g = threadIdx.x % 32 / 4, c = heads * hs;
    long long bh = r.bh;
    typename Op::A q[TC_STEPS];
    load_rows_a<Op>(q, r.head0 + p.head * hs, r.w, p.row0, seq, hs, rope);
    float o[2 * TC_STEPS][4] = {}, m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    for (int k0 = 0; k0 < r.end; k0 += Op::TILE_ROWS) {
        stage_key_value_tile<Op>(keys, values, r, k0, seq, heads, kv_heads, hs, rope);
        if (k0 > p.row0 + 15) continue;
        float s[Op::TILE_ROWS / 8][4];
        against_tile<Op, Op::TILE_ROWS>(s, q, keys, hs);
        #pragma unroll
        for (int half = 0; half < 2; ++half) {
            int i = p.row0 + g + 8 * half;
            float mx = m[half];
            #pragma unroll
            for (int n = 0; n < Op::TILE_ROWS / 8; ++n)
                #pragma unroll
                for (int e = 0; e < 2; ++e) {
                    int j = k0 + 8 * n + 2 * t + e;
                    float v = i < seq && j <= i ? s[n][2 * half + e] * scale : NEG_INF;
                    s[n][2 * half + e] = v;
                    mx = fmaxf(mx, v);
                }
            mx = quad_max(mx);
            if (mx == NEG_INF) continue;  // no key of this row yet (a row past the sequence)
            float corr = expf(m[half] - mx);
            m[half] = mx;
            l[half] *= corr;
            #pragma unroll
            for (int n = 0; n < 2 * TC_STEPS; ++n) o[n][2 * half] *= corr, o[n][2 * half + 1] *= corr;
            #pragma unroll
            for (int n = 0; n < Op::TILE_ROWS / 8; ++n)
                #pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float v = s[n][2 * half + e], pr = v == NEG_INF ? 0.0f : expf(v - mx);
                    l[half] += pr;
                    s[n][2 * half + e] = pr * dropped(drop, bh, seq, i, k0 + 8 * n + 2 * t + e);
                }
        }
        // Rows with no key yet keep -inf scores: zero probabilities.
        #pragma unroll
        for (int n = 0; n < Op::TILE_ROWS / 8; ++n)
            #pragma unroll
            for (int e = 0; e < 4; ++e)
                if (s[n][e] == NEG_INF) s[n][e] = 0.0f;
        times_tile<Op, Op::TILE_ROWS>(o, s, values, hs);
    }
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
        int i = p.row0 + g + 8 * half;
        float sum = quad_sum(l[half]);
        if (i >= seq) continue;
        T* orow = out + ((long long)p.b * seq + i) * c + p.head * hs;
        #pragma unroll
        for (int n = 0; n < 2 * TC_STEPS; ++n)
            if (8 * n < hs) {
                store(&orow[8 * n + 2 * t], o[n][2 * half] / sum);
                store(&orow[8 * n + 2 * t + 1], o[n][2 * half + 1] / sum);
            }
        if (t == 0) lse[bh * seq + i] = m[half] + logf(sum);
    }
}

// As attention_backward_query, on the tensor cores: dQ (rotated space) and delta of each
// query row, a block per TC_ROWS queries of a head.
template <class Op, class T>
__device__ void tensor_backward_query(float* dqkv, float* delta, const float* dout, const T* qkv, const T* out, const float* lse, const float* rope,
                                      int seq, int heads, int kv_heads, int hs, float scale, DropoutSite dropout) {
    Dropout drop = load_dropout(dropout);
    __shared__ typename Op::Staged keys[Op::TILE_ROWS * Op::ROW_STRIDE], values[Op::TILE_ROWS * Op::ROW_STRIDE];
    TensorQueries<T> r = tensor_queries(qkv, seq, heads, kv_heads, hs);
    TensorPlace p = r.p;
    int t = threadIdx.x % 4, g = threadIdx.x % 32 / 4, c = heads * hs;
    long long bh = r.bh;
    const float* dout0 = dout + (long long)p.b * seq * c + p.head * hs;
    typename Op::A q[TC_STEPS], d_o[TC_STEPS];
    load_rows_a<Op>(q, r.head0 + p.head * hs, r.w, p.row0, seq, hs, rope);
    load_rows_a<Op>(d_o, dout0, c, p.row0, seq, hs, 0);
    // delta = rowsum(dO * O) in f32, each lane over the dimensions its A operand holds.
    float dl[2], li[2];
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
        int i = p.row0 + g + 8 * half;
        float v = 0.0f;
        if (i < seq) {
            const T* orow = out + ((long long)p.b * seq + i) * c + p.head * hs;
            const float* drow = dout0 + (long long)i * c;
            #pragma unroll
            for (int kk = 0; kk < TC_STEPS; ++kk)
                if (16 * kk < hs)
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        int d = 16 * kk + 2 * t + e % 2 + 8 * (e / 2);
                        v += drow[d] * as_float(orow[d]);
                    }
        }
        dl[half] = quad_sum(v);
        li[half] = i < seq ? lse[bh * seq + i] : 0.0f;
        if (i < seq && t == 0) delta[bh * seq + i] = dl[half];
    }
    float dq[2 * TC_STEPS][4] = {};
    for (int k0 = 0; k0 < r.end; k0 += Op::TILE_ROWS) {
        stage_key_value_tile<Op>(keys, values, r, k0, seq, heads, kv_heads, hs, rope);
        if (k0 > p.row0 + 15) continue;
        float s[Op::TILE_ROWS / 8][4], dp[Op::TILE_ROWS / 8][4];
        against_tile<Op, Op::TILE_ROWS>(s, q, keys, hs);
        against_tile<Op, Op::TILE_ROWS>(dp, d_o, values, hs);
        #pragma unroll
        for (int n = 0; n < Op::TILE_ROWS / 8; ++n)
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                int half = e / 2, i = p.row0 + g + 8 * half, j = k0 + 8 * n + 2 * t + e % 2;
                float ds = 0.0f;
                if (i < seq && j <= i) {
                    float pr = expf(s[n][e] * scale - li[half]);
                    ds = pr * (dp[n][e] * dropped(drop, bh, seq, i, j) - dl[half]) * scale;
                }
                s[n][e] = ds;
            }
        times_tile<Op, Op::TILE_ROWS>(dq, s, keys, hs);
    }
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
        int i = p.row0 + g + 8 * half;
        if (i >= seq) continue;
        float* dqrow = dqkv + ((long long)p.b * seq + i) * r.w + p.head * hs;
        #pragma unroll
        for (int n = 0; n < 2 * TC_STEPS; ++n)
            if (8 * n < hs) {
                dqrow[8 * n + 2 * t] = dq[n][2 * half];
                dqrow[8 * n + 2 * t + 1] = dq[n][2 * half + 1];
            }
    }
}

// As attention_backward_key_value, on the tensor cores: dK (rotated space) and dV of each key
// row of a key/value head, a block per TC_ROWS keys, over the query tiles from the block's
// first key: of its query heads in order, or with `partials` (grouped heads) of one query
// head, into its share of `partials`.
template <class Op, class T>
__device__ void tensor_backward_key_value(float* dqkv, float* partials, const float* dout, const T* qkv, const float* lse, const float* delta,
                                          const float* rope, int seq, int heads, int kv_heads, int hs, float scale, DropoutSite dropout) {
    enum { KV_ROWS = Op::KEY_VALUE_TILE_ROWS };
    Dropout drop = load_dropout(dropout);
    __shared__ typename Op::Staged queries[KV_ROWS * Op::ROW_STRIDE], douts[KV_ROWS * Op::ROW_STRIDE];
    __shared__ float tile_lse[KV_ROWS], tile_delta[KV_ROWS];
    int group = heads / kv_heads;
    TensorPlace p = tensor_place(seq, partials ? heads : kv_heads);
    int t = threadIdx.x % 4, g = threadIdx.x % 32 / 4, c = heads * hs, kv = partials ? p.head / group : p.head;
    long long w = (long long)(heads + 2 * kv_heads) * hs;
    int k_at = c + kv * hs, v_at = c + kv_heads * hs + kv * hs;
    const T* head0 = qkv + (long long)p.b * seq * w;
    typename Op::A k[TC_STEPS], v[TC_STEPS];
    load_rows_a<Op>(k, head0 + k_at, w, p.row0, seq, hs, rope);
    load_rows_a<Op>(v, head0 + v_at, w, p.row0, seq, hs, 0);
    float dk[2 * TC_STEPS][4] = {}, dv[2 * TC_STEPS][4] = {};
    int h_end = partials ? p.head + 1 : (kv + 1) * group;
    for (int h = partials ? p.head : kv * group; h < h_end; ++h) {
        long long bh = (long long)p.b * heads + h;
        for (int q0 = p.first; q0 < seq; q0 += KV_ROWS) {
            __syncthreads();
            stage_tile<Op, KV_ROWS>(queries, head0 + h * hs, w, q0, seq, hs, rope);
            stage_tile<Op, KV_ROWS>(douts, dout + (long long)p.b * seq * c + h * hs, c, q0, seq, hs, 0);
            for (int e = threadIdx.x; e < KV_ROWS; e += blockDim.x) {
                tile_lse[e] = q0 + e < seq ? lse[bh * seq + q0 + e] : 0.0f;
                tile_delta[e] = q0 + e < seq ? delta[bh * seq + q0 + e] : 0.0f;
            }
            __syncthreads();
            // Transposed scores and dP: keys (this warp's rows) against the tile's queries.
            float s[KV_ROWS / 8][4], dp[KV_ROWS / 8][4];
            against_tile<Op, KV_ROWS>(s, k, queries, hs);
            against_tile<Op, KV_ROWS>(dp, v, douts, hs);
            #pragma unroll
            for (int n = 0; n < KV_ROWS / 8; ++n)
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    int i = p.row0 + g + 8 * (e / 2), jj = 8 * n + 2 * t + e % 2, j = q0 + jj;
                    float pd = 0.0f, ds = 0.0f;
                    if (i < seq && j < seq && j >= i) {
                        float pr = expf(s[n][e] * scale - tile_lse[jj]), f = dropped(drop, bh, seq, j, i);
                        pd = pr * f;
                        ds = pr * (dp[n][e] * f - tile_delta[jj]) * scale;
                    }
                    s[n][e] = pd;
                    dp[n][e] = ds;
                }
            times_tile<Op, KV_ROWS>(dv, s, douts, hs);
            times_tile<Op, KV_ROWS>(dk, dp, queries, hs);
        }
    }
    if (partials) k_at = 0, v_at = hs;
    #pragma unroll
    for (int half = 0; half < 2; ++half) {
        int i = p.row0 + g + 8 * half;
        if (i >= seq) continue;
        long long row = (long long)p.b * seq + i;
        float* drow = partials ? partials + (row * heads + p.head) * 2 * hs : dqkv + row * w;
        #pragma unroll
        for (int n = 0; n < 2 * TC_STEPS; ++n)
            if (8 * n < hs)
                #pragma unroll
                for (int e = 0; e < 2; ++e) {
                    drow[k_at + 8 * n + 2 * t + e] = dk[n][2 * half + e];
                    drow[v_at + 8 * n + 2 * t + e] = dv[n][2 * half + e];
                }
    }
}

// The tensor-core kernels, by operands: `attention_tensor_*` with bf16 ones, `attention_tf32x3_*`
// with f32 ones split in three TF32 products (the SIMT kernels' arguments, as above); `*_bf16`
// over bf16 qkv and out (bf16 runs store them so).
#define TENSOR_ATTENTION(PREFIX, SUFFIX, OP, T)                                                                                                         \
    extern "C" __global__ void PREFIX##_forward##SUFFIX(T* out, float* lse, const T* qkv, const float* rope, int batch, int seq, int heads,          \
                                                        int kv_heads, int hs, float scale, DropoutSite dropout) {                                       \
        tensor_forward<OP>(out, lse, qkv, rope, seq, heads, kv_heads, hs, scale, dropout);                                                            \
    }                                                                                                                                                   \
    extern "C" __global__ void PREFIX##_backward_query##SUFFIX(float* dqkv, float* delta, const float* dout, const T* qkv, const T* out,              \
                                                               const float* lse, const float* rope, int batch, int seq, int heads, int kv_heads,       \
                                                               int hs, float scale, DropoutSite dropout) {                                             \
        tensor_backward_query<OP>(dqkv, delta, dout, qkv, out, lse, rope, seq, heads, kv_heads, hs, scale, dropout);                                  \
    }                                                                                                                                                   \
    extern "C" __global__ void PREFIX##_backward_key_value##SUFFIX(float* dqkv, float* partials, const float* dout, const T* qkv, const float* lse,   \
                                                                   const float* delta, const float* rope, int batch, int seq, int heads,               \
                                                                   int kv_heads, int hs, float scale, DropoutSite dropout) {                           \
        tensor_backward_key_value<OP>(dqkv, partials, dout, qkv, lse, delta, rope, seq, heads, kv_heads, hs, scale, dropout);                         \
    }

TENSOR_ATTENTION(attention_tensor, , Bf16Operands, float)
TENSOR_ATTENTION(attention_tensor, _bf16, Bf16Operands, unsigned short)
TENSOR_ATTENTION(attention_tf32x3, , SplitTf32, float)
