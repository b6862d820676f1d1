//! The one interface a run trains its model through, whatever the backend: [`Engine`]. The
//! CPU's ([`CpuEngine`], here) and alpha-gpu's implement it; the CLI (`alpha-native train`,
//! `bench`, blocking on its futures) and the page (alpha-web, awaiting them) drive it with
//! [`Driver`]. A new backend is one [`crate::walk::Executor`], one `Engine`, and
//! its registration where the frontends open engines.
//!
//! Calls return futures: a GPU's readbacks resolve on the platform's event loop (the
//! browser's), the CPU's are ready at once. They are boxed ([`Pending`]) so that a frontend
//! holds any backend's engine as one `Box<dyn Engine>`.
//!
//! ```
//! use alpha_core::engine::{CpuEngine, Engine};
//! use alpha_core::optim::{AdamWConfig, LrSchedule};
//! use alpha_core::train::{OneRank, RunState, TrainConfig};
//! use alpha_core::{GptConfig, Plan, Serial};
//!
//! let config = GptConfig::gpt2(5, 4, 1, 1, 4);
//! let plan = Plan::new(config, 2, 4).unwrap();
//! let schedule = LrSchedule { max_lr: 1e-3, min_lr: 1e-4, warmup_iters: 0, decay_iters: 10 };
//! let cfg = TrainConfig { schedule, adamw: AdamWConfig::default(), grad_clip: 1.0, grad_accum: 1 };
//! let start = RunState::fresh(&plan, 1).unwrap();
//! let mut engine = CpuEngine::new(Serial, &OneRank, plan, cfg, start).unwrap();
//! let data: Vec<u32> = (0..64).map(|i| i % 5).collect();
//! let report = futures_lite(engine.step(data[..].into(), true, &mut ())).unwrap();
//! assert!(report.stats.unwrap().loss.is_finite() && engine.step_count() == 1);
//! # fn futures_lite<F: core::future::Future>(f: F) -> F::Output {
//! #     let waker = core::task::Waker::noop();
//! #     let mut f = core::pin::pin!(f);
//! #     match f.as_mut().poll(&mut core::task::Context::from_waker(&waker)) {
//! #         core::task::Poll::Ready(v) => v,
//! #         core::task::Poll::Pending => unreachable!("the CPU's futures are ready at once"),
//! #     }
//! # }
//! ```

use crate::data::Tokens;
use crate::gemm::Operands;
use crate::model::{Sampler, SamplingConfig};
use crate::parallel::{shard, Parallel};
use crate::plan::{try_vec, Plan};
use crate::rng::Rng;
use crate::tape::Observer;
use crate::train::{LossScaleState, OwnedMemory, Ranks, RunState, StepStats, TrainConfig};
use alloc::borrow::Cow;
use alloc::boxed::Box;
use alloc::format;
use alloc::string::{String, ToString};
use core::future::Future;
use core::pin::Pin;

/// A call's result, to be awaited (or blocked on).
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Parameters and AdamW moments `(params, m, v)` in plan order (host layout): borrowed from
/// CPU memory, read back from a device.
pub type HostState<'a> = (Cow<'a, [f32]>, Cow<'a, [f32]>, Cow<'a, [f32]>);

/// What a step reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepReport {
    /// Loss, gradient norm and learning rate (a device reads them back only when asked).
    pub stats: Option<StepStats>,
    /// With f16 products, read with the statistics: the loss scale and the overflowed steps.
    pub loss_scaling: Option<LossScaling>,
}

/// Dynamic loss scaling's state as an engine with f16 products reports it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScaling {
    /// The scale the last step used.
    pub scale: f64,
    /// Steps since the last read that an f16 overflow skipped (the scale halved each time).
    pub skipped: u64,
}

/// Why a step failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepError {
    /// A non-finite loss or gradient norm: which step(s), and that nothing was applied.
    Diverged(String),
    /// The device failed (a readback, a lost device) or memory ran out.
    Device(String),
}

impl core::fmt::Display for StepError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            StepError::Diverged(msg) | StepError::Device(msg) => f.write_str(msg),
        }
    }
}

