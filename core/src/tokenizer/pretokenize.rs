//! GPT-2's pre-tokenization: text is cut into pieces before BPE (no merge crosses a piece),
//! exactly as the regular expression
//! `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+` cuts it
//! (Hugging Face's `ByteLevel` pre-tokenizer, OpenAI's `encoder.py`), written as a scanner:
//! the same pieces at tens of times a regex engine's speed. `\p{L}` and `\p{N}` are Unicode's
//! letter and number categories (from the `unicode-properties` crate), `\s` its `White_Space`
//! property.
//!
//! ```
//! use alpha_core::tokenizer::pretokenize::Gpt2Split;
//! let pieces: Vec<&str> = Gpt2Split::new("Hello world's  3.5\n\n").collect();
//! assert_eq!(pieces, ["Hello", " world", "'s", " ", " 3", ".", "5", "\n\n"]);
//! ```

use unicode_properties::{GeneralCategoryGroup, UnicodeGeneralCategory};

/// The classes the pattern tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// `\p{L}`.
    Letter,
    /// `\p{N}`.
    Number,
    /// `\s`.
    Space,
    /// Anything else (`[^\s\p{L}\p{N}]`).
    Other,
}

/// The class of each ASCII byte.
pub(crate) const ASCII: [Class; 128] = {
    let mut table = [Class::Other; 128];
    let mut b = 0;
    while b < 128 {
        table[b] = match b as u8 {
            b'a'..=b'z' | b'A'..=b'Z' => Class::Letter,
            b'0'..=b'9' => Class::Number,
            b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ' => Class::Space,
            _ => Class::Other,
        };
        b += 1;
    }
    table
};

/// Unicode's `White_Space` property (the characters `\s` matches).
fn is_white_space(c: char) -> bool {
    matches!(c, '\t'..='\r' | ' ' | '\u{85}' | '\u{A0}' | '\u{1680}' | '\u{2000}'..='\u{200A}' | '\u{2028}' | '\u{2029}' | '\u{202F}' | '\u{205F}' | '\u{3000}')
}

/// The class of a character.
pub(crate) fn class_of(c: char) -> Class {
    if c.is_ascii() {
        return ASCII[c as usize];
    }
    if is_white_space(c) {
        return Class::Space;
    }
    match c.general_category_group() {
        GeneralCategoryGroup::Letter => Class::Letter,
        GeneralCategoryGroup::Number => Class::Number,
        _ => Class::Other,
    }
}

/// A text as the pattern scanners read it (here and in [`super::split`]).
#[derive(Clone, Copy)]
pub(crate) struct Scan<'a>(pub &'a str);

impl Scan<'_> {
    /// The character at byte `i` (a boundary inside the text): its class, length and value.
    #[inline(always)]
    pub(crate) fn char_at(self, i: usize) -> (Class, usize, char) {
        let b = self.0.as_bytes()[i];
        if b < 128 {
            return (ASCII[b as usize], 1, b as char);
        }
        let c = self.0[i..].chars().next().expect("a character boundary inside the text");
        (class_of(c), c.len_utf8(), c)
    }

    /// The end of the run of `class` characters from byte `i`.
    #[inline(always)]
    pub(crate) fn run_end(self, mut i: usize, class: Class) -> usize {
        while i < self.0.len() {
            let (c, len, _) = self.char_at(i);
            if c != class {
                break;
            }
            i += len;
        }
        i
    }

    /// The end of a piece of whitespace from `start` whose run ends at `end`: `\s+(?!\S)`,
    /// the run less its last character where a non-space follows (that one may lead the next
    /// piece); `\s+`, the run, where that leaves nothing.
    pub(crate) fn whitespace_end(self, start: usize, end: usize) -> usize {
        if end == self.0.len() {
            return end;
        }
        let last = self.0[..end].char_indices().next_back().map_or(start, |(i, _)| i);
        if last > start {
            last
        } else {
            end
        }
    }

    /// The piece from `*pos` that `piece_end` ends, advancing `*pos` past it.
    #[inline]
    pub(crate) fn next_piece<'t>(text: &'t str, pos: &mut usize, piece_end: impl FnOnce(usize) -> usize) -> Option<&'t str> {
        if *pos >= text.len() {
            return None;
        }
        let start = *pos;
        *pos = piece_end(start);
        Some(&text[start..*pos])
    }
}

