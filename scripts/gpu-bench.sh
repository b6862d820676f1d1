#!/usr/bin/env bash
# Alpha's whole GPU measurement in one command, within 10 minutes on an H100: build,
# (with a CUDA build: the CUDA device's peaks, CUDA-against-CPU parity and `bench --backend
# cuda` in f32 and bf16 against PyTorch eager),
# CPU-against-GPU parity, the GPU's FMA limits (and the tensor cores'), what its driver's
# compiler made of each kernel (registers, local memory), `bench --backend gpu`
# for the small, baby, GPT-2 124M and SmolLM2-135M (Llama family) configs against PyTorch on the same card (eager and
# torch.compile, fp32 and bf16 autocast; Alpha's --precision f16 on the SIMT kernels, and on
# the tensor cores where the driver has the shape they need, against bf16), and the top
# kernels of each config's traced steps with their achieved rates; it ends with one Markdown
# section (date, card, driver, commit) for docs/performance.md.
#
# What a fresh GPU machine needs:
#   - The Vulkan loader (libvulkan.so.1; Debian/Ubuntu package libvulkan1) and the GPU's Vulkan
#     driver; NVIDIA's also loads glvnd's libraries (libglvnd0, libegl1, libgl1, libglx0,
#     libopengl0, libgles2), without which wgpu finds no adapter. NVIDIA's driver ships its
#     ICD file (nvidia_icd.json); where `alpha-native info --backend gpu` finds no adapter,
#     point the loader at it, e.g.
#     export VK_DRIVER_FILES=/usr/share/vulkan/icd.d/nvidia_icd.json (or where the driver put it).
#     On a bare lent GPU machine, `. scripts/lent-gpu-env.sh` first does all of this (and puts
#     CUDA's libraries on the library path) from the packages `scripts/cuda-check.sh --build`
#     packed.
#   - alpha-native: built here when cargo is on PATH; else the binary at $ALPHA_NATIVE (default
#     target/release/alpha-native) built on a machine with the same or an older glibc.
#   - python3 (the parity check); PyTorch with CUDA for the PyTorch rows (left out without it).
#
#   scripts/gpu-bench.sh [OUT_DIR]     (default: gpu-bench/; the summary is OUT_DIR/gpu-bench.md)
#
# Environment: ALPHA_NATIVE (the binary), ALPHA_COMMIT (the commit ALPHA_NATIVE was built from;
# default the checkout's), GPU_BENCH_CONFIGS (default "small baby gpt2 smollm2"; "small" alone runs on
# lavapipe in a few minutes, a check of this script; "gpt2-b32 gpt2-medium" are issue 71's MFU
# and gpt2-medium goals, GPT-2 124M at batch 32 and 350M at batch 16, block 1024: a few minutes
# more, so not by default), GPU_BENCH_ROUNDS (alternating rounds per
# config, default 2), GPU_BENCH_COMPILE (0 leaves out the torch.compile rows, which compile for
# a minute each), GPU_BENCH_BACKENDS (default "cuda gpu"; "cuda" alone measures the CUDA executor
# without wgpu, which needs the Vulkan loader: a lent GPU's minutes for the rows that changed),
# GPU_BENCH_BASELINES (other builds of alpha-native to time this one against on
# the same card, as LABEL=PATH separated by spaces, e.g. "e12daff=/tmp/alpha-e12daff": the
# baby config's steps, or the first config's, in f32 and, where the driver has the shape, in
# f16 on the tensor cores, in alternating rounds; then each build's top kernels in f32;
# scripts/build-revisions.sh builds them and prints this list), GPU_BENCH_SWITCHES (CUDA's
# switches to time off against all on, e.g. "ALPHA_CUDA_FUSED_EPILOGUES ALPHA_CUDA_BF16_ACTIVATIONS
# ALPHA_CUDA_GRAPHS": the gpt2 config's bf16 steps, or the first config's, each switch set to 0
# in turn, in alternating rounds; a minute or two).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-bench}
mkdir -p "$out"
summary="$out/gpu-bench.md"
rounds=${GPU_BENCH_ROUNDS:-2}
read -r -a configs <<< "${GPU_BENCH_CONFIGS:-small baby gpt2 smollm2}"
# Each config's bench flags (compare_pytorch.py's shapes on a GPU).
declare -A shape=(
    [small]="--layers 4 --heads 4 --embd 128 --block 64 --batch 12"
    [baby]="--layers 6 --heads 6 --embd 384 --block 256 --batch 64"
    [gpt2]="--model gpt2 --vocab-pad 64 --block 1024 --batch 8"
    [smollm2]="--model smollm2-135m --block 512 --batch 4"
    [gpt2-b32]="--model gpt2 --vocab-pad 64 --block 1024 --batch 32"
    [gpt2-medium]="--model gpt2-medium --vocab-pad 64 --block 1024 --batch 16"
)
for c in "${configs[@]}"; do
    [ -n "${shape[$c]:-}" ] || { echo "GPU_BENCH_CONFIGS: no config $c (small, baby, gpt2, smollm2, gpt2-b32, gpt2-medium)" >&2; exit 1; }
