//! Hugging Face GPT-2 directories in, against the reference `transformers` itself computed
//! (tests/data/gpt2-fixture, written by scripts/make_gpt2_fixture.py): the same loss on the
//! same windows, the same greedy tokens, F16/BF16 and sharded weights, models found by name in
//! the Hugging Face cache, fine-tuning from them, and what Alpha does not run refused in one line.

mod common;
use common::*;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/gpt2-fixture")
}

fn reference() -> Value {
    serde_json::from_str(&fs::read_to_string(fixture().join("reference.json")).unwrap()).unwrap()
}

/// `alpha-native eval` of `model` on the fixture's text with 64-token windows.
fn eval(dir: &Path, model: &Path) -> Value {
    let text = fixture().join("text.txt");
    let o = run(dir, &["eval", "--checkpoint", model.to_str().unwrap(), "--text", text.to_str().unwrap(), "--block", "64"]);
    assert_ok(&o);
    serde_json::from_str(&stdout(&o)).unwrap()
}

/// A tensor to write: name, dtype, shape, bytes.
type Tensor = (String, Dtype, Vec<usize>, Vec<u8>);

/// A copy of the fixture in `dir/name` with its weights rewritten by `weights` (file name ->
/// tensors) and its config edited by `config`.
fn variant(dir: &Path, name: &str, weights: &[(&str, Vec<Tensor>)], config: impl Fn(&mut Value)) -> PathBuf {
    let out = dir.join(name);
    fs::create_dir_all(&out).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        fs::copy(fixture().join(f), out.join(f)).unwrap();
    }
    let mut c: Value = serde_json::from_str(&fs::read_to_string(fixture().join("config.json")).unwrap()).unwrap();
    config(&mut c);
    fs::write(out.join("config.json"), c.to_string()).unwrap();
    for (file, tensors) in weights {
        let views: Vec<(String, TensorView<'_>)> = tensors.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
        fs::write(out.join(file), safetensors::serialize(views, None).unwrap()).unwrap();
    }
    out
}

