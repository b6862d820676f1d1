// Causal multi-head self-attention over the fused qkv [B, T, W] (core/src/ops/attention.rs,
// shaders/attention.wgsl): q (NH heads), k and v (KVH heads each) side by side, W = (NH + 2
// KVH) HS, query head h reading key/value head h / (NH / KVH). One warp per query row
// (forward, dQ) or key row of a key/value head (dK and dV, summed over its query heads in
// order), the lanes owning the head's dimensions d = lane + 32k; scores summed over the warp,
// the softmax online. The probabilities are never stored: backward recomputes them from
// `lse`. Every output element is written by one warp in a fixed order (dQ in its own pass, no
// atomics). With a rotary table `rope` [T, HS] (row p: the cosines of position p's HS/2
// angles, then their sines; null without RoPE), q and k are rotated as they are read
// (rotate-half) and attention_rope_backward rotates dQ and dK back.

#define MAX_DIMS 8  // head sizes up to 256

struct Dropout {
    int on;               // whether the probabilities are dropped
    unsigned int site;    // the site's id
    unsigned int threshold;
    float scale;          // 1 / (1 - p)
    DropoutKey key;
};

// The (batch * heads + head, row) of global warp `row` over [B, NH, T], its key/value head
// `g`; `w` a row of qkv, `kv0` and `v0` the first k and v columns of head g, `head0` batch b's
// row 0 of qkv.
#define ROW_OF_WARP                                                          \
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;        \
    int lane = threadIdx.x % WARP;                                           \
    if (row >= batch * heads * seq) return;                                  \
    int i = row % seq, bh = row / seq, h = bh % heads, b = bh / heads;       \
    int c = heads * hs, g = h / (heads / kv_heads);                          \
    long long w = (long long)(heads + 2 * kv_heads) * hs;                    \
    int kv0 = c + g * hs, v0 = c + kv_heads * hs + g * hs;                   \
    const float* head0 = qkv + (long long)b * seq * w;

// Element d of head row `at` as attention reads it: rotated as position `pos` where `rope`
// is a table (pair d, d + HS/2), else as it is.
__device__ __forceinline__ float rotated(const float* at, int d, int hs, const float* rope, int pos) {
    if (!rope) return at[d];
    int half = hs / 2, p = d % half;
    float cs = rope[(long long)pos * hs + p], sn = rope[(long long)pos * hs + half + p];
    return d < half ? at[d] * cs - at[d + half] * sn : at[d] * cs + at[d - half] * sn;
}

__device__ __forceinline__ void load_dims(float* r, const float* at, int lane, int hs) {
    for (int k = 0; k < MAX_DIMS; ++k) {
        int d = lane + WARP * k;
        r[k] = d < hs ? at[d] : 0.0f;
    }
}

// load_dims of a q or k row at position `pos`, rotated where `rope` is a table.
__device__ __forceinline__ void load_rotated(float* r, const float* at, int lane, int hs, const float* rope, int pos) {
    for (int k = 0; k < MAX_DIMS; ++k) {
        int d = lane + WARP * k;
        r[k] = d < hs ? rotated(at, d, hs, rope, pos) : 0.0f;
    }
}

__device__ __forceinline__ float dot_dims(const float* r, const float* at, int lane, int hs) {
    float s = 0.0f;
    for (int k = 0; k < MAX_DIMS; ++k) {
        int d = lane + WARP * k;
        if (d < hs) s += r[k] * at[d];
    }
    return warp_sum(s);
}

// dot_dims with a q or k row at position `pos`, rotated where `rope` is a table.
__device__ __forceinline__ float dot_rotated(const float* r, const float* at, int lane, int hs, const float* rope, int pos) {
    float s = 0.0f;
    for (int k = 0; k < MAX_DIMS; ++k) {
        int d = lane + WARP * k;
        if (d < hs) s += r[k] * rotated(at, d, hs, rope, pos);
    }
    return warp_sum(s);
}

__device__ __forceinline__ float dropped(Dropout drop, long long bh, int seq, int i, int j) {
    if (!drop.on) return 1.0f;
    return dropout_factor(((unsigned long long)(bh * seq + i)) * seq + j, drop.site, drop.threshold, drop.scale, drop.key);
}

// out = dropout(softmax(q k^T * scale, causal)) v per head; lse [B, NH, T].
extern "C" __global__ void attention_forward(float* out, float* lse, const float* qkv, const float* rope, int batch, int seq, int heads, int kv_heads,
                                             int hs, float scale, Dropout drop) {
    ROW_OF_WARP
    float q[MAX_DIMS], o[MAX_DIMS];
    load_rotated(q, head0 + i * w + h * hs, lane, hs, rope, i);
    for (int k = 0; k < MAX_DIMS; ++k) o[k] = 0.0f;
    float m = NEG_INF, l = 0.0f;
    for (int j = 0; j <= i; ++j) {
        const float* kj = head0 + j * w + kv0;
        float s = dot_rotated(q, kj, lane, hs, rope, j) * scale;
        float m_new = fmaxf(m, s);
        float corr = expf(m - m_new), p = expf(s - m_new);
        l = l * corr + p;
        float pd = p * dropped(drop, bh, seq, i, j);
        const float* vj = head0 + j * w + v0;
        for (int k = 0; k < MAX_DIMS; ++k) {
            int d = lane + WARP * k;
            if (d < hs) o[k] = o[k] * corr + pd * vj[d];
        }
        m = m_new;
    }
    float inv = 1.0f / l;
    float* orow = out + ((long long)b * seq + i) * c + h * hs;
    for (int k = 0; k < MAX_DIMS; ++k) {
        int d = lane + WARP * k;
        if (d < hs) orow[d] = o[k] * inv;
    }
    if (lane == 0) lse[row] = m + logf(l);
}

