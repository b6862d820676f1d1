//! The device: choosing an adapter, the features and limits requested from it, and the
//! checks that keep every buffer within them.

use core::fmt;
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
}

/// The optional features alpha-gpu asks for where the adapter has them.
const WANTED: [(Features, &str); 3] = [(Features::SHADER_F16, "shader-f16"), (Features::TIMESTAMP_QUERY, "timestamp-query"), (Features::SUBGROUP, "subgroups")];

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
    }
}

fn instance() -> Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    if desc.backends == Backends::all() {
        // GL adapters have no compute shaders worth the name; browsers give WebGPU.
        desc.backends = Backends::VULKAN | Backends::METAL | Backends::DX12 | Backends::BROWSER_WEBGPU;
    }
    Instance::new(desc)
}

/// Every adapter this machine offers (native; in a browser, the one it hands out).
pub async fn adapters() -> Vec<AdapterSummary> {
    let instance = instance();
    let list = instance.enumerate_adapters(Backends::all()).await;
    if list.is_empty() {
        if let Ok(a) = instance.request_adapter(&Default::default()).await {
            return vec![summary(0, &a)];
        }
    }
    list.iter().enumerate().map(|(i, a)| summary(i, a)).collect()
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
}

impl Gpu {
    /// Opens the adapter `selector` names (an index into [`adapters`] or part of a name,
    /// case-insensitive), or the default high-performance adapter.
    pub async fn open(selector: Option<&str>) -> Result<Gpu, GpuError> {
        let instance = instance();
        let list = instance.enumerate_adapters(Backends::all()).await;
        let (index, adapter) = match selector {
            None => {
                let options = wgpu::RequestAdapterOptions { power_preference: wgpu::PowerPreference::HighPerformance, ..Default::default() };
                let a = instance
                    .request_adapter(&options)
                    .await
                    .map_err(|e| GpuError(format!("no GPU adapter found ({e}); on Linux install a Vulkan driver (mesa-vulkan-drivers gives lavapipe)")))?;
                (list.iter().position(|b| b.get_info() == a.get_info()).unwrap_or(0), a)
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
        let features = WANTED.iter().map(|(f, _)| *f).fold(Features::empty(), |a, f| a | f) & adapter.features();
        let limits = adapter.limits();
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("alpha"),
                required_features: features,
                required_limits: limits.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| GpuError(format!("could not open {}: {e}", adapter_summary.name)))?;
        Ok(Gpu { device, queue, adapter: adapter_summary, limits, features })
    }

    /// An error naming `what` when a buffer of `bytes` would exceed the device's limits
    /// (`bound`: the whole buffer is bound to one shader binding).
    pub fn check_size(&self, what: &str, bytes: u64, bound: bool) -> Result<(), GpuError> {
        let max_buffer = self.limits.max_buffer_size;
        let max_binding = self.limits.max_storage_buffer_binding_size;
        let name = &self.adapter.name;
        if bytes > max_buffer {
            return Err(GpuError(format!(
                "{what}: {} in one buffer; {name} allows at most {} (max_buffer_size): use a smaller batch, block or model",
                human_size(bytes),
                human_size(max_buffer)
            )));
        }
        if bound && bytes > max_binding {
            return Err(GpuError(format!(
                "{what}: {} in one shader binding; {name} binds at most {} (max_storage_buffer_binding_size): use a smaller batch, block or model",
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
