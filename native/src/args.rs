//! Arguments several commands share: the model and its data ([`ModelArgs`], for `train`,
//! `bench` and `info`), the presets' sizes (GPT-2's, SmolLM2's), and reading a text into
//! token ids.

use crate::corpus;
use crate::dataset;
use alpha_core::data::Tokens;
use alpha_core::parallel::Parallel;
use alpha_core::settings::{Family, RunSettings, DEFAULT};
use alpha_core::tokenizer::{CharTokenizer, Tokenizer};
use alpha_core::{GptConfig, Plan};
use anyhow::{anyhow, Result};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Args;
use std::path::PathBuf;

/// GPT-2's vocabulary: 50,000 merges, 256 bytes and `<|endoftext|>`.
pub const GPT2_VOCAB: usize = 50257;
/// GPT-2's context.
pub const GPT2_CONTEXT: usize = 1024;

/// SmolLM2's vocabulary (its tokenizer's 49152 tokens).
pub const SMOLLM2_VOCAB: usize = 49152;
/// The context SmolLM2 was pretrained at (before its long-context stage).
pub const SMOLLM2_CONTEXT: usize = 2048;

/// The models `--model` names: OpenAI's GPT-2 sizes and Hugging Face's SmolLM2 (Llama
/// family), each at its published shape, for training from scratch.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelPreset {
    /// 124M parameters: 12 layers, 12 heads, 768 wide.
    Gpt2,
    /// 350M: 24 layers, 16 heads, 1024 wide.
    Gpt2Medium,
    /// 774M: 36 layers, 20 heads, 1280 wide.
    Gpt2Large,
    /// 1.5B: 48 layers, 25 heads, 1600 wide.
    Gpt2Xl,
    /// SmolLM2-135M: 30 layers, 9 heads over 3 key/value heads, 576 wide, SwiGLU 1536, tied.
    #[value(name = "smollm2-135m")]
    Smollm2_135m,
    /// SmolLM2-360M: 32 layers, 15 heads over 5 key/value heads, 960 wide, SwiGLU 2560, tied.
    #[value(name = "smollm2-360m")]
    Smollm2_360m,
}

impl ModelPreset {
    /// `(layers, heads, width)`.
    pub fn shape(self) -> (usize, usize, usize) {
        match self {
            ModelPreset::Gpt2 => (12, 12, 768),
            ModelPreset::Gpt2Medium => (24, 16, 1024),
            ModelPreset::Gpt2Large => (36, 20, 1280),
            ModelPreset::Gpt2Xl => (48, 25, 1600),
            ModelPreset::Smollm2_135m => (30, 9, 576),
            ModelPreset::Smollm2_360m => (32, 15, 960),
        }
    }

    /// The model's vocabulary: its tokenizer's.
    pub fn vocab_size(self) -> usize {
        if self.family() == Family::Llama {
            SMOLLM2_VOCAB
        } else {
            GPT2_VOCAB
        }
    }

    /// The context it trains at by default.
    pub fn context(self) -> usize {
        if self.family() == Family::Llama {
            SMOLLM2_CONTEXT
        } else {
            GPT2_CONTEXT
        }
    }

    /// The blocks' family.
    pub fn family(self) -> Family {
        match self {
            ModelPreset::Smollm2_135m | ModelPreset::Smollm2_360m => Family::Llama,
            _ => Family::Gpt2,
        }
    }

    /// Its name as `--model` spells it.
    pub fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self).expect("every preset has a name").get_name().to_string()
    }

    /// The settings of its model with a context of `block` tokens (SmolLM2: rope_theta
    /// 100000, RMSNorm eps 1e-5, tied head, no biases).
    fn settings(self, block: usize) -> RunSettings {
        let (layers, heads, embd) = self.shape();
        let llama = match self {
            ModelPreset::Smollm2_135m => RunSettings { kv_heads: 3, intermediate_size: 1536, ..DEFAULT },
            ModelPreset::Smollm2_360m => RunSettings { kv_heads: 5, intermediate_size: 2560, ..DEFAULT },
            _ => DEFAULT,
        };
        let rope_theta = if self.family() == Family::Llama { 100_000.0 } else { DEFAULT.rope_theta };
        RunSettings { layers, heads, embd, block, arch: self.family(), rope_theta, ..llama }
    }
}

