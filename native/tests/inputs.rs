//! What a command reads must be a regular file: a FIFO (which would wait for a writer), a
//! device (/dev/zero and /dev/urandom never end) or a directory is refused in one line before
//! it is read, by every reader: text, prompts, tokenizers, run files, metrics, checkpoints,
//! Hugging Face shards, datasets.

mod common;
use common::*;
use std::fs;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs the binary, failing the test if it is still running after 20 s (a hang).
fn run_bounded(dir: &Path, args: &[&str]) -> Output {
    let mut child = alpha_native().args(args).current_dir(dir).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("{args:?} still ran after 20 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// A non-zero exit with one `error:` line holding `needle`.
fn refused(dir: &Path, args: &[&str], needle: &str) {
    let o = run_bounded(dir, args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && o.status.code().is_some(), "{args:?}: {:?} {err}", o.status);
    assert!(err.starts_with("error: ") && err.trim_end().lines().count() == 1, "{args:?}: {err:?}");
    assert!(err.contains(needle), "{args:?}: {err:?} does not say {needle:?}");
}

fn mkfifo(path: &Path) {
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
}

#[test]
fn devices_fifos_and_directories_are_never_read() {
    let dir = workdir("inputs-special");
    train(&dir, &["--iters", "1"]);
    assert_ok(&run(&dir, &["tokenizer", "train", "--data", "text.txt", "--vocab-size", "300", "--out", "tok.json"]));
    mkfifo(&dir.join("fifo"));
    fs::create_dir_all(dir.join("a-dir")).unwrap();
    let ck = "out/ckpt.safetensors";
    for input in ["/dev/zero", "/dev/urandom", "fifo"] {
        let not_regular = "not a regular file";
        refused(&dir, &["train", "--data", input, "--out", "o", "--iters", "1"], not_regular);
        refused(&dir, &["eval", "--checkpoint", ck, "--text", input], not_regular);
        refused(&dir, &["eval", "--checkpoint", input, "--text", "text.txt"], not_regular);
        refused(&dir, &["sample", "--checkpoint", ck, "--prompt-file", input], not_regular);
        refused(&dir, &["report", "--metrics", input, "--out", "r.html"], not_regular);
        refused(&dir, &["tokenizer", "encode", "--tokenizer", input, "--text", "text.txt"], not_regular);
        refused(&dir, &["tokenizer", "encode", "--tokenizer", "tok.json", "--text", input], not_regular);
        refused(&dir, &["tokenizer", "train", "--data", input, "--vocab-size", "300", "--out", "t.json"], not_regular);
        refused(&dir, &["train", "--data", "text.txt", "--tokenizer", input, "--out", "o"], not_regular);
        refused(&dir, &["train", "--config", input, "--out", "o"], not_regular);
        refused(&dir, &["prepare", "--data", input, "--tokenizer", "tok.json", "--out", "ds"], not_regular);
    }
    refused(&dir, &["train", "--data", "a-dir", "--out", "o"], "is a directory");
    // `prepare` refused its input before it wrote anything.
    assert!(!dir.join("ds").exists());
    // A dataset whose split is a FIFO.
    fs::create_dir_all(dir.join("fifo-ds")).unwrap();
    fs::write(dir.join("fifo-ds/train.bin"), [0u8; 4096]).unwrap();
    mkfifo(&dir.join("fifo-ds/val.bin"));
    refused(&dir, &["train", "--dataset", "fifo-ds", "--tokenizer", "tok.json", "--out", "o"], "not a regular file");
}

/// A shard that `model.safetensors.index.json` names as a FIFO stops `eval`, `train
/// --init-from` and `export` at once.
#[test]
fn a_fifo_shard_of_a_hugging_face_model_is_refused() {
    let dir = workdir("inputs-fifo-shard");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/gpt2-fixture");
    let model = dir.join("model");
    fs::create_dir_all(&model).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json", "text.txt"] {
        fs::copy(fixture.join(f), model.join(f)).unwrap();
    }
    let bytes = fs::read(fixture.join("model.safetensors")).unwrap();
    let names: Vec<String> = safetensors::SafeTensors::deserialize(&bytes).unwrap().names().into_iter().map(String::from).collect();
    let weight_map: serde_json::Map<String, serde_json::Value> = names.iter().map(|n| (n.clone(), "model-00001-of-00001.safetensors".into())).collect();
    fs::write(model.join("model.safetensors.index.json"), serde_json::json!({"weight_map": weight_map}).to_string()).unwrap();
    mkfifo(&model.join("model-00001-of-00001.safetensors"));
    let needle = "model-00001-of-00001.safetensors: it is not a regular file";
    refused(&dir, &["eval", "--checkpoint", "model", "--text", "model/text.txt"], needle);
    refused(&dir, &["train", "--init-from", "model", "--data", "model/text.txt", "--out", "ft"], needle);
    refused(&dir, &["export", "--checkpoint", "model", "--out", "hf"], needle);
}
