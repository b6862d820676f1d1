// Token + position embedding (core/src/ops/embedding.rs, shaders/embedding.wgsl).

// out[i, c] = wte[tokens[i], c] + wpe[(first_position + i % seq), c]; one thread per element.
// `first_position` is 0 in a batch, the token's position when decoding one token. A model
// without a position table (the Llama family's, wpe null) takes the token's row.
extern "C" __global__ void embedding_forward(float* out, const float* wte, const float* wpe, const unsigned int* tokens, int n, int c, int seq,
                                             int first_position) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= n * c) return;
    int i = idx / c, col = idx % c;
    int pos = first_position + i % seq;
    float v = wte[(long long)tokens[i] * c + col];
    if (wpe) v += wpe[(long long)pos * c + col];
    out[idx] = v;
}

// dwte[tokens[i]] += dout[i], dwpe[i % seq] += dout[i] (where there is one): one thread per
// column, rows in order (the CPU's order: the same bits, and no atomics).
extern "C" __global__ void embedding_backward(float* dwte, float* dwpe, const float* dout, const unsigned int* tokens, int n, int c, int seq) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= c) return;
    for (int i = 0; i < n; ++i) {
        float g = dout[(long long)i * c + col];
        dwte[(long long)tokens[i] * c + col] += g;
        if (dwpe) dwpe[(long long)(i % seq) * c + col] += g;
    }
}
