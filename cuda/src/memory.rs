//! Device memory: [`Buffer`]s the engine owns (the arenas, the batch, scratch) and the
//! [`Tensor`] views of them the walk hands to each op; the page-locked [`Staging`] the batch
//! is copied over from.

use crate::device::{driver, Device};
use crate::error::CudaError;
use cudarc::driver::{result as drv, sys as drv_sys};

/// A span of device memory: a raw pointer and a length in elements, as kernels take them.
/// Copy: the walk's tensors are handles into buffers the engine keeps alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tensor {
    /// The device address of the first element.
    pub ptr: drv_sys::CUdeviceptr,
    /// Elements.
    pub len: usize,
}

impl Tensor {
    /// Elements `offset .. offset + len` of a tensor of 4-byte elements (f32 or u32).
    pub fn part(self, offset: usize, len: usize) -> Tensor {
        assert!(offset + len <= self.len, "a part past its tensor's end");
        Tensor { ptr: self.ptr + 4 * offset as u64, len }
    }
}

/// An allocation of `len` elements of `size` bytes each, freed on drop: device memory, or
/// host memory where the host emulates the device.
pub struct Buffer {
    ptr: drv_sys::CUdeviceptr,
    len: usize,
    size: usize,
    /// The host's allocation layout, where the host emulates the device.
    host: Option<std::alloc::Layout>,
}

/// Host buffers start at this alignment, as device allocations do (at least 256 bytes).
const HOST_ALIGN: usize = 256;

impl Buffer {
    /// `len` zeroed elements of `size` bytes on `device`, for `what` (named in an
    /// out-of-memory error).
    pub fn zeroed(device: &Device, what: &str, len: usize, size: usize) -> Result<Buffer, CudaError> {
        let bytes = (len * size).max(size);
        let out_of_memory = || format!("allocating {what} ({:.1} MiB)", bytes as f64 / 1048576.0);
        if device.is_host() {
            let layout = std::alloc::Layout::from_size_align(bytes, HOST_ALIGN).map_err(|_| CudaError::new(out_of_memory()))?;
            // SAFETY: a non-zero size.
            let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
            if ptr.is_null() {
                return Err(CudaError::new(out_of_memory()));
            }
            return Ok(Buffer { ptr: ptr as u64, len, size, host: Some(layout) });
        }
        // SAFETY: a fresh allocation of `bytes`, zeroed before use.
        let ptr = unsafe { drv::malloc_sync(bytes) }.map_err(|e| driver(&out_of_memory())(e))?;
        let buffer = Buffer { ptr, len, size, host: None };
        // SAFETY: `bytes` bytes at `ptr` are ours.
        unsafe { drv::memset_d8_sync(ptr, 0, bytes) }.map_err(driver("clearing memory"))?;
        Ok(buffer)
    }

    /// `len` zeroed f32 elements on `device`.
    pub fn f32s(device: &Device, what: &str, len: usize) -> Result<Buffer, CudaError> {
        Buffer::zeroed(device, what, len, 4)
    }

    /// The whole buffer as a tensor of its elements.
    pub fn tensor(&self) -> Tensor {
        Tensor { ptr: self.ptr, len: self.len }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes.
    pub fn bytes(&self) -> usize {
        self.len * self.size
    }

    /// Copies `data` to elements `offset ..` (after the queued work; the host may reuse
    /// `data` when it returns).
    pub fn upload<T: Copy>(&self, offset: usize, data: &[T]) -> Result<(), CudaError> {
        assert!(size_of::<T>() == self.size && offset + data.len() <= self.len, "an upload past the buffer's end");
        if self.host.is_some() {
            // SAFETY: in bounds of the host allocation (checked above).
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), (self.ptr as *mut T).add(offset), data.len()) };
            return Ok(());
        }
        // SAFETY: in bounds of the allocation (checked above).
        unsafe { drv::memcpy_htod_sync(self.ptr + (offset * self.size) as u64, data) }.map_err(driver("copying to the device"))
    }

    /// Elements `offset .. offset + out.len()` into `out`, after the queued work.
    pub fn download<T: Copy>(&self, offset: usize, out: &mut [T]) -> Result<(), CudaError> {
        assert!(size_of::<T>() == self.size && offset + out.len() <= self.len, "a download past the buffer's end");
        if self.host.is_some() {
            // SAFETY: in bounds of the host allocation (checked above).
            unsafe { std::ptr::copy_nonoverlapping((self.ptr as *const T).add(offset), out.as_mut_ptr(), out.len()) };
            return Ok(());
        }
        // SAFETY: in bounds of the allocation (checked above).
        unsafe { drv::memcpy_dtoh_sync(out, self.ptr + (offset * self.size) as u64) }.map_err(driver("copying from the device"))
    }

    /// Zeroes elements `range`, queued on `device` (the buffer's).
    pub fn clear(&self, device: &Device, range: std::ops::Range<usize>) -> Result<(), CudaError> {
        assert!(range.end <= self.len);
        let at = self.ptr + (range.start * self.size) as u64;
        if self.host.is_some() {
            // SAFETY: in bounds of the host allocation.
            unsafe { std::ptr::write_bytes(at as *mut u8, 0, range.len() * self.size) };
            return Ok(());
        }
        // SAFETY: in bounds of the allocation.
        unsafe { drv::memset_d8_async(at, 0, range.len() * self.size, device.stream()) }.map_err(driver("clearing memory"))
    }
}

