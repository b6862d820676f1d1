//! The global gradient norm's dispatches ([`alpha_core::ops::grad_norm`];
//! `shaders/grad_norm.wgsl`).

use super::u;
use crate::kernels::{Kernel, ProgramBuilder, View};
use std::ops::Range;

/// Chunks of the squared-norm reduction of one binding piece (see
/// [`super::binding_pieces`]).
pub const NORM_CHUNKS: usize = 256;

/// `stats[slot] = Σ x²` over `x` bound in `pieces`, through `partials [pieces * NORM_CHUNKS]`:
/// each piece's chunks, then all of them in order.
pub fn sum_squares<'a>(p: &mut ProgramBuilder<'a>, x: View<'a>, pieces: &[Range<usize>], partials: View<'a>, stats: View<'a>, slot: usize) {
    for (i, piece) in pieces.iter().enumerate() {
        let chunk = piece.len().div_ceil(NORM_CHUNKS).max(1);
        let views = [Some(x.part(piece.start, piece.len())), Some(partials.part(i * NORM_CHUNKS, NORM_CHUNKS))];
        // Every chunk writes its partial, an empty one zero.
        p.push(Kernel::SumSquaresPartials, &[u(piece.len()), u(chunk)], &views, [u(NORM_CHUNKS), 1, 1]);
    }
    let count = pieces.len() * NORM_CHUNKS;
    p.push(Kernel::SumSquaresFinish, &[u(count), u(slot)], &[Some(partials.part(0, count)), Some(stats)], [1, 1, 1]);
}
