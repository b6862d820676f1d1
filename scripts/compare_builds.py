"""Step time of two builds of alpha-native, alternating them in short rounds so that machine
noise hits both alike (the way to tell whether a change made training faster):

  python3 scripts/compare_builds.py BEFORE AFTER [--rounds 10] [--iters 20] [--warmup 5]
                                    [--threads 1] [--after-flags FLAGS] [-- more bench flags]

BEFORE and AFTER are alpha-native binaries (copy target/release/alpha-native aside before
rebuilding), or one binary twice with --after-flags giving the AFTER side's own flags (e.g.
`--after-flags=--recompute` sets activation checkpointing against none). Each round runs
`bench --json` once with each; prints both sides' medians over all their steps, the ratio
AFTER / BEFORE of those medians, and the median and range of the rounds' own ratios. Needs
nothing beyond Python 3.
"""
import argparse
import json
import statistics
import subprocess
import sys


def steps(binary, args, extra):
    out = subprocess.run([binary, "bench", "--json", "--iters", str(args.iters), "--warmup", str(args.warmup),
                          "--threads", str(args.threads), "--peak-gflops", "1"] + extra,
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["step_ms"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--after-flags", default="", help="bench flags of the AFTER side only (space separated)")
    # Everything after `--` goes to bench as is (argparse would not take it after options).
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.extra = extra
    before, after, ratios = [], [], []
    for _ in range(args.rounds):
        b, a = steps(args.before, args, args.extra), steps(args.after, args, args.extra + args.after_flags.split())
        before += b
        after += a
        ratios.append(statistics.median(a) / statistics.median(b))
    mb, ma = statistics.median(before), statistics.median(after)
    print(f"before {mb:.2f} ms, after {ma:.2f} ms (medians of {len(before)} steps each): after / before {ma / mb:.4f}; "
          f"rounds' ratios median {statistics.median(ratios):.4f}, range {min(ratios):.3f}-{max(ratios):.3f}")


if __name__ == "__main__":
    main()
