//! The compiled kernels and the dispatch lists ([`Program`]) built from them.
//!
//! Unstable: public for Alpha's tools and tests; it changes with any release (see the crate's
//! Stability section).
//!
//! Every entry point takes one uniform block of 16 words (binding 0) and its tensors as
//! storage bindings 1..=n, each bound to its own range of a buffer, rounded up to whole
//! 16-byte vec4s (offsets are multiples of 256 bytes: the plan aligns activations,
//! [`crate::layout`] parameters), so the bindings of one dispatch never overlap. Pipelines,
//! layouts and bind groups are made once; a program is encoded into a compute pass as it is.
//!
//! A tensor is f32, or under `--precision f16` an f16 activation or weight copy ([`View::half`]).
//! A kernel is compiled once per pattern of f16 tensors it binds ([`HALF_VARIANTS`]): the WGSL
//! declares such bindings `array<ElemN>` (N the binding) and alpha-gpu prepends each `ElemN`
//! as f32 or f16, with `HALFN` to tell which and `to_elemN` to store into it.

use crate::context::{Gpu, GpuError, Precision};
use alpha_core::plan::Span;
use std::collections::HashMap;
use std::num::NonZeroU64;

/// Bytes of one element of a device arena: f32 (or u32 token ids). f16 tensors live two to
/// an element (see [`View::half`]).
pub const ELEMENT_BYTES: usize = 4;

/// Bytes of `elements` arena elements.
pub fn bytes(elements: usize) -> u64 {
    // Saturating: a size past u64 is refused by `Gpu::check_size` like any over the limits.
    (elements as u64).saturating_mul(ELEMENT_BYTES as u64)
}

/// Whole arena elements in `bytes` bytes (the inverse of [`bytes`]).
pub fn elements(bytes: u64) -> usize {
    usize::try_from(bytes / ELEMENT_BYTES as u64).unwrap_or(usize::MAX)
}

/// Which tensors of a dispatch are f16: bit `i` for binding `i + 1`.
pub type HalfSlots = u8;

/// Declares each WGSL file once: its name and the files compiled together (`common.wgsl` in
/// front of all).
macro_rules! shaders {
    ($($shader:ident => [$($file:literal),+]),* $(,)?) => {
        /// The WGSL files, each compiled with `common.wgsl` in front.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        enum Shader {
            $($shader,)*
        }

        impl Shader {
            fn source(self) -> &'static str {
                match self {
                    $(Shader::$shader => concat!($(include_str!(concat!("../shaders/", $file)), "\n"),+),)*
                }
            }

            /// Its file's name (the last of those compiled together), for messages.
            fn name(self) -> &'static str {
                match self {
                    $(Shader::$shader => [$($file),+][[$($file),+].len() - 1],)*
                }
            }
        }
    };
}

shaders! {
    Matmul => ["matmul.wgsl"],
    MatmulTensor => ["matmul.wgsl", "matmul_tensor.wgsl"],
    RowBlocks => ["row_blocks.wgsl"],
    LayerNorm => ["layernorm.wgsl"],
    RmsNorm => ["rmsnorm.wgsl"],
    Attention => ["attention.wgsl"],
    Embedding => ["embedding.wgsl"],
    CrossEntropy => ["cross_entropy.wgsl"],
    GradNorm => ["grad_norm.wgsl"],
    AdamW => ["adamw.wgsl"],
    Dropout => ["dropout.wgsl"],
}

const COMMON: &str = include_str!("../shaders/common.wgsl");

