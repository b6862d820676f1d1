//! Where a command runs: the `--backend`, `--threads` and `--adapter` flags, the CPU's thread
//! pool and the GPU they choose.

use alpha_core::gemm::Operands;
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
    /// alpha-cuda: cuBLASLt and CUDA C kernels on an NVIDIA GPU (a build with `--features cuda`).
    Cuda,
    /// CUDA where a device is found, else wgpu where a hardware adapter is, else the CPU.
    Auto,
}

impl Backend {
    /// Its name in records and messages.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Gpu => "gpu",
            Backend::Cuda => "cuda",
            Backend::Auto => "auto",
        }
    }
}

/// Whether this build has the CUDA backend.
const CUDA_BUILT: bool = cfg!(feature = "cuda");

/// The error where `--backend cuda` meets a build without it.
fn cuda_not_built() -> anyhow::Error {
    anyhow!("this alpha-native was built without CUDA; build it with `cargo build --release -p alpha-native --features cuda`")
}

/// What `--backend auto` picks here, and why (for the run's first lines).
fn pick_backend() -> (Backend, String) {
    #[cfg(feature = "cuda")]
    {
        match alpha_cuda::device::check_libraries() {
            Ok(()) => match alpha_cuda::device::device_count() {
                0 => {}
                n => return (Backend::Cuda, format!("auto: {n} CUDA device{} found", if n == 1 { "" } else { "s" })),
            },
            Err(e) => eprintln!("note: {e}"),
        }
    }
    let adapters = block_on(alpha_gpu::context::adapters());
    let hardware = adapters.iter().find(|a| a.device_type != "Cpu");
    match hardware {
        Some(a) => (Backend::Gpu, format!("auto: {}{}", a.name, if CUDA_BUILT { " (no CUDA device)" } else { " (a build without CUDA)" })),
        None => (Backend::Cpu, "auto: no CUDA device and no hardware GPU adapter".to_string()),
    }
}

/// The flags that choose where a command runs.
#[derive(Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Where to run: cpu; gpu (wgpu: Vulkan, Metal, DX12); cuda (NVIDIA, a build with
    /// --features cuda); auto (cuda where a device is found, else gpu where a hardware adapter
    /// is, else cpu; it says which).
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    pub backend: Backend,
    /// CUDA device (--backend cuda): its ordinal. Default: 0, and under mpirun each rank on a
    /// machine its own (the local rank's).
    #[arg(long)]
    pub device: Option<usize>,
    /// Lets CUDA's f32 products run on the tensor cores in TF32 (--backend cuda, --precision
    /// f32; PyTorch's `allow_tf32`): faster, to about 1e-3 relative.
    #[arg(long)]
    pub tf32: bool,
    /// Worker threads (CPU backend; the GPU backend's host work is one thread). Default: one
    /// per core.
    #[arg(long)]
    pub threads: Option<usize>,
    /// GPU adapter (--backend gpu): an index or part of a name, as `info` lists them.
    /// Default: the high-performance adapter.
    #[arg(long)]
    pub adapter: Option<String>,
    /// The products' operands (sums in f32, master weights and AdamW in f32 on every
    /// backend): f32; f16 (--backend gpu, needs shader-f16, with dynamic loss scaling); bf16
    /// (--backend cuda, sm_80 and later; the CPU with AVX512-BF16, its linear layers); auto:
    /// bf16 on CUDA sm_80+ and on a CPU with AVX512-BF16, f16 on a wgpu adapter with
    /// shader-f16, else f32. A resumed wgpu run without this flag keeps its checkpoint's
    /// precision (f16 where the adapter has it).
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
    /// f16 products with loss scaling (wgpu).
    F16,
    /// bf16 products (CUDA; the CPU with AVX512-BF16).
    Bf16,
    /// The fastest the device has: bf16 on CUDA sm_80+ and on a CPU with AVX512-BF16, f16 on
    /// wgpu with shader-f16, else f32.
    Auto,
}

impl DeviceArgs {
    /// The CPU thread pool (`--threads`).
    pub fn pool(&self) -> Result<ThreadPool> {
        thread_pool(self.threads)
    }

