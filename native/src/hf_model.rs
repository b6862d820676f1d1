//! Hugging Face model directories in and out: `GPT2LMHeadModel`, `LlamaForCausalLM` and
//! `Qwen2ForCausalLM`. In: `config.json`, `model.safetensors` (or shards named by
//! `model.safetensors.index.json`) and the tokenizer (`tokenizer.json`, or `vocab.json` +
//! `merges.txt`), read as a checkpoint of weights. GPT-2's weights keep their names (with or
//! without the `transformer.` prefix); `transformers`' Conv1D stores `[in, out]`, so the four
//! projection matrices are transposed into Alpha's `nn.Linear` layout; the head is tied. The
//! Llama family's q, k and v projections (and their biases) are Alpha's fused q/k/v rows in
//! that order, gate and up its fused gate/up rows; the head is tied or not as config.json
//! says. F32, F16 and BF16 are read. Files are memory-mapped, never copied whole.
//! Alpha never unpickles: a directory with only `pytorch_model.bin` is refused, with the
//! command that converts it. Out ([`save`]): the same layout from any Alpha checkpoint, which
//! `GPT2LMHeadModel.from_pretrained` and `AutoTokenizer.from_pretrained` load; a character
//! tokenizer becomes a `tokenizers` word-level model over single characters.

use crate::fsutil::{open_regular, read_regular_string};
use alpha_core::checkpoint::Checkpoint;
use alpha_core::plan::{ParamInfo, ParamKind, Plan};
use alpha_core::tokenizer::Tokenizer;
use alpha_core::{Arch, GptConfig, Llama, RopeScaling};
use anyhow::{anyhow, Result};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Whether `path` is a model directory (it holds a `config.json`).
pub fn is_model_dir(path: &Path) -> bool {
    path.is_dir() && path.join("config.json").is_file()
}

/// The names `--init-from` and `--checkpoint` take for Hugging Face's GPT-2 models, found in
/// the local Hugging Face cache.
pub const GPT2_NAMES: [&str; 4] = ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"];

/// The directory a model name (`gpt2`, `openai-community/gpt2`, any `org/name`) has in the
/// local Hugging Face cache (`$HF_HUB_CACHE`, `$HF_HOME/hub` or `~/.cache/huggingface/hub`):
/// its newest snapshot. Nothing is downloaded; the error says where it looked.
pub fn find_cached(name: &str) -> Result<PathBuf> {
    let hub = match (std::env::var_os("HF_HUB_CACHE"), std::env::var_os("HF_HOME"), std::env::var_os("HOME")) {
        (Some(cache), _, _) => PathBuf::from(cache),
        (None, Some(home), _) => PathBuf::from(home).join("hub"),
        (None, None, Some(home)) => PathBuf::from(home).join(".cache/huggingface/hub"),
        (None, None, None) => return Err(anyhow!("{name}: no Hugging Face cache (set HF_HOME)")),
    };
    // GPT-2's models moved to openai-community/; the cache keeps either name.
    let mut repos = vec![name.replace('/', "--")];
    if !name.contains('/') {
        repos.push(format!("openai-community--{name}"));
    }
    let mut looked = Vec::new();
    for repo in &repos {
        let snapshots = hub.join(format!("models--{repo}")).join("snapshots");
        looked.push(snapshots.display().to_string());
        let Ok(entries) = std::fs::read_dir(&snapshots) else { continue };
        let newest = entries.filter_map(|e| e.ok()).filter(|e| is_model_dir(&e.path())).max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok());
        if let Some(dir) = newest {
            return Ok(dir.path());
        }
    }
    Err(anyhow!(
        "model {name} is not in the local Hugging Face cache (looked in {}); download it there first (huggingface-cli download {name}), or give its directory",
        looked.join(" and ")
    ))
}

/// `config.json` as Alpha's model; what Alpha does not compute exactly is an error naming
/// the field.
fn config(dir: &Path) -> Result<GptConfig> {
    let path = dir.join("config.json");
    let text = read_regular_string(&path).map_err(|e| anyhow!("cannot read {}: {e}", path.display()))?;
    let c: Value = serde_json::from_str(&text).map_err(|e| anyhow!("{} is not valid JSON: {e}", path.display()))?;
    match c.get("model_type").and_then(Value::as_str).unwrap_or("gpt2") {
        "gpt2" => gpt2_config(&path, &c),
        kind @ ("llama" | "qwen2") => llama_config(&path, &c, kind),
        kind => Err(anyhow!("{}: model_type is {kind:?}; Alpha runs gpt2, llama and qwen2 models", path.display())),
    }
}

/// A positive size field of `c`.
fn size_field(c: &Value, key: &str) -> Option<usize> {
    c.get(key).and_then(Value::as_u64).and_then(|v| usize::try_from(v).ok()).filter(|&v| v > 0)
}

