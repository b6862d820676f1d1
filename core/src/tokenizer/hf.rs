//! Hugging Face's tokenizer files for byte-level BPE: `tokenizer.json` (read and written) and
//! GPT-2's `vocab.json` + `merges.txt` (read). What Alpha does not implement (WordPiece,
//! Unigram, normalizers, other pre-tokenizers, BPE dropout) is an error naming what is
//! supported, never a tokenizer that would give other ids.
//!
//! ```
//! use alpha_core::tokenizer::hf;
//! let vocab = r#"{"a": 0, "b": 1}"#;
//! // Not byte-level: "a" and "b" alone cannot stand for all 256 bytes.
//! let err = hf::from_vocab_merges(vocab, "#version: 0.2\n").err().unwrap();
//! assert!(err.to_string().contains("no token for the byte 0x00"));
//! ```

use super::bpe::{AddedToken, Bpe, BpeError, Options};
use super::byte_level::{byte_char, char_byte};
use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use serde_json::{json, Map, Value};

/// What Alpha reads, for error messages.
const SUPPORTED: &str = "Alpha supports byte-level BPE (GPT-2 style: a BPE model with the ByteLevel pre-tokenizer and decoder)";

fn error(what: impl core::fmt::Display) -> BpeError {
    BpeError(format!("{what}; {SUPPORTED}"))
}

/// The bytes a byte-level token string stands for.
fn token_bytes(token: &str) -> Result<Vec<u8>, BpeError> {
    token.chars().map(|c| char_byte(c).ok_or_else(|| error(format_args!("the token {token:?} is not in GPT-2's byte-level alphabet")))).collect()
}

/// A token's bytes as a byte-level string.
fn token_string(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_char(b)).collect()
}

/// A field of a JSON object, or null.
fn field<'a>(object: &'a Value, key: &str) -> &'a Value {
    object.get(key).unwrap_or(&Value::Null)
}

/// A boolean field: `default` where absent or null.
fn flag(object: &Value, key: &str, default: bool) -> Result<bool, BpeError> {
    match field(object, key) {
        Value::Null => Ok(default),
        Value::Bool(b) => Ok(*b),
        other => Err(BpeError(format!("tokenizer.json: {key} must be true or false, not {other}"))),
    }
}

/// The `type` of a component (`"BPE"`, `"ByteLevel"`), or `None` for null.
fn kind<'a>(component: &'a Value, name: &str) -> Result<Option<&'a str>, BpeError> {
    match component {
        Value::Null => Ok(None),
        Value::Object(o) => o.get("type").and_then(Value::as_str).map(Some).ok_or_else(|| BpeError(format!("tokenizer.json: the {name} has no type"))),
        _ => Err(BpeError(format!("tokenizer.json: the {name} is not an object"))),
    }
}

/// A vocabulary object `{"token": id, ...}` as bytes and ids.
fn vocab_entries(vocab: &Value, file: &str) -> Result<Vec<(String, u32)>, BpeError> {
    let vocab = vocab.as_object().ok_or_else(|| BpeError(format!("{file}: the vocabulary is not an object of token: id")))?;
    vocab
        .iter()
        .map(|(token, id)| {
            let id = id.as_u64().and_then(|id| u32::try_from(id).ok()).ok_or_else(|| BpeError(format!("{file}: token {token:?} has no valid id")))?;
            Ok((token.clone(), id))
        })
        .collect()
}

/// One merge: `"a b"` (older files, `merges.txt` lines) or `["a", "b"]`.
fn merge_pair(merge: &Value, rank: usize) -> Result<(Vec<u8>, Vec<u8>), BpeError> {
    let (left, right) = match merge {
        Value::String(s) => s.split_once(' ').ok_or_else(|| BpeError(format!("merge {rank} ({s:?}) is not two tokens")))?,
        Value::Array(pair) => match &pair[..] {
            [Value::String(l), Value::String(r)] => (l.as_str(), r.as_str()),
            _ => return Err(BpeError(format!("merge {rank} is not a pair of tokens"))),
        },
        _ => return Err(BpeError(format!("merge {rank} is not a pair of tokens"))),
    };
    Ok((token_bytes(left)?, token_bytes(right)?))
}

