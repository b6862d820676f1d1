"""Sampling speed: `alpha-native sample` (with its KV cache) against Hugging Face transformers'
`generate` (`use_cache=True`) on the same GPT-2-shaped model, on the CPU, greedy, from the same
prompt length, alternating the two in rounds; prints the median time per generated token of
each, the ratio, and both against the time to read the weights once at the memory bandwidth
`alpha-native info` measures (with a KV cache, a token's forward reads every weight once: that
time is the floor).

  python3 scripts/compare_generate.py [--tokens 128] [--prompt 16] [--threads 2] [--rounds 3]

The model is GPT-2 124M's shape (12 layers, 12 heads, 768 wide, context 1024) with a
vocabulary of 50304 (nanoGPT's padded GPT-2 vocabulary): Alpha's is a character model of the
embedded corpus trained one step with --vocab-pad 50304 (its head has all 50304 rows, so each
token costs what GPT-2's does; only its 65 characters are drawn, and no <|endoftext|> ends a
sample early), transformers' a randomly initialised GPT2LMHeadModel of the same shape. Per-token
time leaves out loading, the prompt's forward and the first token: Alpha's is what `sample
--stats` reports (the time from the first token to the last over the tokens after the first),
transformers' (time of generate for 1 + N new tokens - time for 1) / N; each a median over the
rounds, each round a fresh process of each side. Alpha samples with a window of prompt + 1 + N
tokens (`--block`), so that no token slides out of it. Needs a release build and:
pip install torch transformers
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAPE = dict(layers=12, heads=12, embd=768, block=1024, vocab=50304)


def alpha_ms_per_token(binary, checkpoint, prompt, tokens, context, threads):
    """ms per token after the first of one `alpha-native sample --stats` generating `tokens`
    tokens greedily with a window of `context` tokens."""
    args = [binary, "sample", "--checkpoint", checkpoint, "--prompt", prompt, "--tokens", str(tokens), "--temperature", "0", "--block", str(context),
            "--threads", str(threads), "--stats"]
    stats = subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True).stderr
    return float(re.search(r"then ([0-9.]+) ms/token", stats).group(1))


def hf_worker(args):
    """Times transformers' generate of 1 and 1 + N tokens in this process (a fresh one per
    round, as Alpha's: torch's idle threads would otherwise spin beside Alpha's run); prints
    the two times as JSON."""
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    s = SHAPE
    config = transformers.GPT2Config(vocab_size=s["vocab"], n_positions=s["block"], n_embd=s["embd"], n_layer=s["layers"], n_head=s["heads"])
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 65, (1, args.prompt))

    def seconds(tokens):
        with torch.no_grad():
            t = time.perf_counter()
            model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, use_cache=True, pad_token_id=0)
            return time.perf_counter() - t

    seconds(2)  # warm-up
    print(json.dumps({"long": seconds(1 + args.tokens), "short": seconds(1), "versions": f"transformers {transformers.__version__}, torch {torch.__version__}"}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--alpha", default=str(ROOT / "target/release/alpha-native"))
    p.add_argument("--tokens", type=int, default=128, help="tokens generated per timed sample")
    p.add_argument("--prompt", type=int, default=16, help="prompt length in tokens")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--hf-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.hf_worker:
        return hf_worker(args)

    s = SHAPE
    work = Path(tempfile.mkdtemp(prefix="alpha-generate-"))
    train = [args.alpha, "train", "--iters", "1", "--batch", "1", "--layers", str(s["layers"]), "--heads", str(s["heads"]), "--embd", str(s["embd"]),
             "--block", str(s["block"]), "--vocab-pad", str(s["vocab"]), "--eval-interval", "0", "--sample-interval", "0", "--out", str(work / "ck"),
             "--threads", str(args.threads)]
    subprocess.run(train, check=True, stdout=subprocess.DEVNULL)
    checkpoint = str(work / "ck" / "ckpt.safetensors")
    info = json.loads(subprocess.run([args.alpha, "info", "--json", "--measure-steps", "0", "--layers", str(s["layers"]), "--heads", str(s["heads"]),
                                      "--embd", str(s["embd"]), "--block", str(s["block"]), "--batch", "1", "--vocab-pad", str(s["vocab"]),
                                      "--threads", str(args.threads)], check=True, capture_output=True, text=True).stdout)
    prompt = (ROOT / "data" / "shakespeare.txt").read_text(encoding="utf-8")[: args.prompt]
    # A window just long enough (--block), as transformers' cache grows with the text: Alpha's
    # first forward runs over the whole window, padding included.
    context = args.prompt + 1 + args.tokens
    worker = [sys.executable, __file__, "--hf-worker", "--tokens", str(args.tokens), "--prompt", str(args.prompt), "--threads", str(args.threads)]
    times = {"alpha": [], "hf": []}
    versions = ""
    for _ in range(args.rounds):
        times["alpha"].append(alpha_ms_per_token(args.alpha, checkpoint, prompt, 1 + args.tokens, context, args.threads))
        hf = json.loads(subprocess.run(worker, check=True, capture_output=True, text=True).stdout)
        times["hf"].append((hf["long"] - hf["short"]) / args.tokens * 1e3)
        versions = hf["versions"]
    a, h = statistics.median(times["alpha"]), statistics.median(times["hf"])
    floor = info["weights_read_ms"]
    spread = ", ".join(f"{k} {min(v):.2f}-{max(v):.2f}" for k, v in (("Alpha", times["alpha"]), ("transformers", times["hf"])))
    print(f"model: GPT-2 124M shape, vocabulary {s['vocab']}, {info['params'] / 1e6:.1f}M parameters; CPU: {info['cpu']}, {args.threads} threads")
    print(f"prompt {args.prompt} tokens, 1 + {args.tokens} new tokens, greedy, {args.rounds} rounds; rounds' ms/token: {spread}")
    print(f"memory bandwidth {info['memory_bandwidth_gbs']:.1f} GB/s: reading the weights once takes {floor:.2f} ms")
    print("| | ms/token | tokens/s | x weight-read time |")
    print("|---|---|---|---|")
    print(f"| Alpha (KV cache) | {a:.2f} | {1e3 / a:.1f} | {a / floor:.2f} |")
    print(f"| {versions} generate | {h:.2f} | {1e3 / h:.1f} | {h / floor:.2f} |")
    print(f"Alpha / transformers tokens/s: {h / a:.2f}x")


if __name__ == "__main__":
    main()
