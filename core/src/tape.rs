//! The autograd tape: the model recorded once as a list of fused ops over arena spans.
//!
//! [`forward`] walks the tape front to back, [`backward`] back to front, each op with its
//! hand-written backward from [`crate::ops`]. Activation gradients live in three reused
//! scratch buffers (see [`crate::plan::Scratch`]); parameter gradients accumulate into the
//! grads arena at the parameters' offsets.

use crate::config::ConfigError;
use crate::float::Float;
use crate::ops::attention::AttentionShape;
use crate::ops::matmul::Epilogue;
use crate::ops::{attention, cross_entropy, embedding, layernorm, matmul};
use crate::parallel::Parallel;
use crate::plan::{ParamKind, Plan, Span};

/// What a matmul does after `x·wᵀ + bias`, as spans of the activations arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpilogueSpan {
    /// Nothing.
    None,
    /// GELU of the pre-activation, which is computed at `pre`.
    Gelu {
        /// Pre-activation `[N, M]`; a training forward leaves GELU's slope there instead,
        /// which is all the backward needs of it.
        pre: Span,
    },
    /// Residual add of `input` (whose gradient buffer is the op's `dout`).
    Residual {
        /// Residual stream `[N, M]`.
        input: Span,
    },
}

/// One fused op. Fields named after parameters are spans of the params arena (and of the
/// grads arena at the same offsets); all others are spans of the activations arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Token + position embedding of the step's tokens.
    Embedding {
        /// Token embedding `[V, C]`.
        wte: Span,
        /// Position embedding `[block, C]`.
        wpe: Span,
        /// Output `[N, C]`.
        out: Span,
        /// Gradient of `out`.
        dout: Span,
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
        /// Gradient of `out` (consumed: GELU backward works in place).
        dout: Span,
        /// Fused epilogue.
        epilogue: EpilogueSpan,
        /// Input width `K`.
        k: usize,
        /// Output width `M`.
        m: usize,
    },
    /// Causal self-attention over fused QKV.
    Attention {
        /// Input `[N, 3C]`.
        qkv: Span,
        /// Gradient of `qkv` (overwritten).
        dqkv: Span,
        /// Output `[N, C]`.
        out: Span,
        /// Gradient of `out`.
        dout: Span,
        /// Saved log-sum-exp `[B, NH, T]`.
        lse: Span,
        /// Per-(batch, head) tiles.
        scratch: Span,
        /// Shape.
        shape: AttentionShape,
    },
    /// Softmax cross-entropy of `logits` against the step's targets.
    CrossEntropy {
        /// Logits `[N, V]`, replaced by their gradient in a training forward.
        logits: Span,
        /// Per-position losses `[N]`.
        losses: Span,
    },
}

/// Which walk of the tape an op event belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// [`forward`].
    Forward,
    /// [`backward`].
    Backward,
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
    /// The global gradient norm.
    GradNorm,
    /// AdamW (with the clip factor folded in).
    Optimizer,
}

impl Phase {
    /// The phase's name in metrics and traces.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Data => "data",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::GradNorm => "grad_norm",
            Phase::Optimizer => "optimizer",
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
}

impl Observer for () {}

impl Op {
    /// The op family's name, as its kernel file is named in `ops/`.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Embedding { .. } => "embedding",
            Op::LayerNorm { .. } => "layernorm",
            Op::Matmul { epilogue: EpilogueSpan::Gelu { .. }, .. } => "matmul+gelu",
            Op::Matmul { epilogue: EpilogueSpan::Residual { .. }, .. } => "matmul+residual",
            Op::Matmul { .. } => "matmul",
            Op::Attention { .. } => "attention",
            Op::CrossEntropy { .. } => "cross_entropy",
        }
    }

    /// The op's main shape, `[rows, in] -> [rows, out]` style, written to `f`.
    pub fn describe_shape(&self, f: &mut dyn core::fmt::Write) -> core::fmt::Result {
        match *self {
            Op::Embedding { out, wte, .. } => write!(f, "tokens -> [{}], vocab x C = {}", out.len, wte.len),
            Op::LayerNorm { x, mean, .. } => write!(f, "[{} x {}]", mean.len, x.len / mean.len.max(1)),
            Op::Matmul { x, k, m, .. } => write!(f, "[{} x {}] x [{} x {}]ᵀ", x.len / k.max(1), k, m, k),
            Op::Attention { shape, .. } => {
                write!(f, "B {} T {} heads {} x {}", shape.batch, shape.seq, shape.heads, shape.head_size)
            }
            Op::CrossEntropy { logits, losses } => write!(f, "[{} x {}]", losses.len, logits.len / losses.len.max(1)),
        }
    }

    /// A placeholder to fill a tape buffer with before [`record`].
    pub const BLANK: Op = Op::CrossEntropy { logits: Span { offset: 0, len: 0 }, losses: Span { offset: 0, len: 0 } };
}

