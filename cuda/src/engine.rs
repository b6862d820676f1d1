//! The CUDA [`Engine`] (alpha-core's one interface a run trains through): the step of
//! alpha-core's [`Trainer`](alpha_core::train::Trainer), phase by phase, over device arenas.
//! Micro-batches are drawn on the host and copied over from page-locked memory; each forward
//! and backward is the core's walk through the CUDA executor; the mean loss, the gradient
//! norm, the clip factor and whether the update applies are summed and decided on the device,
//! in the step's record, which the host reads only when the step reports (or before a
//! checkpoint): a step queues its work and returns, with no wait for the device. Each
//! micro-batch's forward and backward is one CUDA graph, captured once and replayed (launched
//! kernel by kernel while they are timed). A step whose loss or norm is not finite is skipped
//! on the device and counted, and the next read is an error naming it. (In a data-parallel run
//! the gradients, the loss and a ZeRO-1 shard's norm are summed over the ranks through the
//! host; whole gradients piece by piece during the backward of the rank's last micro-batch,
//! launched kernel by kernel, as the CPU's ranks sum them.) Every sum runs in a fixed order: the same bits on every run.

use crate::blas::{Arithmetic, Products};
use crate::device::{args, Device, Graph};
use crate::error::CudaError;
use crate::executor::{attention_partials_len, bf16_operand_len, group_rows_by_token, weight_grad_slices_len, Arenas, CudaExecutor, Decoding, TokenGroups};
use crate::memory::{Buffer, HostMirror, Staging};
use crate::profile::Profiler;
use alpha_core::data::{sample_batch, skip_batch, Tokens};
use alpha_core::engine::{Description, DeviceDescription, Engine, HostState, Pending, StepError, StepReport};
use alpha_core::model::{sample_token, ContextWindow, SamplingConfig};
use alpha_core::ops::dropout::DropoutKey;
use alpha_core::parallel::shard;
use alpha_core::plan::Span;
use alpha_core::tape::{self, Observer, Op, Phase, Work};
use alpha_core::train::{LossScaleState, Ranks, RunState, StepStats, TrainConfig};
use alpha_core::{walk, Plan, Rng};
use std::borrow::Cow;
use std::ffi::c_void;
use std::ops::Range;

/// Blocks of the gradient norm's partial sums (grad_norm.cu): a fixed grid, so a fixed order.
const NORM_BLOCKS: usize = 1024;

/// The step's record on the device, f64 slots (common.cuh's `RECORD_*`): the micro-batches'
/// mean losses summed, the gradients' sum of squares, the clip factor, whether the update
/// applies, and the steps skipped since the host last read it.
struct Record;

impl Record {
    const LOSS: usize = 0;
    const NORM: usize = 1;
    /// The slots a step starts from zero: all but the skipped count.
    const STEP: std::ops::Range<usize> = 0..4;
    const SKIPPED: usize = 4;
    const SLOTS: usize = 5;
}

/// Where the batch buffer holds what, u32s: the `n` tokens and `n` targets, and for a training
/// micro-batch its rows grouped by token (see [`TokenGroups`]: `n` rows, then the `groups + 1`
/// starts, padded with `n` past the batch's distinct tokens, so that the embedding's gradient
/// has the same grid every step) and its dropout key (`DropoutKey::words`).
#[derive(Clone, Copy)]
struct BatchLayout {
    n: usize,
    groups: usize,
}

impl BatchLayout {
    fn new(plan: &Plan) -> BatchLayout {
        let n = plan.tokens();
        BatchLayout { n, groups: n.min(plan.config.vocab_size) }
    }

    fn rows(self) -> usize {
        2 * self.n
    }

    fn starts(self) -> usize {
        3 * self.n
    }

    fn key(self) -> usize {
        self.starts() + self.groups + 1
    }

    fn len(self) -> usize {
        self.key() + 4
    }
}

/// The widest head the attention kernels take (attention.cu: a row's threads own 32
/// dimensions each, at most eight of them; decoding's warp owns 8 dimensions a lane).
const MAX_HEAD_SIZE: usize = 256;

/// AdamW's threads per block, and the most elements of a tensor one block updates.
const ADAMW_THREADS: u32 = 256;
const ADAMW_CHUNK: usize = 4096;

/// A piece of one parameter tensor that one block of AdamW updates (adamw.cu's `AdamwChunk`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AdamwChunk {
    offset: i64,
    len: i32,
    decayed: i32,
}

/// The parameters of `shard` cut into AdamW's chunks: each tensor's part in the shard, in
/// pieces of at most [`ADAMW_CHUNK`] elements, weight-decayed where the tensor is a matrix.
fn adamw_chunks(plan: &Plan, shard: &Range<usize>) -> Vec<AdamwChunk> {
    let mut chunks = Vec::new();
    for info in plan.params() {
        let (lo, hi) = (info.span.offset.max(shard.start), info.span.end().min(shard.end));
        for offset in (lo..hi).step_by(ADAMW_CHUNK) {
            let len = ADAMW_CHUNK.min(hi - offset) as i32;
            chunks.push(AdamwChunk { offset: offset as i64, len, decayed: info.kind.is_matrix() as i32 });
        }
    }
    chunks
}

