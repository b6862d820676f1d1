// AdamW (core/src/optim.rs, shaders/adamw.wgsl): PyTorch's operation order, the clip factor
// (the step's record, grad_norm.cu's check_step) scaling the gradients, decay
// 1 - lr * weight_decay on matrices (1 elsewhere).

// A piece of one parameter tensor, at most a block's share: `len` elements from `offset` in
// the parameter arena, weight-decayed where `decayed` is 1.
struct AdamwChunk {
    long long offset;
    int len;
    int decayed;
};

// One update of every parameter the moments hold (all, or a ZeRO-1 rank's shard starting at
// `moments_start`): a block per chunk (the engine cuts them once), each element as the CPU's
// scalar loop; nothing where the step's record says the update is skipped. With `p_bf16`,
// also the updated weights' bf16 copy the products read.
extern "C" __global__ void adamw(float* p, float* m, float* v, const float* g, unsigned short* p_bf16, const AdamwChunk* chunks, long long moments_start,
                                 const double* record, float matrix_decay, float one_minus_beta1, float beta2, float one_minus_beta2, float bc2_sqrt,
                                 float eps, float step_size) {
    if (record[RECORD_APPLY] == 0.0) return;
    float grad_scale = (float)record[RECORD_CLIP];
    AdamwChunk chunk = chunks[blockIdx.x];
    float decay = chunk.decayed ? matrix_decay : 1.0f;
    for (int i = threadIdx.x; i < chunk.len; i += blockDim.x) {
        long long idx = chunk.offset + i, moment = idx - moments_start;
        float gi = g[idx] * grad_scale;
        float pi = p[idx] * decay;
        float mi = m[moment] + (gi - m[moment]) * one_minus_beta1;
        float vi = v[moment] * beta2 + one_minus_beta2 * gi * gi;
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        pi -= step_size * mi / denom;
        p[idx] = pi;
        m[moment] = mi;
        v[moment] = vi;
        if (p_bf16) p_bf16[idx] = to_bf16(pi);
    }
}
