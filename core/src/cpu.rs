//! The CPU executor of the [walk](crate::walk): each op's kernel from [`crate::ops`] runs as
//! the walk reaches it, over slices of caller-owned arenas, split across `par`'s threads.
//!
//! Unstable: public for the trainer, the samplers and the tests; it changes with any release
//! (see the crate's Stability section).

use crate::float::Float;
use crate::gemm::Operands;
use crate::ops::dropout::{self, DropoutKey};
use crate::ops::{attention, cross_entropy, embedding, layernorm, matmul, rmsnorm};
use crate::parallel::Parallel;
use crate::plan::{Plan, Scratch, Span};
use crate::tape::{FinishedGradients, Observer, Op, Pass};
use crate::walk::{Arena, Executor};
use core::marker::PhantomData;

/// The step's token ids: inputs `[N]` and, for a loss, targets `[N]`.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    /// Input tokens `[N]`.
    pub tokens: &'a [u32],
    /// Next tokens `[N]`; without them the walk computes logits only.
    pub targets: Option<&'a [u32]>,
}

/// An arena the executor hands out disjoint slices of (see [`Executor::write`]).
struct RawArena<T> {
    ptr: *mut T,
    len: usize,
}

impl<T> RawArena<T> {
    fn new(s: &mut [T]) -> Self {
        RawArena { ptr: s.as_mut_ptr(), len: s.len() }
    }

    /// # Safety
    /// No other live slice from this arena may overlap `span`.
    #[allow(clippy::mut_from_ref)]
    unsafe fn get<'a>(&self, span: Span) -> &'a mut [T] {
        assert!(span.end() <= self.len, "span {span:?} outside arena of {}", self.len);
        // SAFETY: in bounds (checked) and exclusive (caller).
        unsafe { core::slice::from_raw_parts_mut(self.ptr.add(span.offset), span.len) }
    }
}

/// Where a backward walk hands out the gradients it has finished (see
/// [`CpuExecutor::handing_out_finished`]).
struct Finished<'a, T> {
    take: &'a mut dyn FnMut(&'a mut [T]),
    gradients: FinishedGradients,
}

/// A decoding walk's KV cache and position (see [`CpuExecutor::decoding`]).
struct Decoding<'a, T> {
    cache: &'a mut [T],
    pos: usize,
}

/// Runs a walk's ops on the CPU over `params`, `acts` (and `grads` for a backward walk) with
/// the token ids of `batch`. After a forward walk with targets, [`CpuExecutor::loss`] is the
/// batch's mean loss.
pub struct CpuExecutor<'a, T> {
    par: &'a dyn Parallel,
    scratch: Scratch,
    params: &'a [T],
    grads: Option<RawArena<T>>,
    acts: RawArena<T>,
    batch: Batch<'a>,
    dropout_key: Option<DropoutKey>,
    /// What the products' operands (the linear layers' and attention's) are rounded to.
    operands: Operands,
    decoding: Option<Decoding<'a, T>>,
    n_layer: usize,
    /// The block of the op running (for the KV cache).
    layer: usize,
    observer: Option<&'a mut dyn Observer>,
    finished: Option<Finished<'a, T>>,
    loss: Option<f64>,
    /// The arenas stay borrowed while the executor lives.
    _arenas: PhantomData<&'a mut [T]>,
}

impl<'a, T: Float> CpuExecutor<'a, T> {
    /// An executor for `plan`'s tape over its arenas, for forward walks.
    pub fn new(par: &'a dyn Parallel, plan: &Plan, params: &'a [T], acts: &'a mut [T], batch: Batch<'a>) -> Self {
        let n = plan.tokens();
        assert!(params.len() == plan.params_len() && acts.len() == plan.acts_len(), "arenas of another plan");
        assert!(batch.tokens.len() == n && batch.targets.is_none_or(|y| y.len() == n), "a batch of {n} tokens");
        let acts = RawArena::new(acts);
        let n_layer = plan.config.n_layer;
        CpuExecutor {
            par,
            scratch: plan.scratch(),
            params,
            grads: None,
            acts,
            batch,
            dropout_key: None,
            operands: Operands::F32,
            decoding: None,
            n_layer,
            layer: 0,
            observer: None,
            finished: None,
            loss: None,
            _arenas: PhantomData,
        }
    }

