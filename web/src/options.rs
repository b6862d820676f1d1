//! The options object `Trainer.create` takes: `alpha-native train`'s flags in camelCase,
//! every field optional, the defaults `alpha_core::run::DEFAULT`'s.

use alpha_core::checkpoint::{SavePolicy, TrainSettings};
use alpha_core::run::{Cadence, DEFAULT};
use alpha_core::GptConfig;
use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;

/// Where to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// WebGPU when the browser has a usable adapter, else the CPU.
    Auto,
    /// WebGPU only (an error without it).
    Webgpu,
    /// The CPU kernels in WebAssembly.
    Cpu,
}

/// The fields of the options object.
#[derive(Debug, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct Raw {
    layers: usize,
    heads: usize,
    embd: usize,
    block: usize,
    batch: usize,
    lr: f64,
    min_lr: f64,
    warmup: u64,
    iters: Option<u64>,
    lr_decay_iters: Option<u64>,
    weight_decay: f64,
    beta1: f64,
    beta2: f64,
    grad_clip: f64,
    grad_accum: usize,
    seed: u64,
    eval_iters: usize,
    eval_interval: u64,
    sample_interval: u64,
    checkpoint_interval: u64,
    log_interval: u64,
    backend: BackendChoice,
    recompute: bool,
    dropout: f64,
    /// CPU threads (the threads build; others run one). Default: the browser's
    /// `navigator.hardwareConcurrency`.
    threads: Option<usize>,
    /// Learn a byte-level BPE tokenizer of this many tokens from the text, in the page
    /// (`alpha-native tokenizer train`'s). Default: the text's characters.
    vocab_size: Option<usize>,
    /// A Hugging Face tokenizer.json (its text) to encode the text with.
    tokenizer_json: Option<String>,
}

impl Default for Raw {
    fn default() -> Self {
        let d = DEFAULT;
        Raw {
            layers: d.layers,
            heads: d.heads,
            embd: d.embd,
            block: d.block,
            batch: d.batch,
            lr: d.lr,
            min_lr: d.min_lr,
            warmup: d.warmup,
            iters: None,
            lr_decay_iters: None,
            weight_decay: d.weight_decay,
            beta1: d.beta1,
            beta2: d.beta2,
            grad_clip: d.grad_clip,
            grad_accum: d.grad_accum,
            seed: d.seed,
            eval_iters: d.eval_iters,
            eval_interval: d.eval_interval,
            sample_interval: d.sample_interval,
            checkpoint_interval: d.checkpoint_interval,
            log_interval: d.log_interval,
            backend: BackendChoice::Auto,
            recompute: false,
            dropout: d.dropout,
            threads: None,
            vocab_size: None,
            tokenizer_json: None,
        }
    }
}

impl Raw {
    /// Every option at its default (the run's length too) as a JS object: a preset's base.
    pub fn defaults_object() -> Result<JsValue, JsError> {
        let raw = Raw { iters: Some(DEFAULT.iters), ..Raw::default() };
        serde_wasm_bindgen::to_value(&raw).map_err(|e| JsError::new(&e.to_string()))
    }
}

/// The most CPU threads the page uses.
const MAX_THREADS: usize = 64;

/// `navigator.hardwareConcurrency` (1 where the browser does not say).
fn hardware_concurrency() -> usize {
    let navigator = js_sys::Reflect::get(&js_sys::global(), &JsValue::from_str("navigator")).unwrap_or(JsValue::UNDEFINED);
    let cores = js_sys::Reflect::get(&navigator, &JsValue::from_str("hardwareConcurrency")).ok().and_then(|v| v.as_f64());
    cores.map_or(1, |c| (c as usize).max(1))
}

/// Validated options.
pub struct Options {
    raw: Raw,
    /// Model and batch shape.
    pub block: usize,
    /// Seed of the run.
    pub seed: u64,
    /// Steps of the run (the end of the learning-rate schedule).
    pub iters: u64,
    /// Whether `iters` was given.
    pub iters_given: bool,
    /// Batches per split and evaluation.
    pub eval_iters: usize,
    /// Where to train.
    pub backend: BackendChoice,
    /// Activation checkpointing ([`alpha_core::Plan::with_recompute`]).
    pub recompute: bool,
    /// CPU threads (see [`Raw`]'s `threads`).
    pub threads: usize,
    /// How the text becomes tokens.
    pub tokenizer: TokenizerChoice,
}

