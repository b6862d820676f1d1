"""Alpha's byte-level BPE against Hugging Face `tokenizers`, both ways (scripts/test.sh runs it):

  python3 scripts/tokenizer_parity.py ALPHA_NATIVE

1. `tokenizers` trains a GPT-2-style tokenizer (BPE, ByteLevel pre-tokenizer and decoder, the
   256-byte alphabet, <|endoftext|>) on the corpus and saves it as tokenizer.json and as GPT-2's
   vocab.json + merges.txt; the same tokenizer.json with `add_prefix_space` on is a third file.
2. `alpha-native tokenizer train` learns one from the same corpus; `tokenizers` loads it.
3. For every tokenizer, on the tricky strings of tests/data/tokenizer_tricky.txt (the whole file
   and each line) and on slices of the corpus (one with <|endoftext|> between documents),
   `alpha-native tokenizer encode` must give the ids `tokenizers` gives, and `alpha-native
   tokenizer decode` of them the text's bytes.
4. A character-level model exported by `alpha-native export --format hf`: `tokenizers` loads its
   tokenizer.json and gives every character its id in the checkpoint's vocabulary (the index in
   its sorted characters), decodes them back, and refuses a character outside it.
5. The shapes of modern small models' tokenizer.json files, each built here by `tokenizers`
   (trained on the corpus; the machines cannot download the models' own files): Llama 3's
   (Split with its pattern, then ByteLevel without one; ignore_merges; a template adding
   <|begin_of_text|>), Qwen2's (NFC, Split with its pattern, ByteLevel), SmolLM2's (Digits
   one by one, then ByteLevel with GPT-2's pattern), TinyLlama's and Mistral's
   (SentencePiece style: Prepend and Replace, or Metaspace; byte fallback; <s> before a text),
   and a Split with tiktoken's o200k pattern (none of Alpha's scanners: the regex engine). On the texts of 3, ids equal with and
   without special tokens, and Alpha's decode equal to `tokenizers`' (the text itself where
   the shape is lossless); `alpha-native prepare` writes the corpus as `tokenizers` encodes it
   (then the end token), and the tokenizer.json it writes into meta.json, loaded by
   `tokenizers`, gives the same ids.
Needs: pip install tokenizers
"""
import json
import os
import subprocess
import sys
import tempfile

import unicodedata

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "data", "shakespeare.txt")
TRICKY = os.path.join(ROOT, "tests", "data", "tokenizer_tricky.txt")
VOCAB = 2000
EOT = "<|endoftext|>"


def run(alpha, args, stdin=None):
    out = subprocess.run([alpha, "tokenizer"] + args, input=stdin, capture_output=True)
    if out.returncode != 0:
        sys.exit(f"alpha-native tokenizer {' '.join(args)} failed: {out.stderr.decode(errors='replace')}")
    return out.stdout


def hf_trained(tmp):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([CORPUS], trainer)
    path = os.path.join(tmp, "hf.json")
    tok.save(path)
    gpt2_dir = os.path.join(tmp, "gpt2-files")
    os.mkdir(gpt2_dir)
    tok.model.save(gpt2_dir)
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    spec["pre_tokenizer"]["add_prefix_space"] = True
    prefixed = os.path.join(tmp, "hf-prefix-space.json")
    with open(prefixed, "w", encoding="utf-8") as f:
        json.dump(spec, f)
    return path, gpt2_dir, prefixed


