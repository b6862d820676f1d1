//! The pre-tokenization pattern of Llama 3 and Qwen2 (Hugging Face's `Split` pre-tokenizer with
//! their regular expression, before a `ByteLevel` without its own), written as a scanner:
//!
//! `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
//!
//! Llama 3's takes runs of up to three numbers (`\p{N}{1,3}`), Qwen2's one (`\p{N}`). The
//! alternatives are tried in order at each position, as a backtracking engine tries them; the
//! classes are [`super::pretokenize`]'s (`\p{L}`, `\p{N}`, `\s` as Unicode's `White_Space`).
//!
//! ```
//! use alpha_core::tokenizer::split::WordSplit;
//! let pieces: Vec<&str> = WordSplit::llama3("Hello world's 12345\n\n  ok").collect();
//! assert_eq!(pieces, ["Hello", " world", "'s", " ", "123", "45", "\n\n", " ", " ok"]);
//! ```

use super::pretokenize::{class_of, Class, Scan};

/// Llama 3's pattern, as tokenizer.json files write it.
pub const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's pattern: Llama 3's with one number per piece.
pub const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pieces of a text under Llama 3's or Qwen2's pattern, in order (together they are the
/// text: the pattern matches every character).
pub struct WordSplit<'a> {
    text: &'a str,
    pos: usize,
    /// The most numbers a piece takes.
    digits: usize,
}

impl<'a> WordSplit<'a> {
    /// The pieces of `text` under Llama 3's pattern.
    pub fn llama3(text: &'a str) -> Self {
        WordSplit { text, pos: 0, digits: 3 }
    }

    /// The pieces of `text` under Qwen2's pattern.
    pub fn qwen2(text: &'a str) -> Self {
        WordSplit { text, pos: 0, digits: 1 }
    }

    /// The byte length of a contraction at byte `i` of `text` (`'s 't 're 've 'm 'll 'd`, any
    /// case; `ſ`, the long s, folds to s), or 0.
    fn contraction_at(text: &str, i: usize) -> usize {
        let rest = &text.as_bytes()[i..];
        let lower = |k: usize| rest.get(k).map(|b| b.to_ascii_lowercase());
        if rest.first() != Some(&b'\'') {
            return 0;
        }
        match (lower(1), lower(2)) {
            (Some(b's' | b't' | b'm' | b'd'), _) => 2,
            (Some(b'r' | b'v'), Some(b'e')) | (Some(b'l'), Some(b'l')) => 3,
            _ if rest[1..].starts_with("ſ".as_bytes()) => 3,
            _ => 0,
        }
    }

