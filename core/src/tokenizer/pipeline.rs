//! What Hugging Face's tokenizers do around BPE beyond GPT-2's `ByteLevel` pre-tokenizer:
//! normalizers (NFC, as Qwen2's; SentencePiece's `Prepend` and `Replace`), pre-tokenizers
//! before the `ByteLevel` one (`Split` with Llama 3's, Qwen2's or GPT-2's pattern or a literal,
//! as `tokenizers` defines `behavior` and `invert`; `Digits`, as SmolLM2's) or SentencePiece's
//! `Metaspace`, a post-processor that adds special tokens (`TemplateProcessing`, as Llama 3's
//! BOS), and SentencePiece's decoders. A [`Pipeline`] holds them with the JSON they were read
//! from, which a written `tokenizer.json` repeats.
//!
//! ```
//! use alpha_core::tokenizer::pipeline::{Behavior, Pattern, Stage};
//! let digits = Stage::Digits { individual: true };
//! let mut pieces = Vec::new();
//! digits.split("in 2026!", &mut |p| pieces.push(p.to_string()));
//! assert_eq!(pieces, ["in ", "2", "0", "2", "6", "!"]);
//! let split = Stage::Split { pattern: Pattern::Literal("-".into()), behavior: Behavior::MergedWithNext, invert: false };
//! pieces.clear();
//! split.split("a-b--c", &mut |p| pieces.push(p.to_string()));
//! assert_eq!(pieces, ["a", "-b", "-", "-c"]);
//! ```

use super::pretokenize::Gpt2Split;
use super::split::WordSplit;
use alloc::borrow::Cow;
use alloc::string::String;
use alloc::vec::Vec;
use serde_json::Value;
use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};

/// GPT-2's pattern, as tokenizer.json files write it in a `Split` (the `ByteLevel`
/// pre-tokenizer's own).
pub const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// A normalizer, applied to text between added tokens before it is pre-tokenized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Normalizer {
    /// Unicode's canonical composition (NFC).
    Nfc,
    /// `Prepend`: this string before a text that is not empty (SentencePiece's `▁`).
    Prepend(String),
    /// `Replace` with a literal pattern: every `pattern` becomes `content`.
    Replace {
        /// What is replaced.
        pattern: String,
        /// What replaces it.
        content: String,
    },
}

/// When `Metaspace` puts its replacement before a text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrependScheme {
    /// Before every text (between added tokens) that does not start with it.
    Always,
    /// Before the first text only (the one at the start of the input).
    First,
    /// Never.
    Never,
}

/// SentencePiece's pre-tokenizer (`Metaspace`): spaces become `replacement` (`▁`), which is
/// put before a text as `prepend` says; with `split`, a piece starts at each replacement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metaspace {
    /// What spaces become.
    pub replacement: char,
    /// When it goes before a text.
    pub prepend: PrependScheme,
    /// Pieces start at each replacement (else the text is one piece).
    pub split: bool,
}

/// How a SentencePiece-style tokenizer's ids become text (its `decoder`): each token's text
/// with `replace` applied (`▁` to a space), `<0xNN>` tokens as their byte (`ByteFallback`),
/// joined (`Fuse`), and `strip_start` leading spaces removed (`Strip`, or `Metaspace`'s
/// prefix).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CharDecoder {
    /// A pattern and what each token's text has in its place.
    pub replace: Option<(String, String)>,
    /// `<0xNN>` tokens decode to their byte.
    pub byte_fallback: bool,
    /// Leading spaces the decoded text loses.
    pub strip_start: usize,
}

/// What a `Split` pre-tokenizer cuts at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Llama 3's regular expression ([`super::split::LLAMA3_PATTERN`]).
    Llama3,
    /// Qwen2's ([`super::split::QWEN2_PATTERN`]).
    Qwen2,
    /// GPT-2's ([`GPT2_PATTERN`]).
    Gpt2,
    /// A literal string.
    Literal(String),
    /// Any other regular expression (the `regex` feature: a backtracking engine, for
    /// look-ahead as `tokenizers`' Oniguruma has it).
    #[cfg(feature = "regex")]
    Regex(RegexPattern),
}

