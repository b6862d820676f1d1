//! `alpha-native train`: nanoGPT's training loop on the CPU or a GPU, with evaluation,
//! samples, atomic checkpoints, exact resume, JSON Lines metrics and a progress bar.

use crate::checkpoint::{self, SaveError, TrainState};
use crate::corpus;
use crate::dataset::{self, Dataset};
use crate::device::DeviceArgs;
use crate::engine::Placement;
use crate::fsutil::{check_outputs_distinct, check_replaceable, remove_stale_temps, same_file, temp_path, write_atomic, RunLock};
use crate::interrupt::Interrupt;
use crate::ranks::{fingerprint, fingerprint_text, fingerprint_tokens, Group};
use crate::runfile::{self, RUN_FILE};
use crate::step::{Phases, StepClock};
use crate::trace::Trace;
use alpha_core::data::Tokens;
use alpha_core::engine::{Driver, Engine, Event, Splits, StepError};
use alpha_core::parallel::Parallel;
use alpha_core::rng::{derive_seed, stream};
use alpha_core::settings::{RunSettings, SavePolicy, DEFAULT};
use alpha_core::tokenizer::{CharTokenizer, Tokenizer};
use alpha_core::train::{Ranks, RunState};
use alpha_core::{data, GptConfig, Plan, Rng};
use alpha_gpu::block_on;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Args;
use indicatif::{HumanDuration, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Flags of `alpha-native train` (nanoGPT's names; defaults are its Shakespeare-char CPU run).
#[derive(Args, Debug, Clone)]
pub struct TrainArgs {
    /// Model shape and data.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Directory for the checkpoint (DIR/ckpt.safetensors), locked while the run lasts.
    /// Default: `out`, or the directory of the checkpoint given to --resume.
    #[arg(long, value_name = "DIR", default_value = "out")]
    pub out: PathBuf,
    /// Optimizer steps of the whole run, at least 1 (the learning rate reaches --min-lr at
    /// --lr-decay-iters). A resumed run continues its step count up to this.
    #[arg(long, default_value_t = DEFAULT.iters)]
    pub iters: u64,
    /// Peak learning rate (positive).
    #[arg(long, default_value_t = DEFAULT.lr)]
    pub lr: f64,
    /// Step at which the cosine decay reaches --min-lr. Default: --iters.
    #[arg(long)]
    pub lr_decay_iters: Option<u64>,
    /// Final learning rate of the cosine decay (0 or more).
    #[arg(long, default_value_t = DEFAULT.min_lr)]
    pub min_lr: f64,
    /// Linear warmup steps (0 or more).
    #[arg(long, default_value_t = DEFAULT.warmup)]
    pub warmup: u64,
    /// AdamW decoupled weight decay (2-D weights only; 0 or more).
    #[arg(long, default_value_t = DEFAULT.weight_decay)]
    pub weight_decay: f64,
    /// AdamW beta1 (above 0, below 1).
    #[arg(long, default_value_t = DEFAULT.beta1)]
    pub beta1: f64,
    /// AdamW beta2 (above 0, below 1).
    #[arg(long, default_value_t = DEFAULT.beta2)]
    pub beta2: f64,
    /// Clip the global gradient norm to this (0 or more; 0 disables).
    #[arg(long, default_value_t = DEFAULT.grad_clip)]
    pub grad_clip: f64,
    /// Micro-batches accumulated per optimizer step (1 to 65536).
    #[arg(long, default_value_t = DEFAULT.grad_accum)]
    pub grad_accum: usize,
    /// Seed for initialisation, batches, evaluation and samples.
    #[arg(long, default_value_t = DEFAULT.seed)]
    pub seed: u64,
    /// Evaluate train and val loss every N steps and at the end (0 disables).
    #[arg(long, default_value_t = DEFAULT.eval_interval)]
    pub eval_interval: u64,
    /// Batches per split and evaluation (1 to 1000000).
    #[arg(long, default_value_t = DEFAULT.eval_iters)]
    pub eval_iters: usize,
    /// Print a sample every N steps and at the end (0 disables).
    #[arg(long, default_value_t = DEFAULT.sample_interval)]
    pub sample_interval: u64,
    /// Save a checkpoint every N steps (0: only at the end and on Ctrl-C).
    #[arg(long, default_value_t = DEFAULT.checkpoint_interval)]
    pub checkpoint_interval: u64,
    /// Log a metrics record (and a plain line when not on a terminal) every N steps (at least 1).
    #[arg(long, default_value_t = DEFAULT.log_interval)]
    pub log_interval: u64,
    /// Where to train.
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Continue the run saved in this checkpoint (model and settings come from it; flags
    /// given explicitly override the settings).
    #[arg(long, value_name = "FILE")]
    pub resume: Option<PathBuf>,
    /// Start from these weights with a fresh optimizer (nanoGPT's init_from, for fine-tuning):
    /// a Hugging Face GPT-2 directory, a model in the local Hugging Face cache by name (gpt2,
    /// gpt2-medium, gpt2-large, gpt2-xl, org/name), or an Alpha checkpoint. Its model shape and
    /// tokenizer win over the size flags and --tokenizer; --block may shrink the context.
    #[arg(long, value_name = "DIR|NAME|FILE", conflicts_with = "resume")]
    pub init_from: Option<PathBuf>,
    /// Write JSON Lines metrics to this file: a new run refuses an existing file (unless
    /// --overwrite, which starts it anew); a resumed run appends to it.
    #[arg(long, value_name = "FILE")]
    pub metrics: Option<PathBuf>,
    /// Replace an existing DIR/ckpt.safetensors that does not belong to this run, an existing
    /// --trace file, and an existing --metrics file of a new run.
    #[arg(long)]
    pub overwrite: bool,
    /// Which checkpoints the run writes: `always` (every --checkpoint-interval steps, at the end
    /// and on Ctrl-C), or `best` (only after an evaluation whose val loss is the lowest so far:
    /// nanoGPT's always_save_checkpoint=False, for fine-tuning).
    #[arg(long, default_value = "always", value_parser = PossibleValuesParser::new(["always", "best"]).map(|s| if s == "best" { SavePolicy::Best } else { SavePolicy::Always }))]
    pub save: SavePolicy,
    /// Checkpoints kept: DIR/ckpt.safetensors is the newest; with N above 1 the last N saves
    /// are also kept as DIR/ckpt-STEP.safetensors (1 to 1000).
    #[arg(long, default_value_t = DEFAULT.keep)]
    pub keep: usize,
    /// Write checkpoints in the background: the run pauses only to copy its state (one
    /// snapshot of the parameters and AdamW moments in memory while it is written).
    #[arg(long)]
    pub async_checkpoint: bool,
    /// Serve the run's live dashboard over HTTP while it trains (the report's charts,
    /// updated as records come; read-only): at ADDR, or 127.0.0.1:6006 without one. An
    /// address beyond this machine (0.0.0.0, a LAN address) is warned about: anyone who can
    /// reach it sees the run.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = crate::serve::DEFAULT_ADDR)]
    pub serve: Option<String>,
    /// The device's peak GFLOP/s for the MFU the metrics record (positive). Default: measured
    /// once and cached, as `bench` (the CPU's GEMM peak; a GPU's f32 FMA limit).
    #[arg(long)]
    pub peak_gflops: Option<f64>,
    /// ZeRO stage for data-parallel runs (`mpirun -np N`, a build with `--features mpi`):
    /// 1 shards the AdamW moments over the ranks (each holds and updates 1/N of them and the
    /// parameters are all-gathered); 0 keeps them whole on every rank. Checkpoints are the
    /// same either way: a run resumes with any rank count
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub zero: u8,
    /// Write a Chrome trace (open in Perfetto) of the first --trace-steps steps to FILE.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Steps recorded by --trace (1 to 1000).
    #[arg(long, default_value_t = 5)]
    pub trace_steps: u64,
    /// Run file (TOML whose keys are these flags, `_` for `-`) or preset (tiny, small,
    /// shakespeare_char, baby): its keys set the flags, and flags given here override them. Every
    /// run writes its resolved configuration to DIR/run.toml, which repeats it.
    #[arg(long, value_name = "FILE|PRESET")]
    pub config: Option<PathBuf>,
}

impl TrainArgs {
    /// The run the flags describe, as a fresh run would take it: every field of
    /// [`RunSettings`] from its one flag (the model's shape from `--model` where given).
    pub fn settings(&self) -> RunSettings {
        let m = &self.model;
        let config = m.config(0);
        RunSettings {
            data: m.data_name(),
            dataset: m.dataset.is_some(),
            batch: m.batch,
            iters: self.iters,
            lr: self.lr,
            lr_decay_iters: self.lr_decay_iters.unwrap_or(self.iters),
            min_lr: self.min_lr,
            warmup: self.warmup,
            weight_decay: self.weight_decay,
            beta1: self.beta1,
            beta2: self.beta2,
            grad_clip: self.grad_clip,
            grad_accum: self.grad_accum,
            seed: self.seed,
            dropout: m.dropout,
            recompute: m.recompute,
            eval_interval: self.eval_interval,
            eval_iters: self.eval_iters,
            sample_interval: self.sample_interval,
            checkpoint_interval: self.checkpoint_interval,
            log_interval: self.log_interval,
            save: self.save,
            keep: self.keep,
            async_checkpoint: self.async_checkpoint,
            ..RunSettings::default().with_model(config)
        }
    }
}

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
    pub fn sample_tokens(&self, par: &dyn Parallel) -> Result<(Tokenizer, Vec<u32>), String> {
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
                GptConfig { vocab_size: GPT2_VOCAB, block_size: self.block(), n_layer, n_head, n_embd }
            }
            None => GptConfig { vocab_size, block_size: self.block(), n_layer: self.layers, n_head: self.heads, n_embd: self.embd },
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
    pub fn plan(&self, config: GptConfig, classes: usize, batch: usize) -> Result<Plan, String> {
        let plan = Plan::new(config, batch, config.block_size)
            .and_then(|p| p.with_recompute(self.recompute).with_dropout(self.dropout, DEFAULT.seed))
            .and_then(|p| p.with_classes(classes));
        plan.map_err(|e| e.to_string())
    }
}

/// The text named by `--data` as token ids, with `tokenizer` (`None`: the text's characters),
/// encoded on `par`'s threads.
pub fn load_corpus(data: &str, tokenizer: Option<Tokenizer>, par: &dyn Parallel) -> Result<(Tokenizer, Vec<u32>), String> {
    let text = corpus::training_text(data)?;
    let name = corpus::label(data);
    let tok = match tokenizer {
        Some(t) => t,
        None => CharTokenizer::from_text(&text).map_err(|e| format!("{name}: {e}"))?.into(),
    };
    let ids = crate::tokenizer::encode_with_progress(&tok, par, &text).map_err(|e| format!("{name}: {e}"))?;
    Ok((tok, ids))
}

/// Tokens of a dataset's train split that `bench` and `info` read.
pub const DATASET_SAMPLE: usize = 1 << 24;

/// What a run trains on: a text's ids in memory, or a prepared dataset's memory maps.
enum TrainData {
    Text(Vec<u32>),
    Dataset(Dataset),
}

/// Name of the checkpoint inside `--out`.
pub const CHECKPOINT_FILE: &str = "ckpt.safetensors";

/// Where the run's progress goes: a bar on stderr when stdout and stderr are both terminals,
/// with other lines printed above it; plain lines on stdout otherwise (CI, `| tee`).
struct Console {
    bar: ProgressBar,
    /// Whether it prints at all (only rank 0 of a data-parallel run does).
    shown: bool,
}

impl Console {
    fn new(iters: u64, position: u64, shown: bool) -> Console {
        let on_terminal = shown && std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
        let target = if on_terminal { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
        let bar = ProgressBar::with_draw_target(Some(iters), target);
        // Only the message is as wide as the terminal leaves room for, cut to fit, so the line
        // never wraps: the step, ETA, loss and speed go into it.
        bar.set_style(ProgressStyle::with_template("{bar:20.cyan/blue} {wide_msg}").expect("static template").progress_chars("##-"));
        bar.set_position(position);
        Console { bar, shown }
    }

    fn line(&self, msg: &str) {
        if self.plain() {
            println!("{msg}");
        } else if self.shown {
            self.bar.println(msg);
        }
    }

    /// Whether it prints plain lines (no bar).
    fn plain(&self) -> bool {
        self.shown && self.bar.is_hidden()
    }

    /// Moves the bar to step `done` of `iters` with the latest loss and speed.
    fn progress(&self, done: u64, iters: u64, stats: Option<(f64, f64)>) {
        self.bar.set_position(done);
        if let Some((loss, tok_s)) = stats {
            self.bar.set_message(format!("{done}/{iters} loss {loss:.4} | {:.1}k tok/s | eta {}", tok_s / 1e3, HumanDuration(self.bar.eta())));
        }
    }
}

/// Resolved run: model, settings and where it starts.
struct Run {
    config: GptConfig,
    settings: RunSettings,
    resume: Option<checkpoint::Checkpoint>,
    /// `--init-from`'s weights, cropped to the run's context.
    init: Option<checkpoint::Checkpoint>,
    /// The resumed run's settings the flags changed (`--lr 0.1 (was 0.001)`).
    changed: Vec<String>,
}

fn resolve(args: &TrainArgs, explicit: &dyn Fn(&str) -> bool) -> Result<Run, String> {
    let fresh_settings = args.settings();
    if let Some(from) = &args.init_from {
        if args.model.tokenizer.is_some() {
            return Err(format!("--tokenizer: --init-from {} brings its own tokenizer", from.display()));
        }
        let mut ck = checkpoint::load_weights(from)?;
        keeps_model_shape(args, explicit, &ck.config, &format!("--init-from {} brings its own model", from.display()))?;
        let block = args.model.block.unwrap_or(ck.config.block_size);
        if block > ck.config.block_size {
            return Err(format!("--block {block} is larger than {}'s context of {} tokens", from.display(), ck.config.block_size));
        }
        let to = GptConfig { block_size: block, vocab_size: args.model.padded_vocab(ck.config.vocab_size), ..ck.config };
        ck.params = resize_tables(&ck.params, ck.config, to)?;
        ck.config = to;
        return Ok(Run { config: ck.config, settings: fresh_settings.with_model(ck.config), resume: None, init: Some(ck), changed: Vec::new() });
    }
    let Some(path) = &args.resume else {
        let config = args.model.config(0);
        return Ok(Run { config, settings: fresh_settings.with_model(config), resume: None, init: None, changed: Vec::new() });
    };
    let ck = checkpoint::load(path)?;
    if args.model.tokenizer.is_some() {
        return Err("--tokenizer: a resumed run keeps its checkpoint's tokenizer".into());
    }
    if explicit("vocab_pad") {
        return Err("--vocab-pad: a resumed run keeps its checkpoint's model".into());
    }
    let Some((_, _, state)) = &ck.optimizer else {
        return Err(format!("checkpoint {} has no training state (no optimizer moments) and cannot be resumed", path.display()));
    };
    let c = ck.config;
    if explicit("block") && args.model.block() != c.block_size {
        let (given, stored) = (args.model.block(), c.block_size);
        let rel = if given > stored { "is larger than" } else { "differs from" };
        return Err(format!("--block {given} {rel} the checkpoint's block size {stored}; a resumed run keeps the checkpoint's model"));
    }
    keeps_model_shape(args, explicit, &c, "a resumed run keeps the checkpoint's model")?;
    // The run's own settings come from the checkpoint; a flag given overrides one, and the
    // run says which it changed.
    let mut s = state.settings.clone();
    let mut changed = Vec::new();
    macro_rules! take {
        ($($field:ident),*) => {$(
            if explicit(stringify!($field)) && s.$field != fresh_settings.$field {
                changed.push(format!("--{} {} (was {})", stringify!($field).replace('_', "-"), fresh_settings.$field, s.$field));
                s.$field = fresh_settings.$field.clone();
            }
        )*};
    }
    take!(
        data,
        batch,
        iters,
        lr,
        lr_decay_iters,
        min_lr,
        warmup,
        weight_decay,
        beta1,
        beta2,
        grad_clip,
        grad_accum,
        seed,
        dropout,
        recompute,
        eval_interval,
        eval_iters,
        sample_interval,
        checkpoint_interval,
        log_interval,
        save,
        keep,
        async_checkpoint
    );
    Ok(Run { config: c, settings: s, resume: Some(ck), init: None, changed })
}

/// An error where a size flag given (`--layers`, `--heads`, `--embd`, `--model`) differs from
/// the model of a checkpoint the run starts from, `config`; `why` says what decides instead.
/// Flags that repeat the checkpoint's sizes (a run file of the same run) are fine.
fn keeps_model_shape(args: &TrainArgs, explicit: &dyn Fn(&str) -> bool, config: &GptConfig, why: &str) -> Result<(), String> {
    let shape = (config.n_layer, config.n_head, config.n_embd);
    if let Some(model) = args.model.model.filter(|m| m.shape() != shape) {
        let (layers, heads, embd) = model.shape();
        return Err(format!(
            "--model is {layers} layers, {heads} heads, {embd} wide, not the checkpoint's {} layers, {} heads, {} wide; {why}",
            shape.0, shape.1, shape.2
        ));
    }
    for (flag, given, stored, name) in [
        ("layers", args.model.layers, config.n_layer, "number of layers"),
        ("heads", args.model.heads, config.n_head, "number of heads"),
        ("embd", args.model.embd, config.n_embd, "embedding width"),
    ] {
        if explicit(flag) && given != stored {
            return Err(format!("--{flag} {given} differs from the checkpoint's {name} {stored}; {why}"));
        }
    }
    Ok(())
}

/// A copy of the parameters and both AdamW moments (`--async-checkpoint`).
type Snapshot = [Vec<f32>; 3];

/// Where and how a run's checkpoints are written (owned, so that a background thread can).
struct SaveTarget {
    path: PathBuf,
    config: GptConfig,
    keep: usize,
    /// What the run keeps if this save is refused (for the message).
    kept: String,
    /// Told what is kept once the checkpoint is written.
    interrupt: Interrupt,
}

impl SaveTarget {
    /// Writes a checkpoint of `state` and the arenas; a model that is not finite is refused.
    fn write(&self, tokenizer: &Tokenizer, params: &[f32], m: &[f32], v: &[f32], state: &TrainState) -> Result<(), String> {
        let step = state.step;
        checkpoint::save(&self.path, self.config, tokenizer, params, Some((m, v, state))).map_err(|e| match e {
            SaveError::NonFinite { .. } => format!("not saving step {step}: {e}; {}. Try a lower --lr or a smaller --grad-clip", self.kept),
            other => other.to_string(),
        })?;
        self.interrupt.set_kept(format!("the last good checkpoint ({}, step {step}) is kept", self.path.display()));
        keep_last(&self.path, step, self.keep)
    }
}

/// With `keep` above 1, keeps the checkpoint just saved at `path` (step `step`) as
/// `ckpt-STEP.safetensors` beside it too (a hard link where the file system has them) and
/// removes such files beyond the newest `keep`.
fn keep_last(path: &Path, step: u64, keep: usize) -> Result<(), String> {
    if keep <= 1 {
        return Ok(());
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let stamped = dir.join(format!("ckpt-{step:08}.safetensors"));
    let _ = std::fs::remove_file(&stamped);
    std::fs::hard_link(path, &stamped).or_else(|_| std::fs::copy(path, &stamped).map(|_| ())).map_err(|e| format!("cannot keep {}: {e}", stamped.display()))?;
    let mut kept: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("ckpt-") && n.ends_with(".safetensors") && n[5..n.len() - 12].bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    kept.sort();
    for old in &kept[..kept.len().saturating_sub(keep)] {
        std::fs::remove_file(old).map_err(|e| format!("cannot remove {}: {e}", old.display()))?;
    }
    Ok(())
}

/// `params` of a model of `from` as a model of `to`, which differs in its tables' rows: the
/// position table cut to a shorter context (nanoGPT's `crop_block_size`), the token table
/// padded with zero rows (`--vocab-pad`); every other tensor as it is.
fn resize_tables(params: &[f32], from: GptConfig, to: GptConfig) -> Result<Vec<f32>, String> {
    let (from, to) = (Plan::new(from, 1, 1).map_err(|e| e.to_string())?, Plan::new(to, 1, 1).map_err(|e| e.to_string())?);
    let mut out = vec![0f32; to.params_len()];
    for (a, b) in from.params().zip(to.params()) {
        let kept = a.span.len.min(b.span.len);
        out[b.span.offset..b.span.offset + kept].copy_from_slice(&params[a.span.offset..a.span.offset + kept]);
    }
    Ok(out)
}

/// What rank 0 writes to while the run lasts (the other ranks have none of it).
#[derive(Default)]
struct Outputs {
    trace: Option<Trace>,
    /// The output directory's lock, held until the run ends.
    lock: Option<RunLock>,
    metrics: Option<File>,
}

/// The run's files: what it reads and what it writes.
struct Files<'a> {
    data: Option<&'a Path>,
    resume: Option<&'a Path>,
    /// The run file given to --config (not a preset).
    config: Option<&'a Path>,
    out: PathBuf,
    checkpoint: PathBuf,
    /// The resolved configuration beside the checkpoint.
    run_file: PathBuf,
}

impl Files<'_> {
    /// Refuses outputs that would replace what the run reads or another of its outputs, an
    /// existing trace without --overwrite, and outputs that are not regular files where they
    /// would be replaced. Nothing is written yet.
    fn check(&self, args: &TrainArgs) -> Result<(), String> {
        if self.out.exists() && !self.out.is_dir() {
            return Err(format!("--out {} exists and is not a directory", self.out.display()));
        }
        for output in [&self.checkpoint, &self.run_file] {
            check_replaceable(output).map_err(|e| format!("{}: {e}", output.display()))?;
        }
        if let Some(data) = self.data.filter(|d| same_file(d, &self.checkpoint)) {
            return Err(format!("the checkpoint {} would replace --data {}; choose another --out", self.checkpoint.display(), data.display()));
        }
        // The checkpoint may replace the one resumed (resuming in place), nothing else.
        let mut taken: Vec<(&str, &Path)> = vec![("the checkpoint", &self.checkpoint)];
        taken.extend(self.data.map(|p| ("--data", p)));
        taken.extend(self.resume.map(|p| ("--resume", p)));
        taken.extend(self.config.map(|p| ("--config", p)));
        if let Some((what, _)) = taken.iter().find(|(_, p)| same_file(p, &self.run_file)) {
            return Err(format!("the run's resolved configuration {} would replace {what}; choose another --out", self.run_file.display()));
        }
        taken.push(("the run file", &self.run_file));
        check_outputs_distinct(taken, &[("--metrics", args.metrics.as_deref()), ("--trace", args.trace.as_deref())])
    }

    /// Checks the outputs ([`Files::check`]), opens the trace, creates the output directory
    /// and locks it, clears stale temporary files, refuses to replace a checkpoint or a run
    /// file that is not this run's, and opens the metrics: rank 0's set-up of the outputs.
    fn prepare(&self, args: &TrainArgs) -> Result<Outputs, String> {
        self.check(args)?;
        let trace = args.trace.as_deref().map(|p| Trace::new(p, args.trace_steps, args.overwrite)).transpose()?;
        std::fs::create_dir_all(&self.out).map_err(|e| format!("cannot create {}: {e}", self.out.display()))?;
        // Held until the run ends; a second run into this directory stops here.
        let lock = RunLock::acquire(&self.out)?;
        for output in [&self.checkpoint, &self.run_file] {
            remove_stale_temps(output).map_err(|e| format!("cannot clean up {}: {e}", self.out.display()))?;
        }
        let resuming_in_place = args.resume.as_ref().is_some_and(|r| same_file(r, &self.checkpoint));
        if self.checkpoint.exists() && !resuming_in_place && !args.overwrite {
            let ckpt = self.checkpoint.display();
            return Err(format!("{ckpt} already exists; resume it with --resume {ckpt}, choose another --out, or pass --overwrite"));
        }
        // The run file beside the checkpoint is replaced when it is one this program wrote.
        let ours = std::fs::read_to_string(&self.run_file).is_ok_and(|t| t.starts_with(RUN_FILE_HEADER));
        if self.run_file.exists() && !ours && !args.overwrite {
            return Err(format!("{} exists and is not a run file alpha-native wrote; choose another --out, or pass --overwrite", self.run_file.display()));
        }
        let metrics = args.metrics.as_deref().map(|p| self.open_metrics(p, args.resume.is_some(), args.overwrite)).transpose()?;
        Ok(Outputs { trace, lock: Some(lock), metrics })
    }

    /// The metrics file: a fresh run starts it (an existing one only with --overwrite), a
    /// resumed run appends to it.
    fn open_metrics(&self, path: &Path, resumed: bool, overwrite: bool) -> Result<File, String> {
        let meta = std::fs::metadata(path).ok();
        if meta.as_ref().is_some_and(|m| m.is_dir()) {
            return Err(format!("--metrics {} is a directory", path.display()));
        }
        let existing_file = meta.as_ref().is_some_and(|m| m.is_file());
        if existing_file && !resumed && !overwrite {
            return Err(format!(
                "--metrics {} already exists; a new run does not append to another run's metrics: choose another file, or pass --overwrite to start it anew",
                path.display()
            ));
        }
        let mut options = OpenOptions::new();
        if existing_file && !resumed {
            options.write(true).truncate(true);
        } else {
            options.create(true).append(true);
        }
        options.open(path).map_err(|e| format!("cannot open metrics file {}: {e}", path.display()))
    }
}

/// Runs `train`. `explicit(flag)` tells whether a flag (clap id, e.g. `"min_lr"`) was given on
/// the command line, which decides what a resumed run takes from its checkpoint.
pub fn run(args: &TrainArgs, explicit: &dyn Fn(&str) -> bool) -> Result<(), String> {
    let group = Group::launched()?;
    if group.ranks() == 1 {
        return run_in(args, explicit, &group);
    }
    // One rank's error stops them all (the others would wait for it forever).
    run_in(args, explicit, &group).unwrap_or_else(|e| group.fail(&e));
    Ok(())
}

/// [`run`] as one rank of `group`: rank 0 writes everything (console, metrics, samples,
/// checkpoints, the run file, the trace); every rank trains its share of each step.
fn run_in(args: &TrainArgs, explicit: &dyn Fn(&str) -> bool, group: &Group) -> Result<(), String> {
    let root = group.is_root();
    let mut run = resolve(args, explicit)?;
    run.settings.validate(|field| format!("--{}", field.replace('_', "-")))?;
    let s = run.settings.clone();
    let data_name = corpus::label(&s.data);
    let pool = args.device.pool()?;
    // A resumed or initialised run keeps its checkpoint's tokenizer.
    let known = match run.resume.as_ref().or(run.init.as_ref()) {
        Some(ck) => Some(ck.tokenizer.clone()),
        None => args.model.tokenizer.as_deref().map(|p| crate::tokenizer::load(p).map(Tokenizer::from)).transpose()?,
    };
    // Checked before any work: a run must be able to write its checkpoints.
    if let Some(tokenizer) = &known {
        checkpoint::check_header_room(run.config, tokenizer).map_err(|e| format!("the run could not save a checkpoint: {e}"))?;
    }
    let (tokenizer, source) = if s.dataset {
        let d = dataset::open(&s.data, known, &pool)?;
        (d.tokenizer.clone(), TrainData::Dataset(d))
    } else {
        let (tokenizer, tokens) = load_corpus(&s.data, known, &pool)?;
        (tokenizer, TrainData::Text(tokens))
    };
    if run.resume.is_none() && run.init.is_none() {
        if args.model.model.is_some() && tokenizer.vocab_size() != GPT2_VOCAB {
            return Err(format!("--model has GPT-2's {GPT2_VOCAB} tokens, but the tokenizer has {}: train it with GPT-2's tokenizer (--tokenizer), or give --layers, --heads and --embd", tokenizer.vocab_size()));
        }
        run.config.vocab_size = args.model.config(tokenizer.vocab_size()).vocab_size;
    }
    let block = run.config.block_size;
    // Checked first: it bounds the block size the message below computes with.
    let plan = s.plan(run.config).and_then(|p| p.with_classes(tokenizer.vocab_size())).map_err(|e| e.to_string())?;
    let (train_segments, val_segments);
    let (train_tokens, val_tokens): (Tokens<'_>, Tokens<'_>) = match &source {
        TrainData::Text(tokens) => {
            let (train, val) = data::split(tokens);
            if val.len() <= block {
                return Err(format!(
                    "{data_name} is too short: {} tokens, but a block of {block} needs at least {} so that the 10% validation split holds {} tokens",
                    tokens.len(),
                    (block + 1) * 10,
                    block + 1
                ));
            }
            (train.into(), val.into())
        }
        TrainData::Dataset(d) => {
            (train_segments, val_segments) = (d.train.segments(), d.val.segments());
            for (name, split) in [("train", &d.train), ("val", &d.val)] {
                if split.len() <= block {
                    return Err(format!("dataset {data_name}: the {name} split has {} tokens; a block of {block} needs at least {}", split.len(), block + 1));
                }
            }
            (Tokens::Stream(&train_segments), Tokens::Stream(&val_segments))
        }
    };
    args.device.check()?;
    if args.trace.is_some() && group.ranks() > 1 && args.device.backend == crate::device::Backend::Gpu {
        return Err("--trace times one process's GPU kernels; GPU ranks split each step in two submissions: trace a run of one process".into());
    }
    crate::memory::check(&plan, args.device.backend)?;

    // A resumed run writes back where its checkpoint lives unless --out says otherwise.
    let out = match &args.resume {
        Some(r) if !explicit("out") => r.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf(),
        _ => args.out.clone(),
    };
    let data_path = (s.data != corpus::EMBEDDED && !s.dataset).then(|| Path::new(&s.data));
    let config_file = args.config.as_deref().filter(|c| c.exists());
    let (checkpoint, run_file) = (out.join(CHECKPOINT_FILE), out.join(RUN_FILE));
    let files = Files { data: data_path, resume: args.resume.as_deref(), config: config_file, checkpoint, run_file, out };
    let ckpt_path = &files.checkpoint;
    // Only rank 0 writes: the others neither check nor touch the outputs.
    let Outputs { mut trace, lock: _lock, metrics } = if root { files.prepare(args)? } else { Outputs::default() };
    let live = match (&args.serve, root) {
        (Some(addr), true) => {
            let records = crate::serve::Records::default();
            let at = crate::serve::start(addr, records.clone())?;
            println!("dashboard: http://{at}/");
            Some(records)
        }
        _ => None,
    };
    let mut metrics = Metrics { file: metrics, live, started: Instant::now() };

    let (resumed_best, resumed_loss_scale) =
        run.resume.as_ref().and_then(|ck| ck.optimizer.as_ref()).map_or((None, None), |(_, _, state)| (state.best_val_loss, state.loss_scale));
    let start = match run.resume.take() {
        Some(ck) => {
            let (m, v, state) = ck.optimizer.expect("resolve() checked the training state");
            let rng = state.rng().map_err(|e| e.to_string())?;
            RunState { params: ck.params, moments: Some((m, v)), step: state.step, rng }
        }
        // Fine-tuning: the weights, a fresh optimizer, the run's batch stream.
        None => match run.init.take() {
            Some(ck) => RunState { params: ck.params, moments: None, step: 0, rng: Rng::new(derive_seed(s.seed, stream::BATCHES, 0)) },
            None => RunState::fresh(&plan, s.seed).map_err(|e| e.to_string())?,
        },
    };
    let start_step = start.step;
    // A resumed run keeps its checkpoint's precision (an f16 run's holds its loss scale)
    // unless --precision says otherwise: f16 where the adapter has it, as `auto` picks.
    let precision_from_checkpoint = resumed_loss_scale.is_some() && !explicit("precision") && args.device.backend == crate::device::Backend::Gpu;
    let device_args = crate::device::DeviceArgs {
        precision: if precision_from_checkpoint { crate::device::PrecisionArg::Auto } else { args.device.precision },
        ..args.device.clone()
    };
    // N ranks of --grad-accum G take the step one process of --grad-accum N*G takes.
    let mut cfg = s.train_config();
    cfg.grad_accum *= group.ranks();
    cfg.validate().map_err(|e| format!("--grad-accum {} on {} ranks: {e}", s.grad_accum, group.ranks()))?;
    let opened = crate::engine::open(&device_args, &pool, plan, cfg, start, Placement { ranks: group, local_rank: group.local_rank(), zero: args.zero == 1 })?;
    let mut engine = opened.engine;
    if let Some(state) = resumed_loss_scale {
        engine.set_loss_scale(state);
    }
    let description = engine.describe();
    let resolved = resolved_run_file(args, &run.config, &s, opened.gpu.as_ref());
    if group.ranks() > 1 {
        let (train_ids, val_ids) = (fingerprint_tokens(train_tokens), fingerprint_tokens(val_tokens));
        let params = fingerprint(&block_on(engine.state())?.0, f32::to_bits);
        group.agree(&[("settings", fingerprint_text(&resolved)), ("training data", train_ids), ("validation data", val_ids), ("starting weights", params)])?;
    }
    if root {
        write_atomic(&files.run_file, resolved.as_bytes()).map_err(|e| format!("cannot write {}: {e}", files.run_file.display()))?;
    }

    // Ctrl-C and SIGTERM (on every rank under mpirun): the run stops at the end of its step and
    // saves; a second signal stops it at once, the checkpoint on disk a whole one.
    let first = "stopping: the run saves at the end of this step (a second Ctrl-C or SIGTERM stops it at once)";
    let interrupt = Interrupt::install(root.then(|| first.to_string()))?;
    if root {
        for file in [ckpt_path, &files.run_file] {
            interrupt.remove_on_stop(temp_path(file).expect("the outputs have file names"));
        }
    }

    let console = Console::new(s.iters, start_step, root);
    let params_count = plan.num_params();
    let what = match (&args.init_from, start_step) {
        (_, 1..) => format!("resuming at step {start_step}"),
        (Some(from), _) => format!("fine-tuning {}", from.display()),
        (None, _) => "training from scratch".into(),
    };
    console.line(&format!(
        "{what}: {params_count} parameters ({:.2}M), vocab {}, {} layers, {} heads, {} embd, block {block}, batch {}x{}, on {}, data {}",
        params_count as f64 / 1e6,
        run.config.vocab_size,
        run.config.n_layer,
        run.config.n_head,
        run.config.n_embd,
        s.batch,
        s.grad_accum,
        match group.ranks() {
            1 => description.summary.clone(),
            n => format!("{n} MPI ranks of {} each", description.summary),
        },
        s.data
    ));
    if !run.changed.is_empty() {
        console.line(&format!("the flags change the checkpoint's settings: {}", run.changed.join(", ")));
    }
    if let Some(gpu) = &opened.gpu {
        console.line(&device_args.precision_line(gpu, precision_from_checkpoint));
    }
    let device = crate::engine::device_json(&description);
    // MFU and HFU over each logged window, against the peak of every rank's device together.
    let peak = if root { Some(crate::engine::peak(opened.gpu.as_ref(), &pool, args.peak_gflops)?) } else { None };
    let (model_flops, hardware_flops) = (plan.flops_per_token(), plan.flops_per_token() + plan.recomputed_flops_per_token());
    let utilisation = |tok_s: f64, flops: f64| peak.as_ref().map(|p| flops * tok_s / 1e9 / (p.gflops * group.ranks() as f64));
    metrics.write(json!({"type": "start", "step": start_step, "params": params_count,
        "config": run.config, "settings": s, "device": device, "ranks": group.ranks(),
        "backend": description.backend,
        "precision": description.precision, "machine": crate::peak::machine_json(&pool), "recompute": plan.recompute(),
        "memory_mib": crate::memory::plan_json(&plan), "flops_per_token": model_flops, "hardware_flops_per_token": hardware_flops,
        "peak_gflops": peak.as_ref().map(|p| p.gflops), "peak_source": peak.as_ref().map(|p| p.source)}))?;

    // What is on disk when the run stops early: the last checkpoint it saved, or the one it
    // resumed from.
    let kept = |last_saved: Option<u64>| match last_saved.or(args.resume.as_ref().map(|_| start_step)) {
        Some(at) if ckpt_path.exists() => format!("the last good checkpoint ({}, step {at}) is kept", ckpt_path.display()),
        _ => "no checkpoint was written".into(),
    };
    interrupt.set_kept(kept(None));
    let diverged = |e: StepError, last_saved: Option<u64>| match e {
        StepError::Diverged(msg) => format!("training diverged at {msg}; {}. Try a lower --lr or a smaller --grad-clip", kept(last_saved)),
        StepError::Device(msg) => msg,
    };
    // With --async-checkpoint: the snapshot of the arenas, allocated and written once here
    // (its page faults cost the start, not a save's pause), and the checkpoint a background
    // thread is writing from it, joined (handing the snapshot back) before the next save and
    // at the end of the run, where its error (if any) stops the run.
    let buffer = || alpha_core::plan::try_vec("the checkpoint snapshot", plan.params_len(), f32::NAN).map_err(|e| format!("--async-checkpoint: {e}"));
    let snapshot: RefCell<Option<Snapshot>> = RefCell::new(if s.async_checkpoint && root { Some([buffer()?, buffer()?, buffer()?]) } else { None });
    let pending: RefCell<Option<std::thread::JoinHandle<Result<Snapshot, String>>>> = RefCell::new(None);
    let finish_pending = || -> Result<(), String> {
        if let Some(writer) = pending.borrow_mut().take() {
            *snapshot.borrow_mut() = Some(writer.join().unwrap_or_else(|_| Err("the checkpoint writer panicked".into()))?);
        }
        Ok(())
    };
    // Confirms every step was applied, then saves (or, with --async-checkpoint, copies the
    // state and saves in the background); a model that is not finite is never saved.
    let save = |engine: &mut dyn Engine, last_saved: Option<u64>, best_val_loss: Option<f64>| -> Result<(), String> {
        block_on(engine.check()).map_err(|e| diverged(e, last_saved))?;
        // Every rank takes part (ZeRO-1's moments are collected on rank 0); rank 0 writes.
        let (params, m, v) = block_on(engine.state())?;
        if !root {
            return Ok(());
        }
        let step = engine.step_count();
        let loss_scale = block_on(engine.loss_scale())?;
        let state = TrainState { step, rng_state: engine.rng().state().to_string(), settings: s.clone(), best_val_loss, loss_scale };
        finish_pending()?;
        let target = SaveTarget { path: ckpt_path.to_path_buf(), config: run.config, keep: s.keep, kept: kept(last_saved), interrupt: interrupt.clone() };
        if !s.async_checkpoint {
            return target.write(&tokenizer, &params, &m, &v, &state);
        }
        let mut copy = snapshot.borrow_mut().take().expect("the writer handed the snapshot back");
        for (dst, src) in copy.iter_mut().zip([&params, &m, &v]) {
            dst.copy_from_slice(src);
        }
        let tokenizer = tokenizer.clone();
        *pending.borrow_mut() = Some(std::thread::spawn(move || {
            target.write(&tokenizer, &copy[0], &copy[1], &copy[2], &state)?;
            Ok(copy)
        }));
        Ok(())
    };
    let best_mode = s.save == SavePolicy::Best;
    let mut best_val_loss = resumed_best.filter(|_| best_mode);
    let tokens_per_step = (plan.tokens() * cfg.grad_accum) as f64;
    let mut window = Phases::default();
    let mut window_steps = 0u64;
    let mut window_start = Instant::now();
    let mut last_saved: Option<u64> = None;
    let mut driver = Driver::new(s.cadence(), start_step, s.seed, s.eval_iters);
    if !root {
        // Rank 0 samples; sampling leaves the training state as it was.
        driver = driver.without_samples();
    }
    let splits = Splits { train: train_tokens, val: val_tokens };
    let result = loop {
        let t = Instant::now();
        let mut clock = StepClock::start(trace.as_mut());
        let mut stop = || group.any(interrupt.requested());
        let event = match block_on(driver.next(&mut *engine, splits, tokenizer.sample_start(), &mut clock, &mut stop)) {
            Ok(event) => event,
            Err(e) => break Err(diverged(e, last_saved)),
        };
        match event {
            Event::Evaluated { step, train_loss, val_loss } => {
                window.eval += t.elapsed().as_secs_f64();
                console.line(&format!("step {step}: train loss {train_loss:.4}, val loss {val_loss:.4}"));
                metrics.write(json!({"type": "eval", "step": step, "train_loss": train_loss, "val_loss": val_loss}))?;
                if best_mode && best_val_loss.is_none_or(|b| val_loss < b) {
                    let t = Instant::now();
                    best_val_loss = Some(val_loss);
                    if let Err(e) = save(&mut *engine, last_saved, best_val_loss) {
                        break Err(e);
                    }
                    window.checkpoint += t.elapsed().as_secs_f64();
                    last_saved = Some(step);
                    metrics.write(json!({"type": "save", "step": step}))?;
                }
            }
            Event::Sampled { .. } if !root => {}
            Event::Sampled { step, ids } => {
                window.sample += t.elapsed().as_secs_f64();
                let text = tokenizer.decode_lossy(&ids);
                console.line(&format!("--- sample at step {step} ---\n{text}\n---"));
                metrics.write(json!({"type": "sample", "step": step, "text": text}))?;
            }
            Event::Finished { stopped, .. } => break Ok(stopped),
            Event::Trained { step, log, report } => {
                let done = step + 1;
                let phases = clock.finish(step, &report);
                window.add(&phases);
                window_steps += 1;
                console.progress(done, s.iters, report.stats.map(|st| (st.loss, tokens_per_step / phases.total)));
                if let (true, Some(st)) = (log, report.stats) {
                    // Full-workflow accounting: the window's wall time, evaluations, samples and
                    // checkpoints included; idle is what no phase accounts for.
                    let n = window_steps as f64;
                    window.close(window_start.elapsed().as_secs_f64());
                    let ms_per_step = window.total * 1e3 / n;
                    let tok_s = tokens_per_step * n / window.total;
                    let scaling = report.loss_scaling;
                    if console.plain() {
                        let scale = scaling.map(|l| match l.skipped {
                            0 => format!(", loss scale {}", l.scale),
                            n => format!(", loss scale {} ({n} steps skipped: f16 overflow)", l.scale),
                        });
                        println!(
                            "step {step}: loss {:.4}, lr {:.3e}, grad norm {:.3}, {ms_per_step:.1} ms/step, {tok_s:.0} tok/s{}",
                            st.loss,
                            st.lr,
                            st.grad_norm,
                            scale.unwrap_or_default()
                        );
                    }
                    metrics.write(json!({"type": "train", "step": step, "loss": st.loss, "lr": st.lr, "grad_norm": st.grad_norm,
                        "tokens_per_sec": tok_s, "ms_per_step": ms_per_step, "ms": window.json_ms(n), "device": device,
                        "mfu": utilisation(tok_s, model_flops), "hfu": utilisation(tok_s, hardware_flops),
                        "loss_scale": scaling.map(|l| l.scale), "skipped_steps": scaling.map(|l| l.skipped)}))?;
                    window = Phases::default();
                    window_steps = 0;
                    window_start = Instant::now();
                }
            }
            // In --save best, only evaluations save.
            Event::Save { .. } if best_mode => {}
            Event::Save { step } => {
                let t = Instant::now();
                if let Err(e) = save(&mut *engine, last_saved, None) {
                    break Err(e);
                }
                window.checkpoint += t.elapsed().as_secs_f64();
                last_saved = Some(step);
                metrics.write(json!({"type": "save", "step": step}))?;
            }
        }
    };
    // Whatever ended the run, the trace of the steps it recorded is written.
    let traced = trace.as_mut().map_or(Ok(()), Trace::finish);
    console.bar.finish_and_clear();
    // A checkpoint still being written is finished whatever ended the run.
    let written = finish_pending();
    let interrupted = result?;
    written?;
    if last_saved != Some(engine.step_count()) && !best_mode {
        save(&mut *engine, last_saved, None)?;
        finish_pending()?;
        metrics.write(json!({"type": "save", "step": engine.step_count()}))?;
    }
    traced?;
    let steps = engine.step_count();
    if !root {
        return Ok(());
    }
    if best_mode {
        let ended = if interrupted { format!("interrupted at step {steps}") } else { format!("done: {steps} steps") };
        match (last_saved, best_val_loss) {
            (Some(at), Some(loss)) => println!("{ended}; the best checkpoint (step {at}, val loss {loss:.4}) is {}", ckpt_path.display()),
            _ => println!("{ended}; no evaluation improved on the resumed checkpoint's val loss, which stays as it was"),
        }
    } else if interrupted {
        println!("interrupted: checkpoint at step {steps} saved to {}; continue with --resume {}", ckpt_path.display(), ckpt_path.display());
    } else {
        println!("done: {steps} step{}; checkpoint saved to {}", if steps == 1 { "" } else { "s" }, ckpt_path.display());
    }
    Ok(())
}

/// The run's metrics: the `--metrics` file and the `--serve` dashboard's records (neither on
/// ranks other than 0, or without the flags).
struct Metrics {
    file: Option<File>,
    live: Option<crate::serve::Records>,
    /// When this process started the run: records carry their time since (`time_s`).
    started: Instant,
}

impl Metrics {
    /// Appends `record` (an object) with its `time_s`, as one line.
    fn write(&mut self, mut record: serde_json::Value) -> Result<(), String> {
        if self.file.is_none() && self.live.is_none() {
            return Ok(());
        }
        record["time_s"] = json!(self.started.elapsed().as_secs_f64());
        let mut line = record.to_string();
        if let Some(live) = &self.live {
            live.push(&line);
        }
        if let Some(f) = &mut self.file {
            line.push('\n');
            // One write per record, so a reader never sees half a line from a live run.
            f.write_all(line.as_bytes()).map_err(|e| format!("cannot write metrics: {e}"))?;
        }
        Ok(())
    }
}

/// The first line of every run file a run writes (the mark that it may replace it).
const RUN_FILE_HEADER: &str = "# The resolved configuration of the run in this directory: `alpha-native train --config\n# THIS_FILE --out NEW_DIR` repeats it; keys are train's flags with `_` for `-`.\n";

/// The run file that repeats this run (`train --config DIR/run.toml`): its model, settings,
/// cadence and backend as resolved from the defaults, --config, the checkpoint resumed and the
/// flags; on a GPU (`gpu`), the precision and tensor-core use it resolved to, so that a repeat
/// on another device runs the same arithmetic or says why it cannot.
fn resolved_run_file(args: &TrainArgs, config: &GptConfig, s: &RunSettings, gpu: Option<&alpha_gpu::Gpu>) -> String {
    let (int, float) = (|v: u64| v.to_string(), |v: f64| format!("{v:?}"));
    let mut entries = Vec::new();
    if s.data != corpus::EMBEDDED {
        entries.push((if s.dataset { "dataset" } else { "data" }, runfile::string(&s.data)));
    }
    entries.extend(args.model.tokenizer.as_ref().map(|t| ("tokenizer", runfile::string(&t.to_string_lossy()))));
    entries.extend(args.init_from.as_ref().map(|p| ("init_from", runfile::string(&p.to_string_lossy()))));
    entries.extend([
        ("layers", int(config.n_layer as u64)),
        ("heads", int(config.n_head as u64)),
        ("embd", int(config.n_embd as u64)),
        ("block", int(config.block_size as u64)),
        ("batch", int(s.batch as u64)),
        ("grad_accum", int(s.grad_accum as u64)),
        ("iters", int(s.iters)),
        ("lr", float(s.lr)),
        ("lr_decay_iters", int(s.lr_decay_iters)),
        ("min_lr", float(s.min_lr)),
        ("warmup", int(s.warmup)),
        ("weight_decay", float(s.weight_decay)),
        ("beta1", float(s.beta1)),
        ("beta2", float(s.beta2)),
        ("grad_clip", float(s.grad_clip)),
        ("seed", int(s.seed)),
        ("dropout", float(s.dropout)),
        ("eval_interval", int(s.eval_interval)),
        ("eval_iters", int(s.eval_iters as u64)),
        ("sample_interval", int(s.sample_interval)),
        ("checkpoint_interval", int(s.checkpoint_interval)),
        ("log_interval", int(s.log_interval)),
        ("save", runfile::string(s.save.name())),
        ("keep", int(s.keep as u64)),
        ("async_checkpoint", s.async_checkpoint.to_string()),
        ("zero", int(u64::from(args.zero))),
        ("recompute", s.recompute.to_string()),
        ("vocab_pad", int(args.model.vocab_pad as u64)),
        ("backend", runfile::string(if args.device.backend == crate::device::Backend::Gpu { "gpu" } else { "cpu" })),
    ]);
    entries.extend(args.device.adapter.as_deref().map(|a| ("adapter", runfile::string(a))));
    for (key, value) in gpu.map(crate::device::arithmetic_flags).into_iter().flatten() {
        entries.push((key, runfile::string(&value)));
    }
    runfile::write(RUN_FILE_HEADER, &entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::FromArgMatches;
    use serde_json::Value;

    /// Every setting of a run has exactly one flag of `train`, defaulting to the settings'
    /// own default ([`DEFAULT`]), and a run of the default flags has the default settings.
    #[test]
    fn every_setting_has_one_flag_and_its_default() {
        let command = crate::cli::command();
        let train = command.find_subcommand("train").expect("train");
        let Value::Object(defaults) = serde_json::to_value(DEFAULT).unwrap() else { panic!("settings serialise to an object") };
        // Flags whose default is derived, not a value of their own: the text (--data, or
        // --dataset, which `dataset` records), the decay's end (--iters), the block (64, or
        // GPT-2's 1024 with --model).
        let derived = ["data", "dataset", "lr_decay_iters", "block"];
        for (field, default) in &defaults {
            let long = field.replace('_', "-");
            let flags: Vec<_> = train.get_arguments().filter(|a| a.get_long() == Some(long.as_str())).collect();
            assert_eq!(flags.len(), 1, "setting {field} has {} flags --{long}", flags.len());
            if derived.contains(&field.as_str()) {
                continue;
            }
            let given: Vec<String> = flags[0].get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
            let same = match default {
                Value::Number(n) => given.len() == 1 && given[0].parse::<f64>().ok() == n.as_f64(),
                Value::Bool(b) => given.is_empty() && !b || given == [b.to_string()],
                Value::String(s) => given == [s.clone()],
                _ => false,
            };
            assert!(same, "--{long} defaults to {given:?}, the setting to {default}");
        }
        let matches = train.clone().try_get_matches_from(["train"]).unwrap();
        let args = TrainArgs::from_arg_matches(&matches).unwrap();
        assert_eq!(RunSettings { data: String::new(), ..args.settings() }, DEFAULT);
    }
}