/// Declares each kernel once: its doc, WGSL file, entry point, the tensors it binds, and the
/// f16 patterns it is compiled for beside all-f32 (on a device with f16 precision). The enum,
/// [`Kernel::ALL`], its spec and [`HALF_VARIANTS`] follow from this one table.
macro_rules! kernels {
    ($($(#[doc = $doc:literal])* $kernel:ident => ($shader:ident, $entry:literal, $tensors:literal $(, f16: [$($half:literal),*])?)),* $(,)?) => {
        /// A WGSL entry point.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Kernel {
            $($(#[doc = $doc])* $kernel,)*
        }

        impl Kernel {
            /// Every kernel, in declaration order.
            pub const ALL: &'static [Kernel] = &[$(Kernel::$kernel),*];

            /// (shader file, entry point, tensors bound).
            fn spec(self) -> (Shader, &'static str, usize) {
                match self {
                    $(Kernel::$kernel => (Shader::$shader, $entry, $tensors),)*
                }
            }
        }

        /// The f16 patterns each kernel is compiled for beside all-f32, on a device with f16
        /// precision: the products read f16 activations (binding 1, forward) and weight copies
        /// or activations (binding 2) and write qkv and the GELU output as f16 (binding 3);
        /// LayerNorm and attention write their outputs as f16 (binding 1), attention reads qkv
        /// as f16 (binding 2) and its delta pass reads its output (binding 3).
        pub const HALF_VARIANTS: &[(Kernel, HalfSlots)] = &[$($($((Kernel::$kernel, $half),)*)?)*];
    };
}

kernels! {
    /// Tiled GEMM with epilogues (matmul.wgsl).
    Matmul => (Matmul, "matmul", 5, f16: [0b011, 0b111, 0b010]),
    /// The same GEMM over 128 x 128 tiles, for large products (matmul.wgsl).
    MatmulWide => (Matmul, "matmul_wide", 5, f16: [0b011, 0b111, 0b010]),
    /// `MatmulWide` on the tensor cores, in its place on a device opened with them
    /// (matmul_tensor.wgsl; see [`Gpu::tensor_cores`]).
    MatmulTensor => (MatmulTensor, "matmul_tensor", 5, f16: [0b011, 0b111, 0b010]),
    /// GELU backward and bias column sums (matmul.wgsl).
    BiasGrad => (Matmul, "bias_grad", 3),
    /// SwiGLU after the gate and up product, with its slopes in a training forward
    /// (matmul.wgsl).
    SwiGluForward => (Matmul, "swiglu_forward", 2, f16: [0b001]),
    /// SwiGLU's backward: its slopes times the output's gradient (matmul.wgsl).
    SwiGluBackward => (Matmul, "swiglu_backward", 2),
    /// Finishes column sums from row-block partials (row_blocks.wgsl).
    AddPartials => (RowBlocks, "add_partials", 3),
    /// LayerNorm forward (layernorm.wgsl).
    LayerNormForward => (LayerNorm, "layernorm_forward", 6, f16: [0b001]),
    /// LayerNorm input gradient (layernorm.wgsl).
    LayerNormBackward => (LayerNorm, "layernorm_backward", 6),
    /// LayerNorm weight/bias gradient partials (layernorm.wgsl).
    LayerNormParamPartials => (LayerNorm, "layernorm_param_partials", 5),
    /// RMSNorm forward (rmsnorm.wgsl).
    RmsNormForward => (RmsNorm, "rmsnorm_forward", 4, f16: [0b001]),
    /// RMSNorm input gradient (rmsnorm.wgsl).
    RmsNormBackward => (RmsNorm, "rmsnorm_backward", 5),
    /// RMSNorm weight gradient partials (rmsnorm.wgsl).
    RmsNormWeightPartials => (RmsNorm, "rmsnorm_weight_partials", 4),
    /// Causal attention forward (attention.wgsl).
    AttentionForward => (Attention, "attention_forward", 7, f16: [0b011]),
    /// Row deltas for attention backward (attention.wgsl).
    AttentionDelta => (Attention, "attention_delta", 3, f16: [0b100]),
    /// Attention dQ (attention.wgsl).
    AttentionBackwardQ => (Attention, "attention_backward_q", 7, f16: [0b010]),
    /// Attention dK, dV (attention.wgsl).
    AttentionBackwardKv => (Attention, "attention_backward_kv", 7, f16: [0b010]),
    /// RoPE's dQ and dK rotated back (attention.wgsl).
    AttentionRopeBackward => (Attention, "attention_rope_backward", 7),
    /// One token's attention against the KV cache (attention.wgsl).
    AttentionDecode => (Attention, "attention_decode", 7, f16: [0b011]),
    /// Token + position embedding (embedding.wgsl).
    EmbeddingForward => (Embedding, "embedding_forward", 5),
    /// Token embedding gradient (embedding.wgsl).
    EmbeddingBackwardWte => (Embedding, "embedding_backward_wte", 4),
    /// Position embedding gradient (embedding.wgsl).
    EmbeddingBackwardWpe => (Embedding, "embedding_backward_wpe", 2),
    /// Fused softmax cross-entropy (cross_entropy.wgsl).
    CrossEntropy => (CrossEntropy, "cross_entropy", 4),
    /// Loss sum into the statistics buffer (cross_entropy.wgsl).
    SumLosses => (CrossEntropy, "sum_losses", 2),
    /// Σ x² per chunk (grad_norm.wgsl).
    SumSquaresPartials => (GradNorm, "sum_squares_partials", 2),
    /// Σ of the chunks (grad_norm.wgsl).
    SumSquaresFinish => (GradNorm, "sum_squares_finish", 2),
    /// AdamW with clip (adamw.wgsl).
    AdamW => (AdamW, "adamw", 5),
    /// The dynamic loss scale's update after AdamW, under f16 products (adamw.wgsl).
    LossScaleUpdate => (AdamW, "loss_scale_update", 1),
    /// Dropout before a residual add, and its backward (dropout.wgsl).
    Dropout => (Dropout, "dropout", 4),
    /// The f16 copy of the weights that the products read, under f16 precision (adamw.wgsl).
    HalfWeights => (AdamW, "half_weights", 2, f16: [0b010]),
}

impl Kernel {
    /// The entry point's name (trace spans use it).
    pub fn name(self) -> &'static str {
        self.spec().1
    }
}

/// Most tensors one kernel binds.
pub(crate) const MAX_TENSORS: usize = 7;
/// Bytes of one dispatch's uniform words, and the stride between them.
const WORDS_BYTES: u64 = 64;
const WORDS_STRIDE: u64 = 256;

/// Every pipeline, compiled once for one head size (cloning shares them).
#[derive(Clone)]
pub struct Kernels {
    /// By kernel and f16 pattern: the tensor-core GEMM only on a device opened with tensor
    /// cores, the f16 patterns ([`HALF_VARIANTS`]) only on one with f16 precision.
    pipelines: HashMap<(Kernel, HalfSlots), wgpu::ComputePipeline>,
    layouts: Vec<wgpu::BindGroupLayout>,
    /// Stands in for unused bindings (a disjoint 256-byte range per binding slot).
    dummy: wgpu::Buffer,
}

impl Kernels {
    /// Compiles every kernel; attention's for heads of `head_size`. An adapter that cannot
    /// run them (too few bindings, too little workgroup memory) is an error, not a panic.
    pub async fn new(gpu: &Gpu, head_size: usize) -> Result<Kernels, GpuError> {
        if head_size == 0 || head_size > 256 {
            return Err(GpuError(format!("the GPU attention kernels take head sizes 1..=256 (n_embd / n_head), not {head_size}")));
        }
        let device = &gpu.device;
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let layouts: Vec<wgpu::BindGroupLayout> = (0..=MAX_TENSORS)
            .map(|n| {
                let uniform = wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: false,
                        min_binding_size: NonZeroU64::new(WORDS_BYTES),
                    },
                    count: None,
                };
                let storage = (1..=n as u32).map(|binding| wgpu::BindGroupLayoutEntry {
                    binding,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage { read_only: false },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                });
                let entries: Vec<_> = std::iter::once(uniform).chain(storage).collect();
                device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: None, entries: &entries })
            })
            .collect();
        // One pipeline layout per tensor count, shared by every pipeline that binds as many.
        let pipeline_layouts: Vec<wgpu::PipelineLayout> = layouts
            .iter()
            .map(|l| device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor { label: None, bind_group_layouts: &[Some(l)], immediate_size: 0 }))
            .collect();
        let mut modules = HashMap::new();
        let mut pipelines = HashMap::new();
        for (kernel, slots) in compiled_variants(gpu.precision == Precision::F16, gpu.tensor_cores()) {
            let (shader, entry, n) = kernel.spec();
            let module = modules.entry((shader, slots)).or_insert_with(|| gpu.shader_module(shader.name(), &kernel_source(kernel, slots, head_size)));
            pipelines.insert((kernel, slots), gpu.compute_pipeline(module, entry, Some(&pipeline_layouts[n])));
        }
        let dummy = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("unused binding"),
            size: WORDS_STRIDE * (MAX_TENSORS as u64 + 1),
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        if let Some(e) = scope.pop().await {
            return Err(GpuError(format!("{} cannot run alpha's kernels: {e}", gpu.adapter.name)));
        }
        Ok(Kernels { pipelines, layouts, dummy })
    }

    fn pipeline(&self, k: Kernel, slots: HalfSlots) -> &wgpu::ComputePipeline {
        // Programs name only variants built for their device (`ProgramBuilder::build`).
        &self.pipelines[&(k, slots)]
    }

    /// The kernel that runs a dispatch of `k`: the tensor-core GEMM in place of `matmul_wide`
    /// where it was built.
    fn runs(&self, k: Kernel) -> Kernel {
        match k {
            Kernel::MatmulWide if self.pipelines.contains_key(&(Kernel::MatmulTensor, 0)) => Kernel::MatmulTensor,
            k => k,
        }
    }
}

