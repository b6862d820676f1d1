// Fused softmax cross-entropy (core/src/ops/cross_entropy.rs, shaders/cross_entropy.wgsl):
// one block per row; the softmax over the first `classes` logits, the padding after them
// gets no probability and a zero gradient.

// losses[row] = logsumexp(row[..classes]) - row[target]; with `write_grad`, the row replaced
// by grad_scale * (softmax(row) - onehot(target)), or where `grad_bf16` (bf16 products) that
// gradient rounded into its row instead: the LM head's backward operand, the f32 one unread.
extern "C" __global__ void cross_entropy(float* losses, float* logits, unsigned short* grad_bf16, const unsigned int* targets, int v, int classes, int write_grad,
                                         float grad_scale) {
    __shared__ float shared[32];
    float* x = logits + (long long)blockIdx.x * v;
    int target = targets[blockIdx.x];
    float target_logit = x[target];
    float m = NEG_INF;
    for (int j = threadIdx.x; j < classes; j += blockDim.x) m = fmaxf(m, x[j]);
    m = block_max(m, shared);
    float s = 0.0f;
    for (int j = threadIdx.x; j < classes; j += blockDim.x) s += expf(x[j] - m);
    s = block_sum(s, shared);
    if (threadIdx.x == 0) losses[blockIdx.x] = m + logf(s) - target_logit;
    if (!write_grad) return;
    float to_grad = grad_scale / s;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        float g = j < classes ? expf(x[j] - m) * to_grad : 0.0f;
        if (j == target) g -= grad_scale;
        if (grad_bf16)
            grad_bf16[(long long)blockIdx.x * v + j] = to_bf16(g);
        else
            x[j] = g;
    }
}

// record[RECORD_LOSS] += the mean of `losses` [n], summed in f64 in index order by one thread:
// the order (and so the bits) of the CPU's mean.
extern "C" __global__ void add_mean_loss(double* record, const float* losses, int n) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    double sum = 0.0;
    for (int i = 0; i < n; ++i) sum += losses[i];
    record[RECORD_LOSS] += sum / n;
}
