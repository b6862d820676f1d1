//! Checkpoints: safetensors bytes a PyTorch user can load into a nanoGPT-style model, the
//! same on every frontend (native files, browser downloads).
//!
//! Tensors use nanoGPT's `state_dict` names and `nn.Linear` layout (`lm_head` is tied to
//! `transformer.wte.weight` and omitted). AdamW moments are stored as
//! `optimizer.exp_avg.<name>` / `optimizer.exp_avg_sq.<name>`. The header's `__metadata__`
//! holds JSON strings: `format`, `config` (a [`GptConfig`]), `tokenizer`, and, for a resumable
//! checkpoint, `train` (step, RNG state and the run's settings).

use crate::optim::{AdamWConfig, LrSchedule};
use crate::plan::{ParamInfo, Plan};
use crate::tokenizer::CharTokenizer;
use crate::train::TrainConfig;
use crate::GptConfig;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::{Deserialize, Serialize};

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
    /// Training text: a file path or `"<embedded shakespeare>"` (native), a label (browser).
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

impl TrainSettings {
    /// The optimisation settings of the run (AdamW eps 1e-8, as PyTorch's default).
    pub fn train_config(&self) -> TrainConfig {
        TrainConfig {
            schedule: LrSchedule { max_lr: self.lr, min_lr: self.min_lr, warmup_iters: self.warmup, decay_iters: self.lr_decay_iters },
            adamw: AdamWConfig { beta1: self.beta1, beta2: self.beta2, eps: 1e-8, weight_decay: self.weight_decay },
            grad_clip: self.grad_clip,
            grad_accum: self.grad_accum,
        }
    }

    /// An error naming the first setting out of range; `name` spells a field (given in
    /// snake_case, e.g. `"min_lr"`) the way the caller's users write it (`--min-lr`, `minLr`).
    pub fn validate(&self, name: impl Fn(&str) -> String) -> Result<(), String> {
        for (field, v) in [("lr", self.lr), ("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{} must be a positive number, got {v}", name(field)));
            }
        }
        for (field, v) in [("min_lr", self.min_lr), ("weight_decay", self.weight_decay), ("grad_clip", self.grad_clip)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{} must be a non-negative number, got {v}", name(field)));
            }
        }
        if self.beta1 >= 1.0 || self.beta2 >= 1.0 {
            return Err(format!("{} and {} must be below 1", name("beta1"), name("beta2")));
        }
        for (field, v) in [("iters", self.iters), ("grad_accum", self.grad_accum as u64)] {
            if v == 0 {
                return Err(format!("{} must be at least 1", name(field)));
            }
        }
        Ok(())
    }
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

impl TrainState {
    /// The batch generator the run saved.
    pub fn rng(&self) -> Result<crate::Rng, InvalidCheckpoint> {
        let state = self.rng_state.parse().map_err(|_| InvalidCheckpoint(format!("train.rng_state {:?} is not an integer", self.rng_state)))?;
        Ok(crate::Rng::from_state(state))
    }
}

/// Everything in a checkpoint.
#[derive(Clone, Debug, PartialEq)]
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

/// Why bytes are not a valid checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidCheckpoint(pub String);

impl core::fmt::Display for InvalidCheckpoint {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "not a valid Alpha checkpoint: {}", self.0)
    }
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

/// The safetensors bytes of a checkpoint: `params` (plan order) and, for a resumable one, the
/// AdamW moments with the training state.
pub fn to_bytes(config: GptConfig, chars: &[char], params: &[f32], optimizer: Option<(&[f32], &[f32], &TrainState)>) -> Result<Vec<u8>, String> {
    // Any batch shape gives the parameter layout.
    let plan = Plan::new(config, 1, 1).map_err(|e| e.to_string())?;
    for (what, arena) in [("params", Some(params)), ("exp_avg", optimizer.map(|o| o.0)), ("exp_avg_sq", optimizer.map(|o| o.1))] {
        if let Some(a) = arena.filter(|a| a.len() != plan.params_len()) {
            return Err(format!("{what} has {} elements, the model has {}", a.len(), plan.params_len()));
        }
    }
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
    let mut meta = vec![
        ("format".to_string(), FORMAT.to_string()),
        ("config".to_string(), json(&config)),
        ("tokenizer".to_string(), json(&TokenizerJson { kind: "char".into(), chars: chars.iter().collect() })),
    ];
    if let Some((_, _, state)) = optimizer {
        meta.push(("train".to_string(), json(state)));
    }
    safetensors::tensor::serialize(tensors, Some(meta.into_iter().collect())).map_err(|e| format!("serialising checkpoint: {e}"))
}

fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("plain structs always serialise")
}

/// Reads and validates checkpoint bytes: every tensor must be present with the shape its
/// config implies; the tokenizer must match the vocabulary size. Errors say why the bytes are
/// not a valid Alpha checkpoint.
pub fn from_bytes(bytes: &[u8]) -> Result<Checkpoint, InvalidCheckpoint> {
    let bad = InvalidCheckpoint;
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| bad(format!("{e} (truncated or corrupt file?)")))?;
    let tensors = SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
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
    let read_arena = |prefix: &str| -> Result<Vec<f32>, InvalidCheckpoint> {
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
            state.rng()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_bad_bytes_are_errors() {
        let config = GptConfig { vocab_size: 3, block_size: 4, n_layer: 1, n_head: 1, n_embd: 2 };
        let n = Plan::new(config, 1, 1).unwrap().params_len();
        let params: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
        let bytes = to_bytes(config, &['a', 'b', 'c'], &params, None).unwrap();
        let back = from_bytes(&bytes).unwrap();
        assert_eq!((back.config, back.chars, back.params), (config, vec!['a', 'b', 'c'], params.clone()));
        assert!(back.optimizer.is_none());
        assert!(to_bytes(config, &['a', 'b', 'c'], &params[1..], None).unwrap_err().contains("params has"));
        let err = from_bytes(&bytes[..bytes.len() / 2]).unwrap_err();
        assert!(err.to_string().starts_with("not a valid Alpha checkpoint: "), "{err}");
    }
}
