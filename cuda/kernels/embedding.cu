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

// The backward adds each row of dout to its token's row of dwte and its position's row of
// dwpe, in row order as the CPU does (the same bits, and no atomics), a thread per (row of
// the gradient, column) in two kernels.

// dwte[t] += dout[i] for the rows i of token t, in order: the host groups the batch's rows
// by token (`rows` ordered by token, then row; `starts` where each distinct token's run
// begins, then the row count); one item per distinct token.
extern "C" __global__ void embedding_backward_tokens(float* dwte, const float* dout, const unsigned int* tokens, const unsigned int* rows,
                                                     const unsigned int* starts, int c) {
    Cell cell = column_tile_cell(c);
    if (cell.col >= c) return;
    unsigned int first = starts[cell.item], end = starts[cell.item + 1];
    if (first == end) return;  // a group past the batch's distinct tokens
    float* w = dwte + (long long)tokens[rows[first]] * c + cell.col;
    float s = *w;
    for (unsigned int j = first; j < end; ++j) s += dout[(long long)rows[j] * c + cell.col];
    *w = s;
}

// dwpe[p] += dout[i] for the rows i = p, p + seq, ... of n, in order; one item per position.
extern "C" __global__ void embedding_backward_positions(float* dwpe, const float* dout, int n, int c, int seq) {
    Cell cell = column_tile_cell(c);
    if (cell.col >= c) return;
    float* w = dwpe + (long long)cell.item * c + cell.col;
    float s = *w;
    for (int i = cell.item; i < n; i += seq) s += dout[(long long)i * c + cell.col];
    *w = s;
}
