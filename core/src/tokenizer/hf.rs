//! Hugging Face's tokenizer files for byte-level BPE: `tokenizer.json` (read and written) and
//! GPT-2's `vocab.json` + `merges.txt` (read). Beyond GPT-2's layout it reads what Llama 3's,
//! Qwen2's and SmolLM2's files hold (see [`super::pipeline`]). What Alpha does not implement
//! (WordPiece, Unigram, other normalizers and pre-tokenizers, BPE dropout) is an error naming
//! the component, never a tokenizer that would give other ids.
//!
//! ```
//! use alpha_core::tokenizer::hf;
//! let vocab = r#"{"a": 0, "b": 1}"#;
//! // Not byte-level: "a" and "b" alone cannot stand for all 256 bytes.
//! let err = hf::from_vocab_merges(vocab, "#version: 0.2\n").err().unwrap();
//! assert!(err.to_string().contains("no token for the byte 0x00"));
//! ```

use super::bpe::{AddedToken, Affixes, Alphabet, Bpe, BpeError, Options};
use super::byte_level::{byte_char, char_byte};
use super::pipeline::{Behavior, CharDecoder, Metaspace, Normalizer, Pattern, Pipeline, PrependScheme, Stage, Template, GPT2_PATTERN};
use super::split::{LLAMA3_PATTERN, QWEN2_PATTERN};
use alloc::borrow::{Cow, ToOwned};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

/// What Alpha reads, for error messages.
const SUPPORTED: &str = "Alpha supports byte-level BPE (a BPE model, a ByteLevel pre-tokenizer last and decoder, as GPT-2's, Llama 3's, Qwen2's and SmolLM2's)";

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

/// A vocabulary object `{"token": id, ...}` as its entries, in the file's order, each token
/// borrowed from the file's text where it has no escapes: a vocabulary costs about what its
/// text does, not a JSON tree of it.
struct Vocab<'a>(Vec<(Cow<'a, str>, u32)>);

impl<'de: 'a, 'a> Deserialize<'de> for Vocab<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = Vocab<'de>;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("an object of token: id")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(self, mut map: M) -> Result<Vocab<'de>, M::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(entry) = map.next_entry::<Text<'de>, u32>()? {
                    entries.push((entry.0 .0, entry.1));
                }
                Ok(Vocab(entries))
            }
        }
        deserializer.deserialize_map(Entries)
    }
}

/// A string borrowed from the file's text where it can be (Cow's own `Deserialize` always
/// copies).
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Str;
        impl<'de> serde::de::Visitor<'de> for Str {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_str(Str)
    }
}

/// One merge: `"a b"` (older files, `merges.txt` lines) or `["a", "b"]`.
#[derive(Deserialize)]
#[serde(untagged)]
enum MergeEntry<'a> {
    Joined(#[serde(borrow)] Cow<'a, str>),
    Pair(#[serde(borrow)] Cow<'a, str>, #[serde(borrow)] Cow<'a, str>),
}

impl MergeEntry<'_> {
    /// The two tokens as written; merge `rank` in errors.
    fn texts(&self, rank: usize) -> Result<(String, String), BpeError> {
        let (left, right) = match self {
            MergeEntry::Joined(s) => s.split_once(' ').ok_or_else(|| BpeError(format!("merge {rank} ({s:?}) is not two tokens")))?,
            MergeEntry::Pair(l, r) => (&**l, &**r),
        };
        Ok((left.into(), right.into()))
    }

    /// The two tokens' bytes; merge `rank` in errors.
    fn pair(&self, rank: usize) -> Result<(Vec<u8>, Vec<u8>), BpeError> {
        let (left, right) = self.texts(rank)?;
        Ok((token_bytes(&left)?, token_bytes(&right)?))
    }
}

/// `added_tokens`, each entry read straight into an [`AddedToken`] (a file may hold millions).
struct AddedList(Vec<AddedToken>);