    /// The end of the piece of `text` starting at byte `start`, numbers in runs of up to
    /// `digits`.
    fn piece_end(text: &str, digits: usize, start: usize) -> usize {
        let contraction = WordSplit::contraction_at(text, start);
        if contraction > 0 {
            return start + contraction;
        }
        let scan = Scan(text);
        let len = text.len();
        let (class, c_len, c) = scan.char_at(start);
        let next = (start + c_len < len).then(|| scan.char_at(start + c_len));
        // `[^\r\n\p{L}\p{N}]?\p{L}+`.
        if class == Class::Letter {
            return scan.run_end(start + c_len, Class::Letter);
        }
        if class != Class::Number && c != '\r' && c != '\n' {
            if let Some((Class::Letter, n_len, _)) = next {
                return scan.run_end(start + c_len + n_len, Class::Letter);
            }
        }
        // `\p{N}{1,3}` (Qwen2: `\p{N}`).
        if class == Class::Number {
            let mut end = start + c_len;
            for _ in 1..digits {
                match (end < len).then(|| scan.char_at(end)) {
                    Some((Class::Number, l, _)) => end += l,
                    _ => break,
                }
            }
            return end;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`.
        let other_from = match (c, next) {
            (' ', Some((Class::Other, _, _))) => Some(start + 1),
            _ if class == Class::Other => Some(start),
            _ => None,
        };
        if let Some(from) = other_from {
            let end = scan.run_end(from, Class::Other);
            return end + text.as_bytes()[end..].iter().take_while(|&&b| b == b'\r' || b == b'\n').count();
        }
        // Whitespace. `\s*[\r\n]+`: up to the run's last line break, where it has one.
        let end = scan.run_end(start, Class::Space);
        if let Some(last) = text.as_bytes()[start..end].iter().rposition(|&b| b == b'\r' || b == b'\n') {
            return start + last + 1;
        }
        scan.whitespace_end(start, end)
    }
}

impl<'a> Iterator for WordSplit<'a> {
    type Item = &'a str;

    #[inline]
    fn next(&mut self) -> Option<&'a str> {
        let (text, digits) = (self.text, self.digits);
        Scan::next_piece(text, &mut self.pos, |start| WordSplit::piece_end(text, digits, start))
    }
}

/// Where `text` may be cut into parts that split into the same pieces as the whole under
/// [`WordSplit`]: after a line break that a non-whitespace character follows (every piece
/// that holds a line break ends with it there, and the next starts afresh). The first such cut
/// at or after byte `from`, or `text.len()`.
pub fn next_cut(text: &str, from: usize) -> usize {
    let bytes = text.as_bytes();
    let line_break = |b: &u8| *b == b'\n' || *b == b'\r';
    let mut i = from;
    while let Some(found) = bytes.get(i..).and_then(|rest| rest.iter().position(line_break)) {
        // Just past the run of line breaks (ASCII: a character boundary).
        let end = i + found + bytes[i + found..].iter().take_while(|b| line_break(b)).count();
        if text[end..].chars().next().is_some_and(|c| class_of(c) != Class::Space) {
            return end;
        }
        i = end;
    }
    text.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    extern crate alloc;
    use alloc::vec::Vec;

    fn split(text: &str) -> Vec<&str> {
        WordSplit::llama3(text).collect()
    }

    #[test]
    fn splits_as_llama3s_pattern() {
        assert_eq!(split("I'm here, they'LL see"), ["I", "'m", " here", ",", " they", "'LL", " see"]);
        assert_eq!(split("'S 's ''s 'sun"), ["'S", " '", "s", " ''", "s", " '", "sun"]);
        assert_eq!(split("'sun"), ["'s", "un"]);
        assert_eq!(split("(hello) \"world\""), ["(hello", ")", " \"", "world", "\""]);
        assert_eq!(split("  hello"), [" ", " hello"]);
        assert_eq!(split("\n\nhello"), ["\n\n", "hello"]);
        assert_eq!(split("a \n  b"), ["a", " \n", " ", " b"]);
        assert_eq!(split("x\t\ty"), ["x", "\t", "\ty"]);
        assert_eq!(split("ends   "), ["ends", "   "]);
        assert_eq!(split("12,3456 7"), ["12", ",", "345", "6", " ", "7"]);
        assert_eq!(split("ok!!\n\nnext"), ["ok", "!!\n\n", "next"]);
        assert_eq!(split("café 東京 ½ — 🦀!"), ["café", " 東京", " ", "½", " —", " 🦀!"]);
        assert_eq!(split("a\u{A0}b"), ["a", "\u{A0}b"]);
        assert_eq!(split(""), Vec::<&str>::new());
        assert_eq!(WordSplit::qwen2("2026").collect::<Vec<_>>(), ["2", "0", "2", "6"]);
    }

    #[test]
    fn cuts_do_not_change_the_pieces() {
        let text = "First line.\nSecond  line\n\n  third\r\n\r\nFourth\n \nfifth!\n\n(six) \n7\n";
        let whole = split(text);
        let mut parts = Vec::new();
        let mut start = 0;
        while start < text.len() {
            let end = next_cut(text, start + 1);
            assert!(end == text.len() || matches!(&text[end - 1..end], "\n" | "\r"));
            parts.extend(split(&text[start..end]));
            start = end;
        }
        assert_eq!(parts, whole);
    }
}
