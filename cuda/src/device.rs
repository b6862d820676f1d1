//! The device a CUDA engine runs on ([`Device`]): the driver's context on one GPU, the
//! compiled kernels and the cuBLASLt handle, and the checks that turn a missing driver,
//! library or device into a one-line error before cudarc would panic.

use crate::compile;
use crate::error::CudaError;
use cudarc::cublaslt::{result as lt, sys as lt_sys};
use cudarc::driver::{result as drv, sys as drv_sys, CudaContext};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::Arc;

/// The most threads a kernel's block may have. A thread holds at most 255 registers, so at
/// 256 threads any kernel fits a block's 64K registers whatever ptxas gives it; a larger block
/// of a register-hungry kernel fails to launch ("too many resources requested"), and only on
/// a card (as attention's backward at head size 200 did with 512 threads).
pub(crate) const MAX_BLOCK_THREADS: u32 = 256;

/// The libraries a CUDA run loads: what `--backend cuda` needs installed.
const LIBRARIES: [(&str, &str); 3] = [("cuda", "the NVIDIA driver"), ("nvrtc", "NVRTC (the CUDA toolkit's runtime compiler)"), ("cublasLt", "cuBLASLt")];

/// An error naming the first library CUDA runs need (the driver, NVRTC, cuBLASLt) that cannot be loaded: the file names
/// looked for, and where (the loader's path).
pub fn check_libraries() -> Result<(), CudaError> {
    // SAFETY: each check only tries to open the library.
    let present = unsafe { [drv_sys::is_culib_present(), cudarc::nvrtc::sys::is_culib_present(), lt_sys::is_culib_present()] };
    match LIBRARIES.iter().zip(present).find(|(_, present)| !present) {
        None => Ok(()),
        Some(((lib, what), _)) => {
            let names = cudarc::get_lib_name_candidates(lib);
            let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
            Err(CudaError::new(format!(
                "CUDA is not usable here: {what} was not found (looked for {} on the loader's path: the system's library directories and LD_LIBRARY_PATH={path:?})",
                names.first().map(String::as_str).unwrap_or(lib)
            )))
        }
    }
}

/// The CUDA devices present (0 where the driver is missing or finds none).
pub fn device_count() -> usize {
    if check_libraries().is_err() || drv::init().is_err() {
        return 0;
    }
    drv::device::get_count().map_or(0, |n| n.max(0) as usize)
}

/// What a device is, for messages, records and `info`.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceInfo {
    /// Its ordinal among the process's CUDA devices.
    pub ordinal: usize,
    /// The device's name ("NVIDIA H200").
    pub name: String,
    /// Compute capability (9, 0).
    pub capability: (i32, i32),
    /// Streaming multiprocessors.
    pub multiprocessors: i32,
    /// Total and free memory, bytes (free when opened).
    pub total_memory: usize,
    /// Free when it was opened.
    pub free_memory: usize,
    /// The driver's CUDA version (13000 for 13.0).
    pub driver_version: i32,
}

impl DeviceInfo {
    /// The architecture NVRTC compiles for: `sm_90`.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.capability.0, self.capability.1)
    }

    /// Whether its tensor cores multiply bf16 (sm_80 and later).
    pub fn has_bf16(&self) -> bool {
        self.capability.0 >= 8
    }
}

/// One GPU opened for a run: its context (current on the thread that opened it), the kernels
/// compiled for it, a cuBLASLt handle and the stream its work is queued on, in order; reads
/// wait for it. (With the `emulate` feature, for tests without a GPU, it may
/// instead be the host running the same kernels: `Device::emulated`.)
pub struct Device {
    /// What it is.
    pub info: DeviceInfo,
    pub(crate) inner: Inner,
}

/// A real device, or the host emulating one.
pub(crate) enum Inner {
    Cuda(Cuda),
    #[cfg(feature = "emulate")]
    Host(crate::emulate::Host),
}

/// A real device's handles.
pub(crate) struct Cuda {
    ctx: Arc<CudaContext>,
    functions: HashMap<&'static str, drv_sys::CUfunction>,
    modules: Vec<drv_sys::CUmodule>,
    blas: lt_sys::cublasLtHandle_t,
    /// Every kernel, product, clear and asynchronous copy: a stream of its own (the legacy
    /// default stream cannot be captured into a graph), made blocking, so that the legacy
    /// stream's synchronous copies wait for its work and it for theirs.
    stream: drv_sys::CUstream,
}

/// Work captured once from the device's stream ([`Device::begin_capture`],
/// [`Device::end_capture`]) and replayed with one launch ([`Device::replay`]): the same
/// kernels with the same arguments, whose inputs the host changes in device memory between
/// replays.
pub(crate) struct Graph {
    exec: drv_sys::CUgraphExec,
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: instantiated in `end_capture`, destroyed once (a replay still queued keeps
        // what it needs).
        let _ = unsafe { drv::graph::exec_destroy(self.exec) };
    }
}