/// Number of ops in the tape of `plan`.
pub fn tape_len(plan: &Plan) -> usize {
    7 * plan.config.n_layer + 4
}

/// Records the model's tape into `ops` (at least [`tape_len`] long) and returns it.
pub fn record<'a>(plan: &Plan, ops: &'a mut [Op]) -> Result<&'a [Op], ConfigError> {
    let len = tape_len(plan);
    if ops.len() < len {
        return Err(ConfigError::BufferTooSmall { what: "tape", needed: len, given: ops.len() });
    }
    let cfg = &plan.config;
    let c = cfg.n_embd;
    let p = |kind, layer| plan.param(kind, layer).span;
    let sc = plan.scratch();
    let nc = plan.tokens() * c;
    let dqkv = Span { offset: sc.dbig.offset, len: 3 * nc };
    let mut i = 0;
    let mut push = |op| {
        ops[i] = op;
        i += 1;
    };
    push(Op::Embedding { wte: p(ParamKind::Wte, None), wpe: p(ParamKind::Wpe, None), out: plan.encoded(), dout: sc.dres });
    for l in 0..cfg.n_layer {
        let a = plan.layer_acts(l);
        let res_in = plan.residual_in(l);
        let ln = |x, out, mean, rstd, w, b| Op::LayerNorm { x, dx: sc.dres, out, dout: sc.dsmall, mean, rstd, weight: p(w, Some(l)), bias: p(b, Some(l)) };
        push(ln(res_in, a.ln1, a.ln1_mean, a.ln1_rstd, ParamKind::Ln1Weight, ParamKind::Ln1Bias));
        push(Op::Matmul {
            x: a.ln1,
            dx: Some(sc.dsmall),
            weight: p(ParamKind::QkvWeight, Some(l)),
            bias: Some(p(ParamKind::QkvBias, Some(l))),
            out: a.qkv,
            dout: dqkv,
            epilogue: EpilogueSpan::None,
            k: c,
            m: 3 * c,
        });
        push(Op::Attention { qkv: a.qkv, dqkv, out: a.atty, dout: sc.dsmall, lse: a.lse, scratch: sc.attention, shape: plan.attention_shape() });
        push(Op::Matmul {
            x: a.atty,
            dx: Some(sc.dsmall),
            weight: p(ParamKind::AttnProjWeight, Some(l)),
            bias: Some(p(ParamKind::AttnProjBias, Some(l))),
            out: a.res_mid,
            dout: sc.dres,
            epilogue: EpilogueSpan::Residual { input: res_in },
            k: c,
            m: c,
        });
        push(ln(a.res_mid, a.ln2, a.ln2_mean, a.ln2_rstd, ParamKind::Ln2Weight, ParamKind::Ln2Bias));
        push(Op::Matmul {
            x: a.ln2,
            dx: Some(sc.dsmall),
            weight: p(ParamKind::FcWeight, Some(l)),
            bias: Some(p(ParamKind::FcBias, Some(l))),
            out: a.fc_gelu,
            dout: sc.dbig,
            epilogue: EpilogueSpan::Gelu { pre: a.fc_pre },
            k: c,
            m: 4 * c,
        });
        push(Op::Matmul {
            x: a.fc_gelu,
            dx: Some(sc.dbig),
            weight: p(ParamKind::MlpProjWeight, Some(l)),
            bias: Some(p(ParamKind::MlpProjBias, Some(l))),
            out: a.res_out,
            dout: sc.dres,
            epilogue: EpilogueSpan::Residual { input: a.res_mid },
            k: 4 * c,
            m: c,
        });
    }
    let h = plan.head_acts();
    push(Op::LayerNorm {
        x: plan.residual_in(cfg.n_layer),
        dx: sc.dres,
        out: h.lnf,
        dout: sc.dsmall,
        mean: h.lnf_mean,
        rstd: h.lnf_rstd,
        weight: p(ParamKind::LnfWeight, None),
        bias: p(ParamKind::LnfBias, None),
    });
    push(Op::Matmul {
        x: h.lnf,
        dx: Some(sc.dsmall),
        weight: p(ParamKind::Wte, None),
        bias: None,
        out: h.logits,
        dout: h.logits,
        epilogue: EpilogueSpan::None,
        k: c,
        m: cfg.vocab_size,
    });
    push(Op::CrossEntropy { logits: h.logits, losses: h.losses });
    debug_assert_eq!(i, len);
    Ok(&ops[..len])
}

