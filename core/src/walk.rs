//! The one walk of the tape: forward front to back, backward back to front, each op turned
//! into its family's argument struct (`ops::NAME::Forward` / `Backward`) over an
//! [`Executor`]'s tensors. The CPU executor ([`crate::cpu::CpuExecutor`]) runs each op's
//! kernel as the walk reaches it; alpha-gpu's records the op's dispatches into a program it
//! submits later. Nothing else interprets the tape.
//!
//! Unstable: public for Alpha's executors (CPU, wgpu, CUDA) and the tests; it changes with any
//! release (see the crate's Stability section).
//!
//! ```
//! use alpha_core::cpu::{Batch, CpuExecutor};
//! use alpha_core::{tape, walk, GptConfig, Plan, Serial};
//!
//! let config = GptConfig::gpt2(5, 4, 1, 1, 4);
//! let plan = Plan::new(config, 1, 4).unwrap();
//! let tape = tape::record_to_vec(&plan);
//! let params = vec![0.01f32; plan.params_len()];
//! let mut acts = vec![0f32; plan.acts_len()];
//! let batch = Batch { tokens: &[1, 2, 3, 4], targets: Some(&[2, 3, 4, 0]) };
//! let mut cpu = CpuExecutor::new(&Serial, &plan, &params, &mut acts, batch);
//! walk::forward(&mut cpu, &tape, None);
//! // Nearly uniform logits: the loss is about ln(5).
//! assert!((cpu.loss().unwrap() - 5f64.ln()).abs() < 0.01);
//! ```

use crate::ops::{attention, cross_entropy, dropout, embedding, layernorm, matmul, rmsnorm};
use crate::plan::{Plan, Span};
use crate::tape::{self, Dropped, Op, Pass};
use core::ops::Range;

/// Which arena a tensor of the tape lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arena {
    /// The parameters (read only in a walk).
    Params,
    /// The parameter gradients, at the parameters' offsets (written by a backward walk).
    Grads,
    /// Activations and backward scratch.
    Acts,
}

/// A backend the walk drives: it turns spans of the arenas into its tensors (slices, device
/// views) and runs or records each op family's forward and backward. The walk builds every
/// op's arguments; a backend adds only what is its own (the batch's token ids and dropout
/// key, kernel scratch).
pub trait Executor {
    /// A tensor an op writes (`&mut [T]` on the CPU).
    type Write;
    /// A tensor an op reads (`&[T]` on the CPU).
    type Read: Copy;

    /// `span` of `arena` as a tensor to write.
    ///
    /// # Safety
    /// The tensors resolved for one op do not overlap one another (the plan guarantees it for
    /// the tape's ops) nor the executor's own scratch, and none is used after that op's call.
    unsafe fn write(&self, arena: Arena, span: Span) -> Self::Write;

    /// `span` of `arena` as a tensor to read.
    ///
    /// # Safety
    /// As [`Executor::write`].
    unsafe fn read(&self, arena: Arena, span: Span) -> Self::Read;

    /// Op `index` of the tape is about to run (observers, labels); nothing by default.
    fn begin(&mut self, _pass: Pass, _index: usize, _op: &Op) {}
    /// Op `index` has run; nothing by default.
    fn end(&mut self, _pass: Pass, _index: usize, _op: &Op) {}

    /// Token + position embedding of the executor's batch.
    fn embedding_forward(&mut self, a: embedding::Forward<Self::Write, Self::Read>);
    /// Embedding gradients from the executor's batch.
    fn embedding_backward(&mut self, a: embedding::Backward<Self::Write, Self::Read>);
    /// LayerNorm.
    fn layernorm_forward(&mut self, a: layernorm::Forward<Self::Write, Self::Read>);
    /// LayerNorm's gradients.
    fn layernorm_backward(&mut self, a: layernorm::Backward<Self::Write, Self::Read>);
    /// RMSNorm.
    fn rmsnorm_forward(&mut self, a: rmsnorm::Forward<Self::Write, Self::Read>);
    /// RMSNorm's gradients.
    fn rmsnorm_backward(&mut self, a: rmsnorm::Backward<Self::Write, Self::Read>);
    /// Linear layer with its fused epilogue.
    fn matmul_forward(&mut self, a: matmul::Forward<Self::Write, Self::Read>);
    /// Linear layer's gradients.
    fn matmul_backward(&mut self, a: matmul::Backward<Self::Write, Self::Read>);
    /// Causal self-attention.
    fn attention_forward(&mut self, a: attention::Forward<Self::Write, Self::Read>);
    /// Causal self-attention's gradients.
    fn attention_backward(&mut self, a: attention::Backward<Self::Write, Self::Read>);
    /// Fused cross-entropy against the executor's targets (and the loss's gradient).
    fn cross_entropy(&mut self, a: cross_entropy::Forward<Self::Write>);
    /// Dropout with the executor's micro-batch key, before a residual add.
    fn dropout_forward(&mut self, a: dropout::Forward<Self::Write, Self::Read>);
    /// Dropout's gradient (forward's mask again).
    fn dropout_backward(&mut self, a: dropout::Backward<Self::Write, Self::Read>);
}

