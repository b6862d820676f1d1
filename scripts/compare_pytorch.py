"""Side-by-side CPU speed of Alpha and PyTorch eager on nanoGPT's Shakespeare-char CPU config
(4 layers, 4 heads, 128 embd, block 64, batch 12), in one run, alternating the two so that
machine noise hits both. Prints medians of per-step times and the ratio.

  python3 scripts/compare_pytorch.py [--rounds 3] [--iters 100] [--threads 1 2]

Needs a release build (cargo build --release) and: pip install torch numpy safetensors
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALPHA = os.path.join(ROOT, "target", "release", "alpha-native")


def alpha_steps(threads, iters, warmup):
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        subprocess.run([ALPHA, "train", "--out", tmp, "--iters", str(warmup + iters), "--threads", str(threads),
                        "--eval-interval", "0", "--sample-interval", "0", "--checkpoint-interval", "0",
                        "--log-interval", "1", "--metrics", metrics], check=True, stdout=subprocess.DEVNULL)
        records = [json.loads(l) for l in open(metrics)]
        return [r["ms_per_step"] for r in records if r["type"] == "train"][warmup:]


def pytorch_median(threads, iters, warmup):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "nanogpt_reference.py"), "bench",
                          "--data", os.path.join(ROOT, "data", "shakespeare.txt"), "--threads", str(threads),
                          "--iters", str(iters), "--warmup", str(warmup)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["ms_per_iter"], json.loads(out.stdout)["impl"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = p.parse_args()
    tokens = 12 * 64
    print("| threads | Alpha ms/iter | Alpha tok/s | PyTorch ms/iter | PyTorch tok/s | Alpha speed vs PyTorch |")
    print("|---|---|---|---|---|---|")
    for threads in args.threads:
        alpha, torch = [], []
        for _ in range(args.rounds):
            alpha.append(statistics.median(alpha_steps(threads, args.iters, args.warmup)))
            ms, impl = pytorch_median(threads, args.iters, args.warmup)
            torch.append(ms)
        a, t = statistics.median(alpha), statistics.median(torch)
        print(f"| {threads} | {a:.1f} | {tokens / a * 1e3:.0f} | {t:.1f} | {tokens / t * 1e3:.0f} | {t / a:.2f}x |")
    print(f"({impl}; medians of {args.rounds} alternating rounds of {args.iters} steps after {args.warmup} warm-up)")


if __name__ == "__main__":
    main()
