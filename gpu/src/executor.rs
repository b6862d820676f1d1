//! The GPU executor of alpha-core's [walk](alpha_core::walk): each op's dispatches (from
//! [`crate::ops`]) are recorded into a program over device buffers as the walk reaches
//! them; the program is built once and submitted every step.

use crate::context::{Gpu, GpuError};
use crate::forward::storage;
use crate::kernels::{bytes, elements, Kernels, Program, ProgramBuilder, View};
use crate::layout::DeviceLayout;
use crate::ops;
use crate::readback::read;
use crate::trainer::LOSS_SCALE_SLOT;
use alpha_core::ops::{attention, cross_entropy, dropout, embedding, layernorm, matmul};
use alpha_core::plan::{Plan, Scratch, Span, ACT_ALIGN};
use alpha_core::tape::{Op, Pass};
use alpha_core::walk::{Arena, Executor};

/// `n` rounded up to a whole number of [`ACT_ALIGN`] elements.
pub(crate) fn aligned(n: usize) -> usize {
    n.div_ceil(ACT_ALIGN) * ACT_ALIGN
}

/// Where one micro-batch's data live in a batch buffer (u32 elements): input and target
/// token ids, for the embedding's backward the rows grouped by token, and its words: the
/// dropout key (0..4: see [`alpha_core::ops::dropout::DropoutKey::words`]) and, decoding, the
/// token's position (4).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchSlot {
    pub tokens: Span,
    pub targets: Span,
    pub order: Span,
    pub starts: Span,
    pub words: Span,
}

impl BatchSlot {
    /// Slot `index` for batches of `n` tokens over a vocabulary of `vocab`.
    pub fn new(index: usize, n: usize, vocab: usize) -> BatchSlot {
        let base = index * BatchSlot::len(n, vocab);
        let s = |i: usize, len| Span { offset: base + i * aligned(n), len };
        let words = Span { offset: base + 3 * aligned(n) + aligned(vocab + 1), len: 8 };
        BatchSlot { tokens: s(0, n), targets: s(1, n), order: s(2, n), starts: s(3, vocab + 1), words }
    }

    /// Elements of one slot.
    pub fn len(n: usize, vocab: usize) -> usize {
        3 * aligned(n) + aligned(vocab + 1) + ACT_ALIGN
    }
}

/// The activation arena on the device: one buffer, or where the arena is larger than the
/// device's buffers (its `max_buffer_size`), several, each holding whole parts of it
/// ([`Plan::arena_parts`]), so that every activation lies within one buffer.
pub(crate) struct Activations {
    /// Each buffer with the arena element it starts at, in order.
    buffers: Vec<(usize, wgpu::Buffer)>,
}

impl Activations {
    /// The arena elements at which `plan`'s buffers start on `gpu`: its parts in order, a new
    /// buffer wherever the next part would take the current one past the device's largest.
    /// An error names a part that no buffer can hold.
    pub fn starts(gpu: &Gpu, plan: &Plan) -> Result<Vec<usize>, GpuError> {
        let largest = elements(gpu.limits.max_buffer_size);
        let mut starts = vec![0];
        for (part, what) in plan.arena_parts() {
            gpu.check_size(what, bytes(part.len), false, "the batch, block or model")?;
            if starts.last().is_some_and(|&start| part.end() - start > largest) {
                starts.push(part.offset);
            }
        }
        Ok(starts)
    }

    /// The device buffers of `plan`'s activation arena (see [`Activations::starts`]).
    pub fn new(gpu: &Gpu, plan: &Plan) -> Result<Activations, GpuError> {
        let starts = Activations::starts(gpu, plan)?;
        let ends = starts[1..].iter().copied().chain([plan.acts_len()]);
        let buffers = starts.iter().zip(ends).map(|(&start, end)| Ok((start, storage(gpu, "activations", end - start)?))).collect::<Result<_, GpuError>>()?;
        Ok(Activations { buffers })
    }

    /// The buffer that holds arena element `offset`, and the element's offset in it.
    pub fn at(&self, offset: usize) -> (&wgpu::Buffer, usize) {
        let (start, buffer) = &self.buffers[self.buffers.partition_point(|(start, _)| *start <= offset) - 1];
        (buffer, offset - start)
    }

    /// Activation `span`, stored as f16 where `half` (see [`Plan::is_half`]).
    pub fn view(&self, span: Span, half: bool) -> View<'_> {
        let (buffer, offset) = self.at(span.offset);
        let local = Span { offset, len: span.len };
        if half {
            View::half_span(buffer, local)
        } else {
            View::span(buffer, local)
        }
    }

    /// Reads `len` elements from arena element `offset` (all in one part).
    pub async fn read(&self, gpu: &Gpu, offset: usize, len: usize) -> Result<Vec<f32>, GpuError> {
        let (buffer, at) = self.at(offset);
        read(gpu, buffer, at, len).await
    }

    /// Its buffers' bytes.
    pub fn device_bytes(&self) -> u64 {
        self.buffers.iter().map(|(_, b)| b.size()).sum()
    }

    /// How many buffers it takes.
    pub fn buffers(&self) -> usize {
        self.buffers.len()
    }
}

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
    /// Width `C`.
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
                ops::attention::decode(&mut self.program, a, keys, values, words)
            }
            None => ops::attention::forward(&mut self.program, a, words),
        }
    }

    fn attention_backward(&mut self, a: attention::Backward<View<'a>, View<'a>>) {
        let (delta, key) = (self.acts(self.scratch.attention), self.ids(self.slot.words));
        ops::attention::backward(&mut self.program, a, delta, key)
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
