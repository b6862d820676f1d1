#![doc = include_str!("../README.md")]
//!
//! ## Map
//!
//! - [`plan::Plan`] computes, from a [`GptConfig`] and the batch shape, where every tensor
//!   lives in caller-owned arenas.
//! - [`tape::record`] turns the model into a static list of fused ops; [`walk::forward`] and
//!   [`walk::backward`] walk it on an [`walk::Executor`]: [`cpu::CpuExecutor`] runs the
//!   hand-written kernels from [`ops`] (alpha-gpu's and alpha-cuda's executors queue device
//!   kernels).
//! - [`train::Trainer`] adds batching ([`data`]), gradient clipping and AdamW ([`optim`]).
//! - [`tokenizer`]: characters, byte-level BPE; [`model::generate`] samples.
//! - [`run`]: the defaults, presets and loop of a training run, shared by every frontend;
//!   `engine::Engine` (feature `alloc`): the one interface a run trains through, the CPU's
//!   `engine::CpuEngine` and the GPU crates' implementing it.
//! - `checkpoint` and `hf` (feature `checkpoint`): Alpha's checkpoints and Hugging Face
//!   models (GPT-2, Llama, Qwen2) from and to bytes.
#![cfg_attr(not(any(test, feature = "std")), no_std)]

#[cfg(feature = "alloc")]
extern crate alloc;

#[cfg(feature = "checkpoint")]
pub mod checkpoint;
pub mod config;
pub mod cpu;
pub mod data;
#[cfg(feature = "alloc")]
pub mod engine;
pub mod float;
pub mod gemm;
#[cfg(feature = "checkpoint")]
pub mod hf;
pub mod model;
pub mod ops;
pub mod optim;
pub mod parallel;
pub mod plan;
pub mod rng;
pub mod run;
#[cfg(all(feature = "alloc", feature = "serde"))]
pub mod settings;
pub mod simd;
pub mod tape;
pub mod tokenizer;
pub mod train;
pub mod walk;

pub use config::{Arch, ConfigError, GptConfig, Llama, RopeScaling};
pub use float::Float;
pub use parallel::{Parallel, Serial};
pub use plan::Plan;
pub use rng::Rng;
