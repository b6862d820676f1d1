"""PyTorch reference for Alpha: a nanoGPT-style GPT built from an Alpha checkpoint.

Optional tooling (Alpha never needs PyTorch to build, run or test):

  eval   python3 scripts/nanogpt_reference.py eval CKPT TEXT
         Mean cross-entropy over every non-overlapping window, the same definition as
         `alpha-native eval --checkpoint CKPT --text TEXT`; prints one JSON line.
  train  python3 scripts/nanogpt_reference.py train [--iters N] [--dropout P] [--layers N] ...
         nanoGPT's train.py on the text's characters with Alpha's schedule and split (90/10,
         warmup then cosine decay, AdamW with decay on 2-D weights, clip 1.0, dropout on the
         embedding, attention probabilities and residual branches); prints the final train
         and val loss (mean of --eval-iters random batches each) as one JSON line, for
         comparing with `alpha-native train` on the same settings.
  bench  python3 scripts/nanogpt_reference.py bench [--threads N] [--iters N] [--warmup N]
                                                    [--device cpu|cuda] [--compile]
                                                    [--precision fp32|bf16] [--arch llama ...]
         Times nanoGPT's training step (AdamW, clip 1.0; fp32 eager by default) on the default
         CPU config (4 layers, 4 heads, 128 embd, block 64, batch 12) and prints ms/iter and
         tok/s. On CUDA each timed step ends with a synchronize (TF32 off, PyTorch's default for
         fp32 matmuls), the way Alpha's GPU bench ends each step with the read of its loss.
         `--precision bf16` runs the forward and loss under bf16 autocast (nanoGPT's
         `dtype='bfloat16'`: fp32 weights and optimizer, no loss scaling); `--compile` wraps
         the model in torch.compile (nanoGPT's `compile=True`; its compilation happens in the
         warm-up steps, which are not timed). `--arch llama` times a Llama-family model
         instead (see `Llama`: F.rms_norm, RoPE, SwiGLU, scaled_dot_product_attention with
         enable_gqa; --kv-heads, --intermediate-size, --rope-theta).

Needs: pip install torch numpy safetensors
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, n_head, dropout=0.0):
        super().__init__()
        self.n_head = n_head
        self.dropout = dropout
        self.ln_1 = nn.LayerNorm(c)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(c, 3 * c)
        self.attn.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(c, 4 * c)
        self.mlp.c_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + F.dropout(self.attn.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)), p)
        return x + F.dropout(self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh")), p)


class LlamaBlock(nn.Module):
    """A Llama block written the strongest eager way: RMSNorm by F.rms_norm, q/k/v as one
    product, RoPE (rotate-half) from precomputed tables, grouped-query attention by
    scaled_dot_product_attention(enable_gqa=True), gate and up as one product with SiLU."""

    def __init__(self, c, n_head, n_kv_head, hidden):
        super().__init__()
        self.n_head, self.n_kv_head, self.hs = n_head, n_kv_head, c // n_head
        self.norm_1 = nn.Parameter(torch.ones(c))
        self.qkv = nn.Linear(c, (n_head + 2 * n_kv_head) * self.hs, bias=False)
        self.o = nn.Linear(c, c, bias=False)
        self.norm_2 = nn.Parameter(torch.ones(c))
        self.gate_up = nn.Linear(c, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, c, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = self.qkv(F.rms_norm(x, (C,), self.norm_1, 1e-5)).split([C, self.n_kv_head * self.hs, self.n_kv_head * self.hs], dim=2)
        q = q.view(B, T, self.n_head, self.hs).transpose(1, 2)
        k = k.view(B, T, self.n_kv_head, self.hs).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, self.hs).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).contiguous().view(B, T, C))
        gate, up = self.gate_up(F.rms_norm(x, (C,), self.norm_2, 1e-5)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def rope(x, cos, sin):
    """Hugging Face's rotate-half rotary embedding of x [B, H, T, HS]."""
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


class Llama(nn.Module):
    """A Llama-family model (tied head) of the same shape as alpha-native's --arch llama."""

    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, n_kv_head, hidden, rope_theta=10000.0):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, n_embd)
        self.blocks = nn.ModuleList([LlamaBlock(n_embd, n_head, n_kv_head, hidden) for _ in range(n_layer)])
        self.norm = nn.Parameter(torch.ones(n_embd))
        hs = n_embd // n_head
        inv_freq = 1.0 / (rope_theta ** (torch.arange(0, hs, 2).float() / hs))
        angles = torch.outer(torch.arange(block_size).float(), inv_freq)
        self.register_buffer("cos", torch.cat((angles, angles), dim=-1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat((angles, angles), dim=-1).sin(), persistent=False)
        for name, p in self.named_parameters():
            if name.endswith(("o.weight", "down.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.embed(idx)
        cos, sin = self.cos[:T], self.sin[:T]
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = F.linear(F.rms_norm(x, (x.size(-1),), self.norm, 1e-5), self.embed.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), reduction="none")


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout=0.0):
        super().__init__()
        self.dropout = dropout
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head, dropout) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as in nanoGPT
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif "ln_" in name and name.endswith("weight"):
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(T, device=idx.device))
        x = F.dropout(x, self.dropout if self.training else 0.0)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), reduction="none")


def load(path):
    from safetensors import safe_open
    with safe_open(path, "pt") as f:
        meta = f.metadata()
        cfg = json.loads(meta["config"])
        chars = json.loads(meta["tokenizer"])["chars"]
        model = GPT(**cfg)
        state = {k: f.get_tensor(k) for k in f.keys() if not k.startswith("optimizer.")}
    state["lm_head.weight"] = state["transformer.wte.weight"]
    model.load_state_dict(state, strict=True)
    return model, cfg, chars


