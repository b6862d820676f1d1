//! Byte-level BPE, GPT-2's tokenizer: text is cut at added tokens (`<|endoftext|>`), the rest
//! into pieces by GPT-2's pattern ([`Gpt2Split`]), each piece's bytes start as one token each,
//! and adjacent tokens are merged, the lowest-ranked merge first (leftmost among equals), until
//! no merge applies: the ids of Hugging Face `tokenizers` and of `tiktoken` for the same files.
//! Llama 3's, Qwen2's and SmolLM2's tokenizers are this with a [`Pipeline`] around it (a
//! normalizer, other pre-tokenizers before the byte-level step, special tokens around a text).
//!
//! ```
//! use alpha_core::tokenizer::bpe::{AddedToken, Bpe, Options};
//! // Every byte a token (ids 0..256, byte order), then merges "h"+"e" and "he"+"y".
//! let mut vocab: Vec<(Vec<u8>, u32)> = (0..=255u8).map(|b| (vec![b], b as u32)).collect();
//! vocab.push((b"he".to_vec(), 256));
//! vocab.push((b"hey".to_vec(), 257));
//! let merges = vec![(b"h".to_vec(), b"e".to_vec()), (b"he".to_vec(), b"y".to_vec())];
//! let eot = AddedToken { content: "<|endoftext|>".into(), id: 258, special: true };
//! let bpe = Bpe::new(vocab, &merges, vec![eot], Options::default()).unwrap();
//! let ids = bpe.encode_to_vec("hey<|endoftext|>he");
//! assert_eq!(ids, [257, 258, 256]);
//! assert_eq!(bpe.decode(&ids).unwrap(), b"hey<|endoftext|>he");
//! ```

use super::pipeline::{Behavior, Pattern, Pipeline, Stage};
use super::pretokenize::{next_cut, Gpt2Split};
use crate::parallel::{Parallel, SharedMut};
use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use alloc::boxed::Box;
use alloc::collections::BinaryHeap;
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::cmp::Reverse;
use core::fmt;
use hashbrown::HashMap;

/// GPT-2's end-of-text token: the special token `tokenizer train` learns by default, which
/// ends every document of a prepared dataset.
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// The tokens that end a text in the tokenizers Alpha reads, in the order they are looked for:
/// GPT-2's (also Qwen2's and SmolLM2's), Llama 3's, SentencePiece's.
pub const END_TOKENS: [&str; 3] = [END_OF_TEXT, "<|end_of_text|>", "</s>"];

/// Why a tokenizer could not be built, loaded or used (one line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BpeError(pub String);

impl fmt::Display for BpeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl core::error::Error for BpeError {}

/// A token matched in the text before pre-tokenization (Hugging Face's added tokens), such as
/// `<|endoftext|>`: its text always becomes its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddedToken {
    /// The text.
    pub content: String,
    /// Its id.
    pub id: u32,
    /// A control token (end of text, padding) rather than a word added to the vocabulary.
    pub special: bool,
}

/// The switches of Hugging Face's `ByteLevel` pre-tokenizer and `BPE` model that change ids
/// (with a [`Pipeline`], of its last pre-tokenizer, the `ByteLevel` one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Put a space before each text (between added tokens) that does not start with one.
    pub add_prefix_space: bool,
    /// Cut text into pieces with GPT-2's pattern (else each text is one piece).
    pub use_regex: bool,
    /// A piece that is a token as a whole becomes that token without merges.
    pub ignore_merges: bool,
}

impl Default for Options {
    /// GPT-2's: no prefix space, GPT-2's pattern, merges always.
    fn default() -> Self {
        Options { add_prefix_space: false, use_regex: true, ignore_merges: false }
    }
}

/// What a piece's tokens are before any merge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alphabet {
    /// Byte-level: each byte a token (GPT-2's, Llama 3's, Qwen2's, SmolLM2's).
    Bytes,
    /// SentencePiece style (TinyLlama's, Mistral's): each character its token where the
    /// vocabulary has it, else its UTF-8 bytes as `<0xNN>` tokens where `byte_fallback` (and
    /// all of them are tokens), else `unk` (one for a run of them where `fuse_unk`), else
    /// nothing (as `tokenizers` drops it).
    Chars {
        /// The unknown token.
        unk: Option<u32>,
        /// A run of unknown characters is one unknown token.
        fuse_unk: bool,
        /// Unknown characters as their bytes' `<0xNN>` tokens.
        byte_fallback: bool,
    },
}

/// The `BPE` model's `continuing_subword_prefix` and `end_of_word_suffix`, as the vocabulary
/// writes them (bytes, or text): a piece's characters but its first are looked up with the
/// prefix before them, its last with the suffix after it; a merge's right token loses the
/// prefix in the merged one. Empty: none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Affixes {
    /// Before every character of a piece but its first.
    pub prefix: Vec<u8>,
    /// After the last character of a piece.
    pub suffix: Vec<u8>,
}

impl Affixes {
    fn is_empty(&self) -> bool {
        self.prefix.is_empty() && self.suffix.is_empty()
    }
}