LLAMA3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# tiktoken's o200k pattern: none of Alpha's scanners, so it runs through the regex engine.
O200K = r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def modern_shapes(tmp):
    """(name, path, what decode(encode(text)) must give, or None) of each modern shape, trained by tokenizers on the corpus and on
    the tricky strings (repeated, so that merges reach into them: numbers, scripts, spaces)."""
    tricky_copies = os.path.join(tmp, "tricky-copies.txt")
    with open(TRICKY, encoding="utf-8", newline="") as f:
        tricky = f.read()
    with open(tricky_copies, "w", encoding="utf-8", newline="") as f:
        f.write(tricky * 200)

    def build(name, specials, ignore_merges=False, normalizer=None, pre=None, template_bos=None, suffix=None):
        affix = {"end_of_word_suffix": suffix} if suffix else {}
        tok = Tokenizer(models.BPE(ignore_merges=ignore_merges, **affix))
        if normalizer is not None:
            tok.normalizer = normalizer
        tok.pre_tokenizer = pre
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False, **affix)
        tok.train([CORPUS, tricky_copies], trainer)
        byte_level = processors.ByteLevel(trim_offsets=False)
        if template_bos:
            bos = (template_bos, tok.token_to_id(template_bos))
            template = processors.TemplateProcessing(single=f"{template_bos} $A", pair=f"{template_bos} $A {template_bos} $B", special_tokens=[bos])
            tok.post_processor = processors.Sequence([byte_level, template])
        else:
            tok.post_processor = byte_level
        path = os.path.join(tmp, f"{name}.json")
        tok.save(path)
        return path
    def subword_prefix(name):
        """Metaspace pieces, BPE whose continuing characters carry "##" (continuing_subword_prefix)."""
        tok = Tokenizer(models.BPE(unk_token="<unk>", continuing_subword_prefix="##"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "</s>"], continuing_subword_prefix="##", show_progress=False)
        tok.train([CORPUS, tricky_copies], trainer)
        path = os.path.join(tmp, f"{name}.json")
        tok.save(path)
        return path

    def sentencepiece(name, metaspace):
        """TinyLlama's shape (Prepend and Replace normalizers, no pre-tokenizer) or Mistral's
        (Metaspace, the first text prefixed, no split): BPE over characters, an alphabet kept
        small so that rarer characters fall back to <0xNN> byte tokens (in the vocabulary, not
        added tokens, as in the models' files), a decoder undoing it, <s> before a text."""
        tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
        bytes_ = [f"<0x{b:02X}>" for b in range(256)]
        trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"] + bytes_, limit_alphabet=120, show_progress=False)
        tok.train([CORPUS, tricky_copies], trainer)
        if metaspace:
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        else:
            tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
            tok.pre_tokenizer = None
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
        path = os.path.join(tmp, f"{name}.json")
        tok.save(path)
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
        spec["added_tokens"] = [a for a in spec["added_tokens"] if a["content"] not in bytes_]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(spec, f, ensure_ascii=False)
        return path

    no_regex = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return [
        # Prepend puts a ▁ before every text between special tokens: a space after each there.
        ("TinyLlama's shape", sentencepiece("tinyllama", False), lambda text: None if "<s>" in text else text),
        # Metaspace puts no ▁ before a text that starts with a space, and Strip takes one off.
        ("Mistral's shape", sentencepiece("mistral", True), lambda text: None if text.startswith(" ") else text),
        ("Llama 3's shape", build("llama3", ["<|begin_of_text|>", "<|end_of_text|>"], ignore_merges=True,
                                  pre=pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), "isolated"), no_regex]), template_bos="<|begin_of_text|>"), lambda text: text),
        ("Qwen2's shape", build("qwen2", [EOT, "<|im_start|>", "<|im_end|>"], normalizer=normalizers.NFC(),
                                pre=pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2), "isolated"), no_regex])),
         lambda text: None if EOT in text else unicodedata.normalize("NFC", text)),
        # The decoders keep the affixes, in tokenizers as in Alpha: no round trip to check.
        ("byte-level with end_of_word_suffix </w>", build("suffix", [EOT], pre=pre_tokenizers.ByteLevel(add_prefix_space=False), suffix="</w>"), lambda text: None),
        ("Metaspace with continuing_subword_prefix ##", subword_prefix("prefix"), lambda text: None),
        ("a Split with o200k's pattern (the regex engine)", build("o200k", [EOT], pre=pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(O200K), "isolated"), no_regex])),
         lambda text: text),
        ("SmolLM2's shape", build("smollm2", [EOT, "<|im_start|>", "<|im_end|>"],
                                  pre=pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])),
         lambda text: text),
    ]


