//! Where `train`, `bench` and `info` train: the registration of the backends. `--backend`
//! picks one and [`open`] opens its engine (alpha-core's [`CpuEngine`] on the thread pool,
//! alpha-gpu's [`GpuEngine`] on the device), which the commands then drive through
//! alpha-core's one interface, [`Engine`]; what only the CLI needs of a backend (the peak
//! MFU is measured against) is here too. A new backend is one more arm of each.

use crate::device::{Backend, DeviceArgs};
use crate::peak::{gpu_peak, Peak};
use alpha_core::engine::{CpuEngine, Description, Engine};
use alpha_core::parallel::ThreadPool;
use alpha_core::train::{OneRank, Ranks, RunState, TrainConfig};
use alpha_core::Plan;
use alpha_gpu::peak::Real;
use alpha_gpu::{block_on, Gpu, GpuEngine, GpuTrainer};
use anyhow::Result;
use serde_json::{json, Value};

/// Where an engine trains in a data-parallel run.
pub struct Placement<'m> {
    /// The ranks that share each step.
    pub ranks: &'m dyn Ranks<f32>,
    /// This process's place among the ranks on its machine (which GPU it takes).
    pub local_rank: usize,
    /// ZeRO-1: hold and update only this rank's shard of the AdamW moments.
    pub zero: bool,
}

impl Placement<'_> {
    /// A process training on its own.
    pub fn alone() -> Placement<'static> {
        Placement { ranks: &OneRank, local_rank: 0, zero: false }
    }
}

/// An engine as the CLI holds it: any backend's, and its device where it has one.
pub struct Opened<'m> {
    /// The model being trained.
    pub engine: Box<dyn Engine + 'm>,
    /// The wgpu GPU it trains on, if it does (its arithmetic, its peak).
    pub gpu: Option<Gpu>,
    /// On a CUDA device: its arithmetic and peak.
    pub cuda: Option<CudaOpened>,
}

/// What the CLI keeps of a CUDA engine's opening.
pub struct CudaOpened {
    /// The run's line saying which precision the products run, and why.
    pub precision_line: String,
    /// `--precision` resolved (`f32`, `bf16`), for the run file.
    pub precision: &'static str,
    /// Whether TF32 is allowed (`--tf32`).
    pub tf32: bool,
    /// The products' measured peak in that arithmetic, for MFU.
    pub peak: Peak,
}

/// Opens the engine `device` chooses for `plan`, continuing `start`; the CPU's runs on `pool`.
pub fn open<'m>(device: &DeviceArgs, pool: &'m ThreadPool, plan: Plan, cfg: TrainConfig, start: RunState<f32>, placement: Placement<'m>) -> Result<Opened<'m>> {
    let Placement { ranks, local_rank, zero } = placement;
    match device.backend {
        Backend::Cpu => {
            let engine = CpuEngine::in_group(pool, ranks, zero, plan, cfg, start)?.with_operands(device.cpu_operands()?.0)?;
            Ok(Opened { engine: Box::new(engine), gpu: None, cuda: None })
        }
        Backend::Gpu => {
            let gpu = device.open_gpu_local(local_rank)?;
            let sharding: &dyn Ranks<f32> = if zero { ranks } else { &OneRank };
            let trainer = block_on(GpuTrainer::resume_sharded(gpu.clone(), plan, cfg, &start, sharding))?;
            let engine = GpuEngine::new(trainer, ranks)?;
            Ok(Opened { engine: Box::new(engine), gpu: Some(gpu), cuda: None })
        }
        Backend::Cuda => open_cuda(device, plan, cfg, &start, Placement { ranks, local_rank, zero }),
        Backend::Auto => unreachable!("the command line resolves --backend auto"),
    }
}