/// A driver error as a one-line message about `what`.
pub(crate) fn driver(what: &str) -> impl FnOnce(drv::DriverError) -> CudaError + '_ {
    move |e| {
        let name = e.error_string().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|_| format!("{e:?}"));
        CudaError::new(format!("CUDA: {what}: {name}"))
    }
}

impl Device {
    /// Opens device `ordinal` and compiles (or loads from the cache) every kernel for it.
    pub fn open(ordinal: usize) -> Result<Device, CudaError> {
        check_libraries()?;
        drv::init().map_err(driver("the driver did not start"))?;
        let count = drv::device::get_count().map_err(driver("counting devices"))?.max(0) as usize;
        if count == 0 {
            return Err(CudaError::new("CUDA finds no device on this machine (the driver is installed; is a GPU visible, CUDA_VISIBLE_DEVICES?)".into()));
        }
        if ordinal >= count {
            return Err(CudaError::new(format!(
                "--device {ordinal}: this machine has {count} CUDA device{} (0..={})",
                if count == 1 { "" } else { "s" },
                count - 1
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver("opening the device"))?;
        let attr = |a| ctx.attribute(a).map_err(driver("reading the device's attributes"));
        use drv_sys::CUdevice_attribute_enum as A;
        let (free_memory, total_memory) = ctx.mem_get_info().map_err(driver("reading the device's memory"))?;
        let mut driver_version = 0;
        // SAFETY: one out-parameter.
        unsafe { drv_sys::cuDriverGetVersion(&mut driver_version) }.result().map_err(driver("reading the driver's version"))?;
        let info = DeviceInfo {
            ordinal,
            name: ctx.name().map_err(driver("reading the device's name"))?,
            capability: (attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?, attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?),
            multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            total_memory,
            free_memory,
            driver_version,
        };
        let blas = lt::create_handle().map_err(|e| CudaError::new(format!("cuBLASLt did not start: {e}")))?;
        let stream = drv::stream::create(drv::stream::StreamKind::Default).map_err(driver("making a stream"))?;
        let mut cuda = Cuda { ctx, functions: HashMap::new(), modules: Vec::new(), blas, stream };
        cuda.load_kernels(&info.arch())?;
        Ok(Device { info, inner: Inner::Cuda(cuda) })
    }

    /// The host running the kernels in place of a device (the `emulate` feature: tests
    /// without a GPU; see `cuda/emulate/host.hpp`), as an sm_90 device.
    #[cfg(feature = "emulate")]
    pub fn emulated() -> Result<Device, CudaError> {
        let info = DeviceInfo {
            ordinal: 0,
            name: "the host, emulating a CUDA device".into(),
            capability: (9, 0),
            multiprocessors: 1,
            total_memory: 1 << 34,
            free_memory: 1 << 34,
            driver_version: 0,
        };
        Ok(Device { info, inner: Inner::Host(crate::emulate::Host::new()?) })
    }

    /// Makes the device's context current on this thread (a thread that did not open it).
    pub fn bind(&self) -> Result<(), CudaError> {
        match &self.inner {
            Inner::Cuda(c) => c.ctx.bind_to_thread().map_err(driver("binding the context")),
            #[cfg(feature = "emulate")]
            Inner::Host(_) => Ok(()),
        }
    }

    /// Queues kernel `name` over `grid` blocks of `block` threads (at most
    /// [`MAX_BLOCK_THREADS`]) with `args` (pointers to each argument, in the kernel's order and
    /// types).
    ///
    /// # Safety
    /// `args` match the kernel's parameters, and the memory they point to is valid for what
    /// the kernel reads and writes.
    pub(crate) unsafe fn launch(&self, name: &str, grid: u32, block: u32, args: &mut [*mut c_void]) -> Result<(), CudaError> {
        // Checked on the host's emulation too, so that no GPU is needed to find a launch that
        // would fail only on a card.
        assert!(block <= MAX_BLOCK_THREADS, "{name}: {block} threads a block, past {MAX_BLOCK_THREADS}");
        match &self.inner {
            Inner::Cuda(c) => {
                let f = *c.functions.get(name).unwrap_or_else(|| panic!("kernel {name} is not in compile::ENTRY_POINTS"));
                // SAFETY: forwarded to the caller; the device's stream.
                unsafe { drv::launch_kernel(f, (grid.max(1), 1, 1), (block, 1, 1), 0, c.stream, args) }.map_err(driver(name))
            }
            #[cfg(feature = "emulate")]
            // SAFETY: forwarded to the caller.
            Inner::Host(h) => unsafe { h.launch(name, grid.max(1), block, args) },
        }
    }

    /// The stream its work is queued on (null where the host emulates the device).
    pub(crate) fn stream(&self) -> drv_sys::CUstream {
        match &self.inner {
            Inner::Cuda(c) => c.stream,
            #[cfg(feature = "emulate")]
            Inner::Host(_) => std::ptr::null_mut(),
        }
    }

    /// Whether its work can be captured into a CUDA graph: a real device's (the host's
    /// emulation runs each launch as it is queued).
    pub fn captures(&self) -> bool {
        !self.is_host()
    }

    /// Starts capturing the work queued from this thread into a graph instead of running it
    /// (a device that [`Device::captures`]); [`Device::end_capture`] ends it.
    pub(crate) fn begin_capture(&self) -> Result<(), CudaError> {
        use drv_sys::CUstreamCaptureMode as Mode;
        // SAFETY: the device's live stream.
        unsafe { drv::stream::begin_capture(self.stream(), Mode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) }.map_err(driver("starting a graph's capture"))
    }

    /// Ends the capture [`Device::begin_capture`] started, once the work was `queued`: the
    /// graph to replay, or the first error (queueing's, then the capture's).
    pub(crate) fn end_capture(&self, queued: Result<(), CudaError>) -> Result<Graph, CudaError> {
        // SAFETY: the device's stream, capturing.
        let captured = unsafe { drv::stream::end_capture(self.stream()) };
        let graph = match (queued, captured) {
            (Ok(()), Ok(graph)) => graph,
            (queued, captured) => {
                if let Ok(graph) = captured {
                    // SAFETY: made by the capture, not instantiated.
                    let _ = unsafe { drv::graph::destroy(graph) };
                }
                queued?;
                return Err(driver("capturing a graph")(captured.expect_err("not both captured and queued")));
            }
        };
        // SAFETY: the graph just captured; destroyed once instantiated (the instance keeps its own copy).
        let exec = unsafe { drv::graph::instantiate(graph, drv_sys::CUgraphInstantiate_flags(0)) };
        // SAFETY: as above.
        let _ = unsafe { drv::graph::destroy(graph) };
        Ok(Graph { exec: exec.map_err(driver("instantiating a graph"))? })
    }

    /// Queues `graph`'s work once more.
    pub(crate) fn replay(&self, graph: &Graph) -> Result<(), CudaError> {
        // SAFETY: an instance made on this device, its memory alive (the engine's).
        unsafe { drv::graph::launch(graph.exec, self.stream()) }.map_err(driver("launching a graph"))
    }

    /// Waits for everything queued; an error a kernel hit surfaces here.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        match &self.inner {
            Inner::Cuda(c) => c.ctx.synchronize().map_err(driver("running the queued kernels")),
            #[cfg(feature = "emulate")]
            Inner::Host(_) => Ok(()),
        }
    }

    /// Free and total device memory now, bytes.
    pub fn memory(&self) -> Result<(usize, usize), CudaError> {
        match &self.inner {
            Inner::Cuda(c) => c.ctx.mem_get_info().map_err(driver("reading the device's memory")),
            #[cfg(feature = "emulate")]
            Inner::Host(_) => Ok((self.info.free_memory, self.info.total_memory)),
        }
    }

    /// The cuBLASLt handle (a real device's).
    pub(crate) fn blas(&self) -> lt_sys::cublasLtHandle_t {
        match &self.inner {
            Inner::Cuda(c) => c.blas,
            #[cfg(feature = "emulate")]
            Inner::Host(_) => unreachable!("the host runs its products itself"),
        }
    }

    /// Whether the host emulates this device (its memory is host memory).
    pub(crate) fn is_host(&self) -> bool {
        !matches!(self.inner, Inner::Cuda(_))
    }
}

impl Cuda {
    fn load_kernels(&mut self, arch: &str) -> Result<(), CudaError> {
        for ((name, source), (file, entries)) in compile::SOURCES.iter().zip(compile::ENTRY_POINTS) {
            debug_assert_eq!(*name, file);
            let image = compile::cubin(name, source, arch)?;
            // SAFETY: a cubin NVRTC made for this device's architecture.
            let module = unsafe { drv::module::load_data(image.as_ptr() as *const c_void) }.map_err(driver("loading a kernel"))?;
            self.modules.push(module);
            for entry in entries {
                let c_name = CString::new(*entry).expect("entry names hold no NUL");
                // SAFETY: `module` is loaded; the name is one of its extern "C" kernels.
                let f = unsafe { drv::module::get_function(module, c_name) }.map_err(driver(entry))?;
                self.functions.insert(entry, f);
            }
        }
        Ok(())
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        // SAFETY: created in `open`, released once, the stream's work finished first; the
        // context is still alive (held).
        unsafe {
            let _ = drv::stream::synchronize(self.stream);
            let _ = drv::stream::destroy(self.stream);
            let _ = lt::destroy_handle(self.blas);
            for &m in &self.modules {
                let _ = drv::module::unload(m);
            }
        }
    }
}

/// Kernel arguments as the driver wants them: a pointer to each value.
macro_rules! args {
    ($($arg:expr),* $(,)?) => {
        [$(&$arg as *const _ as *mut ::std::ffi::c_void),*]
    };
}
pub(crate) use args;
