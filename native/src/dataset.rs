//! Datasets beyond RAM, for `train --dataset`: memory-maps a directory `alpha-native prepare`
//! wrote (train.bin, val.bin, meta.json), one nanoGPT's own `prepare.py` wrote (`uint16`, no
//! `meta.json`: `--tokenizer` names the tokenizer), or llm.c's shards (a 256 x int32 header:
//! magic 20240520, version 1, token count; then `uint16` ids).

use crate::fsutil::{open_regular, read_regular_string};
use alpha_core::data::Segment;
use alpha_core::parallel::Parallel;
use alpha_core::tokenizer::{hf, Tokenizer};
use anyhow::{anyhow, Result};
use memmap2::Mmap;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// `meta.json`'s `format`.
pub const FORMAT: &str = "alpha-dataset/1";
/// llm.c's shard header: 256 little-endian int32, the first three magic, version, tokens.
const LLMC_HEADER_BYTES: usize = 256 * 4;
const LLMC_MAGIC: i32 = 20240520;
/// How ids are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    /// Two bytes each (vocabularies of at most 65536 tokens).
    U16,
    /// Four bytes each.
    U32,
}

impl Dtype {
    /// The narrowest type for ids below `vocab_size`.
    pub fn for_vocab(vocab_size: usize) -> Dtype {
        if vocab_size <= 1 << 16 {
            Dtype::U16
        } else {
            Dtype::U32
        }
    }

    /// Bytes per id.
    pub fn width(self) -> usize {
        match self {
            Dtype::U16 => 2,
            Dtype::U32 => 4,
        }
    }

    /// numpy's name (`meta.json`).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::U16 => "uint16",
            Dtype::U32 => "uint32",
        }
    }

    fn parse(name: &str) -> Result<Dtype> {
        match name {
            "uint16" => Ok(Dtype::U16),
            "uint32" => Ok(Dtype::U32),
            other => Err(anyhow!("dtype {other:?} is not uint16 or uint32")),
        }
    }
}

/// One memory-mapped file of ids: the map and where its ids start.
struct Shard {
    map: Mmap,
    start: usize,
}

/// A split of a dataset: its shards, read as one stream.
pub struct Split {
    shards: Vec<Shard>,
    dtype: Dtype,
}

impl Split {
    /// The split's ids as segments of the shards' bytes.
    pub fn segments(&self) -> Vec<Segment<'_>> {
        self.shards
            .iter()
            .map(|s| match self.dtype {
                Dtype::U16 => Segment::U16(&s.map[s.start..]),
                Dtype::U32 => Segment::U32(&s.map[s.start..]),
            })
            .collect()
    }

    /// Ids in the split.
    pub fn len(&self) -> usize {
        self.segments().iter().map(Segment::len).sum()
    }

    /// Whether the split holds no id.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A dataset opened for training.
pub struct Dataset {
    /// Training ids.
    pub train: Split,
    /// Validation ids.
    pub val: Split,
    /// The tokenizer of the ids.
    pub tokenizer: Tokenizer,
}

/// Maps `path` read-only.
fn map(path: &Path) -> Result<Mmap> {
    let file = open_regular(path).map_err(|e| anyhow!("cannot read {}: {e}", path.display()))?;
    // SAFETY: the map is read-only; a file changed under a running training is the user's
    // doing (as for nanoGPT's np.memmap) and can only change the ids read, which are checked.
    unsafe { Mmap::map(&file) }.map_err(|e| anyhow!("cannot map {}: {e}", path.display()))
}

/// A shard of nanoGPT's layout (ids from byte 0): its size must be whole ids.
fn plain_shard(path: &Path, dtype: Dtype) -> Result<Shard> {
    let map = map(path)?;
    if !map.len().is_multiple_of(dtype.width()) {
        return Err(anyhow!("{} has {} bytes, not a whole number of {} ids", path.display(), map.len(), dtype.name()));
    }
    Ok(Shard { map, start: 0 })
}