done
read -r -a backends <<< "${GPU_BENCH_BACKENDS:-cuda gpu}"
for b in "${backends[@]}"; do
    [ "$b" = cuda ] || [ "$b" = gpu ] || { echo "GPU_BENCH_BACKENDS: no backend $b (cuda, gpu)" >&2; exit 1; }
done
wgpu=0
[[ " ${backends[*]} " == *" gpu "* ]] && wgpu=1
started=$SECONDS
stage() { echo "== $1 ($((SECONDS - started)) s)" >&2; }
# The GPU backend parity() trains on.
parity_backend=gpu

stage "build"
if command -v cargo >/dev/null; then
    cargo build --release -q -p alpha-native --features cuda
    alpha=target/release/alpha-native
else
    alpha=${ALPHA_NATIVE:-target/release/alpha-native}
fi
[ -x "$alpha" ] || { echo "no alpha-native at $alpha: install Rust (cargo) or set ALPHA_NATIVE" >&2; exit 1; }
commit=${ALPHA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}

if [ $wgpu = 1 ]; then
    stage "the GPU and its FMA limits"
    "$alpha" info --backend gpu --json --measure-steps 0 > "$out/info.json"
    card=$(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); a=d["device"] or {}; g=d["gpu_adapters"]; p=d["gpu_peak_gflops"]
name = g[0]["name"] if g else "?"; drv = g[0]["driver"] if g else "?"
f16 = "f16 %.3g TFLOP/s" % (p["f16"] / 1e3) if p["f16"] else "no shader-f16"
coop = ", ".join(g[0]["cooperative_matrices"]) if g else ""
print("%s (Vulkan driver %s); FMA limits f32 %.3g TFLOP/s, %s; cooperative matrices: %s" % (name, drv, p["f32"] / 1e3, f16, coop or "none"))' "$out/info.json")
    # The tensor cores' limit (the MFU denominator of --tensor-cores runs) where the driver has the
    # shape matmul_tensor needs.
    if grep -q '16x16x16 f16->f32' "$out/info.json"; then
        "$alpha" info --backend gpu --precision f16 --tensor-cores --json --measure-steps 0 > "$out/info-tensor.json"
        card="$card; tensor cores (16x16x16 f16->f32) $(python3 -c 'import json,sys; print("%.3g TFLOP/s" % (json.load(open(sys.argv[1]))["gpu_peak_gflops"]["tensor"] / 1e3))' "$out/info-tensor.json")"
    fi
else
    "$alpha" info --json --measure-steps 0 > "$out/info.json"
    card="the CUDA device below (wgpu left out: GPU_BENCH_BACKENDS=${backends[*]})"
fi
{
    echo "### GPU bench: $(date -u +%Y-%m-%d), commit $commit"
    echo
    echo "\`scripts/gpu-bench.sh\` on $card; host: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["cpu"])' "$out/info.json")."
    echo
} > "$summary"

