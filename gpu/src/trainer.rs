//! Training on the GPU: the core's tape compiled once into dispatch lists over device
//! buffers, and each optimizer step encoded into one command buffer and one submit (zero
//! the gradients; per micro-batch forward, loss sum, backward; gradient norm; AdamW with the
//! clip factor). Nothing is read back inside a step: the loss and gradient norm stay in a
//! small statistics buffer until [`GpuTrainer::stats`] reads them.

use crate::context::{Gpu, GpuError, Precision};
use crate::executor::{DeviceArenas, Recorder};
use crate::forward::GpuForward;
use crate::kernels::{bytes, elements, Kernels, Program, ProgramBuilder, View};
use crate::layout::DeviceLayout;
use crate::memory::{aligned, allocating, device_plan, storage, Activations, BatchSlot, HalfWeights};
use crate::memory::{BAD_LOSS_SLOT, EVAL_SLOT, GOOD_STEPS_SLOT, LOSS_SCALE_SLOT, LOSS_SCALE_SLOTS, LOSS_SLOT, NORM_SLOT, SKIPPED_SLOT, USED_SCALE_SLOT};
use crate::ops;
use crate::profile::Profiler;
use crate::readback::{read, read_into, staging_buffer};
use alpha_core::data::{sample_batch, skip_batch, Tokens};
use alpha_core::parallel::shard;
use alpha_core::plan::{Plan, Span, ACT_ALIGN};
use alpha_core::tape;
use alpha_core::tape::KernelTime;
use alpha_core::train::{LossScaleState, OneRank, Ranks, RunState, StepStats, TrainConfig};
use alpha_core::{walk, Rng};
use std::ops::Range;

/// The first loss scale under f16 products (GradScaler's).
pub const INITIAL_LOSS_SCALE: f32 = 65536.0;
/// Good steps in a row that double the loss scale (GradScaler's `growth_interval`).
pub const GROWTH_INTERVAL: u32 = 2000;

/// The device buffers of one model.
struct Buffers {
    params: wgpu::Buffer,
    grads: wgpu::Buffer,
    adam_m: wgpu::Buffer,
    adam_v: wgpu::Buffer,
    acts: Activations,
    batch: wgpu::Buffer,
    stats: wgpu::Buffer,
    norm_partials: wgpu::Buffer,
    /// The depth chunks of split weight gradients (see `ops::matmul::weight_grad_splits`).
    split: wgpu::Buffer,
    /// Under f16 precision, the parameters' f16 copy that the products read.
    half_weights: Option<HalfWeights>,
}

/// Per micro-batch slot: forward (with the loss) and backward.
struct MicroStep {
    forward: Program,
    backward: Program,
}

/// Trains one model on the GPU. `step` and `rng` are, as on the CPU, the whole training
/// state beside the parameters and moments: the same seed draws the same batches.
pub struct GpuTrainer {
    gpu: Gpu,
    kernels: Kernels,
    /// The memory plan (shapes and activation offsets).
    pub plan: Plan,
    layout: DeviceLayout,
    /// Optimisation settings.
    pub cfg: TrainConfig,
    /// Optimizer steps taken so far.
    pub step: u64,
    /// Draws the training batches.
    pub rng: Rng,
    bufs: Buffers,
    micro: Vec<MicroStep>,
    eval: Program,
    update: Program,
    /// AdamW's dispatches in `update` and the arena pieces they bind.
    adamw: Vec<(usize, Range<usize>)>,
    /// The parameters (device layout) whose AdamW moments it holds and updates: all, or its
    /// ZeRO-1 shard.
    shard: Range<usize>,
    host_batch: Vec<u32>,
    dres: Span,
    profiler: Option<Profiler>,
    /// A data-parallel rank's gradients (and ZeRO-1 parameters) on their way through the
    /// host: kept from its first step on, since they are the size of the model.
    rank_io: Option<RankIo>,
    /// The loss scale update's index in the update program, with f16 products.
    loss_scaling: Option<usize>,
}

