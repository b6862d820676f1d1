// The gradients' sum of squares (core/src/ops/grad_norm.rs, shaders/grad_norm.wgsl), in f64:
// a fixed grid of blocks each sums a fixed stride of elements and writes its partial;
// check_step adds the partials in order. The same bits every run.

#define SUM_THREADS 256

extern "C" __global__ void sum_squares_partials(double* partials, const float* x, long long len) {
    __shared__ double shared[SUM_THREADS];
    double s = 0.0;
    for (long long i = (long long)blockIdx.x * SUM_THREADS + threadIdx.x; i < len; i += (long long)gridDim.x * SUM_THREADS) {
        double v = x[i];
        s += v * v;
    }
    shared[threadIdx.x] = s;
    __syncthreads();
    for (int half = SUM_THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

// The step's check before AdamW, by one thread: record[RECORD_NORM] = the `count` partials
// summed in order (none: the host wrote the sum there, a ZeRO-1 shard's over the ranks); the
// update applies where the loss and the norm are finite, with the clip factor for `max_norm`
// (0: no clipping; core's grad_norm::clip_factor), else it is skipped and counted.
extern "C" __global__ void check_step(double* record, const double* partials, int count, double max_norm) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    if (count > 0) {
        double sum = 0.0;
        for (int i = 0; i < count; ++i) sum += partials[i];
        record[RECORD_NORM] = sum;
    }
    double norm = sqrt(record[RECORD_NORM]);
    bool apply = isfinite(record[RECORD_LOSS]) && isfinite(norm);
    record[RECORD_APPLY] = apply ? 1.0 : 0.0;
    record[RECORD_CLIP] = max_norm > 0.0 ? fmin(max_norm / (norm + 1e-6), 1.0) : 1.0;
    if (!apply) record[RECORD_SKIPPED] += 1.0;
}
