//! Learning byte-level BPE from text (Hugging Face's `BpeTrainer` for GPT-2-style
//! tokenizers): the text's pieces ([`Gpt2Split`]) are counted, every piece starts as its
//! bytes, and the most frequent adjacent pair of tokens (the smallest ids among equally
//! frequent ones) becomes a new token, merged wherever it occurs, until the vocabulary has its
//! size. Ids: the special tokens first, then the 256 bytes (in the byte-level alphabet's
//! order, as GPT-2's), then the merges in the order they were learned.
//!
//! ```
//! use alpha_core::tokenizer::train::{train, WordCounts};
//! use alpha_core::Serial;
//! let mut words = WordCounts::new();
//! words.add(&Serial, "low lower lowest<|endoftext|>low low", &["<|endoftext|>"]).unwrap();
//! let bpe = train(&words, 256 + 1 + 3, &["<|endoftext|>"], &mut |_, _| {}).unwrap();
//! assert_eq!(bpe.vocab_size(), 260);
//! assert_eq!(bpe.encode_to_vec(" low").len(), 1);
//! assert_eq!(bpe.decode(&bpe.encode_to_vec("lowest<|endoftext|>")).unwrap(), b"lowest<|endoftext|>");
//! ```

use super::bpe::{AddedMatcher, AddedToken, Bpe, BpeError, Options, PART_BYTES};
use super::byte_level::byte_char;
use super::pretokenize::{next_cut, Gpt2Split};
use crate::parallel::{split_range, Parallel, SharedMut};
use alloc::collections::BinaryHeap;
use alloc::format;
use alloc::string::ToString;
use alloc::vec;
use alloc::vec::Vec;
use core::cmp::Reverse;
use hashbrown::HashMap;

/// Checks what [`train`] is asked for, before any text is counted: room in the vocabulary for
/// the 256 bytes and the special tokens, and special tokens that are neither empty nor
/// repeated (an empty one would match everywhere: [`WordCounts::add`] must not be given one).
pub fn check_request(vocab_size: usize, specials: &[&str]) -> Result<(), BpeError> {
    let base = specials.len() + 256;
    if vocab_size < base {
        return Err(BpeError(format!("the vocabulary size must be at least {base} (256 bytes and {} special tokens), not {vocab_size}", specials.len())));
    }
    if let Some(dup) = specials.iter().enumerate().find(|(i, s)| s.is_empty() || specials[..*i].contains(s)) {
        return Err(BpeError(format!("special token {:?} is empty or repeated", dup.1)));
    }
    Ok(())
}

/// How many times each piece occurs in a corpus.
#[derive(Default)]
pub struct WordCounts {
    counts: HashMap<Vec<u8>, u64>,
}

impl WordCounts {
    /// No text yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts the pieces of `text`, skipping the text of `specials`, on `par`'s threads (the
    /// counts do not depend on their number). An empty special token is an error.
    pub fn add(&mut self, par: &dyn Parallel, text: &str, specials: &[&str]) -> Result<(), BpeError> {
        let matcher = AddedMatcher::new(specials.iter().copied())?;
        let mut parts = Vec::new();
        for (plain, _) in matcher.split(text) {
            let mut start = 0;
            while start < plain.len() {
                let end = next_cut(plain, (start + PART_BYTES).min(plain.len()));
                parts.push(&plain[start..end]);
                start = end;
            }
        }
        let tasks = par.threads().min(parts.len());
        let mut maps: Vec<HashMap<Vec<u8>, u64>> = (0..tasks).map(|_| HashMap::new()).collect();
        let maps_p = SharedMut(maps.as_mut_ptr());
        par.run(tasks, &|task| {
            // SAFETY: task `task` alone uses map `task`.
            let counts = unsafe { &mut maps_p.slice(task, 1)[0] };
            for part in &parts[split_range(parts.len(), tasks, task)] {
                for piece in Gpt2Split::new(part) {
                    *counts.entry_ref(piece.as_bytes()).or_insert(0) += 1;
                }
            }
        });
        for map in maps {
            for (piece, n) in map {
                *self.counts.entry(piece).or_insert(0) += n;
            }
        }
        Ok(())
    }

    /// Distinct pieces counted.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }
}

/// The key of a pair of adjacent tokens (the smaller, the earlier among equal counts).
#[inline(always)]
fn pair(left: u32, right: u32) -> u64 {
    (left as u64) << 32 | right as u64
}

