//! Hugging Face models from bytes and to bytes: `GPT2LMHeadModel`, `LlamaForCausalLM` and
//! `Qwen2ForCausalLM`. In: `config.json`'s text ([`config_from_json`]) and the weights'
//! safetensors ([`params_from_safetensors`], one file or shards), read as Alpha's model and
//! parameters; every setting and tensor checked, so that what Alpha cannot reproduce exactly is
//! an error naming it, never a silently different model. Out ([`model_files`]): the files of a
//! directory `transformers` loads as the same class. No file system: the caller reads and
//! writes the files (alpha-native maps them; a page gets them from a drop).
//!
//! GPT-2's weights keep their names (with or without the `transformer.` prefix); `transformers`'
//! Conv1D stores `[in, out]`, so the four projection matrices are transposed into Alpha's
//! `nn.Linear` layout; the head is tied. The Llama family's q, k and v projections (and their
//! biases) are Alpha's fused q/k/v rows in that order, gate and up its fused gate/up rows; the
//! head is tied or not as config.json says. F32, F16 and BF16 are read.
//!
//! ```
//! let json = r#"{"model_type": "llama", "vocab_size": 320, "hidden_size": 32, "intermediate_size": 48,
//!     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
//!     "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": true}"#;
//! let config = alpha_core::hf::config_from_json(json).unwrap();
//! assert_eq!((config.kv_heads(), config.hidden()), (2, 48));
//! // Biases on all four projections are not a model Alpha has: refused, naming the field.
//! let err = alpha_core::hf::config_from_json(&json.replace("}", r#", "attention_bias": true}"#)).unwrap_err();
//! assert!(err.to_string().starts_with("attention_bias is true"));
//! ```

use crate::checkpoint::Checkpoint;
use crate::plan::{ParamInfo, ParamKind, Plan};
use crate::tokenizer::{CharTokenizer, Tokenizer};
use crate::{Arch, GptConfig, Llama, RopeScaling};
use alloc::collections::BTreeSet;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde_json::Value;

/// Why Hugging Face files could not be read as an Alpha model: one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HfError {
    /// config.json is not JSON.
    Json(String),
    /// config.json describes a model Alpha does not run exactly (the field named).
    Config(String),
    /// The weights do not match the config (a tensor missing, extra, misshapen, not finite).
    Weights(String),
    /// A weights file is not safetensors.
    Safetensors(String),
    /// The tokenizer's files do not describe a tokenizer Alpha runs exactly.
    Tokenizer(String),
    /// The error is in this file of the directory ([`from_files`]).
    InFile(String, alloc::boxed::Box<HfError>),
}

impl fmt::Display for HfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HfError::Json(e) => write!(f, "is not valid JSON: {e}"),
            HfError::Safetensors(e) => write!(f, "is not a valid safetensors file: {e}"),
            HfError::Config(e) | HfError::Weights(e) | HfError::Tokenizer(e) => f.write_str(e),
            HfError::InFile(file, e) if matches!(**e, HfError::Json(_) | HfError::Safetensors(_)) => write!(f, "{file} {e}"),
            HfError::InFile(file, e) => write!(f, "{file}: {e}"),
        }
    }
}

impl core::error::Error for HfError {}

/// `config.json`'s text as Alpha's model; what Alpha does not compute exactly is an error
/// naming the field.
pub fn config_from_json(text: &str) -> Result<GptConfig, HfError> {
    let c: Value = serde_json::from_str(text).map_err(|e| HfError::Json(e.to_string()))?;
    match c.get("model_type").and_then(Value::as_str).unwrap_or("gpt2") {
        "gpt2" => gpt2_config(&c),
        kind @ ("llama" | "qwen2") => llama_config(&c, kind),
        kind => Err(HfError::Config(format!("model_type is {kind:?}; Alpha runs gpt2, llama and qwen2 models"))),
    }
}

/// A positive size field of `c`.
fn size_field(c: &Value, key: &str) -> Option<usize> {
    c.get(key).and_then(Value::as_u64).and_then(|v| usize::try_from(v).ok()).filter(|&v| v > 0)
}

