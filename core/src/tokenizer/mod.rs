//! Tokenizers: characters (the vocabulary is a text's set of characters; the embedded corpus's
//! default) and, with the `bpe` feature, byte-level BPE as GPT-2 and Hugging Face define it
//! (encode, decode, training, `tokenizer.json` and `vocab.json` + `merges.txt`).

mod character;
pub use character::*;

#[cfg(feature = "bpe")]
pub mod bpe;
#[cfg(feature = "bpe")]
pub mod byte_level;
#[cfg(feature = "bpe")]
pub mod hf;
#[cfg(feature = "bpe")]
pub mod pipeline;
#[cfg(feature = "bpe")]
pub mod pretokenize;
#[cfg(feature = "bpe")]
pub mod split;
#[cfg(feature = "bpe")]
pub mod train;

#[cfg(feature = "bpe")]
mod model_tokenizer;
#[cfg(feature = "bpe")]
pub use model_tokenizer::{TextStream, Tokenizer};
