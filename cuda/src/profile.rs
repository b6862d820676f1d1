//! Kernel times for `--trace` on CUDA (the twin of alpha-gpu's `profile.rs`): an event is
//! recorded on the device's stream before and after every kernel and product of a step, and
//! read after the step as [`KernelTime`]s, each with its work (FLOPs, bytes) for its achieved
//! rates. On the host's emulation the stamps are the host's clock (its launches run at once).

use crate::device::{driver, Device, Inner};
use crate::error::CudaError;
use alpha_core::tape::{KernelTime, Work};
use cudarc::driver::{result as drv, sys as drv_sys};

/// A point on the device's clock: an event, or the host's clock on its emulation.
enum Stamp {
    Event(drv_sys::CUevent),
    #[cfg(feature = "emulate")]
    Host(std::time::Instant),
}

/// One stamped kernel: its pass, op, entry point and work.
struct Entry {
    pass: &'static str,
    op: &'static str,
    kernel: &'static str,
    work: Work,
}

/// The stamps of one step's kernels, two per kernel, kept from step to step (events are
/// made once and recorded again).
pub(crate) struct Profiler {
    stamps: Vec<Stamp>,
    entries: Vec<Entry>,
}

impl Profiler {
    pub fn new() -> Profiler {
        Profiler { stamps: Vec::new(), entries: Vec::new() }
    }

    /// Forgets the last step's kernels (a new step starts).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Stamps the start of `kernel` of `op` in `pass`, queued next on `device`.
    pub fn start(&mut self, device: &Device, pass: &'static str, op: &'static str, kernel: &'static str, work: Work) -> Result<(), CudaError> {
        self.entries.push(Entry { pass, op, kernel, work });
        self.stamp(device, 2 * self.entries.len() - 2)
    }

    /// Stamps the end of the kernel started last.
    pub fn end(&mut self, device: &Device) -> Result<(), CudaError> {
        self.stamp(device, 2 * self.entries.len() - 1)
    }

    /// Records stamp `i` (made on first use) on `device`'s stream now.
    fn stamp(&mut self, device: &Device, i: usize) -> Result<(), CudaError> {
        if i == self.stamps.len() {
            self.stamps.push(match &device.inner {
                Inner::Cuda(_) => Stamp::Event(drv::event::create(drv_sys::CUevent_flags::CU_EVENT_DEFAULT).map_err(driver("making a timing event"))?),
                #[cfg(feature = "emulate")]
                Inner::Host(_) => Stamp::Host(std::time::Instant::now()),
            });
        }
        match &mut self.stamps[i] {
            // SAFETY: an event made above on the device's context; the device's stream.
            Stamp::Event(e) => unsafe { drv::event::record(*e, device.stream()) }.map_err(driver("recording a timing event")),
            #[cfg(feature = "emulate")]
            Stamp::Host(t) => {
                *t = std::time::Instant::now();
                Ok(())
            }
        }
    }

    /// The last step's kernels, their times from the first one's start (after the device has
    /// run them: synchronize first).
    pub fn read(&self) -> Result<Vec<KernelTime>, CudaError> {
        let Some(origin) = self.stamps.first() else { return Ok(Vec::new()) };
        let ns = |s: &Stamp| -> Result<f64, CudaError> {
            match (origin, s) {
                // SAFETY: both events made on this context and recorded on its stream.
                (Stamp::Event(a), Stamp::Event(b)) => Ok(1e6 * unsafe { drv::event::elapsed(*a, *b) }.map_err(driver("reading a timing event"))? as f64),
                #[cfg(feature = "emulate")]
                (Stamp::Host(a), Stamp::Host(b)) => Ok(b.duration_since(*a).as_nanos() as f64),
                #[cfg(feature = "emulate")]
                _ => unreachable!("one device's stamps are all of one kind"),
            }
        };
        self.entries
            .iter()
            .zip(self.stamps.chunks_exact(2))
            .map(|(e, s)| {
                Ok(KernelTime { pass: e.pass, op: e.op, kernel: e.kernel, start_ns: ns(&s[0])?, end_ns: ns(&s[1])?, flops: e.work.flops, bytes: e.work.bytes })
            })
            .collect()
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        for s in &self.stamps {
            match s {
                // SAFETY: made in `stamp`, destroyed once; the engine drops its profiler
                // before its device.
                Stamp::Event(e) => drop(unsafe { drv::event::destroy(*e) }),
                #[cfg(feature = "emulate")]
                Stamp::Host(_) => {}
            }
        }
    }
}