/// A compiled regular expression, equal to another with the same source.
#[cfg(feature = "regex")]
#[derive(Clone, Debug)]
pub struct RegexPattern(fancy_regex::Regex);

#[cfg(feature = "regex")]
impl RegexPattern {
    /// `pattern` compiled, or why it cannot be.
    pub fn new(pattern: &str) -> Result<RegexPattern, String> {
        // A backtracking limit no pre-tokenization pattern nears: past it a text would be
        // cut where the engine gave up, which `tokenizers` would not do.
        let compiled = fancy_regex::RegexBuilder::new(pattern).backtrack_limit(usize::MAX).build().map_err(|e| alloc::format!("{e}"))?;
        Ok(RegexPattern(compiled))
    }

    /// Its source.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

#[cfg(feature = "regex")]
impl PartialEq for RegexPattern {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

#[cfg(feature = "regex")]
impl Eq for RegexPattern {}

/// What a split does with what its pattern matches (Hugging Face's `SplitDelimiterBehavior`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behavior {
    /// Matches are dropped.
    Removed,
    /// Each match is a piece of its own.
    Isolated,
    /// Each match joins the piece before it.
    MergedWithPrevious,
    /// Each match joins the piece after it.
    MergedWithNext,
    /// Consecutive matches form one piece.
    Contiguous,
}

/// A pre-tokenizer before the `ByteLevel` one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stage {
    /// `Split`: pieces at a pattern's matches.
    Split {
        /// What it matches.
        pattern: Pattern,
        /// What becomes of the matches.
        behavior: Behavior,
        /// Matches and the text between them swap roles.
        invert: bool,
    },
    /// `Digits`: numbers (Unicode's `Nd`, `Nl`, `No`) apart from the rest, each one alone
    /// (`individual`) or in runs.
    Digits {
        /// Each digit a piece of its own.
        individual: bool,
    },
}

/// `(start, end, is_match)` spans of a piece, in order, covering it (Hugging Face's
/// `find_matches`: the text between matches is a span too).
fn spans(text: &str, matches: impl Iterator<Item = (usize, usize)>) -> Vec<(usize, usize, bool)> {
    let mut out = Vec::new();
    let mut prev = 0;
    for (start, end) in matches {
        if prev != start {
            out.push((prev, start, false));
        }
        out.push((start, end, true));
        prev = end;
    }
    if prev != text.len() {
        out.push((prev, text.len(), false));
    }
    out
}

/// `spans` (flipped where `invert`) combined as `behavior` says, each non-empty piece given to
/// `f` (Hugging Face's `NormalizedString::split`).
fn emit(text: &str, mut spans: Vec<(usize, usize, bool)>, behavior: Behavior, invert: bool, f: &mut dyn FnMut(&str)) {
    if invert {
        spans.iter_mut().for_each(|s| s.2 = !s.2);
    }
    let mut pieces: Vec<(usize, usize, bool)> = Vec::with_capacity(spans.len());
    let mut previous_match = false;
    match behavior {
        Behavior::Removed => pieces.extend(spans.into_iter().filter(|s| !s.2)),
        Behavior::Isolated => pieces = spans,
        Behavior::MergedWithPrevious => {
            for (start, end, is_match) in spans {
                match pieces.last_mut() {
                    Some(last) if is_match && !previous_match => last.1 = end,
                    _ => pieces.push((start, end, is_match)),
                }
                previous_match = is_match;
            }
        }
        Behavior::MergedWithNext => {
            for (start, end, is_match) in spans.into_iter().rev() {
                match pieces.last_mut() {
                    Some(last) if is_match && !previous_match => last.0 = start,
                    _ => pieces.push((start, end, is_match)),
                }
                previous_match = is_match;
            }
            pieces.reverse();
        }
        Behavior::Contiguous => {
            for (start, end, is_match) in spans {
                match pieces.last_mut() {
                    Some(last) if is_match == previous_match => last.1 = end,
                    _ => pieces.push((start, end, is_match)),
                }
                previous_match = is_match;
            }
        }
    }
    for (start, end, _) in pieces {
        if start < end {
            f(&text[start..end]);
        }
    }
}