/// The fixture's tensors as (name, dtype, shape, bytes), each converted by `convert`.
fn tensors(convert: impl Fn(f32) -> (Dtype, Vec<u8>)) -> Vec<Tensor> {
    let bytes = fs::read(fixture().join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| {
            let mut dtype = Dtype::F32;
            let data: Vec<u8> = t
                .data()
                .chunks_exact(4)
                .flat_map(|b| {
                    let (d, v) = convert(f32::from_le_bytes(b.try_into().unwrap()));
                    dtype = d;
                    v
                })
                .collect();
            (name, dtype, t.shape().to_vec(), data)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn the_loss_and_greedy_tokens_are_transformers() {
    let dir = workdir("hf-fixture");
    let r = reference();
    let got = eval(&dir, &fixture());
    let (loss, want) = (got["loss"].as_f64().unwrap(), r["loss"].as_f64().unwrap());
    assert!(((loss - want) / want).abs() < 1e-5, "Alpha {loss}, transformers {want}");
    assert_eq!((got["windows"].clone(), got["tokens"].clone()), (r["windows"].clone(), r["tokens"].clone()));
    assert!(got["bpb"].as_f64().unwrap() > 0.0);
    // The text's ids are those transformers' tokenizer gave.
    let o = run(&dir, &["tokenizer", "encode", "--tokenizer", fixture().to_str().unwrap(), "--text", fixture().join("text.txt").to_str().unwrap()]);
    assert_ok(&o);
    assert_eq!(serde_json::from_str::<Value>(&stdout(&o)).unwrap()["ids"], r["ids"]);
    // Greedy generation: transformers' 12 tokens after the prompt, as text.
    let ids = r["greedy"].to_string();
    let mut decode = alpha_native()
        .args(["tokenizer", "decode", "--tokenizer", fixture().to_str().unwrap()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut decode.stdin.take().unwrap(), ids.as_bytes()).unwrap();
    let want_text = String::from_utf8_lossy(&decode.wait_with_output().unwrap().stdout).into_owned();
    let o =
        run(&dir, &["sample", "--checkpoint", fixture().to_str().unwrap(), "--prompt", r["prompt"].as_str().unwrap(), "--tokens", "12", "--temperature", "0"]);
    assert_ok(&o);
    assert_eq!(stdout(&o), format!("{}{want_text}\n", r["prompt"].as_str().unwrap()));
    // The same from a prompt file, with transformers' name for the length.
    fs::write(dir.join("prompt.txt"), r["prompt"].as_str().unwrap()).unwrap();
    let model = fixture();
    let file_args =
        ["sample", "--checkpoint", model.to_str().unwrap(), "--prompt-file", "prompt.txt", "--max-new-tokens", "12", "--temperature", "0", "--top-p", "0.5"];
    let o = run(&dir, &file_args);
    assert_ok(&o);
    assert_eq!(stdout(&o), format!("{}{want_text}\n", r["prompt"].as_str().unwrap()));
    expect_error(&dir, &["sample", "--checkpoint", model.to_str().unwrap(), "--top-p", "1.5"], "--top-p must be above 0 and at most 1");
}

#[test]
fn half_precision_and_sharded_weights_load() {
    let dir = workdir("hf-variants");
    let want = reference()["loss"].as_f64().unwrap();
    let f16 = variant(&dir, "f16", &[("model.safetensors", tensors(|x| (Dtype::F16, half::f16::from_f32(x).to_le_bytes().to_vec())))], |_| {});
    let bf16 = variant(&dir, "bf16", &[("model.safetensors", tensors(|x| (Dtype::BF16, half::bf16::from_f32(x).to_le_bytes().to_vec())))], |_| {});
    for (model, tolerance) in [(&f16, 1e-3), (&bf16, 1e-2)] {
        let loss = eval(&dir, model)["loss"].as_f64().unwrap();
        assert!(((loss - want) / want).abs() < tolerance, "{}: {loss} against {want}", model.display());
    }
    // Two shards and their index, names without the `transformer.` prefix (older files).
    let all = tensors(|x| (Dtype::F32, x.to_le_bytes().to_vec()));
    let unprefixed = |t: &Tensor| (t.0.trim_start_matches("transformer.").to_string(), t.1, t.2.clone(), t.3.clone());
    let (first, second): (Vec<_>, Vec<_>) = all.iter().map(unprefixed).partition(|t| t.0.starts_with("h.0."));
    let weight_map: serde_json::Map<String, Value> = first
        .iter()
        .map(|t| (t.0.clone(), "model-00001-of-00002.safetensors".into()))
        .chain(second.iter().map(|t| (t.0.clone(), "model-00002-of-00002.safetensors".into())))
        .collect();
    let sharded = variant(&dir, "sharded", &[("model-00001-of-00002.safetensors", first), ("model-00002-of-00002.safetensors", second)], |_| {});
    fs::write(sharded.join("model.safetensors.index.json"), serde_json::json!({"metadata": {}, "weight_map": weight_map}).to_string()).unwrap();
    let loss = eval(&dir, &sharded)["loss"].as_f64().unwrap();
    assert!(((loss - want) / want).abs() < 1e-5, "sharded: {loss} against {want}");
}

#[test]
fn models_are_found_by_name_in_the_hugging_face_cache() {
    let dir = workdir("hf-cache");
    let home = dir.join("hf-home");
    let snapshot = home.join("hub/models--openai-community--gpt2/snapshots/0123abcd");
    fs::create_dir_all(&snapshot).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        fs::copy(fixture().join(f), snapshot.join(f)).unwrap();
    }
    let text = fixture().join("text.txt");
    let args = ["eval", "--checkpoint", "gpt2", "--text", text.to_str().unwrap(), "--block", "64"];
    let o = alpha_native().args(args).current_dir(&dir).env("HF_HOME", &home).env_remove("HF_HUB_CACHE").output().unwrap();
    assert_ok(&o);
    let loss = serde_json::from_str::<Value>(&stdout(&o)).unwrap()["loss"].as_f64().unwrap();
    assert!((loss - reference()["loss"].as_f64().unwrap()).abs() < 1e-4);
    let o = alpha_native()
        .args(["eval", "--checkpoint", "gpt2-xl", "--text", text.to_str().unwrap()])
        .current_dir(&dir)
        .env("HF_HOME", &home)
        .env_remove("HF_HUB_CACHE")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1));
    assert!(err.contains("model gpt2-xl is not in the local Hugging Face cache (looked in") && err.contains("models--gpt2-xl/snapshots"), "{err}");
}

#[test]
fn fine_tuning_starts_from_the_weights_with_a_cropped_context() {
    let dir = workdir("hf-finetune");
    let model = fixture();
    let m = model.to_str().unwrap();
    let text = fixture().join("text.txt");
    fs::copy(&text, dir.join("text.txt")).unwrap();
    let base = [
        "train",
        "--init-from",
        m,
        "--data",
        "text.txt",
        "--iters",
        "4",
        "--batch",
        "2",
        "--eval-interval",
        "2",
        "--eval-iters",
        "1",
        "--sample-interval",
        "0",
        "--threads",
        "2",
    ];
    assert_ok(&run(&dir, &[&base[..], &["--block", "16", "--out", "ft", "--metrics", "ft.jsonl"]].concat()));
    let ck = alpha_core::checkpoint::from_bytes(&fs::read(dir.join("ft/ckpt.safetensors")).unwrap()).unwrap();
    assert_eq!((ck.config.block_size, ck.config.n_layer, ck.config.vocab_size, ck.tokenizer.kind()), (16, 2, 320, "bpe"));
    assert!(fs::read_to_string(dir.join("ft/run.toml")).unwrap().contains("init_from = "));
    // The first evaluation is the pretrained model's (its loss on this text, not ln(320)'s
    // random start, which a fresh model of this shape would be near).
    let evals: Vec<Value> =
        fs::read_to_string(dir.join("ft.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).filter(|r: &Value| r["type"] == "eval").collect();
    assert!(evals[0]["val_loss"].as_f64().unwrap() > 5.0, "{evals:?}");
    expect_error(&dir, &[&base[..], &["--block", "65", "--out", "x"]].concat(), "--block 65 is larger than");
    expect_error(&dir, &[&base[..], &["--tokenizer", "t.json", "--out", "x"]].concat(), "brings its own tokenizer");
    // Size flags that would change the model are refused; those that repeat it (a run file of
    // this run) are not.
    expect_error(&dir, &[&base[..], &["--layers", "3", "--out", "x"]].concat(), "--layers 3 differs from the checkpoint's number of layers 2; --init-from");
    expect_error(
        &dir,
        &[&base[..], &["--model", "gpt2", "--out", "x"]].concat(),
        "--model is gpt2 with 12 layers, 12 heads, 768 wide, not the checkpoint's gpt2 with 2 layers",
    );
    assert_ok(&run(&dir, &["train", "--config", "ft/run.toml", "--out", "again", "--iters", "1", "--eval-interval", "0"]));
}

#[test]
fn what_alpha_does_not_run_is_refused_in_one_line() {
    let dir = workdir("hf-refusals");
    let text = fixture().join("text.txt");
    let weights = [("model.safetensors", tensors(|x| (Dtype::F32, x.to_le_bytes().to_vec())))];
    let check = |name: &str, edit: &dyn Fn(&mut Value), needle: &str| {
        let model = variant(&dir, name, &weights, edit);
        expect_error(&dir, &["eval", "--checkpoint", model.to_str().unwrap(), "--text", text.to_str().unwrap()], needle);
    };
    check("relu", &|c| c["activation_function"] = "relu".into(), "activation_function is \"relu\"; Alpha runs GPT-2");
    check("eps", &|c| c["layer_norm_epsilon"] = 1e-6.into(), "layer_norm_epsilon is 0.000001");
    check("mistral", &|c| c["model_type"] = "mistral".into(), "model_type is \"mistral\"; Alpha runs gpt2, llama and qwen2 models");
    check("vocab", &|c| c["vocab_size"] = 319.into(), "vocab_size is 319 but the tokenizer has 320 tokens");
    check("layers", &|c| c["n_layer"] = 3.into(), "the weights have no tensor transformer.h.2.ln_1.weight");
    // A config that understates the layers (or tensors it does not explain) would drop weights.
    check("fewer-layers", &|c| c["n_layer"] = 1.into(), "holds tensor transformer.h.1.attn.c_attn.bias, which a model of config.json's 1 layers");
    let stray = [("model.safetensors", {
        let mut t = tensors(|x| (Dtype::F32, x.to_le_bytes().to_vec()));
        t.push(("transformer.h.0.attn.rotary.inv_freq".into(), Dtype::F32, vec![4], vec![0; 16]));
        // The causal mask older transformers saved is explained: Alpha computes it.
        t.push(("h.1.attn.bias".into(), Dtype::F32, vec![1, 1, 2, 2], vec![0; 16]));
        t
    })];
    let model = variant(&dir, "stray", &stray, |_| {});
    for command in [
        &["eval", "--checkpoint", model.to_str().unwrap(), "--text", text.to_str().unwrap()][..],
        &["export", "--checkpoint", model.to_str().unwrap(), "--out", "x"],
    ] {
        expect_error(&dir, command, "holds tensor transformer.h.0.attn.rotary.inv_freq");
    }
    let empty = dir.join("no-config");
    fs::create_dir_all(&empty).unwrap();
    expect_error(&dir, &["eval", "--checkpoint", empty.to_str().unwrap(), "--text", text.to_str().unwrap()], "is a directory without config.json");
    let pickle = dir.join("pickle");
    fs::create_dir_all(&pickle).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        fs::copy(fixture().join(f), pickle.join(f)).unwrap();
    }
    fs::write(pickle.join("pytorch_model.bin"), b"not read").unwrap();
    expect_error(
        &dir,
        &["eval", "--checkpoint", pickle.to_str().unwrap(), "--text", text.to_str().unwrap()],
        "a pickle, which Alpha never loads; convert it once with",
    );
    let untied = [("model.safetensors", {
        let mut t = tensors(|x| (Dtype::F32, x.to_le_bytes().to_vec()));
        let wte = t.iter().find(|t| t.0 == "transformer.wte.weight").unwrap().clone();
        t.push(("lm_head.weight".into(), Dtype::F32, wte.2, vec![0; wte.3.len()]));
        t
    })];
    let model = variant(&dir, "untied", &untied, |_| {});
    expect_error(&dir, &["eval", "--checkpoint", model.to_str().unwrap(), "--text", text.to_str().unwrap()], "lm_head.weight is not the token embedding");
}

/// Export writes what transformers wrote: the fixture's weights come back byte for byte, and
/// a fine-tuned model exports and loads back with the same loss, as does a character model.
#[test]
fn export_writes_the_hugging_face_layout() {
    let dir = workdir("hf-export");
    let m = fixture();
    assert_ok(&run(&dir, &["export", "--checkpoint", m.to_str().unwrap(), "--out", "fixture"]));
    assert_eq!(fs::read(dir.join("fixture/model.safetensors")).unwrap(), fs::read(m.join("model.safetensors")).unwrap());
    let config: Value = serde_json::from_str(&fs::read_to_string(dir.join("fixture/config.json")).unwrap()).unwrap();
    let theirs: Value = serde_json::from_str(&fs::read_to_string(m.join("config.json")).unwrap()).unwrap();
    for key in ["vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "activation_function", "layer_norm_epsilon", "eos_token_id"] {
        assert_eq!(config[key], theirs[key], "{key}");
    }
    expect_error(&dir, &["export", "--checkpoint", m.to_str().unwrap(), "--out", "fixture"], "is not empty; pass --force");
    fs::write(dir.join("a-file"), "kept").unwrap();
    expect_error(&dir, &["export", "--checkpoint", m.to_str().unwrap(), "--out", "a-file", "--force"], "--out a-file exists and is not a directory");
    assert_eq!(fs::read_to_string(dir.join("a-file")).unwrap(), "kept");

    fs::copy(fixture().join("text.txt"), dir.join("text.txt")).unwrap();
    let train = [
        "train",
        "--init-from",
        m.to_str().unwrap(),
        "--data",
        "text.txt",
        "--iters",
        "3",
        "--batch",
        "2",
        "--block",
        "32",
        "--eval-interval",
        "0",
        "--sample-interval",
        "0",
        "--out",
        "ft",
    ];
    assert_ok(&run(&dir, &train));
    assert_ok(&run(&dir, &["export", "--checkpoint", "ft/ckpt.safetensors", "--out", "ft-hf"]));
    let a = run(&dir, &["eval", "--checkpoint", "ft/ckpt.safetensors", "--text", "text.txt"]);
    let b = run(&dir, &["eval", "--checkpoint", "ft-hf", "--text", "text.txt"]);
    assert_ok(&a);
    assert_eq!(stdout(&a), stdout(&b));

    // A vocabulary padded to a multiple of 128 (320 -> 384 rows): the padding gets no
    // gradient (its zero rows stay zero through AdamW), the run is the unpadded run, and
    // export drops the padding.
    let padded = [&train[..], &["--vocab-pad", "128", "--out", "ft-pad"]].concat();
    assert_ok(&run(&dir, &[&train[..], &["--out", "ft-plain", "--metrics", "plain.jsonl", "--log-interval", "1"]].concat()));
    assert_ok(&run(&dir, &[&padded[..], &["--metrics", "pad.jsonl", "--log-interval", "1"]].concat()));
    let losses = |f: &str| -> Vec<f64> {
        let text = fs::read_to_string(dir.join(f)).unwrap();
        text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()).filter(|r| r["type"] == "train").map(|r| r["loss"].as_f64().unwrap()).collect()
    };
    let (plain, pad) = (losses("plain.jsonl"), losses("pad.jsonl"));
    assert_eq!(plain.len(), 3);
    for (x, y) in plain.iter().zip(&pad) {
        assert!((x - y).abs() <= 1e-5 * x, "padded run's loss {y} vs {x}");
    }
    let ck = alpha_core::checkpoint::from_bytes(&fs::read(dir.join("ft-pad/ckpt.safetensors")).unwrap()).unwrap();
    assert_eq!((ck.config.vocab_size, ck.tokenizer.vocab_size()), (384, 320));
    assert!(ck.params[320 * ck.config.n_embd..384 * ck.config.n_embd].iter().all(|&x| x == 0.0), "the padding rows moved");
    assert_ok(&run(&dir, &["export", "--checkpoint", "ft-pad/ckpt.safetensors", "--out", "pad-hf"]));
    let config: Value = serde_json::from_str(&fs::read_to_string(dir.join("pad-hf/config.json")).unwrap()).unwrap();
    assert_eq!(config["vocab_size"], 320);
    let a = run(&dir, &["eval", "--checkpoint", "ft-pad/ckpt.safetensors", "--text", "text.txt"]);
    let b = run(&dir, &["eval", "--checkpoint", "pad-hf", "--text", "text.txt"]);
    assert_ok(&a);
    assert_eq!(stdout(&a), stdout(&b));
    assert_ok(&run(&dir, &["sample", "--checkpoint", "ft-pad/ckpt.safetensors", "--tokens", "20", "--seed", "3"]));
    expect_error(
        &dir,
        &["train", "--resume", "ft-pad/ckpt.safetensors", "--data", "text.txt", "--vocab-pad", "64"],
        "--vocab-pad: a resumed run keeps its checkpoint's model",
    );

    // A character model exports (a word-level tokenizer.json of its characters) and loads
    // back as the same model.
    assert_ok(&run(
        &dir,
        &["train", "--config", "tiny", "--data", "text.txt", "--iters", "2", "--eval-interval", "0", "--sample-interval", "0", "--out", "chars"],
    ));
    assert_ok(&run(&dir, &["export", "--checkpoint", "chars", "--out", "chars-hf"]));
    let a = run(&dir, &["eval", "--checkpoint", "chars", "--text", "text.txt"]);
    let b = run(&dir, &["eval", "--checkpoint", "chars-hf", "--text", "text.txt"]);
    assert_ok(&a);
    assert_eq!(stdout(&a), stdout(&b));
}
