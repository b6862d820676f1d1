//! Datasets beyond RAM. `alpha-native prepare` tokenizes text files or JSONL (one document per
//! line, its `text` field) into nanoGPT's layout: `train.bin` and `val.bin` (little-endian
//! token ids, `uint16` where the vocabulary fits, else `uint32`) and `meta.json` (the
//! tokenizer, the dtype, the token counts), streaming, on all threads, with the same bytes for
//! any thread count. `train --dataset` memory-maps such a directory, one nanoGPT's own
//! `prepare.py` wrote (`uint16`, no `meta.json`: `--tokenizer` names the tokenizer), or llm.c's
//! shards (a 256 x int32 header: magic 20240520, version 1, token count; then `uint16` ids).

use crate::device::thread_pool;
use crate::fsutil::{open_regular, read_regular_string, temp_path, write_atomic};
use crate::interrupt::Interrupt;
use crate::tokenizer::bar;
use alpha_core::data::Segment;
use alpha_core::parallel::{Parallel, ThreadPool};
use alpha_core::tokenizer::bpe::{Bpe, END_OF_TEXT};
use alpha_core::tokenizer::{hf, Tokenizer};
use clap::Args;
use memmap2::Mmap;
use serde_json::{json, Value};
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// `meta.json`'s `format`.
pub const FORMAT: &str = "alpha-dataset/1";
/// llm.c's shard header: 256 little-endian int32, the first three magic, version, tokens.
const LLMC_HEADER_BYTES: usize = 256 * 4;
const LLMC_MAGIC: i32 = 20240520;
/// Text read and tokenized at once (then written): bounds `prepare`'s memory.
const BLOCK_BYTES: usize = 32 << 20;

/// Flags of `alpha-native prepare`.
#[derive(Args, Debug, Clone)]
pub struct PrepareArgs {
    /// Input files: UTF-8 text (each file one document) or JSONL (`.jsonl`: one document per
    /// line, its "text" field).
    #[arg(long, value_name = "FILE", num_args = 1.., required = true)]
    pub data: Vec<PathBuf>,
    /// The byte-level BPE tokenizer (tokenizer.json, or a directory with one or with
    /// vocab.json + merges.txt); it must have <|endoftext|>, which ends every document.
    #[arg(long, value_name = "PATH")]
    pub tokenizer: PathBuf,
    /// Output directory: train.bin, val.bin, meta.json.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// The share of the tokens (the last ones) that goes to val.bin (above 0, below 1).
    #[arg(long, default_value_t = 0.1)]
    pub val_fraction: f64,
    /// Tokenizing threads. Default: one per core.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Replace existing train.bin, val.bin and meta.json in --out.
    #[arg(long)]
    pub force: bool,
}

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

    fn parse(name: &str) -> Result<Dtype, String> {
        match name {
            "uint16" => Ok(Dtype::U16),
            "uint32" => Ok(Dtype::U32),
            other => Err(format!("dtype {other:?} is not uint16 or uint32")),
        }
    }
}

/// The token ids of `docs`, each followed by `eot` where given, encoded on `pool`'s threads
/// (each document on one thread, long ones on all: the same ids either way). One document may
/// be a part of a text that `continues` it (see [`Bpe::encode_part`]).
fn encode_documents(bpe: &Bpe, pool: &ThreadPool, docs: &[String], continues: bool, eot: Option<u32>) -> Vec<u32> {
    if let [doc] = docs {
        let mut ids = bpe.encode_part(pool, doc, continues);
        ids.extend(eot);
        return ids;
    }
    let outs: Vec<Mutex<Vec<u32>>> = docs.iter().map(|_| Mutex::new(Vec::new())).collect();
    pool.run(docs.len(), &|i| {
        let mut ids = bpe.encode_to_vec(&docs[i]);
        ids.extend(eot);
        *outs[i].lock().expect("no task panics") = ids;
    });
    outs.into_iter().flat_map(|m| m.into_inner().expect("no task panics")).collect()
}

