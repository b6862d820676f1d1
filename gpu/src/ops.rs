//! The dispatches of each op family, forward and backward side by side: the GPU twins of
//! `alpha_core::ops`, with the same arguments as views of device buffers. Shapes in comments
//! use `N` rows (`B*T` tokens), `C` channels, `V` vocabulary.

use crate::kernels::{rows_grid, Kernel, ProgramBuilder, View};
use alpha_core::ops::attention::AttentionShape;
use alpha_core::ops::matmul::Epilogue;
use alpha_core::ops::row_blocks::blocks;
use alpha_core::ops::{attention, cross_entropy, embedding, layernorm, matmul};
use alpha_core::optim::AdamWConfig;

const EPI_ACCUMULATE: u32 = 1;
const EPI_BIAS: u32 = 2;
const EPI_GELU: u32 = 4;
const EPI_RESIDUAL: u32 = 8;
const EPI_GELU_SLOPE: u32 = 16;

fn u(x: usize) -> u32 {
    u32::try_from(x).expect("GPU shapes fit in 32 bits (checked when the trainer is built)")
}

/// Workgroups (64 x 64 output tiles) a weight gradient aims for: one with fewer tiles splits
/// its depth (the tokens) into chunks, each a slice of its own, summed afterwards in order.
const SPLIT_TARGET_GROUPS: usize = 512;
/// Smallest depth chunk of a split weight gradient.
const SPLIT_MIN_DEPTH: usize = 128;

/// Depth chunks of the weight gradient `dw [M, K] += doutᵀ·x` over `n` rows (1: not split).
pub fn weight_grad_splits(n: usize, k: usize, m: usize) -> usize {
    let tiles = m.div_ceil(64) * k.div_ceil(64);
    SPLIT_TARGET_GROUPS.div_ceil(tiles).min(n / SPLIT_MIN_DEPTH).max(1)
}

/// Scratch elements [`matmul_backward`] needs for a weight gradient: one `M x K` slice per
/// depth chunk, none when it is not split.
pub fn weight_grad_scratch_len(n: usize, k: usize, m: usize) -> usize {
    match weight_grad_splits(n, k, m) {
        1 => 0,
        splits => splits * m * k,
    }
}

/// `c[rows, cols] (+)= a·b` with `a[i, k]` at `i*a_rs + k*a_cs`, `b[k, j]` at `k*b_rs + j*b_cs`;
/// with `splits` above 1, chunk `z` of the depth goes to slice `z` of `c` (`rows * cols`
/// each), without epilogue.
#[allow(clippy::too_many_arguments)]
fn gemm<'a>(
    p: &mut ProgramBuilder<'a>,
    c: View<'a>,
    a: View<'a>,
    b: View<'a>,
    bias: Option<View<'a>>,
    aux: Option<View<'a>>,
    flags: u32,
    [rows, cols, depth]: [usize; 3],
    [a_rs, a_cs, b_rs, b_cs]: [usize; 4],
    splits: usize,
) {
    let chunk = depth.div_ceil(splits);
    let words = [u(rows), u(cols), u(depth), flags, u(a_rs), u(a_cs), u(b_rs), u(b_cs), u(chunk)];
    p.push(Kernel::Matmul, &words, &[Some(a), Some(b), Some(c), bias, aux], [u(cols.div_ceil(64)), u(rows.div_ceil(64)), u(depth.div_ceil(chunk))]);
}

/// Forward: `out [N, M] = epilogue(x [N, K] · w [M, K]ᵀ + bias [M])`.
pub fn matmul_forward<'a>(p: &mut ProgramBuilder<'a>, a: matmul::Forward<View<'a>, View<'a>>) {
    let matmul::Forward { out, x, weight, bias, epilogue, save_slope, k, m } = a;
    let n = x.len / k;
    let (aux, epi) = match epilogue {
        Epilogue::None => (None, 0),
        Epilogue::Gelu { pre } => (Some(pre), if save_slope { EPI_GELU | EPI_GELU_SLOPE } else { EPI_GELU }),
        Epilogue::Residual { input } => (Some(input), EPI_RESIDUAL),
    };
    let flags = epi | if bias.is_some() { EPI_BIAS } else { 0 };
    gemm(p, out, x, weight, bias, aux, flags, [n, m, k], [k, 1, 1, k], 1);
}