/// A model training on one CUDA device, one of `ranks` in a data-parallel run.
pub struct CudaEngine<'r> {
    products: Products,
    plan: Plan,
    tape: Vec<Op>,
    cfg: TrainConfig,
    ranks: &'r dyn Ranks<f32>,
    params: Buffer,
    /// The weights' bf16 copy under bf16 products (AdamW keeps it current).
    params_bf16: Option<Buffer>,
    grads: Buffer,
    /// AdamW's moments of `shard` of the parameters (all, or a ZeRO-1 rank's).
    adam_m: Buffer,
    adam_v: Buffer,
    shard: Range<usize>,
    /// The shard cut into AdamW's blocks (see [`adamw_chunks`]).
    adamw_chunks: Buffer,
    acts: Buffer,
    /// The batch, u32s, as [`BatchLayout`] lays it out.
    batch: Buffer,
    layout: BatchLayout,
    /// Where the host writes the batch to be copied over (`batch`'s layout).
    staging: Staging,
    operands_bf16: Option<(Buffer, Buffer)>,
    norm_partials: Buffer,
    /// The step's [`Record`].
    record: Buffer,
    /// With RoPE, attention's rotary table.
    rope: Option<Buffer>,
    /// With grouped heads, attention's backward's shares of dK and dV (see
    /// [`attention_partials_len`]).
    attention_partials: Option<Buffer>,
    /// Where the weight gradients' token slices are written (see
    /// [`crate::executor::weight_grad_slices`]).
    weight_grad_slices: Option<Buffer>,
    /// The rows and starts of the last training batch grouped by token, on the host.
    host_rows: Vec<u32>,
    host_starts: Vec<u32>,
    step: u64,
    /// The last step's learning rate, and the steps since the record was last read.
    lr: f64,
    unread: u64,
    rng: Rng,
    /// Batch-1 memory for samples, made at the first.
    sampler: Option<Sampler>,
    /// Kernels and products a micro-batch's forward and backward queue (0 until one has).
    kernels_per_step: usize,
    /// Whether micro-batches run as a CUDA graph (`ALPHA_CUDA_GRAPHS=0`: launch by launch),
    /// and the graph, once captured.
    graphs: bool,
    graph: Option<Graph>,
    /// With whole gradients summed over ranks (not ZeRO-1's shards), the host copy they are
    /// summed in.
    mirror: Option<HostMirror>,
    /// Whether those sums start during the backward of the rank's last micro-batch of a step,
    /// piece by piece as it finishes them (launched kernel by kernel: the host waits for each
    /// piece), or after it, all at once (`ALPHA_CUDA_OVERLAP=0`, to measure the difference).
    overlap_sums: bool,
    /// While an observer wants kernel times (`--trace`), what stamps them.
    profiler: Option<Profiler>,
    /// Last: dropped after everything allocated on it.
    device: Device,
}

/// The device memory of one plan's forward: activations and token ids (and targets).
struct ForwardMemory {
    plan: Plan,
    acts: Buffer,
    tokens: Buffer,
}

impl ForwardMemory {
    fn new(device: &Device, plan: Plan) -> Result<ForwardMemory, CudaError> {
        Ok(ForwardMemory {
            plan,
            acts: Buffer::f32s(device, "sampling activations", plan.acts_len())?,
            tokens: Buffer::zeroed(device, "sampling tokens", plan.tokens(), 4)?,
        })
    }
}

/// What sampling needs: a one-token plan against a KV cache of the window's positions, and a
/// whole window's plan for when the window slides.
struct Sampler {
    decode: ForwardMemory,
    window: ForwardMemory,
    cache: Buffer,
}