/// GPT-2's `config.json`.
fn gpt2_config(path: &Path, c: &Value) -> Result<GptConfig> {
    let bad = |what: String| anyhow!("{}: {what}; Alpha runs GPT-2 (model_type gpt2, gelu_new, LayerNorm eps 1e-5, tied head)", path.display());
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
fn llama_config(path: &Path, c: &Value, kind: &str) -> Result<GptConfig> {
    let bad = |what: String| anyhow!("{}: {what}; Alpha cannot run this {kind} model exactly", path.display());
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

/// The weight files: `model.safetensors`, or the shards its index names.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = read_regular_string(&index).map_err(|e| anyhow!("cannot read {}: {e}", index.display()))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| anyhow!("{} is not valid JSON: {e}", index.display()))?;
        let map = v.get("weight_map").and_then(Value::as_object).ok_or_else(|| anyhow!("{} has no weight_map", index.display()))?;
        let mut files: Vec<String> = map.values().filter_map(Value::as_str).map(str::to_string).collect();
        files.sort();
        files.dedup();
        if files.iter().any(|f| f.contains('/') || f.contains('\\') || f == "..") {
            return Err(anyhow!("{} names a shard outside its directory", index.display()));
        }
        return Ok(files.iter().map(|f| dir.join(f)).collect());
    }
    if dir.join("pytorch_model.bin").is_file() {
        return Err(anyhow!(
            "{} has only pytorch_model.bin, a pickle, which Alpha never loads; convert it once with: python -c \"from transformers import GPT2LMHeadModel as M; M.from_pretrained('{0}').save_pretrained('{0}')\" (writes model.safetensors)",
            dir.display()
        ));
    }
    Err(anyhow!("{} has no model.safetensors (nor a sharded model.safetensors.index.json)", dir.display()))
}

/// Whether the tensor is stored as `[in, out]` (Conv1D) in `transformers`.
fn is_conv1d(kind: ParamKind) -> bool {
    matches!(kind, ParamKind::QkvWeight | ParamKind::AttnProjWeight | ParamKind::FcWeight | ParamKind::MlpProjWeight)
}

/// A tensor's values as f32 (F32, F16 or BF16, little-endian).
fn values(name: &str, t: &TensorView<'_>) -> Result<Vec<f32>> {
    let data = t.data();
    Ok(match t.dtype() {
        Dtype::F32 => data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        Dtype::F16 => data.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::BF16 => data.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        other => return Err(anyhow!("tensor {name} is {other:?}; Alpha reads F32, F16 and BF16")),
    })
}

