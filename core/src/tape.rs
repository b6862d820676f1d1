//! The autograd tape: the model recorded once as a list of fused ops over arena spans.
//!
//! [`crate::walk`] runs it forward and backward on any [`crate::walk::Executor`], each op
//! with its hand-written backward from [`crate::ops`]. Activation gradients live in three
//! reused scratch buffers (see [`crate::plan::Scratch`]); parameter gradients accumulate into
//! the grads arena at the parameters' offsets.
//!
//! Stable: recording ([`record`], [`tape_len`], [`Op::BLANK`] to fill a caller's buffer).
//! Unstable: the contents of [`Op`] (the op list changes with the model), public for the
//! executors and the tests.

use crate::config::ConfigError;
use crate::ops::attention::AttentionShape;
use crate::ops::dropout::Site;
use crate::ops::matmul::Epilogue;
use crate::plan::{ParamKind, Plan, Span};
use core::ops::Range;

/// One fused op. Fields named after parameters are spans of the params arena (and of the
/// grads arena at the same offsets); all others are spans of the activations arena.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// Token + position embedding of the step's tokens.
    Embedding {
        /// Token embedding `[V, C]`.
        wte: Span,
        /// Position embedding `[block, C]` (GPT-2's).
        wpe: Option<Span>,
        /// Output `[N, C]`.
        out: Span,
        /// Gradient of `out`.
        dout: Span,
        /// Sequence length `T` (row `i` is position `i % T`).
        seq: usize,
        /// Dropout on `out` in training walks.
        dropout: Option<Dropped>,
    },
    /// LayerNorm of `x` into `out`.
    LayerNorm {
        /// Input `[N, C]`.
        x: Span,
        /// Gradient of `x` (accumulated).
        dx: Span,
        /// Output `[N, C]`.
        out: Span,
        /// Gradient of `out`.
        dout: Span,
        /// Saved row means `[N]`.
        mean: Span,
        /// Saved row reciprocal standard deviations `[N]`.
        rstd: Span,
        /// Weight `[C]`.
        weight: Span,
        /// Bias `[C]`.
        bias: Span,
    },
    /// RMSNorm of `x` into `out` (the Llama family).
    RmsNorm {
        /// Input `[N, C]`.
        x: Span,
        /// Gradient of `x` (accumulated).
        dx: Span,
        /// Output `[N, C]`.
        out: Span,
        /// Gradient of `out`.
        dout: Span,
        /// Saved row reciprocal root mean squares `[N]`.
        rstd: Span,
        /// Weight `[C]`.
        weight: Span,
        /// Added to the mean square.
        eps: f64,
    },
    /// `out = epilogue(x·wᵀ + bias)`.
    Matmul {
        /// Input `[N, K]`.
        x: Span,
        /// Gradient of `x` (overwritten), if needed.
        dx: Option<Span>,
        /// Weight `[M, K]`.
        weight: Span,
        /// Bias `[M]`.
        bias: Option<Span>,
        /// Output `[N, M]`.
        out: Span,
        /// Gradient of `out` (consumed: GELU backward works in place); with SwiGLU, its `pre`
        /// (see [`Epilogue::SwiGlu`]), `out`'s gradient being [`Op::Matmul::dh`].
        dout: Span,
        /// With SwiGLU, the gradient of `out` `[N, M/2]`.
        dh: Option<Span>,
        /// Fused epilogue (a residual's gradient is `dout` itself).
        epilogue: Epilogue<Span, Span>,
        /// Input width `K`.
        k: usize,
        /// Output width `M`.
        m: usize,
        /// Dropout on `x·wᵀ + bias` (before a residual add) in training walks.
        dropout: Option<Dropped>,
    },
    /// Causal self-attention over fused QKV.
    Attention {
        /// Input `[N, (NH + 2 KVH) HS]`.
        qkv: Span,
        /// Gradient of `qkv` (overwritten).
        dqkv: Span,
        /// Output `[N, C]`.
        out: Span,
        /// Gradient of `out`.
        dout: Span,
        /// Saved log-sum-exp `[B, NH, T]`.
        lse: Span,
        /// Shape.
        shape: AttentionShape,
        /// Dropout on the attention probabilities in training walks.
        dropout: Option<Site>,
    },
    /// Softmax cross-entropy of `logits` against the step's targets.
    CrossEntropy {
        /// Logits `[N, V]`, replaced by their gradient in a training forward.
        logits: Span,
        /// Per-position losses `[N]`.
        losses: Span,
        /// Logits in use (the tokenizer's vocabulary); the rest are padding.
        classes: usize,
    },
}

