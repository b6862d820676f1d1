//! `--trace FILE`: a Chrome trace (JSON trace-event format; open it in Perfetto or
//! chrome://tracing) of the first few steps: one span per step, per phase inside it, and per
//! op inside forward and backward, with the op's shape. GPU runs add a second track with every
//! kernel's time from timestamp queries.

use crate::fsutil::{check_replaceable, write_atomic};
use alpha_core::tape::{KernelTime, Observer, Op, Pass};
use anyhow::{anyhow, Result};
use serde_json::{json, Value};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Track (trace "thread") of host spans.
const CPU_TRACK: u32 = 1;
/// Track of GPU kernel spans.
const GPU_TRACK: u32 = 2;

/// Collects spans for a bounded number of steps, then writes them once.
pub struct Trace {
    path: PathBuf,
    origin: Instant,
    events: Vec<Value>,
    open_ops: Vec<Instant>,
    steps_left: u64,
    written: bool,
    error: Option<String>,
}

/// The most steps `--trace-steps` may record (a trace is held in memory until written).
pub const MAX_TRACE_STEPS: u64 = 1000;

impl Trace {
    /// A trace of the next `steps` steps, to be written to `path`, which must be absent (or,
    /// with `overwrite`, a regular file).
    pub fn new(path: &Path, steps: u64, overwrite: bool) -> Result<Self> {
        if !(1..=MAX_TRACE_STEPS).contains(&steps) {
            return Err(anyhow!("--trace-steps must be between 1 and {MAX_TRACE_STEPS}, got {steps}"));
        }
        check_replaceable(path).map_err(|e| anyhow!("--trace {}: {e}", path.display()))?;
        if path.exists() && !overwrite {
            return Err(anyhow!("--trace {} already exists; choose another file, or pass --overwrite to replace it", path.display()));
        }
        let track = |tid: u32, name: &str| json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": name}});
        let events = vec![track(CPU_TRACK, "CPU"), track(GPU_TRACK, "GPU")];
        Ok(Trace { path: path.to_path_buf(), origin: Instant::now(), events, open_ops: Vec::new(), steps_left: steps, written: false, error: None })
    }

    /// Whether steps are still being traced.
    pub fn active(&self) -> bool {
        self.steps_left > 0
    }

    fn us(&self, t: Instant) -> f64 {
        t.duration_since(self.origin).as_secs_f64() * 1e6
    }

    /// Records a span from `start` to `end` on the CPU track.
    pub fn span(&mut self, name: &str, start: Instant, end: Instant, args: Value) {
        let (ts, dur) = (self.us(start), self.us(end) - self.us(start));
        self.events.push(json!({"name": name, "ph": "X", "pid": 1, "tid": CPU_TRACK, "ts": ts, "dur": dur, "args": args}));
    }

    /// Records one step's kernels on the GPU track. The device's clock is not the host's:
    /// the kernels ran after the submit began (`submit.start`) and ended before their results
    /// were read (`read`), so the first is placed at the end of the submit call, moved earlier
    /// when that would end the last one after `read`.
    pub fn gpu_kernels(&mut self, submit: Range<Instant>, read: Instant, kernels: &[KernelTime]) {
        let busy_us = kernels.iter().map(|k| k.end_ns).fold(0.0, f64::max) / 1e3;
        let at = self.us(submit.end).min(self.us(read) - busy_us).max(self.us(submit.start));
        for k in kernels {
            let args = json!({"pass": k.pass, "kernel": k.kernel, "op": k.op, "flops": k.flops, "bytes": k.bytes});
            let (ts, dur) = (at + k.start_ns / 1e3, (k.end_ns - k.start_ns) / 1e3);
            self.events.push(json!({"name": k.op, "ph": "X", "pid": 1, "tid": GPU_TRACK, "ts": ts, "dur": dur, "args": args}));
        }
    }

    /// Closes a traced step; writes the file right after the last one (an error is kept
    /// for [`Trace::finish`]).
    pub(crate) fn step_done(&mut self) {
        self.steps_left = self.steps_left.saturating_sub(1);
        if self.steps_left == 0 {
            self.write();
        }
    }

    fn write(&mut self) {
        if !self.written {
            self.written = true;
            let doc = json!({"traceEvents": self.events, "displayTimeUnit": "ms"});
            if let Err(e) = write_atomic(&self.path, doc.to_string().as_bytes()) {
                self.error = Some(format!("cannot write trace {}: {e}", self.path.display()));
            }
        }
    }

    /// Writes what was collected if that has not happened yet (a run that ends early writes a
    /// shorter trace) and reports a failed write.
    pub fn finish(&mut self) -> Result<()> {
        self.write();
        self.error.take().map_or(Ok(()), |e| Err(anyhow!(e)))
    }
}

impl Observer for Trace {
    fn begin(&mut self, _: Pass, _: usize, _: &Op) {
        self.open_ops.push(Instant::now());
    }

    fn end(&mut self, pass: Pass, index: usize, op: &Op) {
        let end = Instant::now();
        let start = self.open_ops.pop().expect("every op end follows its begin");
        let mut shape = String::new();
        let _ = op.describe_shape(&mut shape);
        let (flops, bytes) = op.work(pass);
        self.span(op.name(), start, end, json!({"pass": pass.name(), "tape_index": index, "shape": shape, "flops": flops, "bytes": bytes}));
    }
}