/// What [`GpuTrainer::step_ranked`] reads back through, each the device layout's length.
struct RankIo {
    staging: wgpu::Buffer,
    host: Vec<f32>,
}

/// What [`GpuTrainer::stats`] reads: the last step and the steps skipped before it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuStats {
    /// Loss, gradient norm and learning rate of the last step.
    pub last: StepStats,
    /// Steps since the previous read whose loss or gradient norm was not finite (their
    /// updates were skipped on the device).
    pub skipped: u64,
    /// Of those, the steps whose loss was not finite (with f32 products every skipped step
    /// is one; with f16 products the others overflowed an f16 operand and lowered the scale).
    pub non_finite_losses: u64,
    /// The loss scale the last step used, with f16 products.
    pub loss_scale: Option<f64>,
}

impl GpuTrainer {
    /// Builds every buffer and dispatch for `plan` on `gpu` and uploads `params` (host
    /// layout, `plan.params_len()` elements); moments start at zero.
    pub async fn new(gpu: Gpu, plan: Plan, cfg: TrainConfig, rng: Rng, params: &[f32]) -> Result<GpuTrainer, GpuError> {
        let whole = 0..DeviceLayout::new(&plan).len();
        GpuTrainer::build(gpu, plan, cfg, rng, params, None, whole).await
    }

    /// A trainer that continues `state` (parameters, moments, step, batch generator).
    pub async fn resume(gpu: Gpu, plan: Plan, cfg: TrainConfig, state: &RunState<f32>) -> Result<GpuTrainer, GpuError> {
        GpuTrainer::resume_sharded(gpu, plan, cfg, state, &OneRank).await
    }

    /// [`GpuTrainer::resume`] holding only this rank's ZeRO-1 shard of the AdamW moments
    /// (`shard` of the device layout's elements over `ranks`): [`GpuTrainer::step_ranked`]
    /// updates those parameters and gathers the others from the other ranks.
    pub async fn resume_sharded(gpu: Gpu, plan: Plan, cfg: TrainConfig, state: &RunState<f32>, ranks: &dyn Ranks<f32>) -> Result<GpuTrainer, GpuError> {
        let moments = state.moments.as_ref().map(|(m, v)| (&m[..], &v[..]));
        let shard = shard(DeviceLayout::new(&plan).len(), ranks.ranks(), ranks.rank());
        let mut t = GpuTrainer::build(gpu, plan, cfg, state.rng, &state.params, moments, shard).await?;
        t.step = state.step;
        Ok(t)
    }