impl<'de> Deserialize<'de> for AddedList {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = AddedList;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("a list of added tokens")
            }
            fn visit_seq<S: serde::de::SeqAccess<'de>>(self, mut seq: S) -> Result<AddedList, S::Error> {
                let mut added = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(token) = seq.next_element::<AddedEntry<'de>>()? {
                    for (option, set) in [("lstrip", token.lstrip), ("rstrip", token.rstrip), ("single_word", token.single_word)] {
                        if set {
                            return Err(serde::de::Error::custom(error(format_args!("added token {:?} sets {option}", token.content))));
                        }
                    }
                    added.push(AddedToken { content: token.content.into_owned(), id: token.id, special: token.special });
                }
                added.shrink_to_fit();
                Ok(AddedList(added))
            }
        }
        deserializer.deserialize_seq(Entries)
    }
}

/// An entry of `added_tokens`.
#[derive(Deserialize)]
struct AddedEntry<'a> {
    id: u32,
    #[serde(borrow)]
    content: Cow<'a, str>,
    #[serde(default)]
    single_word: bool,
    #[serde(default)]
    lstrip: bool,
    #[serde(default)]
    rstrip: bool,
    #[serde(default)]
    special: bool,
}

/// The parts of a `tokenizer.json` Alpha reads: the model and the added tokens kept as their
/// text until they are read into their own types, the small components as JSON.
#[derive(Deserialize)]
struct TokenizerFile<'a> {
    #[serde(default, borrow)]
    model: Option<&'a RawValue>,
    #[serde(default, borrow)]
    added_tokens: Option<&'a RawValue>,
    #[serde(default)]
    truncation: Value,
    #[serde(default)]
    padding: Value,
    #[serde(default)]
    normalizer: Value,
    #[serde(default)]
    pre_tokenizer: Value,
    #[serde(default)]
    post_processor: Value,
    #[serde(default)]
    decoder: Value,
}

/// A model's fields but its vocabulary and merges (skipped unread), as JSON.
struct ModelHead(Value);

impl<'de> Deserialize<'de> for ModelHead {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = ModelHead;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("a model object")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(self, mut map: M) -> Result<ModelHead, M::Error> {
                let mut head = Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "vocab" || key == "merges" {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    } else {
                        head.insert(key, map.next_value()?);
                    }
                }
                Ok(ModelHead(Value::Object(head)))
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// A BPE model's vocabulary and merges.
#[derive(Deserialize)]
struct BpeModel<'a> {
    #[serde(borrow)]
    vocab: Vocab<'a>,
    #[serde(borrow)]
    merges: Vec<MergeEntry<'a>>,
}

/// A component of `tokenizer.json` read as `T`; errors name `what`.
fn parse<'a, T: Deserialize<'a>>(text: &'a str, what: &str) -> Result<T, BpeError> {
    serde_json::from_str(text).map_err(|e| BpeError(format!("tokenizer.json: {what}: {e}")))
}

