#![doc = include_str!("../README.md")]
//!
//! ## Map
//!
//! - [`context`]: adapter choice, features and limits ([`Gpu`]).
//! - [`kernels`]: the compiled pipelines and how a dispatch binds its tensors.
//! - [`ops`]: per op family, the dispatches of its forward and backward (twins of
//!   `alpha_core::ops`, over the same argument structs).
//! - `executor`: the core's walk of the tape recorded into programs of those dispatches.
//! - [`layout`]: where each parameter lives on the device.
//! - [`forward`]: a forward-only model, for evaluation and sampling ([`GpuForward`]).
//! - [`trainer`]: the whole training step, one submission per step ([`GpuTrainer`]).
//! - [`engine`]: the GPU's implementation of alpha-core's one training interface
//!   ([`GpuEngine`]).
//! - [`profile`]: timestamp queries around every kernel, for traces
//!   (`alpha_core::tape::KernelTime`).
//! - [`peak`]: the device's arithmetic limit in f32 and f16 ([`peak::FmaProbe`]), for MFU.
//! - `driver_stats` (native): what the Vulkan driver's compiler made of each kernel
//!   (registers, local memory), for `info --kernels`.

pub mod context;
#[cfg(not(target_arch = "wasm32"))]
pub mod driver_stats;
pub mod engine;
mod executor;
pub mod forward;
pub mod kernels;
pub mod layout;
mod memory;
pub mod ops;
pub mod peak;
pub mod profile;
mod readback;
pub mod trainer;

pub use context::{AdapterSummary, Gpu, GpuError, Precision, TensorCores};
pub use engine::GpuEngine;
pub use forward::GpuForward;
pub use readback::{block_on, read};
pub use trainer::{GpuStats, GpuTrainer};
