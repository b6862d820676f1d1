//! Fused CPU kernels. Each file holds one op family: forward, backward, and a
//! finite-difference gradient check of the backward against the forward (run in `f64`).
//!
//! Unstable: public for alpha-gpu's and alpha-cuda's executors and the tests; it changes with
//! any release (see the crate's Stability section).
//!
//! Shapes use `N = B*T` rows, `C` channels, `V` vocabulary, `NH` heads of size `HS`.
//! Backward kernels accumulate (`+=`) into parameter gradients, so gradient accumulation
//! over micro-batches needs no extra pass.

pub mod attention;
pub mod cross_entropy;
pub mod dropout;
pub mod embedding;
pub mod grad_norm;
pub mod layernorm;
pub mod matmul;
pub mod rmsnorm;

#[cfg(test)]
pub(crate) mod gradcheck;

/// Columns per task for kernels that reduce over rows column by column.
pub(crate) const COLUMN_CHUNK: usize = 64;

pub mod row_blocks;