/// The tape of `plan` in a new vector (`alloc` feature).
#[cfg(feature = "alloc")]
pub fn record_to_vec(plan: &Plan) -> alloc::vec::Vec<Op> {
    let mut ops = alloc::vec![Op::BLANK; tape_len(plan)];
    record(plan, &mut ops).expect("the buffer has tape_len entries");
    ops
}

/// Raw views of the arenas for one tape walk. Ops take slices of disjoint spans; the plan
/// guarantees the spans an op uses at once do not overlap (tested in `plan_tests`).
struct Arena<T> {
    ptr: *mut T,
    len: usize,
}

impl<T> Arena<T> {
    fn new(s: &mut [T]) -> Self {
        Arena { ptr: s.as_mut_ptr(), len: s.len() }
    }
    /// # Safety
    /// No other live slice from this arena may overlap `span`.
    #[allow(clippy::mut_from_ref)]
    unsafe fn get(&self, span: Span) -> &mut [T] {
        assert!(span.end() <= self.len, "span {span:?} outside arena of {}", self.len);
        // SAFETY: in bounds (checked) and exclusive (caller).
        unsafe { core::slice::from_raw_parts_mut(self.ptr.add(span.offset), span.len) }
    }
}

/// Runs the tape forward on `tokens [N]`. With `targets`, returns the mean loss; with
/// `grad_scale` as well, leaves `grad_scale * d(Σ losses)/d(logits)` in the logits for
/// [`backward`] (pass `1 / (N * micro_batches)` for the mean over accumulated batches).
#[allow(clippy::too_many_arguments)]
pub fn forward<T: Float>(
    par: &dyn Parallel,
    plan: &Plan,
    tape: &[Op],
    params: &[T],
    acts: &mut [T],
    tokens: &[u32],
    targets: Option<&[u32]>,
    grad_scale: Option<f64>,
) -> Option<f64> {
    forward_observed(par, plan, tape, params, acts, tokens, targets, grad_scale, &mut ())
}