/// Learns a tokenizer of `vocab_size` tokens (fewer where the text has no more pairs to
/// merge) from `words`, with `specials` as its first ids; calls `progress(merges, of)` as it
/// goes.
pub fn train(words: &WordCounts, vocab_size: usize, specials: &[&str], progress: &mut dyn FnMut(usize, usize)) -> Result<Bpe, BpeError> {
    check_request(vocab_size, specials)?;
    let mut tokens: Vec<Vec<u8>> = specials.iter().map(|s| s.as_bytes().to_vec()).collect();
    let mut bytes: Vec<u8> = (0..=255).collect();
    bytes.sort_by_key(|&b| byte_char(b));
    let mut byte_id = [0u32; 256];
    for (i, &b) in bytes.iter().enumerate() {
        byte_id[b as usize] = (specials.len() + i) as u32;
        tokens.push(vec![b]);
    }
    // The pieces in byte order (the map's order is random), as token sequences.
    let mut entries: Vec<(&Vec<u8>, u64)> = words.counts.iter().map(|(w, &n)| (w, n)).collect();
    entries.sort_unstable();
    let counts: Vec<i64> = entries.iter().map(|&(_, n)| n as i64).collect();
    let mut symbols: Vec<Vec<u32>> = entries.iter().map(|(w, _)| w.iter().map(|&b| byte_id[b as usize]).collect()).collect();
    let mut pair_counts: HashMap<u64, i64> = HashMap::new();
    let mut pair_words: HashMap<u64, Vec<u32>> = HashMap::new();
    for (w, syms) in symbols.iter().enumerate() {
        for p in syms.windows(2) {
            let key = pair(p[0], p[1]);
            *pair_counts.entry(key).or_insert(0) += counts[w];
            let list = pair_words.entry(key).or_default();
            if list.last() != Some(&(w as u32)) {
                list.push(w as u32);
            }
        }
    }
    let mut heap: BinaryHeap<(i64, Reverse<u64>)> = pair_counts.iter().map(|(&p, &n)| (n, Reverse(p))).collect();
    let mut merges = Vec::new();
    let mut visited = vec![usize::MAX; symbols.len()];
    let mut changed = Vec::new();
    let target = vocab_size - (specials.len() + 256);
    while merges.len() < target {
        let Some((n, Reverse(key))) = heap.pop() else { break };
        let now = pair_counts.get(&key).copied().unwrap_or(0);
        if now != n {
            // Counted again since it was pushed: back in with its count.
            if now > 0 {
                heap.push((now, Reverse(key)));
            }
            continue;
        }
        if n <= 0 {
            break;
        }
        let (left, right) = ((key >> 32) as u32, key as u32);
        let new = tokens.len() as u32;
        tokens.push([&tokens[left as usize][..], &tokens[right as usize][..]].concat());
        merges.push((left, right));
        changed.clear();
        for w in pair_words.remove(&key).unwrap_or_default() {
            let w = w as usize;
            if core::mem::replace(&mut visited[w], merges.len()) == merges.len() {
                continue;
            }
            let old = &symbols[w];
            let mut merged = Vec::with_capacity(old.len());
            let mut i = 0;
            while i < old.len() {
                if i + 1 < old.len() && old[i] == left && old[i + 1] == right {
                    merged.push(new);
                    i += 2;
                } else {
                    merged.push(old[i]);
                    i += 1;
                }
            }
            if merged.len() == old.len() {
                continue;
            }
            for p in old.windows(2) {
                *pair_counts.get_mut(&pair(p[0], p[1])).expect("counted") -= counts[w];
            }
            for p in merged.windows(2) {
                let key = pair(p[0], p[1]);
                *pair_counts.entry(key).or_insert(0) += counts[w];
                if p[0] == new || p[1] == new {
                    let list = pair_words.entry(key).or_default();
                    if list.last() != Some(&(w as u32)) {
                        list.push(w as u32);
                    }
                    changed.push(key);
                }
            }
            symbols[w] = merged;
        }
        changed.sort_unstable();
        changed.dedup();
        for &key in &changed {
            heap.push((pair_counts[&key], Reverse(key)));
        }
        progress(merges.len(), target);
    }
    let vocab: Vec<(Vec<u8>, u32)> = tokens.iter().enumerate().skip(specials.len()).map(|(id, t)| (t.clone(), id as u32)).collect();
    let merge_bytes: Vec<(Vec<u8>, Vec<u8>)> = merges.iter().map(|&(l, r)| (tokens[l as usize].clone(), tokens[r as usize].clone())).collect();
    let added = specials.iter().enumerate().map(|(id, s)| AddedToken { content: s.to_string(), id: id as u32, special: true }).collect();
    Bpe::new(vocab, &merge_bytes, added, Options::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parallel::ReversedThreads;

    #[test]
    fn counts_and_merges_do_not_depend_on_threads() {
        let text: alloc::string::String = (0..3000).map(|i| ["the cat sat\n", "on the mat\n\n", "  the end\n", "thé\tcat\n"][i % 4]).collect();
        let mut serial = WordCounts::new();
        serial.add(&Serial, &text, &[]).unwrap();
        let mut threaded = WordCounts::new();
        threaded.add(&ReversedThreads(3), &text, &[]).unwrap();
        assert_eq!(serial.counts, threaded.counts);
        let a = train(&serial, 300, &[], &mut |_, _| {}).unwrap();
        let b = train(&threaded, 300, &[], &mut |_, _| {}).unwrap();
        assert_eq!(a.merges(), b.merges());
        // The first merge joins two bytes.
        let first = a.merges()[0];
        assert!(a.token_bytes(first.0).unwrap().len() == 1 && a.token_bytes(first.1).unwrap().len() == 1);
        assert_eq!(a.decode(&a.encode_to_vec(&text)).unwrap(), text.as_bytes());
        // Few distinct pieces and enough merges: each piece is one token.
        assert_eq!(a.encode_to_vec(&text).len(), Gpt2Split::new(&text).count());
    }

    #[test]
    fn a_too_small_vocabulary_is_an_error() {
        let words = WordCounts::new();
        assert!(train(&words, 256, &["<|endoftext|>"], &mut |_, _| {}).err().unwrap().0.contains("at least 257"));
        // Nothing to merge: the bytes alone.
        assert_eq!(train(&words, 1000, &[], &mut |_, _| {}).unwrap().vocab_size(), 256);
    }

    use crate::parallel::Serial;
}
