//! Where a command runs: the `--backend`, `--threads` and `--adapter` flags, the CPU's thread
//! pool and the GPU they choose.

use alpha_core::parallel::ThreadPool;
use alpha_gpu::{block_on, Gpu, Precision, TensorCores};
use anyhow::{anyhow, Result};
use clap::{Args, ValueEnum};

/// The most threads `--threads` may ask for.
pub const MAX_THREADS: usize = 1024;

/// A thread pool of `threads` threads (`None`: one per available core).
pub fn thread_pool(threads: Option<usize>) -> Result<ThreadPool> {
    let n = match threads {
        Some(0) => return Err(anyhow!("--threads must be at least 1")),
        Some(n) if n > MAX_THREADS => return Err(anyhow!("--threads {n} is more than {MAX_THREADS}")),
        Some(n) => n,
        None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    };
    ThreadPool::try_new(n).map_err(|e| anyhow!("cannot start {n} threads: {e}"))
}

/// Where the model runs.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The CPU kernels of alpha-core.
    Cpu,
    /// alpha-gpu's WGSL kernels through wgpu (Vulkan, Metal, DX12).
    Gpu,
}

/// The flags that choose where a command runs.
#[derive(Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Where to run.
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    pub backend: Backend,
    /// Worker threads (CPU backend; the GPU backend's host work is one thread). Default: one
    /// per core.
    #[arg(long)]
    pub threads: Option<usize>,
    /// GPU adapter (--backend gpu): an index or part of a name, as `info` lists them.
    /// Default: the high-performance adapter.
    #[arg(long)]
    pub adapter: Option<String>,
    /// The GPU's arithmetic (--backend gpu): f32; f16 mixed precision (every matrix
    /// product's operands rounded to f16, sums and everything else f32, dynamic loss scaling:
    /// needs shader-f16); auto: f16 where the adapter has shader-f16, else f32. A resumed
    /// run without this flag keeps its checkpoint's precision (f16 where the adapter has it).
    #[arg(long, value_enum, default_value_t = PrecisionArg::F32)]
    pub precision: PrecisionArg,
    /// The large f16 matrix products on the GPU's tensor cores (Vulkan cooperative matrices
    /// of 16x16x16 f16 products summed in f32, as NVIDIA's drivers report; `info --backend
    /// gpu` lists them): auto, where the products are f16 and the adapter has them; on (or
    /// the bare flag), always (an error where they are f32 or the adapter lacks them); off,
    /// never.
    #[arg(long, value_enum, default_value_t = TensorCoresArg::Auto, num_args = 0..=1, default_missing_value = "on")]
    pub tensor_cores: TensorCoresArg,
}

/// `--tensor-cores`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorCoresArg {
    /// Where the products are f16 and the adapter has the tensor cores' shape.
    Auto,
    /// Always.
    On,
    /// Never.
    Off,
}

/// What records call the arithmetic of `gpu`'s products: "f32", "f16" (f16 operands, f32 sums
/// and everything else f32), or "f16 (tensor cores)".
pub fn precision_name(gpu: &Gpu) -> &'static str {
    match gpu.precision {
        Precision::F16 if gpu.tensor_cores() => "f16 (tensor cores)",
        Precision::F16 => "f16",
        Precision::F32 => "f32",
    }
}

/// The `--precision` and `--tensor-cores` values (flag names with `_`) that open a device
/// running `gpu`'s arithmetic again, `auto` resolved: what a run's resolved run file records.
pub fn arithmetic_flags(gpu: &Gpu) -> [(&'static str, String); 2] {
    let precision = match gpu.precision {
        Precision::F32 => PrecisionArg::F32,
        Precision::F16 => PrecisionArg::F16,
    };
    let tensor_cores = if gpu.tensor_cores() { TensorCoresArg::On } else { TensorCoresArg::Off };
    [("precision", value_name(precision)), ("tensor_cores", value_name(tensor_cores))]
}

/// A flag value's name as the command line spells it.
fn value_name(value: impl ValueEnum) -> String {
    value.to_possible_value().expect("no value is skipped").get_name().to_string()
}

/// `--precision`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrecisionArg {
    /// f32 throughout.
    F32,
    /// f16 products with loss scaling.
    F16,
    /// f16 where the adapter has shader-f16, else f32.
    Auto,
}

impl DeviceArgs {
    /// The CPU thread pool (`--threads`).
    pub fn pool(&self) -> Result<ThreadPool> {
        thread_pool(self.threads)
    }

    /// Opens the GPU `--adapter` names.
    pub fn open_gpu(&self) -> Result<Gpu> {
        self.open_gpu_local(0)
    }

    /// Opens the GPU `--adapter` names for data-parallel rank `local` of this machine's
    /// ranks: without `--adapter`, its own of the machine's GPUs (see [`Gpu::open_local`]).
    pub fn open_gpu_local(&self, local: usize) -> Result<Gpu> {
        let precision = match self.precision {
            PrecisionArg::F32 => Some(Precision::F32),
            PrecisionArg::F16 => Some(Precision::F16),
            PrecisionArg::Auto => None,
        };
        let tensor_cores = match self.tensor_cores {
            TensorCoresArg::Auto => TensorCores::Auto,
            TensorCoresArg::On => TensorCores::On,
            TensorCoresArg::Off => TensorCores::Off,
        };
        Ok(block_on(Gpu::open_local(self.adapter.as_deref(), local, precision, tensor_cores))?)
    }

    /// Which precision `gpu` (opened from these flags) runs, and what `auto` chose and why,
    /// for the run's first lines; `resumed`: `auto` stands for a resumed f16 checkpoint's
    /// precision, not for `--precision`.
    pub fn precision_line(&self, gpu: &Gpu, resumed: bool) -> String {
        let (name, chosen) = (&gpu.adapter.name, precision_name(gpu));
        let f16 = gpu.precision == Precision::F16;
        let mut why = Vec::new();
        if resumed && f16 {
            why.push("the resumed checkpoint's".to_string());
        } else if resumed {
            why.push(format!("the resumed checkpoint trained in f16, but {name} lacks shader-f16"));
        } else if self.precision == PrecisionArg::Auto {
            why.push(format!("auto: {name} {} shader-f16", if f16 { "has" } else { "lacks" }));
        }
        if let (true, TensorCoresArg::Auto, Some(lacks)) = (f16, self.tensor_cores, &gpu.adapter.no_tensor_cores) {
            why.push(format!("no tensor cores: {name} {lacks}"));
        }
        if why.is_empty() {
            format!("precision: {chosen}")
        } else {
            format!("precision: {chosen} ({})", why.join("; "))
        }
    }

    /// An error if `--adapter` is given without `--backend gpu` (it would be ignored).
    pub fn check(&self) -> Result<()> {
        if self.backend == Backend::Cpu && self.adapter.is_some() {
            return Err(anyhow!("--adapter selects a GPU; add --backend gpu"));
        }
        if self.backend == Backend::Cpu && self.tensor_cores == TensorCoresArg::On {
            return Err(anyhow!("--tensor-cores runs products on a GPU; add --backend gpu"));
        }
        if self.backend == Backend::Cpu && self.precision == PrecisionArg::F16 {
            return Err(anyhow!("--precision f16 runs on a GPU; add --backend gpu (the CPU computes in f32)"));
        }
        Ok(())
    }
}
