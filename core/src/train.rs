//! A training loop over caller-owned memory: batching, forward, backward, gradient clipping
//! and AdamW, split into phases a frontend can time, plus evaluation.

use crate::config::ConfigError;
use crate::cpu::{Batch, CpuExecutor};
use crate::data::{sample_batch, skip_batch, Tokens};
use crate::float::Float;
use crate::ops::grad_norm;
use crate::optim::{adamw_step, AdamWConfig, AdamWTensors, LrSchedule};
use crate::parallel::{shard, split_range, Parallel, SharedMut};
#[cfg(feature = "alloc")]
use crate::plan::try_vec;
use crate::plan::Plan;
use crate::rng::Rng;
use crate::tape::{Observer, Op, Phase};
use crate::walk;
use core::fmt;

/// Optimisation settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainConfig {
    /// Learning-rate schedule.
    pub schedule: LrSchedule,
    /// AdamW settings.
    pub adamw: AdamWConfig,
    /// Clip the global gradient norm to this; 0 disables clipping.
    pub grad_clip: f64,
    /// Micro-batches accumulated per optimizer step.
    pub grad_accum: usize,
}

impl TrainConfig {
    /// An error unless the settings can drive a trainer (on any executor): gradient
    /// accumulation 1..=[`MAX_GRAD_ACCUM`](crate::config::MAX_GRAD_ACCUM) micro-batches.
    pub fn validate(&self) -> Result<(), ConfigError> {
        crate::config::check_size("gradient accumulation steps", self.grad_accum, crate::config::MAX_GRAD_ACCUM)
    }
}

/// The caller's memory for one model: four parameter-shaped arenas, the activations, and
/// the batch (`2 * B * T` token ids: inputs then targets).
pub struct Memory<'a, T> {
    /// Parameters (`plan.params_len()`).
    pub params: &'a mut [T],
    /// Gradients (`plan.params_len()`).
    pub grads: &'a mut [T],
    /// AdamW first moments (`plan.params_len()`, or a ZeRO-1 shard's length: see
    /// [`Trainer::with_shard`]).
    pub adam_m: &'a mut [T],
    /// AdamW second moments (as many as `adam_m`).
    pub adam_v: &'a mut [T],
    /// Activations and scratch (`plan.acts_len()`).
    pub acts: &'a mut [T],
    /// Batch token ids (`2 * plan.tokens()`).
    pub batch: &'a mut [u32],
}

/// A non-finite loss or gradient norm: the update was not applied.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NonFinite {
    /// The step that failed (0-based).
    pub step: u64,
    /// Mean loss of the step.
    pub loss: f64,
    /// Global gradient norm of the step.
    pub grad_norm: f64,
}

impl fmt::Display for NonFinite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step {}: loss is {}, gradient norm is {}; the update was not applied", self.step, self.loss, self.grad_norm)
    }
}

impl core::error::Error for NonFinite {}

/// What one optimizer step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepStats {
    /// Mean training loss over the step's micro-batches.
    pub loss: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate used.
    pub lr: f64,
}

/// The data-parallel group a trainer belongs to: processes that each run some of a step's
/// micro-batches and sum their gradients before one identical optimizer step on every rank
/// (alpha-native's MPI ranks). [`OneRank`] is a process on its own.
pub trait Ranks<T> {
    /// This process's place in the group, `0..ranks()`.
    fn rank(&self) -> usize;
    /// Processes in the group.
    fn ranks(&self) -> usize;
    /// Sums `values` element by element over the group, in place, with the same result on
    /// every rank.
    fn sum(&self, values: &mut [T]);
    /// Sums one number over the group.
    fn sum_f64(&self, value: f64) -> f64;
    /// Starts summing `values` over the group, in place, and may return before the sum is
    /// done (a non-blocking collective, so that it overlaps the rest of the backward); every
    /// rank starts the same pieces in the same order. [`Ranks::finish_sums`] completes them.
    /// By default it sums at once.
    ///
    /// # Safety
    /// `values` is neither read nor written by the caller, nor freed, until
    /// [`Ranks::finish_sums`] returns.
    unsafe fn start_sum(&self, values: &mut [T]) {
        self.sum(values);
    }
    /// Waits for every sum [`Ranks::start_sum`] started.
    fn finish_sums(&self) {}
    /// ZeRO-1's reduce-scatter: sums `values` over the group in this rank's [`shard`] of
    /// them; the rest is left undefined.
    fn sum_shard(&self, values: &mut [T]);
    /// ZeRO-1's all-gather: every rank's [`shard`] of `values`, from that rank, on every rank.
    fn gather_shards(&self, values: &mut [T]);
    /// Every rank's `mine` (its [`shard`] of `all.len()` values) into `all` on rank 0 (for a
    /// checkpoint); other ranks pass an empty `all`.
    fn collect_shards(&self, mine: &[T], all: &mut [T]);
}