def check_modern(alpha, tmp):
    """Part 5 (see the module docs); the number of texts checked."""
    text_path = os.path.join(tmp, "modern.txt")
    checked = 0
    for case, path, round_trip in modern_shapes(tmp):
        hf = Tokenizer.from_file(path)
        for name, text in texts():
            with open(text_path, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            for special in (True, False):
                flags = [] if special else ["--no-special-tokens"]
                ids = json.loads(run(alpha, ["encode", "--tokenizer", path, "--text", text_path] + flags))["ids"]
                want = hf.encode(text, add_special_tokens=special).ids
                if ids != want:
                    at = next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
                    sys.exit(f"{case}, {name}, special tokens {special}: ids differ from tokenizers' at token {at}: Alpha {ids[at:at + 8]}, tokenizers {want[at:at + 8]}")
            decoded = run(alpha, ["decode", "--tokenizer", path], stdin=json.dumps({"ids": ids}).encode())
            if decoded != hf.decode(ids, skip_special_tokens=False).encode("utf-8"):
                sys.exit(f"{case}, {name}: Alpha's decode differs from tokenizers'")
            expected = round_trip(text)
            if expected is not None and decoded != expected.encode("utf-8"):
                sys.exit(f"{case}, {name}: decode(encode(text)) is not the text (NFC-normalized where the shape normalizes)")
            checked += 1
        check_prepare(alpha, tmp, case, path, hf)
    return checked


def check_prepare(alpha, tmp, case, path, hf):
    """`prepare` on a slice of the corpus: ids as tokenizers encodes it (with special tokens), the
    end token after; its meta.json's tokenizer, loaded by tokenizers, encodes as the original."""
    with open(CORPUS, encoding="utf-8", newline="") as f:
        text = f.read()[:300_000]
    data, out = os.path.join(tmp, "prepare.txt"), os.path.join(tmp, "prepared")
    with open(data, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    subprocess.run([alpha, "prepare", "--data", data, "--tokenizer", path, "--out", out, "--force"], check=True, capture_output=True)
    with open(os.path.join(out, "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    ids = []
    for split in ("train.bin", "val.bin"):
        with open(os.path.join(out, split), "rb") as f:
            raw = f.read()
        width = 2 if meta["dtype"] == "uint16" else 4
        ids += [int.from_bytes(raw[i:i + width], "little") for i in range(0, len(raw), width)]
    if ids != hf.encode(text).ids + [meta["eot"]]:
        sys.exit(f"{case}: prepare's ids are not tokenizers' encoding of the text and the end token")
    written = os.path.join(tmp, "written.json")
    with open(written, "w", encoding="utf-8") as f:
        json.dump(meta["tokenizer"], f)
    again = Tokenizer.from_file(written)
    for name, sample in texts():
        if again.encode(sample).ids != hf.encode(sample).ids:
            sys.exit(f"{case}, {name}: the tokenizer.json Alpha wrote encodes otherwise in tokenizers")


def texts():
    with open(TRICKY, encoding="utf-8", newline="") as f:
        tricky = f.read()
    with open(CORPUS, encoding="utf-8", newline="") as f:
        corpus = f.read()
    yield "tricky (whole file)", tricky
    for i, line in enumerate(tricky.split("\n")):
        if line:
            yield f"tricky line {i + 1}", line
    yield "corpus, first 200 kB", corpus[:200_000]
    documents = corpus[1_000_000:1_100_000].split("\n\n")
    yield "corpus documents joined by <|endoftext|>", EOT.join(documents)
    # SentencePiece's special tokens mid-text: what follows one is not the input's first text.
    yield "corpus documents joined by </s><s>", "</s><s>".join(documents[:200])
    yield "corpus documents joined by Llama 3's <|end_of_text|><|begin_of_text|>", "<|end_of_text|><|begin_of_text|>".join(documents[:200])


def main():
    alpha = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        hf_json, gpt2_dir, prefixed = hf_trained(tmp)
        alpha_json = os.path.join(tmp, "alpha.json")
        run(alpha, ["train", "--data", CORPUS, "--vocab-size", str(VOCAB), "--out", alpha_json])
        # (what Alpha loads, what tokenizers loads): GPT-2's files are the tokenizer.json's model.
        cases = [("tokenizers-trained tokenizer.json", hf_json, hf_json), ("tokenizers-trained vocab.json + merges.txt", gpt2_dir, hf_json),
                 ("tokenizer.json with add_prefix_space", prefixed, prefixed), ("Alpha-trained tokenizer.json", alpha_json, alpha_json)]
        text_path = os.path.join(tmp, "text.txt")
        checked = 0
        for case, alpha_file, hf_file in cases:
            hf = Tokenizer.from_file(hf_file)
            for name, text in texts():
                with open(text_path, "w", encoding="utf-8", newline="") as f:
                    f.write(text)
                ids = json.loads(run(alpha, ["encode", "--tokenizer", alpha_file, "--text", text_path]))["ids"]
                want = hf.encode(text).ids
                if ids != want:
                    at = next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
                    sys.exit(f"{case}, {name}: ids differ from tokenizers' at token {at}: Alpha {ids[at:at + 8]}, tokenizers {want[at:at + 8]}")
                decoded = run(alpha, ["decode", "--tokenizer", alpha_file], stdin=json.dumps({"ids": ids}).encode())
                expected = text.encode("utf-8") if case != "tokenizer.json with add_prefix_space" else None
                if expected is not None and decoded != expected:
                    sys.exit(f"{case}, {name}: decode(encode(text)) is not the text")
                checked += 1
        check_char_export(alpha, tmp)
        modern = check_modern(alpha, tmp)
        print(f"tokenizer parity: {checked} texts x tokenizers, ids equal to tokenizers {__import__('tokenizers').__version__}; decode(encode(x)) == x; a character model's export splits as Alpha does;"
              f" {modern} texts x Llama 3's, Qwen2's, SmolLM2's, TinyLlama's and Mistral's shapes and o200k's pattern, with and without special tokens, decode as tokenizers', prepare and the written file too")


def check_char_export(alpha, tmp):
    with open(CORPUS, encoding="utf-8") as f:
        text = f.read()[:30_000]
    data = os.path.join(tmp, "chars.txt")
    with open(data, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    out = os.path.join(tmp, "char-run")
    subprocess.run([alpha, "train", "--data", data, "--iters", "1", "--layers", "1", "--heads", "1", "--embd", "8", "--block", "8", "--batch", "1",
                    "--eval-interval", "0", "--sample-interval", "0", "--out", out], check=True, capture_output=True)
    exported = os.path.join(tmp, "char-hf")
    subprocess.run([alpha, "export", "--checkpoint", os.path.join(out, "ckpt.safetensors"), "--out", exported], check=True, capture_output=True)
    tok = Tokenizer.from_file(os.path.join(exported, "tokenizer.json"))
    chars = sorted(set(text))
    ids = tok.encode(text).ids
    if ids != [chars.index(c) for c in text] or tok.decode(ids) != text:
        sys.exit("the exported character tokenizer does not split as Alpha's")
    try:
        tok.encode("\u20ac" if "\u20ac" not in chars else "\u2603")
        sys.exit("the exported character tokenizer encoded a character outside its vocabulary")
    except Exception:
        pass


if __name__ == "__main__":
    main()