/// Runs `tape` forward on `exec`. With `grad_scale`, a training forward: the logits are
/// left holding `grad_scale * d(Σ losses)/d(logits)` and every op what [`backward`] needs
/// (pass `1 / (N * micro_batches)` for the mean over accumulated batches).
pub fn forward<E: Executor>(exec: &mut E, tape: &[Op], grad_scale: Option<f64>) {
    forward_ops(exec, tape, 0..tape.len(), Pass::Forward, grad_scale.is_some(), grad_scale);
}

/// Runs `plan`'s `tape` backward on `exec` after a training [`forward`], accumulating
/// parameter gradients. The residual stream's gradient (`plan.scratch().dres`) must start at
/// zero. With [`Plan::recompute`], each block's forward is run again from its kept input
/// just before the block's backward.
pub fn backward<E: Executor>(exec: &mut E, plan: &Plan, tape: &[Op]) {
    if !plan.recompute() {
        return backward_ops(exec, tape, 0..tape.len());
    }
    let blocks = plan.config.n_layer;
    backward_ops(exec, tape, tape::block_ops(blocks - 1).end..tape.len());
    for layer in (0..blocks).rev() {
        let ops = tape::block_ops(layer);
        forward_ops(exec, tape, ops.clone(), Pass::Recompute, true, None);
        backward_ops(exec, tape, ops);
    }
    backward_ops(exec, tape, 0..tape::block_ops(0).start);
}

/// Ops `range` of `tape` forward; `training`: a backward follows.
fn forward_ops<E: Executor>(exec: &mut E, tape: &[Op], range: Range<usize>, pass: Pass, training: bool, grad_scale: Option<f64>) {
    for index in range {
        let op = &tape[index];
        exec.begin(pass, index, op);
        // SAFETY: the spans of one op are pairwise disjoint (the plan's guarantee).
        unsafe { forward_op(exec, op, training, grad_scale) };
        exec.end(pass, index, op);
    }
}

/// Ops `range` of `tape` backward, last first.
fn backward_ops<E: Executor>(exec: &mut E, tape: &[Op], range: Range<usize>) {
    for index in range.rev() {
        let op = &tape[index];
        exec.begin(Pass::Backward, index, op);
        // SAFETY: the spans of one op are pairwise disjoint, and distinct parameters never
        // overlap (the plan's guarantee).
        unsafe { backward_op(exec, op) };
        exec.end(Pass::Backward, index, op);
    }
}

/// # Safety
/// The spans `op` names are pairwise disjoint.
unsafe fn forward_op<E: Executor>(e: &mut E, op: &Op, training: bool, grad_scale: Option<f64>) {
    // SAFETY (all three): forwarded to the caller.
    let w = |s| unsafe { e.write(Arena::Acts, s) };
    let r = |s| unsafe { e.read(Arena::Acts, s) };
    let p = |s| unsafe { e.read(Arena::Params, s) };
    // Dropout runs in training walks only: the op writes its scratch, the dropout the output.
    let dropping = |d: Option<Dropped>| d.filter(|_| training);
    match *op {
        Op::Embedding { wte, wpe, out, seq, dropout, .. } => {
            let a = embedding::Forward { out: w(dropping(dropout).map_or(out, |d| d.scratch)), wte: p(wte), wpe: wpe.map(p), seq };
            e.embedding_forward(a);
            if let Some(d) = dropping(dropout) {
                // SAFETY: forwarded to the caller.
                unsafe { dropout_forward(e, d, out, None) }
            }
        }
        Op::LayerNorm { x, out, mean, rstd, weight, bias, .. } => {
            let a = layernorm::Forward { out: w(out), mean: w(mean), rstd: w(rstd), x: r(x), weight: p(weight), bias: p(bias) };
            e.layernorm_forward(a)
        }
        Op::RmsNorm { x, out, rstd, weight, eps, .. } => e.rmsnorm_forward(rmsnorm::Forward { out: w(out), rstd: w(rstd), x: r(x), weight: p(weight), eps }),
        Op::Matmul { x, weight, bias, out, epilogue, k, m, dropout, .. } => match dropping(dropout) {
            None => {
                let epilogue = epilogue.map(w, r);
                let a = matmul::Forward { out: w(out), x: r(x), weight: p(weight), bias: bias.map(p), epilogue, save_slope: training, k, m };
                e.matmul_forward(a)
            }
            Some(d) => {
                // The branch, dropped, then the residual added by the dropout.
                let residual = match epilogue {
                    matmul::Epilogue::Residual { input } => Some(input),
                    matmul::Epilogue::None => None,
                    matmul::Epilogue::Gelu { .. } | matmul::Epilogue::SwiGlu { .. } => unreachable!("the tape drops no activation's output"),
                };
                let a = matmul::Forward {
                    out: w(d.scratch),
                    x: r(x),
                    weight: p(weight),
                    bias: bias.map(p),
                    epilogue: matmul::Epilogue::None,
                    save_slope: training,
                    k,
                    m,
                };
                e.matmul_forward(a);
                // SAFETY: forwarded to the caller.
                unsafe { dropout_forward(e, d, out, residual) }
            }
        },
        Op::Attention { qkv, out, lse, shape, dropout, .. } => {
            let a = attention::Forward { out: w(out), lse: w(lse), qkv: r(qkv), shape, dropout: dropout.filter(|_| training) };
            e.attention_forward(a)
        }
        Op::CrossEntropy { logits, losses, classes } => {
            let a = cross_entropy::Forward { losses: w(losses), logits: w(logits), grad_scale, classes };
            e.cross_entropy(a)
        }
    }
}