/// A merge of two adjacent tokens.
#[derive(Clone, Copy, Debug)]
struct Merge {
    /// Its rank: lower merges first.
    rank: u32,
    /// The merged token.
    id: u32,
}

/// The key of a pair of adjacent tokens.
#[inline(always)]
fn pair(left: u32, right: u32) -> u64 {
    (left as u64) << 32 | right as u64
}

const NONE: u32 = u32::MAX;

/// Bytes of text per part that one task encodes or counts: parts even out threads of unequal
/// speed.
pub(crate) const PART_BYTES: usize = 1 << 18;

/// A token of a piece being merged, in a linked list.
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: u32,
    next: u32,
}

/// Buffers of the merge loop, reused from piece to piece.
#[derive(Default)]
struct Scratch {
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Reverse<(u32, u32)>>,
}

/// How many added tokens (and bytes of them) a tokenizer may have before their automaton is
/// kept compact.
const MANY_ADDED: usize = 4096;
const MANY_ADDED_BYTES: usize = 256 << 10;

/// Finds added tokens in a text with one automaton (Aho-Corasick): one pass over the text
/// whatever their number. Where several match, the first to start wins, the longest among
/// those (Hugging Face's rule).
#[derive(Clone, Debug)]
pub(crate) struct AddedMatcher {
    /// `None` without tokens.
    automaton: Option<AhoCorasick>,
}

impl AddedMatcher {
    /// A matcher of `tokens` (none empty: an empty token would match everywhere).
    pub(crate) fn new<'a>(tokens: impl ExactSizeIterator<Item = &'a str> + Clone) -> Result<Self, BpeError> {
        if tokens.len() == 0 {
            return Ok(AddedMatcher { automaton: None });
        }
        if tokens.clone().any(str::is_empty) {
            return Err(BpeError("an added token is empty".into()));
        }
        // Beyond a few thousand tokens (or a few hundred KB of them) the automaton stays in
        // its first, compact form: its faster forms would cost several times the tokens' own
        // size to build, a DFA hundreds of times.
        let bytes: usize = tokens.clone().map(str::len).sum();
        let kind = (tokens.len() > MANY_ADDED || bytes > MANY_ADDED_BYTES).then_some(AhoCorasickKind::NoncontiguousNFA);
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .kind(kind)
            .build(tokens)
            .map_err(|e| BpeError(format!("the added tokens cannot be matched: {e}")))?;
        Ok(AddedMatcher { automaton: Some(automaton) })
    }

    /// `text` cut at the added tokens in it: `(text before, Some(index of the token))` for
    /// each, then `(the rest, None)`.
    pub(crate) fn split<'t>(&'t self, text: &'t str) -> impl Iterator<Item = (&'t str, Option<usize>)> + 't {
        let mut matches = self.automaton.as_ref().map(|a| a.find_iter(text));
        let mut pos = 0;
        core::iter::from_fn(move || {
            if pos > text.len() {
                return None;
            }
            let start = pos;
            Some(match matches.as_mut().and_then(Iterator::next) {
                Some(m) => {
                    pos = m.end();
                    (&text[start..m.start()], Some(m.pattern().as_usize()))
                }
                None => {
                    pos = text.len() + 1;
                    (&text[start..], None)
                }
            })
        })
    }
}

/// A byte-level BPE tokenizer (see the module docs).
#[derive(Clone)]
pub struct Bpe {
    /// Each id's bytes: `bytes[offsets[id]..offsets[id + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<u32>,
    /// The vocabulary's tokens by their bytes.
    ids: HashMap<Vec<u8>, u32>,
    /// The token of each single byte.
    byte_ids: [u32; 256],
    /// Merges by the pair they merge.
    merges: HashMap<u64, Merge>,
    /// The merged pairs in rank order.
    merge_list: Vec<(u32, u32)>,
    /// Whether merging a token's own bytes gives the token (then a piece equal to it needs no
    /// merging: most pieces of a text).
    whole: Vec<bool>,
    added: Vec<AddedToken>,
    /// Finds the added tokens in a text.
    matcher: AddedMatcher,
    options: Options,
    /// What it does beyond GPT-2's tokenizer, if anything.
    pipeline: Option<Box<Pipeline>>,
    /// What a piece's tokens are before merges.
    alphabet: Alphabet,
    /// With a character alphabet, each id's decoded bytes (as `bytes`/`offsets`), which
    /// [`Bpe::token_bytes`] gives; `bytes` holds the tokens' text then.
    decoded: Option<Box<(Vec<u8>, Vec<u32>)>>,
    /// The model's subword prefix and word suffix.
    affixes: Affixes,
}

impl fmt::Debug for Bpe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bpe {{ {} tokens, {} merges, added {:?}, {:?}, {:?} }}", self.vocab_size(), self.merge_list.len(), self.added, self.options, self.pipeline)
    }
}

