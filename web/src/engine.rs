//! The model being trained in the page: alpha-gpu on WebGPU, or alpha-core's CPU kernels in
//! WebAssembly (on every core where the page runs the threads build: `threads`). Every call is
//! async: WebGPU readbacks resolve on the browser's event loop, and the page stays responsive
//! between them.

use crate::options::BackendChoice;
use alpha_core::data::Tokens;
use alpha_core::model::{Sampler, SamplingConfig};
use alpha_core::parallel::Parallel;
use alpha_core::train::{LossScaleState, OwnedMemory, RunState, TrainConfig};
use alpha_core::{Plan, Rng, Serial};
use alpha_gpu::{Gpu, GpuForward, GpuTrainer, Precision, TensorCores};

/// The CPU engine: the arenas, and the training state between calls (a core `Trainer`
/// borrows the arenas for the length of one call).
pub struct CpuEngine {
    /// The threads the kernels run on.
    par: Box<dyn Parallel>,
    plan: Plan,
    cfg: TrainConfig,
    mem: OwnedMemory<f32>,
    step: u64,
    rng: Rng,
    sampler: Sampler<f32>,
}

/// The WebGPU engine.
pub struct GpuEngine {
    trainer: GpuTrainer,
    sampler: GpuForward,
}

/// A model being trained.
pub enum Engine {
    Cpu(Box<CpuEngine>),
    Gpu(Box<GpuEngine>),
}

impl Engine {
    /// An engine on the chosen backend; with `Auto`, the CPU when WebGPU cannot be used, and
    /// why (returned beside it).
    /// `threads`: the CPU engine's threads (1 unless this is the threads build).
    pub async fn new(choice: BackendChoice, plan: Plan, cfg: TrainConfig, start: RunState<f32>, threads: usize) -> Result<(Engine, Option<String>), String> {
        if choice == BackendChoice::Cpu {
            return Ok((Engine::cpu(plan, cfg, start, threads).await?, None));
        }
        match Engine::gpu(plan, cfg, &start).await {
            Ok(engine) => Ok((engine, None)),
            Err(e) if choice == BackendChoice::Auto => Ok((Engine::cpu(plan, cfg, start, threads).await?, Some(e))),
            Err(e) => Err(e),
        }
    }

    async fn cpu(plan: Plan, cfg: TrainConfig, start: RunState<f32>, threads: usize) -> Result<Engine, String> {
        let mut mem = OwnedMemory::<f32>::new(&plan).map_err(|e| e.to_string())?;
        mem.resume(plan, cfg, &start).map_err(|e| e.to_string())?;
        let sampler = Sampler::new(plan.config, plan.classes(), plan.config.block_size).map_err(|e| e.to_string())?;
        let par = threads_pool(threads).await?;
        Ok(Engine::Cpu(Box::new(CpuEngine { par, plan, cfg, mem, step: start.step, rng: start.rng, sampler })))
    }

    async fn gpu(plan: Plan, cfg: TrainConfig, start: &RunState<f32>) -> Result<Engine, String> {
        // Mixed precision where the adapter has shader-f16 (f16 products, loss scaling); no
        // tensor cores (their GEMM needs wgpu's native-only cooperative matrices).
        let gpu = Gpu::open_local(None, 0, None, TensorCores::Off).await.map_err(|e| format!("WebGPU is not available: {e}"))?;
        let trainer = GpuTrainer::resume(gpu, plan, cfg, start).await.map_err(|e| e.to_string())?;
        let sampler = trainer.forward_model(1, plan.config.block_size).map_err(|e| e.to_string())?;
        Ok(Engine::Gpu(Box::new(GpuEngine { trainer, sampler })))
    }

    /// One optimizer step on batches from `data`; its loss. An error (and no update) when
    /// the loss or gradient norm is not finite.
    pub async fn step(&mut self, data: Tokens<'_>) -> Result<f64, String> {
        match self {
            Engine::Cpu(c) => c.with_trainer(|t, par| t.train_step(par, data).map(|s| s.loss).map_err(|e| format!("training diverged at {e}")))?,
            Engine::Gpu(g) => {
                let lr = g.trainer.step(data);
                let s = g.trainer.stats(lr).await.map_err(|e| e.to_string())?;
                // An f16 overflow only skips the step (and halves the loss scale).
                if s.non_finite_losses > 0 {
                    return Err(format!(
                        "training diverged at step {}: loss is {}, gradient norm is {}; the update was not applied",
                        g.trainer.step - 1,
                        s.last.loss,
                        s.last.grad_norm
                    ));
                }
                Ok(s.last.loss)
            }
        }
    }

    /// The mean loss of `iters` batches of `data` drawn with `rng`.
    pub async fn evaluate(&mut self, data: Tokens<'_>, iters: usize, rng: &mut Rng) -> Result<f64, String> {
        match self {
            Engine::Cpu(c) => c.with_trainer(|t, par| Ok(t.evaluate(par, data, iters, rng)))?,
            Engine::Gpu(g) => g.trainer.evaluate(data, iters, rng).await.map_err(|e| e.to_string()),
        }
    }

