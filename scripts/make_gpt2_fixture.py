"""Writes tests/data/gpt2-fixture/: a tiny GPT-2 made by Hugging Face `transformers` itself, the
reference Alpha's loader is tested against (run once, by hand, where torch and transformers
are installed; CI only reads its output):

  python3 scripts/make_gpt2_fixture.py

- tokenizer: byte-level BPE learned by `tokenizers` (GPT-2's pre-tokenizer, the 256-byte
  alphabet, <|endoftext|>) from the start of data/shakespeare.txt, 320 tokens, saved by
  GPT2TokenizerFast (tokenizer.json, vocab.json, merges.txt, ...);
- model: GPT2LMHeadModel with 2 layers, 2 heads, 32 wide, 64 positions, every parameter drawn
  from N(0, 0.2) with seed 0 (so that LayerNorm weights and biases differ from 1 and 0 and a
  mapping error shows), saved with save_pretrained (config.json, model.safetensors);
- reference.json: for text.txt (a held-out slice of the corpus) the ids `transformers` gives,
  the mean cross-entropy over its non-overlapping windows of 64 tokens (inputs ids[i*64 :
  (i+1)*64], targets shifted by one: alpha-native eval's windows), and 12 greedy tokens
  `generate` draws after a prompt.
"""
import json
import os

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GPT2Config, GPT2LMHeadModel

try:
    from transformers import GPT2TokenizerFast
except ImportError:  # transformers 5 keeps one tokenizer class per model
    from transformers import GPT2Tokenizer as GPT2TokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "gpt2-fixture")
BLOCK = 64


def main():
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(ROOT, "data", "shakespeare.txt"), encoding="utf-8") as f:
        corpus = f.read()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([corpus[:100_000]], trainer)
    fast = GPT2TokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>", unk_token="<|endoftext|>")
    fast.save_pretrained(OUT)

    config = GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=BLOCK, n_embd=32, n_layer=2, n_head=2, activation_function="gelu_new",
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                        bos_token_id=fast.eos_token_id, eos_token_id=fast.eos_token_id)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.eval()
    model.save_pretrained(OUT)

    write_reference(OUT, model, fast, corpus, fast.eos_token_id)


def write_reference(out, model, fast, corpus, pad_token_id):
    """text.txt (a held-out slice of `corpus`) and reference.json in `out`: the ids `fast` gives
    it, `model`'s mean cross-entropy over its non-overlapping BLOCK-token windows, and 12 greedy
    tokens after a prompt (shared with scripts/make_llama_fixture.py)."""
    text = corpus[2_000_000:2_003_000]
    with open(os.path.join(out, "text.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(text)
    ids = fast(text)["input_ids"]
    windows = (len(ids) - 1) // BLOCK
    x = torch.tensor([ids[i * BLOCK:(i + 1) * BLOCK] for i in range(windows)])
    y = torch.tensor([ids[i * BLOCK + 1:(i + 1) * BLOCK + 1] for i in range(windows)])
    with torch.no_grad():
        logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)).item()
    prompt = "ROMEO:"
    prompt_ids = fast(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        generated = model.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids), max_new_tokens=12, do_sample=False,
                                   pad_token_id=pad_token_id)[0, prompt_ids.size(1):].tolist()
    reference = {"block": BLOCK, "ids": ids, "windows": windows, "tokens": windows * BLOCK, "loss": loss,
                 "prompt": prompt, "greedy": generated, "transformers": __import__("transformers").__version__, "torch": torch.__version__}
    with open(os.path.join(out, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(reference, f)
        f.write("\n")
    print(f"wrote {out}: loss {loss:.6f} over {windows} windows, greedy {generated}")


if __name__ == "__main__":
    main()
