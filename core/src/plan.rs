//! The memory plan: from (config, batch, sequence) the offset of every tensor in the arenas.
//!
//! Five arenas, all owned by the caller:
//! - `params`, `grads`, `adam_m`, `adam_v`: [`Plan::params_len`] elements each, one layout
//!   (a parameter's gradient and moments sit at the parameter's offset);
//! - `acts`: [`Plan::acts_len`] elements: saved activations, then backward scratch. Every
//!   activation span starts at a multiple of [`ACT_ALIGN`] elements. Under wgpu's f16
//!   precision and CUDA's bf16 products the activations that feed the linear layers (and
//!   qkv) are stored as 16-bit floats, two to an element (see [`Plan::with_half_activations`]).
//!
//! Parameters are laid out in nanoGPT's `state_dict` order with `nn.Linear` layout
//! (`[out_features, in_features]`), so a checkpoint is the params arena cut at the offsets.

use crate::config::{check_size, ConfigError, GptConfig, MAX_DIM};
use crate::ops::attention::AttentionShape;
use core::fmt;

/// A contiguous range of one arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Span {
    /// First element.
    pub offset: usize,
    /// Number of elements.
    pub len: usize,
}

impl Span {
    /// One past the last element.
    pub fn end(&self) -> usize {
        self.offset + self.len
    }
    /// The span as a range, for slicing an arena.
    pub fn range(&self) -> core::ops::Range<usize> {
        self.offset..self.end()
    }
}

/// The parameter tensors of a GPT, in nanoGPT's `state_dict` order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// Token embedding `[V, C]`, tied to the LM head.
    Wte,
    /// Position embedding `[block_size, C]`.
    Wpe,
    /// First LayerNorm weight `[C]`.
    Ln1Weight,
    /// First LayerNorm bias `[C]`.
    Ln1Bias,
    /// Fused QKV projection `[3C, C]`.
    QkvWeight,
    /// Fused QKV bias `[3C]`.
    QkvBias,
    /// Attention output projection `[C, C]`.
    AttnProjWeight,
    /// Attention output bias `[C]`.
    AttnProjBias,
    /// Second LayerNorm weight `[C]`.
    Ln2Weight,
    /// Second LayerNorm bias `[C]`.
    Ln2Bias,
    /// MLP expansion `[4C, C]`.
    FcWeight,
    /// MLP expansion bias `[4C]`.
    FcBias,
    /// MLP projection `[C, 4C]`.
    MlpProjWeight,
    /// MLP projection bias `[C]`.
    MlpProjBias,
    /// Final LayerNorm weight `[C]`.
    LnfWeight,
    /// Final LayerNorm bias `[C]`.
    LnfBias,
    /// Llama: token embedding `[V, C]` (the LM head too where tied).
    Embed,
    /// Llama: RMSNorm weight before attention `[C]`.
    AttnNorm,
    /// Llama: fused q, k, v projection `[(NH + 2 KVH) HS, C]`: q's rows, then k's, then v's.
    QkvProj,
    /// Llama: fused q, k, v bias (Qwen2) `[(NH + 2 KVH) HS]`.
    QkvProjBias,
    /// Llama: attention output projection `[C, C]`.
    OProj,
    /// Llama: RMSNorm weight before the MLP `[C]`.
    MlpNorm,
    /// Llama: fused gate and up projections `[2I, C]`: gate's rows, then up's.
    GateUp,
    /// Llama: the MLP's down projection `[C, I]`.
    Down,
    /// Llama: final RMSNorm weight `[C]`.
    Norm,
    /// Llama: untied LM head `[V, C]`.
    LmHead,
}

/// The per-block parameters, in order.
pub const LAYER_PARAMS: [ParamKind; 12] = [
    ParamKind::Ln1Weight,
    ParamKind::Ln1Bias,
    ParamKind::QkvWeight,
    ParamKind::QkvBias,
    ParamKind::AttnProjWeight,
    ParamKind::AttnProjBias,
    ParamKind::Ln2Weight,
    ParamKind::Ln2Bias,
    ParamKind::FcWeight,
    ParamKind::FcBias,
    ParamKind::MlpProjWeight,
    ParamKind::MlpProjBias,
];

/// A Llama block's parameters, in order: with q/k/v biases (Qwen2's), and without.
const LLAMA_LAYER_PARAMS: [ParamKind; 7] =
    [ParamKind::AttnNorm, ParamKind::QkvProj, ParamKind::QkvProjBias, ParamKind::OProj, ParamKind::MlpNorm, ParamKind::GateUp, ParamKind::Down];
const LLAMA_LAYER_PARAMS_UNBIASED: [ParamKind; 6] =
    [ParamKind::AttnNorm, ParamKind::QkvProj, ParamKind::OProj, ParamKind::MlpNorm, ParamKind::GateUp, ParamKind::Down];

/// The parameters of a model of `cfg`: those before the blocks, each block's, those after.
pub(crate) fn param_kinds(cfg: &GptConfig) -> [&'static [ParamKind]; 3] {
    use ParamKind::*;
    match cfg.llama() {
        None => [&[Wte, Wpe], &LAYER_PARAMS, &[LnfWeight, LnfBias]],
        Some(l) => {
            let layer: &[ParamKind] = if l.qkv_bias { &LLAMA_LAYER_PARAMS } else { &LLAMA_LAYER_PARAMS_UNBIASED };
            [&[Embed], layer, if l.tied { &[Norm] } else { &[Norm, LmHead] }]
        }
    }
}

/// Parameter tensors of a model of `cfg` (saturating: `n_layer` is not checked yet).
#[cfg(feature = "checkpoint")]
pub(crate) fn tensor_count(cfg: &GptConfig) -> usize {
    let [before, block, after] = param_kinds(cfg);
    (before.len() + after.len()).saturating_add(block.len().saturating_mul(cfg.n_layer))
}

