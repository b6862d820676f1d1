//! Reading device buffers back without blocking: a copy into a mappable buffer, `map_async`,
//! and a future that completes when the mapping does (on native, the device is polled to
//! completion first, so the future is ready at once).

use crate::context::{Gpu, GpuError};
use crate::kernels::bytes;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// Runs a future to completion on the calling thread (native frontends; wgpu's native futures
/// are ready once the device has been polled, which every readback here does).
pub fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

#[derive(Default)]
struct MapState {
    result: Option<Result<(), wgpu::BufferAsyncError>>,
    waker: Option<Waker>,
}

/// Completes when the `map_async` whose callback shares `state` has finished.
struct Mapped(Arc<Mutex<MapState>>);

impl Future for Mapped {
    type Output = Result<(), wgpu::BufferAsyncError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match s.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// `len` 32-bit words of `src` from word `offset`, read back as `T` (f32 or u32).
pub async fn read<T: bytemuck::Pod>(gpu: &Gpu, src: &wgpu::Buffer, offset: usize, len: usize) -> Result<Vec<T>, GpuError> {
    let mut out = vec![T::zeroed(); len];
    if len > 0 {
        read_into(gpu, src, offset, &staging_buffer(gpu, len), &mut out).await?;
    }
    Ok(out)
}

/// A buffer [`read_into`] can read `len` words back through (a caller that reads as much
/// every step keeps one rather than allocating it each time).
pub fn staging_buffer(gpu: &Gpu, len: usize) -> wgpu::Buffer {
    gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("readback"),
        size: bytes(len.max(1)),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

/// [`read`] into `out` (its length in words) through `staging` (from [`staging_buffer`], at
/// least as long): no buffer allocated.
pub async fn read_into<T: bytemuck::Pod>(gpu: &Gpu, src: &wgpu::Buffer, offset: usize, staging: &wgpu::Buffer, out: &mut [T]) -> Result<(), GpuError> {
    let size = bytes(out.len());
    if size == 0 {
        return Ok(());
    }
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(src, bytes(offset), staging, 0, size);
    gpu.queue.submit([enc.finish()]);
    let state = Arc::new(Mutex::new(MapState::default()));
    let cb_state = state.clone();
    staging.map_async(wgpu::MapMode::Read, ..size, move |r| {
        let mut s = cb_state.lock().unwrap_or_else(|e| e.into_inner());
        s.result = Some(r);
        if let Some(w) = s.waker.take() {
            w.wake();
        }
    });
    // Native: wait here (a no-op in the browser, where the event loop completes the map).
    gpu.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| GpuError(format!("GPU readback failed: {e}")))?;
    Mapped(state).await.map_err(|e| GpuError(format!("GPU readback failed: {e}")))?;
    let view = staging.get_mapped_range(..size).map_err(|e| GpuError(format!("GPU readback failed: {e}")))?;
    out.copy_from_slice(bytemuck::cast_slice::<u8, T>(&view));
    drop(view);
    staging.unmap();
    Ok(())
}