/// The model and data flags `train`, `bench` and `info` share.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Training text (UTF-8). Default: the embedded Shakespeare corpus. The last 10% is validation.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// A byte-level BPE tokenizer for the text (a Hugging Face tokenizer.json, or a directory
    /// with one or with GPT-2's vocab.json + merges.txt). Default: the text's characters.
    #[arg(long, value_name = "PATH")]
    pub tokenizer: Option<PathBuf>,
    /// A prepared dataset instead of --data: a directory with train.bin and val.bin (from
    /// `alpha-native prepare`, or nanoGPT's prepare.py with --tokenizer), or a pattern of
    /// llm.c shards ('dir/*_train_*.bin'; the val shards are the same with _val_). Read through
    /// memory maps: larger than RAM is fine.
    #[arg(long, value_name = "DIR|PATTERN", conflicts_with = "data")]
    pub dataset: Option<String>,
    /// Sequences per micro-batch (1 to 2^24, as every size below; the run must also fit in
    /// memory).
    #[arg(long, default_value_t = DEFAULT.batch)]
    pub batch: usize,
    /// Context length in tokens (the model's block size). Default: 64, or 1024 with --model.
    #[arg(long)]
    pub block: Option<usize>,
    /// A published model's shape: a GPT-2 size, gpt2 (124M), gpt2-medium (350M), gpt2-large
    /// (774M), gpt2-xl (1.5B), with a 1024-token context and GPT-2's vocabulary of 50257
    /// tokens; or SmolLM2 (Llama family), smollm2-135m, smollm2-360m, with a 2048-token
    /// context and its 49152 tokens. --block may shorten the context; train with the
    /// model's own tokenizer (--tokenizer).
    #[arg(long, value_enum, conflicts_with_all = ["layers", "heads", "embd", "arch", "kv_heads", "intermediate_size", "rope_theta", "norm_eps", "qkv_bias", "untied_head"])]
    pub model: Option<ModelPreset>,
    /// The blocks' family: gpt2 (LayerNorm, learned positions, GELU, biases, tied head) or
    /// llama (RMSNorm, rotary positions, SwiGLU, grouped-query attention: Hugging Face's
    /// LlamaForCausalLM; the flags below shape it).
    #[arg(long, default_value = "gpt2", value_parser = PossibleValuesParser::new(["gpt2", "llama"]).map(|s| if s == "llama" { Family::Llama } else { Family::Gpt2 }))]
    pub arch: Family,
    /// Llama: key/value heads, dividing --heads (grouped-query attention). 0: one per head.
    #[arg(long, default_value_t = DEFAULT.kv_heads)]
    pub kv_heads: usize,
    /// Llama: the SwiGLU MLP's width. 0: 8/3 of --embd rounded up to a multiple of 64.
    #[arg(long, default_value_t = DEFAULT.intermediate_size)]
    pub intermediate_size: usize,
    /// Llama: the rotary embeddings' base (rope_theta).
    #[arg(long, default_value_t = DEFAULT.rope_theta)]
    pub rope_theta: f64,
    /// Llama: RMSNorm's epsilon (rms_norm_eps).
    #[arg(long, default_value_t = DEFAULT.norm_eps)]
    pub norm_eps: f64,
    /// Llama: biases on the q, k and v projections (Qwen2's).
    #[arg(long)]
    pub qkv_bias: bool,
    /// Llama: an LM head of its own instead of the token embedding (tie_word_embeddings
    /// false).
    #[arg(long)]
    pub untied_head: bool,
    /// Transformer blocks.
    #[arg(long, default_value_t = DEFAULT.layers)]
    pub layers: usize,
    /// Attention heads per block (must divide --embd).
    #[arg(long, default_value_t = DEFAULT.heads)]
    pub heads: usize,
    /// Embedding width.
    #[arg(long, default_value_t = DEFAULT.embd)]
    pub embd: usize,
    /// Activation checkpointing: keep only each block's input through the forward and run
    /// the block's forward again just before its backward. Activations shrink to about a
    /// sixteenth per block for one more forward of each block; losses keep their bits.
    #[arg(long)]
    pub recompute: bool,
    /// Dropout probability in training, on the embedding, the attention probabilities and
    /// both residual branches of every block (nanoGPT's dropout; 0 or more, below 1).
    /// Evaluation and sampling never drop.
    #[arg(long, default_value_t = DEFAULT.dropout)]
    pub dropout: f64,
    /// Pad the model's vocabulary to a multiple of N (nanoGPT's 50304 for GPT-2's 50257 is
    /// --vocab-pad 64: whole GEMM tiles). The padding's logits get no probability and no
    /// gradient; export drops them. 1: no padding.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub vocab_pad: u32,
}