/// A process training on its own: the whole step is its.
pub struct OneRank;

impl<T: Copy> Ranks<T> for OneRank {
    fn rank(&self) -> usize {
        0
    }
    fn ranks(&self) -> usize {
        1
    }
    fn sum(&self, _: &mut [T]) {}
    fn sum_f64(&self, value: f64) -> f64 {
        value
    }
    fn sum_shard(&self, _: &mut [T]) {}
    fn gather_shards(&self, _: &mut [T]) {}
    fn collect_shards(&self, mine: &[T], all: &mut [T]) {
        all.copy_from_slice(mine);
    }
}

/// Trains a model held in caller memory. `step` and `rng` are the whole training state
/// beside the arenas: saving them with params and moments makes resuming exact.
pub struct Trainer<'a, T> {
    /// The memory plan.
    pub plan: Plan,
    tape: &'a [Op],
    /// The arenas.
    pub mem: Memory<'a, T>,
    /// Optimisation settings.
    pub cfg: TrainConfig,
    /// Optimizer steps taken so far.
    pub step: u64,
    /// Draws the training batches.
    pub rng: Rng,
    /// What the products' operands (the linear layers' and attention's) are rounded to (f32 by
    /// default; bf16: `T` is f32 and the CPU has the bf16 kernel, see [`crate::gemm::bf16`]).
    pub operands: crate::gemm::Operands,
    /// The parameters whose AdamW moments this trainer holds and updates: all of them, or
    /// its ZeRO-1 shard.
    shard: core::ops::Range<usize>,
}

impl<'a, T: Float> Trainer<'a, T> {
    /// A trainer over `mem`, which must match `plan`; `tape` must be `record(plan)`.
    pub fn new(plan: Plan, tape: &'a [Op], mem: Memory<'a, T>, cfg: TrainConfig, rng: Rng) -> Result<Self, ConfigError> {
        Self::with_shard(plan, tape, mem, cfg, rng, 0..plan.params_len())
    }

    /// A trainer whose AdamW moments (in `mem`) are those of `shard` of the parameters only
    /// (ZeRO-1: `shard` is this rank's [`shard`] of them, and each step it updates those
    /// parameters and gathers the others from the other ranks; see
    /// [`Trainer::train_step_ranked`]).
    pub fn with_shard(plan: Plan, tape: &'a [Op], mem: Memory<'a, T>, cfg: TrainConfig, rng: Rng, shard: core::ops::Range<usize>) -> Result<Self, ConfigError> {
        let p = plan.params_len();
        if shard.end > p {
            return Err(ConfigError::BufferTooSmall { what: "params (for the moments' shard)", needed: shard.end, given: p });
        }
        for (what, len, needed) in [
            ("params", mem.params.len(), p),
            ("grads", mem.grads.len(), p),
            ("adam_m", mem.adam_m.len(), shard.len()),
            ("adam_v", mem.adam_v.len(), shard.len()),
            ("acts", mem.acts.len(), plan.acts_len()),
            ("batch", mem.batch.len(), 2 * plan.tokens()),
        ] {
            if len != needed {
                return Err(ConfigError::BufferTooSmall { what, needed, given: len });
            }
        }
        cfg.validate()?;
        Ok(Trainer { plan, tape, mem, cfg, step: 0, rng, operands: crate::gemm::Operands::F32, shard })
    }