/// Backward: GELU backward in place on `dout [N, M]` (`*= gelu_slope`), `dbias += Σ rows`,
/// `dx [N, K] = dout·w` (overwritten), `dw [M, K] += doutᵀ·x`. `partials`: at least
/// `blocks(N) * M` elements of scratch; `split`: at least [`weight_grad_scratch_len`] (for a
/// weight gradient split by depth).
pub fn matmul_backward<'a>(p: &mut ProgramBuilder<'a>, a: matmul::Backward<View<'a>, View<'a>>, partials: View<'a>, split: View<'a>) {
    let matmul::Backward { dx, dweight: dw, dbias, dout, x, weight: w, gelu_slope, k, m } = a;
    let n = x.len / k;
    if gelu_slope.is_some() || dbias.is_some() {
        let words = [u(n), u(m), u32::from(gelu_slope.is_some())];
        p.push(Kernel::BiasGrad, &words, &[Some(dout), gelu_slope, Some(partials)], [u(m.div_ceil(64)), u(blocks(n)), 1]);
    }
    if let Some(db) = dbias {
        add_partials(p, db, partials, blocks(n), m, 0);
    }
    if let Some(dx) = dx {
        gemm(p, dx, dout, w, None, None, 0, [n, k, m], [m, 1, k, 1], 1);
    }
    match weight_grad_splits(n, k, m) {
        1 => gemm(p, dw, dout, x, None, None, EPI_ACCUMULATE, [m, k, n], [1, m, k, 1], 1),
        splits => {
            let slices = View { len: splits * m * k, ..split };
            gemm(p, slices, dout, x, None, None, 0, [m, k, n], [1, m, k, 1], splits);
            add_partials(p, dw, slices, splits, m * k, 0);
        }
    }
}

/// `out [W] += Σ_b partials[b * stride + offset ..][..W]` over `count` row blocks.
pub fn add_partials<'a>(p: &mut ProgramBuilder<'a>, out: View<'a>, partials: View<'a>, count: usize, stride: usize, offset: usize) {
    let words = [u(count), u(out.len), u(stride), u(offset)];
    p.push(Kernel::AddPartials, &words, &[Some(partials), Some(out)], [u(out.len.div_ceil(64)), 1, 1]);
}

/// LayerNorm forward: `out [N, C]`, saving `mean [N]` and `rstd [N]`.
pub fn layernorm_forward<'a>(p: &mut ProgramBuilder<'a>, a: layernorm::Forward<View<'a>, View<'a>>) {
    let layernorm::Forward { out, mean, rstd, x, weight, bias } = a;
    let (n, c) = (mean.len, weight.len);
    p.push(Kernel::LayerNormForward, &[u(n), u(c)], &[Some(out), Some(mean), Some(rstd), Some(x), Some(weight), Some(bias)], rows_grid(1, n));
}

/// LayerNorm backward: `dx += ...`, `dweight`, `dbias` accumulated. `partials`: at least
/// `blocks(N) * 2C` elements of scratch.
pub fn layernorm_backward<'a>(p: &mut ProgramBuilder<'a>, a: layernorm::Backward<View<'a>, View<'a>>, partials: View<'a>) {
    let layernorm::Backward { dx, dweight, dbias, dout, x, mean, rstd, weight } = a;
    let (n, c) = (mean.len, weight.len);
    let views = [Some(dx), Some(dout), Some(x), Some(mean), Some(rstd), Some(weight)];
    p.push(Kernel::LayerNormBackward, &[u(n), u(c)], &views, rows_grid(1, n));
    let views = [Some(partials), Some(dout), Some(x), Some(mean), Some(rstd)];
    p.push(Kernel::LayerNormParamPartials, &[u(n), u(c)], &views, [u(c.div_ceil(64)), u(blocks(n)), 1]);
    add_partials(p, dweight, partials, blocks(n), 2 * c, 0);
    add_partials(p, dbias, partials, blocks(n), 2 * c, c);
}

