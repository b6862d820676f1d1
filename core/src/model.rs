//! The GPT: parameter initialisation and sampling on top of the tape.

use crate::cpu::{Batch, CpuExecutor};
use crate::float::Float;
use crate::parallel::Parallel;
use crate::plan::Plan;
use crate::rng::Rng;
use crate::tape::Op;
use crate::walk;

/// GPT-2 initialisation into `params` (nanoGPT's, for both families): weights and
/// embeddings N(0, 0.02), residual output projections N(0, 0.02 / sqrt(2 * n_layer)), biases
/// 0, norm weights 1.
pub fn init_params<T: Float>(plan: &Plan, params: &mut [T], rng: &mut Rng) {
    let proj_std = 0.02 / libm::sqrt(2.0 * plan.config.n_layer as f64);
    for info in plan.params() {
        let dst = &mut params[info.span.range()];
        match info.kind {
            k if k.is_norm_weight() => dst.fill(T::ONE),
            k if !k.is_matrix() => dst.fill(T::ZERO),
            k => {
                let std = if k.is_residual_projection() { proj_std } else { 0.02 };
                for x in dst.iter_mut() {
                    *x = T::from_f64(rng.normal() * std);
                }
            }
        }
    }
}

/// How many tokens to generate and how each is drawn from the logits (Hugging Face's
/// `GenerationConfig`: `max_new_tokens`, `temperature`, `top_k`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingConfig {
    /// Logits are divided by this; 0 means greedy (argmax).
    pub temperature: f64,
    /// Keep only the `top_k` most likely tokens (and ties); 0 keeps all.
    pub top_k: usize,
    /// Then keep only the most likely tokens whose probabilities add up to `top_p` (nucleus
    /// sampling; 1 keeps all).
    pub top_p: f64,
    /// Tokens to generate after the prompt.
    pub tokens: usize,
    /// A token that ends the generation (not emitted), as `<|endoftext|>`; `None`: none.
    pub stop: Option<u32>,
}

impl SamplingConfig {
    /// nanoGPT's `sample.py` defaults: temperature 0.8, top-k 200, all of the nucleus, no stop.
    pub const fn new(tokens: usize) -> Self {
        SamplingConfig { temperature: 0.8, top_k: 200, top_p: 1.0, tokens, stop: None }
    }
}

/// Draws a token id from one row of logits (nanoGPT's `sample.py`: temperature, then top-k,
/// then softmax and a multinomial draw; with `top_p`, Hugging Face's nucleus after top-k).
/// Uses `logits` as scratch; allocation-free.
pub fn sample_token<T: Float>(logits: &mut [T], cfg: &SamplingConfig, rng: &mut Rng) -> u32 {
    let argmax = logits.iter().enumerate().fold(0, |best, (i, &x)| if x > logits[best] { i } else { best });
    if cfg.temperature <= 0.0 {
        return argmax as u32;
    }
    let max = logits[argmax].to_f64();
    let threshold = if cfg.top_k > 0 && cfg.top_k < logits.len() { kth_largest(logits, cfg.top_k) } else { f64::NEG_INFINITY };
    let mut total = 0.0;
    for x in logits.iter_mut() {
        let v = x.to_f64();
        let p = if v >= threshold { libm::exp((v - max) / cfg.temperature) } else { 0.0 };
        total += p;
        *x = T::from_f64(p);
    }
    if cfg.top_p < 1.0 {
        // The smallest set of the most likely tokens holding `top_p` of the mass: those at or
        // above the threshold where the mass above first reaches it.
        let t = largest_threshold(logits, |t| logits.iter().map(|x| x.to_f64()).filter(|&p| p >= t).sum::<f64>() >= cfg.top_p * total);
        total = 0.0;
        for x in logits.iter_mut() {
            if x.to_f64() < t {
                *x = T::ZERO;
            }
            total += x.to_f64();
        }
    }
    let mut r = rng.next_f64() * total;
    for (i, p) in logits.iter().enumerate() {
        r -= p.to_f64();
        if r < 0.0 {
            return i as u32;
        }
    }
    argmax as u32
}

/// The `k`-th largest value of `xs` (1-based): no allocation.
fn kth_largest<T: Float>(xs: &[T], k: usize) -> f64 {
    largest_threshold(xs, |t| xs.iter().filter(|x| x.to_f64() >= t).count() >= k)
}

