//! One optimizer step with its wall-clock cost split into phases, shared by `train` and
//! `bench`.

use alpha_core::parallel::ThreadPool;
use alpha_core::train::{NonFinite, Trainer};
use serde_json::{json, Value};
use std::time::Instant;

/// Seconds spent in each phase, summed over one or more steps. `idle` is the wall time no
/// phase accounts for (between phases), so the phases always add up to `total`.
#[derive(Default, Clone, Copy, Debug, PartialEq)]
pub struct Phases {
    /// Drawing batches.
    pub data: f64,
    /// Forward passes (with the fused loss).
    pub forward: f64,
    /// Backward passes.
    pub backward: f64,
    /// The global gradient norm (the clip factor is folded into the optimizer).
    pub grad_norm: f64,
    /// AdamW, clip factor included.
    pub optimizer: f64,
    /// Evaluations.
    pub eval: f64,
    /// Samples.
    pub sample: f64,
    /// Checkpoint writes.
    pub checkpoint: f64,
    /// Wall time between the phases above.
    pub idle: f64,
    /// Wall time of everything.
    pub total: f64,
}

impl Phases {
    fn named(&self) -> [(&'static str, f64); 8] {
        [
            ("data", self.data),
            ("forward", self.forward),
            ("backward", self.backward),
            ("grad_norm", self.grad_norm),
            ("optimizer", self.optimizer),
            ("eval", self.eval),
            ("sample", self.sample),
            ("checkpoint", self.checkpoint),
        ]
    }

    /// Sets `total` to `wall` seconds and `idle` to what the phases leave of it.
    pub fn close(&mut self, wall: f64) {
        self.total = wall;
        self.idle = (wall - self.named().iter().map(|(_, s)| s).sum::<f64>()).max(0.0);
    }

    /// Adds another measurement.
    pub fn add(&mut self, o: &Phases) {
        self.data += o.data;
        self.forward += o.forward;
        self.backward += o.backward;
        self.grad_norm += o.grad_norm;
        self.optimizer += o.optimizer;
        self.eval += o.eval;
        self.sample += o.sample;
        self.checkpoint += o.checkpoint;
        self.idle += o.idle;
        self.total += o.total;
    }

    /// Milliseconds per step of every phase (and idle), as a JSON object.
    pub fn json_ms(&self, steps: f64) -> Value {
        let mut map = serde_json::Map::new();
        for (name, s) in self.named().into_iter().chain([("idle", self.idle)]) {
            map.insert(name.into(), json!(s * 1e3 / steps));
        }
        Value::Object(map)
    }
}

/// The result of [`timed_step`].
#[derive(Clone, Copy, Debug)]
pub struct TimedStep {
    /// Mean loss over the micro-batches.
    pub loss: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Where the time went.
    pub phases: Phases,
}

/// One optimizer step on batches of `data` (`grad_accum` micro-batches, norm, AdamW), each
/// phase timed. A non-finite loss or norm is an error and the update is not applied.
pub fn timed_step(trainer: &mut Trainer<'_, f32>, pool: &ThreadPool, data: &[u32]) -> Result<TimedStep, NonFinite> {
    let start = Instant::now();
    let mut ph = Phases::default();
    let timed = |slot: &mut f64, f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        *slot += t.elapsed().as_secs_f64();
    };
    trainer.zero_grads();
    let mut loss = 0.0;
    for _ in 0..trainer.cfg.grad_accum {
        timed(&mut ph.data, &mut || trainer.load_batch(data));
        timed(&mut ph.forward, &mut || loss += trainer.forward(pool));
        timed(&mut ph.backward, &mut || trainer.backward(pool));
    }
    loss /= trainer.cfg.grad_accum as f64;
    let mut grad_norm = 0.0;
    timed(&mut ph.grad_norm, &mut || grad_norm = trainer.grad_norm(pool));
    trainer.check_finite(loss, grad_norm)?;
    let lr = trainer.lr();
    timed(&mut ph.optimizer, &mut || trainer.apply(pool, grad_norm));
    ph.close(start.elapsed().as_secs_f64());
    Ok(TimedStep { loss, grad_norm, lr, phases: ph })
}
