//! The embedding's dispatches ([`alpha_core::ops::embedding`]; `shaders/embedding.wgsl`).

use super::{rows_per_piece, u};
use crate::kernels::{rows_grid, Kernel, ProgramBuilder, View};
use alpha_core::ops::embedding;

/// Embedding forward: `out [N, C] = wte[tokens] + wpe[position]` (without a position table,
/// `wte[tokens]`); decoding, the positions start at the batch slot's `words[4]`.
pub fn forward<'a>(p: &mut ProgramBuilder<'a>, a: embedding::Forward<View<'a>, View<'a>>, tokens: View<'a>, decoding: Option<View<'a>>) {
    let embedding::Forward { out, wte, wpe, seq } = a;
    let n = tokens.len;
    let c = out.len / n;
    // A token table larger than one binding goes in pieces of whole rows, each dispatch
    // writing the rows whose token is in its piece.
    let (vocab, piece) = (wte.len / c, rows_per_piece(c, p.max_binding()));
    for v0 in (0..vocab).step_by(piece) {
        let v1 = (v0 + piece).min(vocab);
        let table = wte.part(v0 * c, (v1 - v0) * c);
        let words = [u(n), u(c), u(seq), u(decoding.is_some() as usize), u(v0), u(v1), u(wpe.is_some() as usize)];
        p.push(Kernel::EmbeddingForward, &words, &[Some(out), Some(tokens), Some(table), wpe, decoding], rows_grid(c.div_ceil(64), n));
    }
}

/// Embedding backward: `dwte` (and `dwpe`, where the model has one) accumulated from
/// `dout [N, C]`. `order [N]` lists the
/// rows grouped by token and `starts [V + 1]` where each token's rows begin (see
/// [`group_rows_by_token`]).
pub fn backward<'a>(p: &mut ProgramBuilder<'a>, a: embedding::Backward<View<'a>, View<'a>>, order: View<'a>, starts: View<'a>) {
    let embedding::Backward { dwte, dwpe, dout, seq } = a;
    let vocab = starts.len - 1;
    let c = dout.len / order.len;
    let piece = rows_per_piece(c, p.max_binding());
    for v0 in (0..vocab).step_by(piece) {
        let rows = piece.min(vocab - v0);
        let table = dwte.part(v0 * c, rows * c);
        p.push(Kernel::EmbeddingBackwardWte, &[u(rows), u(c), u(v0)], &[Some(table), Some(order), Some(starts), Some(dout)], rows_grid(c.div_ceil(64), rows));
    }
    if let Some(dwpe) = dwpe {
        let batch = order.len / seq;
        p.push(Kernel::EmbeddingBackwardWpe, &[u(seq), u(c), u(batch)], &[Some(dwpe), Some(dout)], rows_grid(c.div_ceil(64), seq));
    }
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