/// [`open`] on a CUDA device: its products' peak measured first (square products of 4096 in
/// the run's arithmetic), then the engine.
#[cfg(feature = "cuda")]
fn open_cuda<'m>(device: &DeviceArgs, plan: Plan, cfg: TrainConfig, start: &RunState<f32>, placement: Placement<'m>) -> Result<Opened<'m>> {
    use alpha_cuda::Arithmetic;
    let (dev, arithmetic, precision_line) = device.open_cuda_local(placement.local_rank)?;
    let gflops = alpha_cuda::peak::product_gflops(&dev, arithmetic, 4096)?;
    let source = match arithmetic {
        Arithmetic::F32 => "measured (cuBLASLt f32 products)",
        Arithmetic::Tf32 => "measured (cuBLASLt TF32 products)",
        Arithmetic::Bf16 => "measured (cuBLASLt bf16 products)",
    };
    let engine = alpha_cuda::CudaEngine::new(dev, arithmetic, plan, cfg, start, placement.ranks, placement.zero)?;
    let precision = if arithmetic == Arithmetic::Bf16 { "bf16" } else { "f32" };
    let cuda = CudaOpened { precision_line, precision, tf32: arithmetic == Arithmetic::Tf32, peak: Peak { gflops, source } };
    Ok(Opened { engine: Box::new(engine), gpu: None, cuda: Some(cuda) })
}

/// A CUDA engine of `plan` holding `params`, to evaluate or sample (the optimizer's settings
/// unused).
#[cfg(feature = "cuda")]
pub fn cuda_model(device: &DeviceArgs, plan: Plan, params: Vec<f32>) -> Result<alpha_cuda::CudaEngine<'static>> {
    let (dev, arithmetic, _) = device.open_cuda_local(0)?;
    let start = RunState { params, moments: None, step: 0, rng: alpha_core::Rng::new(0) };
    let schedule = alpha_core::optim::LrSchedule { max_lr: 0.0, min_lr: 0.0, warmup_iters: 0, decay_iters: 0 };
    let cfg = TrainConfig { schedule, adamw: alpha_core::optim::AdamWConfig::default(), grad_clip: 0.0, grad_accum: 1 };
    Ok(alpha_cuda::CudaEngine::new(dev, arithmetic, plan, cfg, &start, &OneRank, false)?)
}

/// A CUDA model (as `cuda_model` makes) as any engine, to sample from (an error in a build
/// without CUDA).
pub fn cuda_sampler(device: &DeviceArgs, plan: Plan, params: Vec<f32>) -> Result<Box<dyn Engine>> {
    #[cfg(feature = "cuda")]
    return Ok(Box::new(cuda_model(device, plan, params)?));
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (plan, params);
        match device.open_cuda_local(0)? {}
    }
}

/// `--backend cuda` in a build without it.
#[cfg(not(feature = "cuda"))]
fn open_cuda<'m>(device: &DeviceArgs, _plan: Plan, _cfg: TrainConfig, _start: &RunState<f32>, placement: Placement<'m>) -> Result<Opened<'m>> {
    match device.open_cuda_local(placement.local_rank)? {}
}

/// The peak MFU is measured against, for an `opened` engine: `given`, else the CPU's GEMM
/// peak for `pool`'s threads (the bf16 GEMM's for bf16 products), a wgpu GPU's limit for the arithmetic its products run
/// (measured on the engine's own device: the tensor cores' where its products run there,
/// else the f32 FMA limit, since f16 products on the SIMT kernels round their operands but
/// multiply and sum in f32; measured once and cached), or a CUDA device's cuBLASLt peak in
/// its arithmetic (measured as it opened).
pub fn peak(opened: &Opened<'_>, pool: &ThreadPool, given: Option<f64>) -> Result<Peak> {
    match (&opened.gpu, &opened.cuda, given) {
        (_, Some(_), Some(gflops)) => Ok(Peak { gflops, source: "given" }),
        (_, Some(cuda), None) => Ok(cuda.peak.clone()),
        (None, None, _) if opened.engine.describe().precision == "bf16" => crate::peak::bf16_peak(pool, given),
        (None, None, _) => crate::peak::peak(pool, given),
        (Some(gpu), None, _) => gpu_peak(gpu, if gpu.tensor_cores() { Real::Tensor } else { Real::F32 }, given, false),
    }
}

/// The device of a description for records: null on the CPU; adapter, kernels and submits
/// per step, device memory and the buffers the activations take on a device.
pub fn device_json(d: &Description) -> Value {
    match &d.device {
        None => Value::Null,
        Some(dev) => json!({
            "adapter": dev.adapter,
            "backend": dev.platform,
            "device_type": dev.device_type,
            "kernels_per_step": dev.kernels_per_step,
            "submits_per_step": dev.submits_per_step,
            "device_memory_mib": dev.memory_bytes as f64 / 1048576.0,
            "activation_buffers": dev.activation_buffers,
        }),
    }
}
