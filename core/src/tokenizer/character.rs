//! The character tokenizer: the vocabulary is the sorted set of characters of a text, and a
//! character's id is its index in that set.

use core::fmt;

/// Why a text could not be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizeError {
    /// A character that is not in the vocabulary.
    UnknownChar {
        /// The character.
        ch: char,
        /// 1-based line.
        line: usize,
        /// 1-based column, in characters.
        column: usize,
        /// Byte offset in the text.
        byte: usize,
    },
    /// The output buffer is shorter than the text.
    BufferTooSmall {
        /// Tokens the buffer can hold.
        capacity: usize,
    },
    /// The tokens of the text do not fit in memory.
    OutOfMemory {
        /// Tokens of the text.
        tokens: usize,
    },
}

impl fmt::Display for TokenizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TokenizeError::UnknownChar { ch, line, column, byte } => {
                write!(f, "character {ch:?} (U+{:04X}) at line {line}, column {column} (byte {byte}) is not in the model's vocabulary", ch as u32)
            }
            TokenizeError::BufferTooSmall { capacity } => write!(f, "the text has more than {capacity} characters"),
            TokenizeError::OutOfMemory { tokens } => write!(f, "the text's {tokens} tokens do not fit in memory"),
        }
    }
}

impl core::error::Error for TokenizeError {}

/// Why a list of characters is not a vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabError {
    /// The list is empty.
    Empty,
    /// The characters are not strictly increasing (sorted, no duplicates) at this index.
    NotSorted(usize),
}

impl fmt::Display for VocabError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            VocabError::Empty => write!(f, "the vocabulary is empty"),
            VocabError::NotSorted(i) => write!(f, "the vocabulary is not sorted and unique at character {i}"),
        }
    }
}

impl core::error::Error for VocabError {}

const NO_ID: u16 = u16::MAX;

/// A character tokenizer over a sorted, unique list of characters held in `C`
/// (`Vec<char>`, `&[char]`, an array...).
#[derive(Clone, Debug, PartialEq)]
pub struct CharTokenizer<C> {
    chars: C,
    ascii: [u16; 128],
}

impl<C: AsRef<[char]>> CharTokenizer<C> {
    /// A tokenizer whose id `i` is `chars[i]`; `chars` must be sorted and unique.
    pub fn new(chars: C) -> Result<Self, VocabError> {
        let list = chars.as_ref();
        if list.is_empty() {
            return Err(VocabError::Empty);
        }
        if let Some(i) = list.windows(2).position(|w| w[0] >= w[1]) {
            return Err(VocabError::NotSorted(i + 1));
        }
        let mut ascii = [NO_ID; 128];
        for (id, &ch) in list.iter().enumerate() {
            if (ch as u32) < 128 && id < NO_ID as usize {
                ascii[ch as usize] = id as u16;
            }
        }
        Ok(CharTokenizer { chars, ascii })
    }

    /// The characters in id order.
    pub fn chars(&self) -> &[char] {
        self.chars.as_ref()
    }

    /// Number of ids.
    pub fn vocab_size(&self) -> usize {
        self.chars.as_ref().len()
    }

    /// The id of `ch`, if it is in the vocabulary.
    pub fn id(&self, ch: char) -> Option<u32> {
        if (ch as u32) < 128 && self.ascii[ch as usize] != NO_ID {
            return Some(self.ascii[ch as usize] as u32);
        }
        self.chars.as_ref().binary_search(&ch).ok().map(|i| i as u32)
    }

    /// The character of `id`.
    pub fn decode(&self, id: u32) -> Option<char> {
        self.chars.as_ref().get(id as usize).copied()
    }

    /// Encodes `text` into `out` and returns the number of tokens written.
    pub fn encode(&self, text: &str, out: &mut [u32]) -> Result<usize, TokenizeError> {
        let (mut line, mut column) = (1, 0);
        let capacity = out.len();
        for (n, (byte, ch)) in text.char_indices().enumerate() {
            column += 1;
            let id = self.id(ch).ok_or(TokenizeError::UnknownChar { ch, line, column, byte })?;
            *out.get_mut(n).ok_or(TokenizeError::BufferTooSmall { capacity })? = id;
            if ch == '\n' {
                line += 1;
                column = 0;
            }
        }
        Ok(text.chars().count())
    }
}

#[cfg(feature = "alloc")]
impl CharTokenizer<alloc::vec::Vec<char>> {
    /// The vocabulary of `text`: its distinct characters, sorted.
    pub fn from_text(text: &str) -> Result<Self, VocabError> {
        let mut seen_ascii = [false; 128];
        let mut other = alloc::collections::BTreeSet::new();
        for ch in text.chars() {
            if (ch as u32) < 128 {
                seen_ascii[ch as usize] = true;
            } else {
                other.insert(ch);
            }
        }
        let mut chars: alloc::vec::Vec<char> = (0u8..128).filter(|&b| seen_ascii[b as usize]).map(char::from).collect();
        chars.extend(other);
        Self::new(chars)
    }

    /// Encodes `text` into a new vector.
    pub fn encode_to_vec(&self, text: &str) -> Result<alloc::vec::Vec<u32>, TokenizeError> {
        let tokens = text.chars().count();
        let mut out = alloc::vec::Vec::new();
        out.try_reserve_exact(tokens).map_err(|_| TokenizeError::OutOfMemory { tokens })?;
        out.resize(tokens, 0);
        self.encode(text, &mut out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_sorts() {
        let tok = CharTokenizer::from_text("hello, wörld\n").unwrap();
        assert_eq!(tok.chars(), &['\n', ' ', ',', 'd', 'e', 'h', 'l', 'o', 'r', 'w', 'ö']);
        let ids = tok.encode_to_vec("wörld").unwrap();
        let back: String = ids.iter().map(|&i| tok.decode(i).unwrap()).collect();
        assert_eq!(back, "wörld");
    }

    #[test]
    fn unknown_character_names_char_and_position() {
        let tok = CharTokenizer::new(['\n', 'a', 'b']).unwrap();
        let mut out = [0u32; 16];
        let err = tok.encode("ab\nbXa", &mut out).unwrap_err();
        assert_eq!(err, TokenizeError::UnknownChar { ch: 'X', line: 2, column: 2, byte: 4 });
        let msg = format!("{err}");
        assert!(msg.contains("'X'") && msg.contains("line 2, column 2"), "{msg}");
    }

    #[test]
    fn rejects_unsorted_vocab_and_small_buffers() {
        assert_eq!(CharTokenizer::new(['b', 'a']).unwrap_err(), VocabError::NotSorted(1));
        let tok = CharTokenizer::new(['a']).unwrap();
        assert_eq!(tok.encode("aaa", &mut [0; 2]).unwrap_err(), TokenizeError::BufferTooSmall { capacity: 2 });
    }
}
