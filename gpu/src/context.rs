//! The device: choosing an adapter, the features and limits requested from it, and the
//! checks that keep every buffer within them.

use core::fmt;
use std::cell::RefCell;
use wgpu::{Adapter, Backends, Device, Features, Instance, Limits, Queue};

/// A GPU error with a message for the user (no adapter, a limit exceeded, a failed readback).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuError(pub String);

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GpuError {}

/// What `alpha-native info` shows of an adapter.
#[derive(Clone, Debug, PartialEq)]
pub struct AdapterSummary {
    /// Position in the adapter list (what `--adapter N` selects).
    pub index: usize,
    /// Adapter name.
    pub name: String,
    /// Backend (Vulkan, Metal, Dx12, BrowserWebGpu).
    pub backend: String,
    /// Discrete, integrated, virtual, CPU.
    pub device_type: String,
    /// Driver name and version.
    pub driver: String,
    /// The optional features we use that it has.
    pub features: Vec<&'static str>,
    /// Largest storage buffer binding, bytes.
    pub max_storage_binding: u64,
    /// Largest buffer, bytes.
    pub max_buffer: u64,
    /// The cooperative-matrix (tensor core) products the driver reports, as
    /// `MxNxK a->c` (for example `16x16x16 f16->f32`): what a tensor-core GEMM can use.
    pub cooperative_matrices: Vec<String>,
    /// Why the tensor-core GEMM cannot run here (what the adapter lacks), or `None` where it
    /// can.
    pub no_tensor_cores: Option<String>,
}

/// Whether f16 products run on the tensor cores (`matmul_tensor.wgsl`) or on the SIMT
/// kernels (`matmul_wide`); docs/performance.md has what each runs at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorCores {
    /// Where the products are f16 and the adapter has what the tensor-core GEMM needs
    /// ([`AdapterSummary::no_tensor_cores`] is `None`).
    Auto,
    /// Always: an error where the products are f32 or the adapter lacks them.
    On,
    /// Never.
    Off,
}

/// How the device runs the model's matrix products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// f32 operands and sums: the CPU's results to rounding.
    F32,
    /// Mixed precision (`--precision f16`): every product's operands rounded to f16, sums in
    /// f32, everything else f32, with dynamic loss scaling so that small gradients survive
    /// the rounding (see the trainer). Needs shader-f16.
    F16,
}

/// The optional features alpha-gpu asks for where the adapter has them.
const WANTED: [(Features, &str); 3] = [(Features::SHADER_F16, "shader-f16"), (Features::TIMESTAMP_QUERY, "timestamp-query"), (Features::SUBGROUP, "subgroups")];

/// Why `a` cannot run the tensor-core GEMM (matmul_tensor.wgsl), if it cannot: it needs
/// cooperative matrices with 16 x 16 x 16 f16 products summed in f32, f16 in shaders, and
/// subgroups of exactly 32 invocations (its 256 threads are eight subgroups).
///
/// With `ALPHA_GPU_UNREPORTED_COOP_SHAPES=1` a driver with cooperative matrices qualifies
/// without reporting that shape, with subgroups of up to 32: Mesa's lavapipe (26.1) reports
/// only 8 x 8 x 8 but runs the kernel correctly, four 8-wide subgroups doing each group's
/// work alike, so the tensor-core kernels are tested without a GPU
/// (`scripts/lavapipe-coop.sh`). Never faster: tests only.
fn tensor_core_support(a: &Adapter) -> Result<(), String> {
    use wgpu::CooperativeScalarType::{F16, F32};
    let needed = [(Features::EXPERIMENTAL_COOPERATIVE_MATRIX, "cooperative matrices"), (Features::SHADER_F16, "shader-f16"), (Features::SUBGROUP, "subgroups")];
    let missing: Vec<&str> = needed.iter().filter(|(f, _)| !a.features().contains(*f)).map(|(_, name)| *name).collect();
    if !missing.is_empty() {
        return Err(format!("lacks {}", missing.join(", ")));
    }
    let unreported = std::env::var_os("ALPHA_GPU_UNREPORTED_COOP_SHAPES").is_some_and(|v| v == "1");
    let reported = a.cooperative_matrix_properties().iter().any(|m| (m.m_size, m.n_size, m.k_size, m.ab_type, m.cr_type) == (16, 16, 16, F16, F32));
    if !reported && !unreported {
        return Err("reports no 16x16x16 f16->f32 cooperative matrix".into());
    }
    let info = a.get_info();
    let subgroups_fit = if unreported { info.subgroup_max_size <= 32 } else { (info.subgroup_min_size, info.subgroup_max_size) == (32, 32) };
    if !subgroups_fit {
        return Err(format!("has subgroups of {} to {} invocations, not 32", info.subgroup_min_size, info.subgroup_max_size));
    }
    Ok(())
}

