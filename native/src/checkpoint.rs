//! Checkpoints: safetensors files a PyTorch user can load into a nanoGPT-style model.
//!
//! Tensors use nanoGPT's `state_dict` names and `nn.Linear` layout (`lm_head` is tied to
//! `transformer.wte.weight` and omitted). AdamW moments are stored as
//! `optimizer.exp_avg.<name>` / `optimizer.exp_avg_sq.<name>`. The header's `__metadata__`
//! holds JSON strings: `config` (a [`GptConfig`]), `tokenizer`, and, for a resumable checkpoint, `train`
//! (step, RNG state and the run's settings). Writes are atomic.

use crate::fsutil::write_atomic;
use alpha_core::plan::{ParamInfo, Plan};
use alpha_core::tokenizer::CharTokenizer;
use alpha_core::GptConfig;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// Identifies the file layout in `__metadata__.format`.
pub const FORMAT: &str = "alpha-gpt/1";

/// `__metadata__.tokenizer` for the character tokenizer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizerJson {
    /// Always `"char"`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Every character, in id order.
    pub chars: String,
}

/// The settings of a training run, stored so `--resume` continues the same run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainSettings {
    /// Training text: a file path, or `"<embedded shakespeare>"`.
    pub data: String,
    /// Sequences per micro-batch.
    pub batch: usize,
    /// Total optimizer steps of the run.
    pub iters: u64,
    /// Peak learning rate.
    pub lr: f64,
    /// Step at which the cosine decay reaches `min_lr`.
    pub lr_decay_iters: u64,
    /// Final learning rate.
    pub min_lr: f64,
    /// Warmup steps.
    pub warmup: u64,
    /// AdamW weight decay.
    pub weight_decay: f64,
    /// AdamW beta1.
    pub beta1: f64,
    /// AdamW beta2.
    pub beta2: f64,
    /// Global-norm clip (0 = off).
    pub grad_clip: f64,
    /// Micro-batches per step.
    pub grad_accum: usize,
    /// Seed of the run (initialisation and the evaluation batches).
    pub seed: u64,
}

/// `__metadata__.train`: where a run stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// Optimizer steps taken.
    pub step: u64,
    /// The batch generator's state, as a decimal string (exact in any JSON reader).
    pub rng_state: String,
    /// The run's settings.
    pub settings: TrainSettings,
}

/// Everything in a checkpoint file.
pub struct Checkpoint {
    /// Model shape.
    pub config: GptConfig,
    /// Tokenizer vocabulary in id order.
    pub chars: Vec<char>,
    /// Parameters in plan order.
    pub params: Vec<f32>,
    /// AdamW moments `(exp_avg, exp_avg_sq)` in plan order, with the training state.
    pub optimizer: Option<(Vec<f32>, Vec<f32>, TrainState)>,
}

fn le_bytes(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn shape_of(info: &ParamInfo) -> Vec<usize> {
    if info.ndim() == 2 {
        info.shape.to_vec()
    } else {
        vec![info.shape[0]]
    }
}

/// Writes a checkpoint atomically (temporary file, fsync, rename, fsync of the directory).
pub fn save(path: &Path, config: GptConfig, chars: &[char], params: &[f32], optimizer: Option<(&[f32], &[f32], &TrainState)>) -> Result<(), String> {
    // Any batch shape gives the parameter layout.
    let plan = Plan::new(config, 1, 1).map_err(|e| e.to_string())?;
    let mut arenas: Vec<(String, Vec<u8>)> = vec![(String::new(), le_bytes(params))];
    if let Some((m, v, _)) = optimizer {
        arenas.push(("optimizer.exp_avg.".into(), le_bytes(m)));
        arenas.push(("optimizer.exp_avg_sq.".into(), le_bytes(v)));
    }
    let mut tensors = Vec::new();
    for (prefix, bytes) in &arenas {
        for info in plan.params() {
            let data = &bytes[info.span.offset * 4..info.span.end() * 4];
            let view = TensorView::new(Dtype::F32, shape_of(&info), data).map_err(|e| e.to_string())?;
            tensors.push((format!("{prefix}{info}"), view));
        }
    }
    let mut meta = HashMap::new();
    meta.insert("format".to_string(), FORMAT.to_string());
    meta.insert("config".to_string(), json(&config));
    meta.insert("tokenizer".to_string(), json(&TokenizerJson { kind: "char".into(), chars: chars.iter().collect() }));
    if let Some((_, _, state)) = optimizer {
        meta.insert("train".to_string(), json(state));
    }
    let bytes = safetensors::tensor::serialize(tensors, Some(meta)).map_err(|e| format!("serialising checkpoint: {e}"))?;
    write_atomic(path, &bytes).map_err(|e| format!("cannot write checkpoint {}: {e}", path.display()))
}

fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("plain structs always serialise")
}