fn attention_words(s: AttentionShape) -> [u32; 4] {
    let scale = 1.0 / (s.head_size as f32).sqrt();
    [u(s.batch), u(s.seq), u(s.heads), scale.to_bits()]
}

fn attention_grid(s: AttentionShape) -> [u32; 3] {
    [u(s.seq.div_ceil(64)), u(s.batch * s.heads), 1]
}

/// Causal attention forward: `out [B, T, C]` and `lse [B, NH, T]` from `qkv [B, T, 3C]`.
pub fn attention_forward<'a>(p: &mut ProgramBuilder<'a>, a: attention::Forward<View<'a>, View<'a>>) {
    let attention::Forward { out, lse, qkv, shape } = a;
    p.push(Kernel::AttentionForward, &attention_words(shape), &[Some(out), Some(qkv), Some(lse)], attention_grid(shape));
}

/// Causal attention backward: `dqkv [B, T, 3C]` (overwritten) from `dout [B, T, C]`, using
/// `delta`, at least `[B, NH, T]`, as scratch.
pub fn attention_backward<'a>(p: &mut ProgramBuilder<'a>, a: attention::Backward<View<'a>, View<'a>>, delta: View<'a>) {
    let attention::Backward { dqkv, dout, qkv, out, lse, shape } = a;
    let delta = View { len: shape.batch * shape.heads * shape.seq, ..delta };
    let (w, g) = (attention_words(shape), attention_grid(shape));
    p.push(Kernel::AttentionDelta, &w, &[Some(delta), Some(dout), Some(out)], g);
    let views = [Some(dqkv), Some(qkv), Some(dout), Some(lse), Some(delta)];
    p.push(Kernel::AttentionBackwardQ, &w, &views, g);
    p.push(Kernel::AttentionBackwardKv, &w, &views, g);
}

/// Embedding forward: `out [N, C] = wte[tokens] + wpe[position]`.
pub fn embedding_forward<'a>(p: &mut ProgramBuilder<'a>, a: embedding::Forward<View<'a>, View<'a>>, tokens: View<'a>) {
    let embedding::Forward { out, wte, wpe, seq } = a;
    let n = tokens.len;
    let c = out.len / n;
    p.push(Kernel::EmbeddingForward, &[u(n), u(c), u(seq)], &[Some(out), Some(tokens), Some(wte), Some(wpe)], rows_grid(c.div_ceil(64), n));
}

/// Embedding backward: `dwte`, `dwpe` accumulated from `dout [N, C]`. `order [N]` lists the
/// rows grouped by token and `starts [V + 1]` where each token's rows begin (see
/// [`group_rows_by_token`]).
pub fn embedding_backward<'a>(p: &mut ProgramBuilder<'a>, a: embedding::Backward<View<'a>, View<'a>>, order: View<'a>, starts: View<'a>) {
    let embedding::Backward { dwte, dwpe, dout, seq } = a;
    let vocab = starts.len - 1;
    let c = dout.len / order.len;
    p.push(Kernel::EmbeddingBackwardWte, &[u(vocab), u(c)], &[Some(dwte), Some(order), Some(starts), Some(dout)], rows_grid(c.div_ceil(64), vocab));
    let batch = order.len / seq;
    p.push(Kernel::EmbeddingBackwardWpe, &[u(seq), u(c), u(batch)], &[Some(dwpe), Some(dout)], rows_grid(c.div_ceil(64), seq));
}

/// Fills `order [N]` and `starts [V + 1]` so that the rows holding token `v` are
/// `order[starts[v]..starts[v + 1]]`, in increasing order (a counting sort).
pub fn group_rows_by_token(tokens: &[u32], order: &mut [u32], starts: &mut [u32]) {
    let vocab = starts.len() - 1;
    // starts[v + 1] = end of token v's rows (counts, then a running sum) ...
    starts.fill(0);
    for &t in tokens {
        starts[t as usize + 1] += 1;
    }
    for v in 1..=vocab {
        starts[v] += starts[v - 1];
    }
    // ... counted down to their start while placing the rows from the last.
    for (i, &t) in tokens.iter().enumerate().rev() {
        let end = &mut starts[t as usize + 1];
        *end -= 1;
        order[*end as usize] = i as u32;
    }
    starts.copy_within(1..=vocab, 0);
    starts[vocab] = tokens.len() as u32;
}

