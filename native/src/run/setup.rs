//! A run's set-up: the model and settings it resolves from the flags and the checkpoint it
//! starts from ([`resolve`]), the tokenizer, data and memory plan it trains with
//! ([`inputs`]), where it starts ([`start`]) and the engine that trains it ([`open_engine`]).

use crate::args::load_corpus;
use crate::checkpoint::{self, Checkpoint};
use crate::dataset::{self, Dataset};
use crate::device::{Backend, DeviceArgs, PrecisionArg};
use crate::engine::{Opened, Placement};
use crate::ranks::Group;
use crate::run::args::{fields_in_order, TrainArgs};
use alpha_core::data::{self, Segment, Tokens};
use alpha_core::engine::Splits;
use alpha_core::parallel::{Parallel, ThreadPool};
use alpha_core::rng::{derive_seed, stream};
use alpha_core::settings::RunSettings;
use alpha_core::tokenizer::Tokenizer;
use alpha_core::train::{LossScaleState, Ranks, RunState, TrainConfig};
use alpha_core::{GptConfig, Plan, Rng};
use anyhow::{anyhow, Error, Result};
use serde_json::Value;

/// What a run trains on: a text's ids in memory, or a prepared dataset's memory maps.
pub enum TrainData {
    /// A text's ids.
    Text(Vec<u32>),
    /// A prepared dataset.
    Dataset(Dataset),
}

/// Resolved run: model, settings and where it starts.
pub struct Run {
    /// The model (its vocabulary set by [`inputs`] for a fresh run).
    pub config: GptConfig,
    /// The run's settings, checked.
    pub settings: RunSettings,
    /// The checkpoint resumed (`--resume`).
    pub resume: Option<Checkpoint>,
    /// `--init-from`'s weights, cropped to the run's context.
    pub init: Option<Checkpoint>,
    /// The resumed run's settings the flags changed (`--lr 0.1 (was 0.001)`).
    pub changed: Vec<String>,
}

/// The run the flags describe (`explicit(flag)`: whether the command line gave `flag`): a
/// fresh one, one that continues `--resume`'s checkpoint with its own settings (a flag given
/// overriding one), or one that starts from `--init-from`'s weights; its settings checked.
pub fn resolve(args: &TrainArgs, explicit: &dyn Fn(&str) -> bool) -> Result<Run> {
    let flag = |field: &str| format!("--{}", field.replace('_', "-"));
    // A fresh model's flags as given (its settings keep only what its family has); a model
    // from a checkpoint is compared with them instead (`keeps_model_shape`).
    if args.resume.is_none() && args.init_from.is_none() {
        args.model.shape_settings().validate(flag).map_err(Error::msg)?;
    }
    let run = resolve_unchecked(args, explicit)?;
    run.settings.validate(flag).map_err(Error::msg)?;
    Ok(run)
}

