// RMSNorm over the last dimension with a weight and no bias, the Llama family's
// (core/src/ops/rmsnorm.rs, shaders/rmsnorm.wgsl).

// One warp per row: out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps), saved; `out`
// f32, or bf16 in bf16 runs (rmsnorm_forward_bf16, as layernorm's).
template <class Out>
__device__ void rmsnorm_rows(Out* out, float* rstd, const float* x, const float* weight, int n, int c, float eps) {
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= n) return;
    const float* xr = x + (long long)row * c;
    float q = 0.0f;
    for (int i = lane; i < c; i += WARP) q += xr[i] * xr[i];
    float r = 1.0f / sqrtf(warp_sum(q) / c + eps);
    Out* o = out + (long long)row * c;
    for (int i = lane; i < c; i += WARP) store(&o[i], xr[i] * r * weight[i]);
    if (lane == 0) rstd[row] = r;
}

extern "C" __global__ void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight, int n, int c, float eps) {
    rmsnorm_rows(out, rstd, x, weight, n, c, eps);
}

extern "C" __global__ void rmsnorm_forward_bf16(unsigned short* out, float* rstd, const float* x, const float* weight, int n, int c, float eps) {
    rmsnorm_rows(out, rstd, x, weight, n, c, eps);
}

// One warp per row: dx += (dout * w - xhat * mean(dout * w * xhat)) * rstd.
extern "C" __global__ void rmsnorm_backward_input(float* dx, const float* dout, const float* x, const float* rstd, const float* weight, int n, int c) {
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (row >= n) return;
    long long at = (long long)row * c;
    float r = rstd[row];
    float b = 0.0f;
    for (int i = lane; i < c; i += WARP) b += dout[at + i] * weight[i] * (x[at + i] * r);
    float dnorm_xhat_mean = warp_sum(b) / c;
    for (int i = lane; i < c; i += WARP) dx[at + i] += (dout[at + i] * weight[i] - x[at + i] * r * dnorm_xhat_mean) * r;
}

// The weight gradient's first pass (row_blocks.cu): partials [blocks, c], row b sum(dout *
// xhat) over the block's rows in order; a thread per (row block, column).
extern "C" __global__ void rmsnorm_weight_partials(float* partials, const float* dout, const float* x, const float* rstd, int n, int c) {
    Cell cell = column_tile_cell(c);
    int col = cell.col, first, end;
    if (col >= c) return;
    row_block_rows(cell.item, n, &first, &end);
    float dw = 0.0f;
    for (int i = first; i < end; ++i) dw += dout[(long long)i * c + col] * (x[(long long)i * c + col] * rstd[i]);
    partials[(long long)cell.item * c + col] = dw;
}