/// The pieces of a text, in order (an iterator of `&str`: together they are the text).
pub struct Gpt2Split<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Gpt2Split<'a> {
    /// The pieces of `text`.
    pub fn new(text: &'a str) -> Self {
        Gpt2Split { text, pos: 0 }
    }

    /// The length of a contraction (`'s 't 're 've 'm 'll 'd`) at byte `i` of `text`, or 0.
    fn contraction_at(text: &str, i: usize) -> usize {
        match text.as_bytes()[i..] {
            [b'\'', b's' | b't' | b'm' | b'd', ..] => 2,
            [b'\'', b'r' | b'v', b'e', ..] | [b'\'', b'l', b'l', ..] => 3,
            _ => 0,
        }
    }

    /// The end of the piece of `text` starting at byte `start`.
    fn piece_end(text: &str, start: usize) -> usize {
        let contraction = Gpt2Split::contraction_at(text, start);
        if contraction > 0 {
            return start + contraction;
        }
        let scan = Scan(text);
        let (class, len, _) = scan.char_at(start);
        // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: one space may lead a run.
        if text.as_bytes()[start] == b' ' && start + 1 < text.len() {
            let (next, next_len, _) = scan.char_at(start + 1);
            if next != Class::Space {
                return scan.run_end(start + 1 + next_len, next);
            }
        }
        if class != Class::Space {
            return scan.run_end(start + len, class);
        }
        scan.whitespace_end(start, scan.run_end(start + len, Class::Space))
    }
}

impl<'a> Iterator for Gpt2Split<'a> {
    type Item = &'a str;

    #[inline]
    fn next(&mut self) -> Option<&'a str> {
        let text = self.text;
        Scan::next_piece(text, &mut self.pos, |start| Gpt2Split::piece_end(text, start))
    }
}

/// Where `text` may be cut into parts that split into the same pieces as the whole: before a
/// newline that a non-whitespace character follows (the newline is a piece of its own then,
/// and what precedes it ends a piece either way), so that threads can split parts apart.
/// Returns the first such cut at or after byte `from`, or `text.len()`.
pub fn next_cut(text: &str, from: usize) -> usize {
    let bytes = text.as_bytes();
    let mut i = from;
    while let Some(offset) = bytes[i.min(bytes.len())..].iter().position(|&b| b == b'\n') {
        let nl = i + offset;
        if text[nl + 1..].chars().next().is_some_and(|c| class_of(c) != Class::Space) {
            return nl;
        }
        i = nl + 1;
    }
    text.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    extern crate alloc;
    use alloc::vec::Vec;

    fn split(text: &str) -> Vec<&str> {
        Gpt2Split::new(text).collect()
    }

    #[test]
    fn splits_as_the_gpt2_pattern() {
        assert_eq!(split("I'm here, they'll see"), ["I", "'m", " here", ",", " they", "'ll", " see"]);
        assert_eq!(split("'S 's ''s"), ["'", "S", " '", "s", " ''", "s"]);
        assert_eq!(split("  hello"), [" ", " hello"]);
        assert_eq!(split("\n\nhello"), ["\n", "\n", "hello"]);
        assert_eq!(split("a \n  b"), ["a", " \n ", " b"]);
        assert_eq!(split("x\t\ty"), ["x", "\t", "\t", "y"]);
        assert_eq!(split("ends   "), ["ends", "   "]);
        assert_eq!(split("12,345 678"), ["12", ",", "345", " 678"]);
        assert_eq!(split("café 東京 ½ — 🦀!"), ["café", " 東京", " ½", " —", " 🦀!"]);
        assert_eq!(split("a\u{A0}b"), ["a", "\u{A0}", "b"]);
        assert_eq!(split(" "), [" "]);
        assert_eq!(split(""), Vec::<&str>::new());
    }

    #[test]
    fn cuts_do_not_change_the_pieces() {
        let text = "First line.\nSecond  line\n\n  third\n\nFourth\n \nfifth\n";
        let whole = split(text);
        let mut parts = Vec::new();
        let mut start = 0;
        while start < text.len() {
            let end = next_cut(text, start + 1);
            assert!(end == text.len() || &text[end..end + 1] == "\n");
            parts.extend(split(&text[start..end]));
            start = end;
        }
        assert_eq!(parts, whole);
    }
}
