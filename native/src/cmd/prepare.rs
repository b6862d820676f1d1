//! `alpha-native prepare`: tokenizes text files or JSONL (one document per line, its `text`
//! field) into nanoGPT's layout: `train.bin` and `val.bin` (little-endian token ids, `uint16`
//! where the vocabulary fits, else `uint32`) and `meta.json` (the tokenizer, the dtype, the
//! token counts), streaming, on all threads, with the same bytes for any thread count.

use crate::dataset::{Dtype, FORMAT};
use crate::device::thread_pool;
use crate::fsutil::{open_regular, temp_path, write_atomic};
use crate::interrupt::Interrupt;
use crate::tokenizer::bar;
use alpha_core::parallel::{Parallel, ThreadPool};
use alpha_core::tokenizer::bpe::{Bpe, END_TOKENS};
use alpha_core::tokenizer::hf;
use anyhow::{anyhow, Result};
use clap::Args;
use serde_json::{json, Value};
use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

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

/// The token ids of `docs` as `tokenizers` encodes each with its special tokens (Llama 3's
/// BOS before it; none for GPT-2's), each followed by `eot` (unless those tokens end with
/// it), encoded on `pool`'s threads (each document on one thread, long ones on all: the same
/// ids either way). The first document may be a part of a text that `continues` it (see
/// [`Bpe::encode_part`]; no special tokens before it then), the last one a part that does not
/// end it unless `ends` (nothing after it then).
fn encode_documents(bpe: &Bpe, pool: &ThreadPool, docs: &[String], continues: bool, ends: bool, eot: u32) -> Vec<u32> {
    let (before, after) = bpe.special_tokens_around();
    let last = docs.len().saturating_sub(1);
    let around = |i: usize, ids: Vec<u32>| {
        let mut out = if i > 0 || !continues { before.to_vec() } else { Vec::new() };
        out.extend(ids);
        if i < last || ends {
            out.extend_from_slice(after);
            if after.last() != Some(&eot) {
                out.push(eot);
            }
        }
        out
    };
    if let [doc] = docs {
        return around(0, bpe.encode_part(pool, doc, continues));
    }
    let outs: Vec<Mutex<Vec<u32>>> = docs.iter().map(|_| Mutex::new(Vec::new())).collect();
    pool.run(docs.len(), &|i| {
        *outs[i].lock().expect("no task panics") = around(i, bpe.encode_to_vec(&docs[i]));
    });
    outs.into_iter().flat_map(|m| m.into_inner().expect("no task panics")).collect()
}

/// How `prepare` encodes a document with `bpe`, for its last line.
fn documents_line(bpe: &Bpe, eot_name: &str) -> String {
    let name = |ids: &[u32]| ids.iter().map(|&id| String::from_utf8_lossy(bpe.token_bytes(id).unwrap_or_default()).into_owned()).collect::<Vec<_>>().join("");
    match bpe.special_tokens_around() {
        ([], []) => format!("its ids, then {eot_name}"),
        (before, after) => format!("its ids with the tokenizer's special tokens ({:?} before, {:?} after), then {eot_name}", name(before), name(after)),
    }
}

/// Receives blocks of documents: `(documents, whether the first continues a text, whether
/// the last one ends there)`.
type DocumentSink<'a> = dyn FnMut(&[String], bool, bool) -> Result<()> + 'a;