/// A tokenizer from the text of a Hugging Face `tokenizer.json`.
pub fn from_tokenizer_json(json: &str) -> Result<Bpe, BpeError> {
    let root: TokenizerFile<'_> = serde_json::from_str(json).map_err(|e| BpeError(format!("tokenizer.json is not valid JSON: {e}")))?;
    let Some(model_text) = root.model else { return Err(error("the file has no model")) };
    let model = parse::<ModelHead>(model_text.get(), "the model")?.0;
    match kind(&model, "model")? {
        Some("BPE") => {}
        Some(other) => return Err(error(format_args!("the model is {other}"))),
        None => return Err(error("the file has no model")),
    }
    if !field(&model, "dropout").is_null() {
        return Err(error("BPE dropout is set (it draws different ids at each encoding)"));
    }
    let affix = |key: &str| field(&model, key).as_str().unwrap_or("").to_owned();
    let (prefix, suffix) = (affix("continuing_subword_prefix"), affix("end_of_word_suffix"));
    // Truncation and padding change the ids of every encoding (and would corrupt a corpus).
    for (key, value, what) in [("truncation", &root.truncation, "cuts encodings to a length"), ("padding", &root.padding, "pads encodings with a token")] {
        if !value.is_null() {
            return Err(BpeError(format!("tokenizer.json sets {key} (it {what}); Alpha gives every text all its ids: set \"{key}\" to null")));
        }
    }
    let normalizers = normalizers(&root.normalizer)?;
    let template = post_processor(&root.post_processor)?;
    let added = match root.added_tokens {
        Some(text) => parse::<AddedList>(text.get(), "added_tokens")?.0,
        None => Vec::new(),
    };
    let BpeModel { vocab, merges } = parse(model_text.get(), "the BPE model")?;
    // SentencePiece style: no pre-tokenizer, or Metaspace; else byte-level (ByteLevel last).
    let metaspace = match kind(&root.pre_tokenizer, "pre-tokenizer")? {
        None => Some(None),
        Some("Metaspace") => Some(Some(metaspace(&root.pre_tokenizer)?)),
        Some(_) => None,
    };
    let tokens = vocabulary(vocab, &added)?;
    let Some(metaspace) = metaspace else {
        if flag(&model, "byte_fallback", false)? {
            return Err(error("byte_fallback is set with a ByteLevel pre-tokenizer"));
        }
        let (stages, byte_level) = pre_tokenizers(&root.pre_tokenizer)?;
        match kind(&root.decoder, "decoder")? {
            Some("ByteLevel") | None => {}
            Some(other) => return Err(error(format_args!("the decoder is {other}"))),
        }
        let options = Options {
            add_prefix_space: flag(byte_level, "add_prefix_space", false)?,
            use_regex: flag(byte_level, "use_regex", true)?,
            ignore_merges: flag(&model, "ignore_merges", false)?,
        };
        let tokens = tokens.into_iter().map(|(t, id)| Ok((token_bytes(&t)?, id))).collect::<Result<Vec<_>, BpeError>>()?;
        let merges = merges.iter().enumerate().map(|(rank, m)| m.pair(rank)).collect::<Result<Vec<_>, _>>()?;
        let affixes = Affixes { prefix: token_bytes(&prefix)?, suffix: token_bytes(&suffix)? };
        let bpe = Bpe::with_affixes(tokens, &merges, added, options, affixes)?;
        if normalizers.is_empty() && stages.is_empty() && template.is_none() {
            return Ok(bpe);
        }
        let json = [root.normalizer, root.pre_tokenizer, root.post_processor, root.decoder];
        return bpe.with_pipeline(Pipeline { normalizers, stages, template, json, ..Pipeline::default() });
    };
    if flag(&model, "ignore_merges", false)? {
        return Err(error("ignore_merges is set without a ByteLevel pre-tokenizer"));
    }
    let decoder = char_decoder(&root.decoder)?;
    let unk = match field(&model, "unk_token").as_str() {
        None => None,
        Some(name) => Some(
            tokens
                .iter()
                .find(|(t, _)| t == name)
                .map(|&(_, id)| id)
                .or_else(|| added.iter().find(|a| a.content == name).map(|a| a.id))
                .ok_or_else(|| BpeError(format!("tokenizer.json: the unknown token {name:?} is not in the vocabulary")))?,
        ),
    };
    let alphabet = Alphabet::Chars { unk, fuse_unk: flag(&model, "fuse_unk", false)?, byte_fallback: flag(&model, "byte_fallback", false)? };
    let tokens: Vec<(String, u32)> = tokens.into_iter().map(|(t, id)| (t.into_owned(), id)).collect();
    let merges = merges.iter().enumerate().map(|(rank, m)| m.texts(rank)).collect::<Result<Vec<_>, _>>()?;
    let affixes = Affixes { prefix: prefix.into_bytes(), suffix: suffix.into_bytes() };
    let bpe = Bpe::with_chars(tokens, &merges, added, alphabet, affixes, &decoder)?;
    let json = [root.normalizer, root.pre_tokenizer, root.post_processor, root.decoder];
    bpe.with_pipeline(Pipeline { normalizers, template, json, metaspace, decoder, ..Pipeline::default() })
}

