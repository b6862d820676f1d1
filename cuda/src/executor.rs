//! The CUDA executor of alpha-core's [walk](alpha_core::walk): each op's kernels and
//! cuBLASLt products are queued on the device as the walk reaches the op (nothing is recorded
//! for later, unlike wgpu's programs). An error is kept and returned after the walk
//! ([`CudaExecutor::finish`]), since the walk's calls return nothing.

use crate::blas::{Addends, Arithmetic, Product, Products};
use crate::device::{args, Device, DeviceInfo, MAX_BLOCK_THREADS};
use crate::error::CudaError;
use crate::memory::Tensor;
use crate::profile::Profiler;
use alpha_core::ops::dropout::Site;
use alpha_core::ops::{attention, cross_entropy, dropout, embedding, layernorm, matmul, rmsnorm, row_blocks};
use alpha_core::plan::{Plan, Span};
use alpha_core::tape::{FinishedGradients, Op, Pass, Work};
use alpha_core::walk::{Arena, Executor};

/// Threads per block of the element-wise, per-column and per-row kernels.
const BLOCK: u32 = 256;
/// Warps per block of the kernels that give each row a warp.
const WARPS: u32 = BLOCK / 32;

/// Blocks of [`BLOCK`] threads covering `n` threads.
fn blocks(n: usize) -> u32 {
    n.div_ceil(BLOCK as usize) as u32
}

/// Blocks of a pass with a thread per (item, column) of `width` columns: tiles of [`BLOCK`]
/// columns by `items` (common.cuh's `column_tile_cell`).
fn tile_grid(width: usize, items: usize) -> u32 {
    (blocks(width) as usize * items) as u32
}

/// Threads of one row in attention's tiled kernels: a power of two giving each thread up to
/// 32 of the head's dimensions (attention.cu's `row_parts`, `CHUNKS` 4-float chunks).
fn attention_row_parts(s: attention::AttentionShape) -> usize {
    s.head_size.div_ceil(32).next_power_of_two()
}

/// Rows of a block of attention's tiled kernels: 64 (attention.cu's `ROWS`), or fewer where
/// 64 rows would take more than [`MAX_BLOCK_THREADS`] (heads over 128 dimensions: the
/// backward's threads hold about 200 registers each).
fn attention_rows(s: attention::AttentionShape) -> usize {
    64.min(MAX_BLOCK_THREADS as usize / attention_row_parts(s))
}

/// Attention's kernels for a shape: their names, and whether they are the tensor cores' (blocks
/// of 64 rows in 4 warps, attention.cu's `TC_ROWS`) or the SIMT ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AttentionKernels {
    pub forward: &'static str,
    pub backward_query: &'static str,
    pub backward_key_value: &'static str,
    pub tensor: bool,
}

/// The kernels attention of shape `s` runs on `device` in `arithmetic`, over qkv and its output
/// stored as bf16 where `stored_bf16` (a bf16 run's activations), else as f32: the tensor
/// cores' from sm_80 for heads of 16 to 64 dimensions in steps of 16 (attention.cu's
/// `TC_STEPS`; wider heads would spill the backward's registers), with bf16 operands under bf16
/// products and f32 ones split in three TF32 products otherwise (PyTorch's fp32 attention on
/// these cards); the SIMT kernels for other heads and cards.
pub(crate) fn attention_kernels(device: &DeviceInfo, arithmetic: Arithmetic, s: attention::AttentionShape, stored_bf16: bool) -> AttentionKernels {
    let tensor = device.has_bf16() && s.head_size.is_multiple_of(16) && s.head_size <= 64;
    let ((forward, backward_query, backward_key_value), tensor) = match (tensor, arithmetic, stored_bf16) {
        (true, Arithmetic::Bf16, false) => (("attention_tensor_forward", "attention_tensor_backward_query", "attention_tensor_backward_key_value"), true),
        (true, Arithmetic::Bf16, true) => {
            (("attention_tensor_forward_bf16", "attention_tensor_backward_query_bf16", "attention_tensor_backward_key_value_bf16"), true)
        }
        (true, Arithmetic::F32 | Arithmetic::Tf32, false) => {
            (("attention_tf32x3_forward", "attention_tf32x3_backward_query", "attention_tf32x3_backward_key_value"), true)
        }
        (_, _, false) => (("attention_forward", "attention_backward_query", "attention_backward_key_value"), false),
        // f32 products never meet bf16 activations (the engine stores them so only under bf16
        // ones); were they to, the SIMT kernels take them.
        (_, _, true) => (("attention_forward_bf16", "attention_backward_query_bf16", "attention_backward_key_value_bf16"), false),
    };
    AttentionKernels { forward, backward_query, backward_key_value, tensor }
}

/// The grid and block of attention's kernels over `heads` heads of `s` (one block per rows of
/// each (batch row, head)): on the tensor cores (`tensor`) 64 rows of 4 warps (attention.cu's
/// `TC_ROWS`), else [`attention_rows`] rows of [`attention_row_parts`] threads.
fn attention_launch(tensor: bool, s: attention::AttentionShape, heads: usize) -> (u32, u32) {
    let (rows, threads) = if tensor { (64, 128) } else { (attention_rows(s), attention_rows(s) * attention_row_parts(s)) };
    ((s.batch * heads * s.seq.div_ceil(rows)) as u32, threads as u32)
}

/// Blocks of [`WARPS`] warps covering `rows` warps.
fn warp_blocks(rows: usize) -> u32 {
    rows.div_ceil(WARPS as usize) as u32
}

