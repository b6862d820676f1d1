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
    /// The GPU it trains on, if it does (its arithmetic, its peak).
    pub gpu: Option<Gpu>,
}

/// Opens the engine `device` chooses for `plan`, continuing `start`; the CPU's runs on `pool`.
pub fn open<'m>(device: &DeviceArgs, pool: &'m ThreadPool, plan: Plan, cfg: TrainConfig, start: RunState<f32>, placement: Placement<'m>) -> Result<Opened<'m>> {
    let Placement { ranks, local_rank, zero } = placement;
    match device.backend {
        Backend::Cpu => {
            let engine = CpuEngine::in_group(pool, ranks, zero, plan, cfg, start)?;
            Ok(Opened { engine: Box::new(engine), gpu: None })
        }
        Backend::Gpu => {
            let gpu = device.open_gpu_local(local_rank)?;
            let sharding: &dyn Ranks<f32> = if zero { ranks } else { &OneRank };
            let trainer = block_on(GpuTrainer::resume_sharded(gpu.clone(), plan, cfg, &start, sharding))?;
            let engine = GpuEngine::new(trainer, ranks)?;
            Ok(Opened { engine: Box::new(engine), gpu: Some(gpu) })
        }
    }
}

/// The peak MFU is measured against, for an engine on `gpu` (or the CPU, `None`): `given`,
/// else the CPU's GEMM peak for `pool`'s threads or the GPU's limit for the arithmetic its
/// products run (measured on the engine's own device): the tensor cores' where its products
/// run there, else the f32 FMA limit (f16 products on the SIMT kernels round their operands
/// but multiply and sum in f32). Each is measured once and cached.
pub fn peak(gpu: Option<&Gpu>, pool: &ThreadPool, given: Option<f64>) -> Result<Peak> {
    match gpu {
        None => crate::peak::peak(pool, given),
        Some(gpu) => gpu_peak(gpu, if gpu.tensor_cores() { Real::Tensor } else { Real::F32 }, given, false),
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
