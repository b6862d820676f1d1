"""Byte-level BPE speed side by side in one run: Alpha, tiktoken and Hugging Face tokenizers on
the same tokenizer and text, alternated in rounds; prints medians and ratios.

  python3 scripts/compare_tokenizers.py [--vocab-size 8192] [--rounds 5] [--text FILE]

- Training: `alpha-native tokenizer train` against `tokenizers`' BpeTrainer (ByteLevel, the
  256-byte alphabet, <|endoftext|>), same text and vocabulary size, at one thread and at all
  threads (RAYON_NUM_THREADS for tokenizers, --threads for Alpha); wall time of each whole
  training (reading the text included), each in its own process.
- Encoding, one thread: `alpha-native tokenizer bench` (the median of its timed encodings of
  the whole text), tiktoken's `encode` with an Encoding built from the same ranks (GPT-2's
  pattern, no download) and `tokenizers`' `encode`, on the tokenizer Alpha trained; MB/s.
  Then the same on Llama 3's shape (a tokenizer.json `tokenizers` trains with Llama 3's Split
  pattern, ByteLevel without its own, ignore_merges; tiktoken with the same pattern).
  tiktoken merges any pair whose bytes are a token, so its ids may differ from the other two
  in a few places: the speed is what is compared.
Needs a release build (cargo build --release) and: pip install tokenizers tiktoken
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALPHA = os.path.join(ROOT, "target", "release", "alpha-native")
EOT = "<|endoftext|>"
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

HF_TRAIN = """
import sys, time
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
started = time.perf_counter()
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=int(sys.argv[2]), special_tokens=["<|endoftext|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
tok.train([sys.argv[1]], trainer)
tok.save(sys.argv[3])
print(time.perf_counter() - started)
"""


def alpha_train(text, vocab, out, threads):
    flags = ["--threads", str(threads)] if threads else []
    started = time.perf_counter()
    subprocess.run([ALPHA, "tokenizer", "train", "--data", text, "--vocab-size", str(vocab), "--out", out, "--force"] + flags,
                   check=True, capture_output=True)
    return time.perf_counter() - started


def hf_train(text, vocab, out, threads):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads or os.cpu_count()), TOKENIZERS_PARALLELISM="true")
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", HF_TRAIN, text, str(vocab), out], check=True, capture_output=True, env=env)
    return time.perf_counter() - started


def llama3_shaped(text, vocab, out):
    """A tokenizer.json of Llama 3's shape, trained by tokenizers on `text`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_PATTERN), "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([text], trainer)
    tok.save(out)


def encoders(tokenizer_json, pattern=GPT2_PATTERN):
    import tiktoken
    from tokenizers import Tokenizer
    with open(tokenizer_json, encoding="utf-8") as f:
        spec = json.load(f)
    byte_of = {}
    n = 0
    for b in range(256):
        # GPT-2's byte-level alphabet (see core/src/tokenizer/byte_level.rs).
        if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255:
            byte_of[chr(b)] = b
        else:
            byte_of[chr(256 + n)] = b
            n += 1
    ranks = {bytes(byte_of[c] for c in token): rank for token, rank in spec["model"]["vocab"].items() if token != EOT}
    tiktoken_enc = tiktoken.Encoding("alpha-trained", pat_str=pattern, mergeable_ranks=ranks, special_tokens={EOT: spec["model"]["vocab"][EOT]})
    hf = Tokenizer.from_file(tokenizer_json)
    return tiktoken_enc, hf


def timed(fn, text):
    started = time.perf_counter()
    fn(text)
    return time.perf_counter() - started


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--text", default=os.path.join(ROOT, "data", "shakespeare.txt"))
    args = p.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    mb = len(text.encode()) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        alpha_json, hf_json = os.path.join(tmp, "alpha.json"), os.path.join(tmp, "hf.json")
        train = {(side, threads): [] for side in ("alpha", "hf") for threads in (1, 0)}
        for _ in range(args.rounds):
            for threads in (1, 0):
                train[("alpha", threads)].append(alpha_train(args.text, args.vocab_size, alpha_json, threads))
                train[("hf", threads)].append(hf_train(args.text, args.vocab_size, hf_json, threads))
        tiktoken_enc, hf = encoders(alpha_json)
        enc = {"alpha": [], "tiktoken": [], "hf": []}
        for _ in range(args.rounds):
            out = subprocess.run([ALPHA, "tokenizer", "bench", "--tokenizer", alpha_json, "--text", args.text, "--rounds", "3"],
                                 check=True, capture_output=True, text=True)
            enc["alpha"].append(json.loads(out.stdout)["seconds"])
            enc["tiktoken"].append(timed(lambda t: tiktoken_enc.encode(t, allowed_special="all"), text))
            enc["hf"].append(timed(lambda t: hf.encode(t), text))
        llama3_json = os.path.join(tmp, "llama3.json")
        llama3_shaped(args.text, args.vocab_size, llama3_json)
        tiktoken_llama3, hf_llama3 = encoders(llama3_json, LLAMA3_PATTERN)
        for _ in range(args.rounds):
            out = subprocess.run([ALPHA, "tokenizer", "bench", "--tokenizer", llama3_json, "--text", args.text, "--rounds", "3"],
                                 check=True, capture_output=True, text=True)
            enc["alpha-llama3"] = enc.get("alpha-llama3", []) + [json.loads(out.stdout)["seconds"]]
            enc["tiktoken-llama3"] = enc.get("tiktoken-llama3", []) + [timed(lambda t: tiktoken_llama3.encode(t, allowed_special="all"), text)]
            enc["hf-llama3"] = enc.get("hf-llama3", []) + [timed(lambda t: hf_llama3.encode(t), text)]
    med = {k: statistics.median(v) for k, v in {**{f"train-{s}-{t}": v for (s, t), v in train.items()}, **{f"enc-{k}": v for k, v in enc.items()}}.items()}
    cores = os.cpu_count()
    print(f"text: {args.text} ({mb:.2f} MB), vocabulary {args.vocab_size}, {args.rounds} rounds, medians")
    print("| | Alpha | tiktoken | HF tokenizers | Alpha vs tiktoken | Alpha vs HF |")
    print("|---|---|---|---|---|---|")
    a, t, h = med["enc-alpha"], med["enc-tiktoken"], med["enc-hf"]
    print(f"| encode, 1 thread (MB/s) | {mb / a:.1f} | {mb / t:.1f} | {mb / h:.1f} | {t / a:.2f}x | {h / a:.2f}x |")
    a, t, h = med["enc-alpha-llama3"], med["enc-tiktoken-llama3"], med["enc-hf-llama3"]
    print(f"| encode, Llama 3's shape, 1 thread (MB/s) | {mb / a:.1f} | {mb / t:.1f} | {mb / h:.1f} | {t / a:.2f}x | {h / a:.2f}x |")
    for threads, label in ((1, "1 thread"), (0, f"all {cores} threads")):
        a, h = med[f"train-alpha-{threads}"], med[f"train-hf-{threads}"]
        print(f"| train, {label} (s) | {a:.2f} | - | {h:.2f} | - | {h / a:.2f}x |")
    print("(ratios: how many times faster Alpha is; training times are whole processes, reading the text included)")


if __name__ == "__main__":
    main()