    /// Zeroes the gradients (start of an optimizer step), split across `par`'s threads.
    pub fn zero_grads(&mut self, par: &dyn Parallel) {
        let (grads, tasks) = (SharedMut(self.mem.grads.as_mut_ptr()), par.threads());
        let len = self.mem.grads.len();
        par.run(tasks, &|task| {
            let mine = split_range(len, tasks, task);
            // SAFETY: tasks own disjoint ranges of the gradients.
            unsafe { grads.slice(mine.start, mine.len()) }.fill(T::ZERO);
        });
    }

    /// Draws the next training batch from `data`.
    pub fn load_batch<'d>(&mut self, data: impl Into<Tokens<'d>>) {
        let (x, y) = self.mem.batch.split_at_mut(self.plan.tokens());
        sample_batch(&mut self.rng, data.into(), self.plan.seq, x, y);
    }

    /// Draws the next training batch of `data` without loading it (another rank's).
    fn skip_batch(&mut self, data: Tokens<'_>) {
        skip_batch(&mut self.rng, data, self.plan.seq, self.plan.batch);
    }

    /// Training forward on the loaded batch as micro-batch `micro` of the current step
    /// (which draws its dropout masks); returns its mean loss and leaves the scaled logits
    /// gradient for [`Trainer::backward`].
    pub fn forward(&mut self, par: &dyn Parallel, micro: usize) -> f64 {
        self.forward_observed(par, micro, &mut ())
    }

    /// [`Trainer::forward`], reporting every op to `obs`.
    pub fn forward_observed(&mut self, par: &dyn Parallel, micro: usize, obs: &mut dyn Observer) -> f64 {
        let (tokens, targets) = self.mem.batch.split_at(self.plan.tokens());
        let scale = 1.0 / (self.plan.tokens() * self.cfg.grad_accum) as f64;
        let batch = Batch { tokens, targets: Some(targets) };
        let key = self.dropout_key(micro);
        let mut cpu = CpuExecutor::new(par, &self.plan, self.mem.params, self.mem.acts, batch).with_operands(self.operands).with_dropout_key(key).observed(obs);
        walk::forward(&mut cpu, self.tape, Some(scale));
        cpu.loss().unwrap_or(f64::NAN)
    }

    /// Backward of the last [`Trainer::forward`] (of micro-batch `micro`), accumulating into
    /// the gradients.
    pub fn backward(&mut self, par: &dyn Parallel, micro: usize) {
        self.backward_observed(par, micro, &mut ())
    }

    /// [`Trainer::backward`], reporting every op to `obs`.
    pub fn backward_observed(&mut self, par: &dyn Parallel, micro: usize, obs: &mut dyn Observer) {
        let batch = Batch { tokens: &self.mem.batch[..self.plan.tokens()], targets: None };
        self.mem.acts[self.plan.scratch().dres.range()].fill(T::ZERO);
        let key = self.dropout_key(micro);
        let mut cpu = CpuExecutor::new(par, &self.plan, self.mem.params, self.mem.acts, batch)
            .with_operands(self.operands)
            .with_grads(self.mem.grads)
            .with_dropout_key(key)
            .observed(obs);
        walk::backward(&mut cpu, &self.plan, self.tape);
    }

    /// [`Trainer::backward_observed`] for a data-parallel rank's last micro-batch of the step:
    /// the gradients start summing over `ranks` as the walk finishes them, block by block from
    /// the last, overlapping the rest of the backward; the token and position tables when it
    /// ends. [`Ranks::finish_sums`] completes the sums.
    fn backward_summing(&mut self, par: &dyn Parallel, micro: usize, obs: &mut dyn Observer, ranks: &dyn Ranks<T>) {
        let batch = Batch { tokens: &self.mem.batch[..self.plan.tokens()], targets: None };
        self.mem.acts[self.plan.scratch().dres.range()].fill(T::ZERO);
        let key = self.dropout_key(micro);
        let mut handed_out = 0;
        let mut start = |done: &mut [T]| {
            handed_out += done.len();
            if !done.is_empty() {
                // SAFETY: the walk never touches `done` again, and the trainer reads the
                // gradients only after `finish_sums`.
                unsafe { ranks.start_sum(done) };
            }
        };
        let cpu = CpuExecutor::new(par, &self.plan, self.mem.params, self.mem.acts, batch)
            .with_operands(self.operands)
            .with_grads(self.mem.grads)
            .with_dropout_key(key);
        let mut cpu = cpu.observed(obs).handing_out_finished(&self.plan, &mut start);
        walk::backward(&mut cpu, &self.plan, self.tape);
        let rest = self.mem.grads.len() - handed_out;
        // SAFETY: as above; these are the gradients the walk had not handed out.
        unsafe { ranks.start_sum(&mut self.mem.grads[..rest]) };
    }

    /// The dropout key of micro-batch `micro` of the current step: micro-batches are numbered
    /// over the run, so a resumed run draws the masks it would have drawn.
    fn dropout_key(&self, micro: usize) -> crate::ops::dropout::DropoutKey {
        self.plan.dropout_key(self.step * self.cfg.grad_accum as u64 + micro as u64)
    }

    /// The global gradient norm.
    pub fn grad_norm(&self, par: &dyn Parallel) -> f64 {
        libm::sqrt(grad_norm::sum_squares(par, self.mem.grads))
    }

    /// The learning rate of the current step.
    pub fn lr(&self) -> f64 {
        self.cfg.schedule.at(self.step)
    }

    /// AdamW with the clip factor for `grad_norm`; advances `step`.
    pub fn apply(&mut self, par: &dyn Parallel, grad_norm: f64) {
        let clip = if self.cfg.grad_clip > 0.0 { grad_norm::clip_factor(grad_norm, self.cfg.grad_clip) } else { 1.0 };
        let lr = self.lr();
        self.step += 1;
        let m = &mut self.mem;
        let tensors = AdamWTensors { params: m.params, grads: m.grads, m: m.adam_m, v: m.adam_v, shard_start: self.shard.start };
        adamw_step(par, &self.plan, tensors, &self.cfg.adamw, lr, self.step, clip);
    }

    /// One whole optimizer step on batches from `data`: `grad_accum` micro-batches, clip,
    /// AdamW. A non-finite loss or norm is returned as an error and nothing is updated.
    pub fn train_step<'d>(&mut self, par: &dyn Parallel, data: impl Into<Tokens<'d>>) -> Result<StepStats, NonFinite> {
        self.train_step_observed(par, data.into(), &mut ())
    }

    /// [`Trainer::train_step`], reporting each phase and each op to `obs`.
    pub fn train_step_observed(&mut self, par: &dyn Parallel, data: Tokens<'_>, obs: &mut dyn Observer) -> Result<StepStats, NonFinite> {
        self.train_step_ranked(par, data, obs, &OneRank)
    }

    /// [`Trainer::train_step_observed`] as one of `ranks`: the step's `grad_accum`
    /// micro-batches are drawn in order from the one stream every rank holds, and rank r runs
    /// those numbered r, r + ranks, ...; gradients and losses are summed over the group, so
    /// `ranks` processes take the step one process would, up to the order of the sums.
    pub fn train_step_ranked(&mut self, par: &dyn Parallel, data: Tokens<'_>, obs: &mut dyn Observer, ranks: &dyn Ranks<T>) -> Result<StepStats, NonFinite> {
        fn phase<R>(obs: &mut dyn Observer, p: Phase, f: impl FnOnce(&mut dyn Observer) -> R) -> R {
            obs.phase_begin(p);
            let r = f(&mut *obs);
            obs.phase_end(p);
            r
        }
        let sharded = self.sharded();
        if sharded {
            assert_eq!(self.shard, shard(self.plan.params_len(), ranks.ranks(), ranks.rank()), "the moments are not this rank's shard");
        }
        // Whole gradients are summed while this rank's last micro-batch's backward runs.
        let last = (0..self.cfg.grad_accum).rev().find(|m| m % ranks.ranks() == ranks.rank());
        let overlapped = ranks.ranks() > 1 && !sharded && last.is_some();
        self.zero_grads(par);
        let mut loss = 0.0;
        for micro in 0..self.cfg.grad_accum {
            if micro % ranks.ranks() != ranks.rank() {
                phase(obs, Phase::Data, |_| self.skip_batch(data));
                continue;
            }
            phase(obs, Phase::Data, |_| self.load_batch(data));
            loss += phase(obs, Phase::Forward, |o| self.forward_observed(par, micro, o));
            phase(obs, Phase::Backward, |o| {
                if overlapped && Some(micro) == last {
                    self.backward_summing(par, micro, o, ranks)
                } else {
                    self.backward_observed(par, micro, o)
                }
            });
        }
        if ranks.ranks() > 1 {
            loss = phase(obs, Phase::Allreduce, |_| {
                if overlapped {
                    ranks.finish_sums();
                } else if sharded {
                    ranks.sum_shard(self.mem.grads);
                } else {
                    ranks.sum(self.mem.grads);
                }
                ranks.sum_f64(loss)
            });
        }
        loss /= self.cfg.grad_accum as f64;
        let grad_norm = phase(obs, Phase::GradNorm, |_| {
            if sharded {
                libm::sqrt(ranks.sum_f64(grad_norm::sum_squares(par, &self.mem.grads[self.shard.clone()])))
            } else {
                self.grad_norm(par)
            }
        });
        self.check_finite(loss, grad_norm)?;
        let lr = self.lr();
        phase(obs, Phase::Optimizer, |_| self.apply(par, grad_norm));
        if sharded {
            phase(obs, Phase::Allreduce, |_| ranks.gather_shards(self.mem.params));
        }
        Ok(StepStats { loss, grad_norm, lr })
    }

    /// Whether this trainer holds the moments of a ZeRO-1 shard only.
    pub fn sharded(&self) -> bool {
        self.shard.len() < self.plan.params_len()
    }

    /// The parameters whose moments this trainer holds (all, or its ZeRO-1 shard).
    pub fn shard(&self) -> core::ops::Range<usize> {
        self.shard.clone()
    }

    /// An error if the loss or gradient norm is NaN or infinite.
    pub fn check_finite(&self, loss: f64, grad_norm: f64) -> Result<(), NonFinite> {
        if loss.is_finite() && grad_norm.is_finite() {
            Ok(())
        } else {
            Err(NonFinite { step: self.step, loss, grad_norm })
        }
    }

    /// Mean loss over `iters` random batches of `data` drawn with `rng` (nanoGPT's
    /// `estimate_loss`). Leaves the training state untouched, gradients included.
    pub fn evaluate<'d>(&mut self, par: &dyn Parallel, data: impl Into<Tokens<'d>>, iters: usize, rng: &mut Rng) -> f64 {
        self.evaluate_ranked(par, data.into(), iters, rng, &OneRank)
    }

    /// [`Trainer::evaluate`] as one of `ranks`: rank r evaluates batches r, r + ranks, ... of
    /// the same draws, and the mean is over all of them.
    pub fn evaluate_ranked(&mut self, par: &dyn Parallel, data: Tokens<'_>, iters: usize, rng: &mut Rng, ranks: &dyn Ranks<T>) -> f64 {
        let n = self.plan.tokens();
        let mut total = 0.0;
        for i in 0..iters {
            if i % ranks.ranks() != ranks.rank() {
                skip_batch(rng, data, self.plan.seq, self.plan.batch);
                continue;
            }
            let (x, y) = self.mem.batch.split_at_mut(n);
            sample_batch(rng, data, self.plan.seq, x, y);
            let (tokens, targets) = self.mem.batch.split_at(n);
            let mut cpu =
                CpuExecutor::new(par, &self.plan, self.mem.params, self.mem.acts, Batch { tokens, targets: Some(targets) }).with_operands(self.operands);
            walk::forward(&mut cpu, self.tape, None);
            total += cpu.loss().unwrap_or(f64::NAN);
        }
        ranks.sum_f64(total) / iters.max(1) as f64
    }
}

