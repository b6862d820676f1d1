//! Where the page trains: the registration of its backends. [`open`] opens alpha-gpu's
//! engine on WebGPU or alpha-core's CPU engine in WebAssembly (on every core where the page
//! runs the threads build: `threads`), which the page then drives through alpha-core's one
//! interface, `Engine`, and the [`Peak`] the page's MFU is taken against. Every call is
//! async: WebGPU readbacks resolve on the browser's event loop, and the page stays responsive
//! between them.

use crate::options::BackendChoice;
use alpha_core::engine::{CpuEngine, Engine};
use alpha_core::parallel::Parallel;
use alpha_core::train::{OneRank, RunState, TrainConfig};
use alpha_core::{Plan, Serial};
use alpha_gpu::peak::Real;
use alpha_gpu::{Gpu, GpuEngine, GpuTrainer, TensorCores};
use std::sync::Arc;

/// Where the page's engine computes, for measuring its peak (MFU's denominator), as
/// `alpha-native` measures it: the CPU's GEMM on the engine's own threads, or WebGPU's f32
/// FMA limit on the engine's device (its f16 products round their operands but multiply and
/// sum in f32).
pub enum Peak {
    /// The CPU engine's threads.
    Cpu(Arc<dyn Parallel + Send>),
    /// The GPU engine's device.
    Gpu(Box<Gpu>),
}

impl Peak {
    /// Measures the peak in GFLOP/s (the CPU's up to about 1.5 s, WebGPU's under a second),
    /// on the page's clock.
    pub async fn measure(&self) -> Result<f64, String> {
        let now = || crate::now_ms() / 1e3;
        match self {
            Peak::Cpu(par) => Ok(alpha_core::gemm::peak_gflops(par, &now)),
            Peak::Gpu(gpu) => alpha_gpu::peak::measure(gpu, Real::F32, &now).await.map_err(|e| e.to_string()),
        }
    }
}

/// An engine on the chosen backend, where it computes, and, with `Auto`, why the CPU when
/// WebGPU cannot be used. `threads`: the CPU engine's threads (1 unless this is the threads
/// build).
pub async fn open(
    choice: BackendChoice,
    plan: Plan,
    cfg: TrainConfig,
    start: RunState<f32>,
    threads: usize,
) -> Result<(Box<dyn Engine>, Peak, Option<String>), String> {
    if choice == BackendChoice::Cpu {
        let (engine, peak) = cpu(plan, cfg, start, threads).await?;
        return Ok((engine, peak, None));
    }
    match gpu(plan, cfg, &start).await {
        Ok((engine, peak)) => Ok((engine, peak, None)),
        Err(e) if choice == BackendChoice::Auto => {
            let (engine, peak) = cpu(plan, cfg, start, threads).await?;
            Ok((engine, peak, Some(e)))
        }
        Err(e) => Err(e),
    }
}

async fn cpu(plan: Plan, cfg: TrainConfig, start: RunState<f32>, threads: usize) -> Result<(Box<dyn Engine>, Peak), String> {
    let par = threads_pool(threads).await?;
    let engine = CpuEngine::new(par.clone(), &OneRank, plan, cfg, start).map_err(|e| e.to_string())?;
    Ok((Box::new(engine), Peak::Cpu(par)))
}

async fn gpu(plan: Plan, cfg: TrainConfig, start: &RunState<f32>) -> Result<(Box<dyn Engine>, Peak), String> {
    // Mixed precision where the adapter has shader-f16 (f16 products, loss scaling); no
    // tensor cores (their GEMM needs wgpu's native-only cooperative matrices).
    let gpu = Gpu::open_local(None, 0, None, TensorCores::Off).await.map_err(|e| format!("WebGPU is not available: {e}"))?;
    let trainer = GpuTrainer::resume(gpu.clone(), plan, cfg, start).await.map_err(|e| e.to_string())?;
    Ok((Box::new(GpuEngine::new(trainer, &OneRank).map_err(|e| e.to_string())?), Peak::Gpu(Box::new(gpu))))
}

/// The CPU engine's threads: a pool of `threads` in the threads build, else this one.
#[cfg(target_feature = "atomics")]
async fn threads_pool(threads: usize) -> Result<Arc<dyn Parallel + Send>, String> {
    Ok(match threads {
        0 | 1 => Arc::new(Serial),
        n => Arc::new(crate::threads::pool(n).await?),
    })
}

/// The CPU engine's threads: this one (a build without WebAssembly threads).
#[cfg(not(target_feature = "atomics"))]
async fn threads_pool(_threads: usize) -> Result<Arc<dyn Parallel + Send>, String> {
    Ok(Arc::new(Serial))
}