/// Device memory a walk reads and writes.
#[derive(Clone, Copy)]
pub(crate) struct Arenas {
    /// Parameters, in plan order.
    pub params: Tensor,
    /// Under bf16 products, their bf16 copy (same offsets, 2 bytes each).
    pub params_bf16: Option<Tensor>,
    /// Their gradients (backward walks).
    pub grads: Option<Tensor>,
    /// Activations and backward scratch, in the plan's layout.
    pub acts: Tensor,
    /// Token ids `[N]`, u32.
    pub tokens: Tensor,
    /// Targets `[N]`, u32 (walks with a loss).
    pub targets: Option<Tensor>,
    /// Under bf16 products, two bf16 scratch tensors for the operands the walk rounds (an
    /// input, a gradient), each at least [`bf16_operand_len`] long.
    pub operands_bf16: Option<(Tensor, Tensor)>,
    /// With RoPE, attention's rotary table `[block_size, HS]` (see [`rope_table`]).
    pub rope: Option<Tensor>,
    /// The batch's rows grouped by token (backward walks with a token embedding).
    pub token_groups: Option<TokenGroups>,
    /// With grouped heads (fewer key/value heads than query heads), each query head's share of
    /// dK and dV, `[N, NH, 2, HS]` (backward walks; see [`attention_partials_len`]).
    pub attention_partials: Option<Tensor>,
    /// Where the token slices of the weight gradients' products are written (backward walks
    /// whose batch is cut: see [`weight_grad_slices`]).
    pub weight_grad_slices: Option<Tensor>,
}

/// Elements of each bf16 operand scratch of [`Arenas`]: the batch's tokens by the widest product
/// input or output gradient (the vocabulary, the MLP's widths), or by twice qkv's width: a bf16
/// run stores qkv as bf16, its product's f32 sums landing first in the second scratch (whose
/// gradients the forward does not round), two bf16 elements to each.
pub(crate) fn bf16_operand_len(plan: &Plan) -> usize {
    let c = &plan.config;
    plan.tokens() * c.vocab_size.max(c.fc_width()).max(c.hidden()).max(c.n_embd).max(2 * c.qkv_width())
}

/// Outputs the token slices of a weight gradient's product are meant to fill: about 256 tiles
/// of 128 x 128, two waves of a 132-multiprocessor card.
const SLICED_OUTPUTS: usize = 1 << 22;
/// The fewest tokens a slice takes.
const MIN_SLICE: usize = 512;

/// How a weight gradient's product of `outputs` elements over `tokens` tokens is cut: `(slices,
/// tokens a slice)`, the slices (but the last) of equal length, a multiple of 64 (their
/// operands stay aligned). A weight gradient has few outputs and many tokens: in one product
/// it would run on a few of a card's multiprocessors; its slices' products, added in order
/// after (`add_weight_grad_slices`), fill about [`SLICED_OUTPUTS`], each over at least
/// [`MIN_SLICE`] tokens. By the shape alone, so that every card sums in the same order.
pub(crate) fn weight_grad_slices(outputs: usize, tokens: usize) -> (usize, usize) {
    let wanted = SLICED_OUTPUTS.div_ceil(outputs.max(1)).min(tokens / MIN_SLICE).max(1);
    if wanted == 1 {
        return (1, tokens);
    }
    let len = tokens.div_ceil(wanted).next_multiple_of(64);
    (tokens.div_ceil(len), len)
}

/// Elements of the scratch the weight gradients' slices are written to (0 where `plan`'s batch
/// is too small to cut): `slices x outputs` stays under twice [`SLICED_OUTPUTS`].
pub(crate) fn weight_grad_slices_len(plan: &Plan) -> usize {
    if plan.tokens() >= 2 * MIN_SLICE {
        2 * SLICED_OUTPUTS
    } else {
        0
    }
}

/// Elements of the scratch where attention's backward leaves each query head's share of dK
/// and dV when `plan`'s heads are grouped (0 where they are not): the shares spread a key/value
/// head's work over its query heads' blocks, then are added in order (attention.cu).
pub(crate) fn attention_partials_len(plan: &Plan) -> usize {
    let s = plan.attention_shape();
    if s.kv_heads < s.heads {
        plan.tokens() * s.heads * 2 * s.head_size
    } else {
        0
    }
}

/// The batch's rows grouped by token, for the token embedding's gradient (embedding.cu):
/// `rows` `[N]` u32 ordered by token, then row; `starts` `[count + 1]` u32, where each of the
/// distinct tokens' runs begins, then N, repeated where the batch has fewer than `count`
/// distinct tokens (empty groups, which the kernel skips: the same grid every step).
#[derive(Clone, Copy)]
pub(crate) struct TokenGroups {
    pub rows: Tensor,
    pub starts: Tensor,
    pub count: usize,
}

/// `tokens`' rows grouped by token into `rows` (as long as `tokens`) and `starts` (cleared
/// first): see [`TokenGroups`]. The count of groups is `starts.len() - 1`.
pub(crate) fn group_rows_by_token(tokens: &[u32], rows: &mut [u32], starts: &mut Vec<u32>) {
    for (i, r) in rows.iter_mut().enumerate() {
        *r = i as u32;
    }
    rows.sort_unstable_by_key(|&r| (tokens[r as usize], r));
    starts.clear();
    for (j, &r) in rows.iter().enumerate() {
        if j == 0 || tokens[r as usize] != tokens[rows[j - 1] as usize] {
            starts.push(j as u32);
        }
    }
    starts.push(rows.len() as u32);
}

/// The rotary table of a model with RoPE (`[block_size, HS]`, row `p` the cosines of
/// position `p`'s angles then their sines, as the CPU's attention computes them), to upload.
pub(crate) fn rope_table(plan: &Plan) -> Option<Vec<f32>> {
    let shape = plan.attention_shape();
    let rope = shape.rope?;
    let mut table = vec![0f32; plan.config.block_size * shape.head_size];
    rope.fill_table(&alpha_core::Serial, &mut table, shape.head_size);
    Some(table)
}

/// Decoding one token against a KV cache: per layer keys then values, `[len, KVH * HS]` each.
#[derive(Clone, Copy)]
pub(crate) struct Decoding {
    pub cache: Tensor,
    /// Positions the cache holds.
    pub len: usize,
    /// The token's position.
    pub position: usize,
}

