//! Token + position embedding: `out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]`.

use super::COLUMN_CHUNK;
use crate::float::Float;
use crate::parallel::{split_range, Parallel, SharedMut};

/// Forward. `out [N, C]`, `tokens [N]` (row `i` is position `i % t`), `wte [V, C]`, `wpe [>=T, C]`.
pub fn forward<T: Float>(par: &dyn Parallel, out: &mut [T], tokens: &[u32], wte: &[T], wpe: &[T], t: usize, c: usize) {
    let n = tokens.len();
    let tasks = par.threads().min(n);
    let out_ptr = SharedMut(out.as_mut_ptr());
    par.run(tasks, &|task| {
        for i in split_range(n, tasks, task) {
            // SAFETY: tasks own disjoint row ranges.
            let row = unsafe { out_ptr.slice(i * c, c) };
            let tok = tokens[i] as usize * c;
            let pos = (i % t) * c;
            for ((o, &a), &b) in row.iter_mut().zip(&wte[tok..tok + c]).zip(&wpe[pos..pos + c]) {
                *o = a + b;
            }
        }
    });
}

/// Backward: `dwte[tokens[i]] += dout[i]`, `dwpe[i % t] += dout[i]`. Parallel over column
/// chunks, so every gradient element is summed in row order by one task.
pub fn backward<T: Float>(par: &dyn Parallel, dwte: &mut [T], dwpe: &mut [T], dout: &[T], tokens: &[u32], t: usize, c: usize) {
    let chunks = c.div_ceil(COLUMN_CHUNK);
    let (dwte_ptr, dwpe_ptr) = (SharedMut(dwte.as_mut_ptr()), SharedMut(dwpe.as_mut_ptr()));
    par.run(chunks, &|chunk| {
        let cols = chunk * COLUMN_CHUNK..((chunk + 1) * COLUMN_CHUNK).min(c);
        for (i, &tok) in tokens.iter().enumerate() {
            let d = &dout[i * c + cols.start..i * c + cols.end];
            // SAFETY: tasks own disjoint column ranges of every row.
            let (wt, wp) = unsafe { (dwte_ptr.slice(tok as usize * c + cols.start, cols.len()), dwpe_ptr.slice((i % t) * c + cols.start, cols.len())) };
            for ((a, b), &g) in wt.iter_mut().zip(wp.iter_mut()).zip(d) {
                *a += g;
                *b += g;
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
        backward(&Serial, &mut dwte, &mut dwpe, &w, &tokens, t, c);
        let wpe0 = wpe.clone();
        let num_wte = numeric_grad(&mut wte, |x| {
            forward(&Serial, &mut out, &tokens, x, &wpe0, t, c);
            weighted_sum(&out, &w)
        });
        let wte0 = wte.clone();
        let num_wpe = numeric_grad(&mut wpe, |x| {
            forward(&Serial, &mut out, &tokens, &wte0, x, t, c);
            weighted_sum(&out, &w)
        });
        assert_close("dwte", &dwte, &num_wte);
        assert_close("dwpe", &dwpe, &num_wpe);
    }
}
