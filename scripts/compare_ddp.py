"""Data parallelism side by side, in one run: Alpha on 1 rank, Alpha on 2 MPI ranks and PyTorch
DDP (gloo) on 2 processes, each process on one thread, the same model and the same global batch,
alternating in rounds so that machine noise hits all alike. Prints a Markdown table of the
median step time and tokens/s, Alpha's 2-rank scaling, Alpha's all-reduce time per step (its
share of the step) and Alpha 2 ranks against DDP.

  python3 scripts/compare_ddp.py [--config baby|small] [--rounds N] [--iters N] [--warmup N]
                                 [--alpha PATH]

Alpha runs `mpirun -np N alpha-native train` (a release build with MPI: cargo build --release
-p alpha-native --features mpi; Open MPI's mpirun on PATH) with --log-interval 1 and reads each
step's time from its metrics; one rank takes the whole global batch, two ranks half each.
PyTorch runs nanoGPT's model (scripts/nanogpt_reference.py) under DistributedDataParallel on
gloo, launched by torch.multiprocessing, half the global batch per process; every process
times its steps and rank 0's are reported. Needs pip install torch numpy.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALPHA = os.path.join(ROOT, "target", "release", "alpha-native")
CONFIGS = {
    "small": dict(layers=4, heads=4, embd=128, block=64, batch=24),
    "baby": dict(layers=6, heads=6, embd=384, block=256, batch=64),
}


def alpha_run(alpha, c, ranks, iters, warmup, work):
    """Median ms/step and all-reduce ms/step of `iters` steps after `warmup`, on `ranks` ranks."""
    metrics = os.path.join(work, f"alpha{ranks}.jsonl")
    flags = [f"--{k}={c[k]}" for k in ("layers", "heads", "embd", "block")]
    cmd = ["mpirun", "--oversubscribe", "-np", str(ranks), alpha, "train", *flags, f"--batch={c['batch'] // ranks}",
           f"--iters={warmup + iters}", "--threads=1", "--log-interval=1", "--eval-interval=0", "--sample-interval=0",
           f"--out={os.path.join(work, 'out')}", "--overwrite", f"--metrics={metrics}"]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    steps = [json.loads(l) for l in open(metrics) if '"type":"train"' in l][warmup:]
    return statistics.median(s["ms_per_step"] for s in steps), statistics.median(s["ms"]["allreduce"] for s in steps)


def ddp_worker(rank, world, port, c, iters, warmup, out):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from nanogpt_reference import GPT
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1337)
    text = open(os.path.join(ROOT, "data", "shakespeare.txt"), encoding="utf-8").read()
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    data = torch.tensor([stoi[ch] for ch in text], dtype=torch.long)
    model = DDP(GPT(len(chars), c["block"], c["layers"], c["heads"], c["embd"]))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.99))
    B, T = c["batch"] // world, c["block"]
    gen = torch.Generator().manual_seed(rank)
    times = []
    for it in range(warmup + iters):
        t0 = time.perf_counter()
        ix = torch.randint(len(data) - T, (B,), generator=gen)
        x = torch.stack([data[i : i + T] for i in ix])
        y = torch.stack([data[i + 1 : i + 1 + T] for i in ix])
        loss = model(x, y).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if it >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    if rank == 0:
        json.dump({"ms": statistics.median(times), "torch": torch.__version__}, open(out, "w"))
    dist.destroy_process_group()


def ddp_run(c, iters, warmup, work):
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(work, "ddp.json")
    mp.spawn(ddp_worker, args=(2, port, c, iters, warmup, out), nprocs=2, join=True)
    r = json.load(open(out))
    return r["ms"], r["torch"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=CONFIGS, default="baby")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--alpha", default=ALPHA, help="the alpha-native binary (built with --features mpi)")
    args = p.parse_args()
    c = CONFIGS[args.config]
    if not os.path.exists(args.alpha):
        sys.exit(f"{args.alpha} is missing: cargo build --release -p alpha-native --features mpi")
    one, two, ddp, reduce_ms = [], [], [], []
    version = "?"
    with tempfile.TemporaryDirectory() as work:
        for r in range(args.rounds):
            one.append(alpha_run(args.alpha, c, 1, args.iters, args.warmup, work)[0])
            ms, red = alpha_run(args.alpha, c, 2, args.iters, args.warmup, work)
            two.append(ms)
            reduce_ms.append(red)
            ms, version = ddp_run(c, args.iters, args.warmup, work)
            ddp.append(ms)
            print(f"round {r + 1}: Alpha 1 rank {one[-1]:.0f} ms, 2 ranks {two[-1]:.0f} ms (all-reduce {red:.1f}), DDP {ms:.0f} ms", file=sys.stderr)
    tokens = c["batch"] * c["block"]
    med = {k: statistics.median(v) for k, v in (("one", one), ("two", two), ("ddp", ddp))}
    print(f"{args.config}: {c['layers']}L/{c['heads']}H/{c['embd']}E, block {c['block']}, global batch {c['batch']}, "
          f"1 thread per process, medians of {args.rounds} rounds of {args.iters} steps (PyTorch {version})\n")
    print("| | ms/step | tokens/s |")
    print("|---|---|---|")
    for name, key in (("Alpha, 1 rank", "one"), ("Alpha, 2 MPI ranks", "two"), ("PyTorch DDP (gloo), 2 processes", "ddp")):
        print(f"| {name} | {med[key]:.1f} | {tokens / med[key] * 1e3:.0f} |")
    red = statistics.median(reduce_ms)
    print(f"\nAlpha 2-rank scaling: {med['one'] / med['two']:.2f}x its 1-rank throughput; all-reduce {red:.1f} ms per step "
          f"({red / med['two']:.1%} of the step); Alpha 2 ranks vs DDP: {med['ddp'] / med['two']:.2f}x")


if __name__ == "__main__":
    main()