impl ModelArgs {
    /// `--data` (or `--dataset`) as recorded in settings: the path, or [`corpus::EMBEDDED`].
    pub fn data_name(&self) -> String {
        match (&self.dataset, &self.data) {
            (Some(d), _) => d.clone(),
            (None, Some(p)) => p.to_string_lossy().into_owned(),
            (None, None) => corpus::EMBEDDED.to_string(),
        }
    }

    /// The tokenizer and token ids `bench` and `info` run on: all of `--data`'s, or the first
    /// [`DATASET_SAMPLE`] of `--dataset`'s train split.
    pub fn sample_tokens(&self, par: &dyn Parallel) -> Result<(Tokenizer, Vec<u32>)> {
        let tokenizer = self.tokenizer.as_deref().map(|p| crate::tokenizer::load(p).map(Tokenizer::from)).transpose()?;
        let Some(spec) = &self.dataset else { return load_corpus(&self.data_name(), tokenizer, par) };
        let d = dataset::open(spec, tokenizer, par)?;
        let segments = d.train.segments();
        let mut ids = vec![0; d.train.len().min(DATASET_SAMPLE)];
        Tokens::Stream(&segments).read(0, &mut ids);
        Ok((d.tokenizer, ids))
    }

    /// The model's settings: `--model`'s, else the size and family flags'.
    pub fn shape_settings(&self) -> RunSettings {
        match self.model {
            Some(m) => m.settings(self.block()),
            None => RunSettings {
                layers: self.layers,
                heads: self.heads,
                embd: self.embd,
                block: self.block(),
                arch: self.arch,
                kv_heads: self.kv_heads,
                intermediate_size: self.intermediate_size,
                rope_theta: self.rope_theta,
                norm_eps: self.norm_eps,
                qkv_bias: self.qkv_bias,
                untied_head: self.untied_head,
                ..DEFAULT
            },
        }
    }

    /// `--model`'s configuration (with its vocabulary), else the size and family flags' for
    /// a tokenizer of `vocab_size` tokens; the vocabulary padded to `--vocab-pad`.
    pub fn config(&self, vocab_size: usize) -> GptConfig {
        let config = self.shape_settings().config(self.model.map_or(vocab_size, |m| m.vocab_size()));
        GptConfig { vocab_size: self.padded_vocab(config.vocab_size), ..config }
    }

    /// A vocabulary of `vocab_size` tokens padded to `--vocab-pad`.
    pub fn padded_vocab(&self, vocab_size: usize) -> usize {
        vocab_size.next_multiple_of(self.vocab_pad as usize)
    }

    /// `--block`, or its default (64; with `--model`, the model's context).
    pub fn block(&self) -> usize {
        self.block.unwrap_or(self.model.map_or(DEFAULT.block, |m| m.context()))
    }

    /// The memory plan of `config` for a tokenizer of `classes` tokens and batches of `batch`
    /// whole blocks, with `--recompute` and `--dropout` (for `bench` and `info`; a run's is its
    /// settings').
    pub fn plan(&self, config: GptConfig, classes: usize, batch: usize) -> Result<Plan> {
        self.shape_settings().validate(|field| format!("--{}", field.replace('_', "-"))).map_err(anyhow::Error::msg)?;
        let plan = Plan::new(config, batch, config.block_size)
            .and_then(|p| p.with_recompute(self.recompute).with_dropout(self.dropout, DEFAULT.seed))
            .and_then(|p| p.with_classes(classes));
        Ok(plan?)
    }
}

/// The text named by `--data` as token ids, with `tokenizer` (`None`: the text's characters),
/// encoded on `par`'s threads.
pub fn load_corpus(data: &str, tokenizer: Option<Tokenizer>, par: &dyn Parallel) -> Result<(Tokenizer, Vec<u32>)> {
    let text = corpus::training_text(data)?;
    let name = corpus::label(data);
    let tok = match tokenizer {
        Some(t) => t,
        None => CharTokenizer::from_text(&text).map_err(|e| anyhow!("{name}: {e}"))?.into(),
    };
    let ids = crate::tokenizer::encode_with_progress(&tok, par, &text).map_err(|e| anyhow!("{name}: {e}"))?;
    Ok((tok, ids))
}

/// Tokens of a dataset's train split that `bench` and `info` read.
pub const DATASET_SAMPLE: usize = 1 << 24;
