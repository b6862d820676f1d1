//! Training on the GPU: the core's tape compiled once into dispatch lists over device
//! buffers, and each optimizer step encoded into one command buffer and one submit (zero
//! the gradients; per micro-batch forward, loss sum, backward; gradient norm; AdamW with the
//! clip factor). Nothing is read back inside a step: the loss and gradient norm stay in a
//! small statistics buffer until [`GpuTrainer::stats`] reads them.

use crate::context::{Gpu, GpuError};
use crate::kernels::{Kernels, Program, ProgramBuilder, View};
use crate::layout::DeviceLayout;
use crate::ops::{self, Epilogue};
use crate::readback::read;
use alpha_core::data::sample_batch;
use alpha_core::plan::{Plan, Span, ACT_ALIGN};
use alpha_core::tape::{self, EpilogueSpan, Op};
use alpha_core::train::{NonFinite, StepStats, TrainConfig};
use alpha_core::Rng;

/// Statistics buffer slots.
const LOSS_SLOT: usize = 0;
const NORM_SLOT: usize = 1;
const EVAL_SLOT: usize = 2;

fn aligned(n: usize) -> usize {
    n.div_ceil(ACT_ALIGN) * ACT_ALIGN
}

/// Where one batch's token ids live in the batch buffer (u32 elements).
#[derive(Clone, Copy, Debug)]
struct BatchSlot {
    tokens: Span,
    targets: Span,
    order: Span,
    starts: Span,
}

impl BatchSlot {
    fn new(index: usize, n: usize, vocab: usize) -> BatchSlot {
        let base = index * BatchSlot::len(n, vocab);
        let s = |i: usize, len| Span { offset: base + i * aligned(n), len };
        BatchSlot { tokens: s(0, n), targets: s(1, n), order: s(2, n), starts: s(3, vocab + 1) }
    }
    fn len(n: usize, vocab: usize) -> usize {
        3 * aligned(n) + aligned(vocab + 1)
    }
}

/// The device buffers of one model.
struct Buffers {
    params: wgpu::Buffer,
    grads: wgpu::Buffer,
    adam_m: wgpu::Buffer,
    adam_v: wgpu::Buffer,
    acts: wgpu::Buffer,
    batch: wgpu::Buffer,
    stats: wgpu::Buffer,
    norm_partials: wgpu::Buffer,
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
    adamw_index: usize,
    host_batch: Vec<u32>,
    dres: Span,
}

fn storage(gpu: &Gpu, label: &str, elements: usize) -> Result<wgpu::Buffer, GpuError> {
    let bytes = (elements.max(ACT_ALIGN) * 4) as u64;
    gpu.check_size(label, bytes, false)?;
    Ok(gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    }))
}

