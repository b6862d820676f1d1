//! A model's tokenizer, whichever kind it is: what a checkpoint records, training encodes with
//! and sampling decodes with.
//!
//! ```
//! use alpha_core::tokenizer::{CharTokenizer, TextStream, Tokenizer};
//! let tok = Tokenizer::from(CharTokenizer::from_text("\nab").unwrap());
//! let ids = tok.encode("ab\n").unwrap();
//! assert_eq!((tok.vocab_size(), tok.sample_start()), (3, 0));
//! let mut text = TextStream::default();
//! let out: String = ids.iter().map(|&id| text.push(&tok.token_bytes(id))).collect();
//! assert_eq!(out + &text.finish(), "ab\n");
//! ```

use super::bpe::Bpe;
use super::{CharTokenizer, TokenizeError};
use crate::parallel::Parallel;
use alloc::borrow::Cow;
use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;

/// Characters or byte-level BPE.
#[derive(Clone, Debug, PartialEq)]
pub enum Tokenizer {
    /// One token per character of the vocabulary.
    Char(Box<CharTokenizer<Vec<char>>>),
    /// GPT-2's byte-level BPE.
    Bpe(Box<Bpe>),
}

impl From<CharTokenizer<Vec<char>>> for Tokenizer {
    fn from(t: CharTokenizer<Vec<char>>) -> Self {
        Tokenizer::Char(Box::new(t))
    }
}

impl From<Bpe> for Tokenizer {
    fn from(t: Bpe) -> Self {
        Tokenizer::Bpe(Box::new(t))
    }
}

impl Tokenizer {
    /// Tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Char(t) => t.vocab_size(),
            Tokenizer::Bpe(t) => t.vocab_size(),
        }
    }

    /// `"char"` or `"bpe"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Tokenizer::Char(_) => "char",
            Tokenizer::Bpe(_) => "bpe",
        }
    }

    /// The ids of `text` (a character tokenizer fails on a character it does not have).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        match self {
            Tokenizer::Char(t) => t.encode_to_vec(text),
            Tokenizer::Bpe(t) => Ok(t.encode_to_vec(text)),
        }
    }

    /// [`Tokenizer::encode`] on `par`'s threads (BPE; the same ids for any number).
    pub fn encode_with(&self, par: &dyn Parallel, text: &str) -> Result<Vec<u32>, TokenizeError> {
        match self {
            Tokenizer::Char(t) => t.encode_to_vec(text),
            Tokenizer::Bpe(t) => Ok(t.encode_with(par, text)),
        }
    }

    /// The bytes of token `id` (empty past the vocabulary): part of a character where BPE
    /// split one.
    pub fn token_bytes(&self, id: u32) -> Cow<'_, [u8]> {
        match self {
            Tokenizer::Char(t) => {
                let mut buf = [0u8; 4];
                Cow::Owned(t.decode(id).map_or(&[][..], |c| c.encode_utf8(&mut buf).as_bytes()).to_vec())
            }
            Tokenizer::Bpe(t) => Cow::Borrowed(t.token_bytes(id).unwrap_or_default()),
        }
    }

    /// The text of `ids`, bytes that are not UTF-8 as U+FFFD.
    pub fn decode_lossy(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(&self.token_bytes(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The id of the token that ends a text (the first of
    /// [`END_TOKENS`](super::bpe::END_TOKENS) the tokenizer has): what ends documents and
    /// samples.
    pub fn end_of_text(&self) -> Option<u32> {
        match self {
            Tokenizer::Bpe(t) => t.end_of_text().map(|(_, id)| id),
            Tokenizer::Char(_) => None,
        }
    }

    /// The ids a text encoded with special tokens has before and after its own (Llama 3's
    /// BOS; none for GPT-2's and character tokenizers).
    pub fn special_tokens_around(&self) -> (&[u32], &[u32]) {
        match self {
            Tokenizer::Bpe(t) => t.special_tokens_around(),
            Tokenizer::Char(_) => (&[], &[]),
        }
    }

    /// The token samples start from: a newline (nanoGPT's start), or id 0 where a newline is
    /// not one token.
    pub fn sample_start(&self) -> u32 {
        match self.encode("\n").as_deref() {
            Ok([id]) => *id,
            _ => 0,
        }
    }
}

/// Text from a stream of tokens' bytes, whole characters at a time: the bytes of a character
/// that BPE split across tokens wait for the rest; bytes that cannot become UTF-8 are U+FFFD.
#[derive(Default)]
pub struct TextStream {
    pending: Vec<u8>,
}

impl TextStream {
    /// Adds a token's bytes; returns the characters they complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match core::str::from_utf8(&self.pending) {
                Ok(text) => {
                    out.push_str(text);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(core::str::from_utf8(&self.pending[..valid]).expect("checked"));
                    match e.error_len() {
                        // An incomplete character at the end: wait for the next token.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// What is left at the end of the stream (an incomplete character as U+FFFD).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_split_across_tokens_wait_for_their_rest() {
        let mut s = TextStream::default();
        let crab = "🦀".as_bytes();
        assert_eq!(s.push(&crab[..1]), "");
        assert_eq!(s.push(&crab[1..3]), "");
        assert_eq!(s.push(&[crab[3], b'a']), "🦀a");
        assert_eq!(s.push(&[0xFF, b'b', 0xE6]), "\u{FFFD}b");
        assert_eq!(s.finish(), "\u{FFFD}");
    }
}