/// The vocabulary's entries but the added tokens it holds (at the added tokens' ids, as
/// `tokenizers` gives an added token whose text the vocabulary holds the vocabulary's id).
fn vocabulary<'a>(vocab: Vocab<'a>, added: &[AddedToken]) -> Result<Vec<(Cow<'a, str>, u32)>, BpeError> {
    let added_ids: hashbrown::HashMap<&str, u32> = added.iter().map(|a| (a.content.as_str(), a.id)).collect();
    let mut tokens = Vec::with_capacity(vocab.0.len());
    for (token, id) in vocab.0 {
        match added_ids.get(&*token) {
            // An added token may be in the vocabulary too (GPT-2's <|endoftext|>), as its text.
            Some(&added_id) if added_id == id => {}
            Some(&added_id) => {
                return Err(BpeError(format!(
                    "tokenizer.json: added token {token:?} has id {added_id}, but the vocabulary gives its text id {id} (which Hugging Face would use); give both the same id"
                )))
            }
            None => tokens.push((token, id)),
        }
    }
    Ok(tokens)
}

/// A `Metaspace` pre-tokenizer.
fn metaspace(component: &Value) -> Result<Metaspace, BpeError> {
    let replacement = field(component, "replacement").as_str().and_then(|r| {
        let mut chars = r.chars();
        chars.next().filter(|_| chars.next().is_none())
    });
    let replacement = replacement.ok_or_else(|| BpeError("tokenizer.json: the Metaspace pre-tokenizer's replacement is not one character".into()))?;
    // Older files say add_prefix_space where newer ones say prepend_scheme.
    let prepend = match (field(component, "prepend_scheme").as_str(), flag(component, "add_prefix_space", true)?) {
        (Some("always"), _) => PrependScheme::Always,
        (Some("first"), _) => PrependScheme::First,
        (Some("never"), _) => PrependScheme::Never,
        (Some(other), _) => return Err(BpeError(format!("tokenizer.json: the Metaspace pre-tokenizer's prepend_scheme is {other:?}"))),
        (None, true) => PrependScheme::Always,
        (None, false) => PrependScheme::Never,
    };
    Ok(Metaspace { replacement, prepend, split: flag(component, "split", true)? })
}

/// A SentencePiece-style `decoder`: `Replace` (a literal), `ByteFallback`, `Fuse`, `Strip`
/// (of leading spaces), `Metaspace`, or a `Sequence` of them.
fn char_decoder(component: &Value) -> Result<CharDecoder, BpeError> {
    let mut decoder = CharDecoder::default();
    let list: Vec<&Value> = match kind(component, "decoder")? {
        None => Vec::new(),
        Some("Sequence") => {
            field(component, "decoders").as_array().ok_or_else(|| BpeError("tokenizer.json: a Sequence decoder has no decoders list".into()))?.iter().collect()
        }
        Some(_) => alloc::vec![component],
    };
    for d in list {
        match kind(d, "decoder")? {
            Some("Replace") => {
                let (pattern, content) = (field(field(d, "pattern"), "String").as_str(), field(d, "content").as_str());
                let (Some(pattern), Some(content)) = (pattern, content) else { return Err(error("a Replace decoder's pattern is not a string")) };
                decoder.replace = Some((pattern.into(), content.into()));
            }
            Some("ByteFallback") => decoder.byte_fallback = true,
            Some("Fuse") => {}
            Some("Strip") if field(d, "content").as_str() == Some(" ") && field(d, "stop").as_u64() == Some(0) => {
                decoder.strip_start = field(d, "start").as_u64().unwrap_or(0) as usize;
            }
            Some("Metaspace") => {
                let m = metaspace(d)?;
                decoder.replace = Some((m.replacement.into(), " ".into()));
                decoder.strip_start = usize::from(m.prepend != PrependScheme::Never);
            }
            Some(other) => return Err(error(format_args!("the decoder is {other}"))),
            None => {}
        }
    }
    Ok(decoder)
}

