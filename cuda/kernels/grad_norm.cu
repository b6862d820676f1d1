// The gradients' sum of squares (core/src/ops/grad_norm.rs, shaders/grad_norm.wgsl), in f64:
// a fixed grid of blocks each sums a fixed stride of elements and writes its partial; the
// host adds the partials in order. The same bits every run.

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
