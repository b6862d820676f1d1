// Prepended to every kernel file of alpha-cuda (the twin of shaders/common.wgsl): warp
// reductions, bf16 rounding, GELU and the Philox dropout masks, in the CPU's formulas.
// Tensors are f32 unless named `*_bf16` or typed by a template's element type (bf16 as its 16
// bits). Lengths and indices are 32-bit where a tensor fits 2^31 elements (the plan checks it),
// 64-bit for dropout counters.

#define WARP 32
#define NEG_INF __int_as_float(0xff800000)

// The step's record (engine.rs, `Record`), f64 slots on the device that the host reads only
// when it reports: the micro-batches' mean losses summed, the gradients' sum of squares, the
// clip factor, whether the update applies (1 or 0), and the steps skipped since the last read.
#define RECORD_LOSS 0
#define RECORD_NORM 1
#define RECORD_CLIP 2
#define RECORD_APPLY 3
#define RECORD_SKIPPED 4

struct Sum {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// `v` reduced by `op` over the warp, in every lane (a fixed butterfly: the same bits every run).
template <typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, Sum()); }

// `v` reduced by `op` over a block of `blockDim.x` threads (a multiple of 32, at most 1024),
// in every thread; `shared` holds 32 floats, `identity` is what an absent warp contributes.
// A fixed order: deterministic.
template <typename Op>
__device__ float block_reduce(float v, float* shared, float identity, Op op) {
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    v = warp_reduce(v, op);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < warps ? shared[lane] : identity;
    return warp_reduce(v, op);
}

__device__ float block_sum(float v, float* shared) { return block_reduce(v, shared, 0.0f, Sum()); }
__device__ float block_max(float v, float* shared) { return block_reduce(v, shared, NEG_INF, Max()); }

// A thread's cell in a pass with a thread per (item, column) of `width` columns, the grid
// (column tiles of blockDim.x) x items: its column `col` (at or past `width` in the last
// tile's spare threads) and its `item`.
struct Cell {
    int col, item;
};

__device__ __forceinline__ Cell column_tile_cell(int width) {
    int tiles = (width + blockDim.x - 1) / blockDim.x;
    return Cell{(int)((blockIdx.x % tiles) * blockDim.x + threadIdx.x), (int)(blockIdx.x / tiles)};
}

// Row block `block`'s rows of `n`: from `*first` to `*end` (ROW_BLOCK, fewer in the last).
__device__ __forceinline__ void row_block_rows(int block, int n, int* first, int* end) {
    *first = block * ROW_BLOCK;
    *end = *first + ROW_BLOCK < n ? *first + ROW_BLOCK : n;
}

// f32 to bf16 bits, rounding to nearest even (NaN stays NaN), as `half::bf16::from_f32`.
__device__ __forceinline__ unsigned short to_bf16(float x) {
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

// An element of a tensor as f32: itself, or a bf16 activation widened (bf16 runs store the
// linear layers' inputs and qkv so: the plan's half activations). Kernels that read or write
// such a tensor are templates over its element type, `float` or `unsigned short`.
__device__ __forceinline__ float as_float(float x) { return x; }
__device__ __forceinline__ float as_float(unsigned short b) { return __uint_as_float((unsigned)b << 16); }

// `v` stored as the element type: itself, or rounded to bf16.
__device__ __forceinline__ void store(float* at, float v) { *at = v; }
__device__ __forceinline__ void store(unsigned short* at, float v) { *at = to_bf16(v); }

// Two floats as bf16 in one register, the first in the low half (mma's operand layout).
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    return (unsigned)to_bf16(lo) | ((unsigned)to_bf16(hi) << 16);
}

