//! `alpha-native eval`: the mean cross-entropy of a checkpoint on a text, over every
//! non-overlapping window (window `i`: inputs `ids[i*T..(i+1)*T]`, targets shifted by one).

use crate::checkpoint;
use crate::cmd::sample::context_len;
use crate::corpus::read_text;
use crate::device::{Backend, DeviceArgs};
use alpha_core::cpu::{Batch, CpuExecutor};
use alpha_core::data::Tokens;
use alpha_core::gemm::Operands;
use alpha_core::parallel::ThreadPool;
use alpha_core::train::OwnedMemory;
use alpha_core::{walk, Plan};
use alpha_gpu::{block_on, GpuForward};
use anyhow::{anyhow, Result};
use clap::Args;
use std::borrow::Cow;
use std::path::PathBuf;

/// Flags of `alpha-native eval`.
#[derive(Args, Debug, Clone)]
pub struct EvalArgs {
    /// The model: an Alpha checkpoint, a Hugging Face GPT-2 directory, or a cached model name.
    #[arg(long, value_name = "FILE|DIR|NAME")]
    pub checkpoint: PathBuf,
    /// UTF-8 text to measure the model on.
    #[arg(long, value_name = "FILE", required_unless_present = "dataset", conflicts_with = "dataset")]
    pub text: Option<PathBuf>,
    /// A prepared dataset (as `train --dataset` takes it): the model is measured on its
    /// validation split.
    #[arg(long, value_name = "DIR|PATTERN")]
    pub dataset: Option<String>,
    /// Window length T. Default: the checkpoint's block size.
    #[arg(long)]
    pub block: Option<usize>,
    /// Windows evaluated at once (memory/speed only; the result does not depend on it).
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Where to run.
    #[command(flatten)]
    pub device: DeviceArgs,
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
    /// Bits per byte: the loss in bits over the UTF-8 bytes of the predicted tokens, which
    /// compares models with different tokenizers.
    pub bpb: f64,
}

/// Evaluates `checkpoint` on the text file at `text`.
pub fn evaluate(args: &EvalArgs) -> Result<EvalResult> {
    let EvalArgs { checkpoint, block, batch, device, .. } = args;
    let batch = *batch;
    device.check()?;
    if batch == 0 {
        return Err(anyhow!("--batch must be at least 1"));
    }
    let ck = checkpoint::load_weights(checkpoint)?;
    let t = context_len(*block, ck.config.block_size)?;
    let tok = &ck.tokenizer;
    let pool = device.pool()?;
    let (ids, dataset, what);
    let segments;
    let tokens: Tokens<'_> = match (&args.text, &args.dataset) {
        (Some(text), _) => {
            let content = read_text(text, "text file")?;
            // As `tokenizers` encodes a text: with the special tokens its post-processor adds.
            let (before, after) = tok.special_tokens_around();
            let body = tok.encode_with(&pool, &content).map_err(|e| anyhow!("text file {}: {e}", text.display()))?;
            if !(before.is_empty() && after.is_empty()) {
                eprintln!(
                    "note: the text is encoded with the tokenizer's special tokens ({} before, {} after), as tokenizers encodes it",
                    before.len(),
                    after.len()
                );
            }
            ids = [before, &body, after].concat();
            what = format!("text file {}", text.display());
            Tokens::Ids(&ids)
        }
        (None, Some(spec)) => {
            dataset = crate::dataset::open(spec, Some(tok.clone()), &pool)?;
            segments = dataset.val.segments();
            what = format!("dataset {spec}'s val split");
            Tokens::Stream(&segments)
        }
        (None, None) => return Err(anyhow!("give --text or --dataset")),
    };
    let windows = tokens.len().saturating_sub(1) / t;
    if windows == 0 {
        return Err(anyhow!("{what} has {} tokens; a window of {t} needs at least {}", tokens.len(), t + 1));
    }
    let b = batch.min(windows);
    let plan = Plan::new(ck.config, b, t).and_then(|p| p.with_classes(tok.vocab_size()))?;
    crate::memory::check(&plan, device.backend)?;
    let mut model = Forward::new(device, plan, ck.params)?;
    let (mut x, mut y) = (vec![0; plan.tokens()], vec![0; plan.tokens()]);
    let (mut total, mut predicted_bytes) = (0.0f64, 0usize);
    for first in (0..windows).step_by(b) {
        let real = b.min(windows - first);
        for r in 0..b {
            // Rows past the last window repeat it; their losses are not counted.
            let w = first + r.min(real - 1);
            tokens.read(w * t, &mut x[r * t..(r + 1) * t]);
            tokens.read(w * t + 1, &mut y[r * t..(r + 1) * t]);
        }
        predicted_bytes += y[..real * t].iter().map(|&id| tok.token_bytes(id).len()).sum::<usize>();
        total += model.losses(&x, &y)?[..real * t].iter().map(|&l| l as f64).sum::<f64>();
    }
    Ok(EvalResult { loss: total / (windows * t) as f64, windows, tokens: windows * t, bpb: total / std::f64::consts::LN_2 / predicted_bytes as f64 })
}

