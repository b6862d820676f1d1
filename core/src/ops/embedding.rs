//! Token + position embedding: `out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]` (the Llama
//! family has no position embedding: its attention rotates q and k instead).

use super::COLUMN_CHUNK;
use crate::float::Float;
use crate::parallel::{split_range, Parallel, SharedMut};

/// Forward's tensors, `W` written and `R` read (slices here, device views on the GPU).
pub struct Forward<W, R> {
    /// Output `[N, C]`.
    pub out: W,
    /// Token embedding `[V, C]`.
    pub wte: R,
    /// Position embedding `[>= T, C]`, if the model has one.
    pub wpe: Option<R>,
    /// Sequence length `T`: row `i` is position `i % T`.
    pub seq: usize,
}

/// Backward's tensors, `W` written and `R` read.
pub struct Backward<W, R> {
    /// Gradient of the token embedding `[V, C]` (accumulated).
    pub dwte: W,
    /// Gradient of the position embedding `[>= T, C]` (accumulated), if the model has one.
    pub dwpe: Option<W>,
    /// Gradient of the output `[N, C]`.
    pub dout: R,
    /// Sequence length `T`.
    pub seq: usize,
}

/// Forward: `out[i] = wte[tokens[i]] + wpe[i % T]` for the step's `tokens [N]`.
pub fn forward<T: Float>(par: &dyn Parallel, a: Forward<&mut [T], &[T]>, tokens: &[u32]) {
    let Forward { out, wte, wpe, seq: t } = a;
    let n = tokens.len();
    let c = out.len() / n.max(1);
    let tasks = par.threads().min(n);
    let out_ptr = SharedMut(out.as_mut_ptr());
    par.run(tasks, &|task| {
        for i in split_range(n, tasks, task) {
            // SAFETY: tasks own disjoint row ranges.
            let row = unsafe { out_ptr.slice(i * c, c) };
            let tok = tokens[i] as usize * c;
            row.copy_from_slice(&wte[tok..tok + c]);
            if let Some(wpe) = wpe {
                let pos = (i % t) * c;
                for (o, &b) in row.iter_mut().zip(&wpe[pos..pos + c]) {
                    *o += b;
                }
            }
        }
    });
}

/// Backward: `dwte[tokens[i]] += dout[i]`, `dwpe[i % t] += dout[i]`. Parallel over column
/// chunks, so every gradient element is summed in row order by one task.
pub fn backward<T: Float>(par: &dyn Parallel, a: Backward<&mut [T], &[T]>, tokens: &[u32]) {
    let Backward { dwte, dwpe, dout, seq: t } = a;
    let c = dout.len() / tokens.len().max(1);
    let chunks = c.div_ceil(COLUMN_CHUNK);
    let (dwte_ptr, dwpe_ptr) = (SharedMut(dwte.as_mut_ptr()), dwpe.map(|d| SharedMut(d.as_mut_ptr())));
    par.run(chunks, &|chunk| {
        let cols = chunk * COLUMN_CHUNK..((chunk + 1) * COLUMN_CHUNK).min(c);
        for (i, &tok) in tokens.iter().enumerate() {
            let d = &dout[i * c + cols.start..i * c + cols.end];
            // SAFETY: tasks own disjoint column ranges of every row.
            let wt = unsafe { dwte_ptr.slice(tok as usize * c + cols.start, cols.len()) };
            for (a, &g) in wt.iter_mut().zip(d) {
                *a += g;
            }
            if let Some(dwpe) = dwpe_ptr {
                // SAFETY: as above.
                let wp = unsafe { dwpe.slice((i % t) * c + cols.start, cols.len()) };
                for (b, &g) in wp.iter_mut().zip(d) {
                    *b += g;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gradcheck::*;
    use crate::parallel::Serial;
    use crate::rng::Rng;

    #[test]
    fn gradients_match_finite_differences() {
        let (b, t, c, v) = (2, 3, 5, 4);
        let mut rng = Rng::new(1);
        let tokens: Vec<u32> = vec![0, 3, 3, 1, 0, 3];
        let mut wte = random(&mut rng, v * c, 1.0);
        let mut wpe = random(&mut rng, t * c, 1.0);
        let w = random(&mut rng, b * t * c, 1.0);
        let mut out = vec![0.0; b * t * c];
        let (mut dwte, mut dwpe) = (vec![0.0; v * c], vec![0.0; t * c]);
        backward(&Serial, Backward { dwte: &mut dwte, dwpe: Some(&mut dwpe), dout: &w, seq: t }, &tokens);
        let wpe0 = wpe.clone();
        let num_wte = numeric_grad(&mut wte, |x| {
            forward(&Serial, Forward { out: &mut out, wte: x, wpe: Some(&wpe0), seq: t }, &tokens);
            weighted_sum(&out, &w)
        });
        let wte0 = wte.clone();
        let num_wpe = numeric_grad(&mut wpe, |x| {
            forward(&Serial, Forward { out: &mut out, wte: &wte0, wpe: Some(x), seq: t }, &tokens);
            weighted_sum(&out, &w)
        });
        assert_close("dwte", &dwte, &num_wte);
        assert_close("dwpe", &dwpe, &num_wpe);
        // Without positions: the token rows alone, and their gradient the same.
        forward(&Serial, Forward { out: &mut out, wte: &wte0, wpe: None, seq: t }, &tokens);
        for (i, &tok) in tokens.iter().enumerate() {
            assert_eq!(out[i * c..(i + 1) * c], wte0[tok as usize * c..(tok as usize + 1) * c]);
        }
        let mut dwte_alone = vec![0.0; v * c];
        backward(&Serial, Backward { dwte: &mut dwte_alone, dwpe: None, dout: &w, seq: t }, &tokens);
        assert_eq!(dwte_alone, dwte);
    }
}
