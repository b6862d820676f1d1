// The linear layer's kernels beside its cuBLASLt products (core/src/ops/matmul.rs,
// shaders/matmul.wgsl): the epilogues, GELU's backward, the bias gradient's row-block sums
// and the rounding to bf16 of the operands and of the outputs a bf16 run stores so.

// After the product `acc [n, m]` (in `acc`): acc + bias (+ residual) in place; with
// `gelu_out`, acc holds the pre-activation: gelu_out = gelu(acc + bias), and acc becomes the
// slope GELU's backward needs where `save_slope`, else the pre-activation. `gelu_out` is f32,
// or bf16 in bf16 runs (matmul_epilogue_bf16).
template <class Out>
__device__ void epilogue(float* acc, Out* gelu_out, const float* bias, const float* residual, int n, int m, int save_slope) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)n * m) return;
    float v = acc[idx];
    if (bias) v += bias[idx % m];
    if (residual) v = residual[idx] + v;
    if (gelu_out) {
        float s = gelu_sigmoid(v);
        store(&gelu_out[idx], v * s);
        acc[idx] = save_slope ? gelu_slope(v, s) : v;
    } else {
        acc[idx] = v;
    }
}

extern "C" __global__ void matmul_epilogue(float* acc, float* gelu_out, const float* bias, const float* residual, int n, int m, int save_slope) {
    epilogue(acc, gelu_out, bias, residual, n, m, save_slope);
}

extern "C" __global__ void matmul_epilogue_bf16(float* acc, unsigned short* gelu_out, const float* bias, const float* residual, int n, int m,
                                                int save_slope) {
    epilogue(acc, gelu_out, bias, residual, n, m, save_slope);
}

// GELU's backward given its saved slope: dout *= slope.
extern "C" __global__ void gelu_backward(float* dout, const float* slope, long long len) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < len) dout[idx] *= slope[idx];
}

// SwiGLU after the gate and up product pre [n, 2h]: out [n, h] = silu(gate) * up (f32, or
// bf16 in bf16 runs: swiglu_forward_bf16); with `save_slope`, pre becomes the slopes
// [up * s * (1 + gate * (1 - s)), silu(gate)], s = sigmoid(gate).
template <class Out>
__device__ void swiglu(Out* out, float* pre, int n, int h, int save_slope) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)n * h) return;
    long long row = idx / h, at = row * 2 * h + idx % h;
    float g = pre[at], up = pre[at + h];
    float s = 1.0f / (1.0f + expf(-g)), silu = g * s;
    store(&out[idx], silu * up);
    if (save_slope) {
        pre[at] = up * s * (1.0f + g * (1.0f - s));
        pre[at + h] = silu;
    }
}

extern "C" __global__ void swiglu_forward(float* out, float* pre, int n, int h, int save_slope) { swiglu(out, pre, n, h, save_slope); }

extern "C" __global__ void swiglu_forward_bf16(unsigned short* out, float* pre, int n, int h, int save_slope) { swiglu(out, pre, n, h, save_slope); }

// SwiGLU's backward in place: both halves of the slopes d [n, 2h] times dh [n, h].
extern "C" __global__ void swiglu_backward(float* d, const float* dh, int n, int h) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)n * h) return;
    long long row = idx / h, at = row * 2 * h + idx % h;
    d[at] *= dh[idx];
    d[at + h] *= dh[idx];
}

// The bias gradient's first pass (row_blocks.cu): partials [blocks, m], row b the column sums
// of dout's rows b * ROW_BLOCK .. (b + 1) * ROW_BLOCK in order; a thread per (row block,
// column). With `slope`, GELU's backward first, in place: dout *= slope (the CPU's one pass
// over a block). With `dout_bf16` (bf16 products), dout rounded into it too: the products'
// operand.
extern "C" __global__ void bias_grad_partials(float* partials, float* dout, const float* slope, unsigned short* dout_bf16, int n, int m) {
    Cell cell = column_tile_cell(m);
    int col = cell.col, first, end;
    if (col >= m) return;
    row_block_rows(cell.item, n, &first, &end);
    float s = 0.0f;
    for (int i = first; i < end; ++i) {
        long long at = (long long)i * m + col;
        float d = dout[at];
        if (slope) {
            d *= slope[at];
            dout[at] = d;
        }
        if (dout_bf16) dout_bf16[at] = to_bf16(d);
        s += d;
    }
    partials[(long long)cell.item * m + col] = s;
}

// x [len / m, m] (+ bias [m]) rounded to bf16 (--precision bf16): a product's f32 operand, or a
// product's f32 sums and bias into a bf16 activation (qkv).
extern "C" __global__ void round_to_bf16(unsigned short* out_bf16, const float* x, const float* bias, long long len, int m) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < len) out_bf16[idx] = to_bf16(bias ? x[idx] + bias[idx % m] : x[idx]);
}

// A weight gradient summed over token slices: dw [len] += the `splits` slices' products in
// `partials` [splits, len], added in slice order (deterministic, as one product's sums).
extern "C" __global__ void add_weight_grad_slices(float* dw, const float* partials, int splits, long long len) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    float sum = partials[i];
    for (int s = 1; s < splits; ++s) sum += partials[(long long)s * len + i];
    dw[i] += sum;
}