/// Receives blocks of documents: `(documents, whether the first continues a text, whether
/// the last one ends there)`.
type DocumentSink<'a> = dyn FnMut(&[String], bool, bool) -> Result<(), String> + 'a;

/// Calls `each` with the documents of `path` in blocks of about [`BLOCK_BYTES`], and
/// `progress` with the bytes read. A text file is one document, read in parts cut where
/// `bpe` allows (see [`Bpe::next_cut`]: the parts' ids are the whole text's), the last part
/// ending the document; a stretch with no such place is read whole, however long.
fn read_documents(path: &Path, bpe: &Bpe, progress: &dyn Fn(u64), each: &mut DocumentSink<'_>) -> Result<(), String> {
    let name = path.display();
    let file = open_regular(path).map_err(|e| format!("cannot read data file {name}: {e}"))?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    if path.extension().is_some_and(|e| e == "jsonl") {
        let (mut docs, mut bytes, mut line, mut number) = (Vec::new(), 0, String::new(), 0);
        loop {
            line.clear();
            let n = reader.read_line(&mut line).map_err(|e| format!("data file {name}: line {}: {e}", number + 1))?;
            if n == 0 {
                break;
            }
            number += 1;
            progress(n as u64);
            if line.trim().is_empty() {
                continue;
            }
            let value: Value = serde_json::from_str(&line).map_err(|e| format!("data file {name}: line {number} is not JSON: {}", json_line_error(&e)))?;
            let text = value.get("text").and_then(Value::as_str).ok_or_else(|| format!("data file {name}: line {number} has no \"text\" string"))?;
            bytes += text.len();
            docs.push(text.to_string());
            if bytes >= BLOCK_BYTES {
                each(&docs, false, true)?;
                (docs, bytes) = (Vec::new(), 0);
            }
        }
        return if docs.is_empty() { Ok(()) } else { each(&docs, false, true) };
    }
    let mut pending: Vec<u8> = Vec::new();
    let mut offset = 0u64;
    loop {
        let start = pending.len();
        pending.resize(start + BLOCK_BYTES, 0);
        let n = read_full(&mut reader, &mut pending[start..]).map_err(|e| format!("cannot read data file {name}: {e}"))?;
        pending.truncate(start + n);
        progress(n as u64);
        let at_end = n == 0 || pending.len() < start + BLOCK_BYTES;
        // Valid UTF-8 up to where it is cut: the text's cut before its last newline that a
        // non-space follows; the whole rest at the end.
        let valid = match std::str::from_utf8(&pending) {
            Ok(_) => pending.len(),
            Err(e) if e.error_len().is_none() && !at_end => e.valid_up_to(),
            Err(e) => return Err(format!("data file {name} is not valid UTF-8 (invalid byte at offset {})", offset + e.valid_up_to() as u64)),
        };
        let text = std::str::from_utf8(&pending[..valid]).expect("checked");
        // The bytes kept from before hold no cut: the search starts at their last one.
        let cut = if at_end { text.len() } else { last_cut(bpe, text, start.saturating_sub(1)) };
        if cut > 0 || at_end {
            each(&[text[..cut].to_string()], offset > 0, at_end)?;
            offset += cut as u64;
            pending.drain(..cut);
        }
        if at_end {
            return Ok(());
        }
    }
}

/// What is wrong with one line of JSON, at which column (serde_json's message gives the
/// position within the line it was handed, always line 1); an escaped lone UTF-16 surrogate,
/// which is no character, named as such.
fn json_line_error(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let what = text.rsplit_once(" at line ").map_or(text.as_str(), |(what, _)| what);
    let what = if what.contains("surrogate") || what.contains("end of hex escape") {
        "a \\u escape of a lone UTF-16 surrogate, which is not a character (\\uD800-\\uDFFF come in pairs)"
    } else {
        what
    };
    format!("column {}: {what}", e.column())
}