/// The kernels' view of a dropout site (common.cuh's `DropoutSite`): the micro-batch's key
/// by its address, so that a step's launches are the same every step.
#[repr(C)]
#[derive(Clone, Copy)]
struct DropoutArgs {
    on: i32,
    site: u32,
    threshold: u32,
    scale: f32,
    key: u64,
}

impl DropoutArgs {
    fn new(site: Option<Site>, key: Option<Tensor>) -> DropoutArgs {
        match (site, key) {
            (Some(s), Some(k)) => DropoutArgs { on: 1, site: s.id, threshold: s.threshold, scale: s.scale() as f32, key: k.ptr },
            (Some(_), None) => panic!("dropout needs the micro-batch's key"),
            (None, _) => DropoutArgs { on: 0, site: 0, threshold: 0, scale: 1.0, key: 0 },
        }
    }
}

/// Queues a walk's ops on a [`Device`].
pub(crate) struct CudaExecutor<'a> {
    device: &'a Device,
    products: &'a Products,
    arenas: Arenas,
    plan: Plan,
    /// The micro-batch's dropout key in device memory (`DropoutKey::words`, 4 u32s).
    key: Option<Tensor>,
    decoding: Option<Decoding>,
    /// The block of the op being queued.
    layer: usize,
    /// Kernels and products queued.
    launches: usize,
    error: Option<CudaError>,
    /// While profiling (`--trace`), what stamps each kernel, and the pass and op being queued.
    profiler: Option<&'a mut Profiler>,
    /// Where a backward walk hands out the gradients it has finished (see
    /// [`CudaExecutor::handing_out_finished`]).
    finished: Option<(FinishedGradients, &'a mut dyn FnMut(Span))>,
    pass: &'static str,
    op: &'static str,
}

impl<'a> CudaExecutor<'a> {
    /// An executor of `plan`'s tape over `arenas`.
    pub fn new(device: &'a Device, products: &'a Products, plan: &Plan, arenas: Arenas) -> Self {
        CudaExecutor {
            device,
            products,
            arenas,
            plan: *plan,
            key: None,
            decoding: None,
            layer: 0,
            launches: 0,
            error: None,
            profiler: None,
            finished: None,
            pass: "",
            op: "",
        }
    }

    /// Handing `take`, after each op of a backward walk is queued, the span of the gradients
    /// it finished (when it finished any; see [`FinishedGradients`]): final once the work
    /// queued so far has run. The spans come in descending order; what is left when the walk
    /// ends (the tables) lies below the last one.
    pub fn handing_out_finished(self, plan: &Plan, take: &'a mut dyn FnMut(Span)) -> Self {
        CudaExecutor { finished: Some((FinishedGradients::new(plan), take)), ..self }
    }

    /// Every kernel and product stamped by `profiler` (see [`Profiler`]), where there is one.
    pub fn profiled(self, profiler: Option<&'a mut Profiler>) -> Self {
        CudaExecutor { profiler, ..self }
    }

    /// Dropout masks of the micro-batch whose key (`DropoutKey::words`, 4 u32s) lies at `key`.
    pub fn with_dropout_key(self, key: Tensor) -> Self {
        assert_eq!(key.len, 4, "a dropout key is 4 words");
        CudaExecutor { key: Some(key), ..self }
    }

    /// The rotary table's device address where attention of `shape` has RoPE, else 0 (the
    /// kernels' null).
    fn rope(&self, shape: attention::AttentionShape) -> u64 {
        match (shape.rope, self.arenas.rope) {
            (Some(_), Some(table)) => table.ptr,
            (Some(_), None) => panic!("a model with RoPE needs its rotary table in the arenas"),
            (None, _) => 0,
        }
    }

    /// One token's forward (a batch-1, sequence-1 plan) against `decoding`'s cache.
    pub fn decoding(self, decoding: Decoding) -> Self {
        CudaExecutor { decoding: Some(decoding), ..self }
    }

    /// The kernels and products the walk queued, or the first error any op met.
    pub fn finish(self) -> Result<usize, CudaError> {
        self.error.map_or(Ok(self.launches), Err)
    }

    /// Queues one kernel or product, `kernel` doing `work`, by `queue` (stamped before and
    /// after while profiling); keeps the first error.
    fn queue(&mut self, kernel: &'static str, work: Work, queue: impl FnOnce(&Self) -> Result<(), CudaError>) {
        self.launches += 1;
        let device = self.device;
        let (pass, op) = (self.pass, self.op);
        let mut r = self.profiler.as_deref_mut().map_or(Ok(()), |p| p.start(device, pass, op, kernel, work));
        r = r.and_then(|()| queue(self));
        r = r.and_then(|()| self.profiler.as_deref_mut().map_or(Ok(()), |p| p.end(device)));
        self.keep(r);
    }

    /// Keeps `r`'s error where it is the walk's first.
    fn keep(&mut self, r: Result<(), CudaError>) {
        if let (Err(e), None) = (r, &self.error) {
            self.error = Some(e);
        }
    }

    /// Queues kernel `name` doing `work`.
    ///
    /// # Safety
    /// As [`Device::launch`].
    unsafe fn launch(&mut self, name: &'static str, grid: u32, block: u32, work: Work, args: &mut [*mut std::ffi::c_void]) {
        // SAFETY: forwarded to the caller.
        self.queue(name, work, |e| unsafe { e.device.launch(name, grid, block, args) });
    }

    /// `x` rounded to bf16 into scratch operand `which` (0 or 1).
    fn rounded(&mut self, x: Tensor, which: usize) -> u64 {
        let (a, b) = self.arenas.operands_bf16.expect("bf16 products need the operands' scratch");
        let out = if which == 0 { a } else { b };
        assert!(x.len <= out.len, "an operand larger than the bf16 scratch");
        // SAFETY: both hold x.len elements.
        unsafe { self.round_to_bf16(out.ptr, x.ptr, None, x.len) };
        out.ptr
    }

