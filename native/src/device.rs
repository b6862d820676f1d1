//! Where a command runs: the `--backend`, `--threads` and `--adapter` flags, the CPU's thread
//! pool and the GPU they choose.

use alpha_core::parallel::ThreadPool;
use alpha_gpu::{block_on, Gpu};
use clap::{Args, ValueEnum};

/// The most threads `--threads` may ask for.
pub const MAX_THREADS: usize = 1024;

/// A thread pool of `threads` threads (`None`: one per available core).
pub fn thread_pool(threads: Option<usize>) -> Result<ThreadPool, String> {
    let n = match threads {
        Some(0) => return Err("--threads must be at least 1".into()),
        Some(n) if n > MAX_THREADS => return Err(format!("--threads {n} is more than {MAX_THREADS}")),
        Some(n) => n,
        None => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    };
    ThreadPool::try_new(n).map_err(|e| format!("cannot start {n} threads: {e}"))
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
    /// Runs the large matrix products on the GPU's tensor cores (--backend gpu; Vulkan
    /// cooperative matrices with 16x16x16 f16 products summed in f32, as NVIDIA's drivers
    /// report): operands rounded to f16, so results differ from f32 by about 1e-3 relative.
    /// Experimental: an error where the adapter lacks them (`info --backend gpu` lists them).
    #[arg(long)]
    pub tensor_cores: bool,
}

impl DeviceArgs {
    /// The CPU thread pool (`--threads`).
    pub fn pool(&self) -> Result<ThreadPool, String> {
        thread_pool(self.threads)
    }

    /// Opens the GPU `--adapter` names.
    pub fn open_gpu(&self) -> Result<Gpu, String> {
        self.open_gpu_local(0)
    }

    /// Opens the GPU `--adapter` names for data-parallel rank `local` of this machine's
    /// ranks: without `--adapter`, its own of the machine's GPUs (see [`Gpu::open_local`]).
    pub fn open_gpu_local(&self, local: usize) -> Result<Gpu, String> {
        block_on(Gpu::open_local(self.adapter.as_deref(), local, self.tensor_cores)).map_err(|e| e.to_string())
    }

    /// The arithmetic precision records name: "f32", or with `--tensor-cores` the products'
    /// f16 operands.
    pub fn precision(&self) -> &'static str {
        if self.tensor_cores {
            "f32, products with f16 operands (tensor cores)"
        } else {
            "f32"
        }
    }

    /// An error if `--adapter` is given without `--backend gpu` (it would be ignored).
    pub fn check(&self) -> Result<(), String> {
        if self.backend == Backend::Cpu && self.adapter.is_some() {
            return Err("--adapter selects a GPU; add --backend gpu".into());
        }
        if self.backend == Backend::Cpu && self.tensor_cores {
            return Err("--tensor-cores runs products on a GPU; add --backend gpu".into());
        }
        Ok(())
    }
}