/// The ranges of a scanner's pieces in `text` (which they tile).
fn tiles<'t>(text: &'t str, pieces: impl Iterator<Item = &'t str> + 't) -> impl Iterator<Item = (usize, usize)> + 't {
    let base = text.as_ptr() as usize;
    pieces.map(move |p| {
        let start = p.as_ptr() as usize - base;
        (start, start + p.len())
    })
}

impl Stage {
    /// Gives `f` the pieces of `piece`, in order.
    pub fn split(&self, piece: &str, f: &mut dyn FnMut(&str)) {
        match self {
            Stage::Split { pattern: pattern @ (Pattern::Llama3 | Pattern::Qwen2 | Pattern::Gpt2), behavior: Behavior::Isolated, invert: false } => {
                match pattern {
                    // The patterns match every character: their pieces are the pieces.
                    Pattern::Llama3 => WordSplit::llama3(piece).for_each(f),
                    Pattern::Qwen2 => WordSplit::qwen2(piece).for_each(f),
                    _ => Gpt2Split::new(piece).for_each(f),
                }
            }
            Stage::Split { pattern, behavior, invert } => {
                let spans = match pattern {
                    Pattern::Llama3 => spans(piece, tiles(piece, WordSplit::llama3(piece))),
                    Pattern::Qwen2 => spans(piece, tiles(piece, WordSplit::qwen2(piece))),
                    Pattern::Gpt2 => spans(piece, tiles(piece, Gpt2Split::new(piece))),
                    Pattern::Literal(s) if s.is_empty() => spans(piece, core::iter::empty()),
                    Pattern::Literal(s) => spans(piece, piece.match_indices(s.as_str()).map(|(i, m)| (i, i + m.len()))),
                    #[cfg(feature = "regex")]
                    Pattern::Regex(re) => {
                        let found = re.0.find_iter(piece).map(|m| m.expect("no backtracking limit to reach")).map(|m| (m.start(), m.end()));
                        spans(piece, found)
                    }
                };
                emit(piece, spans, *behavior, *invert, f)
            }
            Stage::Digits { individual } => {
                let digits = piece.char_indices().filter(|(_, c)| c.is_numeric()).map(|(i, c)| (i, i + c.len_utf8()));
                let behavior = if *individual { Behavior::Isolated } else { Behavior::Contiguous };
                emit(piece, spans(piece, digits), behavior, false, f)
            }
        }
    }
}

/// A `TemplateProcessing` post-processor's effect on one text: ids before and after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    /// Ids before the text's (Llama 3's BOS).
    pub prefix: Vec<u32>,
    /// Ids after them.
    pub suffix: Vec<u32>,
}

/// Everything a tokenizer does beyond GPT-2's (see the module docs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pipeline {
    /// Applied in order to the text between added tokens.
    pub normalizers: Vec<Normalizer>,
    /// Pre-tokenizers before the `ByteLevel` one, in order.
    pub stages: Vec<Stage>,
    /// Special tokens around a text encoded with them.
    pub template: Option<Template>,
    /// With a character alphabet (SentencePiece style), its pre-tokenizer if it has one.
    pub metaspace: Option<Metaspace>,
    /// With a character alphabet, how ids become text.
    pub decoder: CharDecoder,
    /// The `normalizer`, `pre_tokenizer`, `post_processor` and `decoder` of the
    /// tokenizer.json they were read from, which a written one repeats.
    pub json: [Value; 4],
}