/// Dropout on an op's output in training walks ([`crate::ops::dropout`]): the op writes
/// `scratch`, the dropout reads it; in backward the dropout writes the op's output gradient
/// there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dropped {
    /// The dropout site.
    pub site: Site,
    /// `[N, C]` scratch (the plan's [`crate::plan::Scratch::dropped`]).
    pub scratch: Span,
}

/// Which walk of the tape an op event belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// [`crate::walk::forward`].
    Forward,
    /// [`crate::walk::backward`].
    Backward,
    /// A block's forward run again inside [`crate::walk::backward`] (activation
    /// checkpointing: [`crate::Plan::with_recompute`]).
    Recompute,
}

impl Pass {
    /// The walk's name in traces.
    pub fn name(self) -> &'static str {
        match self {
            Pass::Forward => "forward",
            Pass::Backward => "backward",
            Pass::Recompute => "recompute",
        }
    }
}

/// The phases of a training step ([`crate::train::Trainer::train_step_observed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Drawing a batch.
    Data,
    /// A forward pass with the fused loss.
    Forward,
    /// A backward pass.
    Backward,
    /// Summing the gradients and the loss over data-parallel ranks
    /// ([`crate::train::Ranks`]; a process on its own skips it).
    Allreduce,
    /// The global gradient norm.
    GradNorm,
    /// AdamW (with the clip factor folded in).
    Optimizer,
    /// A device: drawing and writing the batches, encoding and submitting the step.
    Submit,
    /// A device: waiting for the step to finish and reading its results back.
    DeviceWait,
}

impl Phase {
    /// Every phase, in the order declared (`phase as usize` indexes it).
    pub const ALL: [Phase; 8] =
        [Phase::Data, Phase::Forward, Phase::Backward, Phase::Allreduce, Phase::GradNorm, Phase::Optimizer, Phase::Submit, Phase::DeviceWait];

    /// The phase's name in metrics and traces.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Data => "data",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Allreduce => "allreduce",
            Phase::GradNorm => "grad_norm",
            Phase::Optimizer => "optimizer",
            Phase::Submit => "submit",
            Phase::DeviceWait => "device_wait",
        }
    }
}

/// Told when each phase of a training step and each op of a tape walk starts and ends (for
/// timing, tracing and profiling: the core has no clock, the caller's observer does). Every
/// method does nothing unless overridden; `()` observes nothing.
pub trait Observer {
    /// Op `index` of the tape is about to run.
    fn begin(&mut self, _pass: Pass, _index: usize, _op: &Op) {}
    /// Op `index` has finished.
    fn end(&mut self, _pass: Pass, _index: usize, _op: &Op) {}
    /// A phase of a training step is about to start.
    fn phase_begin(&mut self, _phase: Phase) {}
    /// A phase of a training step has finished.
    fn phase_end(&mut self, _phase: Phase) {}
    /// Whether it wants the kernel times of a device's steps ([`Observer::kernel_times`]): a
    /// device then times every kernel, which costs.
    fn wants_kernel_times(&self) -> bool {
        false
    }
    /// The kernels of the step just taken on a device, as the device timed them (after its
    /// `DeviceWait` phase).
    fn kernel_times(&mut self, _kernels: &[KernelTime]) {}
}

/// What one kernel of a device does, for its achieved rates in traces: the floating-point
/// operations of its products (0 for kernels without any) and the bytes of the tensors it
/// reads and writes (each counted once: the least traffic it can have).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Work {
    /// Floating-point operations (a multiply-add is two).
    pub flops: f64,
    /// Bytes of the tensors it reads and writes.
    pub bytes: f64,
}