# What the driver's compiler made of each kernel at the baby config's head size (registers per
# thread, local memory: occupancy and spills): with the f16 variants and the tensor-core GEMM
# where the device has them, else fewer; a failure is reported and the rest goes on.
kernel_runs=()
if [ $wgpu = 1 ]; then
    stage "the driver's statistics of each kernel"
    grep -q '16x16x16 f16->f32' "$out/info.json" && kernel_runs+=("--precision f16 --tensor-cores")
    grep -q '"shader-f16"' "$out/info.json" && kernel_runs+=("--precision f16 --tensor-cores off")
    kernel_runs+=("")
else
    { echo "The driver's statistics of each kernel: wgpu left out (GPU_BENCH_BACKENDS)"; echo; } >> "$summary"
fi
for kernel_flags in "${kernel_runs[@]}"; do
    # shellcheck disable=SC2086 # the flags split on purpose
    if "$alpha" info --backend gpu --kernels --json --measure-steps 0 ${shape[baby]} $kernel_flags > "$out/kernels.json" 2> "$out/kernels.err"; then
        python3 - "$out/kernels.json" "$kernel_flags" >> "$summary" <<'PY'
import json, sys
kernels, flags = json.load(open(sys.argv[1]))["gpu_kernels"] or [], sys.argv[2]
names = list(dict.fromkeys(name for k in kernels for name, _ in k["statistics"]))
print(f"What the driver compiled, `info --backend gpu --kernels{' ' + flags if flags else ''}` at head size 64:\n")
print("| kernel | " + " | ".join(names) + " |")
print("|---|" + "---|" * len(names))
for k in kernels:
    values = dict(k["statistics"])
    print(f"| {k['kernel']} | " + " | ".join(values.get(name, "") for name in names) + " |")
print()
PY
        break
    fi
    echo "The driver's statistics of each kernel${kernel_flags:+ ($kernel_flags)} failed: $(tail -n 1 "$out/kernels.err")" >> "$summary"
    echo >> "$summary"
done

# 20 training steps of one model on the CPU and of the same model on the GPU with GPU_FLAGS
# (on $parity_backend: gpu, or cuda),
# their losses within TOLERANCE relative per step (a line for the summary, or a failure).
# Usage: parity NAME LABEL TOLERANCE MODEL_FLAGS -- GPU_FLAGS (NAME names its files).
parity() {
    local name=$1 label=$2 tolerance=$3
    shift 3
    local model=() gpu=()
    while [ "$1" != "--" ]; do model+=("$1"); shift; done
    shift
    gpu=("$@")
    for run in cpu gpu; do
        local flags=(--backend cpu)
        [ $run = gpu ] && flags=(--backend "$parity_backend" "${gpu[@]}")
        rm -rf "$out/parity-$name-$run" "$out/parity-$name-$run.jsonl"
        "$alpha" train "${model[@]}" "${flags[@]}" --iters 20 --log-interval 1 --eval-interval 0 --sample-interval 0 \
            --metrics "$out/parity-$name-$run.jsonl" --out "$out/parity-$name-$run" > /dev/null
    done
    python3 - "$out/parity-$name-cpu.jsonl" "$out/parity-$name-gpu.jsonl" "$label" "$tolerance" <<'PY'
import json, sys
def losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if r.get("type") == "train"]
cpu, gpu = losses(sys.argv[1]), losses(sys.argv[2])
label, tolerance = sys.argv[3], float(sys.argv[4])
worst = max(abs(a - b) / abs(a) for a, b in zip(cpu, gpu))
print(f"Parity, {label}: 20 training steps on the CPU and the GPU differ by at most {worst:.1e} relative per step"
      f" (at most {tolerance:g}; loss {cpu[0]:.4f} -> {cpu[-1]:.4f}).\n")
if len(cpu) != len(gpu) or len(cpu) < 20 or worst > tolerance:
    sys.exit(f"parity failed ({label}): {len(cpu)} CPU and {len(gpu)} GPU steps, worst relative difference {worst:.2e} (at most {tolerance:g})")