/// [`forward`], reporting the start and end of every op to `obs`.
#[allow(clippy::too_many_arguments)]
pub fn forward_observed<T: Float>(
    par: &dyn Parallel,
    plan: &Plan,
    tape: &[Op],
    params: &[T],
    acts: &mut [T],
    tokens: &[u32],
    targets: Option<&[u32]>,
    grad_scale: Option<f64>,
    obs: &mut dyn Observer,
) -> Option<f64> {
    assert!(params.len() == plan.params_len() && acts.len() == plan.acts_len() && tokens.len() == plan.tokens());
    let a = Arena::new(acts);
    let p = |s: Span| &params[s.range()];
    let wt = plan.scratch().wt;
    let mut loss = None;
    for (index, op) in tape.iter().enumerate() {
        obs.begin(Pass::Forward, index, op);
        // SAFETY (every `a.get` below): the spans named in one op are pairwise disjoint.
        unsafe {
            match *op {
                Op::Embedding { wte, wpe, out, .. } => embedding::forward(par, a.get(out), tokens, p(wte), p(wpe), plan.seq, plan.config.n_embd),
                Op::LayerNorm { x, out, mean, rstd, weight, bias, .. } => {
                    layernorm::forward(par, a.get(out), a.get(mean), a.get(rstd), a.get(x), p(weight), p(bias), plan.config.n_embd)
                }
                Op::Matmul { x, weight, bias, out, epilogue, k, m, .. } => {
                    let epi = match epilogue {
                        EpilogueSpan::None => Epilogue::None,
                        EpilogueSpan::Gelu { pre } => Epilogue::Gelu { pre: a.get(pre), slope: grad_scale.is_some() },
                        EpilogueSpan::Residual { input } => Epilogue::Residual { input: a.get(input) },
                    };
                    matmul::forward(par, a.get(wt), a.get(out), a.get(x), p(weight), bias.map(p), epi, k, m)
                }
                Op::Attention { qkv, out, lse, scratch, shape, .. } => attention::forward(par, a.get(out), a.get(lse), a.get(qkv), a.get(scratch), shape),
                Op::CrossEntropy { logits, losses } => {
                    if let Some(targets) = targets {
                        let scale = grad_scale.map(T::from_f64);
                        cross_entropy::forward(par, a.get(losses), a.get(logits), targets, plan.config.vocab_size, scale);
                        loss = Some(cross_entropy::mean(a.get(losses)));
                    }
                }
            }
        }
        obs.end(Pass::Forward, index, op);
    }
    loss
}

/// Runs the tape backward after a training [`forward`] (with targets and `grad_scale`),
/// accumulating parameter gradients into `grads`.
pub fn backward<T: Float>(par: &dyn Parallel, plan: &Plan, tape: &[Op], params: &[T], grads: &mut [T], acts: &mut [T], tokens: &[u32]) {
    backward_observed(par, plan, tape, params, grads, acts, tokens, &mut ())
}

/// [`backward`], reporting the start and end of every op to `obs`.
#[allow(clippy::too_many_arguments)]
pub fn backward_observed<T: Float>(
    par: &dyn Parallel,
    plan: &Plan,
    tape: &[Op],
    params: &[T],
    grads: &mut [T],
    acts: &mut [T],
    tokens: &[u32],
    obs: &mut dyn Observer,
) {
    assert!(grads.len() == plan.params_len() && acts.len() == plan.acts_len());
    let a = Arena::new(acts);
    let g = Arena::new(grads);
    let p = |s: Span| &params[s.range()];
    // SAFETY: dres is only used here.
    unsafe { a.get(plan.scratch().dres) }.fill(T::ZERO);
    for (index, op) in tape.iter().enumerate().rev() {
        obs.begin(Pass::Backward, index, op);
        // SAFETY (every `a.get`/`g.get` below): spans in one op are pairwise disjoint, and
        // distinct parameters never overlap.
        unsafe {
            match *op {
                Op::Embedding { wte, wpe, dout, .. } => embedding::backward(par, g.get(wte), g.get(wpe), a.get(dout), tokens, plan.seq, plan.config.n_embd),
                Op::LayerNorm { x, dx, dout, mean, rstd, weight, bias, .. } => layernorm::backward(
                    par,
                    a.get(dx),
                    g.get(weight),
                    g.get(bias),
                    a.get(plan.scratch().partials),
                    a.get(dout),
                    a.get(x),
                    a.get(mean),
                    a.get(rstd),
                    p(weight),
                    plan.config.n_embd,
                ),
                Op::Matmul { x, dx, weight, bias, dout, epilogue, k, m, .. } => {
                    let gelu_slope = match epilogue {
                        EpilogueSpan::Gelu { pre } => Some(&*a.get(pre)),
                        _ => None,
                    };
                    matmul::backward(
                        par,
                        dx.map(|s| a.get(s)),
                        g.get(weight),
                        bias.map(|s| g.get(s)),
                        a.get(plan.scratch().partials),
                        a.get(plan.scratch().wt),
                        a.get(dout),
                        a.get(x),
                        p(weight),
                        gelu_slope,
                        k,
                        m,
                    )
                }
                Op::Attention { qkv, dqkv, out, dout, lse, scratch, shape } => {
                    attention::backward(par, a.get(dqkv), a.get(dout), a.get(qkv), a.get(out), a.get(lse), a.get(scratch), shape)
                }
                // The fused forward already left the logits' gradient in place.
                Op::CrossEntropy { .. } => {}
            }
        }
        obs.end(Pass::Backward, index, op);
    }
}

