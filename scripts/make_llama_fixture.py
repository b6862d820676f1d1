"""Writes tests/data/llama-fixture/ and tests/data/qwen2-fixture/: tiny Llama-family models made
by Hugging Face `transformers` itself, the references Alpha's loader, sampler and exporter are
tested against (run once, by hand, where torch and transformers are installed; CI only reads
the output):

  python3 scripts/make_llama_fixture.py

- llama-fixture: a byte-level BPE tokenizer in Llama 3's shape (its Split pattern, then
  ByteLevel without one, ignore_merges, <|begin_of_text|> added before a text,
  <|end_of_text|>) learned by `tokenizers` from the start of data/shakespeare.txt, 320 tokens;
  LlamaForCausalLM with 2 layers, 32 wide, 4 heads over 2 key/value heads, SwiGLU 48, 64
  positions, rope_theta 500 with Llama 3's rope_scaling (factor 8, low 1, high 4, original
  context 16: every band of frequencies in use), RMSNorm eps 1e-5, an untied head.
- qwen2-fixture: Qwen2's tokenizer shape (NFC, its Split pattern, ByteLevel; <|endoftext|>,
  no token before a text); Qwen2ForCausalLM (q/k/v biases) with 2 layers, 32 wide, 4 heads
  over 1 key/value head, SwiGLU 40, 64 positions, rope_theta 10000, RMSNorm eps 1e-6, a tied
  head.

Every parameter is drawn from N(0, 0.2) (Qwen2's from N(0, 0.5), whose greedy tokens then vary)
with seed 0 (so that norm weights differ from 1 and a mapping error shows); saved with
save_pretrained (config.json, model.safetensors, tokenizer files). text.txt and reference.json
come from scripts/make_gpt2_fixture.py's `write_reference`: for text.txt (a held-out slice of
the corpus) the ids `transformers` gives (with the tokenizer's special tokens), the mean
cross-entropy over its non-overlapping windows of 64 tokens (alpha-native eval's windows), and
12 greedy tokens `generate` draws after a prompt.
"""
import os

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from make_gpt2_fixture import write_reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMA3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def tokenizer(corpus, pattern, specials, bos=None, nfc=False, ignore_merges=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    no_regex = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), "isolated"), no_regex])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([corpus[:100_000]], trainer)
    byte_level = processors.ByteLevel(trim_offsets=False)
    if bos:
        template = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
        tok.post_processor = processors.Sequence([byte_level, template])
    else:
        tok.post_processor = byte_level
    return tok


def write(name, model_class, config, tok, special, corpus, std=0.2):
    out = os.path.join(ROOT, "tests", "data", name)
    os.makedirs(out, exist_ok=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **special)
    fast.save_pretrained(out)
    torch.manual_seed(0)
    model = model_class(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    model.eval()
    model.save_pretrained(out)

    write_reference(out, model, fast, corpus, config.eos_token_id)


def main():
    with open(os.path.join(ROOT, "data", "shakespeare.txt"), encoding="utf-8") as f:
        corpus = f.read()

    bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
    tok = tokenizer(corpus, LLAMA3, [bos, eos], bos=bos, ignore_merges=True)
    config = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=500.0,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 16},
                         tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                         bos_token_id=tok.token_to_id(bos), eos_token_id=tok.token_to_id(eos))
    write("llama-fixture", LlamaForCausalLM, config, tok, {"bos_token": bos, "eos_token": eos}, corpus)

    eot = "<|endoftext|>"
    tok = tokenizer(corpus, QWEN2, [eot, "<|im_start|>", "<|im_end|>"], nfc=True)
    config = Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=1, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0,
                         tie_word_embeddings=True, use_sliding_window=False, eos_token_id=tok.token_to_id(eot))
    # N(0, 0.5): at 0.2 this tied model's greedy tokens repeat one token, which would test little.
    write("qwen2-fixture", Qwen2ForCausalLM, config, tok, {"eos_token": eot}, corpus, std=0.5)


if __name__ == "__main__":
    main()