impl ParamKind {
    /// The name's suffix after the prefix [`ParamInfo`]'s name puts before it
    /// (`transformer.h.{i}.`, `model.layers.{i}.`, ...).
    pub fn suffix(self) -> &'static str {
        use ParamKind::*;
        match self {
            Wte => "wte.weight",
            Wpe => "wpe.weight",
            Ln1Weight => "ln_1.weight",
            Ln1Bias => "ln_1.bias",
            QkvWeight => "attn.c_attn.weight",
            QkvBias => "attn.c_attn.bias",
            AttnProjWeight => "attn.c_proj.weight",
            AttnProjBias => "attn.c_proj.bias",
            Ln2Weight => "ln_2.weight",
            Ln2Bias => "ln_2.bias",
            FcWeight => "mlp.c_fc.weight",
            FcBias => "mlp.c_fc.bias",
            MlpProjWeight => "mlp.c_proj.weight",
            MlpProjBias => "mlp.c_proj.bias",
            LnfWeight => "ln_f.weight",
            LnfBias => "ln_f.bias",
            Embed => "embed_tokens.weight",
            AttnNorm => "input_layernorm.weight",
            QkvProj => "self_attn.qkv_proj.weight",
            QkvProjBias => "self_attn.qkv_proj.bias",
            OProj => "self_attn.o_proj.weight",
            MlpNorm => "post_attention_layernorm.weight",
            GateUp => "mlp.gate_up_proj.weight",
            Down => "mlp.down_proj.weight",
            Norm => "norm.weight",
            LmHead => "lm_head.weight",
        }
    }

    /// The tensor's shape: `[rows, cols]` for matrices, `[len, 1]` for vectors.
    pub fn shape(self, cfg: &GptConfig) -> [usize; 2] {
        use ParamKind::*;
        let c = cfg.n_embd;
        match self {
            Wte => [cfg.vocab_size, c],
            Wpe => [cfg.block_size, c],
            QkvWeight => [3 * c, c],
            QkvBias => [3 * c, 1],
            AttnProjWeight => [c, c],
            FcWeight => [4 * c, c],
            FcBias => [4 * c, 1],
            MlpProjWeight => [c, 4 * c],
            Ln1Weight | Ln1Bias | AttnProjBias | Ln2Weight | Ln2Bias | MlpProjBias | LnfWeight | LnfBias => [c, 1],
            Embed | LmHead => [cfg.vocab_size, c],
            QkvProj => [cfg.qkv_width(), c],
            QkvProjBias => [cfg.qkv_width(), 1],
            OProj => [c, c],
            GateUp => [cfg.fc_width(), c],
            Down => [c, cfg.hidden()],
            AttnNorm | MlpNorm | Norm => [c, 1],
        }
    }

    /// Whether the tensor is a matrix (2-D): AdamW decays exactly these.
    pub fn is_matrix(self) -> bool {
        use ParamKind::*;
        matches!(self, Wte | Wpe | QkvWeight | AttnProjWeight | FcWeight | MlpProjWeight | Embed | QkvProj | OProj | GateUp | Down | LmHead)
    }

    /// Whether the tensor belongs to the Llama family's models.
    pub fn is_llama(self) -> bool {
        use ParamKind::*;
        matches!(self, Embed | AttnNorm | QkvProj | QkvProjBias | OProj | MlpNorm | GateUp | Down | Norm | LmHead)
    }

    /// Whether the tensor is a norm's weight (initialised to 1).
    pub fn is_norm_weight(self) -> bool {
        use ParamKind::*;
        matches!(self, Ln1Weight | Ln2Weight | LnfWeight | AttnNorm | MlpNorm | Norm)
    }

    /// Whether the tensor is a block's output projection into the residual stream (GPT-2's
    /// scaled initialisation).
    pub fn is_residual_projection(self) -> bool {
        use ParamKind::*;
        matches!(self, AttnProjWeight | MlpProjWeight | OProj | Down)
    }
}

/// One parameter tensor: what it is and where it lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamInfo {
    /// Which tensor.
    pub kind: ParamKind,
    /// The block it belongs to, `None` for embeddings, the final norm and the head.
    pub layer: Option<usize>,
    /// Where it lives in the params arena (and in grads, adam_m, adam_v).
    pub span: Span,
    /// `[rows, cols]`; vectors have `cols == 1`.
    pub shape: [usize; 2],
}

impl ParamInfo {
    /// Number of dimensions as nanoGPT stores the tensor (1 or 2).
    pub fn ndim(&self) -> usize {
        if self.kind.is_matrix() {
            2
        } else {
            1
        }
    }
}

impl fmt::Display for ParamInfo {
    /// The `state_dict` name: nanoGPT's for GPT-2 (`transformer.h.3.attn.c_attn.weight`),
    /// Hugging Face Llama's for the Llama family, the fused q/k/v and gate/up projections
    /// named as Phi-3 names them (`model.layers.3.self_attn.qkv_proj.weight`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.layer, self.kind.is_llama()) {
            (Some(l), false) => write!(f, "transformer.h.{l}.{}", self.kind.suffix()),
            (None, false) => write!(f, "transformer.{}", self.kind.suffix()),
            (Some(l), true) => write!(f, "model.layers.{l}.{}", self.kind.suffix()),
            (None, true) if self.kind == ParamKind::LmHead => f.write_str(self.kind.suffix()),
            (None, true) => write!(f, "model.{}", self.kind.suffix()),
        }
    }
}

