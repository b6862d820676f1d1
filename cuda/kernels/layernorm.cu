// LayerNorm over the last dimension, eps 1e-5 (core/src/ops/layernorm.rs, shaders/layernorm.wgsl).

#define LAYERNORM_EPS 1e-5f

// One warp per row: out = (x - mean) * rstd * weight + bias, saving mean and rstd.
extern "C" __global__ void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* weight, const float* bias, int n, int c) {
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= n) return;
    const float* xr = x + (long long)row * c;
    float s = 0.0f;
    for (int i = lane; i < c; i += WARP) s += xr[i];
    float m = warp_sum(s) / c;
    float v = 0.0f;
    for (int i = lane; i < c; i += WARP) v += (xr[i] - m) * (xr[i] - m);
    float r = 1.0f / sqrtf(warp_sum(v) / c + LAYERNORM_EPS);
    float* o = out + (long long)row * c;
    for (int i = lane; i < c; i += WARP) o[i] = (xr[i] - m) * r * weight[i] + bias[i];
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// One warp per row: dx += (dout * w - mean(dout * w) - xhat * mean(dout * w * xhat)) * rstd.
extern "C" __global__ void layernorm_backward_input(float* dx, const float* dout, const float* x, const float* mean, const float* rstd,
                                                    const float* weight, int n, int c) {
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= n) return;
    long long at = (long long)row * c;
    float m = mean[row], r = rstd[row];
    float a = 0.0f, b = 0.0f;
    for (int i = lane; i < c; i += WARP) {
        float g = dout[at + i] * weight[i];
        a += g;
        b += g * ((x[at + i] - m) * r);
    }
    float dnorm_mean = warp_sum(a) / c, dnorm_xhat_mean = warp_sum(b) / c;
    for (int i = lane; i < c; i += WARP) {
        float xhat = (x[at + i] - m) * r;
        dx[at + i] += (dout[at + i] * weight[i] - dnorm_mean - xhat * dnorm_xhat_mean) * r;
    }
}

// One thread per column, rows in order: dweight += sum(dout * xhat), dbias += sum(dout).
extern "C" __global__ void layernorm_backward_params(float* dweight, float* dbias, const float* dout, const float* x, const float* mean,
                                                     const float* rstd, int n, int c) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= c) return;
    float dw = 0.0f, db = 0.0f;
    for (int i = 0; i < n; ++i) {
        float g = dout[(long long)i * c + col];
        dw += g * ((x[(long long)i * c + col] - mean[i]) * rstd[i]);
        db += g;
    }
    dweight[col] += dw;
    dbias[col] += db;
}