/// Dynamic loss scaling's state between two steps (GPU runs with f16 products; a checkpoint
/// keeps it so that a resumed run continues with the same scale).
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct LossScaleState {
    /// The scale the next step multiplies the loss's gradient by.
    pub scale: f32,
    /// Steps without an overflow since the scale last changed (it doubles after enough).
    pub good_steps: u32,
}

/// Where a run starts or resumes: parameters, AdamW moments (`None`: zeros), the optimizer
/// steps taken and the batch generator; what a checkpoint restores (`alloc` feature).
#[cfg(feature = "alloc")]
#[derive(Clone, Debug, PartialEq)]
pub struct RunState<T> {
    /// Parameters (plan order).
    pub params: alloc::vec::Vec<T>,
    /// AdamW `(m, v)` (plan order).
    pub moments: Option<(alloc::vec::Vec<T>, alloc::vec::Vec<T>)>,
    /// Optimizer steps taken.
    pub step: u64,
    /// Draws the training batches.
    pub rng: Rng,
}

#[cfg(feature = "alloc")]
impl<T: Float> RunState<T> {
    /// A new run from `seed`, as every frontend starts one: GPT-2 initialisation from the
    /// seed, batches from its [`stream::BATCHES`](crate::rng::stream::BATCHES) stream.
    pub fn fresh(plan: &Plan, seed: u64) -> Result<Self, ConfigError> {
        let mut params = try_vec("parameters", plan.params_len(), T::ZERO)?;
        crate::model::init_params(plan, &mut params, &mut Rng::new(seed));
        let rng = Rng::new(crate::rng::derive_seed(seed, crate::rng::stream::BATCHES, 0));
        Ok(RunState { params, moments: None, step: 0, rng })
    }
}

