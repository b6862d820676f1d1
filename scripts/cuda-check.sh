#!/usr/bin/env bash
# Every CUDA test, on a lent GPU, within 3 minutes of device time: each kernel file compiles
# with the machine's NVRTC; every kernel against its CPU op (cuda/src/kernel_tests.rs); the
# CUDA engine against the CPU's (cuda/tests/parity.rs: 20 f32 steps within 1e-5 relative with
# TF32 off, dropout's masks, bf16 within 2e-2 of f32, bf16 activations against f32 ones (the
# first step's loss bit for bit), --recompute and resume bit for bit, evaluation, greedy
# samples past the window); 2 ranks against --grad-accum 2
# (cuda/tests/ranks.rs); then the CLI: a checkpoint trained on CUDA resumed on the CPU, on
# CUDA and, where wgpu finds an adapter, on wgpu (the same losses within 1e-5), a diverging
# run stopped with its last good checkpoint, and with mpirun, 2 ranks on the one GPU against
# one process with --grad-accum 2 (their gradients summed during the backward, and after it).
#
#   scripts/cuda-check.sh --build   here, with Rust (no GPU needed): builds the test binaries
#                                   and alpha-native (--features cuda, and cuda,mpi where Open
#                                   MPI's headers are, with Debian's Open MPI packages for a
#                                   machine without mpirun) into target/cuda-check/, stripped
#                                   of their symbols (what a lent GPU is sent is at most 64 MiB),
#                                   with Debian's Vulkan loader and glvnd for the wgpu rows
#   scripts/cuda-check.sh           on the GPU machine: sets up what it lacks from those
#                                   packages (scripts/lent-gpu-env.sh, which gpu-bench.sh's
#                                   shell sources too), then runs them (ALPHA_REQUIRE_CUDA=1: a
#                                   missing device or library fails instead of skipping); every
#                                   stage runs even when one before it failed (a lent GPU's
#                                   minutes are rare), and the failed ones are named at the end
set -euo pipefail
cd "$(dirname "$0")/.."
dir=target/cuda-check