    async fn build(
        gpu: Gpu,
        plan: Plan,
        cfg: TrainConfig,
        rng: Rng,
        params: &[f32],
        moments: Option<(&[f32], &[f32])>,
        shard: Range<usize>,
    ) -> Result<GpuTrainer, GpuError> {
        if params.len() != plan.params_len() {
            return Err(GpuError(format!("{} parameters given, the model has {}", params.len(), plan.params_len())));
        }
        cfg.validate().map_err(|e| GpuError(e.to_string()))?;
        GpuTrainer::check_fits(&gpu, &plan)?;
        let plan = device_plan(&gpu, plan);
        let layout = DeviceLayout::new(&plan);
        let kernels = Kernels::new(&gpu, plan.config.head_size()).await?;
        let n = plan.tokens();
        let vocab = plan.config.vocab_size;
        let slot_len = BatchSlot::len(n, vocab);
        let tape = tape::record_to_vec(&plan);
        let split_len = tape::matmul_shapes(&tape).map(|(k, m)| ops::matmul::weight_grad_scratch_len(n, k, m)).max().unwrap_or(0);
        let pieces = ops::binding_pieces(layout.len(), elements(gpu.limits.max_storage_buffer_binding_size));
        let bufs = allocating(&gpu, || {
            let params = storage(&gpu, "parameters", layout.len())?;
            Ok(Buffers {
                half_weights: HalfWeights::new(&gpu, &kernels, &params, layout.len())?,
                params,
                grads: storage(&gpu, "gradients", layout.len())?,
                adam_m: storage(&gpu, "AdamW first moments", shard.len().max(ACT_ALIGN))?,
                adam_v: storage(&gpu, "AdamW second moments", shard.len().max(ACT_ALIGN))?,
                acts: Activations::new(&gpu, &plan)?,
                // One slot per micro-batch and one for evaluation.
                batch: storage(&gpu, "batch", slot_len.checked_mul(cfg.grad_accum + 1).ok_or_else(|| GpuError("the batch buffer's size overflows".into()))?)?,
                stats: storage(&gpu, "statistics", ACT_ALIGN)?,
                norm_partials: storage(&gpu, "norm partials", pieces.len() * ops::grad_norm::NORM_CHUNKS)?,
                split: storage(&gpu, "weight gradient chunks", split_len)?,
            })
        })
        .await?;
        let scale = 1.0 / (n * cfg.grad_accum) as f64;
        let arenas = DeviceArenas {
            params: &bufs.params,
            half_weights: bufs.half_weights.as_ref().map(|h| &h.buffer),
            grads: Some(&bufs.grads),
            acts: &bufs.acts,
            batch: &bufs.batch,
            stats: &bufs.stats,
            split: Some(&bufs.split),
        };
        let mut micro = Vec::with_capacity(cfg.grad_accum);
        for slot in 0..cfg.grad_accum {
            let b = BatchSlot::new(slot, n, vocab);
            let mut forward = Recorder::new(&gpu, &plan, &layout, arenas, b, LOSS_SLOT);
            walk::forward(&mut forward, &tape, Some(scale));
            // The residual gradient is cleared before it runs (see `step`).
            let mut backward = Recorder::new(&gpu, &plan, &layout, arenas, b, LOSS_SLOT);
            walk::backward(&mut backward, &plan, &tape);
            micro.push(MicroStep { forward: forward.finish(&gpu, &kernels)?, backward: backward.finish(&gpu, &kernels)? });
        }
        let mut eval = Recorder::new(&gpu, &plan, &layout, arenas, BatchSlot::new(cfg.grad_accum, n, vocab), EVAL_SLOT);
        walk::forward(&mut eval, &tape, None);
        let eval = eval.finish(&gpu, &kernels)?;
        let mut p = ProgramBuilder::default();
        p.label("update");
        let whole = |buf| View::first(buf, layout.len());
        let stats = View::first(&bufs.stats, ACT_ALIGN);
        let partials = View::first(&bufs.norm_partials, pieces.len() * ops::grad_norm::NORM_CHUNKS);
        ops::grad_norm::sum_squares(&mut p, whole(&bufs.grads), &pieces, partials, stats, NORM_SLOT);
        let in_shard = |buf| View::first(buf, shard.len());
        let arenas = [whole(&bufs.params), whole(&bufs.grads), in_shard(&bufs.adam_m), in_shard(&bufs.adam_v)];
        let mut shard_pieces = ops::binding_pieces(shard.len(), elements(gpu.limits.max_storage_buffer_binding_size));
        shard_pieces.retain(|r| !r.is_empty());
        let shard_pieces: Vec<Range<usize>> = shard_pieces.into_iter().map(|r| shard.start + r.start..shard.start + r.end).collect();
        let adamw = ops::adamw::dispatch(&mut p, arenas, &shard_pieces, shard.start, stats).into_iter().zip(shard_pieces).collect();
        let loss_scaling = (gpu.precision == Precision::F16).then(|| ops::adamw::loss_scale_update(&mut p, stats, LOSS_SCALE_SLOTS, GROWTH_INTERVAL));
        if let Some(copy) = &bufs.half_weights {
            HalfWeights::push(&gpu, &mut p, &bufs.params, &copy.buffer, layout.len());
        }
        let update = p.build(&gpu, &kernels)?;
        let dres = plan.scratch().dres;
        let mut t = GpuTrainer {
            gpu,
            kernels,
            plan,
            layout,
            cfg,
            step: 0,
            rng,
            bufs,
            micro,
            eval,
            update,
            adamw,
            shard,
            host_batch: vec![0; slot_len],
            dres,
            profiler: None,
            rank_io: None,
            loss_scaling,
        };
        t.upload(params, moments)?;
        t.set_loss_scale(LossScaleState { scale: INITIAL_LOSS_SCALE, good_steps: 0 });
        Ok(t)
    }

