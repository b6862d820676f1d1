//! The model being trained, on the CPU or a GPU, behind one interface for `train` and `bench`:
//! a step (timed by phase, traced), the loss read every log interval, evaluation, samples, and
//! the state a checkpoint saves.
//!
//! On the CPU every step reports its loss. On the GPU a step is one submission and nothing is
//! read back until the loss is wanted (`report`), before a checkpoint, or while tracing; the
//! device counts the steps whose update it skipped (non-finite loss or norm), so a divergence
//! between two reads is still found.

use crate::device::{Backend, DeviceArgs};
use crate::peak::{gpu_peak, Peak};
use crate::sample::training_sample;
use crate::step::{timed_step, Phases};
use crate::trace::Trace;
use alpha_core::data::Tokens;
use alpha_core::model::Sampler;
use alpha_core::parallel::shard;
use alpha_core::parallel::{Parallel, ThreadPool};
use alpha_core::run::SAMPLES;
use alpha_core::tokenizer::{TextStream, Tokenizer};
use alpha_core::train::{LossScaleState, OneRank, OwnedMemory, Ranks, RunState, StepStats, TrainConfig, Trainer};
use alpha_core::{Plan, Rng};
use alpha_gpu::peak::Real;
use alpha_gpu::{block_on, GpuForward, GpuTrainer};
use serde_json::{json, Value};
use std::borrow::Cow;
use std::time::Instant;

/// Parameters and AdamW moments `(params, m, v)` in host layout: borrowed from CPU memory,
/// read back from a GPU.
pub type HostState<'a> = (Cow<'a, [f32]>, Cow<'a, [f32]>, Cow<'a, [f32]>);

/// What a step reports.
#[derive(Clone, Copy, Debug)]
pub struct StepReport {
    /// Loss, norm and learning rate (on the GPU only when asked for).
    pub stats: Option<StepStats>,
    /// With f16 products, read with the statistics: the loss scale and the overflowed steps.
    pub loss_scaling: Option<LossScaling>,
    /// Where the time went.
    pub phases: Phases,
}

/// Dynamic loss scaling's state, as a GPU with f16 products reports it.
#[derive(Clone, Copy, Debug)]
pub struct LossScaling {
    /// The scale the last step used.
    pub scale: f64,
    /// Steps since the last read that an f16 overflow skipped (the scale halved each time).
    pub skipped: u64,
}

/// Why a step failed.
#[derive(Clone, Debug, PartialEq)]
pub enum StepError {
    /// A non-finite loss or gradient norm: which step(s), and that nothing was applied.
    Diverged(String),
    /// The device failed (a readback, a lost device).
    Device(String),
}

/// Where an engine trains in a data-parallel run.
pub struct Placement<'m> {
    /// The ranks that share each step.
    pub ranks: &'m dyn Ranks<f32>,
    /// This process's place among the ranks on its machine (which GPU it takes).
    pub local_rank: usize,
    /// ZeRO-1: hold and update only this rank's shard of the AdamW moments.
    pub zero: bool,
}

/// The GPU side of [`Engine`].
pub struct GpuEngine<'m> {
    trainer: GpuTrainer,
    sampler: GpuForward,
    /// Learning rate of the last step.
    lr: f64,
    /// Steps taken since the statistics were last read.
    unread: u64,
    profiling: bool,
    /// The data-parallel group it trains in.
    ranks: &'m dyn Ranks<f32>,
}

/// A model being trained (one per run, so its size does not matter).
#[allow(clippy::large_enum_variant)]
pub enum Engine<'m> {
    /// On the CPU, in caller memory.
    Cpu {
        /// The trainer.
        trainer: Trainer<'m, f32>,
        /// Its thread pool.
        pool: &'m ThreadPool,
        /// Batch-1 memory for samples.
        sampler: Sampler<f32>,
        /// The data-parallel group it trains in.
        ranks: &'m dyn Ranks<f32>,
    },
    /// On a GPU.
    Gpu(GpuEngine<'m>),
}

impl<'m> Engine<'m> {
    /// An engine for `plan` on the backend `device` chooses, starting from `start`; on the
    /// CPU its arenas are allocated into `memory` and it runs on `pool`.
    pub fn new(
        device: &DeviceArgs,
        memory: &'m mut Option<OwnedMemory<f32>>,
        pool: &'m ThreadPool,
        plan: Plan,
        cfg: TrainConfig,
        start: RunState<f32>,
    ) -> Result<Self, String> {
        Engine::in_group(device, memory, pool, plan, cfg, start, Placement { ranks: &OneRank, local_rank: 0, zero: false })
    }

