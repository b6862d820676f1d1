//! Arguments several commands share: the model and its data ([`ModelArgs`], for `train`,
//! `bench` and `info`), GPT-2's sizes, and reading a text into token ids.

use crate::corpus;
use crate::dataset;
use alpha_core::data::Tokens;
use alpha_core::parallel::Parallel;
use alpha_core::settings::DEFAULT;
use alpha_core::tokenizer::{CharTokenizer, Tokenizer};
use alpha_core::{GptConfig, Plan};
use anyhow::{anyhow, Result};
use clap::Args;
use std::path::PathBuf;

/// GPT-2's vocabulary: 50,000 merges, 256 bytes and `<|endoftext|>`.
pub const GPT2_VOCAB: usize = 50257;
/// GPT-2's context.
pub const GPT2_CONTEXT: usize = 1024;

/// The sizes of OpenAI's GPT-2 (`--model`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gpt2Size {
    /// 124M parameters: 12 layers, 12 heads, 768 wide.
    Gpt2,
    /// 350M: 24 layers, 16 heads, 1024 wide.
    Gpt2Medium,
    /// 774M: 36 layers, 20 heads, 1280 wide.
    Gpt2Large,
    /// 1.5B: 48 layers, 25 heads, 1600 wide.
    Gpt2Xl,
}

impl Gpt2Size {
    /// `(layers, heads, width)`.
    pub fn shape(self) -> (usize, usize, usize) {
        match self {
            Gpt2Size::Gpt2 => (12, 12, 768),
            Gpt2Size::Gpt2Medium => (24, 16, 1024),
            Gpt2Size::Gpt2Large => (36, 20, 1280),
            Gpt2Size::Gpt2Xl => (48, 25, 1600),
        }
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
    /// A GPT-2 size: gpt2 (124M), gpt2-medium (350M), gpt2-large (774M), gpt2-xl (1.5B): its
    /// layers, heads and width, a 1024-token context (--block may shorten it) and GPT-2's
    /// vocabulary of 50257 tokens (train it with GPT-2's tokenizer, --tokenizer).
    #[arg(long, value_enum, conflicts_with_all = ["layers", "heads", "embd"])]
    pub model: Option<Gpt2Size>,
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

    /// `--model`'s configuration (with GPT-2's vocabulary), else the size flags' for a
    /// tokenizer of `vocab_size` tokens; the vocabulary padded to `--vocab-pad`.
    pub fn config(&self, vocab_size: usize) -> GptConfig {
        let config = match self.model {
            Some(m) => {
                let (n_layer, n_head, n_embd) = m.shape();
                GptConfig::gpt2(GPT2_VOCAB, self.block(), n_layer, n_head, n_embd)
            }
            None => GptConfig::gpt2(vocab_size, self.block(), self.layers, self.heads, self.embd),
        };
        GptConfig { vocab_size: self.padded_vocab(config.vocab_size), ..config }
    }

    /// A vocabulary of `vocab_size` tokens padded to `--vocab-pad`.
    pub fn padded_vocab(&self, vocab_size: usize) -> usize {
        vocab_size.next_multiple_of(self.vocab_pad as usize)
    }

    /// `--block`, or its default (64, GPT-2's 1024 with `--model`).
    pub fn block(&self) -> usize {
        self.block.unwrap_or(if self.model.is_some() { GPT2_CONTEXT } else { DEFAULT.block })
    }

    /// The memory plan of `config` for a tokenizer of `classes` tokens and batches of `batch`
    /// whole blocks, with `--recompute` and `--dropout` (for `bench` and `info`; a run's is its
    /// settings').
    pub fn plan(&self, config: GptConfig, classes: usize, batch: usize) -> Result<Plan> {
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