    /// An error unless a trainer of `plan` is within `gpu`'s limits: buffer sizes (each
    /// tensor's binding is checked as the programs are built, and the kernels index only
    /// within their bindings, so an arena may pass 2^32 elements; whole arenas are bound in
    /// pieces; the device's free memory shows only when the buffers are made).
    pub fn check_fits(gpu: &Gpu, plan: &Plan) -> Result<(), GpuError> {
        let plan = &device_plan(gpu, *plan);
        gpu.check_size("the parameter arena", bytes(DeviceLayout::new(plan).len()), false, "the model")?;
        Activations::starts(gpu, plan)?;
        // The token embedding and the logits are bound in pieces of 64 rows or more; the
        // largest tensor bound whole is the MLP's hidden activation.
        let (n, c, v) = (plan.tokens(), plan.config.n_embd, plan.config.vocab_size);
        gpu.check_size("64 rows of the logits", bytes(64 * v), true, "the vocabulary")?;
        gpu.check_size("the MLP's hidden activations", bytes(n * 4 * c), true, "the batch, block or model")
    }

    /// Replaces the parameters and, when given, the AdamW moments `(m, v)` (host layout).
    pub fn upload(&self, params: &[f32], moments: Option<(&[f32], &[f32])>) -> Result<(), GpuError> {
        let len = self.plan.params_len();
        if params.len() != len || moments.is_some_and(|(m, v)| m.len() != len || v.len() != len) {
            return Err(GpuError(format!("parameter arenas must have {len} elements")));
        }
        let q = &self.gpu.queue;
        q.write_buffer(&self.bufs.params, 0, bytemuck::cast_slice(&self.layout.to_device(params)));
        let zeros = vec![0.0; len];
        let (m, v) = moments.unwrap_or((&zeros, &zeros));
        // The moments of this trainer's shard (all of them alone).
        q.write_buffer(&self.bufs.adam_m, 0, bytemuck::cast_slice(&self.layout.to_device(m)[self.shard.clone()]));
        q.write_buffer(&self.bufs.adam_v, 0, bytemuck::cast_slice(&self.layout.to_device(v)[self.shard.clone()]));
        self.refresh_half_weights();
        Ok(())
    }

    /// Makes the parameters' f16 copy again after they were written from the host.
    fn refresh_half_weights(&self) {
        if let Some(copy) = &self.bufs.half_weights {
            copy.refresh(&self.gpu, &self.kernels);
        }
    }