impl Work {
    /// A kernel without products moving `floats` 4-byte elements.
    pub fn moving(floats: usize) -> Work {
        Work { flops: 0.0, bytes: 4.0 * floats as f64 }
    }
}

/// One kernel of a step on a device, as the device's timestamps measured it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelTime {
    /// The part of the step: "forward", "backward" or "update".
    pub pass: &'static str,
    /// The tape op the kernel belongs to (e.g. "attention"), or the update's step.
    pub op: &'static str,
    /// The kernel's entry point.
    pub kernel: &'static str,
    /// Start, ns, on the device's clock from the step's first kernel.
    pub start_ns: f64,
    /// End, ns.
    pub end_ns: f64,
    /// Floating-point operations it did (a multiply-add is two), for its achieved FLOP/s.
    pub flops: f64,
    /// Bytes of the tensors it bound, for its achieved GB/s.
    pub bytes: f64,
}

impl Observer for () {}

impl Op {
    /// The op family's name, as its kernel file is named in `ops/`.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Embedding { .. } => "embedding",
            Op::LayerNorm { .. } => "layernorm",
            Op::RmsNorm { .. } => "rmsnorm",
            Op::Matmul { epilogue: Epilogue::Gelu { .. }, .. } => "matmul+gelu",
            Op::Matmul { epilogue: Epilogue::SwiGlu { .. }, .. } => "matmul+swiglu",
            Op::Matmul { epilogue: Epilogue::Residual { .. }, .. } => "matmul+residual",
            Op::Matmul { .. } => "matmul",
            Op::Attention { .. } => "attention",
            Op::CrossEntropy { .. } => "cross_entropy",
        }
    }

    /// The parameter tensors the op reads (whose gradients its backward writes).
    pub fn params(&self) -> [Option<Span>; 2] {
        match *self {
            Op::Embedding { wte, wpe, .. } => [Some(wte), wpe],
            Op::LayerNorm { weight, bias, .. } => [Some(weight), Some(bias)],
            Op::RmsNorm { weight, .. } => [Some(weight), None],
            Op::Matmul { weight, bias, .. } => [Some(weight), bias],
            Op::Attention { .. } | Op::CrossEntropy { .. } => [None, None],
        }
    }

    /// The op's work in `pass` as (FLOPs, bytes of its tensors read and written): the
    /// products' multiply-adds counted as 2 FLOPs, causal attention's half of the scores, the
    /// element-wise ops' tensors once each. An estimate for traces (achieved FLOP/s and GB/s),
    /// not a measurement; a recomputed forward is a forward.
    pub fn work(&self, pass: Pass) -> (f64, f64) {
        let f = |n: usize| n as f64;
        let backward = pass == Pass::Backward;
        match *self {
            Op::Embedding { out, .. } => (f(out.len), 4.0 * f(2 * out.len)),
            Op::LayerNorm { x, .. } if backward => (10.0 * f(x.len), 4.0 * f(4 * x.len)),
            Op::LayerNorm { x, .. } => (8.0 * f(x.len), 4.0 * f(2 * x.len)),
            Op::RmsNorm { x, .. } if backward => (8.0 * f(x.len), 4.0 * f(4 * x.len)),
            Op::RmsNorm { x, .. } => (4.0 * f(x.len), 4.0 * f(2 * x.len)),
            Op::Matmul { x, dx, k, m, .. } => {
                let (n, w) = (f(x.len / k.max(1)), f(k * m));
                let product = 2.0 * n * f(k) * f(m);
                match (backward, dx) {
                    // The weight's gradient, and the input's where it is needed.
                    (true, Some(_)) => (2.0 * product, 4.0 * (2.0 * f(x.len) + n * f(m) + 2.0 * w)),
                    (true, None) => (product, 4.0 * (f(x.len) + n * f(m) + 2.0 * w)),
                    (false, _) => (product, 4.0 * (f(x.len) + n * f(m) + w)),
                }
            }
            Op::Attention { shape, qkv, .. } => {
                let scores = f(shape.batch * shape.heads) * f(shape.seq) * f(shape.seq + 1) / 2.0;
                let per_pass = 4.0 * scores * f(shape.head_size);
                (if backward { 2.0 * per_pass } else { per_pass }, 4.0 * f(qkv.len) * if backward { 3.0 } else { 4.0 / 3.0 })
            }
            Op::CrossEntropy { logits, .. } => (5.0 * f(logits.len), 4.0 * f(2 * logits.len)),
        }
    }

    /// The op's main shape, `[rows, in] -> [rows, out]` style, written to `f`.
    pub fn describe_shape(&self, f: &mut dyn core::fmt::Write) -> core::fmt::Result {
        match *self {
            Op::Embedding { out, wte, .. } => write!(f, "tokens -> [{}], vocab x C = {}", out.len, wte.len),
            Op::LayerNorm { x, mean, .. } => write!(f, "[{} x {}]", mean.len, x.len / mean.len.max(1)),
            Op::RmsNorm { x, rstd, .. } => write!(f, "[{} x {}]", rstd.len, x.len / rstd.len.max(1)),
            Op::Matmul { x, k, m, .. } => write!(f, "[{} x {}] x [{} x {}]ᵀ", x.len / k.max(1), k, m, k),
            Op::Attention { shape, .. } => {
                write!(f, "B {} T {} heads {} x {}", shape.batch, shape.seq, shape.heads, shape.head_size)
            }
            Op::CrossEntropy { logits, losses, .. } => write!(f, "[{} x {}]", losses.len, logits.len / losses.len.max(1)),
        }
    }

    /// A placeholder to fill a tape buffer with before [`record`].
    pub const BLANK: Op = Op::CrossEntropy { logits: Span { offset: 0, len: 0 }, losses: Span { offset: 0, len: 0 }, classes: 0 };
}