    /// Queues `x` [len / M, M] (+ `bias` [M]) rounded to bf16 into `out`.
    ///
    /// # Safety
    /// `x` holds `len` f32s, `out` room for `len` bf16s, `bias` its M f32s.
    unsafe fn round_to_bf16(&mut self, out: u64, x: u64, bias: Option<Tensor>, len: usize) {
        let (bias, m) = bias.map_or((0, 1), |b| (b.ptr, b.len));
        let work = Work { flops: 0.0, bytes: (6 * len + 4 * m * (bias != 0) as usize) as f64 };
        // SAFETY: forwarded to the caller.
        unsafe { self.launch("round_to_bf16", blocks(len), BLOCK, work, &mut args![out, x, bias, len as i64, m as i32]) }
    }

    /// The products' operand for weight `w`: its bf16 copy under bf16 products.
    fn weight(&self, w: Tensor) -> u64 {
        match self.arenas.params_bf16 {
            Some(copy) => copy.ptr + (w.ptr - self.arenas.params.ptr) / 2,
            None => w.ptr,
        }
    }

    /// The products' operand for activation `x`: under bf16 products, itself where it is stored
    /// as bf16, else rounded to bf16.
    fn operand(&mut self, x: Tensor, which: usize) -> u64 {
        match (self.products.arithmetic(), x.bf16) {
            (Arithmetic::Bf16, false) => self.rounded(x, which),
            (Arithmetic::Bf16, true) | (_, false) => x.ptr,
            (_, true) => panic!("a bf16 activation as an f32 product's operand"),
        }
    }

    /// The column sums' second pass (row_blocks.cu) after a first pass left `blocks(n)` rows of
    /// `width` partials in the plan's scratch: columns below `split` added to `out`, the rest
    /// to `second` (0: none).
    fn add_partials(&mut self, n: usize, width: usize, split: usize, out: u64, second: u64) {
        let partials = self.partials().ptr;
        // SAFETY: `out` holds `split` floats, `second` `width - split`; the partials
        // `blocks(n) * width`.
        unsafe {
            self.launch(
                "add_partials",
                blocks(width),
                BLOCK,
                Work::moving(row_blocks::blocks(n) * width + 2 * width),
                &mut args![out, second, partials, row_blocks::blocks(n) as i32, width as i32, width as i32, split as i32],
            )
        }
    }

    /// The plan's scratch for the row blocks' partial column sums.
    fn partials(&self) -> Tensor {
        let span = self.plan.scratch().partials;
        self.arenas.acts.part(span.offset, span.len)
    }

    /// Blocks of a row-block pass over `n` rows of `width` columns: a tile of [`BLOCK`]
    /// columns by a row block each.
    fn row_block_grid(&self, n: usize, width: usize) -> u32 {
        assert!(row_blocks::blocks(n) * width <= self.partials().len, "the row blocks' partials past their scratch");
        tile_grid(width, row_blocks::blocks(n))
    }

    /// Where the cross-entropy writes the gradient of `logits` (the plan's) under bf16 products:
    /// rounded to bf16 into the second operand scratch, the LM head's backward operand as it
    /// would round it, in place of the f32 gradient (which nothing else reads). The scratch is
    /// free from the forward's end (the cross-entropy is its last op) to the LM head's backward
    /// (the backward's first product).
    fn dlogits_bf16(&self, logits: Tensor) -> Option<u64> {
        let span = self.plan.head_acts().logits;
        match (self.products.arithmetic(), self.arenas.operands_bf16) {
            (Arithmetic::Bf16, Some((_, scratch))) if logits == self.arenas.acts.part(span.offset, span.len) => {
                assert!(logits.len <= scratch.len, "the logits past the bf16 operands' scratch");
                Some(scratch.ptr)
            }
            _ => None,
        }
    }

    /// Bytes of an element of the products' operands: 2 under bf16 products, else 4.
    fn operand_bytes(&self) -> usize {
        if self.products.arithmetic() == Arithmetic::Bf16 {
            2
        } else {
            4
        }
    }

    /// Queues product `p` into `d`, `add` summed in by cuBLASLt's epilogue.
    fn product(&mut self, p: Product, a: u64, b: u64, d: u64, add: Addends) {
        let operand = self.operand_bytes() as f64;
        let (m, n, k) = (p.m as f64, p.n as f64, p.k as f64);
        let outputs = 1.0 + (p.accumulate || add.c != 0) as u8 as f64;
        let work = Work { flops: 2.0 * m * n * k, bytes: operand * (m * k + k * n) + 4.0 * m * n * outputs + 4.0 * m * (add.bias != 0) as u8 as f64 };
        // SAFETY: the walk's tensors of this op, of the shapes `p` names.
        self.queue("product", work, |e| unsafe { e.products.run(e.device, p, a, b, d, add) });
    }

    /// A linear layer whose output a bf16 run stores as bf16 (qkv): the product's f32 sums
    /// (with the bias, by cuBLASLt's epilogue where it takes it) into the second bf16 operand
    /// scratch (free in a forward; see [`bf16_operand_len`]), then rounded into the output,
    /// once (with the bias where cuBLASLt left it), as the f32 output would hold it.
    fn matmul_forward_to_bf16(&mut self, a: matmul::Forward<Tensor, Tensor>) {
        let (_, scratch) = self.arenas.operands_bf16.expect("bf16 activations need the bf16 operands' scratch");
        assert!(2 * a.out.len <= scratch.len, "a product's sums past the bf16 operands' scratch");
        let bias_added = self.linear_product(&a, scratch.ptr, Addends { bias: a.bias.map_or(0, |b| b.ptr), c: 0 });
        let bias = if bias_added { None } else { a.bias };
        // SAFETY: the sums [N, M] in the scratch (checked above), out [N, M] bf16, bias [M].
        unsafe { self.round_to_bf16(a.out.ptr, scratch.ptr, bias, a.out.len) }
    }

