//! `alpha-native tokenizer`: training, encode/decode round trips through the CLI, and bad input
//! as one-line errors. (Parity with Hugging Face `tokenizers` is scripts/tokenizer_parity.py.)

mod common;
use common::*;
use std::fs;
use std::io::Write;
use std::process::Stdio;

/// Runs the binary with `stdin` as its standard input.
fn run_with_input(dir: &std::path::Path, args: &[&str], stdin: &[u8]) -> std::process::Output {
    let mut child = alpha_native().args(args).current_dir(dir).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn trains_encodes_and_decodes_back() {
    let dir = workdir("tokenizer-round-trip");
    text_file(&dir);
    assert_ok(&run(&dir, &["tokenizer", "train", "--data", "text.txt", "--vocab-size", "300", "--out", "tok.json", "--threads", "2"]));
    let json: serde_json::Value = serde_json::from_str(&fs::read_to_string(dir.join("tok.json")).unwrap()).unwrap();
    assert_eq!(json["model"]["type"], "BPE");
    assert_eq!(json["added_tokens"][0]["content"], "<|endoftext|>");
    assert_eq!(json["model"]["merges"].as_array().unwrap().len(), 300 - 257);

    let text = "Thou art naïve, 東京 🦀<|endoftext|>\r\n  end\n";
    let o = run_with_input(&dir, &["tokenizer", "encode", "--tokenizer", "tok.json"], text.as_bytes());
    assert_ok(&o);
    let line = stdout(&o);
    let ids: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert!(ids["ids"].as_array().unwrap().contains(&serde_json::json!(0)), "the special token is id 0: {line}");
    for input in [line.clone(), ids["ids"].to_string(), ids["ids"].as_array().unwrap().iter().map(|v| v.to_string()).collect::<Vec<_>>().join(" ")] {
        let o = run_with_input(&dir, &["tokenizer", "decode", "--tokenizer", "tok.json"], input.as_bytes());
        assert_ok(&o);
        assert_eq!(o.stdout, text.as_bytes());
    }
    let o = run(&dir, &["tokenizer", "info", "--tokenizer", "tok.json"]);
    assert_ok(&o);
    assert!(stdout(&o).starts_with("byte-level BPE: 300 tokens, 43 merges\nadded tokens: 0 = \"<|endoftext|>\""), "{}", stdout(&o));
}

#[test]
fn bad_input_is_a_one_line_error() {
    let dir = workdir("tokenizer-errors");
    text_file(&dir);
    fn train<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        [&["tokenizer", "train", "--data", "text.txt", "--out", "tok.json"][..], extra].concat()
    }
    expect_error(&dir, &train(&["--vocab-size", "100"]), "at least 257");
    assert_ok(&run(&dir, &train(&["--vocab-size", "260"])));
    expect_error(&dir, &train(&["--vocab-size", "260"]), "exists; pass --force");
    expect_error(&dir, &["tokenizer", "train", "--data", "missing.txt", "--vocab-size", "300", "--out", "x.json"], "cannot read data file missing.txt");

    fs::write(dir.join("wordpiece.json"), r#"{"model": {"type": "WordPiece", "vocab": {}}}"#).unwrap();
    expect_error(&dir, &["tokenizer", "info", "--tokenizer", "wordpiece.json"], "the model is WordPiece; Alpha supports byte-level BPE");
    fs::write(dir.join("broken.json"), "{\"model\": ").unwrap();
    expect_error(&dir, &["tokenizer", "info", "--tokenizer", "broken.json"], "not valid JSON");
    expect_error(&dir, &["tokenizer", "info", "--tokenizer", "."], "has neither tokenizer.json nor vocab.json and merges.txt");
    for (input, needle) in [
        ("[1, 99999]", "token id 99999 is past the vocabulary (260 tokens)"),
        ("[1, -2]", "-2 is not a token id"),
        ("{\"x\": 1}", "no \"ids\" array"),
        ("[100000000000000000000000]", "100000000000000000000000 is not a token id"),
    ] {
        let o = run_with_input(&dir, &["tokenizer", "decode", "--tokenizer", "tok.json"], input.as_bytes());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{input}: {err}");
        assert!(err.starts_with("error: ") && err.trim_end().lines().count() == 1 && err.contains(needle), "{input}: {err:?}");
    }
    fs::write(dir.join("latin1.txt"), b"caf\xe9").unwrap();
    expect_error(&dir, &["tokenizer", "encode", "--tokenizer", "tok.json", "--text", "latin1.txt"], "not valid UTF-8");
}

/// A BPE model: trained on a text with `--tokenizer`, it carries the tokenizer in its
/// checkpoint (sample and eval need nothing else), resumes exactly, and samples text.
#[test]
fn a_bpe_model_trains_resumes_samples_and_evaluates() {
    let dir = workdir("tokenizer-bpe-model");
    text_file(&dir);
    assert_ok(&run(&dir, &["tokenizer", "train", "--data", "text.txt", "--vocab-size", "320", "--out", "tok.json"]));
    let common = ["--tokenizer", "tok.json", "--iters", "8", "--lr-decay-iters", "8", "--warmup", "2", "--log-interval", "1", "--eval-interval", "4"];
    train(&dir, &[&common[..], &["--out", "whole", "--metrics", "whole.jsonl"]].concat());
    let mut first = common.to_vec();
    first[3] = "5";
    train(&dir, &[&first[..], &["--out", "split", "--metrics", "split.jsonl"]].concat());
    let args = ["train", "--resume", "split/ckpt.safetensors", "--iters", "8", "--threads", "2", "--metrics", "split.jsonl", "--log-interval", "1"];
    assert_ok(&run(&dir, &[&args[..], QUIET].concat()));
    assert_eq!(train_losses(&dir.join("whole.jsonl")), train_losses(&dir.join("split.jsonl")));
    let (x, y) = (checkpoint_of(&dir, "whole"), checkpoint_of(&dir, "split"));
    assert_eq!((x.params, x.tokenizer.kind(), x.config.vocab_size), (y.params, "bpe", 320));
    expect_error(&dir, &["train", "--resume", "split/ckpt.safetensors", "--iters", "9", "--tokenizer", "tok.json"], "keeps its checkpoint's tokenizer");

    // Text, not ids: valid UTF-8 whatever bytes the (barely trained) model draws, the prompt
    // as given.
    let o = run(&dir, &["sample", "--checkpoint", "whole/ckpt.safetensors", "--prompt", "Thou naïve 🦀", "--tokens", "40"]);
    assert_ok(&o);
    assert!(std::str::from_utf8(&o.stdout).is_ok_and(|s| s.starts_with("Thou naïve 🦀")), "{:?}", o.stdout);
    let o = run(&dir, &["eval", "--checkpoint", "whole/ckpt.safetensors", "--text", "text.txt", "--block", "16"]);
    assert_ok(&o);
    let r: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let (loss, tokens, bpb) = (r["loss"].as_f64().unwrap(), r["tokens"].as_f64().unwrap(), r["bpb"].as_f64().unwrap());
    // Bits per byte: the loss in bits spread over the bytes of the predicted tokens (more
    // than one byte per token on average, so fewer bits per byte than per token).
    assert!(bpb > 0.0 && bpb < loss / std::f64::consts::LN_2, "{r}");
    assert!(tokens < 20_000.0, "BPE tokens are fewer than the text's bytes: {r}");
}

fn checkpoint_of(dir: &std::path::Path, out: &str) -> alpha_core::checkpoint::Checkpoint {
    alpha_core::checkpoint::from_bytes(&fs::read(dir.join(out).join("ckpt.safetensors")).unwrap()).unwrap()
}

/// What would give other ids than Hugging Face `tokenizers` is refused in one line (truncation,
/// padding, an added token whose text the vocabulary gives another id, a template naming a
/// special token it gives no ids); a post-processor that adds nothing (as `transformers` 5
/// saves GPT-2's) is accepted with the same ids, and one that adds a token adds it as
/// `tokenizers` does (and not with --no-special-tokens).
#[test]
fn files_that_would_give_other_ids_than_hugging_face_are_refused() {
    let dir = workdir("tokenizer-hf-differences");
    text_file(&dir);
    assert_ok(&run(&dir, &["tokenizer", "train", "--data", "text.txt", "--vocab-size", "300", "--out", "tok.json"]));
    let original: serde_json::Value = serde_json::from_str(&fs::read_to_string(dir.join("tok.json")).unwrap()).unwrap();
    let variant = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        let mut v = original.clone();
        edit(&mut v);
        fs::write(dir.join(name), v.to_string()).unwrap();
    };
    variant("truncated.json", &|v| v["truncation"] = serde_json::json!({"direction": "Right", "max_length": 5, "strategy": "LongestFirst", "stride": 0}));
    expect_error(&dir, &["tokenizer", "encode", "--tokenizer", "truncated.json", "--text", "text.txt"], "tokenizer.json sets truncation");
    expect_error(&dir, &["prepare", "--data", "text.txt", "--tokenizer", "truncated.json", "--out", "ds"], "sets truncation");
    variant("padded.json", &|v| v["padding"] = serde_json::json!({"strategy": {"Fixed": 64}, "direction": "Right", "pad_id": 0, "pad_token": "[PAD]"}));
    expect_error(&dir, &["tokenizer", "encode", "--tokenizer", "padded.json", "--text", "text.txt"], "tokenizer.json sets padding");
    let token = original["model"]["vocab"].as_object().unwrap().iter().find(|(_, id)| id.as_u64() == Some(290)).unwrap().0.clone();
    variant("clash.json", &|v| {
        let added =
            serde_json::json!({"id": 300, "content": token, "special": true, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false});
        v["added_tokens"].as_array_mut().unwrap().push(added);
    });
    expect_error(&dir, &["tokenizer", "info", "--tokenizer", "clash.json"], "has id 300, but the vocabulary gives its text id 290");
    variant("template.json", &|v| {
        let sequence = |id: &str| serde_json::json!({"Sequence": {"id": id, "type_id": 0}});
        v["post_processor"] =
            serde_json::json!({"type": "TemplateProcessing", "single": [sequence("A")], "pair": [sequence("A"), sequence("B")], "special_tokens": {}});
    });
    let ids = |tokenizer: &str| stdout(&run(&dir, &["tokenizer", "encode", "--tokenizer", tokenizer, "--text", "text.txt"]));
    assert_eq!(ids("template.json"), ids("tok.json"));
    assert!(ids("tok.json").starts_with("{\"ids\":["));
    // A template that adds a token: as tokenizers encodes, with it by default and without it
    // on request; one whose special token has no ids is refused.
    let eot = original["model"]["vocab"]["<|endoftext|>"].as_u64().unwrap();
    let bos = serde_json::json!({"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}});
    let template = |specials: serde_json::Value| serde_json::json!({"type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": specials});
    variant("bos.json", &|v| {
        v["post_processor"] = template(serde_json::json!({"<|endoftext|>": {"id": "<|endoftext|>", "ids": [eot], "tokens": ["<|endoftext|>"]}}))
    });
    let plain = ids("tok.json");
    assert_eq!(ids("bos.json"), plain.replacen("{\"ids\":[", &format!("{{\"ids\":[{eot},"), 1));
    let without = stdout(&run(&dir, &["tokenizer", "encode", "--tokenizer", "bos.json", "--text", "text.txt", "--no-special-tokens"]));
    assert_eq!(without, plain);
    variant("bos-unknown.json", &|v| v["post_processor"] = template(serde_json::json!({})));
    expect_error(&dir, &["tokenizer", "info", "--tokenizer", "bos-unknown.json"], "special_tokens lack \"<|endoftext|>\"");
}

/// Special tokens are checked before any text is counted: an empty one (which would match
/// everywhere) is an error at once, not a loop.
#[test]
fn an_empty_special_token_is_refused_before_counting() {
    let dir = workdir("tokenizer-empty-special");
    text_file(&dir);
    let started = std::time::Instant::now();
    expect_error(
        &dir,
        &["tokenizer", "train", "--data", "text.txt", "--vocab-size", "300", "--out", "t.json", "--special", ""],
        "special token \"\" is empty or repeated",
    );
    assert!(started.elapsed().as_secs() < 10);
}

/// Added tokens are found with one automaton: 100,000 of them encode a text at the speed of
/// one, and a file with 300,000 loads in memory proportional to its size.
#[test]
fn many_added_tokens_cost_neither_speed_nor_memory() {
    let dir = workdir("tokenizer-many-added");
    text_file(&dir);
    assert_ok(&run(&dir, &["tokenizer", "train", "--data", "text.txt", "--vocab-size", "300", "--out", "tok.json"]));
    let text = include_str!("../assets/shakespeare.txt");
    fs::write(dir.join("big.txt"), &text[..2_000_000]).unwrap();
    let many = |n: usize, name: &str| {
        let mut v: serde_json::Value = serde_json::from_str(&fs::read_to_string(dir.join("tok.json")).unwrap()).unwrap();
        let added = v["added_tokens"].as_array_mut().unwrap();
        added.extend((0..n).map(|i| serde_json::json!({"id": 300 + i, "content": format!("<tok{i}>"), "special": true})));
        fs::write(dir.join(name), v.to_string()).unwrap();
        fs::metadata(dir.join(name)).unwrap().len()
    };
    many(100_000, "100k.json");
    let seconds = |tokenizer: &str| {
        let r = json_of(&run(&dir, &["tokenizer", "bench", "--tokenizer", tokenizer, "--text", "big.txt", "--rounds", "3"]));
        r["seconds"].as_f64().unwrap()
    };
    let (one, hundred_thousand) = (seconds("tok.json"), seconds("100k.json"));
    assert!(hundred_thousand < 3.0 * one + 0.05, "100,000 added tokens: {hundred_thousand:.3} s, one: {one:.3} s");
    let bytes = many(300_000, "300k.json");
    let (o, peak_kib) = run_measuring_memory(&dir, &["tokenizer", "info", "--tokenizer", "300k.json"]);
    assert_ok(&o);
    assert!(stdout(&o).contains("and 299981 more"), "{}", stdout(&o));
    let bound_kib = 4 * bytes / 1024 + 64 * 1024;
    assert!(peak_kib < bound_kib, "loading a {bytes}-byte tokenizer.json took {peak_kib} KiB (bound {bound_kib})");
}
