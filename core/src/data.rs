//! Token streams: the train/validation split and random training windows, from ids in memory
//! or from the little-endian 16- or 32-bit ids of prepared datasets (memory-mapped files:
//! nanoGPT's `train.bin`, llm.c's shards), read as one stream.

use crate::rng::Rng;

/// nanoGPT's split: the first 90% of the tokens train, the last 10% validate.
pub fn split(tokens: &[u32]) -> (&[u32], &[u32]) {
    let n = (tokens.len() as u128 * 9 / 10) as usize;
    tokens.split_at(n)
}

/// A stretch of token ids.
#[derive(Clone, Copy, Debug)]
pub enum Segment<'a> {
    /// Ids in memory.
    Ids(&'a [u32]),
    /// Little-endian `u16` ids (two bytes each).
    U16(&'a [u8]),
    /// Little-endian `u32` ids (four bytes each).
    U32(&'a [u8]),
}

impl Segment<'_> {
    /// Ids in the segment (a trailing partial id is not one).
    pub fn len(&self) -> usize {
        match self {
            Segment::Ids(ids) => ids.len(),
            Segment::U16(b) => b.len() / 2,
            Segment::U32(b) => b.len() / 4,
        }
    }

    /// Whether the segment holds no id.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies ids `start..start + out.len()` into `out`.
    fn read(&self, start: usize, out: &mut [u32]) {
        match self {
            Segment::Ids(ids) => out.copy_from_slice(&ids[start..start + out.len()]),
            Segment::U16(b) => {
                for (o, c) in out.iter_mut().zip(b[2 * start..].chunks_exact(2)) {
                    *o = u16::from_le_bytes([c[0], c[1]]) as u32;
                }
            }
            Segment::U32(b) => {
                for (o, c) in out.iter_mut().zip(b[4 * start..].chunks_exact(4)) {
                    *o = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
        }
    }
}

/// A split's tokens: ids in memory, or segments read as one stream (several shards of a
/// dataset; a window may run from one into the next, as it runs from one document into the
/// next within a shard).
#[derive(Clone, Copy, Debug)]
pub enum Tokens<'a> {
    /// Ids in memory.
    Ids(&'a [u32]),
    /// Segments, in order.
    Stream(&'a [Segment<'a>]),
}

impl<'a> From<&'a [u32]> for Tokens<'a> {
    fn from(ids: &'a [u32]) -> Self {
        Tokens::Ids(ids)
    }
}

#[cfg(feature = "alloc")]
impl<'a> From<&'a alloc::vec::Vec<u32>> for Tokens<'a> {
    fn from(ids: &'a alloc::vec::Vec<u32>) -> Self {
        Tokens::Ids(ids)
    }
}

impl Tokens<'_> {
    /// Ids in the split.
    pub fn len(&self) -> usize {
        match self {
            Tokens::Ids(ids) => ids.len(),
            Tokens::Stream(segments) => segments.iter().map(Segment::len).sum(),
        }
    }

    /// Whether the split holds no id.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies ids `start..start + out.len()` of the stream into `out`.
    ///
    /// # Panics
    /// If the range is past the end.
    pub fn read(&self, mut start: usize, mut out: &mut [u32]) {
        let segments = match self {
            Tokens::Ids(ids) => return out.copy_from_slice(&ids[start..start + out.len()]),
            Tokens::Stream(segments) => segments,
        };
        for segment in segments.iter() {
            if out.is_empty() {
                return;
            }
            let len = segment.len();
            if start >= len {
                start -= len;
                continue;
            }
            let take = out.len().min(len - start);
            let (here, rest) = out.split_at_mut(take);
            segment.read(start, here);
            out = rest;
            start = 0;
        }
        assert!(out.is_empty(), "a read past the end of the tokens");
    }
}