// A warp's product on the tensor cores (sm_80 and later): D [16 x 8] f32 += A [16 x 16] ·
// B [16 x 8], A and B bf16, in PTX's fragment layout for mma.m16n8k16 with lane = 4 g + t:
// a[0] holds A (row g, columns 2t and 2t + 1), a[1] (row g + 8, the same columns), a[2] (row
// g, columns 2t + 8 and 2t + 9), a[3] (row g + 8, those); b[0] holds B (rows 2t and 2t + 1,
// column g), b[1] (rows 2t + 8 and 2t + 9, column g); d[0], d[1] are D (row g, columns 2t and
// 2t + 1), d[2], d[3] (row g + 8, those). Every lane of the warp takes part. The host's
// emulation (cuda/emulate/host.hpp) defines its own of these and of to_tf32.
#ifndef ALPHA_HOST
__device__ __forceinline__ void mma_bf16(float* d, const unsigned* a, const unsigned* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The same with TF32 operands (10-bit mantissas), mma.m16n8k8: D [16 x 8] += A [16 x 8] · B [8 x
// 8], a[0] holding A (row g, column t), a[1] (row g + 8, column t), a[2] (row g, column t + 4),
// a[3] (row g + 8, column t + 4); b[0] B (row t, column g), b[1] (row t + 4, column g); d as
// above.
__device__ __forceinline__ void mma_tf32(float* d, const unsigned* a, const unsigned* b) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// x rounded to TF32 (to nearest, ties away from zero), as f32 bits: the low 13 bits zero.
// Volatile, so that it happens where it is written: hoisted out of a loop, the split operands
// of a whole head would stay in registers and spill.
__device__ __forceinline__ unsigned to_tf32(float x) {
    unsigned r;
    asm volatile("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
#endif

// GELU, tanh approximation, as core/src/ops/matmul.rs: x * sigmoid(2u), u = sqrt(2/pi)(x + 0.044715 x^3).
#define GELU_SCALE 0.7978845608028654f
#define GELU_CUBIC 0.044715f

__device__ __forceinline__ float gelu_sigmoid(float x) {
    float u = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
    return 1.0f / (1.0f + expf(-2.0f * u));
}

// GELU's slope at x given s = gelu_sigmoid(x).
__device__ __forceinline__ float gelu_slope(float x, float s) {
    float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * x * x);
    return s + 2.0f * x * s * (1.0f - s) * du;
}

// Philox4x32-10 (core/src/ops/dropout.rs): word `idx % 4` at counter
// [idx / 4, site, draw_lo, draw_hi] and key [seed_lo, seed_hi] decides element idx.
struct DropoutKey {
    unsigned int seed_lo, seed_hi, draw_lo, draw_hi;
};

__device__ __forceinline__ unsigned int philox_word(unsigned long long idx, unsigned int site, DropoutKey key) {
    unsigned int c0 = (unsigned int)(idx / 4), c1 = site, c2 = key.draw_lo, c3 = key.draw_hi;
    unsigned int k0 = key.seed_lo, k1 = key.seed_hi;
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        unsigned long long p0 = 0xD2511F53ull * c0;
        unsigned long long p1 = 0xCD9E8D57ull * c2;
        unsigned int n0 = (unsigned int)(p1 >> 32) ^ c1 ^ k0;
        unsigned int n1 = (unsigned int)p1;
        unsigned int n2 = (unsigned int)(p0 >> 32) ^ c3 ^ k1;
        unsigned int n3 = (unsigned int)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    }
    unsigned int w = (unsigned int)(idx % 4);
    return w == 0 ? c0 : w == 1 ? c1 : w == 2 ? c2 : c3;
}

// A dropout site as a kernel takes it: whether it drops, the site's id, its threshold and
// scale (1 / (1 - p)), and where the micro-batch's key lies in device memory (with the batch:
// the same launch every step, as a CUDA graph replays it).
struct DropoutSite {
    int on;
    unsigned int site;
    unsigned int threshold;
    float scale;
    const DropoutKey* key;
};

// The site with its key loaded, as a kernel's threads use it.
struct Dropout {
    int on;
    unsigned int site;
    unsigned int threshold;
    float scale;
    DropoutKey key;
};

__device__ __forceinline__ Dropout load_dropout(DropoutSite s) {
    Dropout d = {s.on, s.site, s.threshold, s.scale, {0u, 0u, 0u, 0u}};
    if (s.on) d.key = *s.key;
    return d;
}

// What dropout multiplies element idx by: 0 where dropped, else `scale` (1 / (1 - p)).
__device__ __forceinline__ float dropout_factor(unsigned long long idx, unsigned int site, unsigned int threshold, float scale, DropoutKey key) {
    return philox_word(idx, site, key) >= threshold ? scale : 0.0f;
}
