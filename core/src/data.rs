//! Token streams: the train/validation split and random training windows.

use crate::rng::Rng;

/// nanoGPT's split: the first 90% of the tokens train, the last 10% validate.
pub fn split(tokens: &[u32]) -> (&[u32], &[u32]) {
    let n = (tokens.len() as u128 * 9 / 10) as usize;
    tokens.split_at(n)
}

/// Fills `inputs` and `targets` (`B * T` each) with `B` random windows of `T + 1` tokens of
/// `data`: inputs `data[i..i+T]`, targets `data[i+1..i+T+1]`, `i` uniform in
/// `0..len - T` (nanoGPT's `get_batch`). `data` must hold more than `T` tokens.
pub fn sample_batch(rng: &mut Rng, data: &[u32], seq: usize, inputs: &mut [u32], targets: &mut [u32]) {
    assert!(data.len() > seq, "a split needs more than {seq} tokens");
    for (x, y) in inputs.chunks_exact_mut(seq).zip(targets.chunks_exact_mut(seq)) {
        let i = rng.below(data.len() - seq);
        x.copy_from_slice(&data[i..i + seq]);
        y.copy_from_slice(&data[i + 1..i + seq + 1]);
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
        sample_batch(&mut rng, val, 4, &mut x, &mut y);
        for (xr, yr) in x.chunks(4).zip(y.chunks(4)) {
            assert!(xr[0] >= 90 && yr[3] < 100);
            for t in 0..4 {
                assert_eq!(yr[t], xr[t] + 1);
            }
        }
    }
}