/// How `Trainer.create` tokenizes its text.
pub enum TokenizerChoice {
    /// One token per character of the text.
    Chars,
    /// Byte-level BPE of this many tokens, learned from the text.
    Learn(usize),
    /// A Hugging Face tokenizer.json's text.
    Json(String),
}

/// `snake_case` as the options object spells it.
pub fn camel(field: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for ch in field.chars() {
        match ch {
            '_' => upper = true,
            c if upper => {
                out.push(c.to_ascii_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

impl Options {
    /// Reads and checks an options object (`undefined` and `null` mean all defaults).
    pub fn from_js(value: JsValue) -> Result<Options, JsError> {
        let raw: Raw = if value.is_undefined() || value.is_null() {
            Raw::default()
        } else {
            serde_wasm_bindgen::from_value(value).map_err(|e| JsError::new(&format!("options: {e}")))?
        };
        if raw.eval_iters == 0 {
            return Err(JsError::new("evalIters must be at least 1"));
        }
        if raw.log_interval == 0 {
            return Err(JsError::new("logInterval must be at least 1"));
        }
        let iters = raw.iters.unwrap_or(DEFAULT.iters);
        let options = Options {
            block: raw.block,
            seed: raw.seed,
            iters,
            iters_given: raw.iters.is_some(),
            eval_iters: raw.eval_iters,
            backend: raw.backend,
            recompute: raw.recompute,
            threads: match raw.threads {
                Some(0) => return Err(JsError::new("threads must be at least 1")),
                Some(n) => n.min(MAX_THREADS),
                None => hardware_concurrency().min(MAX_THREADS),
            },
            tokenizer: match (raw.vocab_size, &raw.tokenizer_json) {
                (Some(_), Some(_)) => return Err(JsError::new("give vocabSize (learn a tokenizer) or tokenizerJson (use one), not both")),
                (Some(n), None) => TokenizerChoice::Learn(n),
                (None, Some(json)) => TokenizerChoice::Json(json.clone()),
                (None, None) => TokenizerChoice::Chars,
            },
            raw,
        };
        options.settings().validate(camel).map_err(|e| JsError::new(&e))?;
        Ok(options)
    }

    /// When the run evaluates, samples, saves and logs, up to step `iters`.
    pub fn cadence(&self, iters: u64) -> Cadence {
        let r = &self.raw;
        Cadence {
            iters,
            eval_interval: r.eval_interval,
            sample_interval: r.sample_interval,
            checkpoint_interval: r.checkpoint_interval,
            log_interval: r.log_interval,
        }
    }

    /// The model for a vocabulary of `vocab_size`.
    pub fn config(&self, vocab_size: usize) -> GptConfig {
        let r = &self.raw;
        GptConfig { vocab_size, block_size: r.block, n_layer: r.layers, n_head: r.heads, n_embd: r.embd }
    }

    /// The run's settings, as a checkpoint stores them.
    pub fn settings(&self) -> TrainSettings {
        let r = &self.raw;
        TrainSettings {
            data: "<browser text>".into(),
            dataset: false,
            batch: r.batch,
            iters: self.iters,
            lr: r.lr,
            lr_decay_iters: r.lr_decay_iters.unwrap_or(self.iters),
            min_lr: r.min_lr,
            warmup: r.warmup,
            weight_decay: r.weight_decay,
            beta1: r.beta1,
            beta2: r.beta2,
            grad_clip: r.grad_clip,
            grad_accum: r.grad_accum,
            seed: r.seed,
            dropout: r.dropout,
            recompute: r.recompute,
            eval_interval: r.eval_interval,
            eval_iters: r.eval_iters,
            sample_interval: r.sample_interval,
            checkpoint_interval: r.checkpoint_interval,
            log_interval: r.log_interval,
            save: SavePolicy::Always,
            keep: 1,
            async_checkpoint: false,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn camel_case_field_names() {
        assert_eq!(super::camel("min_lr"), "minLr");
        assert_eq!(super::camel("grad_accum"), "gradAccum");
        assert_eq!(super::camel("lr"), "lr");
    }
}