/// GPT-2's `config.json`.
fn gpt2_config(c: &Value) -> Result<GptConfig, HfError> {
    let bad = |what: String| HfError::Config(format!("{what}; Alpha runs GPT-2 (model_type gpt2, gelu_new, LayerNorm eps 1e-5, tied head)"));
    let size = |key: &str| size_field(c, key).ok_or_else(|| bad(format!("{key} is missing or not a size")));
    match c.get("activation_function").and_then(Value::as_str).unwrap_or("gelu_new") {
        "gelu_new" | "gelu_pytorch_tanh" => {}
        other => return Err(bad(format!("activation_function is {other:?}"))),
    }
    let eps = c.get("layer_norm_epsilon").and_then(Value::as_f64).unwrap_or(1e-5);
    if eps != 1e-5 {
        return Err(bad(format!("layer_norm_epsilon is {eps}")));
    }
    let flag = |key: &str, default: bool| c.get(key).and_then(Value::as_bool).unwrap_or(default);
    for (key, want) in [("scale_attn_weights", true), ("scale_attn_by_inverse_layer_idx", false), ("add_cross_attention", false), ("tie_word_embeddings", true)]
    {
        if flag(key, want) != want {
            return Err(bad(format!("{key} is {}", !want)));
        }
    }
    let n_embd = size("n_embd")?;
    if let Some(inner) = c.get("n_inner").and_then(Value::as_u64).filter(|&i| i as usize != 4 * n_embd) {
        return Err(bad(format!("n_inner is {inner}, not 4 x n_embd")));
    }
    let config = GptConfig::gpt2(size("vocab_size")?, size("n_positions")?, size("n_layer")?, size("n_head")?, n_embd);
    config.validate().map_err(|e| bad(e.to_string()))?;
    Ok(config)
}

/// `LlamaConfig`'s or `Qwen2Config`'s `config.json` (`kind`): the fields Alpha's Llama
/// family has, each checked; any other setting that changes the model is an error.
fn llama_config(c: &Value, kind: &str) -> Result<GptConfig, HfError> {
    let bad = |what: String| HfError::Config(format!("{what}; Alpha cannot run this {kind} model exactly"));
    let size = |key: &str| size_field(c, key).ok_or_else(|| bad(format!("{key} is missing or not a size")));
    let number = |key: &str, default: f64| match c.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_f64().ok_or_else(|| bad(format!("{key} is not a number"))),
    };
    let flag = |key: &str, default: bool| c.get(key).and_then(Value::as_bool).unwrap_or(default);
    let (n_embd, n_head) = (size("hidden_size")?, size("num_attention_heads")?);
    let n_kv_head = if c.get("num_key_value_heads").is_none_or(Value::is_null) { n_head } else { size("num_key_value_heads")? };
    if let Some(head_dim) = c.get("head_dim").filter(|v| !v.is_null()) {
        if head_dim.as_u64() != Some((n_embd / n_head) as u64) {
            return Err(bad(format!("head_dim is {head_dim}, not hidden_size / num_attention_heads ({})", n_embd / n_head)));
        }
    }
    match c.get("hidden_act").and_then(Value::as_str).unwrap_or("silu") {
        "silu" => {}
        other => return Err(bad(format!("hidden_act is {other:?}, not silu"))),
    }
    if c.get("pretraining_tp").and_then(Value::as_u64).is_some_and(|tp| tp != 1) {
        return Err(bad("pretraining_tp is not 1".into()));
    }
    // Llama's attention_bias puts biases on all four projections, Alpha's on q, k and v only
    // (Qwen2's, which config.json does not name).
    let qkv_bias = kind == "qwen2";
    for key in ["attention_bias", "mlp_bias", "use_sliding_window"] {
        if flag(key, false) {
            return Err(bad(format!("{key} is true")));
        }
    }
    if let Some(kind) = c.get("layer_types").and_then(Value::as_array).and_then(|t| t.iter().find(|t| t.as_str() != Some("full_attention"))) {
        return Err(bad(format!("layer_types holds {kind}; Alpha's attention is full_attention in every layer")));
    }
    // transformers 5 keeps the rotary settings in rope_parameters; earlier versions at the top.
    let rope = c.get("rope_parameters").filter(|v| v.is_object()).or_else(|| c.get("rope_scaling").filter(|v| v.is_object()));
    let rope_type = rope.and_then(|r| r.get("rope_type").or_else(|| r.get("type"))).and_then(Value::as_str).unwrap_or("default");
    let rope_theta = match rope.and_then(|r| r.get("rope_theta")) {
        Some(t) => t.as_f64().ok_or_else(|| bad("rope_parameters.rope_theta is not a number".into()))?,
        None => number("rope_theta", 10000.0)?,
    };
    let rope_scaling = match rope_type {
        "default" => None,
        "llama3" => {
            let r = rope.expect("a rope type comes from an object");
            let field = |key: &str| r.get(key).and_then(Value::as_f64).ok_or_else(|| bad(format!("rope_scaling.{key} is missing or not a number")));
            let original =
                size_field(r, "original_max_position_embeddings").ok_or_else(|| bad("rope_scaling.original_max_position_embeddings is missing".into()))?;
            Some(RopeScaling {
                factor: field("factor")?,
                low_freq_factor: field("low_freq_factor")?,
                high_freq_factor: field("high_freq_factor")?,
                original_max_position_embeddings: original,
            })
        }
        other => return Err(bad(format!("rope_scaling's type is {other:?}; Alpha has none and llama3"))),
    };
    let llama = Llama {
        n_kv_head,
        intermediate_size: size("intermediate_size")?,
        norm_eps: number("rms_norm_eps", 1e-6)?,
        rope_theta,
        rope_scaling,
        qkv_bias,
        tied: flag("tie_word_embeddings", false),
    };
    let config = GptConfig {
        arch: Arch::Llama(llama),
        ..GptConfig::gpt2(size("vocab_size")?, size("max_position_embeddings")?, size("num_hidden_layers")?, n_head, n_embd)
    };
    config.validate().map_err(|e| bad(e.to_string()))?;
    Ok(config)
}

