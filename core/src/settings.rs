//! Every setting of a training run, defined once: [`RunSettings`], with its defaults
//! ([`DEFAULT`]) and its ranges ([`RunSettings::validate`]). The page deserialises its options
//! into it, `alpha-native train` maps each of its flags onto one field (and a test checks that
//! every field has exactly one flag, defaulting to [`DEFAULT`]'s value), and a checkpoint
//! stores it so that `--resume` continues the same run. What belongs to the machine (backend,
//! threads, paths of outputs) is not a setting of the run.
//!
//! ```
//! use alpha_core::settings::{RunSettings, DEFAULT};
//! let s = RunSettings { iters: 500, lr_decay_iters: 500, ..RunSettings::defaults("input.txt") };
//! assert!(s.validate(|f| format!("--{}", f.replace('_', "-"))).is_ok());
//! assert_eq!((s.config(65).n_layer, s.cadence().eval_interval), (DEFAULT.layers, DEFAULT.eval_interval));
//! ```

use crate::config::{Arch, ConfigError, GptConfig, Llama, MAX_GRAD_ACCUM};
use crate::optim::{AdamWConfig, LrSchedule};
use crate::plan::Plan;
use crate::train::TrainConfig;
use alloc::format;
use alloc::string::String;
use serde::{Deserialize, Serialize};

/// Every setting of a training run (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSettings {
    /// Transformer blocks.
    #[serde(default)]
    pub layers: usize,
    /// Attention heads per block (dividing `embd`).
    #[serde(default)]
    pub heads: usize,
    /// Embedding width.
    #[serde(default)]
    pub embd: usize,
    /// Context length in tokens (the model's block size).
    #[serde(default)]
    pub block: usize,
    /// The blocks' family (older checkpoints: GPT-2).
    #[serde(default)]
    pub arch: Family,
    /// Llama: key/value heads (dividing `heads`); 0: one per head.
    #[serde(default)]
    pub kv_heads: usize,
    /// Llama: the SwiGLU MLP's width; 0: 8/3 of `embd` rounded up to a multiple of 64 (Meta's
    /// rule; SmolLM2's 1536 for 576).
    #[serde(default)]
    pub intermediate_size: usize,
    /// Llama: rotary embeddings' base.
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    /// Llama: RMSNorm's epsilon.
    #[serde(default = "default_norm_eps")]
    pub norm_eps: f64,
    /// Llama: biases on the q, k and v projections (Qwen2's).
    #[serde(default)]
    pub qkv_bias: bool,
    /// Llama: an LM head of its own rather than the token embedding.
    #[serde(default)]
    pub untied_head: bool,
    /// Training text: a file path or `"<embedded shakespeare>"` (native), a label (browser);
    /// with `dataset`, a prepared dataset's directory or shard pattern; empty: the frontend's
    /// default text.
    pub data: String,
    /// Whether `data` names a prepared dataset (`train --dataset`) rather than a text.
    #[serde(default)]
    pub dataset: bool,
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
    /// Seed of the run (initialisation, batches, evaluation, dropout masks).
    pub seed: u64,
    /// Dropout probability in training (0: none; older checkpoints have none).
    #[serde(default)]
    pub dropout: f64,
    /// Activation checkpointing (each block's forward run again before its backward).
    #[serde(default)]
    pub recompute: bool,
    /// Steps between evaluations (0: none). Checkpoints from before it was stored read the
    /// default of [`DEFAULT`], as the rest of the cadence.
    #[serde(default = "default_eval_interval")]
    pub eval_interval: u64,
    /// Batches per split and evaluation.
    #[serde(default = "default_eval_iters")]
    pub eval_iters: usize,
    /// Steps between samples (0: none).
    #[serde(default = "default_sample_interval")]
    pub sample_interval: u64,
    /// Steps between checkpoints (0: only at the end).
    #[serde(default = "default_checkpoint_interval")]
    pub checkpoint_interval: u64,
    /// Steps between logged records.
    #[serde(default = "default_log_interval")]
    pub log_interval: u64,
    /// Which checkpoints the run writes.
    #[serde(default)]
    pub save: SavePolicy,
    /// Checkpoints kept (the newest, and the last `keep` saves beside it where above 1).
    #[serde(default = "one")]
    pub keep: usize,
    /// Whether checkpoints are written in the background.
    #[serde(default)]
    pub async_checkpoint: bool,
}

