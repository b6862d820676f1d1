//! alpha-cuda: runs alpha-core's tape on NVIDIA GPUs through CUDA, beside alpha-gpu's wgpu
//! path (which stays the one for other GPUs and browsers). The products go through
//! cuBLASLt, everything else through CUDA C kernels (`cuda/kernels/`, one file per op family
//! named like its WGSL twin) that NVRTC compiles at start for the device.
//!
//! The CUDA libraries are loaded at run time: the crate builds, and CI compiles it, on
//! machines without CUDA, and a missing driver or library is a one-line error
//! ([`device::check_libraries`]).
//!
//! ```no_run
//! use alpha_core::engine::Engine;
//! use alpha_core::optim::{AdamWConfig, LrSchedule};
//! use alpha_core::train::{OneRank, RunState, TrainConfig};
//! use alpha_core::{GptConfig, Plan};
//! use alpha_cuda::{Arithmetic, CudaEngine, Device};
//!
//! let config = GptConfig::gpt2(65, 64, 2, 2, 64);
//! let plan = Plan::new(config, 4, 64).unwrap();
//! let schedule = LrSchedule { max_lr: 1e-3, min_lr: 1e-4, warmup_iters: 0, decay_iters: 100 };
//! let cfg = TrainConfig { schedule, adamw: AdamWConfig::default(), grad_clip: 1.0, grad_accum: 1 };
//! let start = RunState::fresh(&plan, 1).unwrap();
//! let device = Device::open(0).unwrap();
//! let mut engine = CudaEngine::new(device, Arithmetic::F32, plan, cfg, &start, &OneRank, false).unwrap();
//! let data: Vec<u32> = (0..10_000).map(|i| i % 65).collect();
//! let report = futures_lite(engine.step(data[..].into(), true, &mut ())).unwrap();
//! println!("loss {}", report.stats.unwrap().loss);
//! # fn futures_lite<F: core::future::Future>(f: F) -> F::Output {
//! #     let waker = core::task::Waker::noop();
//! #     let mut f = core::pin::pin!(f);
//! #     match f.as_mut().poll(&mut core::task::Context::from_waker(&waker)) {
//! #         core::task::Poll::Ready(v) => v,
//! #         core::task::Poll::Pending => unreachable!("CUDA's futures are ready at once"),
//! #     }
//! # }
//! ```
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

pub use blas::{Arithmetic, Products};
pub use device::{Device, DeviceInfo};
pub use engine::CudaEngine;
pub use error::CudaError;