impl<'r> CudaEngine<'r> {
    /// An engine for `plan` on `device` with products in `arithmetic`, continuing `start`, one
    /// of `ranks`; with `zero` it holds and updates only its rank's shard of the moments.
    pub fn new(
        device: Device,
        arithmetic: Arithmetic,
        plan: Plan,
        cfg: TrainConfig,
        start: &RunState<f32>,
        ranks: &'r dyn Ranks<f32>,
        zero: bool,
    ) -> Result<CudaEngine<'r>, CudaError> {
        let p = plan.params_len();
        if start.params.len() != p {
            return Err(CudaError::new(format!("{} parameters given, the model has {p}", start.params.len())));
        }
        cfg.validate().map_err(|e| CudaError::new(e.to_string()))?;
        let plan = stored(plan, arithmetic, bf16_activations_by_default());
        let head_size = plan.config.head_size();
        if head_size > MAX_HEAD_SIZE {
            return Err(CudaError::new(format!("heads of {head_size} dimensions: the CUDA attention kernels take up to {MAX_HEAD_SIZE} (more --heads)")));
        }
        let needed = CudaEngine::memory_needed(&plan, arithmetic, if zero { ranks.ranks() } else { 1 });
        let (free, _) = device.memory()?;
        if needed > free as u64 {
            let mib = |b: u64| b / (1 << 20);
            return Err(CudaError::new(format!(
                "the model needs {} MiB of device memory and {} has {} MiB free: try a smaller --batch, --recompute or --grad-accum",
                mib(needed),
                device.info.name,
                mib(free as u64)
            )));
        }
        let shard = if zero { shard(p, ranks.ranks(), ranks.rank()) } else { 0..p };
        // The bias and residual on cuBLASLt's epilogues unless `ALPHA_CUDA_FUSED_EPILOGUES=0`
        // (Alpha's own pass after each product, to measure the difference).
        let fused = std::env::var_os("ALPHA_CUDA_FUSED_EPILOGUES").is_none_or(|v| v != "0");
        let products = Products::new(&device, arithmetic)?.with_fused_epilogues(fused);
        let bf16 = arithmetic == Arithmetic::Bf16;
        let n = plan.tokens();
        let operand_len = bf16_operand_len(&plan);
        let chunks = adamw_chunks(&plan, &shard);
        let layout = BatchLayout::new(&plan);
        let mirror = if ranks.ranks() > 1 && !zero { Some(HostMirror::new(&device, "the gradients' host copy", p)?) } else { None };
        let engine = CudaEngine {
            adamw_chunks: Buffer::zeroed(&device, "AdamW's chunks", chunks.len(), size_of::<AdamwChunk>())?,
            params: Buffer::f32s(&device, "the parameters", p)?,
            params_bf16: if bf16 { Some(Buffer::zeroed(&device, "the weights' bf16 copy", p, 2)?) } else { None },
            grads: Buffer::f32s(&device, "the gradients", p)?,
            adam_m: Buffer::f32s(&device, "AdamW's first moments", shard.len())?,
            adam_v: Buffer::f32s(&device, "AdamW's second moments", shard.len())?,
            acts: Buffer::f32s(&device, "the activations", plan.acts_len())?,
            batch: Buffer::zeroed(&device, "the batch", layout.len(), 4)?,
            staging: Staging::new(&device, "the batch's staging", layout.len())?,
            layout,
            operands_bf16: if bf16 {
                Some((Buffer::zeroed(&device, "bf16 operands", operand_len, 2)?, Buffer::zeroed(&device, "bf16 operands", operand_len, 2)?))
            } else {
                None
            },
            norm_partials: Buffer::zeroed(&device, "the gradient norm's partials", NORM_BLOCKS, 8)?,
            record: Buffer::zeroed(&device, "the step's record", Record::SLOTS, 8)?,
            rope: match crate::executor::rope_table(&plan) {
                Some(table) => {
                    let b = Buffer::f32s(&device, "the rotary table", table.len())?;
                    b.upload(0, &table)?;
                    Some(b)
                }
                None => None,
            },
            attention_partials: match attention_partials_len(&plan) {
                0 => None,
                len => Some(Buffer::f32s(&device, "attention's shares of dK and dV", len)?),
            },
            weight_grad_slices: match weight_grad_slices_len(&plan) {
                0 => None,
                len => Some(Buffer::f32s(&device, "the weight gradients' token slices", len)?),
            },
            host_rows: vec![0; n],
            host_starts: Vec::with_capacity(layout.groups + 1),
            tape: tape::record_to_vec(&plan),
            device,
            products,
            plan,
            cfg,
            ranks,
            shard,
            step: start.step,
            lr: 0.0,
            unread: 0,
            rng: start.rng,
            sampler: None,
            kernels_per_step: 0,
            graphs: std::env::var_os("ALPHA_CUDA_GRAPHS").is_none_or(|v| v != "0"),
            graph: None,
            mirror,
            overlap_sums: std::env::var_os("ALPHA_CUDA_OVERLAP").is_none_or(|v| v != "0"),
            profiler: None,
        };
        engine.adamw_chunks.upload(0, &chunks)?;
        engine.upload_state(start)?;
        Ok(engine)
    }

    /// The engine with its micro-batches run as one CUDA graph each (`graphs`, the default
    /// unless `ALPHA_CUDA_GRAPHS=0`) or queued launch by launch: the same bits either way.
    pub fn with_graphs(self, graphs: bool) -> Self {
        CudaEngine { graphs, graph: None, ..self }
    }

    /// The engine with its ranks' sums of whole gradients started during the backward
    /// (`overlap`, the default unless `ALPHA_CUDA_OVERLAP=0`) or after it: the same bits
    /// either way.
    pub fn with_overlapped_sums(self, overlap: bool) -> Self {
        CudaEngine { overlap_sums: overlap, ..self }
    }

    /// The engine with the activations the products read (the linear layers' inputs, and qkv)
    /// stored as bf16 under bf16 products where `on` (the default unless
    /// `ALPHA_CUDA_BF16_ACTIVATIONS=0`; `Plan::with_half_activations`), else as f32 and rounded
    /// for each product: its activations allocated anew. f32 products store them as f32.
    pub fn with_bf16_activations(self, on: bool) -> Result<Self, CudaError> {
        let plan = stored(self.plan, self.arithmetic(), on);
        if plan == self.plan {
            return Ok(self);
        }
        let acts = Buffer::f32s(&self.device, "the activations", plan.acts_len())?;
        Ok(CudaEngine { acts, tape: tape::record_to_vec(&plan), plan, graph: None, kernels_per_step: 0, ..self })
    }

    /// Whether it stores the activations the products read as bf16 (see
    /// [`CudaEngine::with_bf16_activations`]).
    pub fn stores_bf16_activations(&self) -> bool {
        self.plan.is_half(self.plan.head_acts().lnf)
    }

    /// Whether its micro-batches run as a captured CUDA graph (from the second on a device that
    /// captures, unless graphs are off).
    pub fn graph_captured(&self) -> bool {
        self.graph.is_some()
    }

    /// Device bytes an engine for `plan` takes (a ZeRO-1 run's moments split `moment_shards`
    /// ways), before the kernels and cuBLASLt's workspace.
    pub fn memory_needed(plan: &Plan, arithmetic: Arithmetic, moment_shards: usize) -> u64 {
        let plan = &stored(*plan, arithmetic, bf16_activations_by_default());
        let p = plan.params_len() as u64;
        let batch = BatchLayout::new(plan).len() as u64;
        let rope = if plan.attention_shape().rope.is_some() { plan.config.block_size * plan.config.head_size() } else { 0 };
        let chunks = (size_of::<AdamwChunk>() * adamw_chunks(plan, &(0..plan.params_len())).len()) as u64;
        let mut bytes = 4
            * (2 * p
                + 2 * p.div_ceil(moment_shards as u64)
                + plan.acts_len() as u64
                + rope as u64
                + batch
                + (attention_partials_len(plan) + weight_grad_slices_len(plan)) as u64)
            + chunks;
        if arithmetic == Arithmetic::Bf16 {
            bytes += 2 * p + 2 * 2 * bf16_operand_len(plan) as u64;
        }
        bytes
    }

    fn upload_state(&self, start: &RunState<f32>) -> Result<(), CudaError> {
        self.params.upload(0, &start.params)?;
        if let Some((m, v)) = &start.moments {
            self.adam_m.upload(0, &m[self.shard.clone()])?;
            self.adam_v.upload(0, &v[self.shard.clone()])?;
        }
        self.refresh_bf16_weights()
    }

    /// Rounds the parameters into their bf16 copy (after an upload or a gather).
    fn refresh_bf16_weights(&self) -> Result<(), CudaError> {
        if let Some(copy) = &self.params_bf16 {
            let len = self.params.len();
            let (out, x) = (copy.tensor().ptr, self.params.tensor().ptr);
            // SAFETY: both hold the parameters.
            unsafe { self.device.launch("round_to_bf16", len.div_ceil(256) as u32, 256, &mut args![out, x, 0u64, len as i64, 1i32]) }?;
        }
        Ok(())
    }

    /// The device it trains on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The arithmetic of its products.
    pub fn arithmetic(&self) -> Arithmetic {
        self.products.arithmetic()
    }

    fn arenas(&self, backward: bool) -> Arenas {
        let (layout, batch) = (self.layout, self.batch.tensor());
        let n = layout.n;
        Arenas {
            params: self.params.tensor(),
            params_bf16: self.params_bf16.as_ref().map(Buffer::tensor),
            grads: backward.then(|| self.grads.tensor()),
            acts: self.acts.tensor(),
            tokens: batch.part(0, n),
            targets: Some(batch.part(n, n)),
            operands_bf16: self.operands_bf16.as_ref().map(|(a, b)| (a.tensor(), b.tensor())),
            rope: self.rope.as_ref().map(Buffer::tensor),
            attention_partials: self.attention_partials.as_ref().map(Buffer::tensor),
            weight_grad_slices: self.weight_grad_slices.as_ref().map(Buffer::tensor),
            token_groups: backward.then(|| TokenGroups {
                rows: batch.part(layout.rows(), n),
                starts: batch.part(layout.starts(), layout.groups + 1),
                count: layout.groups,
            }),
        }
    }

    /// Draws the next batch of `data` with `rng` and queues its copy to the device; for a
    /// training micro-batch (its dropout key given), with its rows grouped by token for the
    /// token embedding's gradient and the key (see [`BatchLayout`]).
    fn load_batch(&mut self, data: Tokens<'_>, rng: &mut Rng, training: Option<DropoutKey>) -> Result<(), CudaError> {
        let layout = self.layout;
        let n = layout.n;
        let staged = self.staging.get()?;
        let (x, rest) = staged.split_at_mut(n);
        sample_batch(rng, data, self.plan.seq, x, &mut rest[..n]);
        let Some(key) = training else {
            return self.staging.copy_to(&self.device, &self.batch, 0, 0..2 * n);
        };
        group_rows_by_token(x, &mut self.host_rows, &mut self.host_starts);
        self.host_starts.resize(layout.groups + 1, n as u32);
        staged[layout.rows()..layout.starts()].copy_from_slice(&self.host_rows);
        staged[layout.starts()..layout.key()].copy_from_slice(&self.host_starts);
        staged[layout.key()..layout.len()].copy_from_slice(&key.words());
        self.staging.copy_to(&self.device, &self.batch, 0, 0..layout.len())
    }

    /// The mean of the last forward's losses, summed in f64 in index order as the CPU does
    /// (read now: for evaluations).
    fn mean_loss(&self, acts: &Buffer, plan: &Plan) -> Result<f64, CudaError> {
        let losses = plan.head_acts().losses;
        let mut host = vec![0f32; losses.len];
        acts.download(losses.offset, &mut host)?;
        Ok(host.iter().map(|&l| l as f64).sum::<f64>() / host.len() as f64)
    }

    /// Queues a training forward and backward of the loaded micro-batch (see
    /// [`CudaEngine::queue_forward_backward`]): while the kernels are not timed, as one CUDA
    /// graph, captured at the first such micro-batch after one queued launch by launch (which
    /// chose the products' algorithms), and replayed from then on.
    fn forward_backward(&mut self, timed: bool) -> Result<(), CudaError> {
        if timed || !self.graphs || !self.device.captures() {
            return self.queue_forward_backward(false);
        }
        if self.graph.is_none() && self.kernels_per_step > 0 {
            let graphs_off = |e: CudaError| CudaError::new(format!("{e} (ALPHA_CUDA_GRAPHS=0 runs without CUDA graphs)"));
            self.device.begin_capture().map_err(graphs_off)?;
            let queued = self.queue_forward_backward(false);
            self.graph = Some(self.device.end_capture(queued).map_err(graphs_off)?);
        }
        match &self.graph {
            Some(graph) => self.device.replay(graph),
            None => self.queue_forward_backward(false),
        }
    }

    /// Queues a training forward and backward of the loaded micro-batch, launch by launch, its
    /// mean loss added to the record's: the same launches with the same arguments for every
    /// micro-batch, whose batch, grouped rows and dropout key lie in the batch buffer. Where it
    /// `hands_out` the gradients, each piece the backward finishes is queued to be copied into
    /// the mirror as soon as it is final (the tables' last).
    fn queue_forward_backward(&mut self, hands_out: bool) -> Result<(), CudaError> {
        let key = self.batch.tensor().part(self.layout.key(), 4);
        let scale = 1.0 / (self.plan.tokens() * self.cfg.grad_accum) as f64;
        let arenas = self.arenas(false);
        let mut exec = CudaExecutor::new(&self.device, &self.products, &self.plan, arenas).with_dropout_key(key).profiled(self.profiler.as_mut());
        walk::forward(&mut exec, &self.tape, Some(scale));
        let mut launches = exec.finish()?;
        let losses = self.plan.head_acts().losses;
        let (record, x, n) = (self.record.tensor().ptr, self.acts.tensor().part(losses.offset, losses.len).ptr, losses.len as i32);
        // SAFETY: the record's slots; `n` losses.
        unsafe { self.launch_traced("forward", "cross_entropy", "add_mean_loss", 1, 32, Work::moving(losses.len), &mut args![record, x, n]) }?;
        self.acts.clear(&self.device, self.plan.scratch().dres.range())?;
        let arenas = self.arenas(true);
        let exec = CudaExecutor::new(&self.device, &self.products, &self.plan, arenas).with_dropout_key(key).profiled(self.profiler.as_mut());
        let (device, grads) = (&self.device, &self.grads);
        let mut mirror = self.mirror.as_mut().filter(|_| hands_out);
        let (mut copied, mut handed_from) = (Ok(()), grads.len());
        let mut take = |done: Span| {
            handed_from = done.offset;
            if let (Ok(()), Some(m)) = (&copied, mirror.as_deref_mut()) {
                copied = m.copy_piece(device, grads, done.range());
            }
        };
        let mut exec = if hands_out { exec.handing_out_finished(&self.plan, &mut take) } else { exec };
        walk::backward(&mut exec, &self.plan, &self.tape);
        launches += exec.finish()?;
        copied?;
        if let Some(m) = mirror {
            m.copy_piece(device, grads, 0..handed_from)?;
        }
        self.kernels_per_step = launches;
        Ok(())
    }

    /// Queues the sums of squares of the gradients `range` into the norm's partials.
    fn sum_squares(&mut self, range: Range<usize>) -> Result<(), CudaError> {
        let x = self.grads.tensor().part(range.start, range.len());
        let partials = self.norm_partials.tensor().ptr;
        let work = Work { flops: 2.0 * x.len as f64, bytes: 4.0 * x.len as f64 + 8.0 * NORM_BLOCKS as f64 };
        // SAFETY: NORM_BLOCKS partials, `x.len` gradients.
        unsafe { self.launch_traced("update", "grad_norm", "sum_squares_partials", NORM_BLOCKS as u32, 256, work, &mut args![partials, x.ptr, x.len as i64]) }
    }

    /// Queues the step's check (grad_norm.cu's `check_step`): the norm from the `partials`
    /// first partials (none: the record's norm is the host's), the clip factor, whether the
    /// update applies.
    fn check_step(&mut self, partials: usize) -> Result<(), CudaError> {
        let (record, sums, count, max_norm) = (self.record.tensor().ptr, self.norm_partials.tensor().ptr, partials as i32, self.cfg.grad_clip);
        let work = Work::moving(2 * partials);
        // SAFETY: the record's slots; `count` partials.
        unsafe { self.launch_traced("update", "grad_norm", "check_step", 1, 32, work, &mut args![record, sums, count, max_norm]) }
    }

    /// Queues AdamW over the moments' shard, in one launch (skipped on the device where the
    /// record says so); advances the step and returns its learning rate.
    fn apply(&mut self) -> Result<f64, CudaError> {
        let c = &self.cfg;
        let lr = c.schedule.at(self.step);
        self.step += 1;
        let a = c.adamw;
        let bc1 = 1.0 - a.beta1.powf(self.step as f64);
        let bc2_sqrt = (1.0 - a.beta2.powf(self.step as f64)).sqrt();
        let (one_m_b1, b2, one_m_b2) = ((1.0 - a.beta1) as f32, a.beta2 as f32, (1.0 - a.beta2) as f32);
        let (bc2_sqrt, eps, step_size) = (bc2_sqrt as f32, a.eps as f32, (lr / bc1) as f32);
        let matrix_decay = (1.0 - lr * a.weight_decay) as f32;
        let blocks = self.adamw_chunks.len() as u32;
        if blocks == 0 {
            return Ok(lr);
        }
        let (p, g, m, v) = (self.params.tensor().ptr, self.grads.tensor().ptr, self.adam_m.tensor().ptr, self.adam_v.tensor().ptr);
        let p_bf16 = self.params_bf16.as_ref().map_or(0, |b| b.tensor().ptr);
        let (chunks, moments_start, record) = (self.adamw_chunks.tensor().ptr, self.shard.start as i64, self.record.tensor().ptr);
        let len = self.shard.len() as f64;
        let work = Work { flops: 0.0, bytes: len * (4.0 * 7.0 + if p_bf16 != 0 { 2.0 } else { 0.0 }) };
        // SAFETY: the chunks lie in the parameters and, less `moments_start`, in the moments;
        // p_bf16 is the parameters' copy; the record's slots.
        unsafe {
            self.launch_traced(
                "update",
                "adamw",
                "adamw",
                blocks,
                ADAMW_THREADS,
                work,
                &mut args![p, m, v, g, p_bf16, chunks, moments_start, record, matrix_decay, one_m_b1, b2, one_m_b2, bc2_sqrt, eps, step_size],
            )
        }?;
        Ok(lr)
    }

    /// Queues kernel `name` of op `op` in pass `pass` (the walk's passes, or "update"),
    /// stamped while profiling (as the executor stamps the walk's).
    ///
    /// # Safety
    /// As [`Device::launch`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch_traced(
        &mut self,
        pass: &'static str,
        op: &'static str,
        name: &'static str,
        grid: u32,
        block: u32,
        work: Work,
        args: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        if let Some(p) = self.profiler.as_mut() {
            p.start(&self.device, pass, op, name, work)?;
        }
        // SAFETY: forwarded to the caller.
        unsafe { self.device.launch(name, grid, block, args) }?;
        self.profiler.as_mut().map_or(Ok(()), |p| p.end(&self.device))
    }

    /// Sums (or, with ZeRO-1, reduces this rank's shard of) the gradients over the ranks
    /// through host memory: whole ones in the mirror, from the pieces the backward copied
    /// there where it was `overlapped`, else copied whole now.
    fn sum_gradients(&mut self, overlapped: bool) -> Result<(), CudaError> {
        let Some(mirror) = self.mirror.as_mut() else {
            let mut host = vec![0f32; self.grads.len()];
            self.grads.download(0, &mut host)?;
            self.ranks.sum_shard(&mut host);
            return self.grads.upload(0, &host);
        };
        if !overlapped {
            mirror.copy_piece(&self.device, &self.grads, 0..self.grads.len())?;
        }
        mirror.sum_pieces(self.ranks)?;
        mirror.copy_back(&self.device, &self.grads)
    }

    fn sharded(&self) -> bool {
        self.shard.len() < self.plan.params_len()
    }

    /// [`Trainer::train_step_ranked`](alpha_core::train::Trainer::train_step_ranked) on the device:
    /// queued, and with `report` (or while the kernels are timed) waited for and its record
    /// read.
    fn train_step(&mut self, data: Tokens<'_>, report: bool, observer: &mut dyn Observer) -> Result<StepReport, StepError> {
        let device = |e: CudaError| StepError::Device(e.to_string());
        let (rank, ranks) = (self.ranks.rank(), self.ranks.ranks());
        let timed = observer.wants_kernel_times();
        if timed {
            self.profiler.get_or_insert_with(Profiler::new).clear();
        } else {
            self.profiler = None;
        }
        observer.phase_begin(Phase::Submit);
        self.grads.clear(&self.device, 0..self.grads.len()).map_err(device)?;
        self.record.clear(&self.device, Record::STEP).map_err(device)?;
        // Whole gradients are summed while this rank's last micro-batch's backward runs.
        let last = (0..self.cfg.grad_accum).rev().find(|m| m % ranks == rank);
        let overlapped = self.mirror.is_some() && self.overlap_sums && last.is_some();
        for micro in 0..self.cfg.grad_accum {
            let mut rng = self.rng;
            if micro % ranks != rank {
                skip_batch(&mut rng, data, self.plan.seq, self.plan.batch);
            } else {
                let key = self.plan.dropout_key(self.step * self.cfg.grad_accum as u64 + micro as u64);
                self.load_batch(data, &mut rng, Some(key)).map_err(device)?;
                if overlapped && Some(micro) == last {
                    self.queue_forward_backward(true).map_err(device)?;
                } else {
                    self.forward_backward(timed).map_err(device)?;
                }
            }
            self.rng = rng;
        }
        observer.phase_end(Phase::Submit);
        if ranks > 1 {
            observer.phase_begin(Phase::Allreduce);
            self.sum_gradients(overlapped).map_err(device)?;
            let loss = self.ranks.sum_f64(self.read_slot(Record::LOSS).map_err(device)?);
            self.record.upload(Record::LOSS, &[loss]).map_err(device)?;
            if self.sharded() {
                self.sum_squares(self.shard.clone()).map_err(device)?;
                let mut partials = vec![0f64; NORM_BLOCKS];
                self.norm_partials.download(0, &mut partials).map_err(device)?;
                let norm = self.ranks.sum_f64(partials.iter().sum());
                self.record.upload(Record::NORM, &[norm]).map_err(device)?;
            }
            observer.phase_end(Phase::Allreduce);
        }
        observer.phase_begin(Phase::Submit);
        if self.sharded() {
            self.check_step(0).map_err(device)?;
        } else {
            self.sum_squares(0..self.plan.params_len()).map_err(device)?;
            self.check_step(NORM_BLOCKS).map_err(device)?;
        }
        self.lr = self.apply().map_err(device)?;
        self.unread += 1;
        observer.phase_end(Phase::Submit);
        if self.sharded() {
            observer.phase_begin(Phase::Allreduce);
            self.gather_params().map_err(device)?;
            observer.phase_end(Phase::Allreduce);
        }
        if !(report || timed) {
            return Ok(StepReport { stats: None, loss_scaling: None });
        }
        observer.phase_begin(Phase::DeviceWait);
        let stats = self.read_stats()?;
        observer.phase_end(Phase::DeviceWait);
        if let Some(p) = &self.profiler {
            observer.kernel_times(&p.read().map_err(device)?);
        }
        Ok(StepReport { stats: Some(stats), loss_scaling: None })
    }

    /// Slot `slot` of the record, once the queued work is done.
    fn read_slot(&self, slot: usize) -> Result<f64, CudaError> {
        let mut value = [0f64];
        self.record.download(slot, &mut value)?;
        Ok(value[0])
    }

    /// The last step's statistics, once the queued work is done; an error if any step since
    /// the last read was skipped (a non-finite loss or gradient norm).
    fn read_stats(&mut self) -> Result<StepStats, StepError> {
        let device = |e: CudaError| StepError::Device(e.to_string());
        let mut record = [0f64; Record::SLOTS];
        self.record.download(0, &mut record).map_err(device)?;
        let unread = std::mem::take(&mut self.unread);
        let last = StepStats { loss: record[Record::LOSS] / self.cfg.grad_accum as f64, grad_norm: record[Record::NORM].sqrt(), lr: self.lr };
        let skipped = record[Record::SKIPPED] as u64;
        if skipped > 0 {
            self.record.upload(Record::SKIPPED, &[0f64]).map_err(device)?;
            return Err(StepError::skipped_updates(skipped, unread, self.step, &last));
        }
        Ok(last)
    }

    /// ZeRO-1: every rank's updated shard of the parameters to every rank.
    fn gather_params(&mut self) -> Result<(), CudaError> {
        let mut host = vec![0f32; self.params.len()];
        self.params.download(0, &mut host)?;
        self.ranks.gather_shards(&mut host);
        self.params.upload(0, &host)?;
        self.refresh_bf16_weights()
    }

    /// The loss at every position of `tokens` `[B * T]` predicting `targets` (a forward of the
    /// engine's plan; for `eval`).
    pub fn losses(&mut self, tokens: &[u32], targets: &[u32]) -> Result<Vec<f32>, CudaError> {
        let n = self.plan.tokens();
        if tokens.len() != n || targets.len() != n {
            return Err(CudaError::new(format!("a batch of this model has {n} tokens, got {}", tokens.len())));
        }
        self.batch.upload(0, tokens)?;
        self.batch.upload(n, targets)?;
        let mut exec = CudaExecutor::new(&self.device, &self.products, &self.plan, self.arenas(false));
        walk::forward(&mut exec, &self.tape, None);
        exec.finish()?;
        let mut losses = vec![0f32; n];
        self.acts.download(self.plan.head_acts().losses.offset, &mut losses)?;
        Ok(losses)
    }

    /// nanoGPT's `estimate_loss` over `iters` batches drawn with `rng` (rank r evaluates
    /// batches r, r + ranks, ...).
    fn evaluate_batches(&mut self, data: Tokens<'_>, iters: usize, rng: &mut Rng) -> Result<f64, CudaError> {
        let mut total = 0.0;
        for i in 0..iters {
            if i % self.ranks.ranks() != self.ranks.rank() {
                skip_batch(rng, data, self.plan.seq, self.plan.batch);
                continue;
            }
            self.load_batch(data, rng, None)?;
            let mut exec = CudaExecutor::new(&self.device, &self.products, &self.plan, self.arenas(false));
            walk::forward(&mut exec, &self.tape, None);
            exec.finish()?;
            total += self.mean_loss(&self.acts, &self.plan)?;
        }
        Ok(self.ranks.sum_f64(total) / iters.max(1) as f64)
    }

    fn sampler(&mut self) -> Result<&Sampler, CudaError> {
        if self.sampler.is_none() {
            let c = self.plan.config;
            let with_classes = |p: Plan| p.with_classes(self.plan.classes()).map_err(|e| CudaError::new(e.to_string()));
            let decode = with_classes(Plan::new(c, 1, 1).map_err(|e| CudaError::new(e.to_string()))?)?;
            let window = with_classes(Plan::new(c, 1, c.block_size).map_err(|e| CudaError::new(e.to_string()))?)?;
            let cache = Buffer::f32s(&self.device, "the KV cache", 2 * c.n_layer * c.block_size * c.kv_heads() * c.head_size())?;
            self.sampler = Some(Sampler { decode: ForwardMemory::new(&self.device, decode)?, window: ForwardMemory::new(&self.device, window)?, cache });
        }
        Ok(self.sampler.as_ref().expect("made above"))
    }

    /// A forward of `mem`'s plan over its tokens (uploaded), decoding against the cache where
    /// `decoding`; the logits in use at row `row`.
    fn forward_logits(&self, mem: &ForwardMemory, decoding: Option<Decoding>, row: usize) -> Result<Vec<f32>, CudaError> {
        let arenas = Arenas { acts: mem.acts.tensor(), tokens: mem.tokens.tensor(), targets: None, grads: None, ..self.arenas(false) };
        let mut exec = CudaExecutor::new(&self.device, &self.products, &mem.plan, arenas);
        if let Some(d) = decoding {
            exec = exec.decoding(d);
        }
        walk::forward(&mut exec, &tape::record_to_vec(&mem.plan), None);
        exec.finish()?;
        let mut logits = vec![0f32; mem.plan.classes()];
        mem.acts.download(mem.plan.head_acts().logits.offset + row * mem.plan.config.vocab_size, &mut logits)?;
        Ok(logits)
    }

    /// [`alpha_core::model::generate`]'s draws on the device: within the window each token is
    /// one token's forward against the KV cache (the prompt's one by one); once the window
    /// slides, a whole window's forward.
    fn generate(&mut self, context: &[u32], cfg: &SamplingConfig, rng: &mut Rng, emit: &mut dyn FnMut(u32)) -> Result<(), CudaError> {
        self.sampler()?;
        let s = self.sampler.as_ref().expect("made above");
        let block = self.plan.config.block_size;
        let mut scratch = vec![0; block];
        let mut window = ContextWindow::new(&mut scratch, context);
        let mut cached = Some(0);
        for _ in 0..cfg.tokens {
            let last = window.last();
            let mut logits = match cached {
                Some(done) => {
                    let mut logits = Vec::new();
                    for position in done..=last {
                        s.decode.tokens.upload(0, &window.tokens()[position..=position])?;
                        logits = self.forward_logits(&s.decode, Some(Decoding { cache: s.cache.tensor(), len: block, position }), 0)?;
                    }
                    cached = Some(last + 1);
                    logits
                }
                None => {
                    s.window.tokens.upload(0, window.tokens())?;
                    self.forward_logits(&s.window, None, last)?
                }
            };
            let next = sample_token(&mut logits, cfg, rng);
            if cfg.stop == Some(next) {
                break;
            }
            emit(next);
            if window.push(next) {
                cached = None;
            }
        }
        Ok(())
    }

    /// Parameters and moments on the host (with ZeRO-1 rank 0 collects the moments).
    fn download_state(&self) -> Result<HostState<'static>, CudaError> {
        let p = self.plan.params_len();
        let mut params = vec![0f32; p];
        self.params.download(0, &mut params)?;
        let mut mine = (vec![0f32; self.shard.len()], vec![0f32; self.shard.len()]);
        self.adam_m.download(0, &mut mine.0)?;
        self.adam_v.download(0, &mut mine.1)?;
        if !self.sharded() {
            return Ok((Cow::Owned(params), Cow::Owned(mine.0), Cow::Owned(mine.1)));
        }
        let len = if self.ranks.rank() == 0 { p } else { 0 };
        let (mut m, mut v) = (vec![0f32; len], vec![0f32; len]);
        self.ranks.collect_shards(&mine.0, &mut m);
        self.ranks.collect_shards(&mine.1, &mut v);
        Ok((Cow::Owned(params), Cow::Owned(m), Cow::Owned(v)))
    }
}