/// The Hugging Face tensors that make up Alpha's tensor `info` of a Llama-family model, each
/// as (name, rows of Alpha's tensor it holds, in order): the fused q/k/v and gate/up
/// projections are several, every other tensor one under its own name.
fn hf_parts(info: &ParamInfo, config: &GptConfig) -> Vec<(String, usize)> {
    let name = info.to_string();
    let (hs, kv) = (config.head_size(), config.kv_heads());
    let split = |fused: &str, parts: &[(&str, usize)]| parts.iter().map(|&(p, rows)| (name.replace(fused, p), rows)).collect();
    match info.kind {
        ParamKind::QkvProj | ParamKind::QkvProjBias => split("qkv_proj", &[("q_proj", config.n_head * hs), ("k_proj", kv * hs), ("v_proj", kv * hs)]),
        ParamKind::GateUp => split("gate_up_proj", &[("gate_proj", config.hidden()), ("up_proj", config.hidden())]),
        _ => vec![(name, info.shape[0])],
    }
}

/// The shape Hugging Face stores part `rows` of `info` in: Conv1D's `[in, out]` for GPT-2's
/// projections, else `nn.Linear`'s `[out, in]` (or a vector's `[len]`).
fn hf_shape(info: &ParamInfo, rows: usize) -> Vec<usize> {
    match (is_conv1d(info.kind), info.ndim()) {
        (true, _) => vec![info.shape[1], rows],
        (false, 2) => vec![rows, info.shape[1]],
        (false, _) => vec![rows],
    }
}

/// Whether the tensor is stored as `[in, out]` (Conv1D) in `transformers`.
fn is_conv1d(kind: ParamKind) -> bool {
    matches!(kind, ParamKind::QkvWeight | ParamKind::AttnProjWeight | ParamKind::FcWeight | ParamKind::MlpProjWeight)
}

/// A tensor's values as f32 (F32, F16 or BF16, little-endian).
fn values(name: &str, t: &TensorView<'_>) -> Result<Vec<f32>, HfError> {
    let data = t.data();
    Ok(match t.dtype() {
        Dtype::F32 => data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        Dtype::F16 => data.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::BF16 => data.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        other => return Err(HfError::Weights(format!("tensor {name} is {other:?}; Alpha reads F32, F16 and BF16"))),
    })
}

