//! Hugging Face GPT-2 directories in and out. In: `config.json`, `model.safetensors` (or shards named by
//! `model.safetensors.index.json`) and the tokenizer (`tokenizer.json`, or `vocab.json` +
//! `merges.txt`), read as a checkpoint of weights. The weights keep their names (with or
//! without the `transformer.` prefix); `transformers`' Conv1D stores `[in, out]`, so the four
//! projection matrices are transposed into Alpha's `nn.Linear` layout; F32, F16 and BF16 are
//! read; the head is tied to the token embedding. Files are memory-mapped, never copied whole.
//! Alpha never unpickles: a directory with only `pytorch_model.bin` is refused, with the
//! command that converts it. Out ([`save`]): the same layout from any Alpha checkpoint, which
//! `GPT2LMHeadModel.from_pretrained` and `AutoTokenizer.from_pretrained` load; a character
//! tokenizer becomes a `tokenizers` word-level model over single characters.

use crate::fsutil::{open_regular, read_regular_string};
use alpha_core::checkpoint::Checkpoint;
use alpha_core::plan::{ParamInfo, ParamKind, Plan};
use alpha_core::tokenizer::Tokenizer;
use alpha_core::GptConfig;
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

/// `config.json` as Alpha's model; what Alpha's GPT does not compute is an error.
fn config(dir: &Path) -> Result<GptConfig> {
    let path = dir.join("config.json");
    let text = read_regular_string(&path).map_err(|e| anyhow!("cannot read {}: {e}", path.display()))?;
    let c: Value = serde_json::from_str(&text).map_err(|e| anyhow!("{} is not valid JSON: {e}", path.display()))?;
    let bad = |what: String| anyhow!("{}: {what}; Alpha runs GPT-2 (model_type gpt2, gelu_new, LayerNorm eps 1e-5, tied head)", path.display());
    let size =
        |key: &str| c.get(key).and_then(Value::as_u64).and_then(|v| usize::try_from(v).ok()).ok_or_else(|| bad(format!("{key} is missing or not a size")));
    if let Some(kind) = c.get("model_type").and_then(Value::as_str).filter(|k| *k != "gpt2") {
        return Err(bad(format!("model_type is {kind:?}")));
    }
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

/// The shape of `info` in Alpha's layout (`[out, in]` for matrices), as nanoGPT stores it.
fn alpha_shape(info: &ParamInfo) -> Vec<usize> {
    info.shape[..info.ndim()].to_vec()
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
/// (with or without the `transformer.` prefix, once), the tied head, or the causal mask that
/// older `transformers` saved per layer (`attn.bias`, `attn.masked_bias`). A config that
/// understates `n_layer` would otherwise drop the layers past it without a word.
fn account_for_every_tensor(dir: &Path, config: &GptConfig, plan: &Plan, files: &[PathBuf], shards: &[SafeTensors<'_>]) -> Result<()> {
    let weights: std::collections::HashSet<String> = plan.params().map(|i| i.to_string().trim_start_matches("transformer.").to_string()).collect();
    let mask = |name: &str| {
        let Some((layer, buffer)) = name.strip_prefix("h.").and_then(|r| r.split_once('.')) else { return false };
        layer.parse::<usize>().is_ok_and(|l| l < config.n_layer && l.to_string() == layer) && (buffer == "attn.bias" || buffer == "attn.masked_bias")
    };
    let mut seen = std::collections::HashSet::new();
    for (file, shard) in files.iter().zip(shards) {
        let mut names = shard.names();
        names.sort();
        for name in names {
            let short = name.strip_prefix("transformer.").unwrap_or(name);
            let explained = weights.contains(short) || short == "lm_head.weight" || mask(short);
            if !explained {
                return Err(anyhow!(
                    "{}: {} holds tensor {name}, which a GPT-2 of config.json's {} layers, {} wide, does not have (does config.json describe these weights?)",
                    dir.display(),
                    file.file_name().unwrap_or_default().to_string_lossy(),
                    config.n_layer,
                    config.n_embd
                ));
            }
            if !seen.insert(short.to_string()) {
                return Err(anyhow!("{}: tensor {short} is in the weights twice", dir.display()));
            }
        }
    }
    Ok(())
}

/// Reads a Hugging Face GPT-2 directory as a checkpoint of weights (no optimizer state).
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
        let name = info.to_string();
        let t = find(&name).ok_or_else(|| anyhow!("{}: the weights have no tensor {name}", dir.display()))?;
        let mut want = alpha_shape(&info);
        if is_conv1d(info.kind) {
            want.reverse();
        }
        if t.shape() != want.as_slice() {
            return Err(anyhow!("{}: tensor {name} is {:?}, the config implies {want:?}", dir.display(), t.shape()));
        }
        let v = values(&name, &t)?;
        let dst = &mut params[info.span.range()];
        if is_conv1d(info.kind) {
            // [in, out] -> [out, in].
            let (rows, cols) = (want[0], want[1]);
            for (i, row) in v.chunks_exact(cols).enumerate() {
                for (j, &x) in row.iter().enumerate() {
                    dst[j * rows + i] = x;
                }
            }
        } else {
            dst.copy_from_slice(&v);
        }
        if let Some(index) = dst.iter().position(|x| !x.is_finite()) {
            return Err(anyhow!("{}: tensor {name} holds {} at index {index}", dir.display(), dst[index]));
        }
    }
    // An untied head would be a different model.
    if let Some(head) = find("lm_head.weight") {
        let wte = plan.params().find(|i| i.kind == ParamKind::Wte).expect("a GPT has a token embedding");
        if head.shape() != [config.vocab_size, config.n_embd] || values("lm_head.weight", &head)? != params[wte.span.range()] {
            return Err(anyhow!("{}: lm_head.weight is not the token embedding; Alpha's head is tied", dir.display()));
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

/// Writes `ck` to `dir` as a Hugging Face GPT-2 directory: `config.json`, `model.safetensors`
/// (metadata `format: pt`, as `transformers` expects; the head tied, so omitted),
/// `tokenizer.json`, `tokenizer_config.json` and `generation_config.json`, each atomically.
/// A padded vocabulary (`train --vocab-pad`) is cut to the tokenizer's.
pub fn save(ck: &Checkpoint, dir: &Path) -> Result<()> {
    let plan = Plan::new(ck.config, 1, 1)?;
    let c = GptConfig { vocab_size: ck.tokenizer.vocab_size(), ..ck.config };
    let eot = ck.tokenizer.end_of_text();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for info in plan.params() {
        let mut data = &ck.params[info.span.range()];
        let mut shape = alpha_shape(&info);
        if info.kind == ParamKind::Wte {
            data = &data[..c.vocab_size * c.n_embd];
            shape[0] = c.vocab_size;
        }
        let bytes: Vec<u8> = if is_conv1d(info.kind) {
            // [out, in] -> [in, out].
            let (rows, cols) = (shape[0], shape[1]);
            shape.reverse();
            (0..cols).flat_map(|j| (0..rows).map(move |i| data[i * cols + j])).flat_map(f32::to_le_bytes).collect()
        } else {
            data.iter().flat_map(|x| x.to_le_bytes()).collect()
        };
        tensors.push((info.to_string(), shape, bytes));
    }
    let views = tensors.iter().map(|(n, s, b)| TensorView::new(Dtype::F32, s.clone(), b).map(|v| (n.clone(), v))).collect::<Result<Vec<_>, _>>()?;
    let meta = [("format".to_string(), "pt".to_string())].into_iter().collect();
    let weights = safetensors::serialize(views, Some(meta))?;
    let config = serde_json::json!({
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": c.vocab_size, "n_positions": c.block_size, "n_embd": c.n_embd, "n_layer": c.n_layer, "n_head": c.n_head, "n_inner": null,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "scale_attn_weights": true, "scale_attn_by_inverse_layer_idx": false, "reorder_and_upcast_attn": false,
        "tie_word_embeddings": true, "use_cache": true, "bos_token_id": eot, "eos_token_id": eot, "dtype": "float32",
    });
    let (tokenizer, special) = match &ck.tokenizer {
        Tokenizer::Bpe(b) => (
            serde_json::from_str(&alpha_core::tokenizer::hf::to_tokenizer_json(b)).expect("the writer writes JSON"),
            eot.map(|_| alpha_core::tokenizer::bpe::END_OF_TEXT),
        ),
        Tokenizer::Char(t) => (char_tokenizer_json(t.chars()), None),
    };
    let mut tokenizer_config = serde_json::json!({"model_max_length": c.block_size, "add_prefix_space": false, "clean_up_tokenization_spaces": false});
    if let Some(s) = special {
        for key in ["bos_token", "eos_token", "unk_token"] {
            tokenizer_config[key] = s.into();
        }
        tokenizer_config["tokenizer_class"] = "GPT2Tokenizer".into();
    } else {
        tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast".into();
    }
    let generation = serde_json::json!({"bos_token_id": eot, "eos_token_id": eot});
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
