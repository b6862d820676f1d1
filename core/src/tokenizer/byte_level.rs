//! GPT-2's byte-level alphabet: each of the 256 bytes stands as one printable character in
//! vocabulary files (`vocab.json`, `tokenizer.json`), so that a token of raw bytes can be
//! written as a JSON string. Bytes that are printable Latin-1 (`!`..`~`, `¡`..`¬`, `®`..`ÿ`)
//! stand for themselves; the other 68 (control characters, space, DEL, NBSP, soft hyphen) are
//! shifted to U+0100.. in byte order: space is `Ġ`, newline `Ċ`.
//!
//! ```
//! use alpha_core::tokenizer::byte_level::{byte_char, char_byte};
//! assert_eq!((byte_char(b' '), byte_char(b'\n'), byte_char(b'a')), ('Ġ', 'Ċ', 'a'));
//! assert_eq!(char_byte('Ġ'), Some(b' '));
//! assert_eq!(char_byte('€'), None);
//! ```

/// Whether GPT-2 keeps `byte` as its own (Latin-1) character.
const fn stands_for_itself(byte: u8) -> bool {
    matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// `BYTE_CHARS[b]`: the character of byte `b`.
const BYTE_CHARS: [char; 256] = {
    let mut table = ['\0'; 256];
    let mut shifted = 0;
    let mut b = 0;
    while b < 256 {
        table[b] = if stands_for_itself(b as u8) {
            b as u8 as char
        } else {
            shifted += 1;
            match char::from_u32(255 + shifted) {
                Some(c) => c,
                None => panic!("U+0100.. are characters"),
            }
        };
        b += 1;
    }
    table
};

/// The character that stands for `byte` in a byte-level vocabulary.
pub const fn byte_char(byte: u8) -> char {
    BYTE_CHARS[byte as usize]
}

/// The byte a byte-level character stands for, or `None` for a character outside the alphabet.
pub fn char_byte(c: char) -> Option<u8> {
    match c as u32 {
        cp @ 0..=0xFF if stands_for_itself(cp as u8) => Some(cp as u8),
        cp @ 0x100..=0x143 => BYTE_CHARS.iter().position(|&x| x as u32 == cp).map(|b| b as u8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alphabet_is_a_bijection_matching_gpt2() {
        let mut seen = [false; 0x144];
        for b in 0..=255u8 {
            let c = byte_char(b);
            assert!((c as u32) < 0x144 && !seen[c as usize], "byte {b}");
            seen[c as usize] = true;
            assert_eq!(char_byte(c), Some(b));
        }
        // GPT-2's encoder.py: the shifted bytes in order, from U+0100.
        assert_eq!((byte_char(0), byte_char(32), byte_char(127), byte_char(173)), ('Ā', 'Ġ', 'ġ', 'Ń'));
        assert_eq!(char_byte('Ń'), Some(173));
        assert_eq!(char_byte('ń'), None);
    }
}