/// Number of ops in the tape of `plan`.
pub fn tape_len(plan: &Plan) -> usize {
    OPS_BEFORE_BLOCKS + OPS_PER_BLOCK * plan.config.n_layer + 3
}

/// Ops of one transformer block: LayerNorm, QKV, attention, projection + residual,
/// LayerNorm, MLP expansion + GELU, MLP projection + residual.
const OPS_PER_BLOCK: usize = 7;
/// Ops before the first block: the embedding.
const OPS_BEFORE_BLOCKS: usize = 1;

/// Where block `layer`'s ops sit in the tape; the block reads only its input, the residual
/// stream [`Plan::residual_in`]`(layer)`, and writes the next block's.
pub fn block_ops(layer: usize) -> Range<usize> {
    let start = OPS_BEFORE_BLOCKS + OPS_PER_BLOCK * layer;
    start..start + OPS_PER_BLOCK
}

/// The block tape op `index` belongs to (`None` for the embedding and the head).
pub fn block_of(index: usize, n_layer: usize) -> Option<usize> {
    let block = index.checked_sub(OPS_BEFORE_BLOCKS)? / OPS_PER_BLOCK;
    (block < n_layer).then_some(block)
}

/// The gradients a backward walk has finished, so that data parallelism can sum them while
/// the walk goes on: the walk writes a block's parameters' gradients only in that block's ops
/// and visits the blocks from the last to the first, so the gradients from the lowest
/// parameter an op wrote (the token and position tables aside) up are final once it has run.
/// The tables' (`..plan.blocks_params_start()`) are final only when the walk ends: the LM head
/// writes the token table's gradient first and the embedding last.
#[derive(Clone, Copy, Debug)]
pub struct FinishedGradients {
    tables_end: usize,
    /// Gradients from here up have been handed out.
    from: usize,
}

impl FinishedGradients {
    /// Nothing of `plan`'s gradients handed out yet.
    pub fn new(plan: &Plan) -> FinishedGradients {
        FinishedGradients { tables_end: plan.blocks_params_start(), from: plan.params_len() }
    }

    /// After backward op `op` has run, the gradients it finished (maybe none): below the last
    /// span handed out, never handed out again.
    pub fn after(&mut self, op: &Op) -> Span {
        let lowest = op.params().into_iter().flatten().map(|s| s.offset).filter(|&o| o >= self.tables_end).min().unwrap_or(self.from).min(self.from);
        let done = Span { offset: lowest, len: self.from - lowest };
        self.from = lowest;
        done
    }
}

