//! Tokenizers for the commands: reading one from disk (`--tokenizer`), encoding a large text
//! with a progress bar.

use alpha_core::parallel::Parallel;
use alpha_core::tokenizer::bpe::Bpe;
use alpha_core::tokenizer::{hf, TokenizeError, Tokenizer};
use anyhow::{anyhow, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::path::Path;

/// Text encoded at once with a progress bar on a terminal: a large text with BPE in parts of
/// about 16 MB, cut where its pieces cannot change (the same ids as one encoding).
pub fn encode_with_progress(tok: &Tokenizer, par: &dyn Parallel, text: &str) -> Result<Vec<u32>, TokenizeError> {
    const PART: usize = 16 << 20;
    let Tokenizer::Bpe(bpe) = tok else { return tok.encode_with(par, text) };
    if text.len() <= 2 * PART {
        return Ok(bpe.encode_with(par, text));
    }
    let progress = bar(text.len() as u64, "tokenizing {bytes}/{total_bytes} {wide_bar} {elapsed} (eta {eta})");
    let (mut ids, mut start) = (Vec::with_capacity(text.len() / 3), 0);
    while start < text.len() {
        let end = bpe.next_cut(text, (start + PART).min(text.len()));
        ids.extend(bpe.encode_part(par, &text[start..end], start > 0));
        progress.set_position(end as u64);
        start = end;
    }
    progress.finish_and_clear();
    Ok(ids)
}

/// Reads a tokenizer: a tokenizer.json, or a directory with one or with vocab.json + merges.txt.
pub fn load(path: &Path) -> Result<Bpe> {
    let read = |p: &Path| crate::fsutil::read_regular_string(p).map_err(|e| anyhow!("cannot read tokenizer file {}: {e}", p.display()));
    let in_error = |p: &Path, e: alpha_core::tokenizer::bpe::BpeError| anyhow!("tokenizer {}: {e}", p.display());
    if path.is_dir() {
        let json = path.join("tokenizer.json");
        if json.is_file() {
            return hf::from_tokenizer_json(&read(&json)?).map_err(|e| in_error(&json, e));
        }
        let (vocab, merges) = (path.join("vocab.json"), path.join("merges.txt"));
        if vocab.is_file() && merges.is_file() {
            return hf::from_vocab_merges(&read(&vocab)?, &read(&merges)?).map_err(|e| in_error(path, e));
        }
        return Err(anyhow!("tokenizer directory {} has neither tokenizer.json nor vocab.json and merges.txt", path.display()));
    }
    hf::from_tokenizer_json(&read(path)?).map_err(|e| in_error(path, e))
}

/// A progress bar on stderr when it is a terminal (hidden otherwise).
pub(crate) fn bar(len: u64, template: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    bar.set_style(ProgressStyle::with_template(template).expect("a valid template"));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::thread_pool;
    use alpha_core::tokenizer::bpe::END_OF_TEXT;
    use alpha_core::tokenizer::train::{train, WordCounts};

    /// A text large enough to be encoded in parts gets the ids of one encoding.
    #[test]
    fn parts_give_the_ids_of_one_encoding() {
        let corpus = crate::corpus::SHAKESPEARE;
        let mut words = WordCounts::new();
        words.add(&alpha_core::Serial, &corpus[..200_000], &[END_OF_TEXT]).unwrap();
        let bpe = train(&words, 400, &[END_OF_TEXT], &mut |_, _| {}).unwrap();
        let text = [corpus; 8].join(END_OF_TEXT);
        assert!(text.len() > 32 << 20);
        let pool = thread_pool(Some(2)).unwrap();
        let want = bpe.encode_to_vec(&text);
        assert_eq!(encode_with_progress(&Tokenizer::from(bpe), &pool, &text).unwrap(), want);
    }
}