/// An llm.c shard: header checked, then `uint16` ids.
fn llmc_shard(path: &Path) -> Result<Shard> {
    let map = map(path)?;
    let word = |i: usize| i32::from_le_bytes(map[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    if map.len() < LLMC_HEADER_BYTES || word(0) != LLMC_MAGIC {
        return Err(anyhow!("{} is not an llm.c shard (no header with magic {LLMC_MAGIC})", path.display()));
    }
    if word(1) != 1 {
        return Err(anyhow!("{}: llm.c shard version {} is not supported (version 1: uint16 ids)", path.display(), word(1)));
    }
    let count = word(2);
    let body = map.len() - LLMC_HEADER_BYTES;
    if count < 0 || body != 2 * count as usize {
        return Err(anyhow!("{}: the header says {count} tokens, the file holds {} bytes of them", path.display(), body));
    }
    Ok(Shard { map, start: LLMC_HEADER_BYTES })
}

/// Files matching `pattern`, whose file name may hold `*` (any characters), sorted.
fn matching(pattern: &str) -> Result<Vec<PathBuf>> {
    let path = Path::new(pattern);
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| anyhow!("--dataset {pattern}: no file name pattern"))?;
    if dir.to_string_lossy().contains('*') {
        return Err(anyhow!("--dataset {pattern}: only the file name may hold *"));
    }
    let parts: Vec<&str> = name.split('*').collect();
    let matches = |candidate: &str| {
        let (first, last) = (parts[0], parts[parts.len() - 1]);
        if !candidate.starts_with(first) || !candidate.ends_with(last) || candidate.len() < first.len() + last.len() {
            return false;
        }
        let mut rest = &candidate[first.len()..candidate.len() - last.len()];
        for middle in &parts[1..parts.len() - 1] {
            match rest.find(middle) {
                Some(i) => rest = &rest[i + middle.len()..],
                None => return false,
            }
        }
        true
    };
    let entries = fs::read_dir(dir).map_err(|e| anyhow!("--dataset {pattern}: cannot read {}: {e}", dir.display()))?;
    let mut found: Vec<PathBuf> =
        entries.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(matches)).collect();
    found.sort();
    Ok(found)
}

/// `tokenizer` (`--tokenizer`, or a resumed checkpoint's), required where the dataset does
/// not record its own.
fn named_tokenizer(tokenizer: Option<Tokenizer>, what: &str) -> Result<Tokenizer> {
    tokenizer.ok_or_else(|| anyhow!("{what} does not record its tokenizer: name it with --tokenizer"))
}

