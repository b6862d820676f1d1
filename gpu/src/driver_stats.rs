//! What the device's own compiler makes of each kernel, as its Vulkan driver reports it
//! (`VK_KHR_pipeline_executable_properties`): NVIDIA's driver gives the registers per thread
//! (how many workgroups share a multiprocessor) and the local memory (private arrays or
//! spills that left the registers), Mesa's drivers their instruction counts. These are the
//! figures `nvcc -Xptxas -v` gives for CUDA, and they cost no GPU time to read.
//!
//! Unstable: public for `alpha-native info` and the tests; it changes with any release (see the
//! crate's Stability section).
//!
//! ```no_run
//! let stats = alpha_gpu::driver_stats::kernel_statistics("NVIDIA H200", 64, false, false)?;
//! for kernel in &stats {
//!     println!("{}: {:?}", kernel.kernel, kernel.statistics);
//! }
//! # Ok::<(), alpha_gpu::GpuError>(())
//! ```
//!
//! The kernels go to SPIR-V through naga as wgpu compiles them for [`crate::kernels::Kernels`]
//! (no runtime checks, workgroup memory not zeroed), on a Vulkan device of their own: wgpu
//! opens its devices without the extension.

use crate::context::GpuError;
use crate::kernels::{compiled_variants, kernel_source, HalfSlots, Kernel, MAX_TENSORS};
use ash::vk;
use std::ffi::CString;
use wgpu::naga;

/// One compiled kernel's statistics.
#[derive(Clone, Debug)]
pub struct KernelStatistics {
    /// The entry point, with its f16 bindings where it has any (e.g. `matmul_wide f16 0b11`).
    pub kernel: String,
    /// The driver's statistics, (name, value) in its order, over every executable it made.
    pub statistics: Vec<(String, String)>,
}

/// Compiles every kernel a run would compile on the Vulkan device named `adapter` (attention's
/// for heads of `head_size`; the f16 variants with `f16`, the tensor-core GEMM with
/// `tensor_cores`) and returns what its driver reports of each. An error where there is no
/// Vulkan device of that name, or its driver lacks the extension or a feature the kernels
/// need.
pub fn kernel_statistics(adapter: &str, head_size: usize, f16: bool, tensor_cores: bool) -> Result<Vec<KernelStatistics>, GpuError> {
    let vulkan = Vulkan::open(adapter, f16, tensor_cores)?;
    compiled_variants(f16, tensor_cores).map(|(kernel, slots)| vulkan.statistics(kernel, slots, head_size)).collect()
}

/// A Vulkan instance and a device opened with the statistics extension, and the one layout
/// every kernel fits (its uniform words at binding 0, tensors at 1..=MAX_TENSORS).
struct Vulkan {
    instance: ash::Instance,
    device: ash::Device,
    statistics: ash::khr::pipeline_executable_properties::Device,
    set_layout: vk::DescriptorSetLayout,
    layout: vk::PipelineLayout,
    /// The SPIR-V version wgpu writes for this device's Vulkan version.
    spirv: (u8, u8),
}

fn vk_error(call: &'static str) -> impl Fn(vk::Result) -> GpuError {
    move |e| GpuError(format!("{call} failed: {e}"))
}