    /// Parameters and AdamW moments `(params, m, v)` in host layout (for checkpoints).
    pub async fn download(&self) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>), GpuError> {
        self.download_ranked(&OneRank).await
    }

    /// [`GpuTrainer::download`] as one of `ranks` (every rank calls it): with ZeRO-1 rank 0
    /// collects the moments' shards, and the other ranks get empty moments.
    pub async fn download_ranked(&self, ranks: &dyn Ranks<f32>) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>), GpuError> {
        // Whole moments are every rank's own.
        let ranks = if self.sharded() { ranks } else { &OneRank };
        let host = |dev: &[f32]| {
            let mut host = vec![0.0; self.plan.params_len()];
            self.layout.to_host(dev, &mut host);
            host
        };
        let params = host(&read(&self.gpu, &self.bufs.params, 0, self.layout.len()).await?);
        let mut moments = Vec::with_capacity(2);
        for buf in [&self.bufs.adam_m, &self.bufs.adam_v] {
            let mine: Vec<f32> = read(&self.gpu, buf, 0, self.shard.len()).await?;
            let mut all = vec![0.0; if ranks.rank() == 0 { self.layout.len() } else { 0 }];
            ranks.collect_shards(&mine, &mut all);
            moments.push(if ranks.rank() == 0 { host(&all) } else { Vec::new() });
        }
        let v = moments.pop().expect("two moments");
        Ok((params, moments.pop().expect("two moments"), v))
    }

    /// Whether it holds the moments of a ZeRO-1 shard only.
    pub fn sharded(&self) -> bool {
        self.shard.len() < self.layout.len()
    }

    /// Draws a batch from `data` into batch slot `slot` (on the host, then one write), with
    /// the dropout key of micro-batch `slot` of the current step.
    fn write_batch(&mut self, slot: usize, data: Tokens<'_>, rng: Option<&mut Rng>) {
        let (n, vocab) = (self.plan.tokens(), self.plan.config.vocab_size);
        let b = BatchSlot::new(0, n, vocab);
        let hb = &mut self.host_batch;
        let (x, rest) = hb[b.tokens.offset..].split_at_mut(aligned(n));
        let y = &mut rest[..n];
        sample_batch(rng.unwrap_or(&mut self.rng), data, self.plan.seq, &mut x[..n], y);
        let (head, starts) = hb.split_at_mut(b.starts.offset);
        let (tokens, order) = head.split_at_mut(b.order.offset);
        ops::embedding::group_rows_by_token(&tokens[b.tokens.range()], &mut order[..n], &mut starts[..vocab + 1]);
        let key = self.plan.dropout_key(self.step * self.cfg.grad_accum as u64 + slot as u64);
        hb[b.words.offset..b.words.offset + 4].copy_from_slice(&key.words());
        let offset = bytes(slot * BatchSlot::len(n, vocab));
        self.gpu.queue.write_buffer(&self.bufs.batch, offset, bytemuck::cast_slice(&self.host_batch));
    }

    /// One optimizer step on batches from `data`: `grad_accum` micro-batches, the gradient
    /// norm, clipping and AdamW, in one submission. Returns the learning rate used. A
    /// non-finite loss or norm skips the update on the device; [`GpuTrainer::stats`] reports it.
    pub fn step<'d>(&mut self, data: impl Into<Tokens<'d>>) -> f64 {
        let data = data.into();
        let lr = self.cfg.schedule.at(self.step);
        for slot in 0..self.cfg.grad_accum {
            self.write_batch(slot, data, None);
        }
        self.advance(lr);
        let mut enc = self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        let mut queries = self.profiler.as_ref().map(Profiler::cursor);
        self.encode_micro_steps(&mut enc, &mut queries, |_| true);
        self.encode(&mut enc, &mut queries, &self.update);
        if let Some(p) = &self.profiler {
            p.resolve(&mut enc);
        }
        self.gpu.queue.submit([enc.finish()]);
        lr
    }

    /// [`GpuTrainer::step`] as one of `ranks` (data parallelism, as the CPU's
    /// `Trainer::train_step_ranked`): this rank runs micro-batches r, r + ranks, ... of the
    /// step in one submission, its gradients and loss are read back, summed over the ranks
    /// on the host and written back, and a second submission takes the clip and AdamW step.
    /// Alone, it is [`GpuTrainer::step`].
    pub async fn step_ranked<'d>(&mut self, data: impl Into<Tokens<'d>>, ranks: &dyn Ranks<f32>) -> Result<f64, GpuError> {
        let data = data.into();
        if ranks.ranks() == 1 {
            return Ok(self.step(data));
        }
        let lr = self.cfg.schedule.at(self.step);
        let mine = |slot: usize| slot % ranks.ranks() == ranks.rank();
        for slot in 0..self.cfg.grad_accum {
            if mine(slot) {
                self.write_batch(slot, data, None);
            } else {
                skip_batch(&mut self.rng, data, self.plan.seq, self.plan.batch);
            }
        }
        self.advance(lr);
        let mut enc = self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("micro-batches") });
        let mut queries = self.profiler.as_ref().map(Profiler::cursor);
        self.encode_micro_steps(&mut enc, &mut queries, mine);
        self.gpu.queue.submit([enc.finish()]);
        // The device layout is the same on every rank: it is summed as it is.
        let len = self.layout.len();
        let RankIo { staging, host } = self.rank_io.get_or_insert_with(|| RankIo { staging: staging_buffer(&self.gpu, len), host: vec![0.0; len] });
        read_into(&self.gpu, &self.bufs.grads, 0, staging, host).await?;
        let mut loss = [0f32];
        read_into(&self.gpu, &self.bufs.stats, LOSS_SLOT, staging, &mut loss).await?;
        ranks.sum(host);
        let loss = ranks.sum_f64(loss[0] as f64) as f32;
        let q = &self.gpu.queue;
        q.write_buffer(&self.bufs.grads, 0, bytemuck::cast_slice(host));
        q.write_buffer(&self.bufs.stats, bytes(LOSS_SLOT), bytemuck::bytes_of(&loss));
        let mut enc = self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("update") });
        self.encode(&mut enc, &mut queries, &self.update);
        if let Some(p) = &self.profiler {
            p.resolve(&mut enc);
        }
        self.gpu.queue.submit([enc.finish()]);
        if self.sharded() {
            // ZeRO-1: this rank updated its shard; the others' come from them.
            let RankIo { staging, host } = self.rank_io.as_mut().expect("set above");
            read_into(&self.gpu, &self.bufs.params, self.shard.start, staging, &mut host[self.shard.clone()]).await?;
            ranks.gather_shards(host);
            self.gpu.queue.write_buffer(&self.bufs.params, 0, bytemuck::cast_slice(host));
            self.refresh_half_weights();
        }
        Ok(lr)
    }

    /// Encodes the start of a step (gradients and the step's statistics cleared) and the
    /// micro-batches `run` picks (forward with the loss, backward).
    fn encode_micro_steps(&self, enc: &mut wgpu::CommandEncoder, queries: &mut Option<crate::profile::QueryCursor<'_>>, run: impl Fn(usize) -> bool) {
        enc.clear_buffer(&self.bufs.grads, 0, None);
        enc.clear_buffer(&self.bufs.stats, 0, Some(bytes(2)));
        for (slot, m) in self.micro.iter().enumerate() {
            if run(slot) {
                self.encode(enc, queries, &m.forward);
                let (acts, dres) = self.bufs.acts.at(self.dres.offset);
                enc.clear_buffer(acts, bytes(dres), Some(bytes(self.dres.len)));
                self.encode(enc, queries, &m.backward);
            }
        }
    }

    /// Advances `step` and sets the update's AdamW words for it at learning rate `lr`.
    fn advance(&mut self, lr: f64) {
        self.step += 1;
        for (index, piece) in &self.adamw {
            let c = &self.cfg;
            let words =
                ops::adamw::words(piece, self.layout.decay_end(), &c.adamw, lr, self.step, c.grad_clip, [LOSS_SLOT, NORM_SLOT, SKIPPED_SLOT, LOSS_SCALE_SLOT]);
            self.update.set_words(&self.gpu.queue, *index, &words);
        }
    }

    /// Encodes `program`, with timestamps while profiling.
    fn encode(&self, enc: &mut wgpu::CommandEncoder, queries: &mut Option<crate::profile::QueryCursor<'_>>, program: &Program) {
        match queries.as_mut() {
            Some(q) => program.encode_timed(&self.kernels, enc, || q.next_pair()),
            None => program.encode(&self.kernels, &mut enc.begin_compute_pass(&Default::default())),
        }
    }

    /// Stamps every kernel of the following steps with timestamp queries (for traces), or
    /// stops. An error if the device has no timestamp queries.
    pub fn set_profiling(&mut self, on: bool) -> Result<(), GpuError> {
        self.profiler = None;
        if on {
            let named = |pass: &'static str, p: &Program| p.dispatches().map(move |(op, k, work)| (pass, op, k.name(), work)).collect::<Vec<_>>();
            let mut names = Vec::new();
            for m in &self.micro {
                names.extend(named("forward", &m.forward));
                names.extend(named("backward", &m.backward));
            }
            names.extend(named("update", &self.update));
            self.profiler = Some(Profiler::new(&self.gpu, names)?);
        }
        Ok(())
    }

    /// Every kernel's time in the last step (taken while profiling; see
    /// [`GpuTrainer::set_profiling`]).
    pub async fn kernel_times(&self) -> Result<Vec<KernelTime>, GpuError> {
        match &self.profiler {
            Some(p) => p.read(&self.gpu).await,
            None => Err(GpuError("kernel times need set_profiling(true) before the step".into())),
        }
    }

    /// Loss and gradient norm of the last [`GpuTrainer::step`], and how many steps since the
    /// previous call had a non-finite loss or norm (their updates were skipped). Reads the
    /// statistics back: call it every log interval, not every step.
    pub async fn stats(&self, lr: f64) -> Result<GpuStats, GpuError> {
        let s: Vec<f32> = read(&self.gpu, &self.bufs.stats, 0, BAD_LOSS_SLOT + 1).await?;
        for slot in [SKIPPED_SLOT, BAD_LOSS_SLOT] {
            self.gpu.queue.write_buffer(&self.bufs.stats, bytes(slot), bytemuck::bytes_of(&0f32));
        }
        let loss = s[LOSS_SLOT] as f64 / (self.plan.tokens() * self.cfg.grad_accum) as f64;
        let (skipped, scale) = (s[SKIPPED_SLOT] as u64, s[USED_SCALE_SLOT] as f64);
        let grad_norm = (s[NORM_SLOT] as f64).sqrt() / scale;
        let loss_scaling = self.loss_scaling.is_some();
        let non_finite_losses = if loss_scaling { s[BAD_LOSS_SLOT] as u64 } else { skipped };
        let loss_scale = loss_scaling.then_some(scale);
        Ok(GpuStats { last: StepStats { loss, grad_norm, lr }, skipped, non_finite_losses, loss_scale })
    }

    /// Dynamic loss scaling's state for the next step (what a checkpoint keeps), with f16
    /// products.
    pub async fn loss_scale(&self) -> Result<Option<LossScaleState>, GpuError> {
        if self.loss_scaling.is_none() {
            return Ok(None);
        }
        let s: Vec<f32> = read(&self.gpu, &self.bufs.stats, LOSS_SCALE_SLOT, GOOD_STEPS_SLOT - LOSS_SCALE_SLOT + 1).await?;
        Ok(Some(LossScaleState { scale: s[0], good_steps: s[GOOD_STEPS_SLOT - LOSS_SCALE_SLOT] as u32 }))
    }

    /// Continues loss scaling from `state` (a resumed run's; tests force an overflow with a
    /// large scale). With f32 products the scale stays 1.
    pub fn set_loss_scale(&mut self, state: LossScaleState) {
        let LossScaleState { scale, good_steps } = if self.loss_scaling.is_some() { state } else { LossScaleState { scale: 1.0, good_steps: 0 } };
        let slots = [scale, scale, good_steps as f32, 0.0];
        self.gpu.queue.write_buffer(&self.bufs.stats, bytes(LOSS_SCALE_SLOT), bytemuck::cast_slice(&slots));
    }

    /// Sets the good steps in a row that double the loss scale ([`GROWTH_INTERVAL`] unless
    /// set; tests shorten it).
    pub fn set_growth_interval(&mut self, steps: u32) {
        if let Some(index) = self.loss_scaling {
            self.update.set_words(&self.gpu.queue, index, &ops::adamw::loss_scale_words(LOSS_SCALE_SLOTS, steps));
        }
    }

    /// Mean loss over `iters` random batches of `data` drawn with `rng` (nanoGPT's
    /// `estimate_loss`); the training state is untouched. One submit per batch, one read.
    pub async fn evaluate<'d>(&mut self, data: impl Into<Tokens<'d>>, iters: usize, rng: &mut Rng) -> Result<f64, GpuError> {
        self.evaluate_ranked(data.into(), iters, rng, &OneRank).await
    }

    /// [`GpuTrainer::evaluate`] as one of `ranks`: this rank evaluates batches r, r + ranks,
    /// ... of the same draws, and the mean is over all of them.
    pub async fn evaluate_ranked(&mut self, data: Tokens<'_>, iters: usize, rng: &mut Rng, ranks: &dyn Ranks<f32>) -> Result<f64, GpuError> {
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        enc.clear_buffer(&self.bufs.stats, bytes(EVAL_SLOT), Some(bytes(1)));
        self.gpu.queue.submit([enc.finish()]);
        for i in 0..iters {
            if i % ranks.ranks() != ranks.rank() {
                skip_batch(rng, data, self.plan.seq, self.plan.batch);
                continue;
            }
            self.write_batch(self.cfg.grad_accum, data, Some(&mut *rng));
            self.eval.submit(&self.gpu, &self.kernels);
        }
        let s: Vec<f32> = read(&self.gpu, &self.bufs.stats, EVAL_SLOT, 1).await?;
        Ok(ranks.sum_f64(s[0] as f64) / (iters.max(1) * self.plan.tokens()) as f64)
    }

    /// Dispatches per optimizer step.
    pub fn kernels_per_step(&self) -> usize {
        self.micro.iter().map(|m| m.forward.len() + m.backward.len()).sum::<usize>() + self.update.len()
    }

    /// Bytes of device memory this trainer allocated.
    pub fn device_bytes(&self) -> u64 {
        let b = &self.bufs;
        let half_weights = b.half_weights.as_ref().map(|h| &h.buffer);
        let buffers: u64 =
            [&b.params, &b.grads, &b.adam_m, &b.adam_v, &b.batch, &b.stats, &b.norm_partials, &b.split].into_iter().chain(half_weights).map(|x| x.size()).sum();
        buffers + b.acts.device_bytes()
    }

    /// Device buffers that hold the activations: more than one where the arena is larger
    /// than the device's largest buffer (see [`Plan::arena_parts`]).
    pub fn activation_buffers(&self) -> usize {
        self.bufs.acts.buffers()
    }

    /// The device this trainer runs on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// A forward-only model of `batch` sequences of `seq` tokens over this trainer's
    /// parameters on the device (for samples during training: no copy, and it sees every
    /// update).
    pub fn forward_model(&self, batch: usize, seq: usize) -> Result<GpuForward, GpuError> {
        let plan = Plan::new(self.plan.config, batch, seq).and_then(|p| p.with_classes(self.plan.classes())).map_err(|e| GpuError(e.to_string()))?;
        let (gpu, kernels, params) = (&self.gpu, &self.kernels, &self.bufs.params);
        let half_weights = self.bufs.half_weights.as_ref().map(|h| HalfWeights::over(gpu, kernels, params, h.buffer.clone(), self.layout.len())).transpose()?;
        GpuForward::sharing(gpu.clone(), kernels.clone(), plan, params.clone(), half_weights)
    }
}