/// Opens `--dataset`: a directory (Alpha's `prepare`, or nanoGPT's with `tokenizer`) or a
/// pattern of llm.c train shards, with `tokenizer` where it records none (one it records must
/// equal a given one); checks every id against the vocabulary on `par`'s threads.
pub fn open(spec: &str, tokenizer: Option<Tokenizer>, par: &dyn Parallel) -> Result<Dataset> {
    let dir = Path::new(spec);
    let dataset = if spec.contains('*') {
        let train_files = matching(spec)?;
        let val_pattern = spec
            .rsplit_once("train")
            .map(|(a, b)| format!("{a}val{b}"))
            .ok_or_else(|| anyhow!("--dataset {spec}: the pattern must name train shards (\"train\" in it)"))?;
        let val_files = matching(&val_pattern)?;
        if train_files.is_empty() || val_files.is_empty() {
            return Err(anyhow!(
                "--dataset {spec}: {} train shards and {} val shards ({val_pattern}) match; both need at least one",
                train_files.len(),
                val_files.len()
            ));
        }
        let tokenizer = named_tokenizer(tokenizer, "an llm.c dataset")?;
        let shards = |files: &[PathBuf]| files.iter().map(|p| llmc_shard(p)).collect::<Result<Vec<_>, _>>();
        Dataset { train: Split { shards: shards(&train_files)?, dtype: Dtype::U16 }, val: Split { shards: shards(&val_files)?, dtype: Dtype::U16 }, tokenizer }
    } else if dir.is_dir() {
        let meta_path = dir.join("meta.json");
        let (dtype, tokenizer) = if meta_path.exists() {
            let in_meta = |e: &dyn std::fmt::Display| anyhow!("{}: {e}", meta_path.display());
            let text = read_regular_string(&meta_path).map_err(|e| in_meta(&e))?;
            let meta: Value = serde_json::from_str(&text).map_err(|e| in_meta(&e))?;
            let dtype = Dtype::parse(meta.get("dtype").and_then(Value::as_str).unwrap_or("")).map_err(|e| anyhow!("{}: {e}", meta_path.display()))?;
            let spec_json = meta.get("tokenizer").ok_or_else(|| anyhow!("{} has no tokenizer", meta_path.display()))?;
            let recorded = Tokenizer::from(hf::from_tokenizer_json(&spec_json.to_string()).map_err(|e| anyhow!("{}: tokenizer: {e}", meta_path.display()))?);
            if tokenizer.is_some_and(|t| t != recorded) {
                return Err(anyhow!("dataset {spec} was prepared with another tokenizer than the one given (its meta.json records it)"));
            }
            (dtype, recorded)
        } else {
            (Dtype::U16, named_tokenizer(tokenizer, &format!("dataset {spec} (no meta.json, as nanoGPT's prepare.py writes it)"))?)
        };
        let shard = |name: &str| plain_shard(&dir.join(name), dtype);
        Dataset { train: Split { shards: vec![shard("train.bin")?], dtype }, val: Split { shards: vec![shard("val.bin")?], dtype }, tokenizer }
    } else {
        return Err(anyhow!("--dataset {spec} is neither a directory nor a pattern of llm.c shards"));
    };
    let vocab = dataset.tokenizer.vocab_size();
    if dataset.train.dtype == Dtype::U16 && vocab > 1 << 16 {
        return Err(anyhow!("--dataset {spec} holds uint16 ids, but the tokenizer has {vocab} tokens: ids past 65535 cannot be stored (prepare it again)"));
    }
    for (name, split) in [("train", &dataset.train), ("val", &dataset.val)] {
        if split.is_empty() {
            return Err(anyhow!("--dataset {spec}: the {name} split is empty"));
        }
        if let Some((id, at)) = first_out_of_vocab(&split.segments(), vocab, par) {
            return Err(anyhow!("--dataset {spec}: the {name} split holds token id {id} at token {at}, past the tokenizer's {vocab} tokens"));
        }
    }
    Ok(dataset)
}

/// The first id of the stream of `segments` at or past `vocab`, with its index, checked in
/// blocks on `par`'s threads.
fn first_out_of_vocab(segments: &[Segment<'_>], vocab: usize, par: &dyn Parallel) -> Option<(u32, usize)> {
    const BLOCK: usize = 1 << 20;
    let mut base = 0;
    for segment in segments {
        let len = segment.len();
        let blocks = len.div_ceil(BLOCK);
        let found: Vec<Mutex<Option<(u32, usize)>>> = (0..blocks).map(|_| Mutex::new(None)).collect();
        par.run(blocks, &|b| {
            let range = b * BLOCK..((b + 1) * BLOCK).min(len);
            let mut ids = vec![0u32; range.len()];
            alpha_core::data::Tokens::Stream(std::slice::from_ref(segment)).read(range.start, &mut ids);
            if let Some(i) = ids.iter().position(|&id| id as usize >= vocab) {
                *found[b].lock().expect("no task panics") = Some((ids[i], range.start + i));
            }
        });
        if let Some((id, at)) = found.into_iter().find_map(|m| m.into_inner().expect("no task panics")) {
            return Some((id, base + at));
        }
        base += len;
    }
    None
}