/// An error naming the first tensor of the weight files (file by file, names in order) that
/// the model `config` does not explain: every tensor is one of its weights (GPT-2's with or
/// without the `transformer.` prefix; once), a tied head, or a buffer older `transformers`
/// saved (GPT-2's causal masks `attn.bias`, `attn.masked_bias`; Llama's
/// `rotary_emb.inv_freq`). A config that understates the layers would otherwise drop the
/// layers past it without a word.
fn account_for_every_tensor(config: &GptConfig, plan: &Plan, shards: &[(&str, SafeTensors<'_>)]) -> Result<(), HfError> {
    let short = |name: &str| name.strip_prefix("transformer.").unwrap_or(name).to_string();
    let weights: BTreeSet<String> = plan.params().flat_map(|i| hf_parts(&i, config)).map(|(name, _)| short(&name)).collect();
    let buffer = |name: &str| {
        let layered = |prefix: &str, buffers: &[&str]| {
            let Some((layer, rest)) = name.strip_prefix(prefix).and_then(|r| r.split_once('.')) else { return false };
            layer.parse::<usize>().is_ok_and(|l| l < config.n_layer && l.to_string() == layer) && buffers.contains(&rest)
        };
        layered("h.", &["attn.bias", "attn.masked_bias"]) || layered("model.layers.", &["self_attn.rotary_emb.inv_freq"])
    };
    let mut seen = BTreeSet::new();
    for (file, shard) in shards {
        let mut names = shard.names();
        names.sort();
        for name in names {
            let short = short(name);
            let explained = weights.contains(&short) || (config.tied() && short == "lm_head.weight") || buffer(&short);
            if !explained {
                return Err(HfError::Weights(format!(
                    "{file} holds tensor {name}, which a model of config.json's {} layers, {} wide, does not have (does config.json describe these weights?)",
                    config.n_layer, config.n_embd
                )));
            }
            if !seen.insert(short.clone()) {
                return Err(HfError::Weights(format!("tensor {short} is in the weights twice")));
            }
        }
    }
    Ok(())
}

/// The parameters (in plan order) of a model of `config` from its weights: `shards`, each a
/// file's name (for messages) and its safetensors. Every tensor must be one the config
/// implies, of its shape and finite; a head stored beside a tied embedding must be the
/// embedding.
pub fn params_from_safetensors(config: &GptConfig, shards: &[(&str, SafeTensors<'_>)]) -> Result<Vec<f32>, HfError> {
    let plan = Plan::new(*config, 1, 1).map_err(|e| HfError::Config(e.to_string()))?;
    account_for_every_tensor(config, &plan, shards)?;
    let find = |name: &str| -> Option<TensorView<'_>> {
        let short = name.strip_prefix("transformer.").unwrap_or(name);
        shards.iter().find_map(|(_, s)| s.tensor(name).or_else(|_| s.tensor(short)).ok())
    };
    let mut params = crate::plan::try_vec("parameters", plan.params_len(), 0f32).map_err(|e| HfError::Weights(e.to_string()))?;
    for info in plan.params() {
        let dst = &mut params[info.span.range()];
        let cols = info.shape[1];
        let mut row = 0;
        for (name, rows) in hf_parts(&info, config) {
            let t = find(&name).ok_or_else(|| HfError::Weights(format!("the weights have no tensor {name}")))?;
            let want = hf_shape(&info, rows);
            if t.shape() != want.as_slice() {
                return Err(HfError::Weights(format!("tensor {name} is {:?}, the config implies {want:?}", t.shape())));
            }
            let v = values(&name, &t)?;
            let part = &mut dst[row * cols..(row + rows) * cols];
            if is_conv1d(info.kind) {
                // [in, out] -> [out, in].
                for (i, r) in v.chunks_exact(rows).enumerate() {
                    for (j, &x) in r.iter().enumerate() {
                        part[j * cols + i] = x;
                    }
                }
            } else {
                part.copy_from_slice(&v);
            }
            if let Some(index) = part.iter().position(|x| !x.is_finite()) {
                return Err(HfError::Weights(format!("tensor {name} holds {} at index {index}", part[index])));
            }
            row += rows;
        }
    }
    // A head stored beside a tied embedding must be the embedding: else it is another model.
    if let Some(head) = find("lm_head.weight").filter(|_| config.tied()) {
        let table = plan.token_embedding();
        if head.shape() != [config.vocab_size, config.n_embd] || values("lm_head.weight", &head)? != params[table.span.range()] {
            return Err(HfError::Weights("lm_head.weight is not the token embedding, though the head is tied (tie_word_embeddings)".into()));
        }
    }
    Ok(params)
}

/// The `tokenizer.json` of a character tokenizer: each character a word of a word-level
/// model, text split into single characters, tokens joined back without separators.
fn char_tokenizer_json(chars: &[char]) -> Value {
    let vocab: serde_json::Map<String, Value> = chars.iter().enumerate().map(|(id, c)| (c.to_string(), id.into())).collect();
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[\\s\\S]"}, "behavior": "Isolated", "invert": false},
        "post_processor": null,
        "decoder": {"type": "Fuse"},
        // An unknown character is an error, as in Alpha: the unknown token is not a word.
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    })
}

/// The character tokenizer of a `tokenizer.json` that [`char_tokenizer_json`] wrote (exactly
/// that form), or `None` for any other file.
fn char_tokenizer_from_json(json: &str) -> Option<CharTokenizer<Vec<char>>> {
    let file: Value = serde_json::from_str(json).ok()?;
    let vocab = file.get("model")?.get("vocab")?.as_object()?;
    let mut chars = vec!['\0'; vocab.len()];
    for (word, id) in vocab {
        let mut word_chars = word.chars();
        let (ch, id) = (word_chars.next()?, usize::try_from(id.as_u64()?).ok()?);
        if word_chars.next().is_some() {
            return None;
        }
        *chars.get_mut(id)? = ch;
    }
    let tokenizer = CharTokenizer::new(chars).ok()?;
    (char_tokenizer_json(tokenizer.chars()) == file).then_some(tokenizer)
}

/// The text of a Hugging Face model directory's tokenizer files.
#[derive(Clone, Copy, Debug)]
pub enum TokenizerFiles<'a> {
    /// `tokenizer.json`.
    Json(&'a str),
    /// GPT-2's `vocab.json` and `merges.txt`.
    VocabMerges {
        /// `vocab.json`.
        vocab: &'a str,
        /// `merges.txt`.
        merges: &'a str,
    },
}

/// A Hugging Face model directory read from its files' contents, no file system involved:
/// `config.json`'s text, the tokenizer's ([`TokenizerFiles`]) and the weights (each
/// safetensors file's name and bytes: `model.safetensors`, or the shards its index names).
/// The checkpoint holds weights only (no optimizer state) and is not `verified` (safetensors
/// carry no checksums). An error names the file it is in, where it is in one.
///
/// ```
/// use alpha_core::hf::{from_files, model_files, TokenizerFiles};
/// use alpha_core::tokenizer::{CharTokenizer, Tokenizer};
/// # let config = alpha_core::GptConfig::gpt2(3, 8, 1, 1, 8);
/// # let tokenizer = Tokenizer::from(CharTokenizer::new(vec!['a', 'b', 'c']).unwrap());
/// # let params = vec![0.01f32; alpha_core::Plan::new(config, 1, 1).unwrap().params_len()];
/// # let ck = alpha_core::checkpoint::Checkpoint { config, tokenizer, params, optimizer: None, verified: true };
/// // A model written as a Hugging Face directory's files, read back from them.
/// let files = model_files(&ck)?;
/// let text = |name: &str| files.iter().find(|(n, _)| *n == name).map(|(_, b)| core::str::from_utf8(b).unwrap()).unwrap();
/// let weights = files.iter().find(|(n, _)| *n == "model.safetensors").map(|(n, b)| (*n, &b[..])).unwrap();
/// let back = from_files(text("config.json"), TokenizerFiles::Json(text("tokenizer.json")), &[weights])?;
/// assert_eq!((back.config, back.params), (ck.config, ck.params));
/// # Ok::<(), alpha_core::hf::HfError>(())
/// ```
pub fn from_files(config_json: &str, tokenizer: TokenizerFiles<'_>, weights: &[(&str, &[u8])]) -> Result<Checkpoint, HfError> {
    let in_file = |file: &str, e: HfError| HfError::InFile(file.into(), alloc::boxed::Box::new(e));
    let config = config_from_json(config_json).map_err(|e| in_file("config.json", e))?;
    let tokenizer = match tokenizer {
        // A character model Alpha exported, else byte-level BPE.
        TokenizerFiles::Json(json) => match char_tokenizer_from_json(json) {
            Some(chars) => Tokenizer::from(chars),
            None => Tokenizer::from(crate::tokenizer::hf::from_tokenizer_json(json).map_err(|e| in_file("tokenizer.json", HfError::Tokenizer(e.0)))?),
        },
        TokenizerFiles::VocabMerges { vocab, merges } => {
            Tokenizer::from(crate::tokenizer::hf::from_vocab_merges(vocab, merges).map_err(|e| in_file("vocab.json and merges.txt", HfError::Tokenizer(e.0)))?)
        }
    };
    // A larger vocabulary is padding (`Plan::with_classes`).
    if tokenizer.vocab_size() > config.vocab_size {
        return Err(HfError::Config(format!("config.json's vocab_size is {} but the tokenizer has {} tokens", config.vocab_size, tokenizer.vocab_size())));
    }
    let shards = weights
        .iter()
        .map(|&(name, bytes)| SafeTensors::deserialize(bytes).map(|s| (name, s)).map_err(|e| in_file(name, HfError::Safetensors(e.to_string()))))
        .collect::<Result<Vec<_>, _>>()?;
    let params = params_from_safetensors(&config, &shards)?;
    Ok(Checkpoint { config, tokenizer, params, optimizer: None, verified: false })
}

/// The files of a Hugging Face model directory that `transformers` loads as the same model as
/// `ck` (`GPT2LMHeadModel`, `LlamaForCausalLM`, or `Qwen2ForCausalLM` where the q/k/v
/// projections have biases), by name: `config.json`, `model.safetensors` (metadata `format:
/// pt`, as `transformers` expects; a tied head omitted), `tokenizer.json`,
/// `tokenizer_config.json` and `generation_config.json`. A padded vocabulary (`train
/// --vocab-pad`) is cut to the tokenizer's.
pub fn model_files(ck: &Checkpoint) -> Result<[(&'static str, Vec<u8>); 5], HfError> {
    let plan = Plan::new(ck.config, 1, 1).map_err(|e| HfError::Config(e.to_string()))?;
    let c = GptConfig { vocab_size: ck.tokenizer.vocab_size(), ..ck.config };
    let (eot_name, eot) = match &ck.tokenizer {
        Tokenizer::Bpe(b) => b.end_of_text().map_or((None, None), |(name, id)| (Some(name.to_string()), Some(id))),
        Tokenizer::Char(_) => (None, None),
    };
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for info in plan.params() {
        let mut data = &ck.params[info.span.range()];
        let cols = info.shape[1];
        if matches!(info.kind, ParamKind::Wte | ParamKind::Embed | ParamKind::LmHead) {
            data = &data[..c.vocab_size * cols];
        }
        let mut row = 0;
        for (name, rows) in hf_parts(&info, &ck.config) {
            let rows = if data.len() < (row + rows) * cols { data.len() / cols - row } else { rows };
            let part = &data[row * cols..(row + rows) * cols];
            let bytes: Vec<u8> = if is_conv1d(info.kind) {
                // [out, in] -> [in, out].
                (0..cols).flat_map(|j| (0..rows).map(move |i| part[i * cols + j])).flat_map(f32::to_le_bytes).collect()
            } else {
                part.iter().flat_map(|x| x.to_le_bytes()).collect()
            };
            tensors.push((name, hf_shape(&info, rows), bytes));
            row += rows;
        }
    }
    let tensor_error = |e: safetensors::SafeTensorError| HfError::Weights(e.to_string());
    let views = tensors
        .iter()
        .map(|(n, s, b)| TensorView::new(Dtype::F32, s.clone(), b).map(|v| (n.clone(), v)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(tensor_error)?;
    let meta = [("format".to_string(), "pt".to_string())].into_iter().collect();
    let weights = safetensors::serialize(views, Some(meta)).map_err(tensor_error)?;
    // The token a sequence starts with: the tokenizer template's first, else the end token.
    let bos = match &ck.tokenizer {
        Tokenizer::Bpe(b) => b.special_tokens_around().0.first().copied().or(eot),
        Tokenizer::Char(_) => None,
    };
    let config = match c.llama() {
        None => serde_json::json!({
            "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "vocab_size": c.vocab_size, "n_positions": c.block_size, "n_embd": c.n_embd, "n_layer": c.n_layer, "n_head": c.n_head, "n_inner": null,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
            "scale_attn_weights": true, "scale_attn_by_inverse_layer_idx": false, "reorder_and_upcast_attn": false,
            "tie_word_embeddings": true, "use_cache": true, "bos_token_id": eot, "eos_token_id": eot, "dtype": "float32",
        }),
        Some(l) => {
            let (class, kind) = if l.qkv_bias { ("Qwen2ForCausalLM", "qwen2") } else { ("LlamaForCausalLM", "llama") };
            let rope_scaling = l.rope_scaling.map(|r| {
                serde_json::json!({"rope_type": "llama3", "factor": r.factor, "low_freq_factor": r.low_freq_factor,
                    "high_freq_factor": r.high_freq_factor, "original_max_position_embeddings": r.original_max_position_embeddings})
            });
            // transformers 5 reads rope_parameters, 4 rope_theta and rope_scaling: both written.
            let mut rope_parameters = rope_scaling.clone().unwrap_or_else(|| serde_json::json!({"rope_type": "default"}));
            rope_parameters["rope_theta"] = l.rope_theta.into();
            let mut config = serde_json::json!({
                "architectures": [class], "model_type": kind,
                "vocab_size": c.vocab_size, "max_position_embeddings": c.block_size, "hidden_size": c.n_embd,
                "intermediate_size": l.intermediate_size, "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head,
                "num_key_value_heads": l.n_kv_head, "head_dim": c.head_size(), "hidden_act": "silu", "rms_norm_eps": l.norm_eps,
                "rope_theta": l.rope_theta, "rope_scaling": rope_scaling, "rope_parameters": rope_parameters, "tie_word_embeddings": l.tied, "initializer_range": 0.02,
                "attention_dropout": 0.0, "use_cache": true, "bos_token_id": bos, "eos_token_id": eot, "dtype": "float32",
            });
            if kind == "llama" {
                config["attention_bias"] = false.into();
                config["mlp_bias"] = false.into();
                config["pretraining_tp"] = 1.into();
            } else {
                config["use_sliding_window"] = false.into();
            }
            config
        }
    };
    let tokenizer = match &ck.tokenizer {
        Tokenizer::Bpe(b) => serde_json::from_str(&crate::tokenizer::hf::to_tokenizer_json(b)).expect("the writer writes JSON"),
        Tokenizer::Char(t) => char_tokenizer_json(t.chars()),
    };
    let mut tokenizer_config = serde_json::json!({"model_max_length": c.block_size, "add_prefix_space": false, "clean_up_tokenization_spaces": false});
    let token_name = |id: Option<u32>| match &ck.tokenizer {
        Tokenizer::Bpe(b) => id.and_then(|id| b.token_text(id)).map(|t| String::from_utf8_lossy(t).into_owned()),
        Tokenizer::Char(_) => None,
    };
    match (eot_name, c.llama()) {
        (Some(eot), None) => {
            for key in ["bos_token", "eos_token", "unk_token"] {
                tokenizer_config[key] = eot.clone().into();
            }
            tokenizer_config["tokenizer_class"] = "GPT2Tokenizer".into();
        }
        (eot, _) => {
            tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast".into();
            if let Some(eot) = eot {
                tokenizer_config["eos_token"] = eot.into();
            }
            if let Some(bos) = token_name(bos) {
                tokenizer_config["bos_token"] = bos.into();
            }
        }
    }
    let generation = serde_json::json!({"bos_token_id": bos, "eos_token_id": eot});
    Ok([
        ("config.json", format!("{config:#}\n").into_bytes()),
        ("model.safetensors", weights),
        ("tokenizer.json", format!("{tokenizer:#}\n").into_bytes()),
        ("tokenizer_config.json", format!("{tokenizer_config:#}\n").into_bytes()),
        ("generation_config.json", format!("{generation:#}\n").into_bytes()),
    ])
}