/// Fills `buf` from `r` as far as the input goes; the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The last place at or after byte `from` where `bpe` may cut `text` (0: none).
fn last_cut(bpe: &Bpe, text: &str, from: usize) -> usize {
    let mut best = 0;
    let mut from = from;
    loop {
        let cut = bpe.next_cut(text, from);
        if cut >= text.len() {
            return best;
        }
        best = cut;
        from = cut + 1;
    }
}

/// Runs `prepare`.
pub fn prepare(args: &PrepareArgs) -> Result<(), String> {
    // `train` evaluates on val.bin: a dataset needs one.
    if !(args.val_fraction.is_finite() && args.val_fraction > 0.0 && args.val_fraction < 1.0) {
        return Err(format!("--val-fraction must be above 0 and below 1 (train evaluates on val.bin), got {}", args.val_fraction));
    }
    let bpe = crate::tokenizer::load(&args.tokenizer)?;
    let eot = bpe.added_id(END_OF_TEXT).ok_or_else(|| format!("tokenizer {} has no {END_OF_TEXT} token to end documents with", args.tokenizer.display()))?;
    let dtype = Dtype::for_vocab(bpe.vocab_size());
    let (train_path, val_path, meta_path) = (args.out.join("train.bin"), args.out.join("val.bin"), args.out.join("meta.json"));
    for p in [&train_path, &val_path, &meta_path] {
        if p.exists() && !args.force {
            return Err(format!("{} exists; pass --force to replace it", p.display()));
        }
        crate::fsutil::check_replaceable(p).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    let total: u64 = args
        .data
        .iter()
        .map(|p| open_regular(p).and_then(|f| f.metadata()).map(|m| m.len()).map_err(|e| format!("cannot read data file {}: {e}", p.display())))
        .sum::<Result<_, _>>()?;
    fs::create_dir_all(&args.out).map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let pool = thread_pool(args.threads)?;
    // Every token goes to one temporary file; its tail becomes val.bin at the end.
    let all_path = args.out.join(format!(".tokens.tmp-{}", std::process::id()));
    // Ctrl-C or SIGTERM stops it after the block it is on, a second one at once: either way
    // the temporary files go and nothing in --out changes.
    let first = "stopping: prepare ends after this block and writes nothing (a second Ctrl-C or SIGTERM stops it at once)";
    let interrupt = Interrupt::install(Some(first.into()))?;
    for temp in [Some(all_path.clone()), temp_path(&val_path)].into_iter().flatten() {
        interrupt.remove_on_stop(temp);
    }
    interrupt.set_kept(format!("nothing was written to {}", args.out.display()));
    let result = (|| {
        let file = fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&all_path);
        let mut all = BufWriter::with_capacity(1 << 22, file.map_err(|e| format!("cannot write {}: {e}", all_path.display()))?);
        let reading = bar(total, "tokenizing {bytes}/{total_bytes} {wide_bar} {elapsed} (eta {eta})");
        let mut tokens = 0u64;
        for path in &args.data {
            read_documents(path, &bpe, &|n| reading.inc(n), &mut |docs, continues, ends| {
                if interrupt.requested() {
                    return Err(format!("interrupted: nothing was written to {}", args.out.display()));
                }
                // A part of a text file that does not end it gets no end-of-text token.
                let ids = encode_documents(&bpe, &pool, docs, continues, ends.then_some(eot));
                tokens += ids.len() as u64;
                write_ids(&mut all, &ids, dtype).map_err(|e| format!("cannot write {}: {e}", all_path.display()))
            })?;
        }
        reading.finish_and_clear();
        let mut all = all.into_inner().map_err(|e| format!("cannot write {}: {}", all_path.display(), e.error()))?;
        let val_tokens = (tokens as f64 * args.val_fraction).round() as u64;
        let train_tokens = tokens - val_tokens;
        if train_tokens == 0 || val_tokens == 0 {
            return Err(format!("the data has {tokens} tokens: too few for a train and a val split"));
        }
        let split_at = train_tokens * dtype.width() as u64;
        copy_tail(&mut all, split_at, &val_path).map_err(|e| format!("cannot write {}: {e}", val_path.display()))?;
        all.set_len(split_at).and_then(|_| all.sync_all()).map_err(|e| format!("cannot write {}: {e}", all_path.display()))?;
        drop(all);
        fs::rename(&all_path, &train_path).map_err(|e| format!("cannot write {}: {e}", train_path.display()))?;
        let spec: Value = serde_json::from_str(&hf::to_tokenizer_json(&bpe)).expect("the writer writes JSON");
        let sources: Vec<String> = args.data.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        let meta = json!({
            "format": FORMAT, "dtype": dtype.name(), "vocab_size": bpe.vocab_size(), "eot": eot,
            "train_tokens": train_tokens, "val_tokens": val_tokens, "sources": sources, "tokenizer": spec,
        });
        write_atomic(&meta_path, format!("{meta:#}\n").as_bytes()).map_err(|e| format!("cannot write {}: {e}", meta_path.display()))?;
        eprintln!("{train_tokens} train and {val_tokens} val tokens ({}) written to {}", dtype.name(), args.out.display());
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&all_path);
    }
    result
}

