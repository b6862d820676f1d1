//! The flags of `alpha-native train` ([`TrainArgs`]) and the run they describe.

use crate::args::ModelArgs;
use crate::device::DeviceArgs;
use alpha_core::settings::{RunSettings, SavePolicy, DEFAULT};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Args;
use serde_json::Value;
use std::path::PathBuf;

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
            ..m.shape_settings()
        }
    }
}

/// The fields of `settings` with their values, in the order the struct declares them (a JSON
/// object of them would sort them).
pub fn fields_in_order(settings: &RunSettings) -> Vec<(String, Value)> {
    struct Fields(Vec<(String, Value)>);
    impl<'de> serde::Deserialize<'de> for Fields {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = Fields;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<M: serde::de::MapAccess<'de>>(self, mut map: M) -> std::result::Result<Fields, M::Error> {
                    let mut out = Vec::new();
                    while let Some(entry) = map.next_entry()? {
                        out.push(entry);
                    }
                    Ok(Fields(out))
                }
            }
            d.deserialize_map(Visit)
        }
    }
    let text = serde_json::to_string(settings).expect("settings serialise");
    serde_json::from_str::<Fields>(&text).expect("settings serialise to an object").0
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, FromArgMatches};
    use serde_json::Value;

    /// Every setting of a run has exactly one flag of `train`, defaulting to the settings'
    /// own default ([`DEFAULT`]), and a run of the default flags has the default settings.
    #[test]
    fn every_setting_has_one_flag_and_its_default() {
        let train = TrainArgs::augment_args(clap::Command::new("train"));
        let Value::Object(defaults) = serde_json::to_value(DEFAULT).unwrap() else { panic!("settings serialise to an object") };
        // Flags whose default is derived, not a value of their own: the text (--data, or
        // --dataset, which `dataset` records), the decay's end (--iters), the block (64, or
        // the model's context with --model).
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