/// What alpha-gpu puts before `common.wgsl` when it compiles `shader` for the f16 pattern
/// `slots`: the extensions, each binding's element type `ElemN` with `HALFN` (whether it is
/// f16) and its conversion `to_elemN` (to f16 by `round_f16`: ±inf past its range), and
/// attention's head size.
fn prelude(shader: Shader, slots: HalfSlots, head_size: usize) -> String {
    let mut text = String::new();
    if slots != 0 || shader == Shader::MatmulTensor {
        text.push_str("enable f16;\n");
    }
    if shader == Shader::MatmulTensor {
        text.push_str("enable wgpu_cooperative_matrix;\n");
    }
    for n in 1..=MAX_TENSORS {
        if slots & (1 << (n - 1)) != 0 {
            text.push_str(&format!("alias Elem{n} = f16;\nconst HALF{n}: bool = true;\nfn to_elem{n}(x: f32) -> f16 {{ return f16(round_f16(x)); }}\n"));
        } else {
            text.push_str(&format!("alias Elem{n} = f32;\nconst HALF{n}: bool = false;\nfn to_elem{n}(x: f32) -> f32 {{ return x; }}\n"));
        }
    }
    if shader == Shader::MatmulTensor {
        // The tensor-core GEMM's store of an accumulator straight into c (row-major, `stride`
        // elements a row) where c is f32; where it is f16 the kernel never calls it.
        let body = if slots & (1 << 2) == 0 { "coopStoreT(acc, &mm_c[at], stride);" } else { "" };
        text.push_str(&format!("fn tc_store_plain(acc: coop_mat16x16<f32, C>, at: u32, stride: u32) {{ {body} }}\n"));
    }
    if shader == Shader::Attention {
        text.push_str(&format!("const HS: u32 = {head_size}u;\n"));
    }
    text
}

