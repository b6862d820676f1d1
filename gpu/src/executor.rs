//! The GPU executor of alpha-core's [walk](alpha_core::walk): each op's dispatches (from
//! [`crate::ops`]) are recorded into a program over device buffers as the walk reaches
//! them; the program is built once and submitted every step.

use crate::context::{Gpu, GpuError};
use crate::kernels::{Kernels, Program, ProgramBuilder, View};
use crate::layout::DeviceLayout;
use crate::memory::{aligned, Activations, BatchSlot, LOSS_SCALE_SLOT};
use crate::ops;
use alpha_core::ops::{attention, cross_entropy, dropout, embedding, layernorm, matmul, rmsnorm};
use alpha_core::plan::{Plan, Scratch, Span, ACT_ALIGN};
use alpha_core::tape::{Op, Pass};
use alpha_core::walk::{Arena, Executor};

/// The device buffers a walk reads and writes.
#[derive(Clone, Copy)]
pub(crate) struct DeviceArenas<'a> {
    /// Parameters, in the device layout.
    pub params: &'a wgpu::Buffer,
    /// Under f16 precision, their f16 copy (same layout), which the products read.
    pub half_weights: Option<&'a wgpu::Buffer>,
    /// Their gradients (backward walks only).
    pub grads: Option<&'a wgpu::Buffer>,
    /// Activations and backward scratch, in the plan's layout.
    pub acts: &'a Activations,
    /// Token ids, in [`BatchSlot`]s.
    pub batch: &'a wgpu::Buffer,
    /// The loss sums and other statistics (see the trainer's slots).
    pub stats: &'a wgpu::Buffer,
    /// The depth chunks of split weight gradients (backward walks only; see
    /// [`ops::matmul::weight_grad_scratch_len`]).
    pub split: Option<&'a wgpu::Buffer>,
}

/// A KV cache on the device: per layer, keys then values, `[T, C]` each, each half starting
/// aligned (see [`KvCache::half`]).
#[derive(Clone, Copy)]
pub(crate) struct KvCache<'a> {
    pub buffer: &'a wgpu::Buffer,
    /// Positions it holds (`T`).
    pub len: usize,
    /// Width of a row: the key/value heads', `KVH * HS`.
    pub width: usize,
}

impl<'a> KvCache<'a> {
    /// Elements from one half (a layer's keys or values) to the next.
    pub fn half(len: usize, width: usize) -> usize {
        aligned(len * width)
    }

    /// Layer `l`'s keys and values.
    fn layer(&self, l: usize) -> (View<'a>, View<'a>) {
        let half = KvCache::half(self.len, self.width);
        let at = |i: usize| View::first(self.buffer, 0).part((2 * l + i) * half, self.len * self.width);
        (at(0), at(1))
    }
}

/// Records a walk's dispatches over [`DeviceArenas`], reading the token ids of one batch
/// slot and summing the losses into one statistics slot.
pub(crate) struct Recorder<'a> {
    program: ProgramBuilder<'a>,
    bufs: DeviceArenas<'a>,
    layout: &'a DeviceLayout,
    /// Its blocks, and the activations it stores as f16.
    plan: Plan,
    scratch: Scratch,
    slot: BatchSlot,
    loss_slot: usize,
    /// Decoding one token against this cache (see [`Recorder::decoding`]).
    cache: Option<KvCache<'a>>,
    /// The block of the op being recorded.
    layer: usize,
}

impl<'a> Recorder<'a> {
    /// A recorder for `plan`'s tape over `bufs`, reading batch `slot` and summing losses into
    /// `stats[loss_slot]`.
    pub fn new(gpu: &Gpu, plan: &Plan, layout: &'a DeviceLayout, bufs: DeviceArenas<'a>, slot: BatchSlot, loss_slot: usize) -> Self {
        let program = ProgramBuilder::for_gpu(gpu);
        Recorder { program, bufs, layout, plan: *plan, scratch: plan.scratch(), slot, loss_slot, cache: None, layer: 0 }
    }

    /// Recording a one-token forward (a plan of batch 1 and sequence 1) at the position in
    /// the slot's `words[4]` against `cache`: the embedding takes that position's row, and
    /// attention writes the token's key and value into the cache and attends over it.
    pub fn decoding(mut self, cache: KvCache<'a>) -> Self {
        self.cache = Some(cache);
        self
    }

    /// The recorded dispatches as a program, pipelines bound.
    pub fn finish(self, gpu: &Gpu, kernels: &Kernels) -> Result<Program, GpuError> {
        self.program.build(gpu, kernels)
    }

    fn acts(&self, span: Span) -> View<'a> {
        self.bufs.acts.view(span, self.plan.is_half(span))
    }

    /// The products' view of weight `w`: its f16 copy under f16 precision.
    fn product_weight(&self, w: View<'a>) -> View<'a> {
        match self.bufs.half_weights {
            Some(copy) => w.in_half_copy(copy),
            None => w,
        }
    }

    fn ids(&self, span: Span) -> View<'a> {
        View::span(self.bufs.batch, span)
    }
}

