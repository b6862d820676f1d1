// Causal multi-head self-attention over the fused qkv [B, T, 3C] (core/src/ops/attention.rs,
// shaders/attention.wgsl): one warp per query row (forward, dQ) or key row (dK and dV), the
// lanes owning the head's dimensions d = lane + 32k; scores summed over the warp, the
// softmax online. The probabilities are never stored: backward recomputes them from `lse`.
// Every output element is written by one warp in a fixed order (dQ in its own pass, no atomics).

#define MAX_DIMS 8  // head sizes up to 256

struct Dropout {
    int on;               // whether the probabilities are dropped
    unsigned int site;    // the site's id
    unsigned int threshold;
    float scale;          // 1 / (1 - p)
    DropoutKey key;
};

// The (batch * heads + head, row) of global warp `row` over [B, NH, T].
#define ROW_OF_WARP                                                          \
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;        \
    int lane = threadIdx.x % WARP;                                           \
    if (row >= batch * heads * seq) return;                                  \
    int i = row % seq, bh = row / seq, h = bh % heads, b = bh / heads;       \
    int c = heads * hs;                                                      \
    long long c3 = 3LL * c;                                                  \
    const float* head0 = qkv + (long long)b * seq * c3 + h * hs;

__device__ __forceinline__ void load_dims(float* r, const float* at, int lane, int hs) {
    for (int k = 0; k < MAX_DIMS; ++k) {
        int d = lane + WARP * k;
        r[k] = d < hs ? at[d] : 0.0f;
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

__device__ __forceinline__ float dropped(Dropout drop, long long bh, int seq, int i, int j) {
    if (!drop.on) return 1.0f;
    return dropout_factor(((unsigned long long)(bh * seq + i)) * seq + j, drop.site, drop.threshold, drop.scale, drop.key);
}

// out = dropout(softmax(q k^T * scale, causal)) v per head; lse [B, NH, T].
extern "C" __global__ void attention_forward(float* out, float* lse, const float* qkv, int batch, int seq, int heads, int hs, float scale, Dropout drop) {
    ROW_OF_WARP
    float q[MAX_DIMS], o[MAX_DIMS];
    load_dims(q, head0 + i * c3, lane, hs);
    for (int k = 0; k < MAX_DIMS; ++k) o[k] = 0.0f;
    float m = NEG_INF, l = 0.0f;
    for (int j = 0; j <= i; ++j) {
        const float* kj = head0 + j * c3 + c;
        float s = dot_dims(q, kj, lane, hs) * scale;
        float m_new = fmaxf(m, s);
        float corr = expf(m - m_new), p = expf(s - m_new);
        l = l * corr + p;
        float pd = p * dropped(drop, bh, seq, i, j);
        const float* vj = kj + c;
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
extern "C" __global__ void attention_backward_query(float* dqkv, float* delta, const float* dout, const float* qkv, const float* out, const float* lse,
                                                    int batch, int seq, int heads, int hs, float scale, Dropout drop) {
    ROW_OF_WARP
    long long orow = ((long long)b * seq + i) * c + h * hs;
    float q[MAX_DIMS], d_o[MAX_DIMS], dq[MAX_DIMS];
    load_dims(q, head0 + i * c3, lane, hs);
    load_dims(d_o, dout + orow, lane, hs);
    float dl = dot_dims(d_o, out + orow, lane, hs);
    for (int k = 0; k < MAX_DIMS; ++k) dq[k] = 0.0f;
    float li = lse[row];
    for (int j = 0; j <= i; ++j) {
        const float* kj = head0 + j * c3 + c;
        float p = expf(dot_dims(q, kj, lane, hs) * scale - li);
        float dp = dot_dims(d_o, kj + c, lane, hs) * dropped(drop, bh, seq, i, j);
        float ds = p * (dp - dl) * scale;
        for (int k = 0; k < MAX_DIMS; ++k) {
            int d = lane + WARP * k;
            if (d < hs) dq[k] += ds * kj[d];
        }
    }
    float* dqrow = dqkv + ((long long)b * seq + i) * c3 + h * hs;
    for (int k = 0; k < MAX_DIMS; ++k) {
        int d = lane + WARP * k;
        if (d < hs) dqrow[d] = dq[k];
    }
    if (lane == 0) delta[row] = dl;
}

// dK and dV of each key row (warp `row` is key i here), over the queries that see it.
extern "C" __global__ void attention_backward_key_value(float* dqkv, const float* dout, const float* qkv, const float* lse, const float* delta,
                                                        int batch, int seq, int heads, int hs, float scale, Dropout drop) {
    ROW_OF_WARP
    float kr[MAX_DIMS], vr[MAX_DIMS], dk[MAX_DIMS], dv[MAX_DIMS];
    load_dims(kr, head0 + i * c3 + c, lane, hs);
    load_dims(vr, head0 + i * c3 + 2 * c, lane, hs);
    for (int k = 0; k < MAX_DIMS; ++k) dk[k] = dv[k] = 0.0f;
    for (int qi = i; qi < seq; ++qi) {
        const float* q = head0 + qi * c3;
        const float* d_o = dout + ((long long)b * seq + qi) * c + h * hs;
        long long at = (long long)bh * seq + qi;
        float p = expf(dot_dims(kr, q, lane, hs) * scale - lse[at]);
        float dp = dot_dims(vr, d_o, lane, hs);
        float f = dropped(drop, bh, seq, qi, i);
        float ds = p * (dp * f - delta[at]) * scale;
        float pd = p * f;
        for (int k = 0; k < MAX_DIMS; ++k) {
            int d = lane + WARP * k;
            if (d < hs) {
                dv[k] += pd * d_o[d];
                dk[k] += ds * q[d];
            }
        }
    }
    float* drow = dqkv + ((long long)b * seq + i) * c3 + h * hs;
    for (int k = 0; k < MAX_DIMS; ++k) {
        int d = lane + WARP * k;
        if (d < hs) {
            drow[c + d] = dk[k];
            drow[2 * c + d] = dv[k];
        }
    }
}

// One token at position `pos` against a layer's cache (keys then values, [len, C] each): its
// key and value are stored at `pos`, then each head (one warp) attends over keys ..= pos.
// Each lane reads and writes only its own dimensions, so no lane waits for another.
extern "C" __global__ void attention_decode(float* out, float* lse, float* keys, float* values, const float* qkv, int pos, int heads, int hs, float scale) {
    int h = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (h >= heads) return;
    int c = heads * hs;
    float q[MAX_DIMS], o[MAX_DIMS];
    load_dims(q, qkv + h * hs, lane, hs);
    for (int k = 0; k < MAX_DIMS; ++k) {
        int d = lane + WARP * k;
        o[k] = 0.0f;
        if (d < hs) {
            keys[(long long)pos * c + h * hs + d] = qkv[c + h * hs + d];
            values[(long long)pos * c + h * hs + d] = qkv[2 * c + h * hs + d];
        }
    }
    float m = NEG_INF, l = 0.0f;
    for (int j = 0; j <= pos; ++j) {
        float s = dot_dims(q, keys + (long long)j * c + h * hs, lane, hs) * scale;
        float m_new = fmaxf(m, s);
        float corr = expf(m - m_new), p = expf(s - m_new);
        l = l * corr + p;
        const float* vj = values + (long long)j * c + h * hs;
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
