//! The host in place of a CUDA device, for tests without a GPU (the `emulate` feature): the
//! kernel files compiled by the system's C++ compiler after `cuda/emulate/host.hpp` (one
//! shared library per file, cached under the temporary directory by the sources' hash) and
//! run block by block, threads as fibers (see host.hpp); the products are `blas`'s plain
//! host sums in f64. It checks the kernels' and the executor's logic against the CPU; the
//! device's own rounding and speed are the lent GPU's to check (scripts/cuda-check.sh).

use crate::compile::{full_source, ENTRY_POINTS, SOURCES};
use crate::error::CudaError;
use std::collections::HashMap;
use std::ffi::c_void;
use std::path::Path;

/// What every emulated kernel file starts with.
const HOST: &str = include_str!("../emulate/host.hpp");

/// The C++ compiler's flags for a kernel file (part of the cache's key): optimised, since
/// the emulated tests are long, but without strict aliasing, since the kernels view memory
/// through more than one type (a `float4` tile staged as floats), as CUDA allows.
const FLAGS: [&str; 6] = ["-std=c++20", "-O2", "-fno-strict-aliasing", "-shared", "-fPIC", "-pthread"];

type Entry = unsafe extern "C" fn(*mut *mut c_void);
type Launch = unsafe extern "C" fn(Entry, u32, u32, *mut *mut c_void);

/// The kernel files' libraries and their entry points.
pub(crate) struct Host {
    /// Kernel name: (its file's `emu_launch`, its `emu_NAME` wrapper).
    entries: HashMap<&'static str, (Launch, Entry)>,
    _libraries: Vec<libloading::Library>,
}

impl Host {
    /// Compiles (or finds compiled) every kernel file and loads it.
    pub fn new() -> Result<Host, CudaError> {
        let compiler = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
        let mut sources = Vec::new();
        for ((name, source), (_, entries)) in SOURCES.iter().zip(ENTRY_POINTS) {
            let wrappers: String = entries.iter().map(|e| format!("EMULATE({e})\n")).collect();
            sources.push((*name, entries, format!("{HOST}\n{}\n{wrappers}", full_source(source))));
        }
        let texts = FLAGS.iter().copied().chain(sources.iter().map(|(_, _, s)| s.as_str()));
        let hash = texts.fold(0xcbf2_9ce4_8422_2325u64, |h, s| s.bytes().fold(h, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)));
        let dir = std::env::temp_dir().join(format!("alpha-cuda-emulate-{hash:016x}"));
        std::fs::create_dir_all(&dir).map_err(|e| CudaError::new(format!("cannot create {}: {e}", dir.display())))?;
        // The files compile in parallel: a few seconds each.
        let built: Vec<Result<std::path::PathBuf, CudaError>> = std::thread::scope(|s| {
            let jobs: Vec<_> = sources.iter().map(|(name, _, text)| s.spawn(|| build(&compiler, &dir, name, text))).collect();
            jobs.into_iter().map(|j| j.join().expect("a compile thread panicked")).collect()
        });
        let (mut entries, mut libraries) = (HashMap::new(), Vec::new());
        for ((_, names, _), path) in sources.iter().zip(built) {
            // SAFETY: a library built above from the kernels and host.hpp (no initialisers
            // beyond the C++ runtime's).
            let lib = unsafe { libloading::Library::new(path?) }.map_err(|e| CudaError::new(format!("cannot load an emulated kernel file: {e}")))?;
            // SAFETY: the symbols host.hpp defines, with these signatures.
            unsafe {
                let launch: Launch = *lib.get::<Launch>(b"emu_launch\0").map_err(|e| CudaError::new(e.to_string()))?;
                for name in names.iter() {
                    let entry: Entry = *lib.get::<Entry>(format!("emu_{name}\0").as_bytes()).map_err(|e| CudaError::new(e.to_string()))?;
                    entries.insert(*name, (launch, entry));
                }
            }
            libraries.push(lib);
        }
        Ok(Host { entries, _libraries: libraries })
    }

    /// Runs kernel `name` over `grid` blocks of `block` threads, now.
    ///
    /// # Safety
    /// As [`crate::device::Device::launch`], with host pointers.
    pub unsafe fn launch(&self, name: &str, grid: u32, block: u32, args: &mut [*mut c_void]) -> Result<(), CudaError> {
        let (launch, entry) = *self.entries.get(name).unwrap_or_else(|| panic!("kernel {name} is not in compile::ENTRY_POINTS"));
        // SAFETY: forwarded to the caller.
        unsafe { launch(entry, grid, block, args.as_mut_ptr()) };
        Ok(())
    }
}

/// Compiles kernel file `name` (`text`, host.hpp included) into `dir`, unless there already.
fn build(compiler: &str, dir: &Path, name: &str, text: &str) -> Result<std::path::PathBuf, CudaError> {
    let library = dir.join(format!("{name}.so"));
    if library.exists() {
        return Ok(library);
    }
    // Names of this build's own: several tests (threads) may build at once.
    static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mine = format!("{}-{}", std::process::id(), BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let source = dir.join(format!("{name}-{mine}.cpp"));
    std::fs::write(&source, text).map_err(|e| CudaError::new(format!("cannot write {}: {e}", source.display())))?;
    let tmp = dir.join(format!("{name}-{mine}.so"));
    let out = std::process::Command::new(compiler)
        .args(FLAGS)
        .arg("-o")
        .arg(&tmp)
        .arg(&source)
        .output()
        .map_err(|e| CudaError::new(format!("the host emulation needs a C++ compiler ({compiler}: {e})")))?;
    let _ = std::fs::remove_file(&source);
    if !out.status.success() {
        return Err(CudaError::new(format!("{compiler} could not compile {name}.cu for the host:\n{}", String::from_utf8_lossy(&out.stderr))));
    }
    std::fs::rename(&tmp, &library).map_err(|e| CudaError::new(format!("cannot keep {}: {e}", library.display())))?;
    Ok(library)
}