fn summary(index: usize, a: &Adapter) -> AdapterSummary {
    let info = a.get_info();
    let limits = a.limits();
    AdapterSummary {
        index,
        name: info.name,
        backend: format!("{:?}", info.backend),
        device_type: format!("{:?}", info.device_type),
        driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
        features: WANTED.iter().filter(|(f, _)| a.features().contains(*f)).map(|(_, n)| *n).collect(),
        max_storage_binding: limits.max_storage_buffer_binding_size,
        max_buffer: limits.max_buffer_size,
        cooperative_matrices: a
            .cooperative_matrix_properties()
            .iter()
            .map(|m| {
                let t = |s: wgpu::wgt::CooperativeScalarType| format!("{s:?}").to_lowercase();
                format!("{}x{}x{} {}->{}", m.m_size, m.n_size, m.k_size, t(m.ab_type), t(m.cr_type))
            })
            .collect(),
        no_tensor_cores: tensor_core_support(a).err(),
    }
}

thread_local! {
    /// The wgpu instance, made once. Per thread because a browser's instance cannot cross
    /// threads; the CLI drives the GPU from its main thread, so it makes one.
    static INSTANCE: Instance = {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        if desc.backends == Backends::all() {
            // GL adapters have no compute shaders worth the name; browsers give WebGPU.
            desc.backends = Backends::VULKAN | Backends::METAL | Backends::DX12 | Backends::BROWSER_WEBGPU;
        }
        Instance::new(desc)
    };
    /// The adapters, listed once: every listing asks each driver again (and Mesa's drivers
    /// print their `XDG_RUNTIME_DIR` warning each time).
    static ADAPTERS: RefCell<Option<Vec<Adapter>>> = const { RefCell::new(None) };
}

/// The instance and every adapter it offers natively (empty in a browser, which hands out
/// one adapter on request instead).
async fn adapter_list() -> (Instance, Vec<Adapter>) {
    let instance = INSTANCE.with(Instance::clone);
    if let Some(list) = ADAPTERS.with(|a| a.borrow().clone()) {
        return (instance, list);
    }
    let list = instance.enumerate_adapters(Backends::all()).await;
    ADAPTERS.with(|a| *a.borrow_mut() = Some(list.clone()));
    (instance, list)
}

/// Every adapter this machine offers (native; in a browser, the one it hands out).
pub async fn adapters() -> Vec<AdapterSummary> {
    let (instance, list) = adapter_list().await;
    if list.is_empty() {
        if let Ok(a) = instance.request_adapter(&Default::default()).await {
            return vec![summary(0, &a)];
        }
    }
    list.iter().enumerate().map(|(i, a)| summary(i, a)).collect()
}

