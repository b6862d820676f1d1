//! `alpha-native sample`: generate text from a checkpoint.

use crate::checkpoint;
use crate::device::{Backend, DeviceArgs};
use alpha_core::model::{Sampler, SamplingConfig};
use alpha_core::tokenizer::TextStream;
use alpha_core::{Plan, Rng};
use alpha_gpu::{block_on, GpuForward};
use anyhow::{anyhow, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// Flags of `alpha-native sample` (nanoGPT's `sample.py` defaults).
#[derive(Args, Debug, Clone)]
pub struct SampleArgs {
    /// The model: an Alpha checkpoint, a Hugging Face GPT-2 directory, or a cached model name.
    #[arg(long, value_name = "FILE|DIR|NAME")]
    pub checkpoint: PathBuf,
    /// Text the sample continues (printed first).
    #[arg(long, default_value = "\n")]
    pub prompt: String,
    /// A UTF-8 file whose text the sample continues, instead of --prompt.
    #[arg(long, value_name = "FILE", conflicts_with = "prompt")]
    pub prompt_file: Option<PathBuf>,
    /// Tokens to generate; the sample ends sooner at <|endoftext|> where the tokenizer has it.
    #[arg(long, visible_alias = "max-new-tokens", default_value_t = 500)]
    pub tokens: usize,
    /// Softmax temperature (0: always the most likely token).
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// Sample only among the K most likely tokens (0: all).
    #[arg(long, default_value_t = 200)]
    pub top_k: usize,
    /// Then only among the most likely tokens whose probabilities add up to P (nucleus
    /// sampling; 1: all).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// Seed of the sampling.
    #[arg(long, default_value_t = 1337)]
    pub seed: u64,
    /// Context the model sees, in tokens. Default: the checkpoint's block size.
    #[arg(long)]
    pub block: Option<usize>,
    /// Where to run.
    #[command(flatten)]
    pub device: DeviceArgs,
    /// After the sample, print its speed to stderr: the time to the first token (the prompt's
    /// forward) and the time per token after it.
    #[arg(long)]
    pub stats: bool,
}

/// Runs `sample`, writing the prompt and the generated text to stdout.
pub fn run(args: &SampleArgs) -> Result<()> {
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        return Err(anyhow!("--temperature must be a non-negative number, got {}", args.temperature));
    }
    if !(args.top_p > 0.0 && args.top_p <= 1.0) {
        return Err(anyhow!("--top-p must be above 0 and at most 1, got {}", args.top_p));
    }
    let prompt_text = match &args.prompt_file {
        Some(path) => crate::corpus::read_text(path, "prompt file")?,
        None => args.prompt.clone(),
    };
    if prompt_text.is_empty() {
        return Err(anyhow!("--prompt is empty; give at least one character"));
    }
    let ck = checkpoint::load_weights(&args.checkpoint)?;
    let block = context_len(args.block, ck.config.block_size)?;
    let tok = &ck.tokenizer;
    // The prompt starts as the texts the model learned from did: after the special tokens the
    // tokenizer puts before a text (Llama 3's BOS), where it has any.
    let prompt = [tok.special_tokens_around().0, &tok.encode(&prompt_text).map_err(|e| anyhow!("--prompt: {e}"))?].concat();
    args.device.check()?;
    let cfg = SamplingConfig { temperature: args.temperature, top_k: args.top_k, top_p: args.top_p, tokens: args.tokens, stop: tok.end_of_text() };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut result = write!(out, "{prompt_text}");
    // Whole characters only: BPE may split one across tokens.
    let mut text = TextStream::default();
    let start = Instant::now();
    // When the first token came, when the last did, and how many.
    let mut timing = (None, start, 0usize);
    let mut emit = |id| {
        let now = Instant::now();
        timing = (timing.0.or(Some(now)), now, timing.2 + 1);
        if result.is_ok() {
            let chars = text.push(&tok.token_bytes(id));
            result = write!(out, "{chars}").and_then(|_| if chars.contains('\n') { out.flush() } else { Ok(()) });
        }
    };
    match args.device.backend {
        Backend::Cpu => {
            let pool = args.device.pool()?;
            let mut sampler = Sampler::new(ck.config, tok.vocab_size(), block)?;
            sampler.generate(&pool, &ck.params, &prompt, &cfg, &mut Rng::new(args.seed), &mut emit);
        }
        Backend::Gpu => {
            let plan = Plan::new(ck.config, 1, block).and_then(|p| p.with_classes(tok.vocab_size()))?;
            let mut model = block_on(GpuForward::new(args.device.open_gpu()?, plan, &ck.params))?;
            block_on(model.generate(&prompt, &cfg, &mut Rng::new(args.seed), &mut emit))?;
        }
        Backend::Cuda => {
            let plan = Plan::new(ck.config, 1, block).and_then(|p| p.with_classes(tok.vocab_size()))?;
            let mut model = crate::engine::cuda_sampler(&args.device, plan, ck.params.clone())?;
            block_on(model.sample(&prompt, &cfg, &mut Rng::new(args.seed), &mut emit)).map_err(anyhow::Error::msg)?;
        }
        Backend::Auto => unreachable!("the command line resolves --backend auto"),
    }
    let rest = text.finish();
    result.and_then(|_| writeln!(out, "{rest}")).and_then(|_| out.flush()).map_err(|e| anyhow!("cannot write to stdout: {e}"))?;
    if let (true, (Some(first), last, tokens)) = (args.stats, timing) {
        let after = tokens.saturating_sub(1);
        let per_token = if after > 0 { (last - first).as_secs_f64() * 1e3 / after as f64 } else { f64::NAN };
        eprintln!("{tokens} tokens: the first after {:.3} s, then {per_token:.2} ms/token ({:.1} tokens/s)", (first - start).as_secs_f64(), 1e3 / per_token);
    }
    Ok(())
}

/// The context length to use: `requested` (at most the checkpoint's) or the checkpoint's.
pub fn context_len(requested: Option<usize>, block_size: usize) -> Result<usize> {
    match requested {
        Some(0) => Err(anyhow!("--block must be at least 1")),
        Some(b) if b > block_size => Err(anyhow!("--block {b} is larger than the checkpoint's block size {block_size}")),
        Some(b) => Ok(b),
        None => Ok(block_size),
    }
}