/// The normalizers of a `normalizer` component: none, `NFC`, or a `Sequence` of them.
fn normalizers(component: &Value) -> Result<Vec<Normalizer>, BpeError> {
    match kind(component, "normalizer")? {
        None => Ok(Vec::new()),
        Some("NFC") => Ok(alloc::vec![Normalizer::Nfc]),
        Some("Prepend") => match field(component, "prepend").as_str() {
            Some(p) => Ok(alloc::vec![Normalizer::Prepend(p.into())]),
            None => Err(BpeError("tokenizer.json: a Prepend normalizer has no prepend string".into())),
        },
        Some("Replace") => match (field(field(component, "pattern"), "String").as_str(), field(component, "content").as_str()) {
            (Some(pattern), Some(content)) => Ok(alloc::vec![Normalizer::Replace { pattern: pattern.into(), content: content.into() }]),
            _ => Err(error("a Replace normalizer's pattern is not a string")),
        },
        Some("Sequence") => {
            let list =
                field(component, "normalizers").as_array().ok_or_else(|| BpeError("tokenizer.json: a Sequence normalizer has no normalizers list".into()))?;
            list.iter().map(normalizers).collect::<Result<Vec<_>, _>>().map(|v| v.concat())
        }
        Some(other) => Err(error(format_args!("the file has a {other} normalizer"))),
    }
}

/// The stages before the `ByteLevel` pre-tokenizer, and that one (last, alone or in a
/// `Sequence`).
fn pre_tokenizers(component: &Value) -> Result<(Vec<Stage>, &Value), BpeError> {
    let list: Vec<&Value> = match kind(component, "pre-tokenizer")? {
        None => return Err(error("the file has no pre-tokenizer")),
        Some("Sequence") => field(component, "pretokenizers")
            .as_array()
            .ok_or_else(|| BpeError("tokenizer.json: a Sequence pre-tokenizer has no pretokenizers list".into()))?
            .iter()
            .collect(),
        Some(_) => alloc::vec![component],
    };
    let Some((last, before)) = list.split_last() else { return Err(error("the pre-tokenizer is an empty Sequence")) };
    if kind(last, "pre-tokenizer")? != Some("ByteLevel") {
        return Err(error(format_args!("the last pre-tokenizer is {}", kind(last, "pre-tokenizer")?.unwrap_or("null"))));
    }
    let stages = before.iter().map(|c| stage(c)).collect::<Result<Vec<_>, _>>()?;
    Ok((stages, last))
}

/// A pre-tokenizer before the `ByteLevel` one: `Split` or `Digits`.
fn stage(component: &Value) -> Result<Stage, BpeError> {
    match kind(component, "pre-tokenizer")? {
        Some("Digits") => Ok(Stage::Digits { individual: flag(component, "individual_digits", false)? }),
        Some("Split") => {
            let pattern = field(component, "pattern");
            let pattern = match (field(pattern, "Regex").as_str(), field(pattern, "String").as_str()) {
                (Some(LLAMA3_PATTERN), _) => Pattern::Llama3,
                (Some(QWEN2_PATTERN), _) => Pattern::Qwen2,
                (Some(GPT2_PATTERN), _) => Pattern::Gpt2,
                #[cfg(feature = "regex")]
                (Some(regex), _) => Pattern::Regex(
                    super::pipeline::RegexPattern::new(regex)
                        .map_err(|e| BpeError(format!("tokenizer.json: the Split pre-tokenizer's pattern {regex:?}: {e}")))?,
                ),
                #[cfg(not(feature = "regex"))]
                (Some(regex), _) => {
                    return Err(error(format_args!(
                        "the Split pre-tokenizer's pattern {regex:?} is none Alpha knows (Llama 3's, Qwen2's, GPT-2's; others with alpha-core's regex feature)"
                    )))
                }
                (None, Some(literal)) => Pattern::Literal(literal.into()),
                (None, None) => return Err(BpeError("tokenizer.json: a Split pre-tokenizer has no pattern".into())),
            };
            let behavior = match field(component, "behavior").as_str() {
                Some("Removed") => Behavior::Removed,
                Some("Isolated") => Behavior::Isolated,
                Some("MergedWithPrevious") => Behavior::MergedWithPrevious,
                Some("MergedWithNext") => Behavior::MergedWithNext,
                Some("Contiguous") => Behavior::Contiguous,
                other => return Err(BpeError(format!("tokenizer.json: a Split pre-tokenizer's behavior is {other:?}"))),
            };
            Ok(Stage::Split { pattern, behavior, invert: flag(component, "invert", false)? })
        }
        Some("ByteLevel") => Err(error("a ByteLevel pre-tokenizer comes before others")),
        Some(other) => Err(error(format_args!("the pre-tokenizer is {other}"))),
        None => Err(error("a pre-tokenizer is null")),
    }
}