    /// `cfg.tokens` token ids after `prompt`.
    pub async fn sample(&mut self, prompt: &[u32], cfg: &SamplingConfig, rng: &mut Rng) -> Result<Vec<u32>, String> {
        let mut out = Vec::with_capacity(cfg.tokens);
        match self {
            Engine::Cpu(c) => c.sampler.generate(&*c.par, &c.mem.params, prompt, cfg, rng, |id| out.push(id)),
            Engine::Gpu(g) => g.sampler.generate(prompt, cfg, rng, |id| out.push(id)).await.map_err(|e| e.to_string())?,
        }
        Ok(out)
    }

    /// Parameters and AdamW moments `(params, m, v)` in plan order.
    pub async fn state(&self) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>), String> {
        match self {
            Engine::Cpu(c) => Ok((c.mem.params.clone(), c.mem.adam_m.clone(), c.mem.adam_v.clone())),
            Engine::Gpu(g) => g.trainer.download().await.map_err(|e| e.to_string()),
        }
    }

    /// Optimizer steps taken.
    pub fn step_count(&self) -> u64 {
        match self {
            Engine::Cpu(c) => c.step,
            Engine::Gpu(g) => g.trainer.step,
        }
    }

    /// The batch generator.
    pub fn rng(&self) -> Rng {
        match self {
            Engine::Cpu(c) => c.rng,
            Engine::Gpu(g) => g.trainer.rng,
        }
    }

    /// The training plan.
    pub fn plan(&self) -> &Plan {
        match self {
            Engine::Cpu(c) => &c.plan,
            Engine::Gpu(g) => &g.trainer.plan,
        }
    }

    /// `"webgpu"` or `"cpu"`.
    pub fn backend_name(&self) -> &'static str {
        match self {
            Engine::Cpu(_) => "cpu",
            Engine::Gpu(_) => "webgpu",
        }
    }

    /// The arithmetic of the model's products, "f32" or "f16" (WebGPU with shader-f16), and
    /// on WebGPU without shader-f16 why not f16.
    pub fn precision(&self) -> (&'static str, Option<String>) {
        match self {
            Engine::Gpu(g) if g.trainer.gpu().precision == Precision::F16 => ("f16", None),
            Engine::Gpu(g) => ("f32", Some(format!("{} lacks shader-f16", g.trainer.gpu().adapter.name))),
            Engine::Cpu(_) => ("f32", None),
        }
    }

    /// Dynamic loss scaling's state, for a checkpoint (WebGPU with f16 products).
    pub async fn loss_scale(&self) -> Result<Option<LossScaleState>, String> {
        match self {
            Engine::Cpu(_) => Ok(None),
            Engine::Gpu(g) => g.trainer.loss_scale().await.map_err(|e| e.to_string()),
        }
    }

    /// Continues loss scaling from a checkpoint's `state` (where the run has loss scaling).
    pub fn set_loss_scale(&mut self, state: LossScaleState) {
        if let Engine::Gpu(g) = self {
            g.trainer.set_loss_scale(state);
        }
    }

    /// The WebGPU adapter's name.
    pub fn adapter(&self) -> Option<String> {
        match self {
            Engine::Cpu(_) => None,
            Engine::Gpu(g) => Some(g.trainer.gpu().adapter.name.clone()),
        }
    }

    /// The threads the CPU engine runs on (1 on WebGPU).
    pub fn threads(&self) -> usize {
        match self {
            Engine::Cpu(c) => c.par.threads(),
            Engine::Gpu(_) => 1,
        }
    }

    /// The CPU's GEMM kernel (`wasm-simd128` or `wasm-relaxed-simd`, after the build).
    pub fn cpu_kernel(&self) -> Option<&'static str> {
        match self {
            Engine::Cpu(_) => Some(alpha_core::gemm::f32_kernel_name()),
            Engine::Gpu(_) => None,
        }
    }
}

/// The CPU engine's threads: a pool of `threads` in the threads build, else this one.
#[cfg(target_feature = "atomics")]
async fn threads_pool(threads: usize) -> Result<Box<dyn Parallel>, String> {
    Ok(match threads {
        0 | 1 => Box::new(Serial),
        n => Box::new(crate::threads::pool(n).await?),
    })
}

/// The CPU engine's threads: this one (a build without WebAssembly threads).
#[cfg(not(target_feature = "atomics"))]
async fn threads_pool(_threads: usize) -> Result<Box<dyn Parallel>, String> {
    Ok(Box::new(Serial))
}

impl CpuEngine {
    /// Runs `f` with a core trainer over the arenas and the engine's threads, keeping the
    /// trainer's step and generator after.
    fn with_trainer<R>(&mut self, f: impl FnOnce(&mut alpha_core::train::Trainer<'_, f32>, &dyn Parallel) -> R) -> Result<R, String> {
        let mut t = self.mem.trainer(self.plan, self.cfg, self.rng).map_err(|e| e.to_string())?;
        t.step = self.step;
        let r = f(&mut t, &*self.par);
        self.step = t.step;
        self.rng = t.rng;
        Ok(r)
    }
}
