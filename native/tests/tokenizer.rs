//! `alpha-native tokenizer`: training, encode/decode round trips through the CLI, and bad input
//! as one-line errors. (Parity with Hugging Face `tokenizers` is scripts/tokenizer_parity.py.)

mod common;
use common::*;
use std::fs;
use std::io::Write;
use std::process::{Command, Stdio};

/// Runs the binary with `stdin` as its standard input.
fn run_with_input(dir: &std::path::Path, args: &[&str], stdin: &[u8]) -> std::process::Output {
    let mut child = Command::new(BIN).args(args).current_dir(dir).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
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
    for (input, needle) in
        [("[1, 99999]", "token id 99999 is past the vocabulary (260 tokens)"), ("[1, -2]", "-2 is not a token id"), ("{\"x\": 1}", "no \"ids\" array")]
    {
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
