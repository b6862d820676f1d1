//! [`GpuForward`], a model that only runs forward (evaluation over whole texts, sampling).

use crate::context::{Gpu, GpuError};
use crate::executor::{DeviceArenas, KvCache, Recorder};
use crate::kernels::{Kernels, Program};
use crate::layout::DeviceLayout;
use crate::memory::{allocating, device_plan, storage, Activations, BatchSlot, HalfWeights};
use alpha_core::model::{sample_token, ContextWindow, SamplingConfig};
use alpha_core::plan::{Plan, ACT_ALIGN};
use alpha_core::{tape, walk, Rng};

/// A model that only runs forward, batch by batch: the losses of given windows (`eval`) or
/// the logits at one position (`sample`). Its parameters are its own or a trainer's.
pub struct GpuForward {
    gpu: Gpu,
    kernels: Kernels,
    plan: Plan,
    layout: DeviceLayout,
    params: wgpu::Buffer,
    /// The parameters' f16 copy under f16 precision (a trainer's model shares the trainer's,
    /// which the trainer keeps current).
    half_weights: Option<HalfWeights>,
    acts: Activations,
    batch: wgpu::Buffer,
    program: Program,
    host_batch: Vec<u32>,
    /// With batch 1, one-token forwards against a KV cache for [`GpuForward::generate`].
    decoder: Option<Decoder>,
}

/// One-token forwards against a KV cache of the window's positions: the one-token plan's
/// activations and batch slot (the token, and its position in `words[4]`), the cache
/// (`[n_layer, 2, window, KVH * HS]`, see [`KvCache`]) and the recorded program.
struct Decoder {
    plan: Plan,
    acts: Activations,
    batch: wgpu::Buffer,
    program: Program,
    host_batch: Vec<u32>,
    /// Kept alive: the program's bind groups hold it.
    _cache: wgpu::Buffer,
}

impl Decoder {
    /// The decoder of a batch-1 `window` plan over the device `params` (and their f16 copy).
    fn new(
        gpu: &Gpu,
        kernels: &Kernels,
        window: &Plan,
        layout: &DeviceLayout,
        params: &wgpu::Buffer,
        half_weights: Option<&wgpu::Buffer>,
    ) -> Result<Decoder, GpuError> {
        let c = window.config;
        let plan = Plan::new(c, 1, 1).and_then(|p| p.with_classes(window.classes())).map_err(|e| GpuError(e.to_string()))?;
        let plan = device_plan(gpu, plan);
        let slot_len = BatchSlot::len(1, c.vocab_size);
        let acts = Activations::new(gpu, &plan)?;
        let batch = storage(gpu, "batch", slot_len)?;
        let stats = storage(gpu, "statistics", ACT_ALIGN)?;
        let kv_width = c.kv_heads() * c.head_size();
        let cache = storage(gpu, "KV cache", 2 * c.n_layer * KvCache::half(window.seq, kv_width))?;
        let bufs = DeviceArenas { params, half_weights, grads: None, acts: &acts, batch: &batch, stats: &stats, split: None };
        let kv = KvCache { buffer: &cache, len: window.seq, width: kv_width };
        let mut recorder = Recorder::new(gpu, &plan, layout, bufs, BatchSlot::new(0, 1, c.vocab_size), 0).decoding(kv);
        walk::forward(&mut recorder, &tape::record_to_vec(&plan), None);
        let program = recorder.finish(gpu, kernels)?;
        Ok(Decoder { plan, acts, batch, program, host_batch: vec![0; slot_len], _cache: cache })
    }

    /// Runs `token` at `position`, leaving its key and value in the cache and its logits in
    /// the activations.
    fn run(&mut self, gpu: &Gpu, kernels: &Kernels, token: u32, position: usize) {
        let slot = BatchSlot::new(0, 1, self.plan.config.vocab_size);
        self.host_batch[slot.tokens.offset] = token;
        self.host_batch[slot.words.offset + 4] = position as u32;
        gpu.queue.write_buffer(&self.batch, 0, bytemuck::cast_slice(&self.host_batch));
        self.program.submit(gpu, kernels);
    }

    /// The logits in use of the last token run.
    async fn logits(&self, gpu: &Gpu) -> Result<Vec<f32>, GpuError> {
        self.acts.read(gpu, self.plan.head_acts().logits.offset, self.plan.classes()).await
    }
}

impl GpuForward {
    /// A forward-only model for `plan` (any batch and sequence length) with `params` (host
    /// layout) uploaded.
    pub async fn new(gpu: Gpu, plan: Plan, params: &[f32]) -> Result<GpuForward, GpuError> {
        if params.len() != plan.params_len() {
            return Err(GpuError(format!("{} parameters given, the model has {}", params.len(), plan.params_len())));
        }
        let kernels = Kernels::new(&gpu, plan.config.head_size()).await?;
        let layout = DeviceLayout::new(&plan);
        let model = allocating(&gpu.clone(), || {
            let buffer = storage(&gpu, "parameters", layout.len())?;
            let copy = HalfWeights::new(&gpu, &kernels, &buffer, layout.len())?;
            GpuForward::sharing(gpu, kernels, plan, buffer, copy)
        })
        .await?;
        model.upload(params)?;
        Ok(model)
    }