impl core::error::Error for StepError {}

impl StepError {
    /// A device's report, read after the `unread` steps before step `step`, that `skipped` of
    /// them had a non-finite loss or gradient norm and were not applied; `last`: the last
    /// step's statistics.
    pub fn skipped_updates(skipped: u64, unread: u64, step: u64, last: &StepStats) -> StepError {
        let which = if unread == 1 { alloc::format!("step {}", step - 1) } else { alloc::format!("{skipped} of steps {}..={}", step - unread, step - 1) };
        StepError::Diverged(alloc::format!(
            "{which}: the loss or gradient norm was not finite (last step: loss {}, gradient norm {}); those updates were not applied",
            last.loss,
            last.grad_norm
        ))
    }
}

/// Where and how an engine trains, for messages and records.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Description {
    /// `"cpu"` or `"gpu"`.
    pub backend: &'static str,
    /// For a run's first line: `"2 threads"`, `"GPU <adapter> (<platform backend>)"`.
    pub summary: String,
    /// The arithmetic of the model's products: `"f32"`, `"f16"`.
    pub precision: &'static str,
    /// CPU threads (1 on a device).
    pub threads: usize,
    /// The device, where it trains on one.
    pub device: Option<DeviceDescription>,
}

/// A device an engine trains on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceDescription {
    /// The adapter's name.
    pub adapter: String,
    /// The platform backend (Vulkan, Metal, DX12, WebGPU, CUDA).
    pub platform: String,
    /// Discrete, integrated, CPU (a software adapter).
    pub device_type: String,
    /// Kernels dispatched by one step.
    pub kernels_per_step: usize,
    /// Submissions to the device per step.
    pub submits_per_step: usize,
    /// Device memory the model takes, bytes.
    pub memory_bytes: u64,
    /// Buffers the activations take (the device's largest buffer bounds one).
    pub activation_buffers: usize,
}

/// A model being trained, on some backend (see the module docs). Every call but a step's
/// leaves the training state as it was.
pub trait Engine {
    /// One optimizer step on batches from `data`, its phases (and ops, and a device's kernels
    /// where `observer` wants them) told to `observer`. With `report` the step's statistics
    /// come back (a device waits for the step then; the CPU always reports). A step whose
    /// loss or gradient norm is not finite is not applied: an error, now or at the next
    /// read of a device's statistics.
    fn step<'a>(&'a mut self, data: Tokens<'a>, report: bool, observer: &'a mut dyn Observer) -> Pending<'a, Result<StepReport, StepError>>;

    /// Confirms that every step so far was applied (a device reads its statistics where steps
    /// ran since the last read): before a checkpoint is taken.
    fn check(&mut self) -> Pending<'_, Result<(), StepError>>;

    /// nanoGPT's `estimate_loss` for one split: the mean loss of `iters` batches of `data`
    /// drawn with `rng`.
    fn evaluate<'a>(&'a mut self, data: Tokens<'a>, iters: usize, rng: &'a mut Rng) -> Pending<'a, Result<f64, String>>;

    /// `cfg.tokens` token ids after `prompt`, each given to `emit` as it is drawn (a sample
    /// ends sooner at `cfg.stop`).
    fn sample<'a>(&'a mut self, prompt: &'a [u32], cfg: &'a SamplingConfig, rng: &'a mut Rng, emit: &'a mut dyn FnMut(u32)) -> Pending<'a, Result<(), String>>;

    /// The parameters and AdamW moments, for a checkpoint. In a data-parallel run every rank
    /// calls it (with ZeRO-1 rank 0 collects the moments' shards; the others get none).
    fn state(&self) -> Pending<'_, Result<HostState<'_>, String>>;

    /// Dynamic loss scaling's state, for a checkpoint (with f16 products).
    fn loss_scale(&self) -> Pending<'_, Result<Option<LossScaleState>, String>>;

    /// Continues loss scaling from a checkpoint's `state` (where the engine scales).
    fn set_loss_scale(&mut self, state: LossScaleState);

    /// Optimizer steps taken.
    fn step_count(&self) -> u64;

    /// The batch generator's state.
    fn rng(&self) -> Rng;

    /// The training plan.
    fn plan(&self) -> &Plan;

    /// Where and how it trains.
    fn describe(&self) -> Description;
}