/// Heap-allocated memory for a plan, allocated once (`alloc` feature).
#[cfg(feature = "alloc")]
pub struct OwnedMemory<T> {
    /// The recorded tape.
    pub tape: alloc::vec::Vec<Op>,
    /// Parameters.
    pub params: alloc::vec::Vec<T>,
    /// Gradients.
    pub grads: alloc::vec::Vec<T>,
    /// AdamW first moments (of `shard`).
    pub adam_m: alloc::vec::Vec<T>,
    /// AdamW second moments (of `shard`).
    pub adam_v: alloc::vec::Vec<T>,
    /// The parameters whose moments it holds: all, or a ZeRO-1 rank's shard.
    pub shard: core::ops::Range<usize>,
    /// Activations and scratch.
    pub acts: alloc::vec::Vec<T>,
    /// Batch token ids.
    pub batch: alloc::vec::Vec<u32>,
}

#[cfg(feature = "alloc")]
impl<T: Float> OwnedMemory<T> {
    /// Zeroed memory and the recorded tape for `plan`; an error, not an abort, when the
    /// machine cannot give it.
    pub fn new(plan: &Plan) -> Result<Self, ConfigError> {
        Self::with_shard(plan, 0..plan.params_len())
    }

    /// [`OwnedMemory::new`] with the AdamW moments of `shard` of the parameters only
    /// (ZeRO-1; see [`Trainer::with_shard`]).
    pub fn with_shard(plan: &Plan, shard: core::ops::Range<usize>) -> Result<Self, ConfigError> {
        let p = plan.params_len();
        Ok(OwnedMemory {
            tape: crate::tape::record_to_vec(plan),
            params: try_vec("parameters", p, T::ZERO)?,
            grads: try_vec("gradients", p, T::ZERO)?,
            adam_m: try_vec("AdamW first moments", shard.len(), T::ZERO)?,
            adam_v: try_vec("AdamW second moments", shard.len(), T::ZERO)?,
            shard,
            acts: try_vec("activations", plan.acts_len(), T::ZERO)?,
            batch: try_vec("batch", 2 * plan.tokens(), 0)?,
        })
    }

