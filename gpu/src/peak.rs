//! The device's arithmetic limit, measured: [`FmaProbe`] runs `shaders/peak.wgsl` (independent
//! chains of vector fused multiply-adds on registers, in f32 or f16) or `shaders/peak_tensor.wgsl`
//! (chains of cooperative-matrix products on the tensor cores) over many workgroups, and
//! [`measure`] times it on the caller's clock. MFU on a GPU is measured against this, never a
//! table of cards.
//!
//! Unstable: public for `alpha-native info` and the tests; it changes with any release (see the
//! crate's Stability section).

use crate::context::{Gpu, GpuError};
use std::num::NonZeroU64;

/// Threads per workgroup of `fma_peak`.
const WORKGROUP: u64 = 256;
/// FLOPs one thread does per rep of `fma_peak`: eight chains of four-lane FMAs, two
/// operations each.
const FMA_FLOPS_PER_REP: u64 = 8 * 4 * 2;
/// FLOPs one thread does per rep of `tensor_peak`: its subgroup's eight 16 x 16 x 16 products
/// (two operations per multiply-add) over the subgroup's 32 threads.
const TENSOR_FLOPS_PER_REP: u64 = 8 * 2 * 16 * 16 * 16 / 32;

/// The element type the probe's chains run in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Real {
    /// 32-bit floats.
    F32,
    /// 16-bit floats (needs the device's `shader-f16`).
    F16,
    /// f16 products summed in f32 on the tensor cores, 16 x 16 x 16 cooperative matrices
    /// (what f16 products run on the tensor cores; needs a device opened with them).
    Tensor,
}

/// The compiled FMA probe for one element type.
pub struct FmaProbe {
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    reps: wgpu::Buffer,
    /// What the threads write (read back to wait for a run).
    sink: wgpu::Buffer,
    flops_per_rep: u64,
}

/// The probe's (source, entry point, FLOPs per thread and rep) in `real`.
fn probe_source(real: Real) -> (String, &'static str, u64) {
    match real {
        Real::F32 => (format!("alias real = f32;\n{}", include_str!("../shaders/peak.wgsl")), "fma_peak", FMA_FLOPS_PER_REP),
        Real::F16 => (format!("enable f16;\nalias real = f16;\n{}", include_str!("../shaders/peak.wgsl")), "fma_peak", FMA_FLOPS_PER_REP),
        Real::Tensor => {
            let source = format!("enable f16;\nenable wgpu_cooperative_matrix;\n{}", include_str!("../shaders/peak_tensor.wgsl"));
            (source, "tensor_peak", TENSOR_FLOPS_PER_REP)
        }
    }
}

impl FmaProbe {
    /// The probe in `real`; an error where the device lacks `shader-f16` for [`Real::F16`],
    /// was opened without tensor cores for [`Real::Tensor`], or cannot compile it.
    pub async fn new(gpu: &Gpu, real: Real) -> Result<FmaProbe, GpuError> {
        if real == Real::F16 && !gpu.features.contains(wgpu::Features::SHADER_F16) {
            return Err(GpuError(format!("{} has no shader-f16", gpu.adapter.name)));
        }
        if real == Real::Tensor && !gpu.tensor_cores() {
            return Err(GpuError(format!("the tensor-core probe needs {} opened with tensor cores (--precision f16 --tensor-cores on)", gpu.adapter.name)));
        }
        let (source, entry, flops_per_rep) = probe_source(real);
        let device = &gpu.device;
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = gpu.shader_module("peak", &source);
        let pipeline = gpu.compute_pipeline(&module, entry, None);
        let buffer = |label, size, usage| device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size, usage, mapped_at_creation: false });
        let reps = buffer("peak reps", 16, wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST);
        // One word per thread of the largest dispatch a caller may ask for.
        let sink = buffer("peak sink", 4 * WORKGROUP * u64::from(u16::MAX), wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC);
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
        Ok(FmaProbe { pipeline, bind_group, reps, sink, flops_per_rep })
    }

    /// Runs `workgroups` (at most 65535) workgroups of `reps` rounds and resolves when they
    /// have finished (a word of their output read back: in the browser too); returns the
    /// FLOPs done.
    pub async fn run(&self, gpu: &Gpu, workgroups: u32, reps: u32) -> Result<f64, GpuError> {
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
        crate::readback::read::<u32>(gpu, &self.sink, 0, 1).await.map_err(|e| GpuError(format!("the FMA probe failed: {e}")))?;
        Ok((u64::from(workgroups) * WORKGROUP * u64::from(reps) * self.flops_per_rep) as f64)
    }
}

/// GFLOP/s of [`FmaProbe`] in `real` on `gpu`: workgroups, then rounds, grown fourfold until
/// one run takes 50 ms (those runs also warm the device up), then the best of three. `now` is
/// the caller's clock in seconds.
pub async fn measure(gpu: &Gpu, real: Real, now: &dyn Fn() -> f64) -> Result<f64, GpuError> {
    let probe = FmaProbe::new(gpu, real).await?;
    let (mut workgroups, mut reps) = (64u32, 64u32);
    loop {
        let t = now();
        probe.run(gpu, workgroups, reps).await?;
        if now() - t >= 0.05 || reps >= 1 << 20 {
            break;
        }
        if workgroups < 16384 {
            workgroups *= 4;
        } else {
            reps *= 4;
        }
    }
    let mut best = 0f64;
    for _ in 0..3 {
        let t = now();
        let flops = probe.run(gpu, workgroups, reps).await?;
        best = best.max(flops / (now() - t).max(1e-9) / 1e9);
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every probe passes naga's WGSL front end and validator (no device here has the tensor
    /// cores to compile that one).
    #[test]
    fn every_probe_is_valid_wgsl() {
        use wgpu::naga::valid::{Capabilities, ValidationFlags, Validator};
        for real in [Real::F32, Real::F16, Real::Tensor] {
            let (source, entry, _) = probe_source(real);
            let module = wgpu::naga::front::wgsl::parse_str(&source).unwrap_or_else(|e| panic!("{real:?}: {}", e.emit_to_string(&source)));
            assert!(module.entry_points.iter().any(|e| e.name == entry), "{real:?}: no entry point {entry}");
            Validator::new(ValidationFlags::all(), Capabilities::all()).validate(&module).unwrap_or_else(|e| panic!("{real:?}: {}", e.emit_to_string(&source)));
        }
    }
}