/// The `(K, M)` of every matmul of `tape` (for sizing a backend's matmul scratch).
pub fn matmul_shapes(tape: &[Op]) -> impl Iterator<Item = (usize, usize)> + '_ {
    tape.iter().filter_map(|op| match *op {
        Op::Matmul { k, m, .. } => Some((k, m)),
        _ => None,
    })
}

/// Records the model's tape into `ops` (at least [`tape_len`] long) and returns it: the
/// embedding; per block a norm, the q/k/v product, attention, the output product + residual,
/// a norm, the MLP's first product with its activation, its second + residual; the final norm,
/// the head and the loss. Both families record these ops in these places; what differs is
/// each op's kind and its tensors (see `Family`).
pub fn record<'a>(plan: &Plan, ops: &'a mut [Op]) -> Result<&'a [Op], ConfigError> {
    let len = tape_len(plan);
    if ops.len() < len {
        return Err(ConfigError::BufferTooSmall { what: "tape", needed: len, given: ops.len() });
    }
    let mut i = 0;
    let mut push = |op| {
        ops[i] = op;
        i += 1;
    };
    let cfg = &plan.config;
    let (c, n) = (cfg.n_embd, plan.tokens());
    let family = Family::of(plan);
    let p = |kind, layer| plan.param(kind, layer).span;
    let sc = plan.scratch();
    // The wide gradients share `dbig`: qkv's, and the MLP's hidden activation's.
    let dqkv = Span { offset: sc.dbig.offset, len: n * cfg.qkv_width() };
    let dh = Span { offset: sc.dbig.offset, len: n * cfg.hidden() };
    let dropped = |site| plan.dropout_site(site).map(|site| Dropped { site, scratch: sc.dropped });
    let (wte, wpe) = (plan.token_embedding().span, family.positions.map(|k| p(k, None)));
    push(Op::Embedding { wte, wpe, out: plan.encoded(), dout: sc.dres, seq: plan.seq, dropout: dropped(0) });
    for l in 0..cfg.n_layer {
        let a = plan.layer_acts(l);
        // Dropout sites 3l + 1 (attention probabilities), 3l + 2 and 3l + 3 (residual branches).
        let site = 3 * l as u32;
        let res_in = plan.residual_in(l);
        let bias = |kind: Option<ParamKind>| kind.map(|k| p(k, Some(l)));
        push(family.norm(plan, res_in, a.ln1, (a.ln1_mean, a.ln1_rstd), family.norm_1, Some(l)));
        push(Op::Matmul {
            x: a.ln1,
            dx: Some(sc.dsmall),
            weight: p(family.qkv.0, Some(l)),
            bias: bias(family.qkv.1),
            out: a.qkv,
            dout: dqkv,
            epilogue: Epilogue::None,
            dh: None,
            k: c,
            m: cfg.qkv_width(),
            dropout: None,
        });
        let shape = plan.attention_shape();
        push(Op::Attention { qkv: a.qkv, dqkv, out: a.atty, dout: sc.dsmall, lse: a.lse, shape, dropout: plan.dropout_site(site + 1) });
        push(Op::Matmul {
            x: a.atty,
            dx: Some(sc.dsmall),
            weight: p(family.proj.0, Some(l)),
            bias: bias(family.proj.1),
            out: a.res_mid,
            dout: sc.dres,
            epilogue: Epilogue::Residual { input: res_in },
            dh: None,
            k: c,
            m: c,
            dropout: dropped(site + 2),
        });
        push(family.norm(plan, a.res_mid, a.ln2, (a.ln2_mean, a.ln2_rstd), family.norm_2, Some(l)));
        // GELU's backward works in place on its output's gradient (`dh`); SwiGLU's makes the
        // product's gradient in place of the slopes its forward left in `fc_pre`, from `dh`.
        let (epilogue, dout, swiglu_dh) =
            if family.swiglu { (Epilogue::SwiGlu { pre: a.fc_pre }, a.fc_pre, Some(dh)) } else { (Epilogue::Gelu { pre: a.fc_pre }, dh, None) };
        push(Op::Matmul {
            x: a.ln2,
            dx: Some(sc.dsmall),
            weight: p(family.fc.0, Some(l)),
            bias: bias(family.fc.1),
            out: a.fc_gelu,
            dout,
            epilogue,
            dh: swiglu_dh,
            k: c,
            m: cfg.fc_width(),
            dropout: None,
        });
        push(Op::Matmul {
            x: a.fc_gelu,
            dx: Some(dh),
            weight: p(family.down.0, Some(l)),
            bias: bias(family.down.1),
            out: a.res_out,
            dout: sc.dres,
            epilogue: Epilogue::Residual { input: a.res_mid },
            dh: None,
            k: cfg.hidden(),
            m: c,
            dropout: dropped(site + 3),
        });
    }
    let h = plan.head_acts();
    push(family.norm(plan, plan.residual_in(cfg.n_layer), h.lnf, (h.lnf_mean, h.lnf_rstd), family.norm_f, None));
    push(Op::Matmul {
        x: h.lnf,
        dx: Some(sc.dsmall),
        weight: plan.head_weight().span,
        bias: None,
        out: h.logits,
        dout: h.logits,
        epilogue: Epilogue::None,
        dh: None,
        k: c,
        m: cfg.vocab_size,
        dropout: None,
    });
    push(Op::CrossEntropy { logits: h.logits, losses: h.losses, classes: plan.classes() });
    debug_assert_eq!(i, len);
    Ok(&ops[..len])
}