impl GpuTrainer {
    /// Builds every buffer and dispatch for `plan` on `gpu` and uploads `params` (host
    /// layout, `plan.params_len()` elements); moments start at zero.
    pub async fn new(gpu: Gpu, plan: Plan, cfg: TrainConfig, rng: Rng, params: &[f32]) -> Result<GpuTrainer, GpuError> {
        if params.len() != plan.params_len() {
            return Err(GpuError(format!("{} parameters given, the model has {}", params.len(), plan.params_len())));
        }
        if cfg.grad_accum == 0 {
            return Err(GpuError("gradient accumulation steps must be at least 1".into()));
        }
        if plan.acts_len().max(plan.params_len() * 4) >= u32::MAX as usize / 4 {
            return Err(GpuError(format!("the model needs {} activation elements; the GPU kernels index at most 2^30", plan.acts_len())));
        }
        let kernels = Kernels::new(&gpu, plan.config.head_size()).await?;
        let layout = DeviceLayout::new(&plan);
        let n = plan.tokens();
        let vocab = plan.config.vocab_size;
        let slot_len = BatchSlot::len(n, vocab);
        let bufs = Buffers {
            params: storage(&gpu, "parameters", layout.len())?,
            grads: storage(&gpu, "gradients", layout.len())?,
            adam_m: storage(&gpu, "AdamW first moments", layout.len())?,
            adam_v: storage(&gpu, "AdamW second moments", layout.len())?,
            acts: storage(&gpu, "activations", plan.acts_len())?,
            batch: storage(&gpu, "batch", slot_len * (cfg.grad_accum + 1))?,
            stats: storage(&gpu, "statistics", ACT_ALIGN)?,
            norm_partials: storage(&gpu, "norm partials", ops::NORM_CHUNKS)?,
        };
        for (what, len) in [("the parameters", layout.len()), ("the gradients", layout.len())] {
            gpu.check_size(what, (len * 4) as u64, true)?;
        }
        let tape = tape::record_to_vec(&plan);
        let scale = 1.0 / (n * cfg.grad_accum) as f32;
        let mut micro = Vec::with_capacity(cfg.grad_accum);
        for slot in 0..cfg.grad_accum {
            let b = BatchSlot::new(slot, n, vocab);
            micro.push(MicroStep {
                forward: compile_forward(&gpu, &kernels, &plan, &layout, &bufs, &tape, b, Some(scale))?,
                backward: compile_backward(&gpu, &kernels, &plan, &layout, &bufs, &tape, b)?,
            });
        }
        let eval = compile_forward(&gpu, &kernels, &plan, &layout, &bufs, &tape, BatchSlot::new(cfg.grad_accum, n, vocab), None)?;
        let mut p = ProgramBuilder::default();
        let whole = |buf| View::first(buf, layout.len());
        let stats = View::first(&bufs.stats, ACT_ALIGN);
        ops::sum_squares(&mut p, whole(&bufs.grads), View::first(&bufs.norm_partials, ops::NORM_CHUNKS), stats, NORM_SLOT);
        let adamw_index = ops::adamw(&mut p, whole(&bufs.params), whole(&bufs.grads), whole(&bufs.adam_m), whole(&bufs.adam_v), stats);
        let update = p.build(&gpu, &kernels)?;
        let dres = plan.scratch().dres;
        let t = GpuTrainer {
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
            adamw_index,
            host_batch: vec![0; slot_len],
            dres,
        };
        t.upload(params, None)?;
        Ok(t)
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
        q.write_buffer(&self.bufs.adam_m, 0, bytemuck::cast_slice(&self.layout.to_device(m)));
        q.write_buffer(&self.bufs.adam_v, 0, bytemuck::cast_slice(&self.layout.to_device(v)));
        Ok(())
    }

