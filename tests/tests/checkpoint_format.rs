//! Checkpoints across crates: core's memory plan and init, native's safetensors format.
//! The tensor names and shapes must be exactly nanoGPT's `state_dict` (minus the tied
//! `lm_head.weight`), and a save/load round trip must be bit-exact.

use alpha_core::model::init_params;
use alpha_core::settings::RunSettings;
use alpha_core::tokenizer::{CharTokenizer, Tokenizer};
use alpha_core::train::LossScaleState;
use alpha_core::{GptConfig, Plan, Rng};
use alpha_native::checkpoint::{self, TrainState};
use safetensors::SafeTensors;
use std::collections::BTreeMap;
use std::path::PathBuf;

const CFG: GptConfig = GptConfig::gpt2(5, 8, 2, 2, 4);

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("checkpoint_format");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn settings() -> RunSettings {
    RunSettings { batch: 2, iters: 10, lr_decay_iters: 10, warmup: 2, seed: 7, ..RunSettings::defaults("x.txt") }
}

/// nanoGPT's `GPT.state_dict()` keys and shapes for `CFG` (with bias=True), `lm_head` left out.
fn nanogpt_state_dict() -> BTreeMap<String, Vec<usize>> {
    let (v, t, c) = (CFG.vocab_size, CFG.block_size, CFG.n_embd);
    let mut m = BTreeMap::new();
    m.insert("transformer.wte.weight".to_string(), vec![v, c]);
    m.insert("transformer.wpe.weight".to_string(), vec![t, c]);
    for l in 0..CFG.n_layer {
        for (name, shape) in [
            ("ln_1.weight", vec![c]),
            ("ln_1.bias", vec![c]),
            ("attn.c_attn.weight", vec![3 * c, c]),
            ("attn.c_attn.bias", vec![3 * c]),
            ("attn.c_proj.weight", vec![c, c]),
            ("attn.c_proj.bias", vec![c]),
            ("ln_2.weight", vec![c]),
            ("ln_2.bias", vec![c]),
            ("mlp.c_fc.weight", vec![4 * c, c]),
            ("mlp.c_fc.bias", vec![4 * c]),
            ("mlp.c_proj.weight", vec![c, 4 * c]),
            ("mlp.c_proj.bias", vec![c]),
        ] {
            m.insert(format!("transformer.h.{l}.{name}"), shape);
        }
    }
    m.insert("transformer.ln_f.weight".to_string(), vec![c]);
    m.insert("transformer.ln_f.bias".to_string(), vec![c]);
    m
}

#[test]
fn tensors_are_nanogpt_state_dict_and_round_trip_exactly() {
    let plan = Plan::new(CFG, 1, 1).unwrap();
    let mut params = vec![0f32; plan.params_len()];
    init_params(&plan, &mut params, &mut Rng::new(3));
    let m: Vec<f32> = (0..params.len()).map(|i| i as f32 * 0.25).collect();
    let v: Vec<f32> = (0..params.len()).map(|i| (i as f32).sqrt()).collect();
    // A GPU run's loss scaling state (f16 products) round-trips too.
    let loss_scale = Some(LossScaleState { scale: 32768.0, good_steps: 17 });
    let state = TrainState { step: 42, rng_state: u64::MAX.to_string(), settings: settings().with_model(CFG), best_val_loss: None, loss_scale };
    let tokenizer = Tokenizer::from(CharTokenizer::new(vec!['\n', ' ', 'a', 'b', 'é']).unwrap());
    let path = tmp("roundtrip.safetensors");
    checkpoint::save(&path, CFG, &tokenizer, &params, Some((&m, &v, &state))).unwrap();

    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let model: BTreeMap<String, Vec<usize>> =
        st.tensors().into_iter().filter(|(name, _)| !name.starts_with("optimizer.")).map(|(name, view)| (name, view.shape().to_vec())).collect();
    assert_eq!(model, nanogpt_state_dict());
    assert_eq!(st.len(), 3 * model.len(), "params plus two moments per tensor");
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = header.metadata().as_ref().unwrap();
    let config: serde_json::Value = serde_json::from_str(&meta["config"]).unwrap();
    assert_eq!(config, serde_json::json!({"vocab_size": 5, "block_size": 8, "n_layer": 2, "n_head": 2, "n_embd": 4}));
    let tok: serde_json::Value = serde_json::from_str(&meta["tokenizer"]).unwrap();
    assert_eq!(tok, serde_json::json!({"type": "char", "chars": "\n abé"}));

    let back = checkpoint::load(&path).unwrap();
    assert_eq!(back.config, CFG);
    assert_eq!(back.tokenizer, tokenizer);
    assert_eq!(back.params, params);
    let (bm, bv, bs) = back.optimizer.unwrap();
    assert_eq!((bm, bv, bs), (m, v, state));
}

#[test]
fn a_weights_only_checkpoint_loads_without_training_state() {
    let plan = Plan::new(CFG, 1, 1).unwrap();
    let params: Vec<f32> = (0..plan.params_len()).map(|i| i as f32).collect();
    let path = tmp("weights.safetensors");
    let tokenizer = Tokenizer::from(CharTokenizer::new(vec!['a', 'b', 'c', 'd', 'e']).unwrap());
    checkpoint::save(&path, CFG, &tokenizer, &params, None).unwrap();
    let back = checkpoint::load(&path).unwrap();
    assert_eq!(back.params, params);
    assert!(back.optimizer.is_none());
}