/// What a model's family puts in the tape's places: its tensors (a weight, and a bias where
/// it has one) and its norm and activation.
struct Family {
    /// The position table (GPT-2's).
    positions: Option<ParamKind>,
    /// The norms: before attention, before the MLP, after the blocks.
    norm_1: Normalize,
    norm_2: Normalize,
    norm_f: Normalize,
    qkv: (ParamKind, Option<ParamKind>),
    proj: (ParamKind, Option<ParamKind>),
    fc: (ParamKind, Option<ParamKind>),
    down: (ParamKind, Option<ParamKind>),
    /// SwiGLU after the MLP's first product (the Llama family), else GELU.
    swiglu: bool,
}

impl Family {
    fn of(plan: &Plan) -> Family {
        use ParamKind::*;
        match plan.config.llama() {
            None => Family {
                positions: Some(Wpe),
                norm_1: Normalize::Layer { weight: Ln1Weight, bias: Ln1Bias },
                norm_2: Normalize::Layer { weight: Ln2Weight, bias: Ln2Bias },
                norm_f: Normalize::Layer { weight: LnfWeight, bias: LnfBias },
                qkv: (QkvWeight, Some(QkvBias)),
                proj: (AttnProjWeight, Some(AttnProjBias)),
                fc: (FcWeight, Some(FcBias)),
                down: (MlpProjWeight, Some(MlpProjBias)),
                swiglu: false,
            },
            Some(l) => Family {
                positions: None,
                norm_1: Normalize::Rms { weight: AttnNorm, eps: l.norm_eps },
                norm_2: Normalize::Rms { weight: MlpNorm, eps: l.norm_eps },
                norm_f: Normalize::Rms { weight: Norm, eps: l.norm_eps },
                qkv: (QkvProj, l.qkv_bias.then_some(QkvProjBias)),
                proj: (OProj, None),
                fc: (GateUp, None),
                down: (Down, None),
                swiglu: true,
            },
        }
    }

    /// `norm` of `x` into `out`, saving `(mean, rstd)` (RMSNorm saves no mean), with the
    /// weights of block `layer` (`None`: the final norm's).
    fn norm(&self, plan: &Plan, x: Span, out: Span, (mean, rstd): (Span, Span), norm: Normalize, layer: Option<usize>) -> Op {
        let sc = plan.scratch();
        let p = |kind| plan.param(kind, layer).span;
        match norm {
            Normalize::Rms { weight, eps } => Op::RmsNorm { x, dx: sc.dres, out, dout: sc.dsmall, rstd, weight: p(weight), eps },
            Normalize::Layer { weight, bias } => Op::LayerNorm { x, dx: sc.dres, out, dout: sc.dsmall, mean, rstd, weight: p(weight), bias: p(bias) },
        }
    }
}