if [ "${1:-}" = --build ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    for test in kernels kernels_compile parity ranks; do
        target=(--test "$test")
        [ "$test" = kernels ] && target=(--lib)
        bin=$(cargo test --profile test-opt -p alpha-cuda "${target[@]}" --no-run --message-format=json 2>/dev/null \
            | python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable")][-1])')
        cp "$bin" "$dir/$test"
    done
    cargo build -q --profile test-opt -p alpha-native --features cuda
    cp target/test-opt/alpha-native "$dir/alpha-native"
    if pkg-config --exists ompi 2>/dev/null || [ -e /usr/include/x86_64-linux-gnu/openmpi/mpi.h ]; then
        cargo build -q --profile test-opt -p alpha-native --features cuda,mpi --target-dir target/cuda-mpi
        cp target/cuda-mpi/test-opt/alpha-native "$dir/alpha-native-mpi"
        mkdir "$dir/mpi-debs"
        (cd "$dir/mpi-debs" && apt-get download -q openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15 libevent-core-2.1-7 \
            libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1 librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200 \
            libnl-route-3-200 libnuma1 libmunge2)
    fi
    # The Vulkan loader and glvnd's libraries, which NVIDIA's Vulkan driver loads: a lent GPU
    # machine has neither (scripts/lent-gpu-env.sh unpacks them there).
    mkdir "$dir/vulkan-debs"
    (cd "$dir/vulkan-debs" && apt-get download -q libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2)
    find "$dir" -maxdepth 1 -type f -exec strip {} +
    du -sh "$dir"
    ls -la "$dir"
    exit 0
fi

[ -x "$dir/parity" ] || { echo "no $dir/parity: run scripts/cuda-check.sh --build first (on a machine with Rust)" >&2; exit 1; }
# What a bare lent GPU machine lacks (the Vulkan loader, Open MPI, CUDA's libraries on the
# library path), from the packages --build packed.
ALPHA_CUDA_CHECK_DIR=$dir . scripts/lent-gpu-env.sh
export ALPHA_REQUIRE_CUDA=1 ALPHA_REQUIRE_NVRTC=1
started=$SECONDS
failed=()
stage() { current=$1; echo "== $1 ($((SECONDS - started)) s)" >&2; }
fail() { failed+=("$current"); echo "FAILED: $current" >&2; }
stage "every kernel compiles with this machine's NVRTC"
"$dir/kernels_compile" --test-threads 1 || fail
stage "every kernel against its CPU op"
"$dir/kernels" --test-threads 1 || fail
stage "the CUDA engine against the CPU's"
"$dir/parity" --test-threads 1 || fail
stage "2 ranks against --grad-accum 2"
"$dir/ranks" || fail
alpha="$dir/alpha-native"
work=$(mktemp -d)
common=(--layers 2 --heads 2 --embd 96 --block 32 --batch 8 --log-interval 1 --eval-interval 0 --sample-interval 0)
train() { "$alpha" train "${common[@]}" "$@" > /dev/null; }
losses() { python3 -c 'import json,sys; print(" ".join(str(r["loss"]) for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "train"))' "$1"; }
stage "a checkpoint across CUDA and the CPU"
across_backends() {
    local backends=(cpu cuda)
    if "$alpha" info --backend gpu --json --measure-steps 0 > /dev/null 2>&1; then
        backends+=(gpu)
    else
        echo "no wgpu adapter here (the Vulkan loader and driver): the checkpoint is resumed on the CPU and CUDA only"
    fi
    train --backend cuda --iters 10 --out "$work/cuda" || return
    for backend in "${backends[@]}"; do
        cp -r "$work/cuda" "$work/resume-$backend"
        train --backend "$backend" --resume "$work/resume-$backend/ckpt.safetensors" --iters 14 --out "$work/resume-$backend" --metrics "$work/$backend.jsonl" || return
    done
    local runs=()
    for backend in "${backends[@]}"; do runs+=("$backend=$(losses "$work/$backend.jsonl")"); done
    python3 - "${runs[@]}" <<'PY'
import sys
runs = {name: list(map(float, losses.split())) for name, losses in (a.split("=") for a in sys.argv[1:])}
cpu = runs.pop("cpu")
for name, steps in runs.items():
    worst = max(abs(a - b) / a for a, b in zip(cpu, steps))
    assert len(cpu) == len(steps) == 4 and worst <= 1e-5, f"resumed on the CPU {cpu} and on {name} {steps}"
    print(f"a CUDA checkpoint resumed on the CPU and on {name}: 4 steps within {worst:.1e} relative")
PY
}
across_backends || fail
stage "a diverging run stops at the next read and keeps the last good checkpoint"
# The device skips the non-finite steps and the checkpoint after step 1 reads the record first.
diverging() {
    local err=$work/diverge.err
    if "$alpha" train "${common[@]}" --backend cuda --lr 1e30 --warmup 0 --checkpoint-interval 1 --iters 5 --out "$work/diverge" > /dev/null 2> "$err"; then
        echo "a run at --lr 1e30 did not stop"; return 1
    fi
    grep -q "training diverged at step 1: the loss or gradient norm was not finite" "$err" || { cat "$err"; return 1; }
    grep -q "the last good checkpoint (.*step 1) is kept" "$err" || { cat "$err"; return 1; }
    echo "diverged at step 1, the checkpoint of step 1 kept"
}
diverging || fail
if command -v mpirun >/dev/null && [ -x "$dir/alpha-native-mpi" ]; then
    stage "2 ranks on one GPU against --grad-accum 2"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    ranks_against_accumulation() {
        mpirun --oversubscribe -np 2 "$dir/alpha-native-mpi" train "${common[@]}" --backend cuda --device 0 --iters 5 --out "$work/ranks" --metrics "$work/ranks.jsonl" > /dev/null || return
        # The gradients summed after the backward instead of during it: the same sums.
        mpirun --oversubscribe -np 2 -x ALPHA_CUDA_OVERLAP=0 "$dir/alpha-native-mpi" train "${common[@]}" --backend cuda --device 0 --iters 5 --out "$work/after" --metrics "$work/after.jsonl" > /dev/null || return
        train --backend cuda --iters 5 --grad-accum 2 --out "$work/accum" --metrics "$work/accum.jsonl" || return
        python3 - "$(losses "$work/ranks.jsonl")" "$(losses "$work/after.jsonl")" "$(losses "$work/accum.jsonl")" <<'PY'
import sys
ranks, after, accum = [list(map(float, a.split())) for a in sys.argv[1:]]
worst = max(abs(a - b) / a for a, b in zip(ranks, accum))
assert len(ranks) == len(accum) == 5 and worst <= 1e-6, f"2 ranks {ranks}, --grad-accum 2 {accum}"
assert ranks == after, f"2 ranks summing during the backward {ranks}, after it {after}"
print(f"2 ranks on one GPU and --grad-accum 2: 5 steps within {worst:.1e} relative; the sums during the backward give the bits of those after it")
PY
    }
    ranks_against_accumulation || fail
else
    echo "skipped: 2 ranks (no mpirun here, or no alpha-native-mpi in $dir)"
fi
stage "done"
if [ ${#failed[@]} -gt 0 ]; then
    printf 'failed: %s\n' "${failed[@]}" >&2
    exit 1
fi
