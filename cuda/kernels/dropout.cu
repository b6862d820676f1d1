// Dropout before a residual add (core/src/ops/dropout.rs, shaders/dropout.wgsl): the CPU's
// Philox masks, element idx of the site.

// out = residual + mask * scale * y (no residual: without it); backward: dy = mask * scale * dout.
extern "C" __global__ void dropout(float* out, const float* y, const float* residual, long long len, DropoutSite dropout) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= len) return;
    Dropout drop = load_dropout(dropout);
    float kept = philox_word((unsigned long long)idx, drop.site, drop.key) >= drop.threshold ? y[idx] * drop.scale : 0.0f;
    out[idx] = residual ? residual[idx] + kept : kept;
}