/// A family's norm and its tensors.
#[derive(Clone, Copy)]
enum Normalize {
    /// LayerNorm with a weight and a bias (GPT-2's).
    Layer { weight: ParamKind, bias: ParamKind },
    /// RMSNorm with a weight (the Llama family's).
    Rms { weight: ParamKind, eps: f64 },
}

/// The tape of `plan` in a new vector (`alloc` feature).
#[cfg(feature = "alloc")]
pub fn record_to_vec(plan: &Plan) -> alloc::vec::Vec<Op> {
    let mut ops = alloc::vec![Op::BLANK; tape_len(plan)];
    record(plan, &mut ops).expect("the buffer has tape_len entries");
    ops
}

#[cfg(test)]
mod plan_tests {
    use super::*;
    use crate::config::GptConfig;

    fn overlap(a: Span, b: Span) -> bool {
        a.offset < b.end() && b.offset < a.end()
    }

    /// The products' work a trace reports: 2 FLOPs per weight of every matmul (the tied LM
    /// head's included) and token in a forward walk, 4 in a backward (every product's input
    /// and weight gradients).
    #[test]
    fn the_products_work_is_two_flops_per_weight_and_token() {
        let cfg = GptConfig::gpt2(11, 8, 2, 2, 6);
        let plan = Plan::new(cfg, 3, 7).unwrap();
        let tape = record_to_vec(&plan);
        let products = |pass| tape.iter().filter(|op| matches!(op, Op::Matmul { .. })).map(|op| op.work(pass).0).sum::<f64>();
        let weights: usize = tape.iter().filter_map(|op| if let Op::Matmul { k, m, .. } = op { Some(k * m) } else { None }).sum();
        let tokens = plan.tokens() as f64;
        assert_eq!(weights, cfg.n_layer * 12 * cfg.n_embd * cfg.n_embd + cfg.vocab_size * cfg.n_embd);
        assert_eq!(products(Pass::Forward), 2.0 * weights as f64 * tokens);
        let with_dx = tape.iter().filter(|op| matches!(op, Op::Matmul { dx: Some(_), .. })).count();
        let all = tape.iter().filter(|op| matches!(op, Op::Matmul { .. })).count();
        assert_eq!(with_dx, all, "every product's input needs its gradient");
        assert_eq!(products(Pass::Backward), 4.0 * weights as f64 * tokens);
    }

    /// Every pair of activation spans one op uses together must be disjoint, and each
    /// must start aligned.
    #[test]
    fn spans_used_together_are_disjoint() {
        let cfg = GptConfig::gpt2(11, 8, 3, 2, 6);
        let plan = Plan::new(cfg, 3, 7).unwrap();
        let dropping = plan.with_dropout(0.1, 1).unwrap();
        for plan in [plan, plan.with_recompute(true), dropping, dropping.with_recompute(true)] {
            check_spans(&plan);
        }
        // Llama-family blocks: grouped heads, a SwiGLU width unlike 4C, q/k/v biases or not,
        // tied head or not.
        for (qkv_bias, tied) in [(true, false), (false, true)] {
            let plan = Plan::new(llama_config(qkv_bias, tied), 3, 7).unwrap();
            let dropping = plan.with_dropout(0.1, 1).unwrap();
            for plan in [plan, plan.with_recompute(true), dropping, dropping.with_recompute(true)] {
                check_spans(&plan);
            }
        }
    }

    /// A small Llama-family config: 4 heads over 2 key/value heads of size 4, SwiGLU 20 wide.
    pub(crate) fn llama_config(qkv_bias: bool, tied: bool) -> GptConfig {
        let llama = crate::config::Llama { n_kv_head: 2, intermediate_size: 20, norm_eps: 1e-5, rope_theta: 10000.0, rope_scaling: None, qkv_bias, tied };
        GptConfig { vocab_size: 11, block_size: 8, n_layer: 3, n_head: 4, n_embd: 16, arch: crate::config::Arch::Llama(llama) }
    }