    /// With the gradients arena, for backward walks.
    pub fn with_grads(mut self, grads: &'a mut [T]) -> Self {
        assert_eq!(grads.len(), self.params.len(), "gradients of another plan");
        self.grads = Some(RawArena::new(grads));
        self
    }

    /// Drawing the dropout masks of a training walk (of a plan with dropout) with `key`, the
    /// micro-batch's (see [`crate::Plan::dropout_key`]).
    pub fn with_dropout_key(mut self, key: DropoutKey) -> Self {
        self.dropout_key = Some(key);
        self
    }

    /// The products (the linear layers' and attention's) with `operands` (bf16: `T` is f32 and
    /// the CPU has the bf16 kernel).
    pub fn with_operands(mut self, operands: Operands) -> Self {
        self.operands = operands;
        self
    }

    /// Decoding one token at position `pos` (a plan of batch 1 and sequence 1) against
    /// `cache`, every layer's keys and values `[n_layer, 2, T, C]` for the positions before it
    /// (see [`attention::decode`]); the token's own are written there.
    pub fn decoding(mut self, cache: &'a mut [T], pos: usize) -> Self {
        self.decoding = Some(Decoding { cache, pos });
        self
    }

    /// The micro-batch's dropout key.
    fn key(&self) -> DropoutKey {
        self.dropout_key.expect("a training walk with dropout needs the micro-batch's dropout key (with_dropout_key)")
    }

    /// Handing `take`, after each op of a backward walk, the gradients that op finished (maybe
    /// none; see [`FinishedGradients`]). The slices come in descending order and are never
    /// touched by the walk again; what is left when the walk ends (the tables) is
    /// `grads[..len - handed out]`. Data parallelism sums them while the backward goes on.
    pub fn handing_out_finished(mut self, plan: &Plan, take: &'a mut dyn FnMut(&'a mut [T])) -> Self {
        self.finished = Some(Finished { take, gradients: FinishedGradients::new(plan) });
        self
    }

    /// Reporting the start and end of every op to `observer`.
    pub fn observed(mut self, observer: &'a mut dyn Observer) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The mean loss of the last forward walk with targets.
    pub fn loss(&self) -> Option<f64> {
        self.loss
    }

    /// One of the plan's scratch spans.
    fn scratch(&self, span: Span) -> &'a mut [T] {
        // SAFETY: scratch spans overlap no span of the tape's ops (the plan's guarantee), and
        // each kernel call takes each at most once.
        unsafe { self.acts.get(span) }
    }
}

impl<'a, T: Float> Executor for CpuExecutor<'a, T> {
    type Write = &'a mut [T];
    type Read = &'a [T];

