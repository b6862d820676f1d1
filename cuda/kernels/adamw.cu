// AdamW (core/src/optim.rs, shaders/adamw.wgsl): PyTorch's operation order, the clip factor
// folded into `grad_scale`, decay 1 - lr * weight_decay on matrices (1 elsewhere).

// One parameter tensor's update (`len` elements of p, m, v, g); with `p_bf16`, also the
// updated weights' bf16 copy the products read.
extern "C" __global__ void adamw(float* p, float* m, float* v, const float* g, unsigned short* p_bf16, long long len, float grad_scale, float decay,
                                 float one_minus_beta1, float beta2, float one_minus_beta2, float bc2_sqrt, float eps, float step_size) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= len) return;
    float gi = g[idx] * grad_scale;
    float pi = p[idx] * decay;
    float mi = m[idx] + (gi - m[idx]) * one_minus_beta1;
    float vi = v[idx] * beta2 + one_minus_beta2 * gi * gi;
    float denom = sqrtf(vi) / bc2_sqrt + eps;
    pi -= step_size * mi / denom;
    p[idx] = pi;
    m[idx] = mi;
    v[idx] = vi;
    if (p_bf16) p_bf16[idx] = to_bf16(pi);
}