    /// A Llama block's products: q/k/v (`NH + 2 KVH` heads), the output projection, gate and
    /// up (`2I`), down (`I`); the head.
    #[test]
    fn llama_products_are_the_blocks_weights() {
        for tied in [true, false] {
            let cfg = llama_config(true, tied);
            let plan = Plan::new(cfg, 2, 5).unwrap();
            let tape = record_to_vec(&plan);
            let (c, hs) = (cfg.n_embd, cfg.head_size());
            let shapes: Vec<(usize, usize)> = matmul_shapes(&tape).collect();
            let block = [(c, (4 + 2 * 2) * hs), (c, c), (c, 40), (20, c)];
            let want: Vec<(usize, usize)> = (0..cfg.n_layer).flat_map(|_| block).chain([(c, cfg.vocab_size)]).collect();
            assert_eq!(shapes, want);
            let head = tape.iter().rev().find_map(|op| if let Op::Matmul { weight, .. } = op { Some(*weight) } else { None }).unwrap();
            let expected = plan.param(if tied { ParamKind::Embed } else { ParamKind::LmHead }, None).span;
            assert_eq!(head, expected);
            assert_eq!(tape.len(), tape_len(&plan));
        }
    }

    fn check_spans(plan: &Plan) {
        let mut ops = [Op::BLANK; 64];
        let tape = record(plan, &mut ops).unwrap();
        let sc = plan.scratch();
        // With recompute, every block's input is kept apart from the shared activations (the
        // blocks' and the head's).
        let kept: Vec<Span> = (0..=plan.config.n_layer).map(|l| plan.residual_in(l)).collect();
        for (i, a) in kept.iter().enumerate() {
            for b in &kept[i + 1..] {
                assert!(!overlap(*a, *b), "kept residuals {a:?} and {b:?} overlap");
            }
            let (shared, h) = (plan.layer_acts(0), plan.head_acts());
            for s in [shared.ln1, shared.qkv, shared.atty, shared.res_mid, shared.ln2, shared.fc_pre, shared.fc_gelu, h.lnf, h.logits, h.losses] {
                assert!(!overlap(*a, s), "kept residual {a:?} overlaps activation {s:?}");
            }
        }
        for op in tape {
            let spans: &[Span] = &match *op {
                Op::Embedding { out, dout, dropout, .. } => [out, dout].into_iter().chain(dropout.map(|d| d.scratch)).collect(),
                Op::LayerNorm { x, dx, out, dout, mean, rstd, .. } => [x, dx, out, dout, mean, rstd, sc.partials].into_iter().filter(|s| s.len > 0).collect(),
                Op::RmsNorm { x, dx, out, dout, rstd, .. } => [x, dx, out, dout, rstd, sc.partials].to_vec(),
                Op::Matmul { x, dx, out, dout, dh, epilogue, dropout, .. } => {
                    let mut v = vec![x, out, sc.wt, sc.partials];
                    v.extend(dropout.map(|d| d.scratch));
                    v.extend(dx);
                    if dout != out {
                        v.push(dout);
                    }
                    match epilogue {
                        Epilogue::Gelu { pre } => v.push(pre),
                        // SwiGLU's backward makes the product's gradient in place of `pre`.
                        Epilogue::SwiGlu { pre } => assert_eq!(pre, dout),
                        Epilogue::Residual { input } => v.push(input),
                        Epilogue::None => {}
                    }
                    v.extend(dh);
                    v
                }
                Op::Attention { qkv, dqkv, out, dout, lse, .. } => [qkv, dqkv, out, dout, lse, sc.attention].to_vec(),
                Op::CrossEntropy { logits, losses, .. } => [logits, losses].to_vec(),
            };
            for (i, a) in spans.iter().enumerate() {
                assert!(a.end() <= plan.acts_len());
                assert_eq!(a.offset % crate::plan::ACT_ALIGN, 0, "{op:?}: {a:?} is not aligned");
                for b in &spans[i + 1..] {
                    assert!(!overlap(*a, *b), "{op:?}: {a:?} overlaps {b:?}");
                }
            }
        }
        // Parameters tile the params arena exactly.
        let mut next = 0;
        for info in plan.params() {
            assert_eq!(info.span.offset, next, "{info}");
            next = info.span.end();
        }
        assert_eq!(next, plan.params_len());
    }
}