    /// Parameters and AdamW moments `(params, m, v)` in host layout (for checkpoints).
    pub async fn download(&self) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>), GpuError> {
        let mut out = Vec::with_capacity(3);
        for buf in [&self.bufs.params, &self.bufs.adam_m, &self.bufs.adam_v] {
            let dev: Vec<f32> = read(&self.gpu, buf, 0, self.layout.len()).await?;
            let mut host = vec![0.0; self.plan.params_len()];
            self.layout.to_host(&dev, &mut host);
            out.push(host);
        }
        let v = out.pop().expect("three arenas");
        let m = out.pop().expect("three arenas");
        Ok((out.pop().expect("three arenas"), m, v))
    }

    /// Draws a batch from `data` into batch slot `slot` (on the host, then one write).
    fn write_batch(&mut self, slot: usize, data: &[u32], rng: Option<&mut Rng>) {
        let (n, vocab) = (self.plan.tokens(), self.plan.config.vocab_size);
        let b = BatchSlot::new(0, n, vocab);
        let hb = &mut self.host_batch;
        let (x, rest) = hb[b.tokens.offset..].split_at_mut(aligned(n));
        let y = &mut rest[..n];
        sample_batch(rng.unwrap_or(&mut self.rng), data, self.plan.seq, &mut x[..n], y);
        let (head, starts) = hb.split_at_mut(b.starts.offset);
        let (tokens, order) = head.split_at_mut(b.order.offset);
        ops::group_rows_by_token(&tokens[b.tokens.range()], &mut order[..n], &mut starts[..vocab + 1]);
        let offset = (slot * BatchSlot::len(n, vocab) * 4) as u64;
        self.gpu.queue.write_buffer(&self.bufs.batch, offset, bytemuck::cast_slice(&self.host_batch));
    }

    /// One optimizer step on batches from `data`: `grad_accum` micro-batches, the gradient
    /// norm, clipping and AdamW, in one submission. Returns the learning rate used. A
    /// non-finite loss or norm skips the update on the device; [`GpuTrainer::stats`] reports it.
    pub fn step(&mut self, data: &[u32]) -> f64 {
        let lr = self.cfg.schedule.at(self.step);
        for slot in 0..self.cfg.grad_accum {
            self.write_batch(slot, data, None);
        }
        self.step += 1;
        let words = ops::adamw_words(self.layout.len(), self.layout.decay_end(), &self.cfg.adamw, lr, self.step, self.cfg.grad_clip, LOSS_SLOT, NORM_SLOT);
        self.update.set_words(&self.gpu.queue, self.adamw_index, &words);
        let mut enc = self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        enc.clear_buffer(&self.bufs.grads, 0, None);
        enc.clear_buffer(&self.bufs.stats, 0, None);
        for m in &self.micro {
            self.encode(&mut enc, &m.forward);
            enc.clear_buffer(&self.bufs.acts, (self.dres.offset * 4) as u64, Some((self.dres.len * 4) as u64));
            self.encode(&mut enc, &m.backward);
        }
        self.encode(&mut enc, &self.update);
        self.gpu.queue.submit([enc.finish()]);
        lr
    }

    fn encode(&self, enc: &mut wgpu::CommandEncoder, program: &Program) {
        program.encode(&self.kernels, &mut enc.begin_compute_pass(&Default::default()));
    }

    /// Loss and gradient norm of the last [`GpuTrainer::step`] (reads the statistics back:
    /// call it every log interval, not every step). An error if either is not finite (the
    /// update was skipped).
    pub async fn stats(&self, lr: f64) -> Result<Result<StepStats, NonFinite>, GpuError> {
        let s: Vec<f32> = read(&self.gpu, &self.bufs.stats, 0, 2).await?;
        let loss = s[LOSS_SLOT] as f64 / (self.plan.tokens() * self.cfg.grad_accum) as f64;
        let grad_norm = (s[NORM_SLOT] as f64).sqrt();
        if loss.is_finite() && grad_norm.is_finite() {
            Ok(Ok(StepStats { loss, grad_norm, lr }))
        } else {
            Ok(Err(NonFinite { step: self.step - 1, loss, grad_norm }))
        }
    }

    /// Mean loss over `iters` random batches of `data` drawn with `rng` (nanoGPT's
    /// `estimate_loss`); the training state is untouched. One submit per batch, one read.
    pub async fn evaluate(&mut self, data: &[u32], iters: usize, rng: &mut Rng) -> Result<f64, GpuError> {
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        enc.clear_buffer(&self.bufs.stats, (EVAL_SLOT * 4) as u64, Some(4));
        self.gpu.queue.submit([enc.finish()]);
        for _ in 0..iters {
            self.write_batch(self.cfg.grad_accum, data, Some(&mut *rng));
            self.eval.submit(&self.gpu, &self.kernels);
        }
        let s: Vec<f32> = read(&self.gpu, &self.bufs.stats, EVAL_SLOT, 1).await?;
        Ok(s[0] as f64 / (iters.max(1) * self.plan.tokens()) as f64)
    }

    /// Dispatches per optimizer step.
    pub fn kernels_per_step(&self) -> usize {
        self.micro.iter().map(|m| m.forward.len() + m.backward.len()).sum::<usize>() + self.update.len()
    }

    /// Bytes of device memory this trainer allocated.
    pub fn device_bytes(&self) -> u64 {
        let b = &self.bufs;
        [&b.params, &b.grads, &b.adam_m, &b.adam_v, &b.acts, &b.batch, &b.stats, &b.norm_partials].iter().map(|x| x.size()).sum()
    }

    /// The device this trainer runs on.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
}

