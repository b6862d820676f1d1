"""Side-by-side training speed of Alpha and PyTorch eager in one run, alternating the two in
short rounds so that machine noise hits both alike; prints a Markdown table of the median step
time over all rounds' steps and the speed ratio.

Configurations:
  small  nanoGPT's Shakespeare-char CPU run: 4 layers, 4 heads, 128 embd, block 64, batch 12
  baby   nanoGPT's "baby GPT": 6 layers, 6 heads, 384 embd, block 256, batch 64
  gpt2   GPT-2 124M (alpha-native --model gpt2): 12 layers, 12 heads, 768 embd, vocabulary
         50257, block 256, batch 4
  gpt2-b32  GPT-2 124M at batch 32 (on a GPU: block 1024, the MFU goal's shape)
  gpt2-medium  GPT-2 350M (alpha-native --model gpt2-medium): 24 layers, 16 heads, 1024 embd,
         block 256, batch 4 (on a GPU: block 1024, batch 16)
  smollm2  SmolLM2-135M's shape (alpha-native --model smollm2-135m: Llama family, 30 layers,
         9 heads over 3 key/value heads, 576 embd, SwiGLU 1536, vocabulary 49152, tied),
         block 512, batch 4; PyTorch's side is nanogpt_reference.py's Llama (F.rms_norm,
         scaled_dot_product_attention with enable_gqa, fused q/k/v and gate/up products)

  python3 scripts/compare_pytorch.py [--configs small baby] [--threads 1 2] [--rounds N]
                                     [--backend cpu|gpu|cuda] [--peers eager compile ...]

Alpha runs `alpha-native bench --json` (steady state: training steps only); PyTorch runs the
same model and step (AdamW, clip 1.0) from scripts/nanogpt_reference.py. Both report every
timed step; each side's figure is the median of its steps from all rounds. Rounds are short
(the small config: 10 rounds of 20 steps after 10 warm-up) because a shared machine's speed
drifts in phases of seconds (on a 2-core EPYC VM (Zen 3), a one-thread small step took
~64 ms for a while, then ~88 ms for a dozen steps): long rounds let one side draw more slow
phases than the other. Each row also shows the range of the rounds' own ratios (of their
medians: how far the noise moves a single round) and the ratio of the two sides' 10th
percentiles (the fastest tenth of the steps: the machine's slow phases left out), and with more
than one thread count the speed-up from the fewest to the most threads is printed for both.
On the CPU a roofline line per row follows: the step's necessary matmul FLOPs (see
`necessary_flops`) over the cores' FMA limit (`alpha-native info`: vector FMAs on registers,
the rate no GEMM passes at the same clock) give the fastest step possible; each side's median is shown as a
fraction of it, and PyTorch's median over it is the largest ratio any implementation could
reach in that run.
`--backend gpu` (or `cuda`) runs Alpha with `--backend gpu` (wgpu; or `cuda`, a build with
`--features cuda`) and PyTorch on CUDA (both wait for each step's end; the GPT-2 sizes at block
1024 there, gpt2 at batch 8, their vocabulary padded to 50304 on both sides); the thread count
does not apply there.
`--peers` picks the PyTorch sides, each timed in the same alternating rounds and shown in a row
of its own: `eager` (fp32 eager, the default), `compile` (torch.compile, fp32), `eager-bf16`
and `compile-bf16` (bf16 autocast, as nanoGPT on a GPU). `--alpha-flags` passes more flags to
Alpha's bench (for example `--alpha-flags=--tensor-cores`). Needs a release build (cargo build
--release) and:
pip install torch numpy safetensors
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALPHA = os.path.join(ROOT, "target", "release", "alpha-native")
CONFIGS = {
    "small": dict(layers=4, heads=4, embd=128, block=64, batch=12, iters=20, warmup=10, rounds=10),
    "baby": dict(layers=6, heads=6, embd=384, block=256, batch=64, iters=4, warmup=1, rounds=3),
    "gpt2": dict(layers=12, heads=12, embd=768, block=256, batch=4, vocab=50257, iters=3, warmup=1, rounds=3),
    "gpt2-b32": dict(layers=12, heads=12, embd=768, block=256, batch=32, vocab=50257, iters=2, warmup=1, rounds=3),
    "gpt2-medium": dict(layers=24, heads=16, embd=1024, block=256, batch=4, vocab=50257, model="gpt2-medium", iters=2, warmup=1, rounds=3),
    "smollm2": dict(layers=30, heads=9, embd=576, block=512, batch=4, vocab=49152, iters=2, warmup=1, rounds=3,
                    llama=dict(model="smollm2-135m", kv_heads=3, intermediate_size=1536, rope_theta=100000.0)),
}
# Timed and warm-up steps on a GPU, where a step takes milliseconds.
GPU_STEPS = dict(iters=50, warmup=5)
# Shapes that differ on a GPU: GPT-2 124M at its full context, batch 8 (a 6.7 GB activation
# arena: a device whose max_buffer_size is smaller gets a "failed" row naming it), its
# vocabulary padded to a multiple of 64 on both sides as nanoGPT trains it (50304: the head's
# products in whole tensor-core tiles; Alpha's padding gets no probability, PyTorch's does).
GPU_SHAPES = {
    "gpt2": dict(block=1024, batch=8, iters=20, vocab_pad=64),
    "gpt2-b32": dict(block=1024, batch=32, iters=10, vocab_pad=64),
    "gpt2-medium": dict(block=1024, batch=16, iters=10, vocab_pad=64),
}
# PyTorch sides: nanogpt_reference.py bench's flags for each.
PEERS = {
    "eager": [],
    "compile": ["--compile"],
    "eager-bf16": ["--precision", "bf16"],
    "compile-bf16": ["--compile", "--precision", "bf16"],
}


def model_flags(c, side="alpha"):
    """The model's flags for `side`: alpha-native's `--model` (gpt2 unless the config names
    another) where the config has a published vocabulary, nanogpt_reference.py's `--vocab`;
    each padded to `vocab_pad` where given."""
    shape = [f"--{k}={c[k]}" for k in ("layers", "heads", "embd")]
    llama = c.get("llama")
    pad = c.get("vocab_pad", 1)
    if "vocab" in c and side == "alpha":
        shape = [f"--model={llama['model'] if llama else c.get('model', 'gpt2')}"] + ([f"--vocab-pad={pad}"] if pad > 1 else [])
    elif "vocab" in c:
        shape += [f"--vocab={-(-c['vocab'] // pad) * pad}"]
        if llama:
            shape += ["--arch=llama"] + [f"--{k.replace('_', '-')}={v}" for k, v in llama.items() if k != "model"]
    return shape + [f"--{k}={c[k]}" for k in ("block", "batch")]


def alpha_steps(c, threads, backend, flags):
    device = ["--backend", backend] if backend != "cpu" else ["--threads", str(threads), "--peak-gflops", "1"]
    out = subprocess.run([ALPHA, "bench", "--json", "--iters", str(c["iters"]), "--warmup", str(c["warmup"])]
                         + device + model_flags(c) + flags, check=True, capture_output=True, text=True)
    r = json.loads(out.stdout)
    return r["step_ms"], (r["device"] or {}).get("adapter", "cpu")


def pytorch_steps(c, threads, backend, peer):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "nanogpt_reference.py"), "bench",
                          "--data", os.path.join(ROOT, "data", "shakespeare.txt"), "--threads", str(threads),
                          "--device", "cpu" if backend == "cpu" else "cuda",
                          "--iters", str(c["iters"]), "--warmup", str(c["warmup"])] + PEERS[peer] + model_flags(c, "pytorch"),
                         check=True, capture_output=True, text=True)
    r = json.loads(out.stdout)
    return r["step_ms"], f"{r['impl']} on {r['device']}"


def fma_limit(c, threads):
    """The cores' FMA limit in GFLOP/s at `threads` threads and the vocabulary size, from
    `alpha-native info` (None where it is not measured)."""
    out = subprocess.run([ALPHA, "info", "--json", "--measure-steps", "0", "--peak-gflops", "1", "--threads", str(threads)]
                         + model_flags(c), check=True, capture_output=True, text=True)
    r = json.loads(out.stdout)
    return r["fma_limit_gflops"], r["config"]["vocab_size"]


def necessary_flops(c, vocab):
    """FLOPs one training step cannot do without: every weight matmul forward and backward
    (6 per weight per token: the 12 C^2 per block and the tied vocab x C head) and causal
    attention's two products forward and four backward over the key/query pairs it keeps
    (T(T+1)/2 per head, no padding, no recomputation). Layer norm, GELU, softmax and AdamW are
    left out, so time at the FMA limit over these is a floor no implementation can beat."""
    C, T, L = c["embd"], c["block"], c["layers"]
    tokens = c["batch"] * T
    llama = c.get("llama")
    # A block's weights: 12 C^2 for GPT-2; q/k/v, output, gate/up and down for the Llama family.
    block = 12 * C * C
    if llama:
        qkv = (c["heads"] + 2 * llama["kv_heads"]) * (C // c["heads"])
        block = qkv * C + C * C + 3 * llama["intermediate_size"] * C
    matmuls = 6 * (L * block + vocab * C) * tokens
    attention = L * c["batch"] * C * (T * (T + 1) // 2) * 2 * 6
    return matmuls + attention


def percentile(values, q):
    """The value below which a fraction `q` of `values` lies (nearest rank)."""
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main():
    global ALPHA
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=["small", "baby"])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, help="alternating rounds per row (default: 10 for small, 3 for baby)")
    p.add_argument("--backend", choices=["cpu", "gpu", "cuda"], default="cpu")
    p.add_argument("--peers", nargs="+", choices=list(PEERS), default=["eager"], help="PyTorch sides (default: eager)")
    p.add_argument("--alpha", default=ALPHA, help="the alpha-native binary (default: target/release/alpha-native)")
    p.add_argument("--alpha-flags", default="", help="more flags for Alpha's bench, split at spaces (e.g. --tensor-cores)")
    args = p.parse_args()
    ALPHA = args.alpha
    threads_list = args.threads if args.backend == "cpu" else [1]
    print("| config | threads | PyTorch side | Alpha ms/iter | Alpha tok/s | PyTorch ms/iter | PyTorch tok/s |"
          " Alpha speed vs PyTorch | per-round ratios | ratio of p10 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    impls, on = {}, "cpu"
    scaling, plans, roofline = [], [], []
    for name in args.configs:
        gpu = args.backend != "cpu"
        c = {**CONFIGS[name], **GPU_STEPS, **GPU_SHAPES.get(name, {})} if gpu else CONFIGS[name]
        rounds = args.rounds or c["rounds"]
        plans.append(f"{name} {rounds} x {c['iters']} steps")
        tokens = c["batch"] * c["block"]
        medians = {}
        for threads in threads_list:
            alpha, torch = [], {peer: [] for peer in args.peers}
            limit, vocab = fma_limit(c, threads) if args.backend == "cpu" else (None, None)
            shown = "-" if gpu else threads
            try:
                for _ in range(rounds):
                    steps, on = alpha_steps(c, threads, args.backend, args.alpha_flags.split())
                    alpha.append(steps)
                    for peer in args.peers:
                        steps, impls[peer] = pytorch_steps(c, threads, args.backend, peer)
                        torch[peer].append(steps)
            except subprocess.CalledProcessError as e:
                # A side that cannot run this config (too large for the device, say): its row
                # says why, and the other configs still run.
                reason = ((e.stderr or "").strip().splitlines() or [f"exit status {e.returncode}"])[-1]
                print(f"| {name} | {shown} | {' '.join(args.peers)} | failed: {reason} |", flush=True)
                continue
            a_steps = [ms for steps in alpha for ms in steps]
            a = statistics.median(a_steps)
            for peer in args.peers:
                t_steps = [ms for steps in torch[peer] for ms in steps]
                t = statistics.median(t_steps)
                # The fastest tenth of each side's steps: the ratio with the machine's slow
                # phases left out (shown beside the medians, never instead of them).
                p10 = percentile(t_steps, 0.1) / percentile(a_steps, 0.1)
                # Each round's PyTorch median over the Alpha median just before it: how far the
                # machine's noise moves the ratio of one round.
                ratios = sorted(statistics.median(tb) / statistics.median(ab) for ab, tb in zip(alpha, torch[peer]))
                print(f"| {name} | {shown} | {peer} | {a:.1f} | {tokens / a * 1e3:.0f} | {t:.1f} | {tokens / t * 1e3:.0f} | {t / a:.2f}x |"
                      f" {ratios[0]:.2f}x-{ratios[-1]:.2f}x | {p10:.2f}x |", flush=True)
            t = statistics.median(ms for steps in torch[args.peers[0]] for ms in steps)
            medians[threads] = (a, t)
            if limit:
                # The clock drifts: the higher of the limits measured before and after the
                # rounds, so that the floor is the lower one (the claim the weaker).
                limit = max(limit, fma_limit(c, threads)[0])
                flops = necessary_flops(c, vocab)
                floor = flops / limit / 1e6
                roofline.append(f"{name}, {threads} thread(s): {flops / 1e9:.3f} GFLOP of matmuls per step at the FMA limit"
                                f" ({limit:.1f} GFLOP/s) take {floor:.1f} ms; Alpha's median step is at {floor / a:.0%}"
                                f" of that limit, PyTorch's at {floor / t:.0%}; a step doing those FLOPs and nothing"
                                f" else at the limit would be {t / floor:.2f}x ahead of this PyTorch median")
        if len(medians) > 1:
            lo, hi = min(medians), max(medians)
            scaling.append(f"{name} {lo} -> {hi} threads: Alpha {medians[lo][0] / medians[hi][0]:.2f}x,"
                           f" PyTorch ({args.peers[0]}) {medians[lo][1] / medians[hi][1]:.2f}x")
    print(f"(Alpha on {on}{' with ' + args.alpha_flags if args.alpha_flags else ''}; {'; '.join(f'{peer}: {impl}' for peer, impl in impls.items())}; median step time over all steps of"
          f" alternating rounds: {', '.join(plans)})")
    for line in scaling:
        print(f"Scaling, {line}")
    for line in roofline:
        print(f"Roofline, {line}")

if __name__ == "__main__":
    main()