fn resolve_unchecked(args: &TrainArgs, explicit: &dyn Fn(&str) -> bool) -> Result<Run> {
    let fresh_settings = args.settings();
    if let Some(from) = &args.init_from {
        if args.model.tokenizer.is_some() {
            return Err(anyhow!("--tokenizer: --init-from {} brings its own tokenizer", from.display()));
        }
        let mut ck = checkpoint::load_weights(from)?;
        keeps_model_shape(args, explicit, &ck.config, &format!("--init-from {} brings its own model", from.display()))?;
        let block = args.model.block.unwrap_or(ck.config.block_size);
        if block > ck.config.block_size {
            return Err(anyhow!("--block {block} is larger than {}'s context of {} tokens", from.display(), ck.config.block_size));
        }
        let to = GptConfig { block_size: block, vocab_size: args.model.padded_vocab(ck.config.vocab_size), ..ck.config };
        ck.params = alpha_core::plan::resize_tables(&ck.params, ck.config, to)?;
        ck.config = to;
        return Ok(Run { config: ck.config, settings: fresh_settings.with_model(ck.config), resume: None, init: Some(ck), changed: Vec::new() });
    }
    let Some(path) = &args.resume else {
        let config = args.model.config(0);
        return Ok(Run { config, settings: fresh_settings.with_model(config), resume: None, init: None, changed: Vec::new() });
    };
    let ck = checkpoint::load(path)?;
    if args.model.tokenizer.is_some() {
        return Err(anyhow!("--tokenizer: a resumed run keeps its checkpoint's tokenizer"));
    }
    if explicit("vocab_pad") {
        return Err(anyhow!("--vocab-pad: a resumed run keeps its checkpoint's model"));
    }
    let Some((_, _, state)) = &ck.optimizer else {
        return Err(anyhow!("checkpoint {} has no training state (no optimizer moments) and cannot be resumed", path.display()));
    };
    let c = ck.config;
    if explicit("block") && args.model.block() != c.block_size {
        let (given, stored) = (args.model.block(), c.block_size);
        let rel = if given > stored { "is larger than" } else { "differs from" };
        return Err(anyhow!("--block {given} {rel} the checkpoint's block size {stored}; a resumed run keeps the checkpoint's model"));
    }
    keeps_model_shape(args, explicit, &c, "a resumed run keeps the checkpoint's model")?;
    let (settings, changed) = overridden(&state.settings, &fresh_settings, explicit)?;
    Ok(Run { config: c, settings, resume: Some(ck), init: None, changed })
}

/// Settings that are the model's shape, which a resumed run takes from its checkpoint (the
/// flags that would change them are refused), and `dataset`, which goes with `data`.
const MODEL_SHAPE: [&str; 12] =
    ["layers", "heads", "embd", "block", "arch", "kv_heads", "intermediate_size", "rope_theta", "norm_eps", "qkv_bias", "untied_head", "dataset"];

/// A resumed run's settings: the checkpoint's (`stored`), each that a flag given (`explicit`)
/// sets otherwise taken from `given`; and the changes, as `--lr 0.1 (was 0.001)`.
fn overridden(stored: &RunSettings, given: &RunSettings, explicit: &dyn Fn(&str) -> bool) -> Result<(RunSettings, Vec<String>)> {
    let Ok(Value::Object(mut settings)) = serde_json::to_value(stored) else { unreachable!("settings serialise to an object") };
    let shown = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.as_u64().map_or_else(|| n.as_f64().unwrap_or(f64::NAN).to_string(), |u| u.to_string()),
        other => other.to_string(),
    };
    let mut changed = Vec::new();
    for (field, value) in fields_in_order(given) {
        let was = &settings[&field];
        if explicit(&field) && !MODEL_SHAPE.contains(&field.as_str()) && *was != value {
            changed.push(format!("--{} {} (was {})", field.replace('_', "-"), shown(&value), shown(was)));
            settings.insert(field, value);
        }
    }
    Ok((serde_json::from_value(Value::Object(settings))?, changed))
}

/// An error where a model flag given (`--layers`, `--heads`, `--embd`, `--arch` and the
/// Llama family's, `--model`) differs from the model of a checkpoint the run starts from,
/// `config`; `why` says what decides instead. Flags that repeat the checkpoint's model (a run
/// file of the same run) are fine.
fn keeps_model_shape(args: &TrainArgs, explicit: &dyn Fn(&str) -> bool, config: &GptConfig, why: &str) -> Result<()> {
    let stored = RunSettings::default().with_model(*config);
    let shape = (config.n_layer, config.n_head, config.n_embd);
    if let Some(model) = args.model.model.filter(|m| m.shape() != shape || m.family() != stored.arch) {
        let (layers, heads, embd) = model.shape();
        return Err(anyhow!(
            "--model is {} with {layers} layers, {heads} heads, {embd} wide, not the checkpoint's {} with {} layers, {} heads, {} wide; {why}",
            model.family().name(),
            stored.arch.name(),
            shape.0,
            shape.1,
            shape.2
        ));
    }
    let given = args.model.shape_settings();
    let (given, stored) = (fields_in_order(&given), fields_in_order(&stored));
    let names = [
        ("layers", "number of layers"),
        ("heads", "number of heads"),
        ("embd", "embedding width"),
        ("arch", "family"),
        ("kv_heads", "number of key/value heads"),
        ("intermediate_size", "MLP width"),
        ("rope_theta", "rope_theta"),
        ("norm_eps", "norm_eps"),
        ("qkv_bias", "q/k/v biases"),
        ("untied_head", "head"),
    ];
    for ((field, value), (_, was)) in given.iter().zip(&stored) {
        let Some((_, name)) = names.iter().find(|(f, _)| f == field) else { continue };
        if explicit(field) && value != was {
            let show = |v: &serde_json::Value| v.as_str().map_or_else(|| v.to_string(), str::to_string);
            return Err(anyhow!("--{} {} differs from the checkpoint's {name} {}; {why}", field.replace('_', "-"), show(value), show(was)));
        }
    }
    Ok(())
}