/// The largest value `t` of `xs` for which `holds(t)`, where `holds` is true at the smallest
/// value and turns false once as `t` grows (a count or a mass of the values at or above `t`),
/// by bisection on the value: no allocation.
fn largest_threshold<T: Float>(xs: &[T], holds: impl Fn(f64) -> bool) -> f64 {
    let (mut lo, mut hi) = xs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(x.to_f64()), hi.max(x.to_f64())));
    // Invariant: holds(lo); !holds(hi) (unless it holds at the largest value).
    if holds(hi) {
        return hi;
    }
    for _ in 0..200 {
        let mid = lo + (hi - lo) / 2.0;
        if mid <= lo || mid >= hi {
            break;
        }
        if holds(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    xs.iter().map(|x| x.to_f64()).filter(|&x| x >= lo).fold(f64::INFINITY, f64::min)
}

/// The tokens a model sees while generating: the most recent `window.len()` tokens, left
/// aligned; positions after the real ones are padding the causal mask ignores. Shared by
/// every executor's sampling loop.
pub struct ContextWindow<'w> {
    window: &'w mut [u32],
    filled: usize,
}

impl<'w> ContextWindow<'w> {
    /// A window over caller scratch `window` (the model's sequence length), holding the end
    /// of `context`. An empty context starts from token 0, as the padding would.
    pub fn new(window: &'w mut [u32], context: &[u32]) -> Self {
        assert!(!window.is_empty(), "a context window needs at least one position");
        let take = context.len().min(window.len());
        window[..take].copy_from_slice(&context[context.len() - take..]);
        window[take..].fill(0);
        ContextWindow { window, filled: take.max(1) }
    }

    /// The whole window (real tokens, then padding).
    pub fn tokens(&self) -> &[u32] {
        self.window
    }

    /// The position whose logits predict the next token.
    pub fn last(&self) -> usize {
        self.filled - 1
    }

    /// Appends `next`, dropping the oldest token when the window is full; true when it did
    /// (every token moved to another position: a KV cache of the window no longer holds).
    pub fn push(&mut self, next: u32) -> bool {
        let t = self.window.len();
        let slides = self.filled == t;
        if slides {
            self.window.copy_within(1.., 0);
            self.window[t - 1] = next;
        } else {
            self.window[self.filled] = next;
            self.filled += 1;
        }
        slides
    }
}

/// The memory [`generate`] runs in, borrowed: a batch-1 plan, its tape and activations, and
/// scratch for the context window (`plan.seq` tokens); with `decoding`, a KV cache.
pub struct SamplingMemory<'a, T> {
    /// The plan (batch 1).
    pub plan: &'a Plan,
    /// Its tape.
    pub tape: &'a [Op],
    /// Its activations.
    pub acts: &'a mut [T],
    /// Window scratch, `plan.seq` tokens.
    pub window: &'a mut [u32],
    /// With it, each token within the context costs one token's forward instead of the whole
    /// window's (a KV cache, as Hugging Face's `use_cache`).
    pub decoding: Option<DecodingMemory<'a, T>>,
}

/// What [`generate`] decodes single tokens with: a plan of batch 1 and sequence 1 of the same
/// model, its tape and activations, and the KV cache of the window (see [`kv_cache_len`]).
pub struct DecodingMemory<'a, T> {
    /// The one-token plan.
    pub plan: &'a Plan,
    /// Its tape.
    pub tape: &'a [Op],
    /// Its activations.
    pub acts: &'a mut [T],
    /// Keys and values of the window's positions, `[n_layer, 2, window, KVH * HS]` (the
    /// keys rotated where the model has RoPE).
    pub cache: &'a mut [T],
}

/// Elements of the KV cache of a model of `plan` for a window of `plan.seq` tokens: only the
/// key/value heads'.
pub fn kv_cache_len(plan: &Plan) -> usize {
    plan.config.n_layer * 2 * plan.seq * plan.config.kv_heads() * plan.config.head_size()
}