/// The activations saved by one block's forward pass, `[rows]` shapes with `N = B*T`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerActs {
    /// LN1 output `[N, C]`.
    pub ln1: Span,
    /// LN1 row means `[N]` (empty for RMSNorm).
    pub ln1_mean: Span,
    /// LN1 row reciprocal standard deviations `[N]`.
    pub ln1_rstd: Span,
    /// Fused QKV `[N, (NH + 2 KVH) HS]` (GPT-2's `[N, 3C]`).
    pub qkv: Span,
    /// Attention output, heads concatenated `[N, C]`.
    pub atty: Span,
    /// Attention row log-sum-exp `[B, NH, T]`.
    pub lse: Span,
    /// Residual after attention `[N, C]`.
    pub res_mid: Span,
    /// LN2 output `[N, C]`.
    pub ln2: Span,
    /// LN2 row means `[N]` (empty for RMSNorm).
    pub ln2_mean: Span,
    /// LN2 row reciprocal standard deviations `[N]`.
    pub ln2_rstd: Span,
    /// MLP pre-activation `[N, 4C]` (SwiGLU's gate and up `[N, 2I]`); after a training
    /// forward, the activation's slopes there.
    pub fc_pre: Span,
    /// MLP activation output `[N, 4C]` (SwiGLU's `[N, I]`).
    pub fc_gelu: Span,
    /// Residual after the MLP `[N, C]`.
    pub res_out: Span,
}

/// Sizes of every tensor for one (config, batch, sequence) and their offsets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Plan {
    /// The model.
    pub config: GptConfig,
    /// Sequences per batch (`B`).
    pub batch: usize,
    /// Tokens per sequence (`T`), at most `config.block_size`.
    pub seq: usize,
    /// Activation checkpointing (see [`Plan::with_recompute`]).
    recompute: bool,
    /// 16-bit storage of the linear layers' inputs (see [`Plan::with_half_activations`]).
    half_activations: bool,
    /// Logits in use (see [`Plan::with_classes`]).
    classes: usize,
    /// Dropout's threshold (see [`crate::ops::dropout::threshold`]; 0: none) and seed (see
    /// [`Plan::with_dropout`]).
    dropout: (u32, u64),
    layer_params_len: usize,
    /// Elements of one block's activations (with recompute: of the one shared set, without
    /// the kept residual streams).
    layer_acts_len: usize,
    /// Where the blocks' kept inputs start (with recompute).
    kept_offset: usize,
    /// Where the head's activations start.
    head_offset: usize,
    /// Where the backward's scratch starts.
    scratch_offset: usize,
    params_len: usize,
    acts_len: usize,
}

/// Every activation span starts at a multiple of this many elements (256 bytes of `f32`):
/// a GPU can then bind each tensor on its own (WebGPU's storage-buffer offset alignment) and
/// CPU rows of whole cache lines start aligned.
pub const ACT_ALIGN: usize = 64;

/// `len` rounded up to a whole number of [`ACT_ALIGN`] blocks.
const fn aligned(len: usize) -> usize {
    len.div_ceil(ACT_ALIGN) * ACT_ALIGN
}

/// An upper bound on the elements of all arenas of a plan (the four parameter-shaped ones,
/// the activations with their scratch, the batch), computed in `u128` from sizes of at most
/// [`MAX_DIM`], where no product of them can overflow. It mirrors the layout below term by
/// term, with every alignment pad and kernel scratch rounded up, so the real layout (in
/// `usize`) never exceeds it.
fn arena_elements_bound(config: &GptConfig, batch: usize, seq: usize) -> u128 {
    let [c, v, block, layers, heads, b, t] =
        [config.n_embd, config.vocab_size, config.block_size, config.n_layer, config.n_head, batch, seq].map(|x| x as u128);
    // Each at most 3 * MAX_DIM^2 (the head size is at most C).
    let [qkv, hidden, fc] = [config.qkv_width(), config.hidden(), config.fc_width()].map(|x| x as u128);
    let (a, nr, kc) = (ACT_ALIGN as u128, crate::gemm::MAX_NR as u128, crate::gemm::KC as u128);
    let n = b * t;
    // Both embeddings and an untied head, whichever the model has.
    let params = (2 * v + block) * c + layers * ((qkv + c + fc) * c + c * hidden + qkv + fc + 6 * c) + 2 * c;
    let layer = n * (5 * c + qkv + fc + hidden) + 4 * n + b * heads * t + 14 * a;
    let head = n * c + 3 * n + n * v + 6 * a;
    // Each matmul's scratch (see `matmul::scratch_len`), all of them summed.
    let matmul: u128 = [(c, qkv), (c, c), (c, fc), (hidden, c), (c, v)].into_iter().map(|(k, m)| k * (m + nr) + m * (k + nr) + 2 * kc * (k + nr) + m * k).sum();
    let attention = 2 * b * t * (2 * c + heads * t) + t * c;
    let scratch = n * (3 * c + qkv + hidden) + matmul + attention + (n + 1) * (4 * c + fc + qkv) + 8 * a;
    4 * params + 2 * n + n * c + a + layers * layer + head + scratch
}

/// Hands out consecutive aligned spans.
struct Bump(usize);
impl Bump {
    fn take(&mut self, len: usize) -> Span {
        self.take_stored(len, false)
    }

    /// A span of `len` elements, stored as 16-bit floats (in `len / 2` arena elements) where
    /// `half`.
    fn take_stored(&mut self, len: usize, half: bool) -> Span {
        let s = Span { offset: self.0, len };
        self.0 += aligned(if half { len.div_ceil(2) } else { len });
        s
    }
}