PY
}

# traced_steps BACKEND CONFIG FILE [FLAGS...]: 3 traced steps of CONFIG on BACKEND (after 2
# warm-up steps) into FILE.trace.json, and their ms per step, FLOPs and top kernels with their
# achieved rates into the summary. A config the device cannot hold is reported and the others
# still run.
traced_steps() {
    local backend=$1 name=$2 file=$3
    shift 3
    stage "trace of the $name config's steps on $backend${*:+ ($*)}"
    # shellcheck disable=SC2086 # the shape's flags split on purpose
    if "$alpha" bench --backend "$backend" --iters 3 --warmup 2 --trace "$file.trace.json" --overwrite ${shape[$name]} "$@" > "$file.trace.txt" 2>&1; then
        {
            echo "The $name config, \`bench --backend $backend${*:+ $*} --trace\` (3 steps):"
            echo
            sed -n '/^  ms\/iter/p;/^  FLOPs/p' "$file.trace.txt"
            echo
            sed -n '/^trace:/,$p' "$file.trace.txt"
            echo
        } >> "$summary"
    else
        echo "The $name config's trace on $backend${*:+ ($*)} failed: $(tail -n 1 "$file.trace.txt")" >> "$summary"
        echo >> "$summary"
    fi
}

# switches_off CONFIG SWITCH...: CONFIG's bf16 steps on CUDA with everything on and with each
# SWITCH=0 in turn, in alternating rounds, as a table of medians and ratios in the summary.
switches_off() {
    local name=$1
    shift
    stage "CUDA with each of $* off against all on: the $name config in bf16 ($rounds rounds)"
    rm -f "$out"/switch-*.ms
    local round s
    for round in $(seq "$rounds"); do
        for s in all-on "$@"; do
            local off=()
            [ "$s" = all-on ] || off=("$s=0")
            # shellcheck disable=SC2086 # the shape's flags split on purpose
            if env "${off[@]}" "$alpha" bench --backend cuda --precision bf16 --json --iters 10 --warmup 3 ${shape[$name]} > "$out/switch.json" 2> "$out/switch.err"; then
                python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ms_per_iter"]["median"])' "$out/switch.json" >> "$out/switch-$s.ms"
            else
                echo "$round, $s: $(tail -n 1 "$out/switch.err")" >&2
            fi
        done
    done
    python3 - "$out" "$name" all-on "$@" >> "$summary" <<'PY'
import os, statistics, sys
out, config, names = sys.argv[1], sys.argv[2], sys.argv[3:]
median = {}
for name in names:
    path = f"{out}/switch-{name}.ms"
    times = [float(t) for t in open(path)] if os.path.exists(path) else []
    median[name] = (statistics.median(times), len(times)) if times else None
print(f"CUDA's switches, the {config} config, `bench --backend cuda --precision bf16 --iters 10 --warmup 3` in alternating rounds (median ms per step):\n")
print("| run | ms per step | all on is faster by |")
print("|---|---|---|")
for name in names:
    label = "all on" if name == "all-on" else f"{name}=0"
    if median[name] is None:
        print(f"| {label} | failed | - |")
        continue
    ms, n = median[name]
    ratio = f"{ms / median['all-on'][0]:.3f}x" if median["all-on"] and name != "all-on" else "-"
    print(f"| {label} | {ms:.2f} ({n} rounds) | {ratio} |")
print()
PY
}

# The CUDA executor (a build with --features cuda): the device, its measured peaks, 20
# steps against the CPU in f32 (TF32 off) and bf16, each config in f32 and bf16 against
# PyTorch eager fp32 and bf16 autocast (1 round each: GPU rounds agree within 1%), and each
# config's traced steps in bf16 (where the step's time goes, kernel by kernel).
if [[ " ${backends[*]} " != *" cuda "* ]]; then
    echo "No CUDA rows: left out (GPU_BENCH_BACKENDS=${backends[*]})" >> "$summary"
    echo >> "$summary"