/// Fused cross-entropy against `targets [N]`: `losses [N]`, and with `grad_scale` the logits
/// `[N, V]` replaced by `grad_scale * (softmax - onehot)`.
pub fn cross_entropy<'a>(p: &mut ProgramBuilder<'a>, a: cross_entropy::Forward<View<'a>>, targets: View<'a>) {
    let cross_entropy::Forward { losses, logits, grad_scale } = a;
    let (n, v) = (losses.len, logits.len / losses.len);
    let scale = grad_scale.map(|s| s as f32);
    let words = [u(n), u(v), u32::from(scale.is_some()), scale.unwrap_or(0.0).to_bits()];
    p.push(Kernel::CrossEntropy, &words, &[Some(logits), Some(losses), Some(targets)], rows_grid(1, n));
}

/// `stats[slot] += Σ losses`.
pub fn sum_losses<'a>(p: &mut ProgramBuilder<'a>, losses: View<'a>, stats: View<'a>, slot: usize) {
    p.push(Kernel::SumLosses, &[u(losses.len), u(slot)], &[Some(losses), Some(stats)], [1, 1, 1]);
}

/// Chunks of the squared-norm reduction (the size of its `partials`).
pub const NORM_CHUNKS: usize = 256;

/// `stats[slot] = Σ x²`, through `partials [NORM_CHUNKS]`.
pub fn sum_squares<'a>(p: &mut ProgramBuilder<'a>, x: View<'a>, partials: View<'a>, stats: View<'a>, slot: usize) {
    let chunk = x.len.div_ceil(NORM_CHUNKS).max(1);
    let count = x.len.div_ceil(chunk);
    p.push(Kernel::SumSquaresPartials, &[u(x.len), u(chunk)], &[Some(x), Some(partials)], [u(count), 1, 1]);
    p.push(Kernel::SumSquaresFinish, &[u(count), u(slot)], &[Some(partials), Some(stats)], [1, 1, 1]);
}

/// The AdamW dispatch over whole arenas; its words change every step ([`adamw_words`]).
/// Returns the dispatch's index in the program.
#[allow(clippy::too_many_arguments)]
pub fn adamw<'a>(p: &mut ProgramBuilder<'a>, params: View<'a>, grads: View<'a>, m: View<'a>, v: View<'a>, stats: View<'a>) -> usize {
    let groups = params.len.div_ceil(64);
    let x = groups.min(65535);
    p.push(Kernel::AdamW, &[], &[Some(params), Some(grads), Some(m), Some(v), Some(stats)], [u(x), u(groups.div_ceil(x)), 1])
}

/// The step's AdamW words (see adamw.wgsl): the constants computed in f64 as the CPU does.
#[allow(clippy::too_many_arguments)]
pub fn adamw_words(len: usize, decay_end: usize, cfg: &AdamWConfig, lr: f64, step: u64, max_norm: f64, stats_slots: [usize; 3]) -> [u32; 16] {
    let bc1 = 1.0 - cfg.beta1.powf(step as f64);
    let bc2_sqrt = (1.0 - cfg.beta2.powf(step as f64)).sqrt();
    let f = |x: f64| (x as f32).to_bits();
    let mut w = [0u32; 16];
    let [loss_slot, norm_slot, skipped_slot] = stats_slots;
    w[..13].copy_from_slice(&[
        u(len),
        u(decay_end),
        f(lr / bc1),
        f(1.0 - lr * cfg.weight_decay),
        f(1.0 - cfg.beta1),
        f(cfg.beta2),
        f(1.0 - cfg.beta2),
        f(bc2_sqrt),
        f(cfg.eps),
        f(max_norm),
        u(loss_slot),
        u(norm_slot),
        u(skipped_slot),
    ]);
    w
}
