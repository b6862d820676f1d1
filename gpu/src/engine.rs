//! The GPU's [`Engine`] (alpha-core's one interface a run trains through): a [`GpuTrainer`]
//! with a batch-1 [`GpuForward`] over its weights for samples.
//!
//! A step is one submission, and nothing is read back until the step's statistics are asked
//! for, before a checkpoint, or while the kernels are timed; the device counts the steps whose
//! update it skipped (a non-finite loss or norm, or with f16 products an overflow, which only
//! halves the loss scale), so a divergence between two reads is still found.

use crate::context::{Gpu, GpuError, Precision};
use crate::forward::GpuForward;
use crate::trainer::GpuTrainer;
use alpha_core::data::Tokens;
use alpha_core::engine::{Description, DeviceDescription, Engine, HostState, LossScaling, Pending, StepError, StepReport};
use alpha_core::model::SamplingConfig;
use alpha_core::tape::{Observer, Phase};
use alpha_core::train::{LossScaleState, Ranks, StepStats};
use alpha_core::{Plan, Rng};
use std::borrow::Cow;

/// A model training on a GPU, one of `ranks` in a data-parallel run.
pub struct GpuEngine<'r> {
    trainer: GpuTrainer,
    sampler: GpuForward,
    ranks: &'r dyn Ranks<f32>,
    /// Learning rate of the last step.
    lr: f64,
    /// Steps taken since the statistics were last read.
    unread: u64,
    /// Whether the kernels are being timed.
    profiling: bool,
}

impl<'r> GpuEngine<'r> {
    /// An engine over `trainer`, one of `ranks`.
    pub fn new(trainer: GpuTrainer, ranks: &'r dyn Ranks<f32>) -> Result<Self, GpuError> {
        let sampler = trainer.forward_model(1, trainer.plan.config.block_size)?;
        Ok(GpuEngine { trainer, sampler, ranks, lr: 0.0, unread: 0, profiling: false })
    }

    /// The device it trains on.
    pub fn gpu(&self) -> &Gpu {
        self.trainer.gpu()
    }

    /// The last step's statistics (and with f16 products the loss scaling's); an error if a
    /// step since the last read had a non-finite loss, or with f32 products any skipped step.
    async fn read_stats(&mut self) -> Result<(StepStats, Option<LossScaling>), StepError> {
        let s = self.trainer.stats(self.lr).await.map_err(|e| StepError::Device(e.to_string()))?;
        let (unread, step) = (std::mem::take(&mut self.unread), self.trainer.step);
        if s.non_finite_losses > 0 {
            return Err(StepError::skipped_updates(s.non_finite_losses, unread, step, &s.last));
        }
        Ok((s.last, s.loss_scale.map(|scale| LossScaling { scale, skipped: s.skipped })))
    }

    async fn step_traced(&mut self, data: Tokens<'_>, report: bool, observer: &mut dyn Observer) -> Result<StepReport, StepError> {
        let device = |e: GpuError| StepError::Device(e.to_string());
        let timed = observer.wants_kernel_times();
        if timed != self.profiling {
            self.trainer.set_profiling(timed).map_err(device)?;
            self.profiling = timed;
        }
        observer.phase_begin(Phase::Submit);
        self.lr = self.trainer.step_ranked(data, self.ranks).await.map_err(device)?;
        self.unread += 1;
        observer.phase_end(Phase::Submit);
        if !(report || timed) {
            return Ok(StepReport { stats: None, loss_scaling: None });
        }
        observer.phase_begin(Phase::DeviceWait);
        let (stats, loss_scaling) = self.read_stats().await?;
        observer.phase_end(Phase::DeviceWait);
        if timed {
            observer.kernel_times(&self.trainer.kernel_times().await.map_err(device)?);
        }
        Ok(StepReport { stats: Some(stats), loss_scaling })
    }
}

/// The arithmetic of `gpu`'s products, as records and messages name it.
pub fn precision_name(gpu: &Gpu) -> &'static str {
    match gpu.precision {
        Precision::F16 if gpu.tensor_cores() => "f16 (tensor cores)",
        Precision::F16 => "f16",
        Precision::F32 => "f32",
    }
}

impl Engine for GpuEngine<'_> {
    fn step<'a>(&'a mut self, data: Tokens<'a>, report: bool, observer: &'a mut dyn Observer) -> Pending<'a, Result<StepReport, StepError>> {
        Box::pin(self.step_traced(data, report, observer))
    }

    fn check(&mut self) -> Pending<'_, Result<(), StepError>> {
        Box::pin(async move {
            if self.unread > 0 {
                self.read_stats().await?;
            }
            Ok(())
        })
    }

    fn evaluate<'a>(&'a mut self, data: Tokens<'a>, iters: usize, rng: &'a mut Rng) -> Pending<'a, Result<f64, String>> {
        Box::pin(async move { self.trainer.evaluate_ranked(data, iters, rng, self.ranks).await.map_err(|e| e.to_string()) })
    }

    fn sample<'a>(&'a mut self, prompt: &'a [u32], cfg: &'a SamplingConfig, rng: &'a mut Rng, emit: &'a mut dyn FnMut(u32)) -> Pending<'a, Result<(), String>> {
        Box::pin(async move { self.sampler.generate(prompt, cfg, rng, emit).await.map_err(|e| e.to_string()) })
    }

    fn state(&self) -> Pending<'_, Result<HostState<'_>, String>> {
        Box::pin(async move {
            let (p, m, v) = self.trainer.download_ranked(self.ranks).await.map_err(|e| e.to_string())?;
            Ok((Cow::Owned(p), Cow::Owned(m), Cow::Owned(v)))
        })
    }

    fn loss_scale(&self) -> Pending<'_, Result<Option<LossScaleState>, String>> {
        Box::pin(async move { self.trainer.loss_scale().await.map_err(|e| e.to_string()) })
    }

    fn set_loss_scale(&mut self, state: LossScaleState) {
        self.trainer.set_loss_scale(state);
    }

    fn step_count(&self) -> u64 {
        self.trainer.step
    }

    fn rng(&self) -> Rng {
        self.trainer.rng
    }

    fn plan(&self) -> &Plan {
        &self.trainer.plan
    }

    fn describe(&self) -> Description {
        let t = &self.trainer;
        let a = &t.gpu().adapter;
        Description {
            backend: "gpu",
            summary: format!("GPU {} ({})", a.name, a.backend),
            precision: precision_name(t.gpu()),
            threads: 1,
            device: Some(DeviceDescription {
                adapter: a.name.clone(),
                platform: a.backend.clone(),
                device_type: a.device_type.clone(),
                kernels_per_step: t.kernels_per_step(),
                submits_per_step: 1,
                memory_bytes: t.device_bytes(),
                activation_buffers: t.activation_buffers(),
            }),
        }
    }
}