def cmd_eval(args):
    torch.set_num_threads(args.threads)
    model, cfg, chars = load(args.checkpoint)
    stoi = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([stoi[c] for c in open(args.text, encoding="utf-8").read()], dtype=torch.long)
    T = cfg["block_size"]
    n = (len(ids) - 1) // T
    x = ids[: n * T].view(n, T)
    y = ids[1 : n * T + 1].view(n, T)
    total = 0.0
    with torch.no_grad():
        for i in range(0, n, 64):
            total += model(x[i : i + 64], y[i : i + 64]).double().sum().item()
    print(json.dumps({"loss": total / (n * T), "windows": n, "tokens": n * T}))


def lr_at(it, args):
    """nanoGPT's get_lr (Alpha's LrSchedule): linear warmup, cosine decay to min_lr."""
    if it < args.warmup:
        return args.lr * (it + 1) / (args.warmup + 1)
    if it > args.iters:
        return args.min_lr
    ratio = (it - args.warmup) / (args.iters - args.warmup)
    return args.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (args.lr - args.min_lr)


def cmd_train(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    text = open(args.data, encoding="utf-8").read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n = len(data) * 9 // 10
    splits = {"train": data[:n], "val": data[n:]}
    B, T = args.batch, args.block
    model = GPT(len(chars), T, args.layers, args.heads, args.embd, args.dropout)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.99))

    def batch(split):
        d = splits[split]
        ix = torch.randint(len(d) - T, (B,))
        return torch.stack([d[i : i + T] for i in ix]), torch.stack([d[i + 1 : i + 1 + T] for i in ix])

    t0 = time.perf_counter()
    for it in range(args.iters):
        for g in opt.param_groups:
            g["lr"] = lr_at(it, args)
        x, y = batch("train")
        loss = model(x, y).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    seconds = time.perf_counter() - t0
    model.eval()
    losses = {}
    with torch.no_grad():
        for split in ("train", "val"):
            losses[split] = statistics.mean(model(*batch(split)).mean().item() for _ in range(args.eval_iters))
    print(json.dumps({"impl": f"pytorch {torch.__version__}", "iters": args.iters, "dropout": args.dropout, "train_loss": losses["train"],
                      "val_loss": losses["val"], "seconds": seconds}))


def cmd_bench(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    text = open(args.data, encoding="utf-8").read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    B, T = args.batch, args.block
    vocab = args.vocab or len(chars)
    if args.arch == "llama":
        hidden = args.intermediate_size or -(-8 * args.embd // 3 // 64) * 64
        model = Llama(vocab, T, args.layers, args.heads, args.embd, args.kv_heads or args.heads, hidden, args.rope_theta).to(device)
    else:
        model = GPT(vocab, T, args.layers, args.heads, args.embd).to(device)
    step_model = torch.compile(model) if args.compile else model
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99))
    times = []
    for it in range(args.warmup + args.iters):
        t0 = time.perf_counter()
        ix = torch.randint(len(data) - T, (B,))
        x = torch.stack([data[i : i + T] for i in ix])
        y = torch.stack([data[i + 1 : i + 1 + T] for i in ix])
        x, y = x.to(device), y.to(device)
        with autocast:
            loss = step_model(x, y).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        if it >= args.warmup:
            times.append(time.perf_counter() - t0)
    ms = statistics.median(times) * 1e3
    on = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    mode = "compile" if args.compile else "eager"
    print(json.dumps({"impl": f"pytorch {torch.__version__} {mode} {args.precision}", "device": on, "threads": args.threads, "ms_per_iter": ms,
                      "tokens_per_sec": B * T / ms * 1e3, "iters": args.iters, "step_ms": [t * 1e3 for t in times]}))


def run_parser(sub, name, iters, warmup):
    """A subcommand with the model, data and length flags `train` and `bench` share."""
    r = sub.add_parser(name)
    r.add_argument("--data", default="data/shakespeare.txt")
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--iters", type=int, default=iters)
    r.add_argument("--warmup", type=int, default=warmup)
    for flag, default in (("--batch", 12), ("--block", 64), ("--layers", 4), ("--heads", 4), ("--embd", 128)):
        r.add_argument(flag, type=int, default=default)
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("eval")
    e.add_argument("checkpoint")
    e.add_argument("text")
    e.add_argument("--threads", type=int, default=2)
    t = run_parser(sub, "train", iters=2000, warmup=100)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--min-lr", type=float, default=1e-4)
    t.add_argument("--dropout", type=float, default=0.0)
    t.add_argument("--eval-iters", type=int, default=200)
    t.add_argument("--seed", type=int, default=1337)
    b = run_parser(sub, "bench", iters=100, warmup=10)
    b.add_argument("--vocab", type=int, help="vocabulary size (default: the text's characters; more for GPT-2's 50257)")
    b.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    b.add_argument("--compile", action="store_true", help="torch.compile the model (compiled in the warm-up steps)")
    b.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: autocast the forward and loss to bfloat16")
    b.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2", help="llama: RMSNorm, RoPE, SwiGLU, grouped-query attention, tied head")
    b.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (default: --heads)")
    b.add_argument("--intermediate-size", type=int, default=0, help="llama: the SwiGLU width (default: 8/3 of --embd up to a multiple of 64)")
    b.add_argument("--rope-theta", type=float, default=10000.0)
    args = p.parse_args()
    {"eval": cmd_eval, "train": cmd_train, "bench": cmd_bench}[args.cmd](args)


if __name__ == "__main__":
    main()