impl Plan {
    /// Plans a model of `config` run on `batch` sequences of `seq` tokens.
    pub fn new(config: GptConfig, batch: usize, seq: usize) -> Result<Plan, ConfigError> {
        config.validate()?;
        check_size("batch size", batch, MAX_DIM)?;
        check_size("sequence length", seq, MAX_DIM)?;
        if seq > config.block_size {
            return Err(ConfigError::SequenceTooLong { seq, block_size: config.block_size });
        }
        // Every size below is a sum of terms of this bound, so none overflows once it fits.
        let bytes = 4 * arena_elements_bound(&config, batch, seq);
        if bytes > isize::MAX as u128 {
            return Err(ConfigError::TooLarge { bytes });
        }
        let layer_params_len = param_kinds(&config)[1].iter().map(|k| k.shape(&config)[0] * k.shape(&config)[1]).sum();
        let mut plan = Plan {
            config,
            batch,
            seq,
            recompute: false,
            half_activations: false,
            dropout: (0, 0),
            classes: config.vocab_size,
            layer_params_len,
            layer_acts_len: 0,
            kept_offset: 0,
            head_offset: 0,
            scratch_offset: 0,
            params_len: 0,
            acts_len: 0,
        };
        let last = *param_kinds(&config)[2].last().expect("every model has a final norm");
        plan.params_len = plan.param(last, None).span.end();
        Ok(plan.with_recompute(false))
    }

    /// This plan with activation checkpointing on or off. On, the blocks share one set of
    /// activations and only each block's input (the residual stream) is kept through the
    /// forward; the backward walk recomputes a block's forward from it just before the
    /// block's backward ([`crate::walk::backward`]). Losses and gradients keep their bits;
    /// a block's activations (about 16 values per token and channel) shrink to its input (1).
    /// The head's activations share the blocks' too: the head runs forward after the last
    /// block and backward before the first recompute.
    pub fn with_recompute(mut self, recompute: bool) -> Plan {
        self.recompute = recompute;
        let start = self.blocks_start();
        let layers = self.config.n_layer;
        let head_len = self.head_acts_at(0).losses.end().next_multiple_of(ACT_ALIGN);
        if recompute {
            let last = self.layer_acts(0).fc_gelu;
            self.layer_acts_len = aligned(last.offset + self.stored_len(last) - start);
            let shared = self.layer_acts_len.max(head_len);
            self.kept_offset = start + shared;
            self.head_offset = start;
            self.scratch_offset = self.kept_offset + layers * aligned(self.tokens() * self.config.n_embd);
        } else {
            self.layer_acts_len = aligned(self.layer_acts(0).res_out.end() - start);
            self.head_offset = start + layers * self.layer_acts_len;
            self.scratch_offset = self.head_offset + head_len;
        }
        self.acts_len = aligned(self.scratch().dropped.end());
        self
    }

    /// This plan with the linear layers' inputs and qkv (both LayerNorm outputs, qkv and the
    /// attention and GELU outputs of every block, the final LayerNorm's output) stored as
    /// 16-bit floats, in half the room: wgpu's f16 precision (f16) and CUDA's bf16 products
    /// (bf16), whose products round their operands so anyway (and whose attention reads qkv as
    /// autocast's does). A block's activations shrink from about 16 values per token and
    /// channel to 11. Spans keep their length in elements; [`Plan::is_half`] tells them apart
    /// and [`Plan::stored_len`] gives their room. The CPU runs no such plan.
    pub fn with_half_activations(mut self, half: bool) -> Plan {
        self.half_activations = half;
        self.with_recompute(self.recompute)
    }

    /// Whether activation `span` is stored as 16-bit floats (see
    /// [`Plan::with_half_activations`]).
    pub fn is_half(&self, span: Span) -> bool {
        if !self.half_activations || span.offset < self.blocks_start() {
            return false;
        }
        // Only the block whose activations hold the span's offset can have it (executors ask
        // for every tensor they touch).
        let layers = if self.recompute { 1 } else { self.config.n_layer };
        let l = (span.offset - self.blocks_start()) / self.layer_acts_len;
        let in_block = l < layers && {
            let a = self.layer_acts(l);
            [a.ln1, a.qkv, a.atty, a.ln2, a.fc_gelu].contains(&span)
        };
        in_block || span == self.head_acts().lnf
    }

    /// Arena elements activation `span` occupies: its length, half of it stored as 16-bit
    /// floats.
    pub fn stored_len(&self, span: Span) -> usize {
        if self.is_half(span) {
            span.len.div_ceil(2)
        } else {
            span.len
        }
    }

    /// This plan with dropout `p` (nanoGPT's `dropout`) in training walks, the masks drawn
    /// from the run's `seed` (its [`DROPOUT`](crate::rng::stream::DROPOUT) stream; see
    /// [`crate::ops::dropout`]): the tape gets dropout sites on the
    /// embedding, the attention probabilities and both residual branches of every block, and
    /// the scratch an `[N, C]` tensor for a dropped branch. `p = 0` is the plan without
    /// dropout, bit for bit. Evaluation and sampling walks never drop.
    pub fn with_dropout(mut self, p: f64, seed: u64) -> Result<Plan, ConfigError> {
        if !(0.0..1.0).contains(&p) {
            return Err(ConfigError::Probability("dropout"));
        }
        // Attention's mask indices (B * NH * T * T) are 32-bit (as the GPU's).
        let attention = [self.config.n_head, self.seq, self.seq].iter().fold(self.batch as u128, |n, &d| n * d as u128);
        if p > 0.0 && attention > u32::MAX as u128 {
            let value = attention.min(usize::MAX as u128) as usize;
            return Err(ConfigError::OutOfRange { what: "attention scores per step (B * heads * T * T) with dropout", value, max: u32::MAX as usize });
        }
        let threshold = crate::ops::dropout::threshold(p);
        let seed = crate::rng::derive_seed(seed, crate::rng::stream::DROPOUT, 0);
        self.dropout = if threshold > 0 { (threshold, seed) } else { (0, 0) };
        Ok(self.with_recompute(self.recompute))
    }