fn write_ids(w: &mut impl Write, ids: &[u32], dtype: Dtype) -> io::Result<()> {
    let mut bytes = Vec::with_capacity(ids.len() * dtype.width());
    for &id in ids {
        match dtype {
            Dtype::U16 => bytes.extend_from_slice(&(id as u16).to_le_bytes()),
            Dtype::U32 => bytes.extend_from_slice(&id.to_le_bytes()),
        }
    }
    w.write_all(&bytes)
}

/// Writes the bytes of `file` from `from` on to `dest` (atomically).
fn copy_tail(file: &mut File, from: u64, dest: &Path) -> io::Result<()> {
    file.seek(SeekFrom::Start(from))?;
    crate::fsutil::write_atomic_with(dest, |w| io::copy(file, w).map(|_| ()))
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
fn map(path: &Path) -> Result<Mmap, String> {
    let file = open_regular(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    // SAFETY: the map is read-only; a file changed under a running training is the user's
    // doing (as for nanoGPT's np.memmap) and can only change the ids read, which are checked.
    unsafe { Mmap::map(&file) }.map_err(|e| format!("cannot map {}: {e}", path.display()))
}

/// A shard of nanoGPT's layout (ids from byte 0): its size must be whole ids.
fn plain_shard(path: &Path, dtype: Dtype) -> Result<Shard, String> {
    let map = map(path)?;
    if !map.len().is_multiple_of(dtype.width()) {
        return Err(format!("{} has {} bytes, not a whole number of {} ids", path.display(), map.len(), dtype.name()));
    }
    Ok(Shard { map, start: 0 })
}

/// An llm.c shard: header checked, then `uint16` ids.
fn llmc_shard(path: &Path) -> Result<Shard, String> {
    let map = map(path)?;
    let word = |i: usize| i32::from_le_bytes(map[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    if map.len() < LLMC_HEADER_BYTES || word(0) != LLMC_MAGIC {
        return Err(format!("{} is not an llm.c shard (no header with magic {LLMC_MAGIC})", path.display()));
    }
    if word(1) != 1 {
        return Err(format!("{}: llm.c shard version {} is not supported (version 1: uint16 ids)", path.display(), word(1)));
    }
    let count = word(2);
    let body = map.len() - LLMC_HEADER_BYTES;
    if count < 0 || body != 2 * count as usize {
        return Err(format!("{}: the header says {count} tokens, the file holds {} bytes of them", path.display(), body));
    }
    Ok(Shard { map, start: LLMC_HEADER_BYTES })
}

/// Files matching `pattern`, whose file name may hold `*` (any characters), sorted.
fn matching(pattern: &str) -> Result<Vec<PathBuf>, String> {
    let path = Path::new(pattern);
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| format!("--dataset {pattern}: no file name pattern"))?;
    if dir.to_string_lossy().contains('*') {
        return Err(format!("--dataset {pattern}: only the file name may hold *"));
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
    let entries = fs::read_dir(dir).map_err(|e| format!("--dataset {pattern}: cannot read {}: {e}", dir.display()))?;
    let mut found: Vec<PathBuf> =
        entries.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(matches)).collect();
    found.sort();
    Ok(found)
}

/// `tokenizer` (`--tokenizer`, or a resumed checkpoint's), required where the dataset does
/// not record its own.
fn named_tokenizer(tokenizer: Option<Tokenizer>, what: &str) -> Result<Tokenizer, String> {
    tokenizer.ok_or_else(|| format!("{what} does not record its tokenizer: name it with --tokenizer"))
}

/// Opens `--dataset`: a directory (Alpha's `prepare`, or nanoGPT's with `tokenizer`) or a
/// pattern of llm.c train shards, with `tokenizer` where it records none (one it records must
/// equal a given one); checks every id against the vocabulary on `par`'s threads.
pub fn open(spec: &str, tokenizer: Option<Tokenizer>, par: &dyn Parallel) -> Result<Dataset, String> {
    let dir = Path::new(spec);
    let dataset = if spec.contains('*') {
        let train_files = matching(spec)?;
        let val_pattern = spec
            .rsplit_once("train")
            .map(|(a, b)| format!("{a}val{b}"))
            .ok_or_else(|| format!("--dataset {spec}: the pattern must name train shards (\"train\" in it)"))?;
        let val_files = matching(&val_pattern)?;
        if train_files.is_empty() || val_files.is_empty() {
            return Err(format!(
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
            let meta: Value = read_regular_string(&meta_path)
                .map_err(|e| e.to_string())
                .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
                .map_err(|e| format!("{}: {e}", meta_path.display()))?;
            let dtype = Dtype::parse(meta.get("dtype").and_then(Value::as_str).unwrap_or("")).map_err(|e| format!("{}: {e}", meta_path.display()))?;
            let spec_json = meta.get("tokenizer").ok_or_else(|| format!("{} has no tokenizer", meta_path.display()))?;
            let recorded = Tokenizer::from(hf::from_tokenizer_json(&spec_json.to_string()).map_err(|e| format!("{}: tokenizer: {e}", meta_path.display()))?);
            if tokenizer.is_some_and(|t| t != recorded) {
                return Err(format!("dataset {spec} was prepared with another tokenizer than the one given (its meta.json records it)"));
            }
            (dtype, recorded)
        } else {
            (Dtype::U16, named_tokenizer(tokenizer, &format!("dataset {spec} (no meta.json, as nanoGPT's prepare.py writes it)"))?)
        };
        let shard = |name: &str| plain_shard(&dir.join(name), dtype);
        Dataset { train: Split { shards: vec![shard("train.bin")?], dtype }, val: Split { shards: vec![shard("val.bin")?], dtype }, tokenizer }
    } else {
        return Err(format!("--dataset {spec} is neither a directory nor a pattern of llm.c shards"));
    };
    let vocab = dataset.tokenizer.vocab_size();
    if dataset.train.dtype == Dtype::U16 && vocab > 1 << 16 {
        return Err(format!("--dataset {spec} holds uint16 ids, but the tokenizer has {vocab} tokens: ids past 65535 cannot be stored (prepare it again)"));
    }
    for (name, split) in [("train", &dataset.train), ("val", &dataset.val)] {
        if split.is_empty() {
            return Err(format!("--dataset {spec}: the {name} split is empty"));
        }
        if let Some((id, at)) = first_out_of_vocab(&split.segments(), vocab, par) {
            return Err(format!("--dataset {spec}: the {name} split holds token id {id} at token {at}, past the tokenizer's {vocab} tokens"));
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