/// What a run trains with: its tokenizer, data and memory plan.
pub struct Inputs {
    /// How the data became ids (and samples become text).
    pub tokenizer: Tokenizer,
    /// The ids.
    pub data: TrainData,
    /// The memory plan of the model and batch.
    pub plan: Plan,
}

/// Reads the run's tokenizer (a checkpoint's, `--tokenizer`'s, or the text's characters) and
/// data (a text or a prepared dataset, encoded on `pool`'s threads), sets a fresh run's
/// vocabulary and plans its memory. A run that could not write its checkpoints (a header
/// past the format's limit) stops before any work.
pub fn inputs(args: &TrainArgs, run: &mut Run, pool: &dyn Parallel) -> Result<Inputs> {
    // A resumed or initialised run keeps its checkpoint's tokenizer.
    let known = match run.resume.as_ref().or(run.init.as_ref()) {
        Some(ck) => Some(ck.tokenizer.clone()),
        None => args.model.tokenizer.as_deref().map(|p| crate::tokenizer::load(p).map(Tokenizer::from)).transpose()?,
    };
    if let Some(tokenizer) = &known {
        checkpoint::check_header_room(run.config, tokenizer).map_err(|e| anyhow!("the run could not save a checkpoint: {e}"))?;
    }
    let s = &run.settings;
    let (tokenizer, data) = if s.dataset {
        let d = dataset::open(&s.data, known, pool)?;
        (d.tokenizer.clone(), TrainData::Dataset(d))
    } else {
        let (tokenizer, tokens) = load_corpus(&s.data, known, pool)?;
        (tokenizer, TrainData::Text(tokens))
    };
    if run.resume.is_none() && run.init.is_none() {
        if let Some(m) = args.model.model.filter(|m| tokenizer.vocab_size() != m.vocab_size()) {
            let (name, vocab) = (m.name(), m.vocab_size());
            return Err(anyhow!(
                "--model {name} has {vocab} tokens, but the tokenizer has {}: train it with {name}'s tokenizer (--tokenizer), or give --layers, --heads and --embd",
                tokenizer.vocab_size()
            ));
        }
        run.config.vocab_size = args.model.config(tokenizer.vocab_size()).vocab_size;
    }
    let plan = run.settings.plan(run.config).and_then(|p| p.with_classes(tokenizer.vocab_size()))?;
    Ok(Inputs { tokenizer, data, plan })
}

/// The segments a dataset's splits read from (none for a text).
pub struct Streams<'d> {
    train: Vec<Segment<'d>>,
    val: Vec<Segment<'d>>,
}