    /// A forward-only model over an existing device parameter buffer and, under f16
    /// precision, its f16 copy (a trainer's: it sees each update as it happens). `kernels`
    /// must be compiled for `plan`'s head size.
    pub(crate) fn sharing(gpu: Gpu, kernels: Kernels, plan: Plan, params: wgpu::Buffer, half_weights: Option<HalfWeights>) -> Result<GpuForward, GpuError> {
        let plan = device_plan(&gpu, plan);
        let layout = DeviceLayout::new(&plan);
        let (n, vocab) = (plan.tokens(), plan.config.vocab_size);
        let slot_len = BatchSlot::len(n, vocab);
        let acts = Activations::new(&gpu, &plan)?;
        let batch = storage(&gpu, "batch", slot_len)?;
        let stats = storage(&gpu, "statistics", ACT_ALIGN)?;
        let half = half_weights.as_ref().map(|h| &h.buffer);
        let bufs = DeviceArenas { params: &params, half_weights: half, grads: None, acts: &acts, batch: &batch, stats: &stats, split: None };
        let mut recorder = Recorder::new(&gpu, &plan, &layout, bufs, BatchSlot::new(0, n, vocab), 0);
        walk::forward(&mut recorder, &tape::record_to_vec(&plan), None);
        let program = recorder.finish(&gpu, &kernels)?;
        let decoder = if plan.batch == 1 { Some(Decoder::new(&gpu, &kernels, &plan, &layout, &params, half)?) } else { None };
        Ok(GpuForward { gpu, kernels, plan, layout, params, half_weights, acts, batch, program, host_batch: vec![0; slot_len], decoder })
    }

    /// The plan (batch, sequence length, model).
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Replaces the parameters (host layout).
    pub fn upload(&self, params: &[f32]) -> Result<(), GpuError> {
        if params.len() != self.plan.params_len() {
            return Err(GpuError(format!("parameter arenas must have {} elements", self.plan.params_len())));
        }
        self.gpu.queue.write_buffer(&self.params, 0, bytemuck::cast_slice(&self.layout.to_device(params)));
        if let Some(copy) = &self.half_weights {
            copy.refresh(&self.gpu, &self.kernels);
        }
        Ok(())
    }

    /// Runs the model on `tokens` `[B, T]` (and `targets`, or none: zeros) in one submit.
    fn run(&mut self, tokens: &[u32], targets: Option<&[u32]>) -> Result<(), GpuError> {
        let n = self.plan.tokens();
        if tokens.len() != n || targets.is_some_and(|y| y.len() != n) {
            return Err(GpuError(format!("a batch of this model has {n} tokens, got {}", tokens.len())));
        }
        let slot = BatchSlot::new(0, n, self.plan.config.vocab_size);
        self.host_batch[slot.tokens.range()].copy_from_slice(tokens);
        match targets {
            Some(y) => self.host_batch[slot.targets.range()].copy_from_slice(y),
            None => self.host_batch[slot.targets.range()].fill(0),
        }
        let written = &self.host_batch[..slot.targets.offset + n];
        self.gpu.queue.write_buffer(&self.batch, 0, bytemuck::cast_slice(written));
        self.program.submit(&self.gpu, &self.kernels);
        Ok(())
    }

    /// The loss at every position `[B * T]` of `tokens` predicting `targets`.
    pub async fn losses(&mut self, tokens: &[u32], targets: &[u32]) -> Result<Vec<f32>, GpuError> {
        self.run(tokens, Some(targets))?;
        self.acts.read(&self.gpu, self.plan.head_acts().losses.offset, self.plan.tokens()).await
    }

    /// The logits in use (`[plan.classes()]`, no padding) at position `position` (of all
    /// `B * T`) after running `tokens`.
    pub async fn logits(&mut self, tokens: &[u32], position: usize) -> Result<Vec<f32>, GpuError> {
        self.run(tokens, None)?;
        let v = self.plan.config.vocab_size;
        self.acts.read(&self.gpu, self.plan.head_acts().logits.offset + position * v, self.plan.classes()).await
    }

    /// Generates `cfg.tokens` tokens after `context` (a batch-1 model; see
    /// [`alpha_core::model::generate`], whose draws this repeats), calling `emit` with each.
    /// Within the window every token is one token's forward against the KV cache (the
    /// prompt's tokens too, one by one); once the window slides, a whole window's forward.
    pub async fn generate(&mut self, context: &[u32], cfg: &SamplingConfig, rng: &mut Rng, mut emit: impl FnMut(u32)) -> Result<(), GpuError> {
        if self.plan.batch != 1 {
            return Err(GpuError("sampling needs a batch-1 model".into()));
        }
        let mut scratch = vec![0; self.plan.seq];
        let mut window = ContextWindow::new(&mut scratch, context);
        // The window positions in the cache; `None` once the window slid (positions moved).
        let mut cached = Some(0);
        for _ in 0..cfg.tokens {
            let last = window.last();
            let mut logits = match (self.decoder.as_mut(), cached) {
                (Some(d), Some(done)) => {
                    for position in done..=last {
                        d.run(&self.gpu, &self.kernels, window.tokens()[position], position);
                    }
                    cached = Some(last + 1);
                    d.logits(&self.gpu).await?
                }
                _ => self.logits(window.tokens(), last).await?,
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
}
