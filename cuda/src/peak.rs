//! The device's measured limits, for MFU and `info --backend cuda`: the products' peak in
//! each arithmetic (square cuBLASLt products) and the memory bandwidth (a copy kernel).
//!
//! Unstable: public for `alpha-native info` and the tests; it changes with any release (see the
//! crate's Stability section).

use crate::blas::{Addends, Arithmetic, Product, Products};
use crate::device::{args, Device};
use crate::error::CudaError;
use crate::memory::Buffer;
use std::time::Instant;

/// Runs `work` (queued) `reps` times after one warm-up and returns the best seconds of one.
fn best_seconds(device: &Device, reps: usize, mut work: impl FnMut() -> Result<(), CudaError>) -> Result<f64, CudaError> {
    work()?;
    device.synchronize()?;
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let start = Instant::now();
        work()?;
        device.synchronize()?;
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(best)
}

/// GFLOP/s of square `n x n x n` products in `arithmetic` (the best of a few).
pub fn product_gflops(device: &Device, arithmetic: Arithmetic, n: usize) -> Result<f64, CudaError> {
    let products = Products::new(device, arithmetic)?;
    let size = if arithmetic == Arithmetic::Bf16 { 2 } else { 4 };
    let (a, b) = (Buffer::zeroed(device, "a peak's operand", n * n, size)?, Buffer::zeroed(device, "a peak's operand", n * n, size)?);
    let d = Buffer::f32s(device, "a peak's product", n * n)?;
    let p = Product { transpose_a: true, transpose_b: false, m: n, n, k: n, accumulate: false };
    // SAFETY: n x n operands and output, apart.
    let seconds = best_seconds(device, 5, || unsafe { products.run(device, p, a.tensor().ptr, b.tensor().ptr, d.tensor().ptr, Addends::default()) })?;
    Ok(2.0 * (n as f64).powi(3) / seconds / 1e9)
}

/// GB/s of a device-to-device copy of `bytes` (read and written: twice the bytes moved).
pub fn bandwidth_gbs(device: &Device, bytes: usize) -> Result<f64, CudaError> {
    let vectors = bytes / 16;
    let (from, to) = (Buffer::zeroed(device, "a copy's source", vectors, 16)?, Buffer::zeroed(device, "a copy's target", vectors, 16)?);
    let blocks = 4 * device.info.multiprocessors.max(1) as u32 * 8;
    let seconds = best_seconds(device, 10, || {
        // SAFETY: `vectors` 16-byte elements each.
        unsafe { device.launch("copy_bandwidth", blocks, 256, &mut args![to.tensor().ptr, from.tensor().ptr, vectors as i64]) }
    })?;
    Ok(2.0 * (vectors * 16) as f64 / seconds / 1e9)
}