#[cfg(test)]
mod plan_tests {
    use super::*;
    use crate::config::GptConfig;

    fn overlap(a: Span, b: Span) -> bool {
        a.offset < b.end() && b.offset < a.end()
    }

    /// Every pair of activation spans one op uses together must be disjoint, and each
    /// must start aligned.
    #[test]
    fn spans_used_together_are_disjoint() {
        let cfg = GptConfig { vocab_size: 11, block_size: 8, n_layer: 3, n_head: 2, n_embd: 6 };
        let plan = Plan::new(cfg, 3, 7).unwrap();
        let mut ops = [Op::BLANK; 64];
        let tape = record(&plan, &mut ops).unwrap();
        for op in tape {
            let spans: &[Span] = &match *op {
                Op::Embedding { out, dout, .. } => [out, dout].to_vec(),
                Op::LayerNorm { x, dx, out, dout, mean, rstd, .. } => [x, dx, out, dout, mean, rstd].to_vec(),
                Op::Matmul { x, dx, out, dout, epilogue, .. } => {
                    let mut v = vec![x, out];
                    v.extend(dx);
                    if dout != out {
                        v.push(dout);
                    }
                    match epilogue {
                        EpilogueSpan::Gelu { pre } => v.push(pre),
                        EpilogueSpan::Residual { input } => v.push(input),
                        EpilogueSpan::None => {}
                    }
                    v
                }
                Op::Attention { qkv, dqkv, out, dout, lse, scratch, .. } => [qkv, dqkv, out, dout, lse, scratch].to_vec(),
                Op::CrossEntropy { logits, losses } => [logits, losses].to_vec(),
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

#[cfg(test)]
mod model_gradient_tests {
    use super::*;
    use crate::config::GptConfig;
    use crate::ops::gradcheck::{assert_close, numeric_grad, random};
    use crate::parallel::Serial;
    use crate::rng::Rng;

    /// The whole model's backward against central differences of its loss, in f64.
    #[test]
    fn whole_model_gradients_match_finite_differences() {
        let cfg = GptConfig { vocab_size: 7, block_size: 5, n_layer: 2, n_head: 2, n_embd: 6 };
        let plan = Plan::new(cfg, 2, 4).unwrap();
        let mut ops = [Op::BLANK; 32];
        let tape = record(&plan, &mut ops).unwrap();
        let mut rng = Rng::new(11);
        let mut params = random(&mut rng, plan.params_len(), 0.5);
        let tokens: Vec<u32> = (0..8).map(|_| rng.below(7) as u32).collect();
        let targets: Vec<u32> = (0..8).map(|_| rng.below(7) as u32).collect();
        let mut acts = vec![0.0; plan.acts_len()];
        let mut grads = vec![0.0; plan.params_len()];
        let scale = 1.0 / plan.tokens() as f64;
        forward(&Serial, &plan, tape, &params, &mut acts, &tokens, Some(&targets), Some(scale));
        backward(&Serial, &plan, tape, &params, &mut grads, &mut acts, &tokens);
        let numeric = numeric_grad(&mut params, |p| forward(&Serial, &plan, tape, p, &mut acts, &tokens, Some(&targets), None).unwrap());
        for info in plan.params() {
            let r = info.span.range();
            assert_close(&format!("{info}"), &grads[r.clone()], &numeric[r]);
        }
    }
}
