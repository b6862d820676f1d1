//! The device memory every GPU model shares (the trainer's and the forward-only model's):
//! checked storage buffers and their allocation under an out-of-memory scope, the batch
//! slots, the activation arena's buffers, the weights' f16 copy, the plan as a device runs
//! it, and the statistics buffer's slots.

use crate::context::{Gpu, GpuError, Precision};
use crate::kernels::{bytes, elements, Kernels, Program, ProgramBuilder, View};
use crate::layout::PARAM_ALIGN;
use crate::ops;
use crate::readback::read;
use alpha_core::plan::{Plan, Span, ACT_ALIGN};
use std::ops::Range;

/// A storage buffer of `elements` 32-bit words (at least one aligned block, in whole 16-byte
/// vec4s: see `View::binding_len`), checked against the device's limits.
pub(crate) fn storage(gpu: &Gpu, label: &str, elements: usize) -> Result<wgpu::Buffer, GpuError> {
    let size = bytes(elements.max(ACT_ALIGN)).checked_next_multiple_of(16).unwrap_or(u64::MAX);
    gpu.check_size(label, size, false, "the batch, block or model")?;
    Ok(gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    }))
}

/// `plan` as `gpu` runs it: with the linear layers' inputs stored as f16 under f16 precision
/// (see [`Plan::with_half_activations`]).
pub(crate) fn device_plan(gpu: &Gpu, plan: Plan) -> Plan {
    plan.with_half_activations(gpu.precision == Precision::F16)
}

/// Under f16 precision, the f16 copy of a parameter arena (device layout) that the products
/// read, and the program that makes it from the arena: run after every change to the
/// parameters (an upload; a trainer's update ends with the same dispatches).
pub(crate) struct HalfWeights {
    pub buffer: wgpu::Buffer,
    refresh: Program,
}

impl HalfWeights {
    /// A copy of `params` (`len` elements) on a device with f16 precision, `None` on others;
    /// made by the first [`HalfWeights::refresh`], once the parameters are written.
    pub fn new(gpu: &Gpu, kernels: &Kernels, params: &wgpu::Buffer, len: usize) -> Result<Option<HalfWeights>, GpuError> {
        if gpu.precision != Precision::F16 {
            return Ok(None);
        }
        // f16: half as many arena elements (`len` is a multiple of PARAM_ALIGN).
        HalfWeights::over(gpu, kernels, params, storage(gpu, "parameters' f16 copy", len / 2)?, len).map(Some)
    }

    /// `buffer` as the copy of `params` (`len` elements), with the program that makes it (a
    /// model sharing a trainer's copy builds its own).
    pub fn over(gpu: &Gpu, kernels: &Kernels, params: &wgpu::Buffer, buffer: wgpu::Buffer, len: usize) -> Result<HalfWeights, GpuError> {
        let mut p = ProgramBuilder::for_gpu(gpu);
        p.label("f16 weights");
        HalfWeights::push(gpu, &mut p, params, &buffer, len);
        let refresh = p.build(gpu, kernels)?;
        Ok(HalfWeights { buffer, refresh })
    }

    /// Pushes the dispatches that make `copy` from `params` (`len` elements).
    pub fn push<'a>(gpu: &Gpu, p: &mut ProgramBuilder<'a>, params: &'a wgpu::Buffer, copy: &'a wgpu::Buffer, len: usize) {
        let whole = View::first(params, len);
        ops::adamw::half_weights(p, whole, whole.in_half_copy(copy), &HalfWeights::pieces(gpu, len));
    }

    /// Binding pieces of `len` elements, each a multiple of [`PARAM_ALIGN`] long (its f16
    /// part starts aligned).
    fn pieces(gpu: &Gpu, len: usize) -> Vec<Range<usize>> {
        let max = elements(gpu.limits.max_storage_buffer_binding_size) / PARAM_ALIGN * PARAM_ALIGN;
        ops::binding_pieces(len, max)
    }

    /// Makes the copy again from the parameters (after an upload).
    pub fn refresh(&self, gpu: &Gpu, kernels: &Kernels) {
        self.refresh.submit(gpu, kernels);
    }
}

/// Runs `make`, which creates device buffers, inside an out-of-memory error scope: a device
/// that cannot give the memory is an error, not wgpu's panic on an uncaptured error.
pub(crate) async fn allocating<T>(gpu: &Gpu, make: impl FnOnce() -> Result<T, GpuError>) -> Result<T, GpuError> {
    let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let made = make()?;
    match scope.pop().await {
        Some(e) => Err(GpuError(format!("{} is out of memory for this model ({e}): use a smaller batch, block or model", gpu.adapter.name))),
        None => Ok(made),
    }
}

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
/// ([`Plan::arena_parts`]), so that every activation lies within one buffer. Beside it, for
/// a model with RoPE, attention's rotary table.
pub(crate) struct Activations {
    /// Each buffer with the arena element it starts at, in order.
    buffers: Vec<(usize, wgpu::Buffer)>,
    /// The rotary table `[block_size, HS]` (see [`crate::ops::attention::rope_table`]).
    rope: Option<(wgpu::Buffer, usize)>,
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
        let rope = match crate::ops::attention::rope_table(plan.attention_shape(), plan.config.block_size) {
            Some(table) => {
                let buffer = storage(gpu, "rotary table", table.len())?;
                gpu.queue.write_buffer(&buffer, 0, bytemuck::cast_slice(&table));
                Some((buffer, table.len()))
            }
            None => None,
        };
        Ok(Activations { buffers, rope })
    }

    /// Attention's rotary table, for a model with RoPE.
    pub fn rope(&self) -> Option<View<'_>> {
        self.rope.as_ref().map(|(buffer, len)| View::first(buffer, *len))
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

/// Statistics buffer slots: the step's loss sum and squared gradient norm, the evaluation's
/// loss sum, the count of steps whose update was skipped (not reset by a step), and the
/// dynamic loss scaling's state (see [`LOSS_SCALE_SLOT`]).
pub(crate) const LOSS_SLOT: usize = 0;
pub(crate) const NORM_SLOT: usize = 1;
pub(crate) const EVAL_SLOT: usize = 2;
pub(crate) const SKIPPED_SLOT: usize = 3;
/// The loss scale S that the cross-entropy's gradient is multiplied by and the update divides
/// out: 1 with f32 products; with f16 products (`Precision::F16`) dynamic, as PyTorch's
/// GradScaler: from 2^16, halved on a step whose f16 operands overflowed (its update
/// skipped), doubled after [`GROWTH_INTERVAL`](crate::trainer::GROWTH_INTERVAL) good steps in a row.
pub(crate) const LOSS_SCALE_SLOT: usize = 4;
/// The scale the last step used (what its gradient norm is divided by).
pub(crate) const USED_SCALE_SLOT: usize = 5;
/// Good steps since the scale last changed.
pub(crate) const GOOD_STEPS_SLOT: usize = 6;
/// Steps with a non-finite loss since the last read (a divergence, not an overflow).
pub(crate) const BAD_LOSS_SLOT: usize = 7;
/// The loss scale update's slots (see `ops::adamw::loss_scale_words`).
pub(crate) const LOSS_SCALE_SLOTS: [usize; 6] = [LOSS_SCALE_SLOT, USED_SCALE_SLOT, NORM_SLOT, GOOD_STEPS_SLOT, LOSS_SLOT, BAD_LOSS_SLOT];