    /// The CPU's products' operands for `--precision` and the run's line saying which (with
    /// `auto`, why): bf16 where the CPU has AVX512-BF16, an error naming it where `bf16` is
    /// asked for and it lacks it.
    pub fn cpu_operands(&self) -> Result<(Operands, String)> {
        let kernel = alpha_core::gemm::bf16::bf16_kernel_name();
        let bf16 =
            |why: &str| (Operands::Bf16, format!("precision: bf16 products (f32 sums, master weights and AdamW; {} kernel{why})", kernel.unwrap_or("?")));
        Ok(match (self.precision, kernel) {
            (PrecisionArg::Bf16, None) => return Err(anyhow!("--precision bf16 on the CPU needs AVX512-BF16 (with AVX-512 F and BW), which this CPU lacks")),
            (PrecisionArg::Bf16, Some(_)) => bf16(""),
            (PrecisionArg::Auto, Some(_)) => bf16(", auto: this CPU has AVX512-BF16"),
            (PrecisionArg::Auto, None) => (Operands::F32, "precision: f32 (auto: this CPU lacks AVX512-BF16)".to_string()),
            (PrecisionArg::F32 | PrecisionArg::F16, _) => (Operands::F32, "precision: f32".to_string()),
        })
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
            PrecisionArg::Bf16 => return Err(anyhow!("--precision bf16 runs on CUDA (--backend cuda); wgpu's products are f32 or f16")),
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

    /// Opens the CUDA device for data-parallel rank `local` of this machine's ranks
    /// (`--device`, else the local rank's) and the arithmetic its products run, saying which
    /// `auto` chose and why.
    #[cfg(feature = "cuda")]
    pub fn open_cuda_local(&self, local: usize) -> Result<(alpha_cuda::Device, alpha_cuda::Arithmetic, String)> {
        use alpha_cuda::Arithmetic;
        let device = alpha_cuda::Device::open(self.device.unwrap_or(local))?;
        let (arithmetic, why) = match (self.precision, self.tf32) {
            (PrecisionArg::F32, false) => (Arithmetic::F32, String::new()),
            (PrecisionArg::F32, true) => (Arithmetic::Tf32, " (--tf32)".to_string()),
            (PrecisionArg::Bf16, _) => (Arithmetic::Bf16, String::new()),
            (PrecisionArg::Auto, _) if device.info.has_bf16() => (Arithmetic::Bf16, format!(" (auto: {} is {})", device.info.name, device.info.arch())),
            (PrecisionArg::Auto, _) => (Arithmetic::F32, format!(" (auto: {} is {}, before bf16's sm_80)", device.info.name, device.info.arch())),
            (PrecisionArg::F16, _) => return Err(anyhow!("--precision f16 runs on wgpu (--backend gpu); CUDA's products are f32 or bf16")),
        };
        let line = format!("precision: {}{why}", alpha_cuda::engine::precision_name(arithmetic));
        Ok((device, arithmetic, line))
    }

    /// `--backend cuda` in a build without it.
    #[cfg(not(feature = "cuda"))]
    pub fn open_cuda_local(&self, _local: usize) -> Result<std::convert::Infallible> {
        Err(cuda_not_built())
    }

    /// Resolves `--backend auto` to the backend it picks, saying which and why on stderr
    /// (the command line does it before a command runs).
    pub fn resolve(&mut self) {
        if self.backend == Backend::Auto {
            let (backend, why) = pick_backend();
            eprintln!("backend: {} ({why})", backend.name());
            self.backend = backend;
        }
    }

    /// Checks the flags against the backend: an error where a flag would be ignored or the
    /// backend cannot do what is asked.
    pub fn check(&self) -> Result<()> {
        if self.backend == Backend::Auto {
            return Err(anyhow!("--backend auto is resolved by the command line before a command runs"));
        }
        if self.backend == Backend::Cuda && !CUDA_BUILT {
            return Err(cuda_not_built());
        }
        if self.backend != Backend::Cuda && self.device.is_some() {
            return Err(anyhow!("--device selects a CUDA device; add --backend cuda (--adapter selects a wgpu adapter)"));
        }
        if self.backend != Backend::Cuda && self.tf32 {
            return Err(anyhow!("--tf32 lets CUDA's f32 products use TF32; add --backend cuda"));
        }
        if self.backend == Backend::Cuda && self.tf32 && self.precision != PrecisionArg::F32 {
            return Err(anyhow!("--tf32 applies to f32 products; drop it or use --precision f32"));
        }
        if self.backend == Backend::Cuda && (self.adapter.is_some() || self.tensor_cores == TensorCoresArg::On) {
            return Err(anyhow!("--adapter and --tensor-cores are wgpu's (--backend gpu); CUDA's products always run on the tensor cores except in f32, and --device picks the GPU"));
        }
        if self.backend == Backend::Cuda && self.precision == PrecisionArg::F16 {
            return Err(anyhow!("--precision f16 runs on wgpu (--backend gpu); CUDA's products are f32 or bf16"));
        }
        if self.backend == Backend::Gpu && self.precision == PrecisionArg::Bf16 {
            return Err(anyhow!("--precision bf16 runs on CUDA (--backend cuda); wgpu's products are f32 or f16"));
        }
        if self.backend == Backend::Cpu && self.adapter.is_some() {
            return Err(anyhow!("--adapter selects a GPU; add --backend gpu"));
        }
        if self.backend == Backend::Cpu && self.tensor_cores == TensorCoresArg::On {
            return Err(anyhow!("--tensor-cores runs products on a GPU; add --backend gpu"));
        }
        if self.backend == Backend::Cpu && self.precision == PrecisionArg::F16 {
            return Err(anyhow!("--precision f16 runs on a GPU; add --backend gpu (the CPU's products are f32 or bf16)"));
        }
        Ok(())
    }
}