/// A tokenizer from the text of a Hugging Face `tokenizer.json`.
pub fn from_tokenizer_json(json: &str) -> Result<Bpe, BpeError> {
    let root: Value = serde_json::from_str(json).map_err(|e| BpeError(format!("tokenizer.json is not valid JSON: {e}")))?;
    let model = field(&root, "model");
    match kind(model, "model")? {
        Some("BPE") => {}
        Some(other) => return Err(error(format_args!("the model is {other}"))),
        None => return Err(error("the file has no model")),
    }
    if !field(model, "dropout").is_null() {
        return Err(error("BPE dropout is set (it draws different ids at each encoding)"));
    }
    if flag(model, "byte_fallback", false)? {
        return Err(error("byte_fallback is set (SentencePiece-style BPE)"));
    }
    for affix in ["continuing_subword_prefix", "end_of_word_suffix"] {
        if field(model, affix).as_str().is_some_and(|s| !s.is_empty()) {
            return Err(error(format_args!("{affix} is set")));
        }
    }
    if let Some(normalizer) = kind(field(&root, "normalizer"), "normalizer")? {
        return Err(error(format_args!("the file has a {normalizer} normalizer")));
    }
    let pre = field(&root, "pre_tokenizer");
    match kind(pre, "pre-tokenizer")? {
        Some("ByteLevel") => {}
        Some(other) => return Err(error(format_args!("the pre-tokenizer is {other}"))),
        None => return Err(error("the file has no pre-tokenizer")),
    }
    match kind(field(&root, "decoder"), "decoder")? {
        Some("ByteLevel") | None => {}
        Some(other) => return Err(error(format_args!("the decoder is {other}"))),
    }
    // GPT-2's post-processor (ByteLevel) only trims offsets; one that adds tokens would change ids.
    match kind(field(&root, "post_processor"), "post-processor")? {
        Some("ByteLevel") | None => {}
        Some(other) => return Err(error(format_args!("the post-processor is {other} (it adds tokens)"))),
    }
    let options = Options {
        add_prefix_space: flag(pre, "add_prefix_space", false)?,
        use_regex: flag(pre, "use_regex", true)?,
        ignore_merges: flag(model, "ignore_merges", false)?,
    };
    let mut added = Vec::new();
    for token in field(&root, "added_tokens").as_array().map_or(&[][..], |a| &a[..]) {
        let content = field(token, "content").as_str().ok_or_else(|| BpeError("tokenizer.json: an added token has no content".into()))?;
        let id = field(token, "id").as_u64().and_then(|id| u32::try_from(id).ok());
        let id = id.ok_or_else(|| BpeError(format!("tokenizer.json: added token {content:?} has no valid id")))?;
        for option in ["lstrip", "rstrip", "single_word"] {
            if flag(token, option, false)? {
                return Err(error(format_args!("added token {content:?} sets {option}")));
            }
        }
        added.push(AddedToken { content: content.to_owned(), id, special: flag(token, "special", false)? });
    }
    let mut vocab = Vec::new();
    for (token, id) in vocab_entries(field(model, "vocab"), "tokenizer.json")? {
        // An added token may be in the vocabulary too (GPT-2's <|endoftext|>), as its text.
        if !added.iter().any(|a| a.content == token && a.id == id) {
            vocab.push((token_bytes(&token)?, id));
        }
    }
    let merges = field(model, "merges").as_array().ok_or_else(|| BpeError("tokenizer.json: the model has no merges".into()))?;
    let merges = merges.iter().enumerate().map(|(rank, m)| merge_pair(m, rank)).collect::<Result<Vec<_>, _>>()?;
    Bpe::new(vocab, &merges, added, options)
}

