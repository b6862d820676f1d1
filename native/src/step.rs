//! One optimizer step with its wall-clock cost split into phases, shared by `train` and
//! `bench`.

use crate::trace::Trace;
use alpha_core::data::Tokens;
use alpha_core::optim::{AdamWConfig, LrSchedule};
use alpha_core::parallel::ThreadPool;
use alpha_core::tape::{Observer, Op, Pass, Phase};
use alpha_core::train::{NonFinite, Ranks, RunState, TrainConfig, Trainer};
use alpha_core::{data, Plan, Rng};
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
    /// Summing gradients and losses over data-parallel ranks.
    pub allreduce: f64,
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
    /// GPU: drawing and writing the batches, encoding and submitting the step.
    pub submit: f64,
    /// GPU: waiting for the device to finish and reading results back.
    pub device_wait: f64,
    /// Wall time between the phases above.
    pub idle: f64,
    /// Wall time of everything.
    pub total: f64,
}

impl Phases {
    fn named(&self) -> [(&'static str, f64); 11] {
        [
            ("data", self.data),
            ("forward", self.forward),
            ("backward", self.backward),
            ("allreduce", self.allreduce),
            ("grad_norm", self.grad_norm),
            ("optimizer", self.optimizer),
            ("eval", self.eval),
            ("sample", self.sample),
            ("checkpoint", self.checkpoint),
            ("submit", self.submit),
            ("device_wait", self.device_wait),
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
        self.allreduce += o.allreduce;
        self.grad_norm += o.grad_norm;
        self.optimizer += o.optimizer;
        self.eval += o.eval;
        self.sample += o.sample;
        self.checkpoint += o.checkpoint;
        self.submit += o.submit;
        self.device_wait += o.device_wait;
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

/// Times each phase of a step into [`Phases`] and, while tracing, records phase and op spans.
struct StepTimer<'t> {
    phases: Phases,
    phase_start: Instant,
    trace: Option<&'t mut Trace>,
}

impl Observer for StepTimer<'_> {
    fn begin(&mut self, pass: Pass, index: usize, op: &Op) {
        if let Some(t) = self.trace.as_mut() {
            t.begin(pass, index, op);
        }
    }

    fn end(&mut self, pass: Pass, index: usize, op: &Op) {
        if let Some(t) = self.trace.as_mut() {
            t.end(pass, index, op);
        }
    }

    fn phase_begin(&mut self, _: Phase) {
        self.phase_start = Instant::now();
    }

    fn phase_end(&mut self, phase: Phase) {
        let end = Instant::now();
        let ph = &mut self.phases;
        let slot = match phase {
            Phase::Data => &mut ph.data,
            Phase::Forward => &mut ph.forward,
            Phase::Backward => &mut ph.backward,
            Phase::Allreduce => &mut ph.allreduce,
            Phase::GradNorm => &mut ph.grad_norm,
            Phase::Optimizer => &mut ph.optimizer,
        };
        *slot += (end - self.phase_start).as_secs_f64();
        if let Some(t) = self.trace.as_mut() {
            t.span(phase.name(), self.phase_start, end, Value::Null);
        }
    }
}

/// One optimizer step ([`Trainer::train_step_ranked`], as one of `ranks`) with each phase timed, and traced
/// (step, phases, ops) while `trace` is active (counting the step). A non-finite loss or norm
/// is an error and the update is not applied.
pub fn timed_step(
    trainer: &mut Trainer<'_, f32>,
    pool: &ThreadPool,
    data: Tokens<'_>,
    trace: Option<&mut Trace>,
    ranks: &dyn Ranks<f32>,
) -> Result<TimedStep, NonFinite> {
    let start = Instant::now();
    let step = trainer.step;
    let mut timer = StepTimer { phases: Phases::default(), phase_start: start, trace: trace.filter(|t| t.active()) };
    let stats = trainer.train_step_ranked(pool, data, &mut timer, ranks)?;
    timer.phases.close(start.elapsed().as_secs_f64());
    if let Some(t) = timer.trace {
        t.span("step", start, Instant::now(), json!({"step": step, "loss": stats.loss}));
        t.step_done();
    }
    Ok(TimedStep { loss: stats.loss, grad_norm: stats.grad_norm, lr: stats.lr, phases: timer.phases })
}

/// The settings `bench` and `info` train with: nanoGPT's optimizer settings.
pub fn bench_train_config(grad_accum: usize) -> TrainConfig {
    TrainConfig {
        schedule: LrSchedule { max_lr: 1e-3, min_lr: 1e-4, warmup_iters: 0, decay_iters: 1000 },
        adamw: AdamWConfig::default(),
        grad_clip: 1.0,
        grad_accum,
    }
}

/// The training split of `ids`, or an error if it is too short for `plan`'s blocks.
pub fn train_split<'a>(plan: &Plan, ids: &'a [u32]) -> Result<&'a [u32], String> {
    let (train, _) = data::split(ids);
    if train.len() <= plan.seq {
        return Err(format!("the training text has {} tokens; a block of {} needs more", train.len(), plan.seq));
    }
    Ok(train)
}

/// Where `bench` and `info` start: GPT-2 initialisation with seed 1337, batches from seed 1.
pub fn fresh_start(plan: &Plan) -> Result<RunState<f32>, String> {
    Ok(RunState { rng: Rng::new(1), ..RunState::fresh(plan, 1337).map_err(|e| e.to_string())? })
}
