//! The options object `Trainer.create` takes: nanoGPT's names in camelCase, every field
//! optional, defaults those of `alpha-native train`.

use alpha_core::checkpoint::TrainSettings;
use alpha_core::GptConfig;
use serde::Deserialize;
use wasm_bindgen::prelude::*;

/// Where to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
struct Raw {
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
    backend: BackendChoice,
    recompute: bool,
}

impl Default for Raw {
    fn default() -> Self {
        Raw {
            layers: 4,
            heads: 4,
            embd: 128,
            block: 64,
            batch: 12,
            lr: 1e-3,
            min_lr: 1e-4,
            warmup: 100,
            iters: None,
            lr_decay_iters: None,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.99,
            grad_clip: 1.0,
            grad_accum: 1,
            seed: 1337,
            eval_iters: 20,
            backend: BackendChoice::Auto,
            recompute: false,
        }
    }
}

/// Validated options.
pub struct Options {
    raw: Raw,
    /// Model and batch shape.
    pub block: usize,
    /// Sequences per micro-batch.
    pub batch: usize,
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
}

/// `snake_case` as the options object spells it.
fn camel(field: &str) -> String {
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
        let iters = raw.iters.unwrap_or(2000);
        let options = Options {
            block: raw.block,
            batch: raw.batch,
            seed: raw.seed,
            iters,
            iters_given: raw.iters.is_some(),
            eval_iters: raw.eval_iters,
            backend: raw.backend,
            recompute: raw.recompute,
            raw,
        };
        options.settings().validate(camel).map_err(|e| JsError::new(&e))?;
        Ok(options)
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
