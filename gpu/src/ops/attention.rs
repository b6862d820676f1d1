//! Causal self-attention's dispatches ([`alpha_core::ops::attention`];
//! `shaders/attention.wgsl`).

use super::u;
use crate::kernels::{rows_grid, Kernel, ProgramBuilder, View};
use alpha_core::ops::attention::{self, AttentionShape};
use alpha_core::ops::dropout::Site;

/// The kernels' words: shape, score scale, the dropout site (threshold 0: none), the
/// key/value heads and whether q and k are rotated (RoPE).
fn attention_words(s: AttentionShape, dropout: Option<Site>) -> [u32; 9] {
    let scale = 1.0 / (s.head_size as f32).sqrt();
    let (site, threshold, kept) = dropout.map_or((0, 0, 1.0), |d| (d.id, d.threshold, d.scale() as f32));
    [u(s.batch), u(s.seq), u(s.heads), scale.to_bits(), site, threshold, kept.to_bits(), u(s.kv_heads), u32::from(s.rope.is_some())]
}

/// The rotary table `[rows, HS]` (row `p`: the cosines of position `p`'s `HS/2` angles, then
/// their sines, as [`alpha_core::ops::attention::Rope`] computes them) that the kernels read
/// where `shape` has RoPE, as f32 values to upload; `rows` covers every position a plan of
/// the model reaches (its block size).
pub fn rope_table(shape: AttentionShape, rows: usize) -> Option<Vec<f32>> {
    let mut table = vec![0f32; rows * shape.head_size];
    shape.rope?.fill_table(&alpha_core::Serial, &mut table, shape.head_size);
    Some(table)
}

/// The delta pass's grid: a workgroup per 64 rows of each head.
fn delta_grid(s: AttentionShape) -> [u32; 3] {
    [u(s.seq.div_ceil(64)), u(s.batch * s.heads), 1]
}

/// The forward's and the backward kernels' grid: a workgroup per 64 rows (queries or keys)
/// of each head and each 64 of its dimensions.
fn block_grid(s: AttentionShape) -> [u32; 3] {
    [u(s.seq.div_ceil(64)), u(s.batch * s.heads), u(s.head_size.div_ceil(64))]
}

/// Causal attention forward: `out [B, T, C]` and `lse [B, NH, T]` from `qkv [B, T, W]`;
/// with dropout, the micro-batch's `key` (4 words); with RoPE, the rotary `table`.
pub fn forward<'a>(p: &mut ProgramBuilder<'a>, a: attention::Forward<View<'a>, View<'a>>, key: View<'a>, table: Option<View<'a>>) {
    let attention::Forward { out, lse, qkv, shape, dropout } = a;
    let key = dropout.map(|_| key);
    let views = [Some(out), Some(qkv), Some(lse), None, None, key, table];
    let i = p.push(Kernel::AttentionForward, &attention_words(shape, dropout), &views, block_grid(shape));
    p.count_flops(i, shape.causal_flops(2.0));
}

/// One token's attention (batch 1, sequence 1) at the position `words[4]` against one layer's
/// KV cache (`keys` and `values`, `[T, KVH * HS]` each): its key and value written there,
/// then the softmax over the keys up to it (see [`alpha_core::ops::attention::decode`]).
pub fn decode<'a>(
    p: &mut ProgramBuilder<'a>,
    a: attention::Forward<View<'a>, View<'a>>,
    keys: View<'a>,
    values: View<'a>,
    words: View<'a>,
    table: Option<View<'a>>,
) {
    let attention::Forward { out, lse, qkv, shape, .. } = a;
    let w = attention_words(shape, None);
    let views = [Some(out), Some(qkv), Some(lse), Some(keys), Some(values), Some(words), table];
    p.push(Kernel::AttentionDecode, &w, &views, [u(shape.heads), 1, 1]);
}

/// Causal attention backward: `dqkv [B, T, W]` (overwritten) from `dout [B, T, C]`, using
/// `delta`, at least `[B, NH, T]`, as scratch (and forward's dropout `key`, and with RoPE
/// the rotary `table`: dQ and dK are rotated back last).
pub fn backward<'a>(p: &mut ProgramBuilder<'a>, a: attention::Backward<View<'a>, View<'a>>, delta: View<'a>, key: View<'a>, table: Option<View<'a>>) {
    let attention::Backward { dqkv, dout, qkv, out, lse, shape, dropout } = a;
    let delta = View { len: shape.batch * shape.heads * shape.seq, ..delta };
    let w = attention_words(shape, dropout);
    p.push(Kernel::AttentionDelta, &w, &[Some(delta), Some(dout), Some(out)], delta_grid(shape));
    let views = [Some(dqkv), Some(qkv), Some(dout), Some(lse), Some(delta), dropout.map(|_| key), table];
    let i = p.push(Kernel::AttentionBackwardQ, &w, &views, block_grid(shape));
    p.count_flops(i, shape.causal_flops(3.0));
    let kv_grid = [u(shape.seq.div_ceil(64)), u(shape.batch * shape.kv_heads), u(shape.head_size.div_ceil(64))];
    let i = p.push(Kernel::AttentionBackwardKv, &w, &views, kv_grid);
    p.count_flops(i, shape.causal_flops(4.0));
    if shape.rope.is_some() {
        let rows = shape.batch * shape.seq;
        let pairs = (shape.heads + shape.kv_heads) * shape.head_size / 2;
        let words = [u(rows), w[1], w[2], w[3], 0, 0, 0, w[7], w[8]];
        p.push(Kernel::AttentionRopeBackward, &words, &[Some(dqkv), None, None, None, None, None, table], rows_grid(pairs.div_ceil(64), rows));
    }
}
