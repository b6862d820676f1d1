//! Device memory: [`Buffer`]s the engine owns (the arenas, the batch, scratch) and the
//! [`Tensor`] views of them the walk hands to each op; the page-locked [`Staging`] the batch
//! is copied over from, and the [`HostMirror`] data-parallel ranks sum the gradients in.

use crate::device::{driver, Device};
use crate::error::CudaError;
use alpha_core::train::Ranks;
use cudarc::driver::{result as drv, sys as drv_sys};

/// A span of device memory: a raw pointer and a length in elements, as kernels take them.
/// Copy: the walk's tensors are handles into buffers the engine keeps alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tensor {
    /// The device address of the first element.
    pub ptr: drv_sys::CUdeviceptr,
    /// Elements.
    pub len: usize,
    /// Elements of 2 bytes, bf16 (an activation a bf16 run stores so, a bf16 copy or scratch),
    /// else of 4 (f32 or u32).
    pub bf16: bool,
}

impl Tensor {
    /// Elements `offset .. offset + len`.
    pub fn part(self, offset: usize, len: usize) -> Tensor {
        assert!(offset + len <= self.len, "a part past its tensor's end");
        Tensor { ptr: self.ptr + (self.element_bytes() * offset) as u64, len, ..self }
    }

    /// Bytes of an element: 2 or 4.
    pub fn element_bytes(self) -> usize {
        if self.bf16 {
            2
        } else {
            4
        }
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

    /// The whole buffer as a tensor of its elements (bf16 where they take 2 bytes).
    pub fn tensor(&self) -> Tensor {
        Tensor { ptr: self.ptr, len: self.len, bf16: self.size == 2 }
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

/// `len` zeroed elements of host memory: page-locked on a real device (the device copies from
/// and to it while the host goes on; a copy from pageable memory first waits for all the
/// queued work), plain where the host emulates the device. Freed on drop: its owner waits for
/// the copies that use it first.
struct HostMemory<T> {
    ptr: *mut T,
    len: usize,
    pinned: bool,
}

impl<T: Copy + Default> HostMemory<T> {
    fn new(device: &Device, what: &str, len: usize) -> Result<HostMemory<T>, CudaError> {
        if device.is_host() {
            let ptr = Box::into_raw(vec![T::default(); len.max(1)].into_boxed_slice()) as *mut T;
            return Ok(HostMemory { ptr, len, pinned: false });
        }
        let bytes = size_of::<T>() * len.max(1);
        let out_of_memory = format!("allocating {what} ({:.1} MiB of page-locked host memory)", bytes as f64 / 1048576.0);
        // SAFETY: a fresh allocation of `bytes`, zeroed before use.
        let ptr = unsafe { drv::malloc_host(bytes, 0) }.map_err(driver(&out_of_memory))? as *mut T;
        // SAFETY: `bytes` bytes at `ptr` are ours.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, bytes) };
        Ok(HostMemory { ptr, len, pinned: true })
    }

    /// Elements `range`, to read.
    ///
    /// # Safety
    /// No copy queued on the device writes them until the slice is dropped.
    unsafe fn slice(&self, range: std::ops::Range<usize>) -> &[T] {
        assert!(range.start <= range.end && range.end <= self.len, "host memory past its end");
        // SAFETY: in bounds; the caller keeps the device's writes off it.
        unsafe { std::slice::from_raw_parts(self.ptr.add(range.start), range.len()) }
    }

    /// Elements `range`, to write (or to hand to a copy that writes them).
    ///
    /// # Safety
    /// No copy queued on the device reads or writes them until the slice is dropped (or,
    /// handed to a copy, until that copy is done).
    unsafe fn slice_mut(&mut self, range: std::ops::Range<usize>) -> &mut [T] {
        assert!(range.start <= range.end && range.end <= self.len, "host memory past its end");
        // SAFETY: in bounds; the caller keeps the device off it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len()) }
    }
}

impl<T> Drop for HostMemory<T> {
    fn drop(&mut self) {
        if self.pinned {
            // SAFETY: made by malloc_host in `new`, freed once, its copies waited for by the owner.
            let _ = unsafe { drv::free_host(self.ptr as *mut std::ffi::c_void) };
        } else {
            // SAFETY: made in `new` from a boxed slice of `len.max(1)` elements, freed once.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len.max(1))) });
        }
    }
}

/// An event made on the current context: a point in a stream's work to wait for.
fn event() -> Result<drv_sys::CUevent, CudaError> {
    drv::event::create(drv_sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(driver("making an event"))
}

/// Page-locked host memory of `len` u32s that the device copies from while the host goes on,
/// with an event after the last copy queued from it: [`Staging::get`] waits for that copy
/// before handing the memory out to be written again.
pub struct Staging {
    memory: HostMemory<u32>,
    /// A real device's event after the last copy.
    copied: Option<drv_sys::CUevent>,
}

impl Staging {
    /// `len` zeroed u32s for `what` (named in an out-of-memory error).
    pub fn new(device: &Device, what: &str, len: usize) -> Result<Staging, CudaError> {
        let memory = HostMemory::new(device, what, len)?;
        let copied = if memory.pinned { Some(event()?) } else { None };
        Ok(Staging { memory, copied })
    }

    /// The memory to write, once the last copy from it has finished.
    pub fn get(&mut self) -> Result<&mut [u32], CudaError> {
        if let Some(event) = self.copied {
            // SAFETY: an event made with this staging (a fresh one is complete).
            unsafe { drv::event::synchronize(event) }.map_err(driver("waiting for a copy to the device"))?;
        }
        // SAFETY: no copy reads the memory now (waited for above), nor until the next
        // `copy_to`, which the borrow of `self` keeps until the slice is dropped.
        Ok(unsafe { self.memory.slice_mut(0..self.memory.len) })
    }

    /// Queues on `device` (the buffer's) a copy of elements `range` to `buffer` from its
    /// element `offset` (u32s).
    pub fn copy_to(&self, device: &Device, buffer: &Buffer, offset: usize, range: std::ops::Range<usize>) -> Result<(), CudaError> {
        assert!(buffer.size == 4 && range.end <= self.memory.len && offset + range.len() <= buffer.len, "a copy past a buffer's end");
        // SAFETY: in bounds (checked above); read only by this copy, and written again only
        // after `get` has waited for it.
        let src = unsafe { self.memory.slice(range) };
        match self.copied {
            None => {
                // SAFETY: in bounds of the host allocation (checked above).
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), (buffer.ptr as *mut u32).add(offset), src.len()) };
                Ok(())
            }
            // SAFETY: in bounds; the memory lives until the event after the copy completes
            // (drop waits for it).
            Some(event) => unsafe {
                drv::memcpy_htod_async(buffer.ptr + 4 * offset as u64, src, device.stream()).map_err(driver("copying to the device"))?;
                drv::event::record(event, device.stream()).map_err(driver("recording an event"))
            },
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(event) = self.copied {
            // SAFETY: made in `new`; the copy from the memory finishes before it is freed.
            unsafe {
                let _ = drv::event::synchronize(event);
                let _ = drv::event::destroy(event);
            }
        }
    }
}

/// A host copy of an f32 buffer taken piece by piece while the device's stream goes on (the
/// gradients a backward has finished, summed over data-parallel ranks while it computes the
/// rest): each piece copied on a stream of its own once the work queued before it on the
/// device's stream is done, and summed over the ranks once it has arrived; then copied back
/// whole. Copies at once where the host emulates the device.
pub struct HostMirror {
    /// First: dropped (waiting for every copy) before the memory is freed.
    copies: Option<Copies>,
    memory: HostMemory<f32>,
    /// The pieces queued since the last sum, in order, each with its arrival's event.
    pieces: Vec<(std::ops::Range<usize>, usize)>,
}

/// A real device's stream and events for [`HostMirror`]'s copies.
struct Copies {
    stream: drv_sys::CUstream,
    /// Recorded on the device's stream before each piece's copy, which waits for it.
    ready: drv_sys::CUevent,
    /// One per piece of a step (made as the pieces first need them), after its copy.
    arrived: Vec<drv_sys::CUevent>,
    /// After the copy back to the device, which reads the memory.
    returned: drv_sys::CUevent,
}

impl HostMirror {
    /// A mirror of `len` f32s for `what` (named in an out-of-memory error).
    pub fn new(device: &Device, what: &str, len: usize) -> Result<HostMirror, CudaError> {
        let memory = HostMemory::new(device, what, len)?;
        let copies = if memory.pinned {
            let stream = drv::stream::create(drv::stream::StreamKind::NonBlocking).map_err(driver("making a stream"))?;
            // The stream first: a failure below still destroys it (with the events made).
            let mut copies = Copies { stream, ready: std::ptr::null_mut(), arrived: Vec::new(), returned: std::ptr::null_mut() };
            copies.ready = event()?;
            copies.returned = event()?;
            Some(copies)
        } else {
            None
        };
        Ok(HostMirror { copies, memory, pieces: Vec::new() })
    }

    /// Queues a copy of `buffer`'s elements `range` into the mirror's, after the work queued
    /// on `device` so far, without holding that work up.
    pub fn copy_piece(&mut self, device: &Device, buffer: &Buffer, range: std::ops::Range<usize>) -> Result<(), CudaError> {
        assert!(buffer.size == 4 && range.end <= buffer.len && range.end <= self.memory.len, "a piece past a buffer's end");
        let index = self.pieces.len();
        // SAFETY: in bounds (checked above); nothing reads it until its copy has arrived
        // (`sum_pieces` waits), and the last copy back has finished (waited for below).
        let dst = unsafe { self.memory.slice_mut(range.clone()) };
        match self.copies.as_mut() {
            None => {
                // SAFETY: in bounds of the host allocation (checked above).
                unsafe { std::ptr::copy_nonoverlapping((buffer.ptr as *const f32).add(range.start), dst.as_mut_ptr(), dst.len()) };
            }
            Some(c) => {
                if index == c.arrived.len() {
                    c.arrived.push(event()?);
                }
                // SAFETY: live events and streams; in bounds; the copy back of the last sum
                // read this memory before the device's stream reached here, and the memory
                // lives until the copy arrives (drop waits for it).
                unsafe {
                    drv::event::record(c.ready, device.stream()).map_err(driver("recording an event"))?;
                    drv::stream::wait_event(c.stream, c.ready, drv_sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT).map_err(driver("ordering a copy"))?;
                    drv::memcpy_dtoh_async(dst, buffer.ptr + 4 * range.start as u64, c.stream).map_err(driver("copying from the device"))?;
                    drv::event::record(c.arrived[index], c.stream).map_err(driver("recording an event"))?;
                }
            }
        }
        self.pieces.push((range, index));
        Ok(())
    }

    /// Sums the pieces queued since the last call over `ranks`, in order, each started as soon
    /// as it has arrived (the device computing on meanwhile); returns when every sum is done.
    pub fn sum_pieces(&mut self, ranks: &dyn Ranks<f32>) -> Result<(), CudaError> {
        for (range, index) in std::mem::take(&mut self.pieces) {
            if let Some(c) = &self.copies {
                // SAFETY: an event this mirror recorded after the piece's copy.
                unsafe { drv::event::synchronize(c.arrived[index]) }.map_err(driver("waiting for a copy from the device"))?;
            }
            // SAFETY: the piece has arrived and no copy touches it until `finish_sums` below
            // returns (the copy back comes after); pieces do not overlap (`copy_piece`'s
            // callers hand out disjoint ranges).
            unsafe { ranks.start_sum(self.memory.slice_mut(range)) };
        }
        ranks.finish_sums();
        Ok(())
    }

    /// Queues on `device` a copy of the whole mirror back into `buffer`.
    pub fn copy_back(&self, device: &Device, buffer: &Buffer) -> Result<(), CudaError> {
        assert!(buffer.size == 4 && buffer.len == self.memory.len, "a mirror of another buffer");
        // SAFETY: every sum has finished (`sum_pieces`), and the next piece's copy into it
        // waits for the device's stream to pass this copy.
        let src = unsafe { self.memory.slice(0..self.memory.len) };
        match &self.copies {
            None => {
                // SAFETY: in bounds of the host allocation (the same length).
                unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), buffer.ptr as *mut f32, src.len()) };
                Ok(())
            }
            // SAFETY: in bounds; the memory lives until the event after the copy completes
            // (drop waits for it).
            Some(c) => unsafe {
                drv::memcpy_htod_async(buffer.ptr, src, device.stream()).map_err(driver("copying to the device"))?;
                drv::event::record(c.returned, device.stream()).map_err(driver("recording an event"))
            },
        }
    }
}

impl Drop for Copies {
    fn drop(&mut self) {
        // SAFETY: made in `HostMirror::new` (null where not made), destroyed once, after every
        // copy on the stream and the copy back have finished.
        unsafe {
            let _ = drv::stream::synchronize(self.stream);
            if !self.returned.is_null() {
                let _ = drv::event::synchronize(self.returned);
                let _ = drv::event::destroy(self.returned);
            }
            if !self.ready.is_null() {
                let _ = drv::event::destroy(self.ready);
            }
            for &e in &self.arrived {
                let _ = drv::event::destroy(e);
            }
            let _ = drv::stream::destroy(self.stream);
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