/// The special tokens a post-processor puts around one text: `ByteLevel` (none: it only trims
/// offsets), `TemplateProcessing` (its `single` template), or a `Sequence` of them.
fn post_processor(component: &Value) -> Result<Option<Template>, BpeError> {
    match kind(component, "post-processor")? {
        None | Some("ByteLevel") => Ok(None),
        Some("TemplateProcessing") => template(component).map(|t| Some(t).filter(|t| !(t.prefix.is_empty() && t.suffix.is_empty()))),
        Some("Sequence") => {
            let list =
                field(component, "processors").as_array().ok_or_else(|| BpeError("tokenizer.json: a Sequence post-processor has no processors list".into()))?;
            let mut found = None;
            for p in list {
                if let Some(t) = post_processor(p)? {
                    if found.replace(t).is_some() {
                        return Err(error("the post-processor adds special tokens twice"));
                    }
                }
            }
            Ok(found)
        }
        Some(other) => Err(error(format_args!("the post-processor is {other} (it adds tokens)"))),
    }
}

/// A `TemplateProcessing`'s ids before and after the text (`$A`) in its `single` template.
fn template(component: &Value) -> Result<Template, BpeError> {
    let bad = |what: &str| BpeError(format!("tokenizer.json: the TemplateProcessing post-processor's {what}"));
    let single = field(component, "single").as_array().ok_or_else(|| bad("single template is not a list"))?;
    let (mut prefix, mut suffix, mut seen_text) = (Vec::new(), Vec::new(), false);
    for item in single {
        if let Some(sequence) = item.get("Sequence") {
            if field(sequence, "id").as_str() != Some("A") || seen_text {
                return Err(bad("single template names a sequence other than one A"));
            }
            seen_text = true;
        } else if let Some(special) = item.get("SpecialToken") {
            let name = field(special, "id").as_str().ok_or_else(|| bad("single template has a special token without an id"))?;
            let ids = field(field(field(component, "special_tokens"), name), "ids")
                .as_array()
                .ok_or_else(|| bad(&format!("special_tokens lack {name:?}")))?
                .iter()
                .map(|id| id.as_u64().and_then(|i| u32::try_from(i).ok()).ok_or_else(|| bad(&format!("ids of {name:?} are not token ids"))))
                .collect::<Result<Vec<u32>, _>>()?;
            (if seen_text { &mut suffix } else { &mut prefix }).extend(ids);
        } else {
            return Err(bad("single template has an item that is neither Sequence nor SpecialToken"));
        }
    }
    if !seen_text {
        return Err(bad("single template has no $A"));
    }
    Ok(Template { prefix, suffix })
}