impl TrainData {
    /// The segments of a dataset's splits, which [`TrainData::splits`] reads.
    pub fn streams(&self) -> Streams<'_> {
        match self {
            TrainData::Text(_) => Streams { train: Vec::new(), val: Vec::new() },
            TrainData::Dataset(d) => Streams { train: d.train.segments(), val: d.val.segments() },
        }
    }

    /// The train and val splits (a text's last tenth is val), each checked to hold more than
    /// a block of `block` tokens; `name` is the data in messages.
    pub fn splits<'a>(&'a self, streams: &'a Streams<'a>, block: usize, name: &str) -> Result<Splits<'a>> {
        match self {
            TrainData::Text(tokens) => {
                let (train, val) = data::split(tokens);
                if val.len() <= block {
                    return Err(anyhow!(
                        "{name} is too short: {} tokens, but a block of {block} needs at least {} so that the 10% validation split holds {} tokens",
                        tokens.len(),
                        (block + 1) * 10,
                        block + 1
                    ));
                }
                Ok(Splits { train: train.into(), val: val.into() })
            }
            TrainData::Dataset(d) => {
                for (split, tokens) in [("train", &d.train), ("val", &d.val)] {
                    if tokens.len() <= block {
                        return Err(anyhow!("dataset {name}: the {split} split has {} tokens; a block of {block} needs at least {}", tokens.len(), block + 1));
                    }
                }
                Ok(Splits { train: Tokens::Stream(&streams.train), val: Tokens::Stream(&streams.val) })
            }
        }
    }
}

/// What a resumed checkpoint carries besides its tensors.
#[derive(Default)]
pub struct Carried {
    /// The best val loss of a `--save best` run.
    pub best_val_loss: Option<f64>,
    /// An f16 run's loss scale.
    pub loss_scale: Option<LossScaleState>,
}

/// Where the run starts: the resumed checkpoint's state, `--init-from`'s weights with a fresh
/// optimizer and the run's batch stream, or a fresh model of `plan`.
pub fn start(run: &mut Run, plan: &Plan) -> Result<(RunState<f32>, Carried)> {
    if let Some(ck) = run.resume.take() {
        let (m, v, state) = ck.optimizer.expect("resolve() checked the training state");
        let rng = state.rng()?;
        let carried = Carried { best_val_loss: state.best_val_loss, loss_scale: state.loss_scale };
        return Ok((RunState { params: ck.params, moments: Some((m, v)), step: state.step, rng }, carried));
    }
    let seed = run.settings.seed;
    let start = match run.init.take() {
        Some(ck) => RunState { params: ck.params, moments: None, step: 0, rng: Rng::new(derive_seed(seed, stream::BATCHES, 0)) },
        None => RunState::fresh(plan, seed)?,
    };
    Ok((start, Carried::default()))
}

/// The engine a run trains with and what chose it.
pub struct Started<'m> {
    /// The engine and its GPU, if it has one.
    pub opened: Opened<'m>,
    /// The device flags it was opened with (`--precision` as the run resolved it).
    pub device: DeviceArgs,
    /// Whether the precision is the resumed checkpoint's (an f16 run's) rather than a flag's.
    pub precision_from_checkpoint: bool,
    /// The optimizer's settings: `--grad-accum` times the ranks.
    pub config: TrainConfig,
}

/// Opens the engine `args` choose for one rank of `group`, continuing `start` with the
/// settings `s`; a resumed f16 run's loss scale (`carried`) goes on, and its precision unless
/// `--precision` is given (`explicit`).
pub fn open_engine<'m>(
    args: &TrainArgs,
    explicit: &dyn Fn(&str) -> bool,
    pool: &'m ThreadPool,
    plan: Plan,
    s: &RunSettings,
    (start, carried): (RunState<f32>, &Carried),
    group: &'m Group,
) -> Result<Started<'m>> {
    // f16 where the adapter has it, as `auto` picks.
    let precision_from_checkpoint = carried.loss_scale.is_some() && !explicit("precision") && args.device.backend == Backend::Gpu;
    let device = DeviceArgs { precision: if precision_from_checkpoint { PrecisionArg::Auto } else { args.device.precision }, ..args.device.clone() };
    // N ranks of --grad-accum G take the step one process of --grad-accum N*G takes.
    let mut config = s.train_config();
    config.grad_accum *= group.ranks();
    config.validate().map_err(|e| anyhow!("--grad-accum {} on {} ranks: {e}", s.grad_accum, group.ranks()))?;
    let placement = Placement { ranks: group, local_rank: group.local_rank(), zero: args.zero == 1 };
    let mut opened = crate::engine::open(&device, pool, plan, config, start, placement)?;
    if let Some(state) = carried.loss_scale {
        opened.engine.set_loss_scale(state);
    }
    Ok(Started { opened, device, precision_from_checkpoint, config })
}