    /// [`Engine::new`] as one of a data-parallel run's ranks (see
    /// [`Trainer::train_step_ranked`] and [`GpuTrainer::step_ranked`]).
    pub fn in_group(
        device: &DeviceArgs,
        memory: &'m mut Option<OwnedMemory<f32>>,
        pool: &'m ThreadPool,
        plan: Plan,
        cfg: TrainConfig,
        start: RunState<f32>,
        placement: Placement<'m>,
    ) -> Result<Self, String> {
        let Placement { ranks: group, local_rank, zero } = placement;
        match device.backend {
            Backend::Cpu => {
                let moments = if zero { shard(plan.params_len(), group.ranks(), group.rank()) } else { 0..plan.params_len() };
                let mem = memory.insert(OwnedMemory::with_shard(&plan, moments).map_err(|e| e.to_string())?);
                let mut engine = Engine::cpu(mem, pool, plan, cfg, start)?;
                if let Engine::Cpu { ranks, .. } = &mut engine {
                    *ranks = group;
                }
                Ok(engine)
            }
            Backend::Gpu => {
                let gpu = device.open_gpu_local(local_rank)?;
                let sharding = if zero { group } else { &OneRank };
                let trainer = block_on(GpuTrainer::resume_sharded(gpu, plan, cfg, &start, sharding)).map_err(|e| e.to_string())?;
                Engine::on_gpu(trainer, group)
            }
        }
    }

    /// A CPU engine over `mem` (allocated for `plan`) continuing `start`.
    pub fn cpu(mem: &'m mut OwnedMemory<f32>, pool: &'m ThreadPool, plan: Plan, cfg: TrainConfig, start: RunState<f32>) -> Result<Self, String> {
        let trainer = mem.resume(plan, cfg, &start).map_err(|e| e.to_string())?;
        let sampler = Sampler::new(plan.config, plan.classes(), plan.config.block_size).map_err(|e| e.to_string())?;
        Ok(Engine::Cpu { trainer, pool, sampler, ranks: &OneRank })
    }

    /// A GPU engine over `trainer`, one of `ranks`.
    fn on_gpu(trainer: GpuTrainer, ranks: &'m dyn Ranks<f32>) -> Result<Self, String> {
        let sampler = trainer.forward_model(1, trainer.plan.config.block_size).map_err(|e| e.to_string())?;
        Ok(Engine::Gpu(GpuEngine { trainer, sampler, lr: 0.0, unread: 0, profiling: false, ranks }))
    }

    /// Optimizer steps taken.
    pub fn step_count(&self) -> u64 {
        match self {
            Engine::Cpu { trainer, .. } => trainer.step,
            Engine::Gpu(g) => g.trainer.step,
        }
    }

    /// The batch generator's state.
    pub fn rng(&self) -> &Rng {
        match self {
            Engine::Cpu { trainer, .. } => &trainer.rng,
            Engine::Gpu(g) => &g.trainer.rng,
        }
    }

    /// One optimizer step on batches from `data`, traced while `trace` is active. With
    /// `report` the step's loss is returned (on the GPU that waits for the step).
    pub fn step(&mut self, data: Tokens<'_>, trace: Option<&mut Trace>, report: bool) -> Result<StepReport, StepError> {
        match self {
            Engine::Cpu { trainer, pool, ranks, .. } => {
                let s = timed_step(trainer, pool, data, trace, *ranks).map_err(|e| StepError::Diverged(e.to_string()))?;
                Ok(StepReport { stats: Some(StepStats { loss: s.loss, grad_norm: s.grad_norm, lr: s.lr }), loss_scaling: None, phases: s.phases })
            }
            Engine::Gpu(g) => g.step(data, trace.filter(|t| t.active()), report),
        }
    }

    /// Confirms that every step so far was applied (the GPU reads its statistics if steps
    /// ran since the last read): call before saving a checkpoint.
    pub fn check(&mut self) -> Result<(), StepError> {
        match self {
            Engine::Cpu { .. } => Ok(()),
            Engine::Gpu(g) if g.unread > 0 => g.read_stats().map(|_| ()),
            Engine::Gpu(_) => Ok(()),
        }
    }