    unsafe fn write(&self, arena: Arena, span: Span) -> &'a mut [T] {
        // SAFETY (both): the caller's.
        match arena {
            Arena::Acts => unsafe { self.acts.get(span) },
            Arena::Grads => unsafe { self.grads.as_ref().expect("a backward walk needs the gradients arena").get(span) },
            Arena::Params => unreachable!("a walk never writes parameters"),
        }
    }

    unsafe fn read(&self, arena: Arena, span: Span) -> &'a [T] {
        match arena {
            Arena::Params => &self.params[span.range()],
            // SAFETY: the caller's.
            _ => unsafe { self.write(arena, span) },
        }
    }

    fn begin(&mut self, pass: Pass, index: usize, op: &Op) {
        self.layer = crate::tape::block_of(index, self.n_layer).unwrap_or(self.layer);
        if let Some(o) = self.observer.as_mut() {
            o.begin(pass, index, op);
        }
    }

    fn end(&mut self, pass: Pass, index: usize, op: &Op) {
        if let Some(o) = self.observer.as_mut() {
            o.end(pass, index, op);
        }
        if let (Pass::Backward, Some(f), Some(grads)) = (pass, self.finished.as_mut(), self.grads.as_ref()) {
            // SAFETY: no op of the rest of the walk writes this span (see `FinishedGradients`),
            // and it was never handed out before.
            let done = unsafe { grads.get(f.gradients.after(op)) };
            (f.take)(done);
        }
    }

    fn embedding_forward(&mut self, a: embedding::Forward<&'a mut [T], &'a [T]>) {
        match &self.decoding {
            // The token's position row of the table.
            Some(d) => {
                let c = a.out.len();
                embedding::forward(self.par, embedding::Forward { wpe: a.wpe.map(|wpe| &wpe[d.pos * c..]), ..a }, self.batch.tokens)
            }
            None => embedding::forward(self.par, a, self.batch.tokens),
        }
    }

    fn embedding_backward(&mut self, a: embedding::Backward<&'a mut [T], &'a [T]>) {
        embedding::backward(self.par, a, self.batch.tokens)
    }

    fn layernorm_forward(&mut self, a: layernorm::Forward<&'a mut [T], &'a [T]>) {
        layernorm::forward(self.par, a)
    }

    fn layernorm_backward(&mut self, a: layernorm::Backward<&'a mut [T], &'a [T]>) {
        layernorm::backward(self.par, a, self.scratch(self.scratch.partials))
    }

    fn rmsnorm_forward(&mut self, a: rmsnorm::Forward<&'a mut [T], &'a [T]>) {
        rmsnorm::forward(self.par, a)
    }

    fn rmsnorm_backward(&mut self, a: rmsnorm::Backward<&'a mut [T], &'a [T]>) {
        rmsnorm::backward(self.par, a, self.scratch(self.scratch.partials))
    }

    fn matmul_forward(&mut self, a: matmul::Forward<&'a mut [T], &'a [T]>) {
        matmul::forward(self.par, a, self.scratch(self.scratch.wt), self.operands)
    }

    fn matmul_backward(&mut self, a: matmul::Backward<&'a mut [T], &'a [T]>) {
        matmul::backward(self.par, a, self.scratch(self.scratch.partials), self.scratch(self.scratch.wt), self.operands)
    }

    fn attention_forward(&mut self, a: attention::Forward<&'a mut [T], &'a [T]>) {
        let layer = self.layer;
        let scratch = self.scratch(self.scratch.attention);
        match &mut self.decoding {
            Some(d) => {
                let per_layer = d.cache.len() / self.n_layer;
                let kv_width = a.shape.kv_heads * a.shape.head_size;
                let cache = attention::KvCache { rows: &mut d.cache[layer * per_layer..(layer + 1) * per_layer], len: per_layer / (2 * kv_width) };
                attention::decode(self.par, a, cache, d.pos, scratch)
            }
            None => attention::forward(self.par, a, scratch, self.dropout_key, self.operands),
        }
    }

    fn attention_backward(&mut self, a: attention::Backward<&'a mut [T], &'a [T]>) {
        attention::backward(self.par, a, self.scratch(self.scratch.attention), self.dropout_key, self.operands)
    }

    fn dropout_forward(&mut self, a: dropout::Forward<&'a mut [T], &'a [T]>) {
        dropout::forward(self.par, a, self.key())
    }

    fn dropout_backward(&mut self, a: dropout::Backward<&'a mut [T], &'a [T]>) {
        dropout::backward(self.par, a, self.key())
    }

    fn cross_entropy(&mut self, a: cross_entropy::Forward<&'a mut [T]>) {
        if let Some(targets) = self.batch.targets {
            let cross_entropy::Forward { losses, logits, grad_scale, classes } = a;
            cross_entropy::forward(self.par, cross_entropy::Forward { losses: &mut *losses, logits, grad_scale, classes }, targets);
            self.loss = Some(cross_entropy::mean(losses));
        }
    }
}

#[cfg(test)]
mod model_gradient_tests {
    use super::*;
    use crate::config::GptConfig;
    use crate::ops::gradcheck::{assert_close, numeric_grad, random};
    use crate::parallel::Serial;
    use crate::rng::Rng;
    use crate::tape::record_to_vec;
    use crate::walk;