/// Reads and validates a checkpoint: every tensor must be present with the shape its
/// config implies; the tokenizer must match the vocabulary size.
pub fn load(path: &Path) -> Result<Checkpoint, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read checkpoint {}: {e}", path.display()))?;
    let bad = |why: String| format!("checkpoint {} is not a valid Alpha checkpoint: {why}", path.display());
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| bad(format!("{e} (truncated or corrupt file?)")))?;
    let tensors = SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
    let meta = header.metadata().as_ref().ok_or_else(|| bad("no __metadata__ in the header".into()))?;
    let field = |key: &str| meta.get(key).ok_or_else(|| bad(format!("__metadata__ has no \"{key}\"")));
    let config: GptConfig = serde_json::from_str(field("config")?).map_err(|e| bad(format!("config: {e}")))?;
    config.validate().map_err(|e| bad(format!("config: {e}")))?;
    let tok: TokenizerJson = serde_json::from_str(field("tokenizer")?).map_err(|e| bad(format!("tokenizer: {e}")))?;
    if tok.kind != "char" {
        return Err(bad(format!("tokenizer type {:?} is not supported (only \"char\")", tok.kind)));
    }
    let chars: Vec<char> = tok.chars.chars().collect();
    if chars.len() != config.vocab_size {
        return Err(bad(format!("the tokenizer has {} characters but vocab_size is {}", chars.len(), config.vocab_size)));
    }
    CharTokenizer::new(&chars[..]).map_err(|e| bad(format!("tokenizer: {e}")))?;
    let plan = Plan::new(config, 1, 1).map_err(|e| bad(e.to_string()))?;
    let read_arena = |prefix: &str| -> Result<Vec<f32>, String> {
        let mut arena = vec![0f32; plan.params_len()];
        for info in plan.params() {
            let name = format!("{prefix}{info}");
            let t = tensors.tensor(&name).map_err(|_| bad(format!("tensor {name} is missing")))?;
            if t.dtype() != Dtype::F32 || t.shape() != shape_of(&info).as_slice() {
                return Err(bad(format!("tensor {name} is {:?} {:?}, expected F32 {:?}", t.dtype(), t.shape(), shape_of(&info))));
            }
            for (dst, src) in arena[info.span.range()].iter_mut().zip(t.data().chunks_exact(4)) {
                *dst = f32::from_le_bytes(src.try_into().expect("chunks of 4"));
            }
        }
        Ok(arena)
    };
    let params = read_arena("")?;
    let optimizer = match meta.get("train") {
        None => None,
        Some(train) => {
            let state: TrainState = serde_json::from_str(train).map_err(|e| bad(format!("train: {e}")))?;
            state.rng_state.parse::<u64>().map_err(|_| bad(format!("train.rng_state {:?} is not an integer", state.rng_state)))?;
            Some((read_arena("optimizer.exp_avg.")?, read_arena("optimizer.exp_avg_sq.")?, state))
        }
    };
    let expected = plan.params().count() * if optimizer.is_some() { 3 } else { 1 };
    let tied_head = usize::from(tensors.tensor("lm_head.weight").is_ok());
    if tensors.len() != expected + tied_head {
        let names = tensors.names();
        let unknown = names.iter().find(|n| **n != "lm_head.weight" && !is_known(&plan, n));
        return Err(bad(match unknown {
            Some(n) => format!("unexpected tensor {n}"),
            None => format!("{} tensors, expected {}", tensors.len(), expected + tied_head),
        }));
    }
    Ok(Checkpoint { config, chars, params, optimizer })
}

fn is_known(plan: &Plan, name: &str) -> bool {
    let base = name.strip_prefix("optimizer.exp_avg_sq.").or_else(|| name.strip_prefix("optimizer.exp_avg.")).unwrap_or(name);
    plan.params().any(|info| info.to_string() == base)
}
