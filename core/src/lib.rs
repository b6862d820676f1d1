//! # alpha-core
//!
//! Allocation-free training of GPT-2 style language models, usable without `std`.
//!
//! - [`plan::Plan`] computes, from a [`GptConfig`] and the batch shape, where every tensor
//!   lives in caller-owned arenas.
//! - [`tape::record`] turns the model into a static list of fused ops; [`walk::forward`] and
//!   [`walk::backward`] walk it on an [`walk::Executor`]: [`cpu::CpuExecutor`] runs the
//!   hand-written kernels from [`ops`] (alpha-gpu's executor records GPU dispatches).
//! - [`train::Trainer`] adds batching ([`data`]), gradient clipping and AdamW ([`optim`]).
//! - [`tokenizer::CharTokenizer`] maps text to ids; [`model::generate`] samples.
//! - [`run`]: the defaults, presets and loop of a training run, shared by every frontend;
//!   `engine::Engine` (feature `alloc`): the one interface a run trains through, the CPU's
//!   `engine::CpuEngine` and alpha-gpu's implementing it.
//!
//! Nothing allocates inside a training step. Features: `alloc` adds owned buffers
//! ([`train::OwnedMemory`]) and building a vocabulary from text; `std` adds
//! [`parallel::ThreadPool`] and run-time SIMD detection in the GEMM; `checkpoint` adds the
//! safetensors checkpoint format (`checkpoint`) and Hugging Face models from and to bytes
//! ([`hf`]: GPT-2, Llama, Qwen2).
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
