//! The device's arithmetic limit, measured: [`FmaProbe`] runs `shaders/peak.wgsl` (independent
//! chains of vector fused multiply-adds on registers, in f32 or f16) over many workgroups; the
//! caller times it. MFU on a GPU is measured against this, never a table of cards.

use crate::context::{Gpu, GpuError};
use std::num::NonZeroU64;

/// Threads per workgroup of `fma_peak`.
const WORKGROUP: u64 = 256;
/// FLOPs one thread does per rep: eight chains of four-lane FMAs, two operations each.
const FLOPS_PER_REP: u64 = 8 * 4 * 2;

/// The element type the probe's chains run in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Real {
    /// 32-bit floats.
    F32,
    /// 16-bit floats (needs the device's `shader-f16`).
    F16,
}

/// The compiled FMA probe for one element type.
pub struct FmaProbe {
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    reps: wgpu::Buffer,
}

impl FmaProbe {
    /// The probe in `real`; an error where the device lacks `shader-f16` for [`Real::F16`] or
    /// cannot compile it.
    pub async fn new(gpu: &Gpu, real: Real) -> Result<FmaProbe, GpuError> {
        let prelude = match real {
            Real::F32 => "alias real = f32;\n",
            Real::F16 if gpu.features.contains(wgpu::Features::SHADER_F16) => "enable f16;\nalias real = f16;\n",
            Real::F16 => return Err(GpuError(format!("{} has no shader-f16", gpu.adapter.name))),
        };
        let device = &gpu.device;
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let source = format!("{prelude}{}", include_str!("../../shaders/peak.wgsl"));
        let module = gpu.shader_module("peak", &source);
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("fma_peak"),
            layout: None,
            module: &module,
            entry_point: Some("fma_peak"),
            compilation_options: Default::default(),
            cache: None,
        });
        let buffer = |label, size, usage| device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size, usage, mapped_at_creation: false });
        let reps = buffer("peak reps", 16, wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST);
        // One word per thread of the largest dispatch a caller may ask for.
        let sink = buffer("peak sink", 4 * WORKGROUP * u64::from(u16::MAX), wgpu::BufferUsages::STORAGE);
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("peak"),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer: &reps, offset: 0, size: NonZeroU64::new(16) }),
                },
                wgpu::BindGroupEntry { binding: 1, resource: sink.as_entire_binding() },
            ],
        });
        if let Some(e) = scope.pop().await {
            return Err(GpuError(format!("{} cannot run the FMA probe: {e}", gpu.adapter.name)));
        }
        Ok(FmaProbe { pipeline, bind_group, reps })
    }

    /// Submits `workgroups` (at most 65535) workgroups of `reps` rounds and waits for them
    /// (native: the device is polled to completion); returns the FLOPs done.
    pub fn run(&self, gpu: &Gpu, workgroups: u32, reps: u32) -> Result<f64, GpuError> {
        let workgroups = workgroups.clamp(1, u32::from(u16::MAX));
        gpu.queue.write_buffer(&self.reps, 0, bytemuck::cast_slice(&[reps, 0, 0, 0]));
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &self.bind_group, &[]);
            pass.dispatch_workgroups(workgroups, 1, 1);
        }
        gpu.queue.submit([enc.finish()]);
        gpu.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| GpuError(format!("the FMA probe failed: {e}")))?;
        Ok((u64::from(workgroups) * WORKGROUP * u64::from(reps) * FLOPS_PER_REP) as f64)
    }
}
