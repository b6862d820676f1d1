"""Side-by-side training speed of Alpha and PyTorch eager in one run, alternating the two so
that machine noise hits both; prints a Markdown table of medians and the speed ratio.

Configurations:
  small  nanoGPT's Shakespeare-char CPU run: 4 layers, 4 heads, 128 embd, block 64, batch 12
  baby   nanoGPT's "baby GPT": 6 layers, 6 heads, 384 embd, block 256, batch 64

  python3 scripts/compare_pytorch.py [--configs small baby] [--threads 1 2] [--rounds 3]
                                     [--backend cpu|gpu]

Alpha runs `alpha-native bench --json` (steady state: training steps only); PyTorch runs the
same model and step (AdamW, clip 1.0) from scripts/nanogpt_reference.py. Each row also shows
the range of the rounds' own ratios (how far the machine's noise moves them), and with more
than one thread count the speed-up from the fewest to the most threads is printed for both.
`--backend gpu` runs Alpha with `--backend gpu` and PyTorch on CUDA (fp32; both wait for each
step's end); the thread count does not apply there. Needs a release build (cargo build
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
    "small": dict(layers=4, heads=4, embd=128, block=64, batch=12, iters=100, warmup=10),
    "baby": dict(layers=6, heads=6, embd=384, block=256, batch=64, iters=4, warmup=1),
}
# Timed and warm-up steps on a GPU, where a step takes milliseconds.
GPU_STEPS = dict(iters=50, warmup=5)


def model_flags(c):
    return [f"--{k}={c[k]}" for k in ("layers", "heads", "embd", "block", "batch")]


def alpha_ms(c, threads, backend):
    device = ["--backend", "gpu"] if backend == "gpu" else ["--threads", str(threads), "--peak-gflops", "1"]
    out = subprocess.run([ALPHA, "bench", "--json", "--iters", str(c["iters"]), "--warmup", str(c["warmup"])]
                         + device + model_flags(c), check=True, capture_output=True, text=True)
    r = json.loads(out.stdout)
    return r["ms_per_iter"]["median"], (r["device"] or {}).get("adapter", "cpu")


def pytorch_ms(c, threads, backend):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "nanogpt_reference.py"), "bench",
                          "--data", os.path.join(ROOT, "data", "shakespeare.txt"), "--threads", str(threads),
                          "--device", "cuda" if backend == "gpu" else "cpu",
                          "--iters", str(c["iters"]), "--warmup", str(c["warmup"])] + model_flags(c),
                         check=True, capture_output=True, text=True)
    r = json.loads(out.stdout)
    return r["ms_per_iter"], f"{r['impl']} on {r['device']}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=["small", "baby"])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backend", choices=["cpu", "gpu"], default="cpu")
    args = p.parse_args()
    threads_list = [1] if args.backend == "gpu" else args.threads
    print("| config | threads | Alpha ms/iter | Alpha tok/s | PyTorch ms/iter | PyTorch tok/s | Alpha speed vs PyTorch |"
          " per-round ratios |")
    print("|---|---|---|---|---|---|---|---|")
    impl, on = "pytorch", "cpu"
    scaling = []
    for name in args.configs:
        c = dict(CONFIGS[name], **(GPU_STEPS if args.backend == "gpu" else {}))
        tokens = c["batch"] * c["block"]
        medians = {}
        for threads in threads_list:
            alpha, torch = [], []
            for _ in range(args.rounds):
                ms, on = alpha_ms(c, threads, args.backend)
                alpha.append(ms)
                ms, impl = pytorch_ms(c, threads, args.backend)
                torch.append(ms)
            a, t = statistics.median(alpha), statistics.median(torch)
            medians[threads] = (a, t)
            # Each round's PyTorch time over the Alpha time just before it: how far the
            # machine's noise moves the ratio.
            ratios = sorted(tb / ab for ab, tb in zip(alpha, torch))
            shown = "-" if args.backend == "gpu" else threads
            print(f"| {name} | {shown} | {a:.1f} | {tokens / a * 1e3:.0f} | {t:.1f} | {tokens / t * 1e3:.0f} | {t / a:.2f}x |"
                  f" {ratios[0]:.2f}x-{ratios[-1]:.2f}x |", flush=True)
        if len(medians) > 1:
            lo, hi = min(medians), max(medians)
            scaling.append(f"{name} {lo} -> {hi} threads: Alpha {medians[lo][0] / medians[hi][0]:.2f}x,"
                           f" PyTorch {medians[lo][1] / medians[hi][1]:.2f}x")
    print(f"(Alpha on {on}; {impl}; medians of {args.rounds} alternating rounds; per round: median step time)")
    for line in scaling:
        print(f"Scaling, {line}")

if __name__ == "__main__":
    main()