/// A tensor: `len` elements of `buffer` from element `offset`, f32 (4 bytes each) or, where
/// `half`, f16 (2 bytes each).
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    /// The buffer.
    pub buffer: &'a wgpu::Buffer,
    /// First element.
    pub offset: usize,
    /// Elements.
    pub len: usize,
    /// Stored as f16 (see [`alpha_core::plan::Plan::with_half_activations`]).
    pub half: bool,
}

impl<'a> View<'a> {
    /// The elements of `span` in `buffer`.
    pub fn span(buffer: &'a wgpu::Buffer, span: Span) -> View<'a> {
        View { buffer, offset: span.offset, len: span.len, half: false }
    }

    /// The f16 elements of `span` in `buffer`, an arena of f32 elements: two to each, from
    /// the span's first.
    pub fn half_span(buffer: &'a wgpu::Buffer, span: Span) -> View<'a> {
        View { buffer, offset: 2 * span.offset, len: span.len, half: true }
    }

    /// The first `len` elements of `buffer`.
    pub fn first(buffer: &'a wgpu::Buffer, len: usize) -> View<'a> {
        View { buffer, offset: 0, len, half: false }
    }

    /// The same elements of `buffer`, an f16 copy of this tensor's arena.
    pub fn in_half_copy(self, buffer: &'a wgpu::Buffer) -> View<'a> {
        View { buffer, half: true, ..self }
    }

    /// `len` elements of this tensor from its element `at` (a piece bound on its own).
    pub fn part(self, at: usize, len: usize) -> View<'a> {
        View { offset: self.offset + at, len, ..self }
    }

    fn element_bytes(&self) -> u64 {
        if self.half {
            2
        } else {
            ELEMENT_BYTES as u64
        }
    }

    /// Byte offset of its first element.
    pub fn byte_offset(&self) -> u64 {
        self.offset as u64 * self.element_bytes()
    }

    /// Bytes of its elements, rounded up to whole 4-byte words.
    pub fn byte_len(&self) -> u64 {
        (self.len as u64 * self.element_bytes()).next_multiple_of(4)
    }

    /// Bytes it binds: its elements' rounded up to whole 16-byte vec4s, so that a kernel that
    /// reads it as an array of vec4s (the wide and tensor-core GEMMs' operands) reaches its
    /// last elements. Storage buffers are whole vec4s ([`crate::forward::storage`]) and
    /// bindings start on 256 bytes, so this stays inside the buffer (other buffers keep
    /// their length).
    fn binding_len(&self) -> u64 {
        let rounded = self.byte_len().next_multiple_of(16);
        if self.byte_offset() + rounded <= self.buffer.size() {
            rounded
        } else {
            self.byte_len()
        }
    }
}

/// One dispatch before it is built.
struct Pending<'a> {
    kernel: Kernel,
    label: &'static str,
    words: [u32; 16],
    views: Vec<Option<View<'a>>>,
    groups: [u32; 3],
    work: Work,
}

/// What one dispatch does (its products' operations, the bytes of the tensors it binds).
pub use alpha_core::tape::Work;

/// Collects dispatches, then builds their bind groups and uniform words at once.
pub struct ProgramBuilder<'a> {
    pending: Vec<Pending<'a>>,
    label: &'static str,
    max_binding: u64,
    f16_products: bool,
}

impl Default for ProgramBuilder<'_> {
    /// A builder for a device without a binding limit (tests; see [`ProgramBuilder::for_gpu`]).
    fn default() -> Self {
        ProgramBuilder { pending: Vec::new(), label: "", max_binding: u64::MAX, f16_products: false }
    }
}