impl<'a> Executor for Recorder<'a> {
    type Write = View<'a>;
    type Read = View<'a>;

    unsafe fn write(&self, arena: Arena, span: Span) -> View<'a> {
        match arena {
            Arena::Acts => self.acts(span),
            Arena::Params => View::span(self.bufs.params, self.layout.device(span)),
            Arena::Grads => View::span(self.bufs.grads.expect("a backward walk needs the gradients"), self.layout.device(span)),
        }
    }

    unsafe fn read(&self, arena: Arena, span: Span) -> View<'a> {
        // SAFETY: views are handles; the device orders the dispatches.
        unsafe { self.write(arena, span) }
    }

    fn begin(&mut self, _pass: Pass, index: usize, op: &Op) {
        self.layer = alpha_core::tape::block_of(index, self.plan.config.n_layer).unwrap_or(self.layer);
        self.program.label(op.name());
    }

    fn embedding_forward(&mut self, a: embedding::Forward<View<'a>, View<'a>>) {
        let tokens = self.ids(self.slot.tokens);
        let position = self.cache.map(|_| self.ids(self.slot.words));
        ops::embedding::forward(&mut self.program, a, tokens, position)
    }

    fn embedding_backward(&mut self, a: embedding::Backward<View<'a>, View<'a>>) {
        let (order, starts) = (self.ids(self.slot.order), self.ids(self.slot.starts));
        ops::embedding::backward(&mut self.program, a, order, starts)
    }

    fn layernorm_forward(&mut self, a: layernorm::Forward<View<'a>, View<'a>>) {
        ops::layernorm::forward(&mut self.program, a)
    }

    fn layernorm_backward(&mut self, a: layernorm::Backward<View<'a>, View<'a>>) {
        let partials = self.acts(self.scratch.partials);
        ops::layernorm::backward(&mut self.program, a, partials)
    }

    fn rmsnorm_forward(&mut self, a: rmsnorm::Forward<View<'a>, View<'a>>) {
        ops::rmsnorm::forward(&mut self.program, a)
    }

    fn rmsnorm_backward(&mut self, a: rmsnorm::Backward<View<'a>, View<'a>>) {
        let partials = self.acts(self.scratch.partials);
        ops::rmsnorm::backward(&mut self.program, a, partials)
    }

    fn matmul_forward(&mut self, a: matmul::Forward<View<'a>, View<'a>>) {
        let weight = self.product_weight(a.weight);
        ops::matmul::forward(&mut self.program, matmul::Forward { weight, ..a })
    }

    fn matmul_backward(&mut self, a: matmul::Backward<View<'a>, View<'a>>) {
        let split = self.bufs.split.expect("a backward walk needs the split-gradient scratch");
        let split = View::first(split, (split.size() / 4) as usize);
        let partials = self.acts(self.scratch.partials);
        let weight = self.product_weight(a.weight);
        ops::matmul::backward(&mut self.program, matmul::Backward { weight, ..a }, partials, split)
    }

    fn attention_forward(&mut self, a: attention::Forward<View<'a>, View<'a>>) {
        let words = self.ids(self.slot.words);
        match self.cache {
            Some(cache) => {
                let (keys, values) = cache.layer(self.layer);
                ops::attention::decode(&mut self.program, a, keys, values, words, self.bufs.acts.rope())
            }
            None => ops::attention::forward(&mut self.program, a, words, self.bufs.acts.rope()),
        }
    }

    fn attention_backward(&mut self, a: attention::Backward<View<'a>, View<'a>>) {
        let (delta, key) = (self.acts(self.scratch.attention), self.ids(self.slot.words));
        ops::attention::backward(&mut self.program, a, delta, key, self.bufs.acts.rope())
    }

    fn dropout_forward(&mut self, a: dropout::Forward<View<'a>, View<'a>>) {
        let key = self.ids(self.slot.words);
        ops::dropout::forward(&mut self.program, a, key)
    }

    fn dropout_backward(&mut self, a: dropout::Backward<View<'a>, View<'a>>) {
        let key = self.ids(self.slot.words);
        ops::dropout::backward(&mut self.program, a, key)
    }

    fn cross_entropy(&mut self, a: cross_entropy::Forward<View<'a>>) {
        let (losses, targets) = (a.losses, self.ids(self.slot.targets));
        let stats = View::first(self.bufs.stats, ACT_ALIGN);
        ops::cross_entropy::forward(&mut self.program, a, targets, stats, LOSS_SCALE_SLOT);
        ops::cross_entropy::sum_losses(&mut self.program, losses, stats, self.loss_slot);
    }
}