/// The plan an engine in `arithmetic` walks for `plan`: under bf16 products, the activations the
/// products read stored as bf16 where `bf16_activations` (they read them as bf16 anyway, and
/// attention reads qkv so, as PyTorch's autocast stores them); as f32 otherwise.
fn stored(plan: Plan, arithmetic: Arithmetic, bf16_activations: bool) -> Plan {
    plan.with_half_activations(arithmetic == Arithmetic::Bf16 && bf16_activations)
}

/// Whether bf16 runs store activations as bf16: unless `ALPHA_CUDA_BF16_ACTIVATIONS=0` (f32
/// activations rounded for each product, to measure the difference).
fn bf16_activations_by_default() -> bool {
    std::env::var_os("ALPHA_CUDA_BF16_ACTIVATIONS").is_none_or(|v| v != "0")
}

/// The arithmetic's name in records and messages.
pub fn precision_name(arithmetic: Arithmetic) -> &'static str {
    match arithmetic {
        Arithmetic::F32 => "f32",
        Arithmetic::Tf32 => "tf32",
        Arithmetic::Bf16 => "bf16",
    }
}

impl Engine for CudaEngine<'_> {
    fn step<'a>(&'a mut self, data: Tokens<'a>, report: bool, observer: &'a mut dyn Observer) -> Pending<'a, Result<StepReport, StepError>> {
        Box::pin(std::future::ready(self.train_step(data, report, observer)))
    }

    fn check(&mut self) -> Pending<'_, Result<(), StepError>> {
        let read = if self.unread > 0 { self.read_stats().map(|_| ()) } else { Ok(()) };
        Box::pin(std::future::ready(read))
    }

    fn evaluate<'a>(&'a mut self, data: Tokens<'a>, iters: usize, rng: &'a mut Rng) -> Pending<'a, Result<f64, String>> {
        Box::pin(std::future::ready(self.evaluate_batches(data, iters, rng).map_err(|e| e.to_string())))
    }

    fn sample<'a>(&'a mut self, prompt: &'a [u32], cfg: &'a SamplingConfig, rng: &'a mut Rng, emit: &'a mut dyn FnMut(u32)) -> Pending<'a, Result<(), String>> {
        Box::pin(std::future::ready(self.generate(prompt, cfg, rng, emit).map_err(|e| e.to_string())))
    }

    fn state(&self) -> Pending<'_, Result<HostState<'_>, String>> {
        Box::pin(std::future::ready(self.download_state().map_err(|e| e.to_string())))
    }

    fn loss_scale(&self) -> Pending<'_, Result<Option<LossScaleState>, String>> {
        // bf16 and f32 products need no loss scaling.
        Box::pin(std::future::ready(Ok(None)))
    }

    fn set_loss_scale(&mut self, _state: LossScaleState) {}

    fn step_count(&self) -> u64 {
        self.step
    }

    fn rng(&self) -> Rng {
        self.rng
    }

    fn plan(&self) -> &Plan {
        &self.plan
    }

    fn describe(&self) -> Description {
        let info = &self.device.info;
        let bytes = [&self.params, &self.grads, &self.adam_m, &self.adam_v, &self.acts].iter().map(|b| b.bytes() as u64).sum::<u64>()
            + self.params_bf16.as_ref().map_or(0, |b| b.bytes() as u64)
            + self.operands_bf16.as_ref().map_or(0, |(a, b)| (a.bytes() + b.bytes()) as u64);
        Description {
            backend: "cuda",
            summary: format!("CUDA device {} ({}, {})", info.ordinal, info.name, info.arch()),
            precision: precision_name(self.arithmetic()),
            threads: 1,
            device: Some(DeviceDescription {
                adapter: info.name.clone(),
                platform: "CUDA".into(),
                device_type: "discrete".into(),
                kernels_per_step: self.kernels_per_step,
                submits_per_step: 0,
                memory_bytes: bytes,
                activation_buffers: 1,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alpha_core::GptConfig;

    /// The chunks cover a shard once, in order, none longer than a block's share or across two
    /// tensors, decayed exactly where AdamW on the CPU decays (the update itself: parity.rs).
    #[test]
    fn adamw_chunks_cover_the_shard_once_tensor_by_tensor() {
        let plan = Plan::new(GptConfig::gpt2(65, 64, 2, 2, 96), 2, 64).unwrap();
        let p = plan.params_len();
        for shard in [0..p, shard(p, 3, 0), shard(p, 3, 1), shard(p, 3, 2)] {
            let chunks = adamw_chunks(&plan, &shard);
            let mut next = shard.start;
            for c in &chunks {
                assert_eq!(c.offset as usize, next, "shard {shard:?}: a gap or an overlap");
                assert!(c.len > 0 && c.len as usize <= ADAMW_CHUNK);
                let end = c.offset as usize + c.len as usize;
                let info = plan.params().find(|i| i.span.offset <= next && next < i.span.end()).unwrap();
                assert!(end <= info.span.end(), "a chunk across {info} and the next tensor");
                assert_eq!(c.decayed == 1, info.kind.is_matrix(), "{info}");
                next = end;
            }
            assert_eq!(next, shard.end, "shard {shard:?} not covered to its end");
        }
        assert!(adamw_chunks(&plan, &(0..p)).iter().any(|c| c.len as usize == ADAMW_CHUNK), "no tensor spans a whole chunk");
    }
}