/// Copies the keys and values of positions `..filled` of every layer from the activations of
/// a forward of `plan` (batch 1) into `cache` (`[n_layer, 2, plan.seq, KVH * HS]`), rotating
/// the keys as attention did.
fn fill_cache<T: Float>(plan: &Plan, acts: &[T], cache: &mut [T], filled: usize) {
    let (c, t, w) = (plan.config.n_embd, plan.seq, plan.config.qkv_width());
    let (kv, hs, rope) = (plan.config.kv_heads() * plan.config.head_size(), plan.config.head_size(), plan.attention_shape().rope);
    for (l, layer) in cache.chunks_exact_mut(2 * t * kv).enumerate() {
        let qkv = &acts[plan.layer_acts(l).qkv.range()];
        let (keys, values) = layer.split_at_mut(t * kv);
        for i in 0..filled {
            let key = &mut keys[i * kv..(i + 1) * kv];
            key.copy_from_slice(&qkv[i * w + c..i * w + c + kv]);
            if let Some(rope) = rope {
                rope.rotate_row(key, i, hs);
            }
            values[i * kv..(i + 1) * kv].copy_from_slice(&qkv[i * w + c + kv..(i + 1) * w]);
        }
    }
}

/// Generates `cfg.tokens` tokens after `context` with `params`, calling `emit` with each. The
/// model sees the last `plan.seq` tokens (see [`ContextWindow`]). With `mem.decoding`, the
/// prompt fills the KV cache (token by token when it is short, else in one window's forward)
/// and every later token within the window is one token's forward against it; once the
/// window slides, each token is a whole window's forward again (the positions move).
pub fn generate<T: Float>(
    par: &dyn Parallel,
    mem: SamplingMemory<'_, T>,
    params: &[T],
    context: &[u32],
    cfg: &SamplingConfig,
    rng: &mut Rng,
    mut emit: impl FnMut(u32),
) {
    let SamplingMemory { plan, tape, acts, window, mut decoding } = mem;
    assert!(plan.batch == 1 && window.len() == plan.seq, "generate needs a batch-1 plan and a window of plan.seq tokens");
    assert!(!plan.recompute(), "the KV cache reads every layer's activations");
    let (v, classes) = (plan.config.vocab_size, plan.classes());
    let mut window = ContextWindow::new(window, context);
    // The window positions whose keys and values the cache holds.
    let mut cached = 0;
    for _ in 0..cfg.tokens {
        let last = window.last();
        let logits = match decoding.as_mut() {
            // The cache holds every position before the last, or there are few enough tokens
            // that one-token forwards of them all cost less than a whole window's (a one-row
            // product streams the weights once per token, a GEMM reuses them: about four
            // times the cost a token).
            Some(d) if cached == last || (cached == 0 && 4 * (last + 1) <= plan.seq) => {
                for position in cached..=last {
                    let token = [window.tokens()[position]];
                    let mut cpu = CpuExecutor::new(par, d.plan, params, d.acts, Batch { tokens: &token, targets: None }).decoding(d.cache, position);
                    walk::forward(&mut cpu, d.tape, None);
                }
                cached = last + 1;
                &mut d.acts[d.plan.head_acts().logits.range()][..classes]
            }
            _ => {
                walk::forward(&mut CpuExecutor::new(par, plan, params, acts, Batch { tokens: window.tokens(), targets: None }), tape, None);
                if let Some(d) = decoding.as_mut() {
                    fill_cache(plan, acts, d.cache, last + 1);
                    cached = last + 1;
                }
                &mut acts[plan.head_acts().logits.range()][last * v..last * v + classes]
            }
        };
        let next = sample_token(logits, cfg, rng);
        if cfg.stop == Some(next) {
            return;
        }
        emit(next);
        if window.push(next) {
            cached = 0;
        }
    }
}

/// Memory for sampling from a model with batch 1: its plan, tape, activations and context
/// window, allocated once; the parameters are passed to each call (a trainer's, a checkpoint's).
#[cfg(feature = "alloc")]
pub struct Sampler<T> {
    plan: Plan,
    tape: alloc::vec::Vec<Op>,
    acts: alloc::vec::Vec<T>,
    window: alloc::vec::Vec<u32>,
    /// The one-token plan, its tape and activations, and the KV cache.
    token_plan: Plan,
    token_tape: alloc::vec::Vec<Op>,
    token_acts: alloc::vec::Vec<T>,
    cache: alloc::vec::Vec<T>,
}