/// `out = residual + dropout(d.scratch)`.
///
/// # Safety
/// The spans are pairwise disjoint.
unsafe fn dropout_forward<E: Executor>(e: &mut E, d: Dropped, out: Span, residual: Option<Span>) {
    // SAFETY: forwarded to the caller.
    let a = unsafe {
        dropout::Forward { out: e.write(Arena::Acts, out), y: e.read(Arena::Acts, d.scratch), residual: residual.map(|s| e.read(Arena::Acts, s)), site: d.site }
    };
    e.dropout_forward(a)
}

/// # Safety
/// As [`forward_op`].
unsafe fn backward_op<E: Executor>(e: &mut E, op: &Op) {
    // A dropped output's gradient first goes through the dropout into its scratch, which the
    // op then reads as its output's gradient (a residual's gradient is `dout` itself).
    let dropped_dout = match *op {
        Op::Embedding { dout, dropout: Some(d), .. } | Op::Matmul { dout, dropout: Some(d), .. } => {
            // SAFETY: forwarded to the caller.
            let a = unsafe { dropout::Backward { dy: e.write(Arena::Acts, d.scratch), dout: e.read(Arena::Acts, dout), site: d.site } };
            e.dropout_backward(a);
            Some(d.scratch)
        }
        _ => None,
    };
    // SAFETY (all four): forwarded to the caller.
    let w = |s| unsafe { e.write(Arena::Acts, s) };
    let r = |s| unsafe { e.read(Arena::Acts, s) };
    let p = |s| unsafe { e.read(Arena::Params, s) };
    let g = |s| unsafe { e.write(Arena::Grads, s) };
    match *op {
        Op::Embedding { wte, wpe, dout, seq, .. } => {
            let a = embedding::Backward { dwte: g(wte), dwpe: wpe.map(g), dout: r(dropped_dout.unwrap_or(dout)), seq };
            e.embedding_backward(a)
        }
        Op::LayerNorm { x, dx, dout, mean, rstd, weight, bias, .. } => {
            let a =
                layernorm::Backward { dx: w(dx), dweight: g(weight), dbias: g(bias), dout: r(dout), x: r(x), mean: r(mean), rstd: r(rstd), weight: p(weight) };
            e.layernorm_backward(a)
        }
        Op::RmsNorm { x, dx, dout, rstd, weight, .. } => {
            e.rmsnorm_backward(rmsnorm::Backward { dx: w(dx), dweight: g(weight), dout: r(dout), x: r(x), rstd: r(rstd), weight: p(weight) })
        }
        Op::Matmul { x, dx, weight, bias, dout, dh, epilogue, k, m, .. } => {
            let activation = match (epilogue, dh) {
                (matmul::Epilogue::Gelu { pre }, _) => Some(matmul::ActivationGrad::Gelu { slope: r(pre) }),
                (matmul::Epilogue::SwiGlu { .. }, Some(dh)) => Some(matmul::ActivationGrad::SwiGlu { dh: r(dh) }),
                _ => None,
            };
            let dout = w(dropped_dout.unwrap_or(dout));
            let a = matmul::Backward { dx: dx.map(w), dweight: g(weight), dbias: bias.map(g), dout, x: r(x), weight: p(weight), activation, k, m };
            e.matmul_backward(a)
        }
        Op::Attention { qkv, dqkv, out, dout, lse, shape, dropout } => {
            let a = attention::Backward { dqkv: w(dqkv), dout: r(dout), qkv: r(qkv), out: r(out), lse: r(lse), shape, dropout };
            e.attention_backward(a)
        }
        // The fused forward already left the logits' gradient in place.
        Op::CrossEntropy { .. } => {}
    }
}