    /// A linear layer's product into `d`: out [N, M] = x [N, K] · w [M, K]ᵀ, column-major:
    /// outᵀ [M, N] = (wᵀ stored [K, M])ᵀ · xᵀ [K, N]; `add` summed in by cuBLASLt's epilogue
    /// where it takes it (the answer: the caller adds them where not).
    fn linear_product(&mut self, a: &matmul::Forward<Tensor, Tensor>, d: u64, add: Addends) -> bool {
        let (k, m) = (a.k, a.m);
        let (w, x) = (self.weight(a.weight), self.operand(a.x, 0));
        let p = Product { transpose_a: true, transpose_b: false, m, n: a.x.len / k, k, accumulate: false };
        let fused = add.any()
            && self.products.fuses(self.device, p, w, x, d, add).unwrap_or_else(|e| {
                self.keep(Err(e));
                false
            });
        self.product(p, w, x, d, if fused { add } else { Addends::default() });
        fused
    }
}

impl Executor for CudaExecutor<'_> {
    type Write = Tensor;
    type Read = Tensor;

    unsafe fn write(&self, arena: Arena, span: Span) -> Tensor {
        let base = match arena {
            Arena::Acts if self.plan.is_half(span) => {
                // Half the room, in bf16 (see `Plan::with_half_activations`).
                let room = self.arenas.acts.part(span.offset, self.plan.stored_len(span));
                return Tensor { len: span.len, bf16: true, ..room };
            }
            Arena::Acts => self.arenas.acts,
            Arena::Params => self.arenas.params,
            Arena::Grads => self.arenas.grads.expect("a backward walk needs the gradients"),
        };
        base.part(span.offset, span.len)
    }

    unsafe fn read(&self, arena: Arena, span: Span) -> Tensor {
        // SAFETY: views are handles; the device runs the queued work in order.
        unsafe { self.write(arena, span) }
    }

    fn begin(&mut self, pass: Pass, index: usize, op: &Op) {
        (self.pass, self.op) = (pass.name(), op.name());
        self.layer = alpha_core::tape::block_of(index, self.plan.config.n_layer).unwrap_or(self.layer);
    }

    fn end(&mut self, pass: Pass, _index: usize, op: &Op) {
        if let (Pass::Backward, Some((gradients, take))) = (pass, self.finished.as_mut()) {
            let done = gradients.after(op);
            if done.len > 0 {
                take(done);
            }
        }
    }

    fn embedding_forward(&mut self, a: embedding::Forward<Tensor, Tensor>) {
        let c = self.plan.config.n_embd;
        let n = a.out.len / c;
        let first = self.decoding.map_or(0, |d| d.position) as i32;
        let tokens = self.arenas.tokens.ptr;
        let wpe = a.wpe.map_or(0, |w| w.ptr);
        // SAFETY: out [n, C], the tables, n token ids.
        unsafe {
            self.launch(
                "embedding_forward",
                blocks(n * c),
                BLOCK,
                Work::moving(n * c * (2 + a.wpe.is_some() as usize) + n),
                &mut args![a.out.ptr, a.wte.ptr, wpe, tokens, n as i32, c as i32, a.seq as i32, first],
            )
        }
    }

    fn embedding_backward(&mut self, a: embedding::Backward<Tensor, Tensor>) {
        let c = self.plan.config.n_embd;
        let n = a.dout.len / c;
        let tokens = self.arenas.tokens.ptr;
        let groups = self.arenas.token_groups.expect("the token embedding's backward needs the batch's rows grouped by token");
        assert_eq!(groups.rows.len, n, "token groups of another batch");
        // SAFETY: dwte [V, C], dout [n, C], n token ids, the groups of those ids.
        unsafe {
            self.launch(
                "embedding_backward_tokens",
                tile_grid(c, groups.count),
                BLOCK,
                Work::moving(n * c + 2 * groups.count * c + 2 * n + groups.count),
                &mut args![a.dwte.ptr, a.dout.ptr, tokens, groups.rows.ptr, groups.starts.ptr, c as i32],
            )
        }
        if let Some(dwpe) = a.dwpe {
            // SAFETY: dwpe [seq, C], dout [n, C].
            unsafe {
                self.launch(
                    "embedding_backward_positions",
                    tile_grid(c, a.seq),
                    BLOCK,
                    Work::moving(n * c + 2 * a.seq * c),
                    &mut args![dwpe.ptr, a.dout.ptr, n as i32, c as i32, a.seq as i32],
                )
            }
        }
    }

    fn layernorm_forward(&mut self, a: layernorm::Forward<Tensor, Tensor>) {
        let (n, c) = (a.mean.len, a.weight.len);
        let (kernel, out_bytes) = if a.out.bf16 { ("layernorm_forward_bf16", 2.0) } else { ("layernorm_forward", 4.0) };
        // SAFETY: rows of C, n of them.
        unsafe {
            self.launch(
                kernel,
                warp_blocks(n),
                BLOCK,
                Work { bytes: Work::moving(n * c + 2 * c + 2 * n).bytes + out_bytes * (n * c) as f64, flops: 0.0 },
                &mut args![a.out.ptr, a.mean.ptr, a.rstd.ptr, a.x.ptr, a.weight.ptr, a.bias.ptr, n as i32, c as i32],
            )
        }
    }

    fn layernorm_backward(&mut self, a: layernorm::Backward<Tensor, Tensor>) {
        let (n, c) = (a.mean.len, a.weight.len);
        let (dout, x, mean, rstd) = (a.dout.ptr, a.x.ptr, a.mean.ptr, a.rstd.ptr);
        // SAFETY: rows of C, n of them.
        unsafe {
            self.launch(
                "layernorm_backward_input",
                warp_blocks(n),
                BLOCK,
                Work::moving(4 * n * c + c + 2 * n),
                &mut args![a.dx.ptr, dout, x, mean, rstd, a.weight.ptr, n as i32, c as i32],
            );
            let grid = self.row_block_grid(n, 2 * c);
            let partials = self.partials().ptr;
            self.launch(
                "layernorm_params_partials",
                grid,
                BLOCK,
                Work::moving(2 * n * c + 2 * n + row_blocks::blocks(n) * 2 * c),
                &mut args![partials, dout, x, mean, rstd, n as i32, c as i32],
            );
        }
        self.add_partials(n, 2 * c, c, a.dweight.ptr, a.dbias.ptr);
    }

    fn rmsnorm_forward(&mut self, a: rmsnorm::Forward<Tensor, Tensor>) {
        let (n, c) = (a.rstd.len, a.weight.len);
        let eps = a.eps as f32;
        let (kernel, out_bytes) = if a.out.bf16 { ("rmsnorm_forward_bf16", 2.0) } else { ("rmsnorm_forward", 4.0) };
        // SAFETY: rows of C, n of them.
        unsafe {
            self.launch(
                kernel,
                warp_blocks(n),
                BLOCK,
                Work { bytes: Work::moving(n * c + c + n).bytes + out_bytes * (n * c) as f64, flops: 0.0 },
                &mut args![a.out.ptr, a.rstd.ptr, a.x.ptr, a.weight.ptr, n as i32, c as i32, eps],
            )
        }
    }

    fn rmsnorm_backward(&mut self, a: rmsnorm::Backward<Tensor, Tensor>) {
        let (n, c) = (a.rstd.len, a.weight.len);
        let (dout, x, rstd) = (a.dout.ptr, a.x.ptr, a.rstd.ptr);
        // SAFETY: rows of C, n of them.
        unsafe {
            self.launch(
                "rmsnorm_backward_input",
                warp_blocks(n),
                BLOCK,
                Work::moving(4 * n * c + c + n),
                &mut args![a.dx.ptr, dout, x, rstd, a.weight.ptr, n as i32, c as i32],
            );
            let grid = self.row_block_grid(n, c);
            let partials = self.partials().ptr;
            self.launch(
                "rmsnorm_weight_partials",
                grid,
                BLOCK,
                Work::moving(2 * n * c + n + row_blocks::blocks(n) * c),
                &mut args![partials, dout, x, rstd, n as i32, c as i32],
            );
        }
        self.add_partials(n, c, c, a.dweight.ptr, 0);
    }

    fn matmul_forward(&mut self, a: matmul::Forward<Tensor, Tensor>) {
        let (k, m) = (a.k, a.m);
        let n = a.x.len / k;
        if a.out.bf16 && matches!(a.epilogue, matmul::Epilogue::None) {
            return self.matmul_forward_to_bf16(a);
        }
        assert!(!a.out.bf16 || matches!(a.epilogue, matmul::Epilogue::Gelu { .. } | matmul::Epilogue::SwiGlu { .. }), "the residual stream is stored as f32");
        let (target, gelu_out, residual) = match a.epilogue {
            matmul::Epilogue::None => (a.out, 0, 0),
            matmul::Epilogue::Gelu { pre } => (pre, a.out.ptr, 0),
            matmul::Epilogue::Residual { input } => (a.out, 0, input.ptr),
            // The product into `pre`, SwiGLU over its halves after it (below).
            matmul::Epilogue::SwiGlu { pre } => (pre, 0, 0),
        };
        let bias = a.bias.map_or(0, |b| b.ptr);
        // The bias and the residual ride on cuBLASLt's epilogue where it takes them and no
        // activation follows; else `matmul_epilogue` adds them in a pass of its own.
        let fusable = matches!(a.epilogue, matmul::Epilogue::None | matmul::Epilogue::Residual { .. });
        let fused = self.linear_product(&a, target.ptr, if fusable { Addends { bias, c: residual } } else { Addends::default() });
        if !fused && (bias != 0 || gelu_out != 0 || residual != 0) {
            let slope = a.save_slope as i32;
            let (kernel, gelu_bytes) = if a.out.bf16 && gelu_out != 0 { ("matmul_epilogue_bf16", 2) } else { ("matmul_epilogue", 4) };
            // SAFETY: target (and gelu_out, residual) [N, M], bias [M].
            unsafe {
                self.launch(
                    kernel,
                    blocks(n * m),
                    BLOCK,
                    Work {
                        flops: 0.0,
                        bytes: (4 * (n * m * (2 + (residual != 0) as usize) + m * (bias != 0) as usize) + gelu_bytes * n * m * (gelu_out != 0) as usize) as f64,
                    },
                    &mut args![target.ptr, gelu_out, bias, residual, n as i32, m as i32, slope],
                )
            }
        }
        if let matmul::Epilogue::SwiGlu { pre } = a.epilogue {
            let (h, slope) = (m / 2, a.save_slope as i32);
            let (kernel, out_bytes) = if a.out.bf16 { ("swiglu_forward_bf16", 2) } else { ("swiglu_forward", 4) };
            // SAFETY: out [N, M/2], pre [N, M].
            unsafe {
                self.launch(
                    kernel,
                    blocks(n * h),
                    BLOCK,
                    Work { flops: 0.0, bytes: (n * h * (4 * (2 + 2 * slope as usize) + out_bytes)) as f64 },
                    &mut args![a.out.ptr, pre.ptr, n as i32, h as i32, slope],
                )
            }
        }
    }

    fn matmul_backward(&mut self, a: matmul::Backward<Tensor, Tensor>) {
        let (k, m) = (a.k, a.m);
        let n = a.x.len / k;
        // GELU's backward rides on the bias gradient's pass where there is a bias.
        let mut gelu_slope = None;
        match a.activation {
            Some(matmul::ActivationGrad::Gelu { slope }) if a.dbias.is_some() => gelu_slope = Some(slope),
            // SAFETY: both [N, M].
            Some(matmul::ActivationGrad::Gelu { slope }) => unsafe {
                self.launch("gelu_backward", blocks(n * m), BLOCK, Work::moving(3 * n * m), &mut args![a.dout.ptr, slope.ptr, (n * m) as i64])
            },
            // SAFETY: the slopes [N, M], dh [N, M/2].
            Some(matmul::ActivationGrad::SwiGlu { dh }) => unsafe {
                self.launch("swiglu_backward", blocks(n * m / 2), BLOCK, Work::moving(5 * n * m / 2), &mut args![a.dout.ptr, dh.ptr, n as i32, (m / 2) as i32])
            },
            None => {}
        }
        // Under bf16 products the bias gradient's pass, which reads every element of dout, also
        // writes the products' bf16 copy of it (no rounding pass of its own).
        let mut dout_bf16 = None;
        if let Some(db) = a.dbias {
            let (grid, partials, slope) = (self.row_block_grid(n, m), self.partials().ptr, gelu_slope.map_or(0, |s| s.ptr));
            if let (Arithmetic::Bf16, Some((_, scratch))) = (self.products.arithmetic(), self.arenas.operands_bf16) {
                assert!(n * m <= scratch.len, "a gradient larger than the bf16 scratch");
                dout_bf16 = Some(scratch.ptr);
            }
            let copy = dout_bf16.map_or(0, |_| 2 * n * m);
            // SAFETY: dout and the slopes [N, M], the partials blocks(N) x M, the copy [N, M].
            unsafe {
                self.launch(
                    "bias_grad_partials",
                    grid,
                    BLOCK,
                    Work { flops: 0.0, bytes: Work::moving(n * m * if slope != 0 { 3 } else { 1 } + row_blocks::blocks(n) * m).bytes + copy as f64 },
                    &mut args![partials, a.dout.ptr, slope, dout_bf16.unwrap_or(0), n as i32, m as i32],
                )
            };
            self.add_partials(n, m, m, db.ptr, 0);
        }
        let dout = match dout_bf16.or_else(|| self.dlogits_bf16(a.dout)) {
            Some(copy) => copy,
            None => self.operand(a.dout, 1),
        };
        if let Some(dx) = a.dx {
            // dx [N, K] = dout [N, M] · w [M, K]; column-major: dxᵀ [K, N] = wᵀ [K, M] · doutᵀ [M, N].
            let w = self.weight(a.weight);
            self.product(Product { transpose_a: false, transpose_b: false, m: k, n, k: m, accumulate: false }, w, dout, dx.ptr, Addends::default());
        }
        // dw [M, K] += doutᵀ · x; column-major: dwᵀ [K, M] += xᵀ [K, N] · (doutᵀ stored [M, N])ᵀ,
        // over slices of the N tokens where they are many for the outputs.
        let x = self.operand(a.x, 0);
        let (slices, len) = weight_grad_slices(k * m, n);
        if slices == 1 {
            self.product(Product { transpose_a: false, transpose_b: true, m: k, n: m, k: n, accumulate: true }, x, dout, a.dweight.ptr, Addends::default());
            return;
        }
        let partials = self.arenas.weight_grad_slices.expect("a sliced weight gradient needs the slices' scratch");
        assert!(slices * k * m <= partials.len, "the weight gradient's slices past their scratch");
        let size = self.operand_bytes();
        for s in 0..slices {
            let (first, tokens) = (s * len, len.min(n - s * len));
            let (xs, ds, out) = (x + (first * k * size) as u64, dout + (first * m * size) as u64, partials.ptr + (4 * s * k * m) as u64);
            self.product(Product { transpose_a: false, transpose_b: true, m: k, n: m, k: tokens, accumulate: false }, xs, ds, out, Addends::default());
        }
        // SAFETY: dw [M, K], the slices [slices, M, K] in the scratch (checked above).
        unsafe {
            self.launch(
                "add_weight_grad_slices",
                blocks(k * m),
                BLOCK,
                Work { flops: (slices * k * m) as f64, ..Work::moving((slices + 2) * k * m) },
                &mut args![a.dweight.ptr, partials.ptr, slices as i32, (k * m) as i64],
            )
        }
    }

    fn attention_forward(&mut self, a: attention::Forward<Tensor, Tensor>) {
        let s = a.shape;
        let scale = (1.0 / (s.head_size as f64).sqrt()) as f32;
        let (heads, kv_heads, hs) = (s.heads as i32, s.kv_heads as i32, s.head_size as i32);
        let rope = self.rope(s);
        assert_eq!(a.qkv.bf16, a.out.bf16, "attention's qkv and output stored alike");
        match self.decoding {
            Some(d) => {
                assert!(!a.qkv.bf16, "decoding runs on f32 activations");
                let kv = s.kv_heads * s.head_size;
                let keys = d.cache.part(2 * self.layer * d.len * kv, d.len * kv);
                let values = d.cache.part((2 * self.layer + 1) * d.len * kv, d.len * kv);
                let pos = d.position as i32;
                // SAFETY: one token's qkv [W], out [C], lse [NH]; the layer's cache.
                unsafe {
                    self.launch(
                        "attention_decode",
                        warp_blocks(s.heads),
                        BLOCK,
                        Work {
                            flops: 4.0 * (s.heads * (d.position + 1) * s.head_size) as f64,
                            bytes: 4.0 * (2 * (d.position + 1) * kv + s.width() + s.heads * (s.head_size + 1)) as f64,
                        },
                        &mut args![a.out.ptr, a.lse.ptr, keys.ptr, values.ptr, a.qkv.ptr, rope, pos, heads, kv_heads, hs, scale],
                    )
                }
            }
            None => {
                let drop = DropoutArgs::new(a.dropout, self.key);
                let rows = s.batch * s.heads * s.seq;
                let (b, t) = (s.batch as i32, s.seq as i32);
                let kernels = attention_kernels(&self.device.info, self.products.arithmetic(), s, a.qkv.bf16);
                let stored = a.qkv.element_bytes() as f64;
                let (grid, threads) = attention_launch(kernels.tensor, s, s.heads);
                // SAFETY: qkv [B, T, W], out [B, T, C], lse [B, NH, T].
                unsafe {
                    self.launch(
                        kernels.forward,
                        grid,
                        threads,
                        Work { flops: s.causal_flops(2.0), bytes: stored * (s.batch * s.seq * (s.width() + s.heads * s.head_size)) as f64 + 4.0 * rows as f64 },
                        &mut args![a.out.ptr, a.lse.ptr, a.qkv.ptr, rope, b, t, heads, kv_heads, hs, scale, drop],
                    )
                }
            }
        }
    }

    fn attention_backward(&mut self, a: attention::Backward<Tensor, Tensor>) {
        let s = a.shape;
        let scale = (1.0 / (s.head_size as f64).sqrt()) as f32;
        let drop = DropoutArgs::new(a.dropout, self.key);
        let rows = s.batch * s.heads * s.seq;
        let delta = self.arenas.acts.part(self.plan.scratch().attention.offset, rows);
        let (b, t, heads, kv_heads, hs) = (s.batch as i32, s.seq as i32, s.heads as i32, s.kv_heads as i32, s.head_size as i32);
        let rope = self.rope(s);
        assert_eq!(a.qkv.bf16, a.out.bf16, "attention's qkv and output stored alike");
        let kernels = attention_kernels(&self.device.info, self.products.arithmetic(), s, a.qkv.bf16);
        let (stored, tokens) = (a.qkv.element_bytes() as f64, (s.batch * s.seq) as f64);
        // Grouped heads: a block per rows of keys of each query head, its share of dK and dV
        // into the partials, added after.
        let partials = (s.kv_heads < s.heads).then(|| self.arenas.attention_partials.expect("grouped heads' backward needs the attention partials"));
        let key_value_heads = if partials.is_some() { s.heads } else { s.kv_heads };
        let ((query_grid, threads), (key_value_grid, _)) = (attention_launch(kernels.tensor, s, s.heads), attention_launch(kernels.tensor, s, key_value_heads));
        // SAFETY: as forward; delta [B, NH, T] in the attention scratch.
        unsafe {
            let (dqkv, dout, qkv, lse) = (a.dqkv.ptr, a.dout.ptr, a.qkv.ptr, a.lse.ptr);
            self.launch(
                kernels.backward_query,
                query_grid,
                threads,
                Work {
                    flops: s.causal_flops(3.0),
                    bytes: tokens * (stored * (s.width() + s.heads * s.head_size) as f64 + 4.0 * (2 * s.heads * s.head_size) as f64) + 8.0 * rows as f64,
                },
                &mut args![dqkv, delta.ptr, dout, qkv, a.out.ptr, lse, rope, b, t, heads, kv_heads, hs, scale, drop],
            );
            self.launch(
                kernels.backward_key_value,
                key_value_grid,
                threads,
                Work {
                    flops: s.causal_flops(4.0),
                    bytes: tokens * (stored * s.width() as f64 + 4.0 * (s.heads * s.head_size + 2 * s.kv_heads * s.head_size) as f64) + 8.0 * rows as f64,
                },
                &mut args![dqkv, partials.map_or(0, |p| p.ptr), dout, qkv, lse, delta.ptr, rope, b, t, heads, kv_heads, hs, scale, drop],
            );
            if let Some(partials) = partials {
                let (n, sums) = (s.batch * s.seq, s.batch * s.seq * s.kv_heads * 2 * s.head_size);
                assert!(partials.len >= n * s.heads * 2 * s.head_size, "the attention partials are too small");
                self.launch(
                    "attention_sum_key_value",
                    blocks(sums),
                    BLOCK,
                    Work { flops: (sums * (s.heads / s.kv_heads - 1)) as f64, ..Work::moving(n * s.heads * 2 * s.head_size + sums) },
                    &mut args![dqkv, partials.ptr, n as i32, heads, kv_heads, hs],
                );
            }
            if rope != 0 {
                let pairs = s.batch * s.seq * (s.heads + s.kv_heads) * s.head_size / 2;
                let n = (s.batch * s.seq) as i32;
                self.launch(
                    "attention_rope_backward",
                    blocks(pairs),
                    BLOCK,
                    Work::moving(4 * pairs + s.seq * s.head_size),
                    &mut args![dqkv, rope, n, t, heads, kv_heads, hs],
                );
            }
        }
    }

    fn cross_entropy(&mut self, a: cross_entropy::Forward<Tensor>) {
        let n = a.losses.len;
        let v = a.logits.len / n;
        // Without targets (sampling) there is no loss: the logits are the output.
        let Some(targets) = self.arenas.targets.map(|t| t.ptr) else { return };
        let (write_grad, scale) = (a.grad_scale.is_some() as i32, a.grad_scale.unwrap_or(0.0) as f32);
        let grad_bf16 = self.dlogits_bf16(a.logits).filter(|_| write_grad != 0);
        let grad_bytes = write_grad as usize * if grad_bf16.is_some() { 2 } else { 4 };
        // SAFETY: logits [N, V] (and their bf16 gradient, in a scratch of at least N x V), losses
        // and targets [N].
        unsafe {
            self.launch(
                "cross_entropy",
                n as u32,
                BLOCK,
                Work { flops: 0.0, bytes: (n * v * (4 + grad_bytes) + 8 * n) as f64 },
                &mut args![a.losses.ptr, a.logits.ptr, grad_bf16.unwrap_or(0), targets, v as i32, a.classes as i32, write_grad, scale],
            )
        }
    }

    fn dropout_forward(&mut self, a: dropout::Forward<Tensor, Tensor>) {
        let drop = DropoutArgs::new(Some(a.site), self.key);
        let residual = a.residual.map_or(0, |r| r.ptr);
        let len = a.out.len;
        // SAFETY: out, y (and residual) of `len` elements.
        unsafe {
            self.launch(
                "dropout",
                blocks(len),
                BLOCK,
                Work::moving(len * (2 + (residual != 0) as usize)),
                &mut args![a.out.ptr, a.y.ptr, residual, len as i64, drop],
            )
        }
    }

    fn dropout_backward(&mut self, a: dropout::Backward<Tensor, Tensor>) {
        let drop = DropoutArgs::new(Some(a.site), self.key);
        let len = a.dy.len;
        // SAFETY: dy and dout of `len` elements.
        unsafe { self.launch("dropout", blocks(len), BLOCK, Work::moving(2 * len), &mut args![a.dy.ptr, a.dout.ptr, 0u64, len as i64, drop]) }
    }
}