#[cfg(feature = "alloc")]
impl<T: Float> Sampler<T> {
    /// Sampling memory for `config` with a context of `seq` tokens (at most the block size),
    /// drawing from its first `classes` tokens (the tokenizer's; see [`Plan::with_classes`]),
    /// with a KV cache.
    pub fn new(config: crate::GptConfig, classes: usize, seq: usize) -> Result<Self, crate::ConfigError> {
        let plan = Plan::new(config, 1, seq)?.with_classes(classes)?;
        let token_plan = Plan::new(config, 1, 1)?.with_classes(classes)?;
        Ok(Sampler {
            tape: crate::tape::record_to_vec(&plan),
            acts: crate::plan::try_vec("activations", plan.acts_len(), T::ZERO)?,
            window: alloc::vec![0; seq],
            token_tape: crate::tape::record_to_vec(&token_plan),
            token_acts: crate::plan::try_vec("activations", token_plan.acts_len(), T::ZERO)?,
            cache: crate::plan::try_vec("KV cache", kv_cache_len(&plan), T::ZERO)?,
            plan,
            token_plan,
        })
    }

    /// Generates `cfg.tokens` tokens after `prompt` with `params`, calling `emit` with each
    /// (see [`generate`]).
    pub fn generate(&mut self, par: &dyn Parallel, params: &[T], prompt: &[u32], cfg: &SamplingConfig, rng: &mut Rng, emit: impl FnMut(u32)) {
        let decoding = DecodingMemory { plan: &self.token_plan, tape: &self.token_tape, acts: &mut self.token_acts, cache: &mut self.cache };
        let mem = SamplingMemory { plan: &self.plan, tape: &self.tape, acts: &mut self.acts, window: &mut self.window, decoding: Some(decoding) };
        generate(par, mem, params, prompt, cfg, rng, emit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_window_keeps_the_most_recent_tokens() {
        let mut scratch = [9u32; 3];
        let mut w = ContextWindow::new(&mut scratch, &[]);
        assert_eq!((w.tokens(), w.last()), (&[0, 0, 0][..], 0));
        assert!(!w.push(5), "a window with room does not slide");
        assert_eq!((w.tokens(), w.last()), (&[0, 5, 0][..], 1));
        let mut w = ContextWindow::new(&mut scratch, &[1, 2, 3, 4]);
        assert_eq!((w.tokens(), w.last()), (&[2, 3, 4][..], 2));
        assert!(w.push(7), "a full window slides");
        assert_eq!((w.tokens(), w.last()), (&[3, 4, 7][..], 2));
        let mut w = ContextWindow::new(&mut scratch, &[8]);
        assert!(!w.push(6));
        assert_eq!((w.tokens(), w.last()), (&[8, 6, 0][..], 1));
    }

    /// With the KV cache, generation draws the tokens the whole-window forwards draw: greedy
    /// and sampled, the prompt (3 tokens) in one forward or token by token, through the
    /// window sliding (20 generated).
    #[test]
    fn the_kv_cache_generates_what_whole_windows_do() {
        let gpt2 = crate::GptConfig::gpt2(11, 16, 2, 2, 8);
        check_kv_cache(gpt2);
        // Grouped heads (two per key/value head), rotary positions.
        let llama = crate::Llama { n_kv_head: 1, intermediate_size: 12, norm_eps: 1e-5, rope_theta: 100.0, rope_scaling: None, qkv_bias: true, tied: false };
        check_kv_cache(crate::GptConfig { arch: crate::Arch::Llama(llama), ..gpt2 });
    }

    fn check_kv_cache(config: crate::GptConfig) {
        let mut params = alloc::vec![0f32; Plan::new(config, 1, 1).unwrap().params_len()];
        init_params(&Plan::new(config, 1, 1).unwrap(), &mut params, &mut Rng::new(5));
        // Larger weights than GPT-2's initialisation, so that the logits differ enough to
        // make every draw count.
        params.iter_mut().for_each(|x| *x *= 20.0);
        // A window of 8 takes the prompt in one forward, one of 16 token by token.
        for seq in [8, 16] {
            let plan = Plan::new(config, 1, seq).unwrap();
            let mut sampler = Sampler::<f32>::new(config, 11, seq).unwrap();
            let tape = crate::tape::record_to_vec(&plan);
            for cfg in
                [SamplingConfig { temperature: 0.0, ..SamplingConfig::new(20) }, SamplingConfig { temperature: 1.0, top_k: 0, ..SamplingConfig::new(20) }]
            {
                let (mut cached, mut whole) = (alloc::vec::Vec::new(), alloc::vec::Vec::new());
                sampler.generate(&crate::Serial, &params, &[1, 2, 3], &cfg, &mut Rng::new(9), |t| cached.push(t));
                let (mut acts, mut window) = (alloc::vec![0f32; plan.acts_len()], alloc::vec![0u32; seq]);
                let mem = SamplingMemory { plan: &plan, tape: &tape, acts: &mut acts, window: &mut window, decoding: None };
                generate(&crate::Serial, mem, &params, &[1, 2, 3], &cfg, &mut Rng::new(9), |t| whole.push(t));
                assert_eq!(cached, whole, "window {seq}, temperature {}", cfg.temperature);
                assert!(cached.iter().any(|&t| t != cached[0]), "a degenerate model: {cached:?}");
            }
        }
    }

    #[test]
    fn kth_largest_finds_the_value() {
        let xs = [0.3f32, -1.0, 2.5, 2.5, 0.0, 7.0];
        assert_eq!(kth_largest(&xs, 1), 7.0);
        assert_eq!(kth_largest(&xs, 2), 2.5);
        assert_eq!(kth_largest(&xs, 3), 2.5);
        assert_eq!(kth_largest(&xs, 4), 0.3f32 as f64);
        assert_eq!(kth_largest(&xs, 6), -1.0);
    }

    #[test]
    fn top_k_one_is_greedy_and_respects_temperature_zero() {
        let mut rng = Rng::new(3);
        for _ in 0..20 {
            let mut l = [0.1f32, 3.0, 2.9, -4.0];
            assert_eq!(sample_token(&mut l, &SamplingConfig { temperature: 1.0, top_k: 1, ..SamplingConfig::new(1) }, &mut rng), 1);
            let mut l = [0.1f32, 3.0, 2.9, -4.0];
            assert_eq!(sample_token(&mut l, &SamplingConfig { temperature: 0.0, top_k: 0, ..SamplingConfig::new(1) }, &mut rng), 1);
        }
    }

    #[test]
    fn sampling_follows_the_softmax() {
        let mut rng = Rng::new(9);
        let mut counts = [0usize; 3];
        let n = 60_000;
        for _ in 0..n {
            let mut l = [0.0f32, 1.0, 2.0];
            counts[sample_token(&mut l, &SamplingConfig { temperature: 1.0, top_k: 0, ..SamplingConfig::new(1) }, &mut rng) as usize] += 1;
        }
        let z: f64 = (0..3).map(|i| libm::exp(i as f64)).sum();
        for (i, &c) in counts.iter().enumerate() {
            let p = libm::exp(i as f64) / z;
            assert!((c as f64 / n as f64 - p).abs() < 0.01, "token {i}: {c}");
        }
    }

    /// Nucleus sampling keeps the fewest most likely tokens whose probabilities reach top_p
    /// (Hugging Face's TopPLogitsWarper), renormalised.
    #[test]
    fn top_p_keeps_the_nucleus() {
        let probs = [0.05, 0.5, 0.15, 0.3];
        for (top_p, kept) in [(0.5, &[1][..]), (0.7, &[1, 3]), (0.9, &[1, 3, 2]), (1.0, &[1, 3, 2, 0])] {
            let mut rng = Rng::new(4);
            let mut counts = [0usize; 4];
            let n = 40_000;
            for _ in 0..n {
                let mut l: [f32; 4] = probs.map(|p: f64| libm::log(p) as f32);
                counts[sample_token(&mut l, &SamplingConfig { temperature: 1.0, top_k: 0, top_p, ..SamplingConfig::new(1) }, &mut rng) as usize] += 1;
            }
            let mass: f64 = kept.iter().map(|&i| probs[i]).sum();
            for (i, &c) in counts.iter().enumerate() {
                let want = if kept.contains(&i) { probs[i] / mass } else { 0.0 };
                assert!((c as f64 / n as f64 - want).abs() < 0.01, "top_p {top_p}, token {i}: {c} of {n}");
            }
        }
    }
}
