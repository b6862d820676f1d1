//! `alpha-native eval`: the mean cross-entropy of a checkpoint on a text, over every
//! non-overlapping window (window `i`: inputs `ids[i*T..(i+1)*T]`, targets shifted by one).

use crate::checkpoint;
use crate::corpus::read_text;
use crate::sample::context_len;
use alpha_core::tokenizer::CharTokenizer;
use alpha_core::train::OwnedMemory;
use alpha_core::{tape, Plan};
use clap::Args;
use std::path::{Path, PathBuf};

/// Flags of `alpha-native eval`.
#[derive(Args, Debug, Clone)]
pub struct EvalArgs {
    /// Checkpoint to evaluate.
    #[arg(long, value_name = "FILE")]
    pub checkpoint: PathBuf,
    /// UTF-8 text to measure the model on.
    #[arg(long, value_name = "FILE")]
    pub text: PathBuf,
    /// Window length T. Default: the checkpoint's block size.
    #[arg(long)]
    pub block: Option<usize>,
    /// Windows evaluated at once (memory/speed only; the result does not depend on it).
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Worker threads. Default: one per core.
    #[arg(long)]
    pub threads: Option<usize>,
}

/// The result of an evaluation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvalResult {
    /// Mean cross-entropy per token (nats).
    pub loss: f64,
    /// Windows evaluated.
    pub windows: usize,
    /// Tokens predicted (`windows * T`).
    pub tokens: usize,
}

/// Evaluates `checkpoint` on the text file at `text`.
pub fn evaluate(checkpoint: &Path, text: &Path, block: Option<usize>, batch: usize, threads: Option<usize>) -> Result<EvalResult, String> {
    if batch == 0 {
        return Err("--batch must be at least 1".into());
    }
    let ck = checkpoint::load(checkpoint)?;
    let t = context_len(block, ck.config.block_size)?;
    let content = read_text(text, "text file")?;
    let tok = CharTokenizer::new(ck.chars.clone()).map_err(|e| e.to_string())?;
    let ids = tok.encode_to_vec(&content).map_err(|e| format!("text file {}: {e}", text.display()))?;
    let windows = ids.len().saturating_sub(1) / t;
    if windows == 0 {
        return Err(format!("text file {} has {} characters; a window of {t} needs at least {}", text.display(), ids.len(), t + 1));
    }
    let b = batch.min(windows);
    let plan = Plan::new(ck.config, b, t).map_err(|e| e.to_string())?;
    let mut mem = OwnedMemory::<f32>::new(&plan);
    let pool = crate::thread_pool(threads)?;
    let losses_span = plan.head_acts().losses;
    let mut total = 0.0f64;
    for first in (0..windows).step_by(b) {
        let real = b.min(windows - first);
        let (x, y) = mem.batch.split_at_mut(plan.tokens());
        for r in 0..b {
            // Rows past the last window repeat it; their losses are not counted.
            let w = first + r.min(real - 1);
            x[r * t..(r + 1) * t].copy_from_slice(&ids[w * t..(w + 1) * t]);
            y[r * t..(r + 1) * t].copy_from_slice(&ids[w * t + 1..(w + 1) * t + 1]);
        }
        let (x, y) = mem.batch.split_at(plan.tokens());
        tape::forward(&pool, &plan, &mem.tape, &ck.params, &mut mem.acts, x, Some(y), None);
        total += mem.acts[losses_span.range()][..real * t].iter().map(|&l| l as f64).sum::<f64>();
    }
    Ok(EvalResult { loss: total / (windows * t) as f64, windows, tokens: windows * t })
}

/// Runs `eval` and prints `{"loss": L, "windows": n, "tokens": n*T}`.
pub fn run(args: &EvalArgs) -> Result<(), String> {
    let r = evaluate(&args.checkpoint, &args.text, args.block, args.batch, args.threads)?;
    println!("{}", serde_json::json!({"loss": r.loss, "windows": r.windows, "tokens": r.tokens}));
    Ok(())
}