    /// This plan for a tokenizer of `classes` tokens in a vocabulary padded to
    /// `config.vocab_size` (nanoGPT's 50304 for GPT-2's 50257, a multiple of 64 for the GEMMs):
    /// the padding's logits get no probability and no gradient, and sampling never draws them.
    pub fn with_classes(mut self, classes: usize) -> Result<Plan, ConfigError> {
        check_size("the tokenizer's vocabulary", classes, self.config.vocab_size)?;
        self.classes = classes;
        Ok(self)
    }

    /// Logits in use: the tokenizer's vocabulary (`config.vocab_size` unless padded; see
    /// [`Plan::with_classes`]).
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// Dropout site `id` (see [`crate::ops::dropout`]), or `None` without dropout.
    pub fn dropout_site(&self, id: u32) -> Option<crate::ops::dropout::Site> {
        (self.dropout.0 > 0).then_some(crate::ops::dropout::Site { id, threshold: self.dropout.0 })
    }

    /// The dropout probability (0: none).
    pub fn dropout(&self) -> f64 {
        self.dropout_site(0).map_or(0.0, |s| s.p())
    }

    /// The key of micro-batch `draw`'s masks (its number over the run).
    pub fn dropout_key(&self, draw: u64) -> crate::ops::dropout::DropoutKey {
        crate::ops::dropout::DropoutKey { seed: self.dropout.1, draw }
    }

    /// Whether the blocks' activations are recomputed in the backward (see
    /// [`Plan::with_recompute`]).
    pub fn recompute(&self) -> bool {
        self.recompute
    }

    /// Where the blocks' activations start.
    fn blocks_start(&self) -> usize {
        aligned(self.encoded().end())
    }

    /// The shape of every attention op of this plan.
    pub fn attention_shape(&self) -> AttentionShape {
        let rope = self.config.llama().map(|l| crate::ops::attention::Rope { theta: l.rope_theta, scaling: l.rope_scaling });
        AttentionShape {
            batch: self.batch,
            seq: self.seq,
            heads: self.config.n_head,
            kv_heads: self.config.kv_heads(),
            head_size: self.config.head_size(),
            rope,
        }
    }

    /// Tokens per step, `B * T`.
    pub fn tokens(&self) -> usize {
        self.batch * self.seq
    }

    /// Elements of each parameter-shaped arena (params, grads, adam_m, adam_v).
    pub fn params_len(&self) -> usize {
        self.params_len
    }

    /// Elements of the activations arena.
    pub fn acts_len(&self) -> usize {
        self.acts_len
    }

    /// Where parameter `kind` of `layer` lives. `layer` is ignored for non-block tensors.
    /// Panics when the model has no such tensor.
    pub fn param(&self, kind: ParamKind, layer: Option<usize>) -> ParamInfo {
        let cfg = &self.config;
        let shape = kind.shape(cfg);
        let [before, block, after] = param_kinds(cfg);
        let size = |k: &ParamKind| k.shape(cfg)[0] * k.shape(cfg)[1];
        // The offset of `kind` among `kinds` laid out from `start`.
        let within = |kinds: &[ParamKind], start: usize| {
            let at = kinds.iter().position(|&k| k == kind)?;
            Some(start + kinds[..at].iter().map(size).sum::<usize>())
        };
        let layers_start: usize = before.iter().map(size).sum();
        let (offset, layer) = match (within(before, 0), within(after, layers_start + cfg.n_layer * self.layer_params_len)) {
            (Some(offset), _) | (None, Some(offset)) => (offset, None),
            (None, None) => {
                let l = layer.expect("block parameters need a layer index");
                let offset = within(block, layers_start + l * self.layer_params_len).unwrap_or_else(|| panic!("a {:?} model has no {kind:?}", cfg.arch));
                (offset, Some(l))
            }
        };
        ParamInfo { kind, layer, span: Span { offset, len: shape[0] * shape[1] }, shape }
    }