// dQ of each query row, and delta = rowsum(dO * O) [B, NH, T] for the key pass.
// With RoPE, dQ is left in the rotated space (attention_rope_backward rotates it back).
extern "C" __global__ void attention_backward_query(float* dqkv, float* delta, const float* dout, const float* qkv, const float* out, const float* lse,
                                                    const float* rope, int batch, int seq, int heads, int kv_heads, int hs, float scale, Dropout drop) {
    ROW_OF_WARP
    long long orow = ((long long)b * seq + i) * c + h * hs;
    float q[MAX_DIMS], d_o[MAX_DIMS], dq[MAX_DIMS];
    load_rotated(q, head0 + i * w + h * hs, lane, hs, rope, i);
    load_dims(d_o, dout + orow, lane, hs);
    float dl = dot_dims(d_o, out + orow, lane, hs);
    for (int k = 0; k < MAX_DIMS; ++k) dq[k] = 0.0f;
    float li = lse[row];
    for (int j = 0; j <= i; ++j) {
        const float* kj = head0 + j * w + kv0;
        float p = expf(dot_rotated(q, kj, lane, hs, rope, j) * scale - li);
        float dp = dot_dims(d_o, head0 + j * w + v0, lane, hs) * dropped(drop, bh, seq, i, j);
        float ds = p * (dp - dl) * scale;
        for (int k = 0; k < MAX_DIMS; ++k) {
            int d = lane + WARP * k;
            if (d < hs) dq[k] += ds * rotated(kj, d, hs, rope, j);
        }
    }
    float* dqrow = dqkv + ((long long)b * seq + i) * w + h * hs;
    for (int k = 0; k < MAX_DIMS; ++k) {
        int d = lane + WARP * k;
        if (d < hs) dqrow[d] = dq[k];
    }
    if (lane == 0) delta[row] = dl;
}

// dK and dV of each key row of a key/value head (warp `row` over [B, KVH, T] is key i of
// head g here), over its query heads in order and the queries that see the key. With RoPE,
// dK is left in the rotated space.
extern "C" __global__ void attention_backward_key_value(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* delta,
                                                        const float* rope, int batch, int seq, int heads, int kv_heads, int hs, float scale,
                                                        Dropout drop) {
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= batch * kv_heads * seq) return;
    int i = row % seq, g = (row / seq) % kv_heads, b = row / seq / kv_heads;
    int c = heads * hs, group = heads / kv_heads;
    long long w = (long long)(heads + 2 * kv_heads) * hs;
    int kv0 = c + g * hs, v0 = c + kv_heads * hs + g * hs;
    const float* head0 = qkv + (long long)b * seq * w;
    float kr[MAX_DIMS], vr[MAX_DIMS], dk[MAX_DIMS], dv[MAX_DIMS];
    load_rotated(kr, head0 + i * w + kv0, lane, hs, rope, i);
    load_dims(vr, head0 + i * w + v0, lane, hs);
    for (int k = 0; k < MAX_DIMS; ++k) dk[k] = dv[k] = 0.0f;
    for (int h = g * group; h < (g + 1) * group; ++h) {
        long long bh = (long long)b * heads + h;
        for (int qi = i; qi < seq; ++qi) {
            const float* q = head0 + qi * w + h * hs;
            const float* d_o = dout + ((long long)b * seq + qi) * c + h * hs;
            long long at = bh * seq + qi;
            float p = expf(dot_rotated(kr, q, lane, hs, rope, qi) * scale - lse[at]);
            float dp = dot_dims(vr, d_o, lane, hs);
            float f = dropped(drop, bh, seq, qi, i);
            float ds = p * (dp * f - delta[at]) * scale;
            float pd = p * f;
            for (int k = 0; k < MAX_DIMS; ++k) {
                int d = lane + WARP * k;
                if (d < hs) {
                    dv[k] += pd * d_o[d];
                    dk[k] += ds * rotated(q, d, hs, rope, qi);
                }
            }
        }
    }
    float* drow = dqkv + ((long long)b * seq + i) * w;
    for (int k = 0; k < MAX_DIMS; ++k) {
        int d = lane + WARP * k;
        if (d < hs) {
            drow[kv0 + d] = dk[k];
            drow[v0 + d] = dv[k];
        }
    }
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