/// How much an adapter is preferred by default (lower first): a discrete GPU, then an
/// integrated one, a virtual one, anything else, and a CPU (software) adapter last.
fn preference(a: &Adapter) -> u8 {
    match a.get_info().device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// An open device and its queue (cloning shares them).
#[derive(Clone)]
pub struct Gpu {
    /// The device.
    pub device: Device,
    /// Its queue.
    pub queue: Queue,
    /// The adapter it was opened on.
    pub adapter: AdapterSummary,
    /// The limits granted (the adapter's own).
    pub limits: Limits,
    /// The optional features enabled.
    pub features: Features,
    /// How the model's products run on it.
    pub precision: Precision,
}

impl Gpu {
    /// Opens the adapter `selector` names (an index into [`adapters`] or part of a name,
    /// case-insensitive), or the default high-performance adapter.
    pub async fn open(selector: Option<&str>) -> Result<Gpu, GpuError> {
        Gpu::open_nth(selector, 0, Some(Precision::F32), TensorCores::Off).await
    }

    /// [`Gpu::open`] for local process `local` of several on one machine (data-parallel
    /// ranks): without a selector, the default kind of adapter (discrete GPUs first) and of
    /// those the one at `local` modulo their count, so that each rank takes its own GPU.
    /// Its products run in `precision` (`None`: f16 where the adapter has shader-f16, else
    /// f32), on the tensor-core GEMM as `tensor_cores` says (see [`Gpu::tensor_cores`]); an
    /// error where the adapter cannot do what is asked.
    pub async fn open_local(selector: Option<&str>, local: usize, precision: Option<Precision>, tensor_cores: TensorCores) -> Result<Gpu, GpuError> {
        Gpu::open_nth(selector, local, precision, tensor_cores).await
    }

    async fn open_nth(selector: Option<&str>, nth: usize, precision: Option<Precision>, tensor_cores: TensorCores) -> Result<Gpu, GpuError> {
        let (instance, list) = adapter_list().await;
        let no_adapter = |why: String| GpuError(format!("no GPU adapter found ({why}); on Linux install a Vulkan driver (mesa-vulkan-drivers gives lavapipe)"));
        let (index, adapter) = match selector {
            None if list.is_empty() => {
                // A browser: it chooses.
                let options = wgpu::RequestAdapterOptions { power_preference: wgpu::PowerPreference::HighPerformance, ..Default::default() };
                (0, instance.request_adapter(&options).await.map_err(|e| no_adapter(e.to_string()))?)
            }
            None => {
                let best = list.iter().map(preference).min().ok_or_else(|| no_adapter("none listed".into()))?;
                let mut kind: Vec<_> = list.into_iter().enumerate().filter(|(_, a)| preference(a) == best).collect();
                let pick = nth % kind.len();
                kind.swap_remove(pick)
            }
            Some(sel) => {
                let names: Vec<String> = list.iter().enumerate().map(|(i, a)| format!("{i}: {}", a.get_info().name)).collect();
                let found = match sel.parse::<usize>() {
                    Ok(i) => list.into_iter().enumerate().nth(i),
                    Err(_) => list.into_iter().enumerate().find(|(_, a)| a.get_info().name.to_lowercase().contains(&sel.to_lowercase())),
                };
                found.ok_or_else(|| GpuError(format!("no adapter matches --adapter {sel}; adapters: [{}]", names.join(", "))))?
            }
        };
        let adapter_summary = summary(index, &adapter);
        let mut features = WANTED.iter().map(|(f, _)| *f).fold(Features::empty(), |a, f| a | f) & adapter.features();
        let mut experimental_features = wgpu::ExperimentalFeatures::disabled();
        let precision = precision.unwrap_or(if features.contains(Features::SHADER_F16) { Precision::F16 } else { Precision::F32 });
        if precision == Precision::F16 && !features.contains(Features::SHADER_F16) {
            return Err(GpuError(format!("--precision f16: {} lacks shader-f16", adapter_summary.name)));
        }
        if tensor_cores == TensorCores::On && precision != Precision::F16 {
            return Err(GpuError("--tensor-cores runs the products in f16: add --precision f16".into()));
        }
        if let (TensorCores::On, Some(why)) = (tensor_cores, &adapter_summary.no_tensor_cores) {
            return Err(GpuError(format!("--tensor-cores: {} {why}", adapter_summary.name)));
        }
        if tensor_cores != TensorCores::Off && precision == Precision::F16 && adapter_summary.no_tensor_cores.is_none() {
            features |= Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
            // SAFETY: wgpu asks callers of experimental features to accept that their
            // validation may be incomplete. Only matmul_tensor.wgsl uses this one, at the
            // 16 x 16 x 16 f16 -> f32 shape the driver reports (checked above; lavapipe's
            // unreported one in tests), and it is tested against the CPU GEMM on such a device.
            experimental_features = unsafe { wgpu::ExperimentalFeatures::enabled() };
        }
        let limits = adapter.limits();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("alpha"),
                required_features: features,
                required_limits: limits.clone(),
                experimental_features,
                ..Default::default()
            })
            .await
            .map_err(|e| GpuError(format!("could not open {}: {e}", adapter_summary.name)))?;
        Ok(Gpu { device, queue, adapter: adapter_summary, limits, features, precision })
    }

    /// Whether the device was opened for the tensor-core GEMM (`matmul_tensor.wgsl`:
    /// cooperative matrices of 16 x 16 x 16 f16 products summed in f32), which then runs the
    /// large products in place of `matmul_wide`.
    pub fn tensor_cores(&self) -> bool {
        self.features.contains(Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
    }

    /// Compiles one of Alpha's own WGSL kernels without the checks naga adds to untrusted
    /// code: an index clamp on every array access, a counter on every loop and a zero test on
    /// every integer division. In a GEMM's inner loop those cost more than the arithmetic
    /// (and the loop counters keep the driver from unrolling); browsers keep their own checks.
    pub fn shader_module(&self, label: &str, wgsl: &str) -> wgpu::ShaderModule {
        let descriptor = wgpu::ShaderModuleDescriptor { label: Some(label), source: wgpu::ShaderSource::Wgsl(wgsl.into()) };
        // SAFETY: only Alpha's kernels come here, and each is written to stay in bounds: its
        // loops run to uniform counts, it divides only by nonzero sizes, it indexes its private
        // and workgroup arrays within their lengths and guards every buffer access with the
        // tensor's size (the GPU tests run every kernel against the CPU at ragged sizes).
        // Buffer accesses stay bounded by the driver's robust buffer access where it has it.
        unsafe { self.device.create_shader_module_trusted(descriptor, wgpu::ShaderRuntimeChecks::unchecked()) }
    }

    /// The pipeline of entry point `entry` of one of Alpha's kernels (`module`, from
    /// [`Gpu::shader_module`]), with `layout` or, where `None`, the one the shader implies.
    /// Its workgroup memory is not zeroed at each workgroup's start: every kernel writes
    /// what it reads there first, and zeroing is a store of every shared array per workgroup
    /// (without the driver's native zeroing, naga's stand-in has one invocation store it all).
    pub fn compute_pipeline(&self, module: &wgpu::ShaderModule, entry: &str, layout: Option<&wgpu::PipelineLayout>) -> wgpu::ComputePipeline {
        self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(entry),
            layout,
            module,
            entry_point: Some(entry),
            compilation_options: wgpu::PipelineCompilationOptions { zero_initialize_workgroup_memory: false, ..Default::default() },
            cache: None,
        })
    }

    /// An error naming `what` when a buffer of `bytes` would exceed the device's limits
    /// (`bound`: the whole buffer is bound to one shader binding), and what to make smaller
    /// (`smaller`: "the model" for the parameters, "the batch, block or model" for most).
    pub fn check_size(&self, what: &str, bytes: u64, bound: bool, smaller: &str) -> Result<(), GpuError> {
        let max_buffer = self.limits.max_buffer_size;
        let max_binding = self.limits.max_storage_buffer_binding_size;
        let name = &self.adapter.name;
        if bytes > max_buffer {
            return Err(GpuError(format!(
                "{what}: {} in one buffer; {name} allows at most {} (max_buffer_size): make {smaller} smaller",
                human_size(bytes),
                human_size(max_buffer)
            )));
        }
        if bound && bytes > max_binding {
            return Err(GpuError(format!(
                "{what}: {} in one shader binding; {name} binds at most {} (max_storage_buffer_binding_size): make {smaller} smaller",
                human_size(bytes),
                human_size(max_binding)
            )));
        }
        Ok(())
    }
}

/// `bytes` in MiB, KiB or bytes, whichever reads best.
fn human_size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / 1048576.0),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} bytes"),
    }
}
