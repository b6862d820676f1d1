//! `--trace FILE`: a Chrome trace (JSON trace-event format; open it in Perfetto or
//! chrome://tracing) of the first few steps: one span per step, per phase inside it, and per
//! op inside forward and backward, with the op's shape.

use crate::fsutil::write_atomic;
use alpha_core::tape::{Observer, Op, Pass};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Instant;

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

impl Trace {
    /// A trace of the next `steps` steps, to be written to `path`.
    pub fn new(path: &Path, steps: u64) -> Result<Self, String> {
        if steps == 0 {
            return Err("--trace-steps must be at least 1".into());
        }
        Ok(Trace { path: path.to_path_buf(), origin: Instant::now(), events: Vec::new(), open_ops: Vec::new(), steps_left: steps, written: false, error: None })
    }

    /// Whether steps are still being traced.
    pub fn active(&self) -> bool {
        self.steps_left > 0
    }

    /// Records a span from `start` to `end`.
    pub fn span(&mut self, name: &str, start: Instant, end: Instant, args: Value) {
        let us = |t: Instant| t.duration_since(self.origin).as_secs_f64() * 1e6;
        self.events.push(json!({"name": name, "ph": "X", "pid": 1, "tid": 1, "ts": us(start), "dur": us(end) - us(start), "args": args}));
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
    pub fn finish(&mut self) -> Result<(), String> {
        self.write();
        self.error.take().map_or(Ok(()), Err)
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
        let pass = match pass {
            Pass::Forward => "forward",
            Pass::Backward => "backward",
        };
        self.span(op.name(), start, end, json!({"pass": pass, "tape_index": index, "shape": shape}));
    }
}