/// The CPU's engine: alpha-core's [`crate::train::Trainer`] over owned arenas, its kernels on
/// `par`'s threads, one of `ranks` in a data-parallel run. `P` is a thread pool it owns or
/// borrows (`&ThreadPool`, `Box<dyn Parallel>`).
pub struct CpuEngine<'r, P> {
    par: P,
    ranks: &'r dyn Ranks<f32>,
    plan: Plan,
    cfg: TrainConfig,
    mem: OwnedMemory<f32>,
    step: u64,
    rng: Rng,
    /// What the linear layers' products' operands are rounded to.
    operands: Operands,
    /// Batch-1 memory for samples.
    sampler: Sampler<f32>,
}

impl<'r, P: Parallel> CpuEngine<'r, P> {
    /// The engine with its linear layers' products on `operands` (bf16: an error naming what
    /// is missing unless the CPU has the bf16 kernel).
    pub fn with_operands(mut self, operands: Operands) -> Result<Self, crate::ConfigError> {
        if operands == Operands::Bf16 && crate::gemm::bf16::bf16_kernel_name().is_none() {
            return Err(crate::ConfigError::Setting("bf16 products on the CPU need AVX512-BF16 (with AVX-512 F and BW), which this CPU lacks"));
        }
        self.operands = operands;
        Ok(self)
    }

    /// An engine for `plan` continuing `start`; with ZeRO-1 (`zero`) it holds and updates
    /// only its rank's shard of the AdamW moments.
    pub fn new(par: P, ranks: &'r dyn Ranks<f32>, plan: Plan, cfg: TrainConfig, start: RunState<f32>) -> Result<Self, crate::ConfigError> {
        CpuEngine::in_group(par, ranks, false, plan, cfg, start)
    }

    /// [`CpuEngine::new`] as one of `ranks`, with ZeRO-1 where `zero`.
    pub fn in_group(par: P, ranks: &'r dyn Ranks<f32>, zero: bool, plan: Plan, cfg: TrainConfig, start: RunState<f32>) -> Result<Self, crate::ConfigError> {
        let moments = if zero { shard(plan.params_len(), ranks.ranks(), ranks.rank()) } else { 0..plan.params_len() };
        let mut mem = OwnedMemory::with_shard(&plan, moments)?;
        mem.resume(plan, cfg, &start)?;
        let sampler = Sampler::new(plan.config, plan.classes(), plan.config.block_size)?;
        Ok(CpuEngine { par, ranks, plan, cfg, mem, step: start.step, rng: start.rng, operands: Operands::F32, sampler })
    }