    /// Every parameter tensor in `state_dict` order.
    pub fn params(&self) -> impl Iterator<Item = ParamInfo> + '_ {
        let [before, block, after] = param_kinds(&self.config);
        let head = before.iter().map(|&k| self.param(k, None));
        let blocks = (0..self.config.n_layer).flat_map(move |l| block.iter().map(move |&k| self.param(k, Some(l))));
        let tail = after.iter().map(|&k| self.param(k, None));
        head.chain(blocks).chain(tail)
    }

    /// Where the blocks' parameters start: after the token (and position) tables.
    pub fn blocks_params_start(&self) -> usize {
        param_kinds(&self.config)[0].iter().map(|k| k.shape(&self.config)[0] * k.shape(&self.config)[1]).sum()
    }

    /// The parameter tensors of one block, in order.
    pub fn layer_param_kinds(&self) -> &'static [ParamKind] {
        param_kinds(&self.config)[1]
    }

    /// The LM head's weight: the token embedding where tied.
    pub fn head_weight(&self) -> ParamInfo {
        match self.config.llama() {
            None => self.param(ParamKind::Wte, None),
            Some(l) => self.param(if l.tied { ParamKind::Embed } else { ParamKind::LmHead }, None),
        }
    }

    /// The token embedding.
    pub fn token_embedding(&self) -> ParamInfo {
        self.param(if self.config.llama().is_some() { ParamKind::Embed } else { ParamKind::Wte }, None)
    }

    /// Total number of parameters (the tied LM head counted once).
    pub fn num_params(&self) -> usize {
        self.params_len
    }

    /// Training FLOPs per token of the model at the plan's sequence length, what MFU divides
    /// (nanoGPT's and PaLM's count): 6 per parameter the products read, which is every one but
    /// the tables only looked up (GPT-2's position table, an untied token embedding), and
    /// 12 · layers · T · C for attention's.
    pub fn flops_per_token(&self) -> f64 {
        let c = &self.config;
        let head = self.head_weight().kind;
        let lookups: usize = param_kinds(c)[0].iter().filter(|&&k| k != head).map(|&k| self.param(k, None).span.len).sum();
        6.0 * (self.num_params() - lookups) as f64 + 12.0 * (c.n_layer * self.seq * c.n_embd) as f64
    }

    /// FLOPs per token that activation checkpointing adds: each block's forward runs again
    /// before its backward (2 × the blocks' parameters + 4 × layers × T × C); 0 without it.
    /// Hardware FLOPs (HFU's) are [`Plan::flops_per_token`] plus these.
    pub fn recomputed_flops_per_token(&self) -> f64 {
        let c = &self.config;
        if self.recompute() {
            2.0 * (c.n_layer * self.layer_params_len) as f64 + 4.0 * (c.n_layer * self.seq * c.n_embd) as f64
        } else {
            0.0
        }
    }

    /// The embedding output (residual stream before block 0) `[N, C]`.
    pub fn encoded(&self) -> Span {
        Span { offset: 0, len: self.tokens() * self.config.n_embd }
    }

    /// Activations of block `l` (with recompute, all blocks share them but for `res_out`).
    pub fn layer_acts(&self, l: usize) -> LayerActs {
        let (n, c, cfg) = (self.tokens(), self.config.n_embd, &self.config);
        let mut b = Bump(self.blocks_start() + if self.recompute { 0 } else { l * self.layer_acts_len });
        let half = self.half_activations;
        // RMSNorm saves no means.
        let means = if cfg.llama().is_some() { 0 } else { n };
        LayerActs {
            ln1: b.take_stored(n * c, half),
            ln1_mean: b.take(means),
            ln1_rstd: b.take(n),
            qkv: b.take_stored(n * cfg.qkv_width(), half),
            atty: b.take_stored(n * c, half),
            lse: b.take(self.batch * self.config.n_head * self.seq),
            res_mid: b.take(n * c),
            ln2: b.take_stored(n * c, half),
            ln2_mean: b.take(means),
            ln2_rstd: b.take(n),
            fc_pre: b.take(n * cfg.fc_width()),
            fc_gelu: b.take_stored(n * cfg.hidden(), half),
            res_out: if self.recompute { Span { offset: self.kept_offset + l * aligned(n * c), len: n * c } } else { b.take(n * c) },
        }
    }

    /// The residual stream entering block `l` (`encoded` for block 0).
    pub fn residual_in(&self, l: usize) -> Span {
        if l == 0 {
            self.encoded()
        } else {
            self.layer_acts(l - 1).res_out
        }
    }

    /// Activations after the last block.
    pub fn head_acts(&self) -> HeadActs {
        self.head_acts_at(self.head_offset)
    }

    fn head_acts_at(&self, offset: usize) -> HeadActs {
        let (n, c, v) = (self.tokens(), self.config.n_embd, self.config.vocab_size);
        let mut b = Bump(offset);
        let means = if self.config.llama().is_some() { 0 } else { n };
        HeadActs { lnf: b.take_stored(n * c, self.half_activations), lnf_mean: b.take(means), lnf_rstd: b.take(n), logits: b.take(n * v), losses: b.take(n) }
    }

    /// The activation arena as consecutive parts, in order, that no activation or scratch
    /// span crosses, each with what it holds: a device whose buffers cannot hold the whole
    /// arena holds it in several buffers of whole parts. The parts: the embedding output;
    /// each block's activations (with recompute, the blocks' shared ones, then each block's
    /// kept input); the head's; each backward scratch tensor.
    pub fn arena_parts(&self) -> impl Iterator<Item = (Span, &'static str)> {
        let start = self.blocks_start();
        let between = |from: usize, to: usize| Span { offset: from, len: to - from };
        let (blocks_from, block_len, shared, head) = if self.recompute {
            let shared = (between(start, self.kept_offset), "the blocks' and the head's shared activations");
            (self.kept_offset, aligned(self.tokens() * self.config.n_embd), Some(shared), None)
        } else {
            let head = (between(self.head_offset, self.scratch_offset), "the head's activations (the logits)");
            (start, self.layer_acts_len, None, Some(head))
        };
        let what = if self.recompute { "one block's input" } else { "one block's activations" };
        let blocks = (0..self.config.n_layer).map(move |l| (Span { offset: blocks_from + l * block_len, len: block_len }, what));
        let scratch = self.scratch().spans().map(|s| (Span { offset: s.offset, len: aligned(s.len) }, "a backward scratch tensor"));
        core::iter::once((between(0, start), "the embedding output")).chain(shared).chain(blocks).chain(head).chain(scratch).filter(|(span, _)| span.len > 0)
    }

    /// The largest scratch of any matmul (see [`crate::ops::matmul::scratch_len`]).
    fn matmul_scratch_len(&self) -> usize {
        let (c, cfg) = (self.config.n_embd, &self.config);
        // Every matmul's weight: qkv [3C, C], [C, C], fc [4C, C], [C, 4C], [V, C] (GPT-2).
        [(c, cfg.qkv_width()), (c, c), (c, cfg.fc_width()), (cfg.hidden(), c), (c, cfg.vocab_size)]
            .into_iter()
            .map(|(k, m)| crate::ops::matmul::scratch_len(k, m))
            .max()
            .unwrap_or(0)
    }

    /// Backward scratch buffers.
    pub fn scratch(&self) -> Scratch {
        let nc = self.tokens() * self.config.n_embd;
        let mut b = Bump(self.scratch_offset);
        let wt = self.matmul_scratch_len();
        let attention = self.attention_shape().scratch_len();
        // The widest product whose backward passes over row blocks (a bias, an activation).
        let cfg = &self.config;
        let partials = crate::ops::row_blocks::blocks(self.tokens()) * (4 * cfg.n_embd).max(cfg.fc_width()).max(cfg.qkv_width());
        let dropped = if self.dropout.0 > 0 { nc } else { 0 };
        Scratch {
            dres: b.take(nc),
            dbig: b.take(self.tokens() * self.config.hidden().max(self.config.qkv_width())),
            dsmall: b.take(nc),
            wt: b.take(wt),
            attention: b.take(attention),
            partials: b.take(partials),
            dropped: b.take(dropped),
        }
    }
}

