//! Sums over rows (bias and LayerNorm parameter gradients) in a fixed order, without tasks
//! reading each other's rows: rows are cut into blocks of [`ROW_BLOCK`], each block's column
//! sums go to its own partial row of a scratch buffer, then the partials are added up block
//! by block. The blocks depend only on the row count, so results are the same on any number
//! of threads; each task takes a contiguous run of blocks, the rows it also owns in the
//! row-parallel passes around it.

use super::COLUMN_CHUNK;
use crate::float::Float;
use crate::parallel::{split_range, Parallel, SharedMut};
use core::ops::Range;

/// Rows per block.
pub const ROW_BLOCK: usize = 64;

/// Blocks for `rows` rows.
pub fn blocks(rows: usize) -> usize {
    rows.div_ceil(ROW_BLOCK)
}

/// Work on one block: `(rows, partial)`.
pub type BlockFn<'a, T> = dyn Fn(Range<usize>, &mut [T]) + Sync + 'a;

/// Runs `block(rows, partial)` for every block of `rows` rows, where `partial` is the block's
/// row (`width` wide) of `partials`, which must hold `blocks(rows) * width` elements.
pub fn for_each_block<T: Float>(par: &dyn Parallel, rows: usize, partials: &mut [T], width: usize, block: &BlockFn<'_, T>) {
    let count = blocks(rows);
    assert!(partials.len() >= count * width, "row blocks: partials too small");
    let tasks = par.threads().min(count);
    let p = SharedMut(partials.as_mut_ptr());
    par.run(tasks, &|task| {
        for b in split_range(count, tasks, task) {
            // SAFETY: each block owns its row of partials.
            let partial = unsafe { p.slice(b * width, width) };
            block(b * ROW_BLOCK..((b + 1) * ROW_BLOCK).min(rows), partial);
        }
    });
}

/// `out[j] += Σ_b partials[b * width + offset + j]`, blocks in order, for the blocks of
/// `rows` rows; columns split across tasks.
pub fn add_partials<T: Float>(par: &dyn Parallel, rows: usize, partials: &[T], width: usize, offset: usize, out: &mut [T]) {
    let (count, len) = (blocks(rows), out.len());
    assert!(offset + len <= width && partials.len() >= count * width, "row blocks: bad partial layout");
    let chunks = len.div_ceil(COLUMN_CHUNK);
    let out_p = SharedMut(out.as_mut_ptr());
    par.run(chunks, &|chunk| {
        let cols = chunk * COLUMN_CHUNK..((chunk + 1) * COLUMN_CHUNK).min(len);
        // SAFETY: tasks own disjoint column ranges.
        let o = unsafe { out_p.slice(cols.start, cols.len()) };
        for b in 0..count {
            let row = b * width + offset;
            for (x, &s) in o.iter_mut().zip(&partials[row + cols.start..row + cols.end]) {
                *x += s;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parallel::{Serial, ThreadPool};

    /// Column sums of a 150 x 5 matrix, bit-identical on 1 and 3 threads.
    #[test]
    fn column_sums_do_not_depend_on_threads() {
        let (rows, width) = (150, 5);
        let m: Vec<f32> = (0..rows * width).map(|i| ((i * 37) % 101) as f32 * 0.013 - 0.6).collect();
        let run = |par: &dyn Parallel| {
            let mut partials = vec![0f32; blocks(rows) * width];
            for_each_block(par, rows, &mut partials, width, &|r, partial| {
                partial.fill(0.0);
                for i in r {
                    for (p, &x) in partial.iter_mut().zip(&m[i * width..(i + 1) * width]) {
                        *p += x;
                    }
                }
            });
            let mut out = vec![1f32; width - 1];
            add_partials(par, rows, &partials, width, 1, &mut out);
            out
        };
        let serial = run(&Serial);
        assert_eq!(serial, run(&ThreadPool::new(3)));
        for (j, &s) in serial.iter().enumerate() {
            let exact: f64 = (0..rows).map(|i| m[i * width + j + 1] as f64).sum::<f64>() + 1.0;
            assert!((s as f64 - exact).abs() < 1e-4, "column {j}: {s} vs {exact}");
        }
    }
}