    /// Runs `f` with a trainer over the arenas, keeping its step and generator after.
    fn with_trainer<R>(&mut self, f: impl FnOnce(&mut crate::train::Trainer<'_, f32>, &P, &dyn Ranks<f32>) -> R) -> R {
        let mut t = self.mem.trainer(self.plan, self.cfg, self.rng).expect("the arenas were made for this plan");
        (t.step, t.operands) = (self.step, self.operands);
        let r = f(&mut t, &self.par, self.ranks);
        (self.step, self.rng) = (t.step, t.rng);
        r
    }
}

impl<P: Parallel> Engine for CpuEngine<'_, P> {
    fn step<'a>(&'a mut self, data: Tokens<'a>, _report: bool, observer: &'a mut dyn Observer) -> Pending<'a, Result<StepReport, StepError>> {
        let stepped = self.with_trainer(|t, par, ranks| t.train_step_ranked(par, data, observer, ranks));
        let report = stepped.map(|stats| StepReport { stats: Some(stats), loss_scaling: None }).map_err(|e| StepError::Diverged(e.to_string()));
        Box::pin(core::future::ready(report))
    }

    fn check(&mut self) -> Pending<'_, Result<(), StepError>> {
        // Every CPU step is checked as it ends.
        Box::pin(core::future::ready(Ok(())))
    }

    fn evaluate<'a>(&'a mut self, data: Tokens<'a>, iters: usize, rng: &'a mut Rng) -> Pending<'a, Result<f64, String>> {
        let loss = self.with_trainer(|t, par, ranks| t.evaluate_ranked(par, data, iters, rng, ranks));
        Box::pin(core::future::ready(Ok(loss)))
    }

    fn sample<'a>(&'a mut self, prompt: &'a [u32], cfg: &'a SamplingConfig, rng: &'a mut Rng, emit: &'a mut dyn FnMut(u32)) -> Pending<'a, Result<(), String>> {
        self.sampler.generate(&self.par, &self.mem.params, prompt, cfg, rng, emit);
        Box::pin(core::future::ready(Ok(())))
    }

    fn state(&self) -> Pending<'_, Result<HostState<'_>, String>> {
        let m = &self.mem;
        let state = if m.shard.len() < self.plan.params_len() {
            // ZeRO-1: rank 0 collects the moments' shards.
            let whole = |mine: &[f32]| -> Result<Cow<'_, [f32]>, String> {
                let len = if self.ranks.rank() == 0 { self.plan.params_len() } else { 0 };
                let mut all = try_vec("the AdamW moments of a checkpoint", len, 0.0).map_err(|e| e.to_string())?;
                self.ranks.collect_shards(mine, &mut all);
                Ok(Cow::Owned(all))
            };
            whole(&m.adam_m).and_then(|adam_m| Ok((Cow::Borrowed(&m.params[..]), adam_m, whole(&m.adam_v)?)))
        } else {
            Ok((Cow::Borrowed(&m.params[..]), Cow::Borrowed(&m.adam_m[..]), Cow::Borrowed(&m.adam_v[..])))
        };
        Box::pin(core::future::ready(state))
    }

    fn loss_scale(&self) -> Pending<'_, Result<Option<LossScaleState>, String>> {
        // f32 products: no loss scaling.
        Box::pin(core::future::ready(Ok(None)))
    }

    fn set_loss_scale(&mut self, _state: LossScaleState) {}

    fn step_count(&self) -> u64 {
        self.step
    }

    fn rng(&self) -> Rng {
        self.rng
    }

    fn plan(&self) -> &Plan {
        &self.plan
    }

    fn describe(&self) -> Description {
        let threads = self.par.threads();
        let precision = match self.operands {
            Operands::F32 => "f32",
            Operands::Bf16 => "bf16",
        };
        Description { backend: "cpu", summary: format!("{threads} threads"), precision, threads, device: None }
    }
}

/// nanoGPT's `estimate_loss` at `step` of a run seeded by `seed`: the mean loss of `iters`
/// batches of each split, drawn from the run's evaluation streams for that step (the same
/// batches on every backend and frontend).
pub async fn estimate_loss(engine: &mut dyn Engine, splits: Splits<'_>, seed: u64, step: u64, iters: usize) -> Result<(f64, f64), String> {
    use crate::rng::{derive_seed, stream};
    let mut losses = [0.0; 2];
    for (loss, (split, s)) in losses.iter_mut().zip([(splits.train, stream::EVAL_TRAIN), (splits.val, stream::EVAL_VAL)]) {
        let mut rng = Rng::new(derive_seed(seed, s, step));
        *loss = engine.evaluate(split, iters, &mut rng).await?;
    }
    Ok((losses[0], losses[1]))
}

/// The training and validation ids a run draws from.
#[derive(Clone, Copy, Debug)]
pub struct Splits<'a> {
    /// Training batches (and the train loss of evaluations).
    pub train: Tokens<'a>,
    /// The val loss of evaluations.
    pub val: Tokens<'a>,
}