/// Activations of the final LayerNorm and the LM head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadActs {
    /// Final LayerNorm output `[N, C]`.
    pub lnf: Span,
    /// Its row means `[N]`.
    pub lnf_mean: Span,
    /// Its row reciprocal standard deviations `[N]`.
    pub lnf_rstd: Span,
    /// Logits `[N, V]`; after a training forward they hold d(loss)/d(logits).
    pub logits: Span,
    /// Per-position cross-entropy `[N]`.
    pub losses: Span,
}

/// Gradient buffers reused by every block during backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scratch {
    /// Gradient of the residual stream `[N, C]`, accumulated through the blocks.
    pub dres: Span,
    /// Gradient of a wide activation: the MLP's hidden one `[N, 4C]` (`[N, I]`) or QKV.
    pub dbig: Span,
    /// Gradient of a narrow activation: a LayerNorm output or the attention output `[N, C]`.
    pub dsmall: Span,
    /// A matmul's scratch (see [`crate::ops::matmul::scratch_len`]; the largest of any
    /// matmul): its weight packed into the GEMM's panels and, in backward, the second half of
    /// its weight gradient's sum over rows `[M, K]`.
    pub wt: Span,
    /// Attention's per-(batch, head) tiles (see [`AttentionShape::scratch_len`]).
    pub attention: Span,
    /// Per-row-block column sums of the bias and LayerNorm gradients (see
    /// [`crate::ops::row_blocks`]): `blocks(N) x` the widest biased or activated product.
    pub partials: Span,
    /// With dropout, a branch before its dropout in a training forward and its gradient
    /// after it in backward `[N, C]` (empty without dropout).
    pub dropped: Span,
}

impl Scratch {
    /// Every scratch tensor, in arena order.
    pub fn spans(&self) -> [Span; 7] {
        [self.dres, self.dbig, self.dsmall, self.wt, self.attention, self.partials, self.dropped]
    }
}

/// `params` of a model of `from` as a model of `to`, which differs in its tables' rows: the
/// position table cut to a shorter context (nanoGPT's `crop_block_size`: a model fine-tuned on
/// shorter windows than it was trained on), the token table padded with zero rows; every
/// other tensor as it is.
#[cfg(feature = "alloc")]
pub fn resize_tables(params: &[f32], from: GptConfig, to: GptConfig) -> Result<alloc::vec::Vec<f32>, ConfigError> {
    let (from, to) = (Plan::new(from, 1, 1)?, Plan::new(to, 1, 1)?);
    let mut out = try_vec("parameters", to.params_len(), 0f32)?;
    for (a, b) in from.params().zip(to.params()) {
        let kept = a.span.len.min(b.span.len);
        out[b.span.offset..b.span.offset + kept].copy_from_slice(&params[a.span.offset..a.span.offset + kept]);
    }
    Ok(out)
}