/// A tokenizer from GPT-2's `vocab.json` and `merges.txt` (as OpenAI and Hugging Face's
/// `GPT2Tokenizer` ship them). Vocabulary entries written `<|...|>` are added special tokens.
pub fn from_vocab_merges(vocab_json: &str, merges_txt: &str) -> Result<Bpe, BpeError> {
    let vocab: Vocab<'_> = serde_json::from_str(vocab_json).map_err(|e| BpeError(format!("vocab.json is not an object of token: id ({e})")))?;
    let mut tokens = Vec::new();
    let mut added = Vec::new();
    for (token, id) in vocab.0 {
        if token.len() > 4 && token.starts_with("<|") && token.ends_with("|>") {
            added.push(AddedToken { content: token.into_owned(), id, special: true });
        } else {
            tokens.push((token_bytes(&token)?, id));
        }
    }
    added.sort_by_key(|a| a.id);
    let merges = merges_txt
        .lines()
        .filter(|line| !line.starts_with("#version") && !line.trim().is_empty())
        .enumerate()
        .map(|(rank, line)| MergeEntry::Joined(Cow::Borrowed(line.trim_end_matches('\r'))).pair(rank))
        .collect::<Result<Vec<_>, _>>()?;
    Bpe::new(tokens, &merges, added, Options::default())
}

/// `bpe` as a Hugging Face `tokenizer.json` (GPT-2's layout), which `tokenizers` loads and
/// encodes with the same ids. Added tokens are in the vocabulary too, as their text (as GPT-2's
/// `<|endoftext|>`): `tokenizers` keeps the vocabulary's id for an added token it finds there.
pub fn to_tokenizer_json(bpe: &Bpe) -> String {
    let text = |id: u32| bpe.token_text(id).expect("merges name tokens");
    let token = |id: u32| match bpe.alphabet() {
        Alphabet::Bytes => token_string(text(id)),
        Alphabet::Chars { .. } => String::from_utf8_lossy(text(id)).into_owned(),
    };
    let affix = |bytes: &[u8]| match (bytes.is_empty(), bpe.alphabet()) {
        (true, _) => Value::Null,
        (false, Alphabet::Bytes) => Value::String(token_string(bytes)),
        (false, Alphabet::Chars { .. }) => Value::String(String::from_utf8_lossy(bytes).into_owned()),
    };
    let (prefix, suffix) = (affix(&bpe.affixes().prefix), affix(&bpe.affixes().suffix));
    let (unk, fuse_unk, byte_fallback) = match bpe.alphabet() {
        Alphabet::Bytes => (None, false, false),
        Alphabet::Chars { unk, fuse_unk, byte_fallback } => (unk.map(token), fuse_unk, byte_fallback),
    };
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
    // A pipeline's components as the file it came from wrote them; else GPT-2's.
    let [normalizer, pre_tokenizer, post_processor, decoder] = match bpe.pipeline() {
        Some(p) => p.json.clone(),
        None => [Value::Null, byte_level(true), byte_level(false), byte_level(true)],
    };
    let root = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": decoder,
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": unk,
            "continuing_subword_prefix": prefix,
            "end_of_word_suffix": suffix,
            "fuse_unk": fuse_unk,
            "byte_fallback": byte_fallback,
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
        let lowercase = r#"{"model": {"type": "BPE", "vocab": {}, "merges": []}, "normalizer": {"type": "Lowercase"}, "pre_tokenizer": {"type": "ByteLevel"}}"#;
        assert!(from_tokenizer_json(lowercase).err().unwrap().to_string().contains("Lowercase normalizer"));
        let whitespace = r#"{"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": {"type": "WhitespaceSplit"}}"#;
        assert!(from_tokenizer_json(whitespace).err().unwrap().to_string().contains("last pre-tokenizer is WhitespaceSplit"));
        let regex = r#"{"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "([0-9]"}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel"}]}}"#;
        let e = from_tokenizer_json(regex).err().unwrap().to_string();
        // Unknown without the regex feature, not a regular expression with it.
        assert!(e.contains("Split pre-tokenizer's pattern \"([0-9]\""), "{e}");
        assert!(from_tokenizer_json("{").err().unwrap().to_string().contains("not valid JSON"));
    }
}