impl<'a> ProgramBuilder<'a> {
    /// A builder whose dispatches bind at most `gpu`'s `max_storage_buffer_binding_size`
    /// bytes each: the ops split larger tensors (see [`ProgramBuilder::max_binding`]).
    /// Its products round their operands to f16 where `gpu` runs them so ([`Precision::F16`]).
    pub fn for_gpu(gpu: &Gpu) -> Self {
        let f16_products = gpu.precision == Precision::F16;
        ProgramBuilder { max_binding: gpu.limits.max_storage_buffer_binding_size, f16_products, ..ProgramBuilder::default() }
    }

    /// With the products' operands rounded to f16 (`on`) or not.
    pub fn with_f16_products(mut self, on: bool) -> Self {
        self.f16_products = on;
        self
    }

    /// Whether the products round their operands to f16.
    pub fn f16_products(&self) -> bool {
        self.f16_products
    }

    /// With a binding limit of `bytes` (as if the device had it).
    pub fn with_max_binding(mut self, bytes: u64) -> Self {
        self.max_binding = bytes;
        self
    }

    /// The most elements one binding may hold: ops whose tensors are larger dispatch over
    /// pieces of them.
    pub fn max_binding(&self) -> usize {
        elements(self.max_binding)
    }

    /// Names the dispatches pushed from now on (the tape op they belong to, for traces).
    pub fn label(&mut self, label: &'static str) {
        self.label = label;
    }