elif "$alpha" info --backend cuda --json --measure-steps 0 > "$out/info-cuda.json" 2> "$out/info-cuda.err"; then
    stage "CUDA: parity and bench"
    python3 - "$out/info-cuda.json" >> "$summary" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["cuda"]
bf16 = "%.0f" % (c["peak_bf16_gflops"] / 1e3) if c["peak_bf16_gflops"] else "-"
print(f"CUDA: {c['name']} ({c['arch']}, driver {c['driver_version']}); cuBLASLt 8192^3 products: f32 {c['peak_f32_gflops'] / 1e3:.1f}"
      f" TFLOP/s, TF32 {c['peak_tf32_gflops'] / 1e3:.0f}, bf16 {bf16}; copy bandwidth {c['bandwidth_gbs']:.0f} GB/s.\n")
PY
    parity_backend=cuda
    parity cuda-f32 "the default model in f32 on CUDA" 1e-5 -- >> "$summary" || echo "Parity on CUDA in f32: FAILED" | tee -a "$summary"
    parity cuda-bf16 "2L/256E, block 128, batch 32 in bf16 on CUDA" 2e-2 --layers 2 --heads 4 --embd 256 --block 128 --batch 32 -- --precision bf16 >> "$summary" \
        || echo "Parity on CUDA in bf16: FAILED" | tee -a "$summary"
    parity_backend=gpu
    if python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
        python3 scripts/compare_pytorch.py --alpha "$alpha" --backend cuda --configs "${configs[@]}" --rounds 1 --peers eager | tee -a "$summary"
        echo >> "$summary"
        python3 scripts/compare_pytorch.py --alpha "$alpha" --alpha-flags="--precision bf16" --backend cuda --configs "${configs[@]}" --rounds 1 \
            --peers eager-bf16 | tee -a "$summary"
        echo >> "$summary"
    fi
    for name in "${configs[@]}"; do
        traced_steps cuda "$name" "$out/cuda-$name-bf16" --precision bf16
    done
    if [ -n "${GPU_BENCH_SWITCHES:-}" ]; then
        switch_config=${configs[0]}
        [[ " ${configs[*]} " == *" gpt2 "* ]] && switch_config=gpt2
        read -r -a switches <<< "$GPU_BENCH_SWITCHES"
        switches_off "$switch_config" "${switches[@]}"
    fi
    if [ "${GPU_BENCH_COMPILE:-1}" != 0 ] && python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
        stage "CUDA bf16 against torch.compile bf16 (1 round)"
        python3 scripts/compare_pytorch.py --alpha "$alpha" --alpha-flags="--precision bf16" --backend cuda --configs "${configs[@]}" --rounds 1 \
            --peers compile-bf16 | tee -a "$summary"
        echo >> "$summary"
    fi
else
    echo "No CUDA rows: $(tail -n 1 "$out/info-cuda.err")" >> "$summary"
    echo >> "$summary"
fi

if [ $wgpu = 0 ]; then
    stage "done"
    cat "$summary"
    exit 0
fi

stage "parity: 20 training steps on the CPU and on the GPU"
parity f32 "the default model in f32" 1e-5 -- >> "$summary"
# A model most of whose products take the 128 x 128 tiles (the tensor cores' with
# --tensor-cores), in f16 against the CPU's f32 at the f16 tolerance.
wide=(--layers 2 --heads 4 --embd 256 --block 128 --batch 32)
# The f16 paths are measured only where their parity holds; a failure is reported and the
# f32 measurements go on.
f16_ok=0
tensor_ok=0
if grep -q '"shader-f16"' "$out/info.json"; then
    label="2L/256E, block 128, batch 32 in f16"
    if parity f16 "$label" 2e-2 "${wide[@]}" -- --precision f16 --tensor-cores off >> "$summary"; then
        f16_ok=1
    else
        echo "Parity, $label: FAILED (see the log); f16 is left out below." | tee -a "$summary"
    fi
