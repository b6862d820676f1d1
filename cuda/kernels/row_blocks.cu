// Finishing column sums from per-row-block partials (core/src/ops/row_blocks.rs,
// shaders/row_blocks.wgsl). The bias, LayerNorm and RMSNorm weight gradients sum over rows in
// two passes with the CPU's order: first each block of ROW_BLOCK rows sums its rows in order
// into its own row of partials (a thread per block and column: rows by thousands keep the
// device busy), then this kernel adds the blocks' partials in block order.

// out[j] += Σ_b partials[b * stride + j], blocks in order, for columns j below `split`, else
// second[j - split] (LayerNorm's weight and bias gradients from one partials row per block).
// Few columns run long chains here (a bias over 8192 rows: 128 blocks), so eight blocks'
// loads go ahead of their sums.
extern "C" __global__ void add_partials(float* out, float* second, const float* partials, int blocks, int width, int stride, int split) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width) return;
    float* target = j < split ? out + j : second + (j - split);
    float s = *target;
    int b = 0;
    for (; b + 8 <= blocks; b += 8) {
        float x[8];
        for (int u = 0; u < 8; ++u) x[u] = partials[(long long)(b + u) * stride + j];
        for (int u = 0; u < 8; ++u) s += x[u];
    }
    for (; b < blocks; ++b) s += partials[(long long)b * stride + j];
    *target = s;
}