    /// Adds a dispatch of `kernel` over `groups` workgroups binding `views` (None: unused)
    /// with uniform `words`; returns its index in the program.
    pub fn push(&mut self, kernel: Kernel, words: &[u32], views: &[Option<View<'a>>], groups: [u32; 3]) -> usize {
        assert_eq!(views.len(), kernel.spec().2, "{kernel:?} binds {} tensors", kernel.spec().2);
        let mut w = [0u32; 16];
        w[..words.len()].copy_from_slice(words);
        let bytes = views.iter().flatten().map(|v| v.byte_len() as f64).sum();
        self.pending.push(Pending { kernel, label: self.label, words: w, views: views.to_vec(), groups, work: Work { flops: 0.0, bytes } });
        self.pending.len() - 1
    }

    /// Sets the floating-point operations of dispatch `index` (see [`Work`]).
    pub fn count_flops(&mut self, index: usize, flops: f64) {
        self.pending[index].work.flops = flops;
    }

    /// Bind groups and one uniform buffer for every dispatch pushed.
    pub fn build(self, gpu: &Gpu, kernels: &Kernels) -> Result<Program, GpuError> {
        let device = &gpu.device;
        let align = gpu.limits.min_storage_buffer_offset_alignment as usize;
        let uniforms = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("dispatch words"),
            size: WORDS_STRIDE * self.pending.len().max(1) as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let max_groups = gpu.limits.max_compute_workgroups_per_dimension;
        let mut dispatches = Vec::with_capacity(self.pending.len());
        for (i, p) in self.pending.iter().enumerate() {
            if p.groups.iter().any(|&g| g > max_groups) {
                return Err(GpuError(format!("{} needs {:?} workgroups; the device allows {max_groups} per dimension", p.kernel.name(), p.groups)));
            }
            let kernel = kernels.runs(p.kernel);
            let slots = p.views.iter().enumerate().filter(|(_, v)| v.is_some_and(|v| v.half)).fold(0, |s, (i, _)| s | 1 << i);
            if !kernels.pipelines.contains_key(&(kernel, slots)) {
                return Err(GpuError(format!("{} is not built to bind f16 tensors at {slots:#b} on {}", kernel.name(), gpu.adapter.name)));
            }
            gpu.queue.write_buffer(&uniforms, WORDS_STRIDE * i as u64, bytemuck::cast_slice(&p.words));
            let mut entries = vec![wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &uniforms,
                    offset: WORDS_STRIDE * i as u64,
                    size: NonZeroU64::new(WORDS_BYTES),
                }),
            }];
            for (slot, v) in p.views.iter().enumerate() {
                let binding = match v {
                    Some(v) if v.len > 0 => {
                        assert_eq!(v.byte_offset() % align as u64, 0, "{}: binding {} is not aligned", p.kernel.name(), slot + 1);
                        gpu.check_size(&format!("a tensor of {}", p.kernel.name()), v.binding_len(), true, "the batch, block or model")?;
                        wgpu::BufferBinding { buffer: v.buffer, offset: v.byte_offset(), size: NonZeroU64::new(v.binding_len()) }
                    }
                    _ => wgpu::BufferBinding { buffer: &kernels.dummy, offset: WORDS_STRIDE * (slot as u64 + 1), size: NonZeroU64::new(WORDS_STRIDE) },
                };
                entries.push(wgpu::BindGroupEntry { binding: slot as u32 + 1, resource: wgpu::BindingResource::Buffer(binding) });
            }
            let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(p.kernel.name()),
                layout: &kernels.layouts[p.views.len()],
                entries: &entries,
            });
            dispatches.push(Dispatch { kernel, slots, label: p.label, bind_group, groups: p.groups, work: p.work });
        }
        Ok(Program { dispatches, uniforms })
    }
}

/// A built dispatch.
struct Dispatch {
    kernel: Kernel,
    slots: HalfSlots,
    label: &'static str,
    bind_group: wgpu::BindGroup,
    groups: [u32; 3],
    work: Work,
}

/// A fixed list of dispatches with their bind groups and uniform words.
pub struct Program {
    dispatches: Vec<Dispatch>,
    uniforms: wgpu::Buffer,
}

impl Program {
    /// Records every dispatch into `pass`, in order.
    pub fn encode(&self, kernels: &Kernels, pass: &mut wgpu::ComputePass<'_>) {
        for d in &self.dispatches {
            pass.set_pipeline(kernels.pipeline(d.kernel, d.slots));
            pass.set_bind_group(0, &d.bind_group, &[]);
            pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
        }
    }

    /// Encodes the program alone and submits it.
    pub fn submit(&self, gpu: &Gpu, kernels: &Kernels) {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        self.encode(kernels, &mut enc.begin_compute_pass(&Default::default()));
        gpu.queue.submit([enc.finish()]);
    }

    /// Replaces the uniform words of dispatch `index` (takes effect at the next submit).
    pub fn set_words(&self, queue: &wgpu::Queue, index: usize, words: &[u32; 16]) {
        queue.write_buffer(&self.uniforms, WORDS_STRIDE * index as u64, bytemuck::cast_slice(words));
    }

    /// Number of dispatches.
    pub fn len(&self) -> usize {
        self.dispatches.len()
    }

    /// True if the program dispatches nothing.
    pub fn is_empty(&self) -> bool {
        self.dispatches.is_empty()
    }

