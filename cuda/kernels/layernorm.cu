// LayerNorm over the last dimension, eps 1e-5 (core/src/ops/layernorm.rs, shaders/layernorm.wgsl).

#define LAYERNORM_EPS 1e-5f

// One warp per row: out = (x - mean) * rstd * weight + bias, saving mean and rstd; `out` f32,
// or bf16 in bf16 runs (layernorm_forward_bf16: the products' input, stored as they read it).
template <class Out>
__device__ void layernorm_rows(Out* out, float* mean, float* rstd, const float* x, const float* weight, const float* bias, int n, int c) {
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= n) return;
    const float* xr = x + (long long)row * c;
    float s = 0.0f;
    for (int i = lane; i < c; i += WARP) s += xr[i];
    float m = warp_sum(s) / c;
    float v = 0.0f;
    for (int i = lane; i < c; i += WARP) v += (xr[i] - m) * (xr[i] - m);
    float r = 1.0f / sqrtf(warp_sum(v) / c + LAYERNORM_EPS);
    Out* o = out + (long long)row * c;
    for (int i = lane; i < c; i += WARP) store(&o[i], (xr[i] - m) * r * weight[i] + bias[i]);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

extern "C" __global__ void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* weight, const float* bias, int n, int c) {
    layernorm_rows(out, mean, rstd, x, weight, bias, n, c);
}

extern "C" __global__ void layernorm_forward_bf16(unsigned short* out, float* mean, float* rstd, const float* x, const float* weight, const float* bias,
                                                  int n, int c) {
    layernorm_rows(out, mean, rstd, x, weight, bias, n, c);
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

// The weight and bias gradients' first pass (row_blocks.cu): partials [blocks, 2c], row b
// [sum(dout * xhat), sum(dout)] over the block's rows in order; a thread per (row block,
// column).
extern "C" __global__ void layernorm_params_partials(float* partials, const float* dout, const float* x, const float* mean, const float* rstd, int n,
                                                     int c) {
    Cell cell = column_tile_cell(c);
    int col = cell.col, first, end;
    if (col >= c) return;
    row_block_rows(cell.item, n, &first, &end);
    float dw = 0.0f, db = 0.0f;
    for (int i = first; i < end; ++i) {
        float g = dout[(long long)i * c + col];
        dw += g * ((x[(long long)i * c + col] - mean[i]) * rstd[i]);
        db += g;
    }
    partials[(long long)cell.item * 2 * c + col] = dw;
    partials[(long long)cell.item * 2 * c + c + col] = db;
}