/// The forward walk of the tape; with `grad_scale`, the loss gradient is left in the logits
/// and the loss sum added to the training slot, else to the evaluation slot.
#[allow(clippy::too_many_arguments)]
fn compile_forward(gpu: &Gpu, kernels: &Kernels, plan: &Plan, layout: &DeviceLayout, bufs: &Buffers, tape: &[Op], batch: BatchSlot, grad_scale: Option<f32>) -> Result<Program, GpuError> {
    let mut p = ProgramBuilder::default();
    let a = |s: Span| View::span(&bufs.acts, s);
    let w = |s: Span| View::span(&bufs.params, layout.device(s));
    let ids = |s: Span| View::span(&bufs.batch, s);
    let c = plan.config.n_embd;
    for op in tape {
        match *op {
            Op::Embedding { wte, wpe, out, .. } => ops::embedding_forward(&mut p, a(out), ids(batch.tokens), w(wte), w(wpe), plan.seq, c),
            Op::LayerNorm { x, out, mean, rstd, weight, bias, .. } => {
                ops::layernorm_forward(&mut p, a(out), a(mean), a(rstd), a(x), w(weight), w(bias), c)
            }
            Op::Matmul { x, weight, bias, out, epilogue, k, m, .. } => {
                let epi = match epilogue {
                    EpilogueSpan::None => Epilogue::None,
                    EpilogueSpan::Gelu { pre } => Epilogue::Gelu(a(pre)),
                    EpilogueSpan::Residual { input } => Epilogue::Residual(a(input)),
                };
                ops::matmul_forward(&mut p, a(out), a(x), w(weight), bias.map(w), epi, k, m)
            }
            Op::Attention { qkv, out, lse, shape, .. } => ops::attention_forward(&mut p, a(out), a(lse), a(qkv), shape),
            Op::CrossEntropy { logits, losses } => {
                ops::cross_entropy(&mut p, a(logits), a(losses), ids(batch.targets), plan.config.vocab_size, grad_scale);
                let slot = if grad_scale.is_some() { LOSS_SLOT } else { EVAL_SLOT };
                ops::sum_losses(&mut p, a(losses), View::first(&bufs.stats, ACT_ALIGN), slot);
            }
        }
    }
    p.build(gpu, kernels)
}

/// The backward walk of the tape (the residual gradient is zeroed before it runs).
fn compile_backward(gpu: &Gpu, kernels: &Kernels, plan: &Plan, layout: &DeviceLayout, bufs: &Buffers, tape: &[Op], batch: BatchSlot) -> Result<Program, GpuError> {
    let mut p = ProgramBuilder::default();
    let a = |s: Span| View::span(&bufs.acts, s);
    let w = |s: Span| View::span(&bufs.params, layout.device(s));
    let g = |s: Span| View::span(&bufs.grads, layout.device(s));
    let ids = |s: Span| View::span(&bufs.batch, s);
    let c = plan.config.n_embd;
    let partials = a(plan.scratch().partials);
    for op in tape.iter().rev() {
        match *op {
            Op::Embedding { wte, wpe, dout, .. } => {
                ops::embedding_backward(&mut p, g(wte), g(wpe), ids(batch.order), ids(batch.starts), a(dout), plan.seq, c)
            }
            Op::LayerNorm { x, dx, dout, mean, rstd, weight, bias, .. } => {
                ops::layernorm_backward(&mut p, a(dx), g(weight), g(bias), partials, a(dout), a(x), a(mean), a(rstd), w(weight), c)
            }
            Op::Matmul { x, dx, weight, bias, dout, epilogue, k, m, .. } => {
                let pre = match epilogue {
                    EpilogueSpan::Gelu { pre } => Some(a(pre)),
                    _ => None,
                };
                ops::matmul_backward(&mut p, dx.map(a), g(weight), bias.map(g), partials, a(dout), a(x), w(weight), pre, k, m)
            }
            Op::Attention { qkv, dqkv, out, dout, lse, scratch, shape } => {
                let delta = View { buffer: &bufs.acts, offset: scratch.offset, len: shape.batch * shape.heads * shape.seq };
                ops::attention_backward(&mut p, a(dqkv), delta, a(dout), a(qkv), a(out), a(lse), shape)
            }
            Op::CrossEntropy { .. } => {}
        }
    }
    p.build(gpu, kernels)
}