/// What the run's next action did (see [`Driver::next`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// nanoGPT's `estimate_loss` at `step`: the mean losses of both splits.
    Evaluated {
        /// The step evaluated.
        step: u64,
        /// On the training split.
        train_loss: f64,
        /// On the validation split.
        val_loss: f64,
    },
    /// A sample of the model at `step` ([`crate::run::SAMPLES`]), as token ids (none where
    /// the driver skips samples).
    Sampled {
        /// The step sampled.
        step: u64,
        /// The ids drawn after the tokenizer's sample start.
        ids: alloc::vec::Vec<u32>,
    },
    /// Step `step` trained; `log`: the run logs it (its report then has statistics).
    Trained {
        /// The step (its number before it ran).
        step: u64,
        /// Whether the run logs it.
        log: bool,
        /// What it reported.
        report: StepReport,
    },
    /// A checkpoint of the `step` steps taken is due (mid-run).
    Save {
        /// Steps taken.
        step: u64,
    },
    /// The run is at its end (`step` steps), or was asked to stop before a step.
    Finished {
        /// Steps taken.
        step: u64,
        /// Whether it stopped early (the `stop` check said so).
        stopped: bool,
    },
}

/// Drives an [`Engine`] through a run's [`crate::run::RunLoop`], the same for every frontend:
/// evaluations draw their batches from the run's seed and step, samples likewise, steps report
/// their statistics where the run logs them (or every step). The frontend carries out saves
/// and writes records from the [`Event`]s.
#[derive(Clone, Copy, Debug)]
pub struct Driver {
    run: crate::run::RunLoop,
    seed: u64,
    eval_iters: usize,
    report_every_step: bool,
    samples: bool,
}

impl Driver {
    /// A driver of a run with `cadence` starting at `step`, seeded by `seed`, evaluating on
    /// `eval_iters` batches per split, asking the logged steps for their statistics.
    pub fn new(cadence: crate::run::Cadence, step: u64, seed: u64, eval_iters: usize) -> Driver {
        Driver { run: crate::run::RunLoop::new(cadence, step), seed, eval_iters, report_every_step: false, samples: true }
    }

    /// Asks every step for its statistics (a device then waits for each).
    pub fn reporting_every_step(self) -> Driver {
        Driver { report_every_step: true, ..self }
    }

    /// Skips the samples (ranks other than the one that prints), as if done.
    pub fn without_samples(self) -> Driver {
        Driver { samples: false, ..self }
    }

    /// The loop it follows.
    pub fn run_loop(&self) -> &crate::run::RunLoop {
        &self.run
    }

    /// The loop it follows, to change (a run continued for longer).
    pub fn run_loop_mut(&mut self) -> &mut crate::run::RunLoop {
        &mut self.run
    }

    /// Carries out the run's next action on `engine` and says what it did. Before a step,
    /// `stop()` may end the run early (an interrupt, agreed between ranks). Samples start
    /// from `sample_start` (the tokenizer's).
    pub async fn next(
        &mut self,
        engine: &mut dyn Engine,
        splits: Splits<'_>,
        sample_start: u32,
        observer: &mut dyn Observer,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Event, StepError> {
        use crate::rng::{derive_seed, stream};
        use crate::run::Action;
        let action = self.run.next_action();
        let step = self.run.step();
        Ok(match action {
            Action::Evaluate => {
                let (train_loss, val_loss) = estimate_loss(engine, splits, self.seed, step, self.eval_iters).await.map_err(StepError::Device)?;
                Event::Evaluated { step, train_loss, val_loss }
            }
            Action::Sample if !self.samples => Event::Sampled { step, ids: alloc::vec::Vec::new() },
            Action::Sample => {
                let mut ids = alloc::vec::Vec::with_capacity(crate::run::SAMPLES.tokens);
                let mut rng = Rng::new(derive_seed(self.seed, stream::SAMPLES, step));
                engine.sample(&[sample_start], &crate::run::SAMPLES, &mut rng, &mut |id| ids.push(id)).await.map_err(StepError::Device)?;
                Event::Sampled { step, ids }
            }
            Action::Train { .. } if stop() => Event::Finished { step, stopped: true },
            Action::Train { log } => {
                let report = engine.step(splits.train, log || self.report_every_step, observer).await?;
                Event::Trained { step, log, report }
            }
            Action::Save => Event::Save { step },
            Action::Finish => Event::Finished { step, stopped: false },
        })
    }
}