/// Calls `each` with the documents of `path` in blocks of about [`BLOCK_BYTES`], and
/// `progress` with the bytes read. A text file is one document, read in parts cut where
/// `bpe` allows (see [`Bpe::next_cut`]: the parts' ids are the whole text's), the last part
/// ending the document; a stretch with no such place is read whole, however long.
fn read_documents(path: &Path, bpe: &Bpe, progress: &dyn Fn(u64), each: &mut DocumentSink<'_>) -> Result<()> {
    let name = path.display();
    let file = open_regular(path).map_err(|e| anyhow!("cannot read data file {name}: {e}"))?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    if path.extension().is_some_and(|e| e == "jsonl") {
        let (mut docs, mut bytes, mut line, mut number) = (Vec::new(), 0, String::new(), 0);
        loop {
            line.clear();
            let n = reader.read_line(&mut line).map_err(|e| anyhow!("data file {name}: line {}: {e}", number + 1))?;
            if n == 0 {
                break;
            }
            number += 1;
            progress(n as u64);
            if line.trim().is_empty() {
                continue;
            }
            let value: Value = serde_json::from_str(&line).map_err(|e| anyhow!("data file {name}: line {number} is not JSON: {}", json_line_error(&e)))?;
            let text = value.get("text").and_then(Value::as_str).ok_or_else(|| anyhow!("data file {name}: line {number} has no \"text\" string"))?;
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
        let n = read_full(&mut reader, &mut pending[start..]).map_err(|e| anyhow!("cannot read data file {name}: {e}"))?;
        pending.truncate(start + n);
        progress(n as u64);
        let at_end = n == 0 || pending.len() < start + BLOCK_BYTES;
        // Valid UTF-8 up to where it is cut: the text's cut before its last newline that a
        // non-space follows; the whole rest at the end.
        let valid = match std::str::from_utf8(&pending) {
            Ok(_) => pending.len(),
            Err(e) if e.error_len().is_none() && !at_end => e.valid_up_to(),
            Err(e) => return Err(anyhow!("data file {name} is not valid UTF-8 (invalid byte at offset {})", offset + e.valid_up_to() as u64)),
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
pub fn run(args: &PrepareArgs) -> Result<()> {
    // `train` evaluates on val.bin: a dataset needs one.
    if !(args.val_fraction.is_finite() && args.val_fraction > 0.0 && args.val_fraction < 1.0) {
        return Err(anyhow!("--val-fraction must be above 0 and below 1 (train evaluates on val.bin), got {}", args.val_fraction));
    }
    let bpe = crate::tokenizer::load(&args.tokenizer)?;
    let (eot_name, eot) =
        bpe.end_of_text().ok_or_else(|| anyhow!("tokenizer {} has none of {END_TOKENS:?} to end documents with", args.tokenizer.display()))?;
    let dtype = Dtype::for_vocab(bpe.vocab_size());
    let (train_path, val_path, meta_path) = (args.out.join("train.bin"), args.out.join("val.bin"), args.out.join("meta.json"));
    for p in [&train_path, &val_path, &meta_path] {
        if p.exists() && !args.force {
            return Err(anyhow!("{} exists; pass --force to replace it", p.display()));
        }
        crate::fsutil::check_replaceable(p).map_err(|e| anyhow!("{}: {e}", p.display()))?;
    }
    let total: u64 = args
        .data
        .iter()
        .map(|p| open_regular(p).and_then(|f| f.metadata()).map(|m| m.len()).map_err(|e| anyhow!("cannot read data file {}: {e}", p.display())))
        .sum::<Result<_, _>>()?;
    fs::create_dir_all(&args.out).map_err(|e| anyhow!("cannot create {}: {e}", args.out.display()))?;
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
        let mut all = BufWriter::with_capacity(1 << 22, file.map_err(|e| anyhow!("cannot write {}: {e}", all_path.display()))?);
        let reading = bar(total, "tokenizing {bytes}/{total_bytes} {wide_bar} {elapsed} (eta {eta})");
        let mut tokens = 0u64;
        for path in &args.data {
            read_documents(path, &bpe, &|n| reading.inc(n), &mut |docs, continues, ends| {
                if interrupt.requested() {
                    return Err(anyhow!("interrupted: nothing was written to {}", args.out.display()));
                }
                // A part of a text file that does not end it gets no end-of-text token.
                let ids = encode_documents(&bpe, &pool, docs, continues, ends, eot);
                tokens += ids.len() as u64;
                write_ids(&mut all, &ids, dtype).map_err(|e| anyhow!("cannot write {}: {e}", all_path.display()))
            })?;
        }
        reading.finish_and_clear();
        let mut all = all.into_inner().map_err(|e| anyhow!("cannot write {}: {}", all_path.display(), e.error()))?;
        let val_tokens = (tokens as f64 * args.val_fraction).round() as u64;
        let train_tokens = tokens - val_tokens;
        if train_tokens == 0 || val_tokens == 0 {
            return Err(anyhow!("the data has {tokens} tokens: too few for a train and a val split"));
        }
        let split_at = train_tokens * dtype.width() as u64;
        copy_tail(&mut all, split_at, &val_path).map_err(|e| anyhow!("cannot write {}: {e}", val_path.display()))?;
        all.set_len(split_at).and_then(|_| all.sync_all()).map_err(|e| anyhow!("cannot write {}: {e}", all_path.display()))?;
        drop(all);
        fs::rename(&all_path, &train_path).map_err(|e| anyhow!("cannot write {}: {e}", train_path.display()))?;
        let spec: Value = serde_json::from_str(&hf::to_tokenizer_json(&bpe)).expect("the writer writes JSON");
        let sources: Vec<String> = args.data.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        let meta = json!({
            "format": FORMAT, "dtype": dtype.name(), "vocab_size": bpe.vocab_size(), "eot": eot, "eot_token": eot_name,
            "train_tokens": train_tokens, "val_tokens": val_tokens, "sources": sources, "tokenizer": spec,
        });
        write_atomic(&meta_path, format!("{meta:#}\n").as_bytes()).map_err(|e| anyhow!("cannot write {}: {e}", meta_path.display()))?;
        eprintln!("{train_tokens} train and {val_tokens} val tokens ({}) written to {}", dtype.name(), args.out.display());
        eprintln!("each document: {}", documents_line(&bpe, eot_name));
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
