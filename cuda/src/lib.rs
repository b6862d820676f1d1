#![doc = include_str!("../README.md")]
//!
//! ## Map
//!
//! - [`device`]: the libraries, the device, its kernels ([`Device`]).
//! - [`compile`]: the kernel sources and NVRTC, with the on-disk cache of cubins.
//! - [`blas`]: the products through cuBLASLt, algorithms pinned per shape ([`Products`]).
//! - `memory`: device buffers and the tensors the walk hands out.
//! - `executor`: the core's walk queued as kernels and products.
//! - [`engine`]: the CUDA implementation of alpha-core's one training interface ([`CudaEngine`]).
//! - [`peak`]: the device's measured product peaks and memory bandwidth, for MFU and `info`.

pub mod blas;
pub mod compile;
pub mod device;
#[cfg(feature = "emulate")]
mod emulate;
pub mod engine;
mod error;
mod executor;
#[cfg(test)]
mod kernel_tests;
mod memory;
pub mod peak;
mod profile;

pub use blas::{Arithmetic, Products};
pub use device::{Device, DeviceInfo};
pub use engine::CudaEngine;
pub use error::CudaError;