    /// nanoGPT's `estimate_loss` for one split: the mean loss of `iters` batches drawn with `rng`.
    pub fn evaluate(&mut self, data: Tokens<'_>, iters: usize, rng: &mut Rng) -> Result<f64, String> {
        match self {
            Engine::Cpu { trainer, pool, ranks, .. } => Ok(trainer.evaluate_ranked(*pool, data, iters, rng, *ranks)),
            Engine::Gpu(g) => block_on(g.trainer.evaluate_ranked(data, iters, rng, g.ranks)).map_err(|e| e.to_string()),
        }
    }

    /// A sample of the current model (see [`SAMPLES`]).
    pub fn sample(&mut self, tok: &Tokenizer, seed: u64) -> Result<String, String> {
        match self {
            Engine::Cpu { trainer, pool, sampler, .. } => Ok(training_sample(sampler, pool, trainer.mem.params, tok, seed)),
            Engine::Gpu(g) => {
                let (mut text, mut out) = (TextStream::default(), String::new());
                let emit = |id| out.push_str(&text.push(&tok.token_bytes(id)));
                block_on(g.sampler.generate(&[tok.sample_start()], &SAMPLES, &mut Rng::new(seed), emit)).map_err(|e| e.to_string())?;
                Ok(out + &text.finish())
            }
        }
    }

    /// Parameters and AdamW moments `(params, m, v)` in host layout, for a checkpoint (the
    /// GPU reads them back). With ZeRO-1 every rank must call it (rank 0 collects the
    /// moments' shards; the others get empty moments).
    pub fn state(&self) -> Result<HostState<'_>, String> {
        match self {
            Engine::Cpu { trainer, ranks, .. } if trainer.sharded() => {
                let m = &trainer.mem;
                let whole = |mine: &[f32]| -> Result<Vec<f32>, String> {
                    let len = if ranks.rank() == 0 { trainer.plan.params_len() } else { 0 };
                    let mut all = alpha_core::plan::try_vec("the AdamW moments of a checkpoint", len, 0.0).map_err(|e| e.to_string())?;
                    ranks.collect_shards(mine, &mut all);
                    Ok(all)
                };
                Ok((Cow::Borrowed(&*m.params), Cow::Owned(whole(m.adam_m)?), Cow::Owned(whole(m.adam_v)?)))
            }
            Engine::Cpu { trainer, .. } => {
                let m = &trainer.mem;
                Ok((Cow::Borrowed(&*m.params), Cow::Borrowed(&*m.adam_m), Cow::Borrowed(&*m.adam_v)))
            }
            Engine::Gpu(g) => {
                let (p, m, v) = block_on(g.trainer.download_ranked(g.ranks)).map_err(|e| e.to_string())?;
                Ok((Cow::Owned(p), Cow::Owned(m), Cow::Owned(v)))
            }
        }
    }

    /// Where it runs, for the start line: `"2 threads"` or `"GPU <adapter> (<backend>)"`.
    pub fn describe(&self) -> String {
        match self {
            Engine::Cpu { pool, .. } => format!("{} threads", pool.threads()),
            Engine::Gpu(g) => {
                let a = &g.trainer.gpu().adapter;
                format!("GPU {} ({})", a.name, a.backend)
            }
        }
    }

    /// The peak MFU is measured against: `given`, else the CPU's GEMM peak for `pool`'s
    /// threads or the GPU's limit for the arithmetic its products run (measured on the
    /// engine's own device): the tensor cores' where its products run there, else the f32 FMA limit
    /// (f16 products on the SIMT kernels round their operands but multiply and sum in f32).
    /// Each is measured once and cached.
    pub fn peak(&self, pool: &ThreadPool, given: Option<f64>) -> Result<Peak, String> {
        match self {
            Engine::Cpu { .. } => crate::peak::peak(pool, given),
            Engine::Gpu(g) => {
                let gpu = g.trainer.gpu();
                gpu_peak(gpu, if gpu.tensor_cores() { Real::Tensor } else { Real::F32 }, given, false)
            }
        }
    }

    /// Dynamic loss scaling's state, for a checkpoint (GPU runs with f16 products).
    pub fn loss_scale(&self) -> Result<Option<LossScaleState>, String> {
        match self {
            Engine::Cpu { .. } => Ok(None),
            Engine::Gpu(g) => block_on(g.trainer.loss_scale()).map_err(|e| e.to_string()),
        }
    }

    /// Continues loss scaling from a checkpoint's `state` (where the run has loss scaling).
    pub fn set_loss_scale(&mut self, state: LossScaleState) {
        if let Engine::Gpu(g) = self {
            g.trainer.set_loss_scale(state);
        }
    }

    /// The GPU it trains on, if it does.
    pub fn gpu(&self) -> Option<&alpha_gpu::Gpu> {
        match self {
            Engine::Cpu { .. } => None,
            Engine::Gpu(g) => Some(g.trainer.gpu()),
        }
    }

    /// The precision of the model's arithmetic, for records (see
    /// [`crate::device::precision_name`]; the CPU's is f32).
    pub fn precision(&self) -> &'static str {
        self.gpu().map_or("f32", crate::device::precision_name)
    }

    /// The device for reports: null on the CPU; adapter, kernels and submits per step, device
    /// memory and the buffers the activations take on the GPU.
    pub fn device_json(&self) -> Value {
        match self {
            Engine::Cpu { .. } => Value::Null,
            Engine::Gpu(g) => {
                let t = &g.trainer;
                let a = &t.gpu().adapter;
                json!({
                    "adapter": a.name,
                    "backend": a.backend,
                    "device_type": a.device_type,
                    "kernels_per_step": t.kernels_per_step(),
                    "submits_per_step": 1,
                    "device_memory_mib": t.device_bytes() as f64 / 1048576.0,
                    "activation_buffers": t.activation_buffers(),
                })
            }
        }
    }
}