/// `len` copies of `value` in a new vector, or [`ConfigError::OutOfMemory`] naming `what`
/// when the allocator refuses (where `vec!` would abort the process).
#[cfg(feature = "alloc")]
pub fn try_vec<T: Clone>(what: &'static str, len: usize, value: T) -> Result<alloc::vec::Vec<T>, ConfigError> {
    let mut v = alloc::vec::Vec::new();
    v.try_reserve_exact(len).map_err(|_| ConfigError::OutOfMemory { what, bytes: len.saturating_mul(core::mem::size_of::<T>()) })?;
    v.resize(len, value);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rng;

    fn config(vocab_size: usize, block_size: usize, n_layer: usize, n_head: usize, n_embd: usize) -> GptConfig {
        GptConfig::gpt2(vocab_size, block_size, n_layer, n_head, n_embd)
    }

    /// MFU's FLOPs per token are nanoGPT's: GPT-2 124M's 6 · 123,653,376 (its count without
    /// the position table) + 12 · 12 · 1024 · 768; a Llama-family model counts its token
    /// embedding only where it is also the head.
    #[test]
    fn flops_per_token_count_the_parameters_products_read() {
        let gpt2 = Plan::new(config(50257, 1024, 12, 12, 768), 1, 1024).unwrap();
        assert_eq!(gpt2.num_params(), 124_439_808);
        assert_eq!(gpt2.flops_per_token(), 6.0 * 123_653_376.0 + 12.0 * 12.0 * 1024.0 * 768.0);
        for tied in [true, false] {
            let llama =
                crate::config::Llama { n_kv_head: 1, intermediate_size: 24, norm_eps: 1e-5, rope_theta: 1e4, rope_scaling: None, qkv_bias: false, tied };
            let plan = Plan::new(GptConfig { arch: crate::config::Arch::Llama(llama), ..config(50, 8, 2, 2, 8) }, 1, 8).unwrap();
            let lookups = if tied { 0 } else { 50 * 8 };
            assert_eq!(plan.flops_per_token(), 6.0 * (plan.num_params() - lookups) as f64 + 12.0 * 2.0 * 8.0 * 8.0);
        }
    }

    /// The bound holds every arena of real layouts, odd sizes included (the test profile
    /// checks every `usize` operation of the layout for overflow).
    #[test]
    fn the_bound_covers_every_arena() {
        let mut rng = Rng::new(7);
        let mut pick = |max: usize| 1 + rng.below(max);
        for _ in 0..300 {
            let heads = pick(6);
            let cfg = config(pick(300), pick(80), pick(4), heads, heads * pick(20));
            let (batch, seq) = (pick(9), pick(cfg.block_size));
            let plan = Plan::new(cfg, batch, seq).unwrap();
            let real = 4 * plan.params_len() + plan.acts_len() + 2 * plan.tokens();
            assert!(real as u128 <= arena_elements_bound(&cfg, batch, seq), "{cfg:?} batch {batch} seq {seq}");
            assert_eq!(plan.params().last().unwrap().span.end(), plan.params_len());
        }
    }

    /// Every span of `plan`'s activation arena, each with whether it is f16, in groups whose
    /// spans live at once (with recompute the head shares the blocks' room; the blocks'
    /// inputs stay).
    fn span_groups(plan: &Plan) -> Vec<Vec<(Span, bool)>> {
        let h = plan.head_acts();
        let head = [(plan.encoded(), false), (h.lnf, true), (h.lnf_mean, false), (h.lnf_rstd, false), (h.logits, false), (h.losses, false)];
        let mut blocks = vec![(plan.encoded(), false)];
        for l in 0..plan.config.n_layer {
            let a = plan.layer_acts(l);
            let kept = [a.ln1_mean, a.ln1_rstd, a.lse, a.res_mid, a.ln2_mean, a.ln2_rstd, a.fc_pre, a.res_out];
            blocks.extend([a.ln1, a.qkv, a.atty, a.ln2, a.fc_gelu].map(|s| (s, true)).into_iter().chain(kept.map(|s| (s, false))));
        }
        let scratch = plan.scratch().spans().map(|s| (s, false));
        if plan.recompute() {
            let kept = (0..plan.config.n_layer).map(|l| (plan.layer_acts(l).res_out, false));
            vec![blocks.iter().chain(&scratch).copied().collect(), head.iter().chain(&scratch).copied().chain(kept).collect()]
        } else {
            vec![blocks.iter().chain(&scratch).chain(&head[1..]).copied().collect()]
        }
    }

    /// The arena's parts tile it in order, and every span (odd sizes, f16 or not, recompute,
    /// dropout) lies within one part.
    #[test]
    fn arena_parts_tile_the_arena_and_hold_whole_spans() {
        for (recompute, half, dropout) in [(false, false, 0.0), (true, false, 0.1), (false, true, 0.1), (true, true, 0.0)] {
            let plan = Plan::new(config(65, 16, 3, 3, 9), 3, 11).unwrap().with_dropout(dropout, 1).unwrap();
            let plan = plan.with_recompute(recompute).with_half_activations(half);
            let parts: Vec<Span> = plan.arena_parts().map(|(span, _)| span).collect();
            assert_eq!(parts[0].offset, 0);
            assert!(parts.windows(2).all(|w| w[0].end() == w[1].offset), "{parts:?}");
            assert_eq!(parts.last().unwrap().end(), plan.acts_len());
            for (s, _) in span_groups(&plan).into_iter().flatten().filter(|(s, _)| s.len > 0) {
                let end = s.offset + plan.stored_len(s);
                assert!(parts.iter().any(|p| p.offset <= s.offset && end <= p.end()), "{s:?} crosses a part (recompute {recompute}, f16 {half})");
            }
        }
    }

    /// With f16 activations the linear layers' inputs and qkv (odd lengths here) take half their
    /// elements' room, the others keep theirs, and no two activations share an element.
    #[test]
    fn half_activations_take_half_the_room_and_stay_apart() {
        for recompute in [false, true] {
            let plan = Plan::new(config(65, 16, 3, 3, 9), 3, 11).unwrap().with_recompute(recompute);
            let half = plan.with_half_activations(true);
            assert!(!plan.is_half(plan.layer_acts(0).ln1));
            assert!(half.acts_len() < plan.acts_len(), "recompute {recompute}");
            for group in span_groups(&half) {
                let mut ranges: Vec<(usize, usize)> = Vec::new();
                for (s, is_half) in group {
                    assert_eq!(half.is_half(s), is_half, "{s:?}");
                    assert_eq!(half.stored_len(s), if is_half { s.len.div_ceil(2) } else { s.len });
                    assert_eq!(s.offset % ACT_ALIGN, 0);
                    ranges.push((s.offset, s.offset + half.stored_len(s)));
                }
                // With recompute the blocks share one set of activations.
                ranges.sort();
                ranges.dedup();
                for w in ranges.windows(2) {
                    assert!(w[0].1 <= w[1].0, "{:?} and {:?} overlap (recompute {recompute})", w[0], w[1]);
                }
                assert!(ranges.last().unwrap().1 <= half.acts_len());
            }
        }
    }

    /// Sizes past MAX_DIM, and plans whose arenas would not fit the address space, are errors
    /// before any arithmetic on them can overflow.
    #[test]
    fn huge_sizes_are_errors_not_overflows() {
        let big = config(65, 64, 1_000_000_000, 4, 128);
        assert_eq!(Plan::new(big, 1, 1), Err(ConfigError::OutOfRange { what: "n_layer", value: 1_000_000_000, max: MAX_DIM }));
        let wide = config(MAX_DIM, MAX_DIM, MAX_DIM, MAX_DIM, MAX_DIM);
        let err = Plan::new(wide, MAX_DIM, MAX_DIM).unwrap_err();
        assert!(matches!(err, ConfigError::TooLarge { bytes } if bytes > 1 << 100), "{err:?}");
        assert!(err.to_string().contains("address space"));
        assert_eq!(Plan::new(config(65, 64, 2, 2, 32), usize::MAX, 1), Err(ConfigError::OutOfRange { what: "batch size", value: usize::MAX, max: MAX_DIM }));
        assert_eq!(Plan::new(config(65, 64, 2, 2, 32), 0, 1), Err(ConfigError::Zero("batch size")));
    }
}