fi
if grep -q '16x16x16 f16->f32' "$out/info.json"; then
    label="2L/256E, block 128, batch 32 in f16 on the tensor cores"
    if parity tensor "$label" 2e-2 "${wide[@]}" -- --precision f16 --tensor-cores >> "$summary"; then
        tensor_ok=1
    else
        echo "Parity, $label: FAILED (see the log); the tensor cores are left out below." | tee -a "$summary"
    fi
fi

if [ -n "${GPU_BENCH_BASELINES:-}" ]; then
    ab_config=${configs[0]}
    [[ " ${configs[*]} " == *" baby "* ]] && ab_config=baby
    stage "this build against $GPU_BENCH_BASELINES: the $ab_config config ($rounds rounds)"
    read -r -a builds <<< "$commit=$alpha $GPU_BENCH_BASELINES"
    ab_flags=("")
    [ $tensor_ok = 1 ] && ab_flags+=("--precision f16 --tensor-cores")
    rm -f "$out"/ab-*.ms
    for round in $(seq "$rounds"); do
        for i in "${!ab_flags[@]}"; do
            for build in "${builds[@]}"; do
                # shellcheck disable=SC2086 # the flags split on purpose
                if "${build#*=}" bench --backend gpu --json --iters 20 --warmup 3 ${shape[$ab_config]} ${ab_flags[$i]} > "$out/ab.json" 2> "$out/ab.err"; then
                    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ms_per_iter"]["median"])' "$out/ab.json" >> "$out/ab-${build%%=*}-$i.ms"
                else
                    echo "$round: $(tail -n 1 "$out/ab.err")" >&2
                fi
            done
        done
    done
    python3 - "$out" "$ab_config" "${#ab_flags[@]}" "${builds[@]}" >> "$summary" <<'PY'
import os, statistics, sys
out, config, flag_sets, builds = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
names = ["f32", "f16 --tensor-cores"][:flag_sets]
print(f"This build against others, the {config} config, `bench --backend gpu --iters 20 --warmup 3` in alternating rounds (median ms per step of each round's median):\n")
print("| build | " + " | ".join(names) + " |")
print("|---|" + "---|" * flag_sets)
for build in builds:
    label = build.split("=", 1)[0]
    cells = []
    for i in range(flag_sets):
        path = f"{out}/ab-{label}-{i}.ms"
        times = [float(t) for t in open(path)] if os.path.exists(path) else []
        cells.append(f"{statistics.median(times):.2f} ({len(times)} rounds)" if times else "failed")
    print(f"| {label} | " + " | ".join(cells) + " |")
print()
PY
    # Kernel by kernel: one traced run of each build in f32, so that each kernel's change can
    # be kept or undone on its own.
    stage "each build's trace of the $ab_config config"
    for build in "${builds[@]}"; do
        # shellcheck disable=SC2086 # the flags split on purpose
        "${build#*=}" bench --backend gpu --iters 3 --warmup 2 --trace "$out/ab-${build%%=*}.trace.json" --overwrite \
            ${shape[$ab_config]} > "$out/ab-${build%%=*}.trace.txt" 2>&1 || echo "trace of ${build%%=*} failed" >&2
    done
    python3 - "$out" "$ab_config" "${builds[@]}" >> "$summary" <<'PY'
import os, sys
out, config = sys.argv[1], sys.argv[2]
labels = [b.split("=", 1)[0] for b in sys.argv[3:]]

def kernels(label):
    """ms per step of each (op or kernel, pass) row of a build's trace table."""
    path, times, table = f"{out}/ab-{label}.trace.txt", {}, False
    for line in open(path) if os.path.exists(path) else []:
        table = table or line.startswith("trace:")
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if table and line.startswith("|") and len(cells) >= 3:
            try:
                times[f"{cells[0]}, {cells[1]}"] = float(cells[2])
            except ValueError:
                pass
    return times