/// Page-locked host memory of `len` u32s that the device copies from while the host goes on
/// (a copy from pageable memory first waits for all the queued work), with an event after
/// the last copy queued from it: [`Staging::get`] waits for that copy before handing the
/// memory out to be written again. Plain host memory where the host emulates the device.
pub struct Staging {
    ptr: *mut u32,
    len: usize,
    /// A real device's: the page-locked allocation and the event after its last copy.
    pinned: Option<drv_sys::CUevent>,
}

impl Staging {
    /// `len` zeroed u32s for `what` (named in an out-of-memory error).
    pub fn new(device: &Device, what: &str, len: usize) -> Result<Staging, CudaError> {
        let bytes = 4 * len.max(1);
        if device.is_host() {
            let ptr = Box::into_raw(vec![0u32; len.max(1)].into_boxed_slice()) as *mut u32;
            return Ok(Staging { ptr, len, pinned: None });
        }
        let out_of_memory = format!("allocating {what} ({:.1} MiB of page-locked host memory)", bytes as f64 / 1048576.0);
        // SAFETY: a fresh allocation of `bytes`, zeroed before use.
        let ptr = unsafe { drv::malloc_host(bytes, 0) }.map_err(driver(&out_of_memory))? as *mut u32;
        // SAFETY: `bytes` bytes at `ptr` are ours.
        unsafe { std::ptr::write_bytes(ptr, 0, len.max(1)) };
        let event = drv::event::create(drv_sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        match event {
            Ok(event) => Ok(Staging { ptr, len, pinned: Some(event) }),
            Err(e) => {
                // SAFETY: allocated above, not yet handed out.
                let _ = unsafe { drv::free_host(ptr as *mut std::ffi::c_void) };
                Err(driver("making an event")(e))
            }
        }
    }

    /// The memory to write, once the last copy from it has finished.
    pub fn get(&mut self) -> Result<&mut [u32], CudaError> {
        if let Some(event) = self.pinned {
            // SAFETY: an event made with this staging (a fresh one is complete).
            unsafe { drv::event::synchronize(event) }.map_err(driver("waiting for a copy to the device"))?;
        }
        // SAFETY: `len` u32s owned by this staging; no copy reads them now.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }

    /// Queues on `device` (the buffer's) a copy of elements `range` to `buffer` from its
    /// element `offset` (u32s).
    pub fn copy_to(&self, device: &Device, buffer: &Buffer, offset: usize, range: std::ops::Range<usize>) -> Result<(), CudaError> {
        assert!(buffer.size == 4 && range.end <= self.len && offset + range.len() <= buffer.len, "a copy past a buffer's end");
        // SAFETY: in bounds of both (checked above).
        let src = unsafe { std::slice::from_raw_parts(self.ptr.add(range.start), range.len()) };
        match self.pinned {
            None => {
                // SAFETY: in bounds of the host allocation (checked above).
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), (buffer.ptr as *mut u32).add(offset), src.len()) };
                Ok(())
            }
            Some(event) => {
                // SAFETY: in bounds (checked above); the memory stays untouched until the
                // event after the copy completes (`get` waits for it), and lives until then
                // (drop waits too).
                unsafe {
                    drv::memcpy_htod_async(buffer.ptr + 4 * offset as u64, src, device.stream()).map_err(driver("copying to the device"))?;
                    drv::event::record(event, device.stream()).map_err(driver("recording an event"))
                }
            }
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        match self.pinned {
            // SAFETY: made in `new` from a boxed slice of `len.max(1)` u32s, freed once.
            None => drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len.max(1))) }),
            // SAFETY: made in `new`; the copy from it finishes before it is freed.
            Some(event) => unsafe {
                let _ = drv::event::synchronize(event);
                let _ = drv::event::destroy(event);
                let _ = drv::free_host(self.ptr as *mut std::ffi::c_void);
            },
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        match self.host {
            // SAFETY: allocated in `zeroed` with this layout, freed once.
            Some(layout) => unsafe { std::alloc::dealloc(self.ptr as *mut u8, layout) },
            // SAFETY: allocated in `zeroed`, freed once; the synchronous free waits for the
            // work that uses it.
            None => {
                let _ = unsafe { drv::free_sync(self.ptr) };
            }
        }
    }
}