fn default_eval_interval() -> u64 {
    DEFAULT.eval_interval
}

fn default_eval_iters() -> usize {
    DEFAULT.eval_iters
}

fn default_sample_interval() -> u64 {
    DEFAULT.sample_interval
}

fn default_checkpoint_interval() -> u64 {
    DEFAULT.checkpoint_interval
}

fn default_log_interval() -> u64 {
    DEFAULT.log_interval
}

fn one() -> usize {
    1
}

fn default_rope_theta() -> f64 {
    DEFAULT.rope_theta
}

fn default_norm_eps() -> f64 {
    DEFAULT.norm_eps
}

/// The family of a run's blocks (`train --arch`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// GPT-2 ([`crate::Arch::Gpt2`]).
    #[default]
    Gpt2,
    /// Llama ([`crate::Arch::Llama`]).
    Llama,
}

impl Family {
    /// `"gpt2"` or `"llama"`, as the flag and the file spell it.
    pub fn name(self) -> &'static str {
        match self {
            Family::Gpt2 => "gpt2",
            Family::Llama => "llama",
        }
    }
}

/// Which checkpoints a run writes (`train --save`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SavePolicy {
    /// At every checkpoint interval, at the end and when the run is stopped.
    #[default]
    Always,
    /// After each evaluation whose val loss is the lowest so far, only (nanoGPT's
    /// `always_save_checkpoint = False`, for fine-tuning).
    Best,
}

impl SavePolicy {
    /// `"always"` or `"best"`, as the flag and the file spell it.
    pub fn name(self) -> &'static str {
        match self {
            SavePolicy::Always => "always",
            SavePolicy::Best => "best",
        }
    }
}

impl core::fmt::Display for SavePolicy {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// The SwiGLU width a Llama-family model of width `embd` gets by default: `8/3 · embd`
/// rounded up to a multiple of 64 (SmolLM2's 1536 for 576, Llama's rule of thumb).
pub fn default_intermediate_size(embd: usize) -> usize {
    (8 * embd).div_ceil(3).next_multiple_of(64)
}

/// The most batches an evaluation may ask for (`eval_iters`).
pub const MAX_EVAL_ITERS: usize = 1_000_000;
/// The most checkpoints a run may keep (`keep`).
pub const MAX_KEEP: usize = 1000;

/// The default run: nanoGPT's Shakespeare-char run sized for a CPU (4 layers, 4 heads, 128
/// wide, block 64, batch 12, 2000 steps, the learning rate decaying over all of them). The
/// CLI's flags and the page's options default to these values; presets
/// ([`crate::run::PRESETS`]) change some of them.
pub const DEFAULT: RunSettings = RunSettings {
    layers: 4,
    heads: 4,
    embd: 128,
    block: 64,
    arch: Family::Gpt2,
    kv_heads: 0,
    intermediate_size: 0,
    rope_theta: 10000.0,
    norm_eps: 1e-5,
    qkv_bias: false,
    untied_head: false,
    data: String::new(),
    dataset: false,
    batch: 12,
    iters: 2000,
    lr: 1e-3,
    lr_decay_iters: 2000,
    min_lr: 1e-4,
    warmup: 100,
    weight_decay: 0.1,
    beta1: 0.9,
    beta2: 0.99,
    grad_clip: 1.0,
    grad_accum: 1,
    seed: 1337,
    dropout: 0.0,
    recompute: false,
    eval_interval: 250,
    eval_iters: 20,
    sample_interval: 500,
    checkpoint_interval: 500,
    log_interval: 10,
    save: SavePolicy::Always,
    keep: 1,
    async_checkpoint: false,
};

impl Default for RunSettings {
    fn default() -> Self {
        DEFAULT
    }
}

impl RunSettings {
    /// The default run ([`DEFAULT`]) on `data`.
    pub fn defaults(data: impl Into<String>) -> RunSettings {
        RunSettings { data: data.into(), ..DEFAULT }
    }

    /// The model for a tokenizer of `vocab_size` tokens.
    pub fn config(&self, vocab_size: usize) -> GptConfig {
        let gpt2 = GptConfig::gpt2(vocab_size, self.block, self.layers, self.heads, self.embd);
        match self.arch {
            Family::Gpt2 => gpt2,
            Family::Llama => {
                let llama = Llama {
                    n_kv_head: if self.kv_heads == 0 { self.heads } else { self.kv_heads },
                    intermediate_size: if self.intermediate_size == 0 { default_intermediate_size(self.embd) } else { self.intermediate_size },
                    norm_eps: self.norm_eps,
                    rope_theta: self.rope_theta,
                    rope_scaling: None,
                    qkv_bias: self.qkv_bias,
                    tied: !self.untied_head,
                };
                GptConfig { arch: Arch::Llama(llama), ..gpt2 }
            }
        }
    }

