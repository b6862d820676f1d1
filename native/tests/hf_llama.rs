//! Hugging Face Llama-family directories in and out, against the references `transformers`
//! itself computed (tests/data/llama-fixture: `LlamaForCausalLM` with grouped heads, Llama 3's
//! RoPE scaling, an untied head; tests/data/qwen2-fixture: `Qwen2ForCausalLM` with q/k/v
//! biases and a tied head; both written by scripts/make_llama_fixture.py): the same ids, loss
//! and greedy tokens, the weights exported byte for byte, fine-tuning from them, and what Alpha
//! cannot run exactly refused in one line naming the field.

mod common;
use common::*;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

const FIXTURES: [&str; 2] = ["llama-fixture", "qwen2-fixture"];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name)
}

fn reference(name: &str) -> Value {
    serde_json::from_str(&fs::read_to_string(fixture(name).join("reference.json")).unwrap()).unwrap()
}

/// `alpha-native eval` of `model` on fixture `name`'s text with 64-token windows.
fn eval(dir: &Path, name: &str, model: &Path) -> Value {
    let text = fixture(name).join("text.txt");
    let o = run(dir, &["eval", "--checkpoint", model.to_str().unwrap(), "--text", text.to_str().unwrap(), "--block", "64"]);
    assert_ok(&o);
    serde_json::from_str(&stdout(&o)).unwrap()
}