impl Vulkan {
    fn open(adapter: &str, f16: bool, tensor_cores: bool) -> Result<Vulkan, GpuError> {
        // SAFETY: loading the Vulkan loader runs its initialisation, as wgpu's own load does.
        let entry = unsafe { ash::Entry::load() }.map_err(|e| GpuError(format!("no Vulkan loader: {e}")))?;
        let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
        // SAFETY: valid create info; the instance is destroyed by `Vulkan::drop`, or below.
        let instance =
            unsafe { entry.create_instance(&vk::InstanceCreateInfo::default().application_info(&app), None) }.map_err(vk_error("vkCreateInstance"))?;
        // SAFETY: the instance is live; on any error it is destroyed once, here.
        match unsafe { Vulkan::open_device(&instance, adapter, f16, tensor_cores) } {
            Ok((device, spirv)) => {
                let statistics = ash::khr::pipeline_executable_properties::Device::new(&instance, &device);
                let mut vulkan =
                    Vulkan { instance, device, statistics, set_layout: vk::DescriptorSetLayout::null(), layout: vk::PipelineLayout::null(), spirv };
                let bindings: Vec<_> = (0..=MAX_TENSORS as u32)
                    .map(|b| {
                        let ty = if b == 0 { vk::DescriptorType::UNIFORM_BUFFER } else { vk::DescriptorType::STORAGE_BUFFER };
                        vk::DescriptorSetLayoutBinding::default().binding(b).descriptor_type(ty).descriptor_count(1).stage_flags(vk::ShaderStageFlags::COMPUTE)
                    })
                    .collect();
                // SAFETY: the device is live; both objects are destroyed by `Vulkan::drop`.
                unsafe {
                    vulkan.set_layout = vulkan
                        .device
                        .create_descriptor_set_layout(&vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings), None)
                        .map_err(vk_error("vkCreateDescriptorSetLayout"))?;
                    let sets = [vulkan.set_layout];
                    vulkan.layout = vulkan
                        .device
                        .create_pipeline_layout(&vk::PipelineLayoutCreateInfo::default().set_layouts(&sets), None)
                        .map_err(vk_error("vkCreatePipelineLayout"))?;
                }
                Ok(vulkan)
            }
            Err(e) => {
                // SAFETY: nothing made from the instance outlives it.
                unsafe { instance.destroy_instance(None) };
                Err(e)
            }
        }
    }

    /// The device named `adapter`, opened with the extension and what the kernels need.
    ///
    /// # Safety
    /// `instance` must be live.
    unsafe fn open_device(instance: &ash::Instance, adapter: &str, f16: bool, tensor_cores: bool) -> Result<(ash::Device, (u8, u8)), GpuError> {
        let physical = unsafe { instance.enumerate_physical_devices() }.map_err(vk_error("vkEnumeratePhysicalDevices"))?;
        let named = |&p: &vk::PhysicalDevice| {
            let properties = unsafe { instance.get_physical_device_properties(p) };
            properties.device_name_as_c_str().is_ok_and(|n| n.to_string_lossy() == adapter)
        };
        let physical = physical.into_iter().find(named).ok_or_else(|| GpuError(format!("no Vulkan device named {adapter}")))?;
        let api = unsafe { instance.get_physical_device_properties(physical) }.api_version;
        if api < vk::API_VERSION_1_2 {
            return Err(GpuError(format!("{adapter}'s Vulkan is older than 1.2")));
        }
        let extensions = unsafe { instance.enumerate_device_extension_properties(physical) }.map_err(vk_error("vkEnumerateDeviceExtensionProperties"))?;
        let has = |name: &std::ffi::CStr| extensions.iter().any(|e| e.extension_name_as_c_str() == Ok(name));
        let mut wanted = vec![ash::khr::pipeline_executable_properties::NAME];
        if tensor_cores {
            wanted.push(ash::khr::cooperative_matrix::NAME);
        }
        if let Some(missing) = wanted.iter().find(|n| !has(n)) {
            return Err(GpuError(format!("{adapter}'s driver lacks {}", missing.to_string_lossy())));
        }
        // What the device has, then what the kernels need of it.
        let mut v11 = vk::PhysicalDeviceVulkan11Features::default();
        let mut v12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut executables = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
        let mut coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
        let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut v11).push_next(&mut v12).push_next(&mut executables);
        if tensor_cores {
            features = features.push_next(&mut coop);
        }
        unsafe { instance.get_physical_device_features2(physical, &mut features) };
        let lacks = |what: &str| Err(GpuError(format!("{adapter} lacks {what}")));
        if executables.pipeline_executable_info == 0 {
            return lacks("pipelineExecutableInfo");
        }
        if f16 && (v12.shader_float16 == 0 || v11.storage_buffer16_bit_access == 0) {
            return lacks("shaderFloat16 or storageBuffer16BitAccess");
        }
        if tensor_cores && (coop.cooperative_matrix == 0 || v12.vulkan_memory_model == 0 || v12.vulkan_memory_model_device_scope == 0) {
            return lacks("cooperative matrices or the Vulkan memory model");
        }
        let mut v11 = vk::PhysicalDeviceVulkan11Features::default().storage_buffer16_bit_access(f16);
        let mut v12 =
            vk::PhysicalDeviceVulkan12Features::default().shader_float16(f16).vulkan_memory_model(tensor_cores).vulkan_memory_model_device_scope(tensor_cores);
        let mut executables = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default().pipeline_executable_info(true);
        let mut coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
        let families = unsafe { instance.get_physical_device_queue_family_properties(physical) };
        let compute =
            families.iter().position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE)).ok_or_else(|| GpuError(format!("{adapter} has no compute queue")))?;
        let priorities = [1.0];
        let queues = [vk::DeviceQueueCreateInfo::default().queue_family_index(compute as u32).queue_priorities(&priorities)];
        let names: Vec<*const std::ffi::c_char> = wanted.iter().map(|n| n.as_ptr()).collect();
        let mut info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_extension_names(&names)
            .push_next(&mut v11)
            .push_next(&mut v12)
            .push_next(&mut executables);
        if tensor_cores {
            info = info.push_next(&mut coop);
        }
        let device = unsafe { instance.create_device(physical, &info, None) }.map_err(vk_error("vkCreateDevice"))?;
        // The SPIR-V version wgpu writes for the device's Vulkan version.
        let spirv = if api >= vk::API_VERSION_1_3 { (1, 6) } else { (1, 5) };
        Ok((device, spirv))
    }

    /// Compiles `kernel` with f16 bindings `slots` and reads its statistics.
    fn statistics(&self, kernel: Kernel, slots: HalfSlots, head_size: usize) -> Result<KernelStatistics, GpuError> {
        let name = if slots == 0 { kernel.name().to_string() } else { format!("{} f16 {slots:#b}", kernel.name()) };
        let fail = |what: String| GpuError(format!("{name}: {what}"));
        let source = kernel_source(kernel, slots, head_size);
        let module = naga::front::wgsl::parse_str(&source).map_err(|e| fail(e.emit_to_string(&source)))?;
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .map_err(|e| fail(e.emit_to_string(&source)))?;
        let unchecked = naga::proc::BoundsCheckPolicy::Unchecked;
        let options = naga::back::spv::Options {
            lang_version: self.spirv,
            bounds_check_policies: naga::proc::BoundsCheckPolicies { index: unchecked, buffer: unchecked, image_load: unchecked, binding_array: unchecked },
            zero_initialize_workgroup_memory: naga::back::spv::ZeroInitializeWorkgroupMemoryMode::None,
            force_loop_bounding: false,
            emit_int_div_checks: false,
            ..Default::default()
        };
        let entry_point = kernel.name().to_string();
        let pipeline_options = naga::back::spv::PipelineOptions { shader_stage: naga::ShaderStage::Compute, entry_point };
        let words = naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline_options)).map_err(|e| fail(e.to_string()))?;
        let entry = CString::new(kernel.name()).expect("entry points have no NUL");
        // SAFETY: the device and layout are live; the module and pipeline are destroyed here.
        unsafe {
            let shader =
                self.device.create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None).map_err(vk_error("vkCreateShaderModule"))?;
            let stage = vk::PipelineShaderStageCreateInfo::default().stage(vk::ShaderStageFlags::COMPUTE).module(shader).name(&entry);
            let create = vk::ComputePipelineCreateInfo::default().flags(vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR).stage(stage).layout(self.layout);
            let pipeline = self.device.create_compute_pipelines(vk::PipelineCache::null(), &[create], None);
            self.device.destroy_shader_module(shader, None);
            let pipeline = pipeline.map_err(|(_, e)| vk_error("vkCreateComputePipelines")(e))?[0];
            let statistics = self.read(pipeline);
            self.device.destroy_pipeline(pipeline, None);
            Ok(KernelStatistics { kernel: name, statistics: statistics? })
        }
    }

    /// Every statistic of every executable of `pipeline`, as text.
    ///
    /// # Safety
    /// `pipeline` must be a live pipeline of this device made with `CAPTURE_STATISTICS_KHR`.
    unsafe fn read(&self, pipeline: vk::Pipeline) -> Result<Vec<(String, String)>, GpuError> {
        let executables = unsafe { self.statistics.get_pipeline_executable_properties(&vk::PipelineInfoKHR::default().pipeline(pipeline)) }
            .map_err(vk_error("vkGetPipelineExecutablePropertiesKHR"))?;
        let mut out = Vec::new();
        for index in 0..executables.len() as u32 {
            let info = vk::PipelineExecutableInfoKHR::default().pipeline(pipeline).executable_index(index);
            let statistics = unsafe { self.statistics.get_pipeline_executable_statistics(&info) }.map_err(vk_error("vkGetPipelineExecutableStatisticsKHR"))?;
            for s in statistics {
                let name = s.name_as_c_str().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                // SAFETY: `format` says which member of the union the driver wrote.
                let value = unsafe {
                    match s.format {
                        vk::PipelineExecutableStatisticFormatKHR::BOOL32 => (s.value.b32 != 0).to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => format!("{:.3}", s.value.f64),
                        _ => "?".to_string(),
                    }
                };
                out.push((name, value));
            }
        }
        Ok(out)
    }
}

impl Drop for Vulkan {
    fn drop(&mut self) {
        // SAFETY: everything made from the device is destroyed before it, and it before the
        // instance; nothing is in flight (no command was submitted).
        unsafe {
            self.device.destroy_pipeline_layout(self.layout, None);
            self.device.destroy_descriptor_set_layout(self.set_layout, None);
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}
