//! Where the page trains: the registration of its backends. [`open`] opens alpha-gpu's
//! engine on WebGPU or alpha-core's CPU engine in WebAssembly (on every core where the page
//! runs the threads build: `threads`), which the page then drives through alpha-core's one
//! interface, `Engine`. Every call is async: WebGPU readbacks resolve on the browser's event
//! loop, and the page stays responsive between them.

use crate::options::BackendChoice;
use alpha_core::engine::{CpuEngine, Engine};
use alpha_core::parallel::Parallel;
use alpha_core::train::{OneRank, RunState, TrainConfig};
use alpha_core::{Plan, Serial};
use alpha_gpu::{Gpu, GpuEngine, GpuTrainer, TensorCores};

/// An engine on the chosen backend; with `Auto`, the CPU when WebGPU cannot be used, and why
/// (returned beside it). `threads`: the CPU engine's threads (1 unless this is the threads
/// build).
pub async fn open(
    choice: BackendChoice,
    plan: Plan,
    cfg: TrainConfig,
    start: RunState<f32>,
    threads: usize,
) -> Result<(Box<dyn Engine>, Option<String>), String> {
    if choice == BackendChoice::Cpu {
        return Ok((cpu(plan, cfg, start, threads).await?, None));
    }
    match gpu(plan, cfg, &start).await {
        Ok(engine) => Ok((engine, None)),
        Err(e) if choice == BackendChoice::Auto => Ok((cpu(plan, cfg, start, threads).await?, Some(e))),
        Err(e) => Err(e),
    }
}

async fn cpu(plan: Plan, cfg: TrainConfig, start: RunState<f32>, threads: usize) -> Result<Box<dyn Engine>, String> {
    let par = threads_pool(threads).await?;
    Ok(Box::new(CpuEngine::new(par, &OneRank, plan, cfg, start).map_err(|e| e.to_string())?))
}

async fn gpu(plan: Plan, cfg: TrainConfig, start: &RunState<f32>) -> Result<Box<dyn Engine>, String> {
    // Mixed precision where the adapter has shader-f16 (f16 products, loss scaling); no
    // tensor cores (their GEMM needs wgpu's native-only cooperative matrices).
    let gpu = Gpu::open_local(None, 0, None, TensorCores::Off).await.map_err(|e| format!("WebGPU is not available: {e}"))?;
    let trainer = GpuTrainer::resume(gpu, plan, cfg, start).await.map_err(|e| e.to_string())?;
    Ok(Box::new(GpuEngine::new(trainer, &OneRank).map_err(|e| e.to_string())?))
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