    /// The tape op label, kernel and work of each dispatch, in order.
    pub fn dispatches(&self) -> impl Iterator<Item = (&'static str, Kernel, Work)> + '_ {
        self.dispatches.iter().map(|d| (d.label, d.kernel, d.work))
    }

    /// Records each dispatch in a pass of its own with a timestamp before and after it, at
    /// the pair of queries `next_pair` gives (profiling: the extra passes cost a little).
    pub(crate) fn encode_timed<'q>(&self, kernels: &Kernels, enc: &mut wgpu::CommandEncoder, mut next_pair: impl FnMut() -> (&'q wgpu::QuerySet, u32)) {
        for d in &self.dispatches {
            let (set, begin) = next_pair();
            let timestamp_writes =
                wgpu::ComputePassTimestampWrites { query_set: set, beginning_of_pass_write_index: Some(begin), end_of_pass_write_index: Some(begin + 1) };
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(d.label), timestamp_writes: Some(timestamp_writes) });
            pass.set_pipeline(kernels.pipeline(d.kernel, d.slots));
            pass.set_bind_group(0, &d.bind_group, &[]);
            pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
        }
    }
}

/// The kernels and f16 patterns a device compiles: every kernel in f32, the f16 patterns
/// ([`HALF_VARIANTS`]) with `f16` precision, the tensor-core GEMM only with `tensor_cores`.
pub(crate) fn compiled_variants(f16: bool, tensor_cores: bool) -> impl Iterator<Item = (Kernel, HalfSlots)> {
    let variants = Kernel::ALL.iter().map(|&k| (k, 0)).chain(HALF_VARIANTS.iter().copied().filter(move |_| f16));
    variants.filter(move |&(k, _)| k != Kernel::MatmulTensor || tensor_cores)
}

/// The WGSL module holding `kernel` with f16 bindings `slots` (attention's for heads of
/// `head_size`): its prelude, `common.wgsl`, then its file.
pub(crate) fn kernel_source(kernel: Kernel, slots: HalfSlots, head_size: usize) -> String {
    let shader = kernel.spec().0;
    format!("{}{COMMON}\n{}", prelude(shader, slots, head_size), shader.source())
}

/// Workgroups for `cols_groups` column groups over `rows` rows spread over y and z (65535
/// at most per dimension; the kernels use `grid_row`).
pub fn rows_grid(cols_groups: usize, rows: usize) -> [u32; 3] {
    let y = rows.clamp(1, 65535);
    [cols_groups as u32, y as u32, rows.div_ceil(y).max(1) as u32]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every module a device may compile, the f16 variants and the tensor-core GEMM included
    /// (Debian 12's lavapipe has no cooperative matrices; Mesa 26's runs that one, through
    /// `scripts/lavapipe-coop.sh`, in the GPU kernel tests), passes
    /// naga's WGSL front end and validator, for head sizes that fill and do not fill a vec4
    /// (1 among them: the kernels that take no head, compiled with the smallest),
    /// and each of its kernels goes through naga's SPIR-V writer as Vulkan devices take it
    /// (a writer's panic on the tensor-core GEMM would otherwise first show on a real GPU).
    #[test]
    fn every_variant_is_valid_wgsl() {
        use wgpu::naga::valid::{Capabilities, ValidationFlags, Validator};
        // One kernel of each module.
        let modules: HashMap<(Shader, HalfSlots), Kernel> = compiled_variants(true, true).map(|(k, slots)| ((k.spec().0, slots), k)).collect();
        for head_size in [1, 5, 64, 100] {
            for (&(shader, slots), &kernel) in &modules {
                let source = kernel_source(kernel, slots, head_size);
                let what = format!("{} with f16 bindings {slots:#b}, head size {head_size}", shader.name());
                let module = wgpu::naga::front::wgsl::parse_str(&source).unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&source)));
                let entries: Vec<&str> = module.entry_points.iter().map(|e| e.name.as_str()).collect();
                for kernel in Kernel::ALL.iter().filter(|k| k.spec().0 == shader) {
                    assert!(entries.contains(&kernel.name()), "{what}: no entry point {}", kernel.name());
                }
                let info = Validator::new(ValidationFlags::all(), Capabilities::all())
                    .validate(&module)
                    .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&source)));
                for kernel in Kernel::ALL.iter().filter(|k| k.spec().0 == shader) {
                    let options = wgpu::naga::back::spv::Options { lang_version: (1, 3), ..Default::default() };
                    let stage = wgpu::naga::back::spv::PipelineOptions { shader_stage: wgpu::naga::ShaderStage::Compute, entry_point: kernel.name().into() };
                    wgpu::naga::back::spv::write_vec(&module, &info, &options, Some(&stage)).unwrap_or_else(|e| panic!("{what}, {}: {e}", kernel.name()));
                }
            }
        }
    }
}
