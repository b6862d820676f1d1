//! One optimizer step with its wall-clock cost split into phases, shared by `train` and
//! `bench`.

use crate::trace::Trace;
use alpha_core::data::Tokens;
use alpha_core::engine::{Engine, StepError, StepReport};
use alpha_core::optim::{AdamWConfig, LrSchedule};
use alpha_core::tape::{KernelTime, Observer, Op, Pass, Phase};
use alpha_core::train::{RunState, TrainConfig};
use alpha_core::{data, Plan, Rng};
use alpha_gpu::block_on;
use anyhow::{anyhow, Result};
use serde_json::{json, Value};
use std::ops::Range;
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

/// The clock of one step: times each phase into [`Phases`] and, while tracing, records phase
/// and op spans and a device's kernels (an [`Observer`] the step is given); see
/// [`StepClock::finish`].
pub struct StepClock<'t> {
    started: Instant,
    phases: Phases,
    phase_start: Instant,
    /// A device's submit and the end of its wait, for placing its kernels on the trace.
    submitted: Option<Range<Instant>>,
    waited: Option<Instant>,
    trace: Option<&'t mut Trace>,
}

impl Observer for StepClock<'_> {
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
            Phase::Submit => &mut ph.submit,
            Phase::DeviceWait => &mut ph.device_wait,
        };
        *slot += (end - self.phase_start).as_secs_f64();
        match phase {
            Phase::Submit => self.submitted = Some(self.phase_start..end),
            Phase::DeviceWait => self.waited = Some(end),
            _ => {}
        }
        if let Some(t) = self.trace.as_mut() {
            t.span(phase.name(), self.phase_start, end, Value::Null);
        }
    }

    fn wants_kernel_times(&self) -> bool {
        self.trace.is_some()
    }

    fn kernel_times(&mut self, kernels: &[KernelTime]) {
        if let Some(t) = self.trace.as_mut() {
            // An engine that reports no submit and wait ran its kernels within the step,
            // which they ended with.
            let now = Instant::now();
            t.gpu_kernels(self.submitted.clone().unwrap_or(self.started..now), self.waited.unwrap_or(now), kernels);
        }
    }
}

impl<'t> StepClock<'t> {
    /// A clock started now, tracing into `trace` while it is active.
    pub fn start(trace: Option<&'t mut Trace>) -> StepClock<'t> {
        let now = Instant::now();
        StepClock { started: now, phases: Phases::default(), phase_start: now, submitted: None, waited: None, trace: trace.filter(|t| t.active()) }
    }

    /// The phases of step `step`, which reported `report` (`total`: since [`StepClock::start`]);
    /// while tracing, the step's span, and the step counted.
    pub fn finish(mut self, step: u64, report: &StepReport) -> Phases {
        self.phases.close(self.started.elapsed().as_secs_f64());
        if let Some(t) = self.trace {
            t.span("step", self.started, Instant::now(), json!({"step": step, "loss": report.stats.map(|s| s.loss)}));
            t.step_done();
        }
        self.phases
    }
}

/// One optimizer step of `engine` with each phase timed, and traced (step, phases, ops, a
/// device's kernels) while `trace` is active (counting the step); `observed` false times the
/// whole step only (no clock inside it). With `report` the step's statistics come back (a
/// device waits for them). A non-finite loss or norm is an error and the update is not applied.
pub fn timed_step(
    engine: &mut dyn Engine,
    data: Tokens<'_>,
    report: bool,
    trace: Option<&mut Trace>,
    observed: bool,
) -> Result<(StepReport, Phases), StepError> {
    let step = engine.step_count();
    let mut clock = StepClock::start(trace);
    let report = if observed { block_on(engine.step(data, report, &mut clock))? } else { block_on(engine.step(data, report, &mut ()))? };
    Ok((report, clock.finish(step, &report)))
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
pub fn train_split<'a>(plan: &Plan, ids: &'a [u32]) -> Result<&'a [u32]> {
    let (train, _) = data::split(ids);
    if train.len() <= plan.seq {
        return Err(anyhow!("the training text has {} tokens; a block of {} needs more", train.len(), plan.seq));
    }
    Ok(train)
}

/// Where `bench` and `info` start: GPT-2 initialisation with seed 1337, batches from seed 1.
pub fn fresh_start(plan: &Plan) -> Result<RunState<f32>> {
    Ok(RunState { rng: Rng::new(1), ..RunState::fresh(plan, 1337)? })
}