traced = {label: kernels(label) for label in labels}
rows = sorted(set().union(*traced.values()), key=lambda k: -max(t.get(k, 0.0) for t in traced.values()))
print(f"Each build's top kernels, the {config} config in f32 (`bench --backend gpu --trace`, 3 steps; ms per step):\n")
print("| op or kernel, pass | " + " | ".join(labels) + " |")
print("|---|" + "---|" * len(labels))
for k in rows:
    print(f"| {k} | " + " | ".join(f"{traced[b][k]:.3f}" if k in traced[b] else "-" for b in labels) + " |")
print()
PY
fi

torch_cuda=0
python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null && torch_cuda=1
if [ $torch_cuda = 1 ]; then
    stage "Alpha against PyTorch eager, fp32 and bf16 ($rounds rounds per config)"
    python3 scripts/compare_pytorch.py --alpha "$alpha" --backend gpu --configs "${configs[@]}" --rounds "$rounds" \
        --peers eager eager-bf16 | tee -a "$summary"
    echo >> "$summary"
    # f16 mixed precision against bf16 autocast: the SIMT products, and on the tensor cores
    # where the driver has the shape they need.
    f16_runs=()
    [ $f16_ok = 1 ] && f16_runs+=("--precision f16 --tensor-cores off")
    [ $tensor_ok = 1 ] && f16_runs+=("--precision f16 --tensor-cores")
    # One round each (GPU rounds agreed within 1% on the H200), to stay within 10 minutes.
    for flags in "${f16_runs[@]}"; do
        stage "Alpha $flags against PyTorch eager bf16 (1 round per config)"
        python3 scripts/compare_pytorch.py --alpha "$alpha" --alpha-flags="$flags" --backend gpu --configs "${configs[@]}" \
            --rounds 1 --peers eager-bf16 | tee -a "$summary"
        echo >> "$summary"
    done
else
    stage "no PyTorch with CUDA: Alpha alone"
    echo "| config | Alpha ms/iter | tokens/s | MFU (f32 FMA limit) |" >> "$summary"
    echo "|---|---|---|---|" >> "$summary"
    for name in "${configs[@]}"; do
        # shellcheck disable=SC2086 # the flags split on purpose
        if "$alpha" bench --backend gpu --json --iters 20 --warmup 3 ${shape[$name]} > "$out/$name.bench.json" 2> "$out/$name.bench.err"; then
            python3 -c 'import json,sys; r=json.load(open(sys.argv[2]))
print("| %s | %.1f | %.0f | %.1f%% |" % (sys.argv[1], r["ms_per_iter"]["median"], r["tokens_per_sec"], 100 * r["mfu"]))' "$name" "$out/$name.bench.json" >> "$summary"
        else
            echo "| $name | failed: $(tail -n 1 "$out/$name.bench.err") | | |" >> "$summary"
        fi
    done
    echo >> "$summary"
fi

# Each config's traced steps in f32, and baby's on the f16 path too (on the tensor cores where
# the driver has their shape).
traces=()
for name in "${configs[@]}"; do traces+=("$name|"); done
f16_trace=""
[ $f16_ok = 1 ] && f16_trace="--precision f16 --tensor-cores off"
[ $tensor_ok = 1 ] && f16_trace="--precision f16 --tensor-cores"
if [ -n "$f16_trace" ] && [[ " ${configs[*]} " == *" baby "* ]]; then traces+=("baby|$f16_trace"); fi
for t in "${traces[@]}"; do
    name=${t%%|*}
    flags=${t#*|}
    # shellcheck disable=SC2086 # the flags split on purpose
    traced_steps gpu "$name" "$out/$name${flags:+-f16}" $flags
done

# torch.compile last: its compiles are the slowest part, and a time limit then cuts only them.
if [ $torch_cuda = 1 ] && [ "${GPU_BENCH_COMPILE:-1}" != 0 ]; then
    stage "Alpha against torch.compile, fp32 and bf16 (1 round)"
    python3 scripts/compare_pytorch.py --alpha "$alpha" --backend gpu --configs "${configs[@]}" --rounds 1 \
        --peers compile compile-bf16 | tee -a "$summary"
    echo >> "$summary"
fi

stage "done"
cat "$summary"