/// The byte of a SentencePiece byte token's text (`<0x41>`), if it is one.
fn byte_of_token(text: &[u8]) -> Option<u8> {
    match text {
        [b'<', b'0', b'x', hi, lo, b'>'] => {
            let digit = |c: u8| (c as char).to_digit(16);
            let b = (digit(*hi)? * 16 + digit(*lo)?) as u8;
            // As `tokenizers` writes them: upper-case digits.
            (format!("<0x{b:02X}>").as_bytes() == text).then_some(b)
        }
        _ => None,
    }
}

/// Two tokenizers are equal when they give every text the same ids: the same tokens, merges,
/// added tokens, options and pipeline (the maps follow from those).
impl PartialEq for Bpe {
    fn eq(&self, other: &Self) -> bool {
        (&self.bytes, &self.offsets, &self.merge_list, &self.added, self.options, &self.pipeline, self.alphabet, &self.affixes)
            == (&other.bytes, &other.offsets, &other.merge_list, &other.added, other.options, &other.pipeline, other.alphabet, &other.affixes)
    }
}

impl Bpe {
    /// A tokenizer from its vocabulary (each token's bytes and id), its merges in rank order
    /// (each a pair of vocabulary tokens whose concatenation is a token too) and its added
    /// tokens. Ids must run from 0 without gaps, every byte must be a token, and merges must
    /// name tokens; anything else is an error that says what is wrong.
    pub fn new(vocab: Vec<(Vec<u8>, u32)>, merges: &[(Vec<u8>, Vec<u8>)], added: Vec<AddedToken>, options: Options) -> Result<Self, BpeError> {
        Bpe::build(vocab, merges, added, options, Alphabet::Bytes, Affixes::default())
    }

    /// [`Bpe::new`] with a subword prefix or word suffix (see [`Affixes`]).
    pub fn with_affixes(
        vocab: Vec<(Vec<u8>, u32)>,
        merges: &[(Vec<u8>, Vec<u8>)],
        added: Vec<AddedToken>,
        options: Options,
        affixes: Affixes,
    ) -> Result<Self, BpeError> {
        Bpe::build(vocab, merges, added, options, Alphabet::Bytes, affixes)
    }

    /// A SentencePiece-style tokenizer (see [`Alphabet::Chars`]): its vocabulary is the
    /// tokens' text, its merges pairs of those; `decoder` says how ids become text. An
    /// `<0xNN>` token that `alphabet` needs and the vocabulary lacks is an error.
    pub fn with_chars(
        vocab: Vec<(String, u32)>,
        merges: &[(String, String)],
        added: Vec<AddedToken>,
        alphabet: Alphabet,
        affixes: Affixes,
        decoder: &super::pipeline::CharDecoder,
    ) -> Result<Self, BpeError> {
        let vocab = vocab.into_iter().map(|(t, id)| (t.into_bytes(), id)).collect();
        let merges: Vec<(Vec<u8>, Vec<u8>)> = merges.iter().map(|(l, r)| (l.as_bytes().to_vec(), r.as_bytes().to_vec())).collect();
        let mut bpe = Bpe::build(vocab, &merges, added, Options::default(), alphabet, affixes)?;
        let (mut bytes, mut offsets) = (Vec::new(), vec![0u32]);
        for id in 0..bpe.vocab_size() as u32 {
            let text = bpe.token_text(id).expect("ids run to vocab_size");
            match (decoder.byte_fallback, byte_of_token(text)) {
                (true, Some(b)) => bytes.push(b),
                _ => match (&decoder.replace, core::str::from_utf8(text)) {
                    (Some((pattern, content)), Ok(t)) => bytes.extend_from_slice(t.replace(pattern.as_str(), content).as_bytes()),
                    _ => bytes.extend_from_slice(text),
                },
            }
            offsets.push(u32::try_from(bytes.len()).map_err(|_| BpeError("the vocabulary's tokens exceed 4 GiB".into()))?);
        }
        bpe.decoded = Some(Box::new((bytes, offsets)));
        Ok(bpe)
    }