/// A model that runs forward only, on the CPU or a GPU (one per evaluation).
#[allow(clippy::large_enum_variant)]
enum Forward {
    Cpu {
        pool: ThreadPool,
        plan: Plan,
        mem: OwnedMemory<f32>,
        params: Vec<f32>,
        /// The products' operands (`--precision`): the linear layers' and attention's.
        operands: Operands,
    },
    Gpu(GpuForward),
    #[cfg(feature = "cuda")]
    Cuda(alpha_cuda::CudaEngine<'static>),
}

impl Forward {
    fn new(device: &DeviceArgs, plan: Plan, params: Vec<f32>) -> Result<Forward> {
        Ok(match device.backend {
            Backend::Cpu => Forward::Cpu { pool: device.pool()?, plan, mem: OwnedMemory::new(&plan)?, params, operands: device.cpu_operands()?.0 },
            Backend::Gpu => Forward::Gpu(block_on(GpuForward::new(device.open_gpu()?, plan, &params))?),
            Backend::Cuda => Forward::cuda(device, plan, params)?,
            Backend::Auto => unreachable!("the command line resolves --backend auto"),
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda(device: &DeviceArgs, plan: Plan, params: Vec<f32>) -> Result<Forward> {
        Ok(Forward::Cuda(crate::engine::cuda_model(device, plan, params)?))
    }

    #[cfg(not(feature = "cuda"))]
    fn cuda(device: &DeviceArgs, _plan: Plan, _params: Vec<f32>) -> Result<Forward> {
        match device.open_cuda_local(0)? {}
    }

    /// The loss at every position of `x` predicting `y`.
    fn losses(&mut self, x: &[u32], y: &[u32]) -> Result<Cow<'_, [f32]>> {
        match self {
            Forward::Cpu { pool, plan, mem, params, operands } => {
                let batch = Batch { tokens: x, targets: Some(y) };
                walk::forward(&mut CpuExecutor::new(pool, plan, params, &mut mem.acts, batch).with_operands(*operands), &mem.tape, None);
                Ok(Cow::Borrowed(&mem.acts[plan.head_acts().losses.range()]))
            }
            Forward::Gpu(m) => Ok(block_on(m.losses(x, y)).map(Cow::Owned)?),
            #[cfg(feature = "cuda")]
            Forward::Cuda(m) => Ok(m.losses(x, y).map(Cow::Owned)?),
        }
    }
}

/// Runs `eval` and prints `{"loss": L, "windows": n, "tokens": n*T, "bpb": B}`.
pub fn run(args: &EvalArgs) -> Result<()> {
    let r = evaluate(args)?;
    println!("{}", serde_json::json!({"loss": r.loss, "windows": r.windows, "tokens": r.tokens, "bpb": r.bpb}));
    Ok(())
}