/// An error naming the first tensor of the weight files (file by file, names in order) that
/// the model `config.json` describes does not explain: every tensor is one of its weights
/// (GPT-2's with or without the `transformer.` prefix; once), a tied head, or a buffer older
/// `transformers` saved (GPT-2's causal masks `attn.bias`, `attn.masked_bias`; Llama's
/// `rotary_emb.inv_freq`). A config that understates the layers would otherwise drop the
/// layers past it without a word.
fn account_for_every_tensor(dir: &Path, config: &GptConfig, plan: &Plan, files: &[PathBuf], shards: &[SafeTensors<'_>]) -> Result<()> {
    let short = |name: &str| name.strip_prefix("transformer.").unwrap_or(name).to_string();
    let weights: std::collections::HashSet<String> = plan.params().flat_map(|i| hf_parts(&i, config)).map(|(name, _)| short(&name)).collect();
    let buffer = |name: &str| {
        let layered = |prefix: &str, buffers: &[&str]| {
            let Some((layer, rest)) = name.strip_prefix(prefix).and_then(|r| r.split_once('.')) else { return false };
            layer.parse::<usize>().is_ok_and(|l| l < config.n_layer && l.to_string() == layer) && buffers.contains(&rest)
        };
        layered("h.", &["attn.bias", "attn.masked_bias"]) || layered("model.layers.", &["self_attn.rotary_emb.inv_freq"])
    };
    let mut seen = std::collections::HashSet::new();
    for (file, shard) in files.iter().zip(shards) {
        let mut names = shard.names();
        names.sort();
        for name in names {
            let short = short(name);
            let explained = weights.contains(&short) || (config.tied() && short == "lm_head.weight") || buffer(&short);
            if !explained {
                return Err(anyhow!(
                    "{}: {} holds tensor {name}, which a model of config.json's {} layers, {} wide, does not have (does config.json describe these weights?)",
                    dir.display(),
                    file.file_name().unwrap_or_default().to_string_lossy(),
                    config.n_layer,
                    config.n_embd
                ));
            }
            if !seen.insert(short.clone()) {
                return Err(anyhow!("{}: tensor {short} is in the weights twice", dir.display()));
            }
        }
    }
    Ok(())
}

/// Reads a Hugging Face model directory as a checkpoint of weights (no optimizer state).
pub fn load(dir: &Path) -> Result<Checkpoint> {
    let config = config(dir)?;
    let tokenizer = Tokenizer::from(crate::tokenizer::load(dir)?);
    // A larger vocabulary is padding (`Plan::with_classes`).
    if tokenizer.vocab_size() > config.vocab_size {
        return Err(anyhow!("{}: config.json's vocab_size is {} but the tokenizer has {} tokens", dir.display(), config.vocab_size, tokenizer.vocab_size()));
    }
    let files = weight_files(dir)?;
    let maps = files
        .iter()
        .map(|p| {
            let f = open_regular(p).map_err(|e| anyhow!("cannot read {}: {e}", p.display()))?;
            // SAFETY: read-only; a file changed while it loads can only change the values read.
            unsafe { Mmap::map(&f) }.map_err(|e| anyhow!("cannot map {}: {e}", p.display()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let shards = maps
        .iter()
        .zip(&files)
        .map(|(m, p)| SafeTensors::deserialize(m).map_err(|e| anyhow!("{} is not a valid safetensors file: {e}", p.display())))
        .collect::<Result<Vec<_>, _>>()?;
    let find = |name: &str| -> Option<TensorView<'_>> {
        let short = name.strip_prefix("transformer.").unwrap_or(name);
        shards.iter().find_map(|s| s.tensor(name).or_else(|_| s.tensor(short)).ok())
    };
    let plan = Plan::new(config, 1, 1)?;
    account_for_every_tensor(dir, &config, &plan, &files, &shards)?;
    let mut params = alpha_core::plan::try_vec("parameters", plan.params_len(), 0f32)?;
    for info in plan.params() {
        let dst = &mut params[info.span.range()];
        let cols = info.shape[1];
        let mut row = 0;
        for (name, rows) in hf_parts(&info, &config) {
            let t = find(&name).ok_or_else(|| anyhow!("{}: the weights have no tensor {name}", dir.display()))?;
            let want = hf_shape(&info, rows);
            if t.shape() != want.as_slice() {
                return Err(anyhow!("{}: tensor {name} is {:?}, the config implies {want:?}", dir.display(), t.shape()));
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
                return Err(anyhow!("{}: tensor {name} holds {} at index {index}", dir.display(), part[index]));
            }
            row += rows;
        }
    }
    // A head stored beside a tied embedding must be the embedding: else it is another model.
    if let Some(head) = find("lm_head.weight").filter(|_| config.tied()) {
        let table = plan.token_embedding();
        if head.shape() != [config.vocab_size, config.n_embd] || values("lm_head.weight", &head)? != params[table.span.range()] {
            return Err(anyhow!("{}: lm_head.weight is not the token embedding, though the head is tied (tie_word_embeddings)", dir.display()));
        }
    }
    // safetensors files carry no checksums.
    Ok(Checkpoint { config, tokenizer, params, optimizer: None, verified: false })
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

/// Writes `ck` to `dir` as a Hugging Face model directory that `transformers` loads as the
/// same model (`GPT2LMHeadModel`, `LlamaForCausalLM`, or `Qwen2ForCausalLM` where the q/k/v
/// projections have biases): `config.json`, `model.safetensors` (metadata `format: pt`, as
/// `transformers` expects; a tied head omitted), `tokenizer.json`, `tokenizer_config.json` and
/// `generation_config.json`, each atomically. A padded vocabulary (`train --vocab-pad`) is cut
/// to the tokenizer's.
pub fn save(ck: &Checkpoint, dir: &Path) -> Result<()> {
    let plan = Plan::new(ck.config, 1, 1)?;
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
    let views = tensors.iter().map(|(n, s, b)| TensorView::new(Dtype::F32, s.clone(), b).map(|v| (n.clone(), v))).collect::<Result<Vec<_>, _>>()?;
    let meta = [("format".to_string(), "pt".to_string())].into_iter().collect();
    let weights = safetensors::serialize(views, Some(meta))?;
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
        Tokenizer::Bpe(b) => serde_json::from_str(&alpha_core::tokenizer::hf::to_tokenizer_json(b)).expect("the writer writes JSON"),
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
    std::fs::create_dir_all(dir).map_err(|e| anyhow!("cannot create {}: {e}", dir.display()))?;
    let files: [(&str, Vec<u8>); 5] = [
        ("config.json", format!("{config:#}\n").into_bytes()),
        ("model.safetensors", weights),
        ("tokenizer.json", format!("{tokenizer:#}\n").into_bytes()),
        ("tokenizer_config.json", format!("{tokenizer_config:#}\n").into_bytes()),
        ("generation_config.json", format!("{generation:#}\n").into_bytes()),
    ];
    for (name, bytes) in files {
        let path = dir.join(name);
        crate::fsutil::write_atomic(&path, &bytes).map_err(|e| anyhow!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}
