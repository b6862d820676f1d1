//! Hugging Face model directories in and out (`GPT2LMHeadModel`, `LlamaForCausalLM`,
//! `Qwen2ForCausalLM`): the files, around [`alpha_core::hf`], which maps their bytes. In:
//! `config.json`, `model.safetensors` (or shards named by `model.safetensors.index.json`) and
//! the tokenizer (`tokenizer.json`, or `vocab.json` + `merges.txt`), read as a checkpoint of
//! weights; files are memory-mapped, never copied whole.
//! Alpha never unpickles: a directory with only `pytorch_model.bin` is refused, with the
//! command that converts it. Out ([`save`]): the same layout from any Alpha checkpoint, which
//! `GPT2LMHeadModel.from_pretrained` and `AutoTokenizer.from_pretrained` load; a character
//! tokenizer becomes a `tokenizers` word-level model over single characters.

use crate::fsutil::{open_regular, read_regular_string};
use alpha_core::checkpoint::Checkpoint;
use alpha_core::hf;
use anyhow::{anyhow, Result};
use memmap2::Mmap;
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

/// Reads a Hugging Face model directory as a checkpoint of weights (no optimizer state):
/// its files read (the weights memory-mapped), then [`hf::from_files`].
pub fn load(dir: &Path) -> Result<Checkpoint> {
    let read = |name: &str| {
        let path = dir.join(name);
        read_regular_string(&path).map_err(|e| anyhow!("cannot read {}: {e}", path.display()))
    };
    let config = read("config.json")?;
    let (json, vocab, merges) = (dir.join("tokenizer.json"), dir.join("vocab.json"), dir.join("merges.txt"));
    let tokenizer_text = if json.is_file() {
        (read("tokenizer.json")?, None)
    } else if vocab.is_file() && merges.is_file() {
        (read("vocab.json")?, Some(read("merges.txt")?))
    } else {
        return Err(anyhow!("{} has neither tokenizer.json nor vocab.json and merges.txt", dir.display()));
    };
    let tokenizer = match &tokenizer_text {
        (json, None) => hf::TokenizerFiles::Json(json),
        (vocab, Some(merges)) => hf::TokenizerFiles::VocabMerges { vocab, merges },
    };
    let files = weight_files(dir)?;
    let maps = files
        .iter()
        .map(|p| {
            let f = open_regular(p).map_err(|e| anyhow!("cannot read {}: {e}", p.display()))?;
            // SAFETY: read-only; a file changed while it loads can only change the values read.
            unsafe { Mmap::map(&f) }.map_err(|e| anyhow!("cannot map {}: {e}", p.display()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let names: Vec<String> = files.iter().map(|f| f.file_name().unwrap_or_default().to_string_lossy().into_owned()).collect();
    let weights: Vec<(&str, &[u8])> = names.iter().map(String::as_str).zip(maps.iter().map(|m| &m[..])).collect();
    hf::from_files(&config, tokenizer, &weights).map_err(|e| anyhow!("{}: {e}", dir.display()))
}

/// Writes `ck` to `dir` as a Hugging Face model directory (see [`hf::model_files`]), each
/// file atomically.
pub fn save(ck: &Checkpoint, dir: &Path) -> Result<()> {
    let files = hf::model_files(ck)?;
    std::fs::create_dir_all(dir).map_err(|e| anyhow!("cannot create {}: {e}", dir.display()))?;
    for (name, bytes) in files {
        let path = dir.join(name);
        crate::fsutil::write_atomic(&path, &bytes).map_err(|e| anyhow!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}