    fn build(
        vocab: Vec<(Vec<u8>, u32)>,
        merges: &[(Vec<u8>, Vec<u8>)],
        added: Vec<AddedToken>,
        options: Options,
        alphabet: Alphabet,
        affixes: Affixes,
    ) -> Result<Self, BpeError> {
        let size = vocab.iter().map(|(_, id)| id).chain(added.iter().map(|a| &a.id)).max().map_or(0, |&m| m as usize + 1);
        // Checked before the table of ids is allocated: a file may claim any id.
        if size > vocab.len() + added.len() {
            return Err(BpeError(format!("ids must run from 0 without gaps: the largest is {}, for {} tokens", size - 1, vocab.len() + added.len())));
        }
        let mut by_id: Vec<Option<&[u8]>> = vec![None; size];
        for (bytes, id) in &vocab {
            if by_id[*id as usize].replace(bytes).is_some() {
                return Err(BpeError(format!("the vocabulary gives id {id} to two tokens")));
            }
        }
        for a in &added {
            if a.content.is_empty() {
                return Err(BpeError(format!("added token {} is empty", a.id)));
            }
            match by_id[a.id as usize] {
                Some(bytes) if bytes != a.content.as_bytes() => {
                    return Err(BpeError(format!("id {} is both a vocabulary token and the added token {:?}", a.id, a.content)));
                }
                _ => by_id[a.id as usize] = Some(a.content.as_bytes()),
            }
        }
        let (mut bytes, mut offsets) = (Vec::new(), vec![0u32]);
        for (id, token) in by_id.iter().enumerate() {
            let token = token.ok_or_else(|| BpeError(format!("ids must run from 0 to {} without gaps: id {id} has no token", size - 1)))?;
            bytes.extend_from_slice(token);
            offsets.push(u32::try_from(bytes.len()).map_err(|_| BpeError("the vocabulary's tokens exceed 4 GiB".into()))?);
        }
        let ids: HashMap<Vec<u8>, u32> = vocab.into_iter().collect();
        let mut byte_ids = [NONE; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = match alphabet {
                Alphabet::Bytes => *ids.get(&[b as u8][..]).ok_or_else(|| {
                    BpeError(format!("the vocabulary has no token for the byte 0x{b:02x}: byte-level BPE needs all 256 (train with the full byte alphabet)"))
                })?,
                // SentencePiece's byte tokens, where it has them.
                Alphabet::Chars { .. } => ids.get(format!("<0x{b:02X}>").as_bytes()).copied().unwrap_or(NONE),
            };
        }
        let token = |bytes: &[u8], rank: usize| {
            ids.get(bytes).copied().ok_or_else(|| BpeError(format!("merge {rank}: {:?} is not in the vocabulary", String::from_utf8_lossy(bytes))))
        };
        let mut merge_map = HashMap::with_capacity(merges.len());
        let mut merge_list = Vec::with_capacity(merges.len());
        for (rank, (left, right)) in merges.iter().enumerate() {
            // The right token's subword prefix is not part of the merged one.
            let right_rest = right.strip_prefix(&affixes.prefix[..]).unwrap_or(right);
            let joined = [&left[..], right_rest].concat();
            let (l, r, id) = (token(left, rank)?, token(right, rank)?, token(&joined, rank)?);
            // A repeated pair takes its last rank, as Hugging Face's map of merges does.
            merge_map.insert(pair(l, r), Merge { rank: rank as u32, id });
            merge_list.push((l, r));
        }
        let matcher = AddedMatcher::new(added.iter().map(|a| a.content.as_str()))?;
        let mut bpe = Bpe {
            bytes,
            offsets,
            ids,
            byte_ids,
            merges: merge_map,
            merge_list,
            whole: Vec::new(),
            added,
            matcher,
            options,
            pipeline: None,
            alphabet,
            decoded: None,
            affixes,
        };
        let mut scratch = Scratch::default();
        let mut out = Vec::new();
        // With affixes a piece's tokens are not its text's: no piece skips the merges.
        let affixed = !bpe.affixes.is_empty();
        bpe.whole = (0..size as u32)
            .map(|id| {
                if affixed {
                    return false;
                }
                out.clear();
                bpe.merge(bpe.token_text(id).unwrap_or_default(), &mut out, &mut scratch);
                out == [id]
            })
            .collect();
        Ok(bpe)
    }