impl GpuEngine<'_> {
    fn step(&mut self, data: Tokens<'_>, mut trace: Option<&mut Trace>, report: bool) -> Result<StepReport, StepError> {
        let device = |e: alpha_gpu::GpuError| StepError::Device(e.to_string());
        if trace.is_some() != self.profiling {
            self.trainer.set_profiling(trace.is_some()).map_err(device)?;
            self.profiling = trace.is_some();
        }
        let step = self.trainer.step;
        let start = Instant::now();
        self.lr = block_on(self.trainer.step_ranked(data, self.ranks)).map_err(device)?;
        self.unread += 1;
        let submitted = Instant::now();
        let (stats, loss_scaling) = if report || trace.is_some() { self.read_stats().map(|(s, l)| (Some(s), l))? } else { (None, None) };
        let done = Instant::now();
        let mut phases = Phases { submit: (submitted - start).as_secs_f64(), device_wait: (done - submitted).as_secs_f64(), ..Phases::default() };
        phases.close((done - start).as_secs_f64());
        if let Some(t) = trace.as_mut() {
            let kernels = block_on(self.trainer.kernel_times()).map_err(device)?;
            t.span("submit", start, submitted, Value::Null);
            t.span("device_wait", submitted, done, Value::Null);
            t.gpu_kernels(start..submitted, done, &kernels);
            t.span("step", start, done, json!({"step": step, "loss": stats.map(|s| s.loss)}));
            t.step_done();
        }
        Ok(StepReport { stats, loss_scaling, phases })
    }

    /// The last step's statistics (and with f16 products the loss scaling's); an error if a
    /// step since the last read had a non-finite loss, or with f32 products any skipped step.
    fn read_stats(&mut self) -> Result<(StepStats, Option<LossScaling>), StepError> {
        let s = block_on(self.trainer.stats(self.lr)).map_err(|e| StepError::Device(e.to_string()))?;
        let (unread, step) = (std::mem::take(&mut self.unread), self.trainer.step);
        if s.non_finite_losses > 0 {
            let n = s.non_finite_losses;
            let which = if unread == 1 { format!("step {}", step - 1) } else { format!("{n} of steps {}..={}", step - unread, step - 1) };
            return Err(StepError::Diverged(format!(
                "{which}: the loss or gradient norm was not finite (last step: loss {}, gradient norm {}); those updates were not applied",
                s.last.loss, s.last.grad_norm
            )));
        }
        Ok((s.last, s.loss_scale.map(|scale| LossScaling { scale, skipped: s.skipped })))
    }
}