impl Pipeline {
    /// `text` normalized (borrowed where normalizing changes nothing).
    pub fn normalize<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let mut text = Cow::Borrowed(text);
        for n in &self.normalizers {
            match n {
                Normalizer::Nfc if is_nfc_quick(text.chars()) == IsNormalized::Yes => {}
                Normalizer::Nfc => text = Cow::Owned(text.nfc().collect()),
                Normalizer::Prepend(p) if !text.is_empty() => text = Cow::Owned([p.as_str(), &text].concat()),
                Normalizer::Prepend(_) => {}
                Normalizer::Replace { pattern, content } if !pattern.is_empty() && text.contains(pattern.as_str()) => {
                    text = Cow::Owned(text.replace(pattern.as_str(), content))
                }
                Normalizer::Replace { .. } => {}
            }
        }
        text
    }

    /// With a character alphabet: gives `f` the pieces of `text` (normalized) after the
    /// `Metaspace` pre-tokenizer, if there is one (`first`: the text starts the input).
    pub fn metaspace_pieces(&self, text: &str, first: bool, f: &mut dyn FnMut(&str)) {
        let Some(m) = self.metaspace else { return f(text) };
        let mut spaced = String::with_capacity(text.len() + 3);
        let prepend = match m.prepend {
            PrependScheme::Always => true,
            PrependScheme::First => first,
            PrependScheme::Never => false,
        };
        if prepend && !text.starts_with(m.replacement) && !text.starts_with(' ') {
            spaced.push(m.replacement);
        }
        spaced.extend(text.chars().map(|c| if c == ' ' { m.replacement } else { c }));
        if !m.split {
            return f(&spaced);
        }
        let mut buf = [0u8; 4];
        let marks = spaced.match_indices(&*m.replacement.encode_utf8(&mut buf)).map(|(i, r)| (i, i + r.len()));
        emit(&spaced, spans(&spaced, marks), Behavior::MergedWithNext, false, f)
    }

    /// Gives `f` the pieces `text` (normalized) has after every stage, in order.
    pub fn pieces(&self, text: &str, f: &mut dyn FnMut(&str)) {
        fn run(stages: &[Stage], piece: &str, f: &mut dyn FnMut(&str)) {
            match stages.split_first() {
                None => f(piece),
                Some((stage, rest)) => stage.split(piece, &mut |sub| run(rest, sub, f)),
            }
        }
        run(&self.stages, text, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    fn split(stage: &Stage, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        stage.split(text, &mut |p| out.push(p.to_string()));
        out
    }

    fn literal(behavior: Behavior, invert: bool) -> Stage {
        Stage::Split { pattern: Pattern::Literal("-".into()), behavior, invert }
    }

    /// Each behavior on "a-b--c", as `tokenizers` splits it.
    #[test]
    fn behaviors_split_as_tokenizers_does() {
        assert_eq!(split(&literal(Behavior::Removed, false), "a-b--c"), ["a", "b", "c"]);
        assert_eq!(split(&literal(Behavior::Isolated, false), "a-b--c"), ["a", "-", "b", "-", "-", "c"]);
        assert_eq!(split(&literal(Behavior::MergedWithPrevious, false), "a-b--c"), ["a-", "b-", "-", "c"]);
        assert_eq!(split(&literal(Behavior::MergedWithNext, false), "a-b--c"), ["a", "-b", "-", "-c"]);
        assert_eq!(split(&literal(Behavior::Contiguous, false), "a-b--c"), ["a", "-", "b", "--", "c"]);
        assert_eq!(split(&literal(Behavior::Removed, true), "a-b--c"), ["-", "-", "-"]);
        assert_eq!(split(&Stage::Digits { individual: false }, "x123y4"), ["x", "123", "y", "4"]);
    }

    #[test]
    fn nfc_composes() {
        let p = Pipeline { normalizers: alloc::vec![Normalizer::Nfc], ..Pipeline::default() };
        assert_eq!(p.normalize("e\u{301}"), "\u{e9}");
        assert!(matches!(p.normalize("plain"), Cow::Borrowed(_)));
    }
}
