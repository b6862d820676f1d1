// The CUDA kernels on the host, for alpha-cuda's tests without a GPU (the `emulate`
// feature): each kernel file compiles as C++ after this header, and `emu_launch` runs a
// launch's blocks one after another on the calling thread, each block's threads as fibers
// (started with ucontext, switched with _setjmp/_longjmp, which save no signal mask: no
// system call per switch) that switch only where CUDA threads wait for one another:
// __syncthreads (the block) and the warps' shuffles (the warp); a launch's fibers run its
// blocks one after another. Slow, and only as exact as the kernels' own
// arithmetic on this CPU: a check of the kernels' logic (indexing, reductions, masks,
// barriers), not of the device's rounding or speed.
#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ucontext.h>
#include <utility>
#include <vector>

// CUDA's device math takes `isfinite` unqualified; <cmath> declares it in std only.
using std::isfinite;

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
struct float4 {
    float x, y, z, w;
};

// Per OS thread: tests launch from several at once.
static thread_local dim3 threadIdx, blockIdx;
static thread_local dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
// One block runs at a time on a thread: a thread-local static is the block's shared memory.
#define __shared__ static thread_local


// A CUDA thread of the running block.
struct Fiber {
    enum State { Runnable, AtWarp, AtBlock, Done } state;
    bool started;
    ucontext_t context;
    std::jmp_buf jump;
};
static thread_local std::vector<Fiber> fibers;
static thread_local std::vector<char> stacks;
static const std::size_t STACK = 64 * 1024;
static thread_local std::jmp_buf scheduler;
static thread_local Fiber* current;
static thread_local void (*running_entry)(void**);
static thread_local void** running_args;
static thread_local float warp_values[32][32];

// The running fiber waits (in `state`) until the scheduler lets it go on.
inline void wait_as(Fiber::State state) {
    current->state = state;
    if (!_setjmp(current->jump)) _longjmp(scheduler, 1);
}

inline void __syncthreads() { wait_as(Fiber::AtBlock); }

inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    warp_values[warp][lane] = v;
    wait_as(Fiber::AtWarp);
    float other = warp_values[warp][lane ^ lane_mask];
    wait_as(Fiber::AtWarp);
    return other;
}

// A fiber's life: the kernel once per block, waiting as Done between blocks.
static void fiber_main() {
    for (;;) {
        running_entry(running_args);
        wait_as(Fiber::Done);
    }
}

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}

inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}

inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// common.cuh's tensor-core product, computed from its definition in PTX's fragment layout:
// each lane posts its fragments, waits for its warp's, and sums its four elements of D over
// the 16 products in order (the device's order of summation is its own).
#define ALPHA_HOST
static thread_local unsigned warp_a[32][32][4], warp_b[32][32][2];

inline float bf16_half(unsigned reg, int high) { return __int_as_float((int)((high ? reg >> 16 : reg & 0xffffu) << 16)); }

inline void mma_bf16(float* d, const unsigned* a, const unsigned* b) {
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    std::memcpy(warp_a[warp][lane], a, sizeof warp_a[warp][lane]);
    std::memcpy(warp_b[warp][lane], b, sizeof warp_b[warp][lane]);
    wait_as(Fiber::AtWarp);
    for (int i = 0; i < 4; ++i) {
        int row = g + 8 * (i / 2), col = 2 * t + i % 2;
        float sum = d[i];
        for (int k = 0; k < 16; ++k) {
            float x = bf16_half(warp_a[warp][4 * (row % 8) + (k % 8) / 2][row / 8 + 2 * (k / 8)], k % 2);
            float y = bf16_half(warp_b[warp][4 * col + (k % 8) / 2][k / 8], k % 2);
            sum += x * y;
        }
        d[i] = sum;
    }
    wait_as(Fiber::AtWarp);
}

// TF32's product as mma.m16n8k8 (common.cuh's layout), the operands' low 13 bits ignored as
// the device ignores them.
inline float tf32_value(unsigned reg) { return __int_as_float((int)(reg & 0xffffe000u)); }