    /// A trainer borrowing this memory that continues `state` (its parameters and moments,
    /// those of the memory's shard, are copied into the arenas).
    pub fn resume(&mut self, plan: Plan, cfg: TrainConfig, state: &RunState<T>) -> Result<Trainer<'_, T>, ConfigError> {
        let p = plan.params_len();
        let given = [Some(state.params.len()), state.moments.as_ref().map(|m| m.0.len()), state.moments.as_ref().map(|m| m.1.len())];
        if let Some(&Some(len)) = given.iter().find(|l| l.is_some_and(|l| l != p)) {
            return Err(ConfigError::BufferTooSmall { what: "run state", needed: p, given: len });
        }
        self.params.copy_from_slice(&state.params);
        match &state.moments {
            Some((m, v)) => {
                self.adam_m.copy_from_slice(&m[self.shard.clone()]);
                self.adam_v.copy_from_slice(&v[self.shard.clone()]);
            }
            None => {
                self.adam_m.fill(T::ZERO);
                self.adam_v.fill(T::ZERO);
            }
        }
        let mut t = self.trainer(plan, cfg, state.rng)?;
        t.step = state.step;
        Ok(t)
    }

    /// A trainer borrowing this memory.
    pub fn trainer(&mut self, plan: Plan, cfg: TrainConfig, rng: Rng) -> Result<Trainer<'_, T>, ConfigError> {
        let mem = Memory {
            params: &mut self.params,
            grads: &mut self.grads,
            adam_m: &mut self.adam_m,
            adam_v: &mut self.adam_v,
            acts: &mut self.acts,
            batch: &mut self.batch,
        };
        Trainer::with_shard(plan, &self.tape, mem, cfg, rng, self.shard.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GptConfig;
    use crate::model::init_params;
    use crate::parallel::Serial;
    use alloc::vec::Vec;

    fn one_step(batch: usize, grad_accum: usize) -> (f64, Vec<f32>) {
        let cfg = GptConfig::gpt2(11, 8, 1, 2, 8);
        let plan = Plan::new(cfg, batch, 8).unwrap();
        let mut mem = OwnedMemory::<f32>::new(&plan).unwrap();
        init_params(&plan, &mut mem.params, &mut Rng::new(1));
        let tc = TrainConfig {
            schedule: LrSchedule { max_lr: 1e-2, min_lr: 1e-3, warmup_iters: 0, decay_iters: 10 },
            adamw: AdamWConfig::default(),
            grad_clip: 0.0,
            grad_accum,
        };
        let data: Vec<u32> = (0..300u32).map(|i| (i * 5 + i / 4) % 11).collect();
        let mut trainer = mem.trainer(plan, tc, Rng::new(2)).unwrap();
        let loss = trainer.train_step(&Serial, &data).unwrap().loss;
        // The step leaves the accumulated gradients in place (Adam's first update barely
        // depends on their scale, so they are what shows an accumulation error).
        (loss, mem.grads)
    }

    /// Memory for `plan` with its parameters initialised from seed 1.
    fn initialised(plan: &Plan) -> OwnedMemory<f32> {
        let mut mem = OwnedMemory::<f32>::new(plan).unwrap();
        init_params(plan, &mut mem.params, &mut Rng::new(1));
        mem
    }

    /// The tests' settings: a short schedule with warm-up, clipping at 1.
    fn settings(grad_accum: usize) -> TrainConfig {
        TrainConfig {
            schedule: LrSchedule { max_lr: 1e-2, min_lr: 1e-3, warmup_iters: 1, decay_iters: 10 },
            adamw: AdamWConfig::default(),
            grad_clip: 1.0,
            grad_accum,
        }
    }

    /// Activation checkpointing changes memory, not arithmetic: three steps with two
    /// micro-batches and three blocks give the same bits (losses, norms, parameters, moments)
    /// with and without it, on one thread and on several, with and without dropout (whose
    /// recomputed forward draws the same masks), and the activations shrink.
    #[test]
    fn recompute_keeps_every_bit() {
        let cfg = GptConfig::gpt2(13, 8, 3, 2, 8);
        let data: Vec<u32> = (0..400u32).map(|i| (i * 7 + i / 3) % 13).collect();
        let run = |plan: Plan, par: &dyn Parallel| {
            let mut mem = initialised(&plan);
            let mut trainer = mem.trainer(plan, settings(2), Rng::new(2)).unwrap();
            let stats: Vec<(u64, u64)> = (0..3)
                .map(|_| {
                    let s = trainer.train_step(par, &data).unwrap();
                    (s.loss.to_bits(), s.grad_norm.to_bits())
                })
                .collect();
            (stats, mem.params, mem.adam_m, mem.adam_v)
        };
        let four = crate::parallel::ReversedThreads(4);
        for plan in [Plan::new(cfg, 3, 8).unwrap(), Plan::new(cfg, 3, 8).unwrap().with_dropout(0.2, 5).unwrap()] {
            let recomputing = plan.with_recompute(true);
            assert!(recomputing.acts_len() < plan.acts_len());
            for par in [&Serial as &dyn Parallel, &four] {
                assert!(run(plan, par) == run(recomputing, par), "recompute changed the run (dropout {})", plan.dropout());
            }
        }
    }

    /// A backward walk hands out every block's gradients, from the last block down, once
    /// they are final (what it hands out equals the gradients when it ends), then leaves the
    /// token and position tables; with and without recompute.
    #[test]
    fn the_backward_hands_out_final_gradients_from_the_top() {
        let cfg = GptConfig::gpt2(13, 8, 3, 2, 8);
        let data: Vec<u32> = (0..400u32).map(|i| (i * 7 + i / 3) % 13).collect();
        for plan in [Plan::new(cfg, 2, 8).unwrap(), Plan::new(cfg, 2, 8).unwrap().with_recompute(true)] {
            let mut mem = initialised(&plan);
            let mut t = mem.trainer(plan, settings(1), Rng::new(2)).unwrap();
            t.load_batch(&data);
            t.forward(&Serial, 0);
            let base = t.mem.grads.as_ptr() as usize;
            let mut handed: Vec<(usize, Vec<f32>)> = Vec::new();
            {
                let batch = Batch { tokens: &t.mem.batch[..plan.tokens()], targets: None };
                let mut take = |done: &mut [f32]| handed.push(((done.as_ptr() as usize - base) / 4, done.to_vec()));
                let mut cpu = CpuExecutor::new(&Serial, &plan, t.mem.params, t.mem.acts, batch).with_grads(t.mem.grads).handing_out_finished(&plan, &mut take);
                walk::backward(&mut cpu, &plan, t.tape);
            }
            let tables_end = plan.blocks_params_start();
            let mut top = plan.params_len();
            for (offset, values) in handed.iter().filter(|(_, v)| !v.is_empty()) {
                assert_eq!(offset + values.len(), top, "not the next piece down");
                assert_eq!(&values[..], &t.mem.grads[*offset..top], "handed out before it was final");
                top = *offset;
            }
            assert_eq!(top, tables_end, "the blocks' gradients were not all handed out");
            assert!(handed.iter().filter(|(_, v)| !v.is_empty()).count() > 3 * 3, "handed out in too few pieces to overlap anything");
        }
    }

    /// Two accumulated micro-batches of 3 sequences are one step on the same 6 sequences.
    #[test]
    fn gradient_accumulation_equals_a_bigger_batch() {
        let (loss_a, grads_a) = one_step(3, 2);
        let (loss_b, grads_b) = one_step(6, 1);
        assert!((loss_a - loss_b).abs() < 1e-6 * loss_b, "{loss_a} vs {loss_b}");
        let scale = grads_b.iter().fold(0f32, |m, g| m.max(g.abs()));
        assert!(scale > 0.0);
        for (a, b) in grads_a.iter().zip(&grads_b) {
            assert!((a - b).abs() <= 1e-5 * scale, "{a} vs {b}");
        }
    }
}