/// A tokenizer from GPT-2's `vocab.json` and `merges.txt` (as OpenAI and Hugging Face's
/// `GPT2Tokenizer` ship them). Vocabulary entries written `<|...|>` are added special tokens.
pub fn from_vocab_merges(vocab_json: &str, merges_txt: &str) -> Result<Bpe, BpeError> {
    let vocab: Value = serde_json::from_str(vocab_json).map_err(|e| BpeError(format!("vocab.json is not valid JSON: {e}")))?;
    let mut tokens = Vec::new();
    let mut added = Vec::new();
    for (token, id) in vocab_entries(&vocab, "vocab.json")? {
        if token.len() > 4 && token.starts_with("<|") && token.ends_with("|>") {
            added.push(AddedToken { content: token, id, special: true });
        } else {
            tokens.push((token_bytes(&token)?, id));
        }
    }
    added.sort_by_key(|a| a.id);
    let merges = merges_txt
        .lines()
        .filter(|line| !line.starts_with("#version") && !line.trim().is_empty())
        .enumerate()
        .map(|(rank, line)| merge_pair(&Value::String(line.trim_end_matches('\r').to_string()), rank))
        .collect::<Result<Vec<_>, _>>()?;
    Bpe::new(tokens, &merges, added, Options::default())
}

/// `bpe` as a Hugging Face `tokenizer.json` (GPT-2's layout), which `tokenizers` loads and
/// encodes with the same ids. Added tokens are in the vocabulary too, as their text (as GPT-2's
/// `<|endoftext|>`): `tokenizers` keeps the vocabulary's id for an added token it finds there.
pub fn to_tokenizer_json(bpe: &Bpe) -> String {
    let token = |id: u32| token_string(bpe.token_bytes(id).expect("merges name tokens"));
    let mut vocab = Map::new();
    for id in 0..bpe.vocab_size() as u32 {
        let key = bpe.added_tokens().iter().find(|a| a.id == id).map_or_else(|| token(id), |a| a.content.clone());
        vocab.insert(key, json!(id));
    }
    let merges: Vec<Value> = bpe.merges().iter().map(|&(l, r)| json!([token(l), token(r)])).collect();
    let added: Vec<Value> = bpe
        .added_tokens()
        .iter()
        .map(|a| json!({"id": a.id, "content": a.content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": a.special}))
        .collect();
    let o = bpe.options();
    let byte_level =
        |trim_offsets: bool| json!({"type": "ByteLevel", "add_prefix_space": o.add_prefix_space, "trim_offsets": trim_offsets, "use_regex": o.use_regex});
    let root = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": byte_level(true),
        "post_processor": byte_level(false),
        "decoder": byte_level(true),
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": o.ignore_merges,
            "vocab": vocab,
            "merges": merges,
        },
    });
    let mut text = serde_json::to_string_pretty(&root).expect("a JSON value serializes");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_what_it_reads() {
        let mut vocab: Vec<(Vec<u8>, u32)> = (0..=255u8).map(|b| (alloc::vec![b], b as u32)).collect();
        vocab.push((b" t".to_vec(), 256));
        vocab.push((b" th".to_vec(), 257));
        let merges = [(b" ".to_vec(), b"t".to_vec()), (b" t".to_vec(), b"h".to_vec())];
        let added = alloc::vec![AddedToken { content: "<|endoftext|>".into(), id: 258, special: true }];
        let bpe = Bpe::new(vocab, &merges, added, Options::default()).unwrap();
        let again = from_tokenizer_json(&to_tokenizer_json(&bpe)).unwrap();
        let text = "the\n<|endoftext|> thin";
        assert_eq!(again.encode_to_vec(text), bpe.encode_to_vec(text));
        assert_eq!(again.merges(), bpe.merges());
        assert_eq!(again.added_tokens(), bpe.added_tokens());
        assert_eq!(bpe.encode_to_vec(" th"), [257]);
    }

    #[test]
    fn other_models_are_named_errors() {
        let wordpiece = r#"{"model": {"type": "WordPiece", "vocab": {}}, "pre_tokenizer": null}"#;
        let e = from_tokenizer_json(wordpiece).err().unwrap().to_string();
        assert!(e.contains("WordPiece") && e.contains("byte-level BPE"), "{e}");
        let nfc = r#"{"model": {"type": "BPE", "vocab": {}, "merges": []}, "normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "ByteLevel"}}"#;
        assert!(from_tokenizer_json(nfc).err().unwrap().to_string().contains("NFC normalizer"));
        assert!(from_tokenizer_json("{").err().unwrap().to_string().contains("not valid JSON"));
    }
}