inline void mma_tf32(float* d, const unsigned* a, const unsigned* b) {
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    std::memcpy(warp_a[warp][lane], a, 4 * sizeof(unsigned));
    std::memcpy(warp_b[warp][lane], b, 2 * sizeof(unsigned));
    wait_as(Fiber::AtWarp);
    for (int i = 0; i < 4; ++i) {
        int row = g + 8 * (i / 2), col = 2 * t + i % 2;
        float sum = d[i];
        for (int k = 0; k < 8; ++k) {
            float x = tf32_value(warp_a[warp][4 * (row % 8) + k % 4][row / 8 + 2 * (k / 4)]);
            float y = tf32_value(warp_b[warp][4 * col + k % 4][k / 4]);
            sum += x * y;
        }
        d[i] = sum;
    }
    wait_as(Fiber::AtWarp);
}

// cvt.rna.tf32.f32: to nearest, ties away from zero (a carry into the exponent rounds up a
// power of two, or to infinity); NaN stays NaN.
inline unsigned to_tf32(float x) {
    unsigned u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return u | 0x400000u;
    return (u + 0x1000u) & 0xffffe000u;
}

// Calls `kernel` with the arguments `args` points to, as cuLaunchKernel's kernelParams.
template <typename... A, std::size_t... I>
void call_unpacked(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<A*>(args[I])...);
}
template <typename... A>
void call_with(void (*kernel)(A...), void** args) {
    call_unpacked(kernel, args, std::index_sequence_for<A...>{});
}

// Kernel `NAME` as `emu_NAME(void** args)`, for emu_launch.
#define EMULATE(NAME) \
    extern "C" void emu_##NAME(void** args) { call_with(NAME, args); }

// Resumes thread `t` of the block (starting its fiber the first time).
static void resume(unsigned t) {
    current = &fibers[t];
    threadIdx.x = t;
    if (_setjmp(scheduler)) return;
    if (current->started) _longjmp(current->jump, 1);
    current->started = true;
    ucontext_t from;
    swapcontext(&from, &current->context);
}

// Runs the block's threads until each is done or waits at __syncthreads: warp by warp, the
// lanes of a warp taking turns until all of them wait at a shuffle, which then lets them on.
static void run_to_block_barrier(unsigned block) {
    for (unsigned w = 0; w * 32 < block; ++w) {
        unsigned first = 32 * w, last = std::min(block, first + 32);
        for (;;) {
            for (unsigned t = first; t < last; ++t)
                if (fibers[t].state == Fiber::Runnable) resume(t);
            bool at_warp = false, all_at_warp = true;
            for (unsigned t = first; t < last; ++t) {
                at_warp |= fibers[t].state == Fiber::AtWarp;
                all_at_warp &= fibers[t].state == Fiber::AtWarp || fibers[t].state == Fiber::Done;
            }
            if (!at_warp) break;
            if (!all_at_warp) {
                // Some lanes wait at a shuffle, others at __syncthreads: not a valid kernel.
                std::abort();
            }
            for (unsigned t = first; t < last; ++t)
                if (fibers[t].state == Fiber::AtWarp) fibers[t].state = Fiber::Runnable;
        }
    }
}

// Runs `entry` (an emu_ wrapper) over `grid` blocks of `block` threads, now.
extern "C" void emu_launch(void (*entry)(void**), unsigned grid, unsigned block, void** args) {
    gridDim.x = grid;
    blockDim.x = block;
    running_entry = entry;
    running_args = args;
    fibers.assign(block, Fiber{});
    stacks.resize(block * STACK);
    for (unsigned t = 0; t < block; ++t) {
        Fiber& f = fibers[t];
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = &stacks[t * STACK];
        f.context.uc_stack.ss_size = STACK;
        f.context.uc_link = nullptr;
        makecontext(&f.context, fiber_main, 0);
    }
    for (unsigned b = 0; b < grid; ++b) {
        blockIdx.x = b;
        for (auto& f : fibers) f.state = Fiber::Runnable;
        for (;;) {
            run_to_block_barrier(block);
            bool waiting = false;
            for (auto& f : fibers)
                if (f.state == Fiber::AtBlock) {
                    f.state = Fiber::Runnable;
                    waiting = true;
                }
            if (!waiting) break;
        }
    }
}