    /// Tokens in the vocabulary, added tokens included: ids are `0..vocab_size()`.
    pub fn vocab_size(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The bytes token `id` decodes to (an added token's text), or `None` past the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let id = id as usize;
        let (bytes, offsets) = self.decoded.as_deref().map_or((&self.bytes, &self.offsets), |(b, o)| (b, o));
        (id + 1 < offsets.len()).then(|| &bytes[offsets[id] as usize..offsets[id + 1] as usize])
    }

    /// Token `id` as the vocabulary has it: its bytes (byte-level), or its text (SentencePiece
    /// style, `▁` and `<0xNN>` as written).
    pub fn token_text(&self, id: u32) -> Option<&[u8]> {
        let id = id as usize;
        (id + 1 < self.offsets.len()).then(|| &self.bytes[self.offsets[id] as usize..self.offsets[id + 1] as usize])
    }

    /// What a piece's tokens are before merges.
    pub fn alphabet(&self) -> Alphabet {
        self.alphabet
    }

    /// The model's subword prefix and word suffix.
    pub fn affixes(&self) -> &Affixes {
        &self.affixes
    }

    /// The added tokens.
    pub fn added_tokens(&self) -> &[AddedToken] {
        &self.added
    }

    /// The merges in rank order, as pairs of ids.
    pub fn merges(&self) -> &[(u32, u32)] {
        &self.merge_list
    }

    /// The pre-tokenizer and model switches.
    pub fn options(&self) -> Options {
        self.options
    }

    /// This tokenizer with `pipeline` around its BPE (an error where its special tokens are
    /// past the vocabulary).
    pub fn with_pipeline(mut self, pipeline: Pipeline) -> Result<Self, BpeError> {
        if let Some(t) = &pipeline.template {
            if let Some(&id) = t.prefix.iter().chain(&t.suffix).find(|&&id| id as usize >= self.vocab_size()) {
                return Err(BpeError(format!("the post-processor adds token id {id}, past the vocabulary ({} tokens)", self.vocab_size())));
            }
        }
        self.pipeline = Some(Box::new(pipeline));
        Ok(self)
    }

    /// What it does beyond GPT-2's tokenizer, if anything.
    pub fn pipeline(&self) -> Option<&Pipeline> {
        self.pipeline.as_deref()
    }

    /// The ids its post-processor puts before and after a text encoded with special tokens
    /// (Llama 3's BOS before; none for GPT-2's).
    pub fn special_tokens_around(&self) -> (&[u32], &[u32]) {
        match self.pipeline.as_ref().and_then(|p| p.template.as_ref()) {
            Some(t) => (&t.prefix, &t.suffix),
            None => (&[], &[]),
        }
    }

    /// The ids of `text` as `tokenizers` encodes it by default (`add_special_tokens=True`):
    /// with the post-processor's special tokens around them.
    pub fn encode_with_special_tokens(&self, text: &str) -> Vec<u32> {
        let (before, after) = self.special_tokens_around();
        let mut out = before.to_vec();
        self.encode(text, &mut out);
        out.extend_from_slice(after);
        out
    }

    /// The id of an added token's text.
    pub fn added_id(&self, content: &str) -> Option<u32> {
        self.added.iter().find(|a| a.content == content).map(|a| a.id)
    }

    /// The token that ends a text (the first of [`END_TOKENS`] it has): its text and id.
    pub fn end_of_text(&self) -> Option<(&str, u32)> {
        END_TOKENS.iter().find_map(|&name| self.added_id(name).map(|id| (name, id)))
    }

    /// Appends the ids of `text` to `out`.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) {
        let mut scratch = Scratch::default();
        for (n, (plain, added)) in self.matcher.split(text).enumerate() {
            self.encode_plain(plain, true, n == 0, out, &mut scratch);
            if let Some(i) = added {
                out.push(self.added[i].id);
            }
        }
    }

    /// The ids of `text`, encoded on `par`'s threads: the same ids as [`Bpe::encode`] for any
    /// number of threads (the text is cut only where its pieces cannot change).
    pub fn encode_with(&self, par: &dyn Parallel, text: &str) -> Vec<u32> {
        self.encode_part(par, text, false)
    }

    /// Where a text may be cut into parts whose ids ([`Bpe::encode_part`]) are those of the
    /// whole: the first such place at or after byte `from` (before a newline that a
    /// non-whitespace character follows, see [`next_cut`]), or `text.len()` where there is
    /// none or the tokenizer allows no cut (without GPT-2's pattern a text is one piece; an
    /// added token with a newline in it could straddle a cut).
    pub fn next_cut(&self, text: &str, from: usize) -> usize {
        // SentencePiece style: a text between added tokens is one piece (or cut at its `▁`s).
        if self.added.iter().any(|a| a.content.contains('\n')) || self.alphabet != Alphabet::Bytes {
            return text.len();
        }
        let word_split = |pattern: &Pattern| matches!(pattern, Pattern::Llama3 | Pattern::Qwen2);
        match self.pipeline.as_ref().map(|p| &p.stages[..]) {
            None | Some([]) if self.options.use_regex => next_cut(text, from),
            // Digits cut anywhere alike; then GPT-2's pattern.
            Some([Stage::Digits { .. }]) if self.options.use_regex => next_cut(text, from),
            Some([Stage::Split { pattern, behavior: Behavior::Isolated, invert: false }]) if word_split(pattern) && !self.options.use_regex => {
                super::split::next_cut(text, from)
            }
            _ => text.len(),
        }
    }

    /// The ids of `part` of a longer text cut at [`Bpe::next_cut`], on `par`'s threads;
    /// `continues` when it is not the text's first part (it then gets no prefix space). The
    /// parts' ids, concatenated, are the ids of the whole text.
    pub fn encode_part(&self, par: &dyn Parallel, part: &str, continues: bool) -> Vec<u32> {
        /// A stretch of plain text (whether it starts a text between added tokens), or one
        /// added token.
        enum Piece<'t> {
            Plain(&'t str, bool, bool),
            Added(u32),
        }
        let mut pieces: Vec<Piece<'_>> = Vec::new();
        for (n, (plain, added)) in self.matcher.split(part).enumerate() {
            let mut start = 0;
            while start < plain.len() {
                let end = self.next_cut(plain, (start + PART_BYTES).min(plain.len()));
                pieces.push(Piece::Plain(&plain[start..end], start == 0 && (n > 0 || !continues), start == 0 && n == 0 && !continues));
                start = end;
            }
            pieces.extend(added.map(|i| Piece::Added(self.added[i].id)));
        }
        let mut outs: Vec<Vec<u32>> = (0..pieces.len()).map(|_| Vec::new()).collect();
        let outs_p = SharedMut(outs.as_mut_ptr());
        par.run(pieces.len(), &|i| {
            // SAFETY: task `i` alone writes output `i`.
            let out = unsafe { &mut outs_p.slice(i, 1)[0] };
            match pieces[i] {
                Piece::Plain(plain, starts, first) => {
                    out.reserve(plain.len() / 3);
                    self.encode_plain(plain, starts, first, out, &mut Scratch::default());
                }
                Piece::Added(id) => out.push(id),
            }
        });
        outs.concat()
    }