/// Fills `inputs` and `targets` (`B * T` each) with `B` random windows of `T + 1` tokens of
/// `data`: inputs `data[i..i+T]`, targets `data[i+1..i+T+1]`, `i` uniform in
/// `0..len - T` (nanoGPT's `get_batch`). `data` must hold more than `T` tokens.
pub fn sample_batch(rng: &mut Rng, data: Tokens<'_>, seq: usize, inputs: &mut [u32], targets: &mut [u32]) {
    let len = data.len();
    assert!(len > seq, "a split needs more than {seq} tokens");
    for (x, y) in inputs.chunks_exact_mut(seq).zip(targets.chunks_exact_mut(seq)) {
        let i = rng.below(len - seq);
        match data {
            Tokens::Ids(ids) => {
                x.copy_from_slice(&ids[i..i + seq]);
                y.copy_from_slice(&ids[i + 1..i + seq + 1]);
            }
            Tokens::Stream(_) => {
                data.read(i, x);
                data.read(i + 1, y);
            }
        }
    }
}

/// Advances `rng` past a batch of `rows` windows of `data` as [`sample_batch`] would draw
/// them, without reading the tokens: a data-parallel rank skips the micro-batches other ranks
/// train on, so that every rank's generator stays where one process's would be.
pub fn skip_batch(rng: &mut Rng, data: Tokens<'_>, seq: usize, rows: usize) {
    let len = data.len();
    assert!(len > seq, "a split needs more than {seq} tokens");
    for _ in 0..rows {
        rng.below(len - seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_shifted_by_one() {
        let data: Vec<u32> = (0..100).collect();
        let (train, val) = split(&data);
        assert_eq!((train.len(), val.len()), (90, 10));
        let mut rng = Rng::new(0);
        let (mut x, mut y) = ([0u32; 12], [0u32; 12]);
        sample_batch(&mut rng, val.into(), 4, &mut x, &mut y);
        for (xr, yr) in x.chunks(4).zip(y.chunks(4)) {
            assert!(xr[0] >= 90 && yr[3] < 100);
            for t in 0..4 {
                assert_eq!(yr[t], xr[t] + 1);
            }
        }
    }

    #[test]
    fn skipping_a_batch_draws_as_sampling_it() {
        let data: Vec<u32> = (0..1000).collect();
        let (mut sampled, mut skipped) = (Rng::new(3), Rng::new(3));
        let (mut x, mut y) = ([0u32; 24], [0u32; 24]);
        sample_batch(&mut sampled, (&data[..]).into(), 8, &mut x, &mut y);
        skip_batch(&mut skipped, (&data[..]).into(), 8, 3);
        assert_eq!(sampled.next_u64(), skipped.next_u64());
    }

    /// Segments of every kind read as one stream: the same windows as the ids in memory.
    #[test]
    fn segments_read_as_one_stream() {
        let ids: Vec<u32> = (0..100).map(|i| i * 7 % 1000).collect();
        let u16_bytes: Vec<u8> = ids[..30].iter().flat_map(|&i| (i as u16).to_le_bytes()).collect();
        let u32_bytes: Vec<u8> = ids[30..45].iter().flat_map(|&i| i.to_le_bytes()).collect();
        let segments = [Segment::U16(&u16_bytes), Segment::U32(&u32_bytes), Segment::Ids(&[]), Segment::Ids(&ids[45..])];
        let stream = Tokens::Stream(&segments);
        assert_eq!(stream.len(), 100);
        let (mut a, mut b) = ([0u32; 40], [0u32; 40]);
        let (mut ra, mut rb) = (Rng::new(5), Rng::new(5));
        sample_batch(&mut ra, stream, 8, &mut a[..], &mut b[..]);
        let (mut c, mut d) = ([0u32; 40], [0u32; 40]);
        sample_batch(&mut rb, Tokens::Ids(&ids), 8, &mut c[..], &mut d[..]);
        assert_eq!((a, b), (c, d));
        let mut all = [0u32; 100];
        stream.read(0, &mut all);
        assert_eq!(&all[..], &ids[..]);
    }
}