    /// The whole model's backward against central differences of its loss, in f64, without
    /// and with dropout (the same masks in every forward of the check); for the Llama family
    /// with grouped heads, q/k/v biases or none, tied and untied heads, Llama 3's RoPE
    /// scaling, and activation checkpointing.
    #[test]
    fn whole_model_gradients_match_finite_differences() {
        let cfg = GptConfig::gpt2(7, 5, 2, 2, 6);
        let plain = Plan::new(cfg, 2, 4).unwrap();
        assert_eq!(plain.with_dropout(0.0, 9), Ok(plain), "dropout 0 is the plan without dropout");
        check_whole_model(plain);
        let scaling = crate::config::RopeScaling { factor: 4.0, low_freq_factor: 1.0, high_freq_factor: 2.0, original_max_position_embeddings: 8 };
        for (qkv_bias, tied, rope_scaling) in [(true, false, None), (false, true, Some(scaling))] {
            let llama = crate::config::Llama { n_kv_head: 1, intermediate_size: 20, norm_eps: 1e-5, rope_theta: 50.0, rope_scaling, qkv_bias, tied };
            let cfg = GptConfig { arch: crate::config::Arch::Llama(llama), ..GptConfig::gpt2(7, 5, 2, 2, 8) };
            let plan = Plan::new(cfg, 2, 4).unwrap();
            check_whole_model(plan);
            check_whole_model(plan.with_recompute(true));
        }
    }

    fn check_whole_model(plain: Plan) {
        for plan in [plain, plain.with_dropout(0.3, 9).unwrap()] {
            let key = plan.dropout_key(5);
            let tape = record_to_vec(&plan);
            let mut rng = Rng::new(11);
            let mut params = random(&mut rng, plan.params_len(), 0.5);
            let tokens: Vec<u32> = (0..8).map(|_| rng.below(7) as u32).collect();
            let targets: Vec<u32> = (0..8).map(|_| rng.below(7) as u32).collect();
            let batch = Batch { tokens: &tokens, targets: Some(&targets) };
            let mut acts = vec![0.0; plan.acts_len()];
            let mut grads = vec![0.0; plan.params_len()];
            let mut cpu = CpuExecutor::new(&Serial, &plan, &params, &mut acts, batch).with_grads(&mut grads).with_dropout_key(key);
            walk::forward(&mut cpu, &tape, Some(1.0 / plan.tokens() as f64));
            walk::backward(&mut cpu, &plan, &tape);
            let numeric = numeric_grad(&mut params, |p| {
                let mut cpu = CpuExecutor::new(&Serial, &plan, p, &mut acts, batch).with_dropout_key(key);
                walk::forward(&mut cpu, &tape, Some(1.0));
                cpu.loss().unwrap()
            });
            for info in plan.params() {
                let r = info.span.range();
                assert_close(&format!("{info} (dropout {}, recompute {})", plan.dropout(), plan.recompute()), &grads[r.clone()], &numeric[r]);
            }
        }
    }

    /// Dropout drops in training walks only: an evaluation forward of a plan with dropout
    /// gives the loss of the plan without, and a training forward another.
    #[test]
    fn evaluation_never_drops() {
        let cfg = GptConfig::gpt2(7, 5, 2, 2, 6);
        let plain = Plan::new(cfg, 2, 4).unwrap();
        let params = random(&mut Rng::new(3), plain.params_len(), 0.5);
        let tokens: Vec<u32> = (0..8).map(|i| i % 7).collect();
        let batch = Batch { tokens: &tokens, targets: Some(&tokens) };
        let loss = |plan: Plan, training: bool| {
            let mut acts = vec![0.0; plan.acts_len()];
            let mut cpu = CpuExecutor::new(&Serial, &plan, &params, &mut acts, batch).with_dropout_key(plan.dropout_key(0));
            walk::forward(&mut cpu, &record_to_vec(&plan), training.then_some(1.0));
            cpu.loss().unwrap()
        };
        let dropping = plain.with_dropout(0.5, 1).unwrap();
        assert_eq!(loss(dropping, false).to_bits(), loss(plain, false).to_bits());
        assert_eq!(loss(plain, true).to_bits(), loss(plain, false).to_bits());
        assert_ne!(loss(dropping, true), loss(plain, true));
    }
}