    /// The ids of `text`.
    pub fn encode_to_vec(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3);
        self.encode(text, &mut out);
        out
    }

    /// Text with no added token in it; `starts` when it starts a text between added tokens
    /// (not a part that continues one), where `add_prefix_space` may put a space before it;
    /// `first` when it starts the whole text (where `Metaspace` may put its `▁`).
    fn encode_plain(&self, text: &str, starts: bool, first: bool, out: &mut Vec<u32>, scratch: &mut Scratch) {
        if text.is_empty() {
            return;
        }
        if let Alphabet::Chars { .. } = self.alphabet {
            return match &self.pipeline {
                None => self.encode_piece(text.as_bytes(), out, scratch),
                Some(p) => p.metaspace_pieces(&p.normalize(text), first, &mut |piece| self.encode_piece(piece.as_bytes(), out, scratch)),
            };
        }
        match &self.pipeline {
            None => self.byte_level(text, starts, out, scratch),
            // Every piece of the stages before it meets the `ByteLevel` step as a text of its own.
            Some(p) if !p.stages.is_empty() => p.pieces(&p.normalize(text), &mut |piece| self.byte_level(piece, true, out, scratch)),
            Some(p) => self.byte_level(&p.normalize(text), starts, out, scratch),
        }
    }

    /// The `ByteLevel` pre-tokenizer's step on `text` (a space before it where it `starts` and
    /// `add_prefix_space` says so; GPT-2's pattern where `use_regex`), then BPE on each piece.
    fn byte_level(&self, text: &str, starts: bool, out: &mut Vec<u32>, scratch: &mut Scratch) {
        if text.is_empty() {
            return;
        }
        if starts && self.options.add_prefix_space && !text.starts_with(' ') {
            let spaced = [" ", text].concat();
            return self.encode_pieces(&spaced, out, scratch);
        }
        self.encode_pieces(text, out, scratch);
    }

    fn encode_pieces(&self, text: &str, out: &mut Vec<u32>, scratch: &mut Scratch) {
        if self.options.use_regex {
            for piece in Gpt2Split::new(text) {
                self.encode_piece(piece.as_bytes(), out, scratch);
            }
        } else {
            self.encode_piece(text.as_bytes(), out, scratch);
        }
    }

    #[inline]
    fn encode_piece(&self, piece: &[u8], out: &mut Vec<u32>, scratch: &mut Scratch) {
        if let ([b], Alphabet::Bytes, true) = (piece, self.alphabet, self.affixes.is_empty()) {
            return out.push(self.byte_ids[*b as usize]);
        }
        if let (Some(&id), true) = (self.ids.get(piece), self.affixes.is_empty()) {
            if self.options.ignore_merges || self.whole[id as usize] {
                return out.push(id);
            }
        }
        self.merge(piece, out, scratch);
    }

    /// BPE on one piece: its bytes as tokens, then the lowest-ranked applicable merge (the
    /// leftmost among equal ranks) until none applies; appends the tokens to `out`.
    fn merge(&self, piece: &[u8], out: &mut Vec<u32>, scratch: &mut Scratch) {
        let Scratch { symbols, heap } = scratch;
        symbols.clear();
        heap.clear();
        self.initial_symbols(piece, symbols);
        let rank_of = |left: u32, right: u32| self.merges.get(&pair(left, right));
        for i in 1..symbols.len() {
            if let Some(m) = rank_of(symbols[i - 1].id, symbols[i].id) {
                heap.push(Reverse((m.rank, i as u32 - 1)));
            }
        }
        while let Some(Reverse((rank, pos))) = heap.pop() {
            let s = symbols[pos as usize];
            if s.id == NONE || s.next == NONE {
                continue;
            }
            let right = symbols[s.next as usize];
            // A stale entry: the pair at `pos` changed since it was pushed.
            let Some(m) = rank_of(s.id, right.id).filter(|m| m.rank == rank) else { continue };
            symbols[pos as usize].id = m.id;
            symbols[pos as usize].next = right.next;
            symbols[s.next as usize].id = NONE;
            if right.next != NONE {
                symbols[right.next as usize].prev = pos;
                if let Some(after) = rank_of(m.id, symbols[right.next as usize].id) {
                    heap.push(Reverse((after.rank, pos)));
                }
            }
            if s.prev != NONE {
                if let Some(before) = rank_of(symbols[s.prev as usize].id, m.id) {
                    heap.push(Reverse((before.rank, s.prev)));
                }
            }
        }
        let mut at = if symbols.is_empty() { NONE } else { 0 };
        while at != NONE {
            out.push(symbols[at as usize].id);
            at = symbols[at as usize].next;
        }
    }

    /// A piece's tokens before merges (see [`Alphabet`]), linked in order.
    fn initial_symbols(&self, piece: &[u8], symbols: &mut Vec<Symbol>) {
        let mut push = |id: u32| {
            let i = symbols.len() as u32;
            if let Some(last) = symbols.last_mut() {
                last.next = i;
            }
            symbols.push(Symbol { id, prev: if i == 0 { NONE } else { i - 1 }, next: NONE });
        };
        let mut key = Vec::new();
        match self.alphabet {
            Alphabet::Bytes if self.affixes.is_empty() => piece.iter().for_each(|&b| push(self.byte_ids[b as usize])),
            // As `tokenizers` drops a byte-level character it has no token for (no unknown token).
            Alphabet::Bytes => {
                for (i, b) in piece.iter().enumerate() {
                    self.affixed(&mut key, core::slice::from_ref(b), i == 0, i + 1 == piece.len());
                    if let Some(&id) = self.ids.get(&key[..]) {
                        push(id);
                    }
                }
            }
            Alphabet::Chars { unk, fuse_unk, byte_fallback } => {
                let text = core::str::from_utf8(piece).expect("a character alphabet's pieces are text");
                let mut after_unk = false;
                for (i, c) in text.char_indices() {
                    let mut buf = [0u8; 4];
                    self.affixed(&mut key, c.encode_utf8(&mut buf).as_bytes(), i == 0, i + c.len_utf8() == text.len());
                    let bytes = &key[..];
                    if let Some(&id) = self.ids.get(bytes) {
                        push(id);
                    } else if byte_fallback && bytes.iter().all(|&b| self.byte_ids[b as usize] != NONE) {
                        bytes.iter().for_each(|&b| push(self.byte_ids[b as usize]));
                    } else if let Some(unk) = unk {
                        if !(fuse_unk && after_unk) {
                            push(unk);
                        }
                        after_unk = true;
                        continue;
                    }
                    after_unk = false;
                }
            }
        }
    }

    /// `key` set to character `c`'s text as the vocabulary looks it up: the subword prefix
    /// before it unless it is its piece's `first`, the word suffix after it where it is the `last`.
    fn affixed(&self, key: &mut Vec<u8>, c: &[u8], first: bool, last: bool) {
        key.clear();
        if !first {
            key.extend_from_slice(&self.affixes.prefix);
        }
        key.extend_from_slice(c);
        if last {
            key.extend_from_slice(&self.affixes.suffix);
        }
    }

    /// The bytes of `ids` (added tokens as their text): the text they encode, or part of one.
    pub fn decode(&self, ids: &[u32]) -> Result<Vec<u8>, BpeError> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(
                self.token_bytes(id).ok_or_else(|| BpeError(format!("token id {id} is past the vocabulary ({} tokens)", self.vocab_size())))?,
            );
        }
        // A SentencePiece decoder's `Strip`: the text's leading spaces it removes.
        let strip = self.pipeline.as_ref().map_or(0, |p| p.decoder.strip_start);
        let leading = out.iter().take(strip).take_while(|&&b| b == b' ').count();
        out.drain(..leading);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes, then the merges' tokens; `merges` as strings.
    fn tokenizer(merges: &[(&str, &str)], added: &[&str]) -> Bpe {
        let mut vocab: Vec<(Vec<u8>, u32)> = (0..=255u8).map(|b| (vec![b], b as u32)).collect();
        let merges: Vec<(Vec<u8>, Vec<u8>)> = merges.iter().map(|(a, b)| (a.as_bytes().to_vec(), b.as_bytes().to_vec())).collect();
        for (a, b) in &merges {
            let joined = [&a[..], &b[..]].concat();
            if !vocab.iter().any(|(t, _)| *t == joined) {
                vocab.push((joined, vocab.len() as u32));
            }
        }
        let added = added.iter().enumerate().map(|(i, s)| AddedToken { content: (*s).into(), id: (vocab.len() + i) as u32, special: true }).collect();
        Bpe::new(vocab, &merges, added, Options::default()).unwrap()
    }

    #[test]
    fn merges_lowest_rank_first_and_leftmost_among_equals() {
        // "b"+"c" ranks before "a"+"b": "abc" -> a, bc (not ab, c), even though "abc" exists
        // as a token (reached from "ab"+"c" only).
        let t = tokenizer(&[("b", "c"), ("a", "b"), ("ab", "c")], &[]);
        let bc = t.ids[&b"bc"[..]];
        assert_eq!(t.encode_to_vec("abc"), [b'a' as u32, bc]);
        // "aaa": the leftmost pair merges.
        let t = tokenizer(&[("a", "a")], &[]);
        let aa = t.ids[&b"aa"[..]];
        assert_eq!(t.encode_to_vec("aaa"), [aa, b'a' as u32]);
        assert_eq!(t.encode_to_vec("aaaa"), [aa, aa]);
    }

    #[test]
    fn added_tokens_match_first_and_longest() {
        let t = tokenizer(&[], &["<a>", "<a><b>"]);
        let ids = t.encode_to_vec("x<a><b>y<a>");
        assert_eq!(ids, [b'x' as u32, 257, b'y' as u32, 256]);
        assert_eq!(t.decode(&ids).unwrap(), b"x<a><b>y<a>");
        assert!(t.decode(&[258]).is_err());
    }

    #[test]
    fn threads_and_parts_give_the_same_ids() {
        let gpt2 = tokenizer(&[("t", "h"), ("th", "e"), (" ", "th"), ("\n", "\n"), (" ", "x"), (" x", "\n")], &["<e>"]);
        let line = |i: usize| if i % 30_000 == 7 { "<e>" } else { ["the cat\n", "\n  then", "x\n\nthe", " ünïcödé\n"][i % 4] };
        let text: String = (0..100_000).map(line).collect();
        assert!(text.len() > 2 * PART_BYTES);
        let with = |options: Options| Bpe { options, ..gpt2.clone() };
        let prefixed = Options { add_prefix_space: true, ..Options::default() };
        let one_piece = Options { use_regex: false, ..Options::default() };
        let staged = |options: Options, stage: Stage| {
            let pipeline = Pipeline { normalizers: vec![super::super::pipeline::Normalizer::Nfc], stages: vec![stage], ..Pipeline::default() };
            with(options).with_pipeline(pipeline).unwrap()
        };
        let llama3 = staged(one_piece, Stage::Split { pattern: Pattern::Llama3, behavior: Behavior::Isolated, invert: false });
        let smollm2 = staged(Options::default(), Stage::Digits { individual: true });
        for t in [with(Options::default()), with(prefixed), with(one_piece), llama3, smollm2] {
            let whole = t.encode_to_vec(&text);
            assert_eq!(t.encode_with(&crate::parallel::ReversedThreads(3), &text), whole, "{:?}", t.options);
            // Cut where the tokenizer allows, each part encoded alone.
            let (mut ids, mut start) = (Vec::new(), 0);
            while start < text.len() {
                let end = t.next_cut(&text, start + 100_003);
                ids.extend(t.encode_part(&crate::Serial, &text[start..end], start > 0));
                start = end;
            }
            assert_eq!(ids, whole, "{:?}", t.options);
        }
    }

    /// SentencePiece style: characters the vocabulary lacks fall back to their bytes' tokens,
    /// or to one unknown token for a run of them; decoding undoes the byte fallback.
    #[test]
    fn characters_fall_back_to_bytes_or_the_unknown_token() {
        use super::super::pipeline::CharDecoder;
        let text = |v: &[(&str, u32)]| v.iter().map(|&(t, id)| (t.to_string(), id)).collect::<Vec<_>>();
        let merges = [("a".to_string(), "b".to_string())];
        let decoder = CharDecoder { byte_fallback: true, ..CharDecoder::default() };
        let bytes = Alphabet::Chars { unk: None, fuse_unk: false, byte_fallback: true };
        let t = Bpe::with_chars(text(&[("a", 0), ("b", 1), ("ab", 2), ("<0xC3>", 3), ("<0xA9>", 4)]), &merges, Vec::new(), bytes, Affixes::default(), &decoder)
            .unwrap();
        assert_eq!(t.encode_to_vec("abé"), [2, 3, 4]);
        assert_eq!(t.decode(&[2, 3, 4]).unwrap(), "abé".as_bytes());
        // No token for the euro sign's bytes: the unknown token, once for the run.
        let unk = AddedToken { content: "<unk>".into(), id: 3, special: true };
        let fused = Alphabet::Chars { unk: Some(3), fuse_unk: true, byte_fallback: true };
        let t = Bpe::with_chars(text(&[("a", 0), ("b", 1), ("ab", 2)]), &merges, vec![unk], fused, Affixes::default(), &decoder).unwrap();
        assert_eq!(t.encode_to_vec("a€€b ab"), [0, 3, 1, 3, 2]);
    }

    #[test]
    fn malformed_vocabularies_are_errors() {
        let bytes: Vec<(Vec<u8>, u32)> = (0..=255u8).map(|b| (vec![b], b as u32)).collect();
        let err = |vocab: Vec<(Vec<u8>, u32)>, merges: &[(Vec<u8>, Vec<u8>)]| Bpe::new(vocab, merges, Vec::new(), Options::default()).err().unwrap().0;
        assert!(err(bytes[1..].to_vec(), &[]).contains("gaps"));
        let mut huge = bytes.clone();
        huge[5].1 = u32::MAX;
        assert!(err(huge, &[]).contains("the largest is 4294967295, for 256 tokens"));
        let mut shifted = bytes[1..].to_vec();
        shifted.push((b"zz".to_vec(), 0));
        assert!(err(shifted, &[]).contains("0x00"));
        assert!(err(bytes.clone(), &[(b"a".to_vec(), b"b".to_vec())]).contains("\"ab\" is not in the vocabulary"));
    }
}
