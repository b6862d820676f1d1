"""Side-by-side CPU training speed of Alpha and PyTorch eager in one run, alternating the two so
that machine noise hits both; prints a Markdown table of medians and the speed ratio.

Configurations:
  small  nanoGPT's Shakespeare-char CPU run: 4 layers, 4 heads, 128 embd, block 64, batch 12
  baby   nanoGPT's "baby GPT": 6 layers, 6 heads, 384 embd, block 256, batch 64

  python3 scripts/compare_pytorch.py [--configs small baby] [--threads 1 2] [--rounds 3]

Alpha runs `alpha-native bench --json` (steady state: training steps only); PyTorch runs the
same model and step (AdamW, clip 1.0) from scripts/nanogpt_reference.py. Needs a release build
(cargo build --release) and: pip install torch numpy safetensors
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


def model_flags(c):
    return [f"--{k}={c[k]}" for k in ("layers", "heads", "embd", "block", "batch")]


def alpha_ms(c, threads):
    out = subprocess.run([ALPHA, "bench", "--json", "--threads", str(threads), "--iters", str(c["iters"]),
                          "--warmup", str(c["warmup"]), "--peak-gflops", "1"] + model_flags(c),
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["ms_per_iter"]["median"]


def pytorch_ms(c, threads):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "nanogpt_reference.py"), "bench",
                          "--data", os.path.join(ROOT, "data", "shakespeare.txt"), "--threads", str(threads),
                          "--iters", str(c["iters"]), "--warmup", str(c["warmup"])] + model_flags(c),
                         check=True, capture_output=True, text=True)
    r = json.loads(out.stdout)
    return r["ms_per_iter"], r["impl"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=["small", "baby"])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    print("| config | threads | Alpha ms/iter | Alpha tok/s | PyTorch ms/iter | PyTorch tok/s | Alpha speed vs PyTorch |")
    print("|---|---|---|---|---|---|---|")
    impl = "pytorch"
    for name in args.configs:
        c = CONFIGS[name]
        tokens = c["batch"] * c["block"]
        for threads in args.threads:
            alpha, torch = [], []
            for _ in range(args.rounds):
                alpha.append(alpha_ms(c, threads))
                ms, impl = pytorch_ms(c, threads)
                torch.append(ms)
            a, t = statistics.median(alpha), statistics.median(torch)
            print(f"| {name} | {threads} | {a:.1f} | {tokens / a * 1e3:.0f} | {t:.1f} | {tokens / t * 1e3:.0f} | {t / a:.2f}x |",
                  flush=True)
    print(f"({impl}; medians of {args.rounds} alternating rounds; per round: median step time)")


if __name__ == "__main__":
    main()