    /// The settings with the model of `config` (a checkpoint's, which decides it).
    pub fn with_model(self, config: GptConfig) -> RunSettings {
        let shape = RunSettings { layers: config.n_layer, heads: config.n_head, embd: config.n_embd, block: config.block_size, ..self };
        match config.llama() {
            None => RunSettings {
                arch: Family::Gpt2,
                kv_heads: DEFAULT.kv_heads,
                intermediate_size: DEFAULT.intermediate_size,
                rope_theta: DEFAULT.rope_theta,
                norm_eps: DEFAULT.norm_eps,
                qkv_bias: false,
                untied_head: false,
                ..shape
            },
            Some(l) => RunSettings {
                arch: Family::Llama,
                kv_heads: l.n_kv_head,
                intermediate_size: l.intermediate_size,
                rope_theta: l.rope_theta,
                norm_eps: l.norm_eps,
                qkv_bias: l.qkv_bias,
                untied_head: !l.tied,
                ..shape
            },
        }
    }

    /// The run's memory plan for `config` (whole blocks, batches of `batch`, its dropout
    /// drawn from its seed, activation checkpointing where it recomputes).
    pub fn plan(&self, config: GptConfig) -> Result<Plan, ConfigError> {
        Plan::new(config, self.batch, config.block_size)?.with_recompute(self.recompute).with_dropout(self.dropout, self.seed)
    }

    /// When the run evaluates, samples, saves and logs, up to its last step.
    pub fn cadence(&self) -> crate::run::Cadence {
        crate::run::Cadence {
            iters: self.iters,
            eval_interval: self.eval_interval,
            sample_interval: self.sample_interval,
            checkpoint_interval: self.checkpoint_interval,
            log_interval: self.log_interval,
        }
    }

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
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(format!("{} must be at least 0 and below 1, got {}", name("dropout"), self.dropout));
        }
        if self.beta1 >= 1.0 || self.beta2 >= 1.0 {
            return Err(format!("{} and {} must be below 1", name("beta1"), name("beta2")));
        }
        for (field, v) in [("iters", self.iters), ("grad_accum", self.grad_accum as u64)] {
            if v == 0 {
                return Err(format!("{} must be at least 1", name(field)));
            }
        }
        if self.grad_accum > MAX_GRAD_ACCUM {
            return Err(format!("{} is {}, more than the largest allowed ({MAX_GRAD_ACCUM})", name("grad_accum"), self.grad_accum));
        }
        if !(1..=MAX_KEEP).contains(&self.keep) {
            return Err(format!("{} must be 1 to {MAX_KEEP}, got {}", name("keep"), self.keep));
        }
        if self.save == SavePolicy::Best && self.eval_interval == 0 {
            return Err(format!("{} best saves after evaluations; give an {}", name("save"), name("eval_interval")));
        }
        if self.eval_interval > 0 && self.eval_iters == 0 {
            return Err(format!("{} must be at least 1 when {} is set", name("eval_iters"), name("eval_interval")));
        }
        if self.eval_iters > MAX_EVAL_ITERS {
            return Err(format!("{} {} is more than {MAX_EVAL_ITERS}", name("eval_iters"), self.eval_iters));
        }
        if self.log_interval == 0 {
            return Err(format!("{} must be at least 1", name("log_interval")));
        }
        if self.arch == Family::Gpt2 {
            let llama_only = [
                ("kv_heads", self.kv_heads != DEFAULT.kv_heads),
                ("intermediate_size", self.intermediate_size != DEFAULT.intermediate_size),
                ("rope_theta", self.rope_theta != DEFAULT.rope_theta),
                ("norm_eps", self.norm_eps != DEFAULT.norm_eps),
                ("qkv_bias", self.qkv_bias),
                ("untied_head", self.untied_head),
            ];
            if let Some((field, _)) = llama_only.iter().find(|(_, set)| *set) {
                return Err(format!("{} is a setting of the Llama family: give {} llama", name(field), name("arch")));
            }
        }
        Ok(())
    }
}