/// `ids` decoded by fixture `name`'s tokenizer.
fn decode(name: &str, ids: &Value) -> String {
    let mut decode = alpha_native()
        .args(["tokenizer", "decode", "--tokenizer", fixture(name).to_str().unwrap()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut decode.stdin.take().unwrap(), ids.to_string().as_bytes()).unwrap();
    String::from_utf8_lossy(&decode.wait_with_output().unwrap().stdout).into_owned()
}

#[test]
fn the_ids_loss_and_greedy_tokens_are_transformers() {
    for name in FIXTURES {
        let dir = workdir(&format!("hf-{name}"));
        let r = reference(name);
        let got = eval(&dir, name, &fixture(name));
        let (loss, want) = (got["loss"].as_f64().unwrap(), r["loss"].as_f64().unwrap());
        assert!(((loss - want) / want).abs() < 1e-5, "{name}: Alpha {loss}, transformers {want}");
        assert_eq!((got["windows"].clone(), got["tokens"].clone()), (r["windows"].clone(), r["tokens"].clone()), "{name}");
        let text = fixture(name).join("text.txt");
        let o = run(&dir, &["tokenizer", "encode", "--tokenizer", fixture(name).to_str().unwrap(), "--text", text.to_str().unwrap()]);
        assert_ok(&o);
        assert_eq!(serde_json::from_str::<Value>(&stdout(&o)).unwrap()["ids"], r["ids"], "{name}");
        // Greedy generation with the KV cache of the key/value heads: transformers' 12 tokens.
        let prompt = r["prompt"].as_str().unwrap();
        let o = run(&dir, &["sample", "--checkpoint", fixture(name).to_str().unwrap(), "--prompt", prompt, "--tokens", "12", "--temperature", "0"]);
        assert_ok(&o);
        assert_eq!(stdout(&o), format!("{prompt}{}\n", decode(name, &r["greedy"])), "{name}");
    }
}

/// Export writes what transformers wrote: every weight byte for byte (the fused q/k/v and
/// gate/up projections cut back into Hugging Face's tensors), the config's fields, and a
/// fine-tuned model exports and loads back with the same loss.
#[test]
fn export_writes_the_same_weights_and_fine_tuning_round_trips() {
    for name in FIXTURES {
        let dir = workdir(&format!("hf-export-{name}"));
        let m = fixture(name);
        assert_ok(&run(&dir, &["export", "--checkpoint", m.to_str().unwrap(), "--out", "fixture"]));
        let ours = fs::read(dir.join("fixture/model.safetensors")).unwrap();
        let theirs = fs::read(m.join("model.safetensors")).unwrap();
        let (ours, theirs) = (safetensors::SafeTensors::deserialize(&ours).unwrap(), safetensors::SafeTensors::deserialize(&theirs).unwrap());
        let mut names = theirs.names();
        names.sort();
        let mut our_names = ours.names();
        our_names.sort();
        assert_eq!(our_names, names, "{name}");
        for n in names {
            let (a, b) = (ours.tensor(n).unwrap(), theirs.tensor(n).unwrap());
            assert_eq!((a.dtype(), a.shape()), (b.dtype(), b.shape()), "{name}: {n}");
            assert!(a.data() == b.data(), "{name}: tensor {n} differs");
        }
        let config: Value = serde_json::from_str(&fs::read_to_string(dir.join("fixture/config.json")).unwrap()).unwrap();
        let want: Value = serde_json::from_str(&fs::read_to_string(m.join("config.json")).unwrap()).unwrap();
        for key in [
            "model_type",
            "architectures",
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "rms_norm_eps",
            "rope_parameters",
            "tie_word_embeddings",
            "max_position_embeddings",
            "eos_token_id",
        ] {
            assert_eq!(config[key], want[key], "{name}: {key}");
        }
        // The exported directory is the same model.
        assert_eq!(eval(&dir, name, &dir.join("fixture"))["loss"], eval(&dir, name, &m)["loss"], "{name}");

        fs::copy(m.join("text.txt"), dir.join("text.txt")).unwrap();
        let train =
            ["train", "--init-from", m.to_str().unwrap(), "--data", "text.txt", "--iters", "3", "--batch", "2", "--block", "32", "--eval-interval", "0"];
        assert_ok(&run(&dir, &[&train[..], &["--sample-interval", "0", "--out", "ft", "--threads", "2"]].concat()));
        let ck = alpha_core::checkpoint::from_bytes(&fs::read(dir.join("ft/ckpt.safetensors")).unwrap()).unwrap();
        assert_eq!(ck.config.llama().map(|l| l.n_kv_head), Some(if name == "llama-fixture" { 2 } else { 1 }), "{name}");
        assert_ok(&run(&dir, &["export", "--checkpoint", "ft/ckpt.safetensors", "--out", "ft-hf"]));
        let a = run(&dir, &["eval", "--checkpoint", "ft/ckpt.safetensors", "--text", "text.txt"]);
        let b = run(&dir, &["eval", "--checkpoint", "ft-hf", "--text", "text.txt"]);
        assert_ok(&a);
        assert_eq!(stdout(&a), stdout(&b), "{name}");
        // Settings that would change the model are refused.
        expect_error(&dir, &[&train[..], &["--kv-heads", "4", "--out", "x"]].concat(), "--kv-heads 4 differs from the checkpoint's number of key/value heads");
    }
}

#[test]
fn what_alpha_cannot_run_exactly_is_refused_naming_the_field() {
    let dir = workdir("hf-llama-refusals");
    let text = fixture("llama-fixture").join("text.txt");
    let check = |name: &str, fixture_name: &str, edit: &dyn Fn(&mut Value), needle: &str| {
        let out = dir.join(name);
        fs::create_dir_all(&out).unwrap();
        for f in ["tokenizer.json", "tokenizer_config.json", "model.safetensors"] {
            fs::copy(fixture(fixture_name).join(f), out.join(f)).unwrap();
        }
        let mut c: Value = serde_json::from_str(&fs::read_to_string(fixture(fixture_name).join("config.json")).unwrap()).unwrap();
        edit(&mut c);
        fs::write(out.join("config.json"), c.to_string()).unwrap();
        expect_error(&dir, &["eval", "--checkpoint", out.to_str().unwrap(), "--text", text.to_str().unwrap()], needle);
    };
    let rope = |c: &mut Value, kind: &str| {
        c["rope_scaling"] = serde_json::json!({"rope_type": kind, "factor": 2.0});
        if let Some(p) = c.get_mut("rope_parameters").filter(|p| p.is_object()) {
            p["rope_type"] = kind.into();
        }
    };
    check("yarn", "llama-fixture", &|c| rope(c, "yarn"), "rope_scaling's type is \"yarn\"; Alpha has none and llama3");
    check("attention-bias", "llama-fixture", &|c| c["attention_bias"] = true.into(), "attention_bias is true; Alpha cannot run this llama model exactly");
    check("mlp-bias", "llama-fixture", &|c| c["mlp_bias"] = true.into(), "mlp_bias is true");
    check("act", "llama-fixture", &|c| c["hidden_act"] = "gelu".into(), "hidden_act is \"gelu\", not silu");
    check("head-dim", "llama-fixture", &|c| c["head_dim"] = 16.into(), "head_dim is 16, not hidden_size / num_attention_heads (8)");
    check("kv", "llama-fixture", &|c| c["num_key_value_heads"] = 3.into(), "the number of key/value heads (3) must divide the number of heads (4)");
    check("sliding", "qwen2-fixture", &|c| c["use_sliding_window"] = true.into(), "use_sliding_window is true; Alpha cannot run this qwen2 model exactly");
    // Weights the config does not explain (here: a tied head declared untied, so lm_head is
    // missing) are an error, not a silently different model.
    check("untied", "qwen2-fixture", &|c| c["tie_word_embeddings"] = false.into(), "the weights have no tensor lm_head.weight");
}
