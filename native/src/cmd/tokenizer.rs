//! `alpha-native tokenizer train | encode | decode | info | bench`: byte-level BPE tokenizers, as
//! Hugging Face `tokenizers` reads and writes them (see `alpha_core::tokenizer::bpe`).

use crate::corpus::read_text;
use crate::device::thread_pool;
use crate::fsutil::write_atomic;
use crate::tokenizer::{bar, load};
use alpha_core::tokenizer::bpe::{Alphabet, Bpe, END_OF_TEXT};
use alpha_core::tokenizer::byte_level::byte_char;
use alpha_core::tokenizer::hf;
use alpha_core::tokenizer::train::{check_request, train, WordCounts};
use anyhow::{anyhow, Result};
use clap::{Args, Subcommand};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Instant;

/// The tokenizer subcommands.
#[derive(Subcommand, Debug, Clone)]
pub enum TokenizerCommand {
    /// Learn a byte-level BPE tokenizer from text and write it as a Hugging Face tokenizer.json.
    Train(TrainArgs),
    /// Print the ids of a text as one JSON line: {"ids": [...]}.
    Encode(EncodeArgs),
    /// Print the text of ids read from stdin: a line {"ids": [...]}, a JSON array, or ids
    /// separated by spaces or commas.
    Decode(TokenizerArg),
    /// Show a tokenizer: vocabulary size, merges, special tokens, and how it splits a sample.
    Info(TokenizerArg),
    /// Measure single-thread encoding speed on a text: one JSON line with the median of the
    /// rounds (scripts/compare_tokenizers.py runs it beside tiktoken and tokenizers).
    Bench(BenchArgs),
}

/// Flags of `tokenizer bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// The tokenizer and the text.
    #[command(flatten)]
    pub encode: EncodeArgs,
    /// Timed encodings of the whole text (1 to 10000).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub rounds: u32,
}

/// Flags of `tokenizer train`.
#[derive(Args, Debug, Clone)]
pub struct TrainArgs {
    /// UTF-8 text files to learn from.
    #[arg(long, value_name = "FILE", num_args = 1.., required = true)]
    pub data: Vec<PathBuf>,
    /// Tokens in the vocabulary: the special tokens, the 256 bytes, and the merges learned.
    #[arg(long)]
    pub vocab_size: usize,
    /// Where to write the tokenizer.json.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// A special token (repeat for several); they take the first ids.
    #[arg(long = "special", value_name = "TOKEN", default_values_t = [END_OF_TEXT.to_string()])]
    pub specials: Vec<String>,
    /// Threads that count the text's pieces. Default: one per core.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Replace an existing --out file.
    #[arg(long)]
    pub force: bool,
}

/// Flags of `tokenizer encode`.
#[derive(Args, Debug, Clone)]
pub struct EncodeArgs {
    /// The tokenizer (see `--tokenizer` of `tokenizer info`).
    #[command(flatten)]
    pub tokenizer: TokenizerArg,
    /// The UTF-8 text to encode. Default: standard input.
    #[arg(long, value_name = "FILE")]
    pub text: Option<PathBuf>,
    /// Without the special tokens the tokenizer's post-processor puts around a text (Llama 3's
    /// <|begin_of_text|>); by default they are added, as `tokenizers` encodes.
    #[arg(long)]
    pub no_special_tokens: bool,
}

/// The tokenizer a command reads.
#[derive(Args, Debug, Clone)]
pub struct TokenizerArg {
    /// A Hugging Face tokenizer.json, or a directory holding one or GPT-2's vocab.json and
    /// merges.txt.
    #[arg(long, value_name = "PATH")]
    pub tokenizer: PathBuf,
}

/// Runs a tokenizer subcommand.
pub fn run(command: &TokenizerCommand) -> Result<()> {
    match command {
        TokenizerCommand::Train(args) => run_train(args),
        TokenizerCommand::Encode(args) => {
            let bpe = load(&args.tokenizer.tokenizer)?;
            let text = match &args.text {
                Some(path) => read_text(path, "text file")?,
                None => read_stdin()?,
            };
            let ids = if args.no_special_tokens { bpe.encode_to_vec(&text) } else { bpe.encode_with_special_tokens(&text) };
            let mut out = std::io::stdout().lock();
            let line = serde_json::json!({ "ids": ids }).to_string();
            writeln!(out, "{line}").and_then(|_| out.flush()).map_err(|e| anyhow!("cannot write to stdout: {e}"))
        }
        TokenizerCommand::Decode(args) => {
            let bpe = load(&args.tokenizer)?;
            let ids = parse_ids(&read_stdin()?)?;
            let bytes = bpe.decode(&ids)?;
            let mut out = std::io::stdout().lock();
            out.write_all(&bytes).and_then(|_| out.flush()).map_err(|e| anyhow!("cannot write to stdout: {e}"))
        }
        TokenizerCommand::Info(args) => {
            let bpe = load(&args.tokenizer)?;
            let mut out = std::io::stdout().lock();
            out.write_all(describe(&bpe).as_bytes()).and_then(|_| out.flush()).map_err(|e| anyhow!("cannot write to stdout: {e}"))
        }
        TokenizerCommand::Bench(args) => {
            let bpe = load(&args.encode.tokenizer.tokenizer)?;
            let text = match &args.encode.text {
                Some(path) => read_text(path, "text file")?,
                None => read_stdin()?,
            };
            let mut ids = Vec::with_capacity(text.len() / 2);
            let mut seconds: Vec<f64> = (0..args.rounds)
                .map(|_| {
                    ids.clear();
                    let started = Instant::now();
                    bpe.encode(&text, &mut ids);
                    started.elapsed().as_secs_f64()
                })
                .collect();
            seconds.sort_by(f64::total_cmp);
            let median = seconds[seconds.len() / 2];
            let line = serde_json::json!({ "bytes": text.len(), "tokens": ids.len(), "seconds": median, "mb_per_s": text.len() as f64 / median / 1e6 });
            println!("{line}");
            Ok(())
        }
    }
}

fn read_stdin() -> Result<String> {
    let mut bytes = Vec::new();
    std::io::stdin().read_to_end(&mut bytes).map_err(|e| anyhow!("cannot read standard input: {e}"))?;
    String::from_utf8(bytes).map_err(|e| anyhow!("standard input is not valid UTF-8 (invalid byte at offset {})", e.utf8_error().valid_up_to()))
}

/// Ids from `{"ids": [...]}`, `[...]`, or numbers separated by spaces or commas. An id that
/// is not one is named as the input writes it (`1e23`, not the float it parses to).
fn parse_ids(input: &str) -> Result<Vec<u32>> {
    use serde_json::value::RawValue;
    let trimmed = input.trim();
    let items: Vec<&str> = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        let list: Vec<&RawValue> = if trimmed.starts_with('{') {
            let fields: std::collections::BTreeMap<String, &RawValue> =
                serde_json::from_str(trimmed).map_err(|e| anyhow!("the input is not valid JSON: {e}"))?;
            let ids = fields.get("ids").ok_or_else(|| anyhow!("the input's JSON object has no \"ids\" array"))?;
            serde_json::from_str(ids.get()).map_err(|_| anyhow!("the input's \"ids\" is not an array"))?
        } else {
            serde_json::from_str(trimmed).map_err(|e| anyhow!("the input is not valid JSON: {e}"))?
        };
        list.into_iter().map(RawValue::get).collect()
    } else {
        trimmed.split(|c: char| c.is_whitespace() || c == ',').filter(|s| !s.is_empty()).collect()
    };
    items
        .iter()
        .map(|item| {
            // A JSON string of digits is an id too ("5"), as bare words are.
            let digits = serde_json::from_str::<String>(item).ok();
            digits.as_deref().unwrap_or(item).parse::<u32>().map_err(|_| anyhow!("{item} is not a token id (a whole number from 0 to {})", u32::MAX))
        })
        .collect()
}

/// Added tokens `tokenizer info` lists (the first ones).
const SHOWN_ADDED: usize = 20;

/// The text of `tokenizer info`: tokens shown as in vocabulary files (bytes in GPT-2's
/// byte-level alphabet: `Ġ` a space, `Ċ` a newline).
pub fn describe(bpe: &Bpe) -> String {
    let o = bpe.options();
    let added = bpe.added_tokens();
    let mut specials: Vec<String> = added.iter().take(SHOWN_ADDED).map(|a| format!("{} = {:?}", a.id, a.content)).collect();
    if added.len() > SHOWN_ADDED {
        specials.push(format!("and {} more", added.len() - SHOWN_ADDED));
    }
    let sample = "Hello world! It's 2026,  naïve café 東京 🦀<|endoftext|>\n";
    let ids = bpe.encode_to_vec(sample);
    let tokens: Vec<String> = ids
        .iter()
        .map(|&id| match bpe.added_tokens().iter().find(|a| a.id == id) {
            Some(a) => a.content.clone(),
            None => match bpe.alphabet() {
                Alphabet::Bytes => bpe.token_text(id).unwrap_or_default().iter().map(|&b| byte_char(b)).collect(),
                Alphabet::Chars { .. } => String::from_utf8_lossy(bpe.token_text(id).unwrap_or_default()).into_owned(),
            },
        })
        .collect();
    let name = |id: &u32| bpe.added_tokens().iter().find(|a| a.id == *id).map_or_else(|| id.to_string(), |a| a.content.clone());
    let pipeline = match bpe.pipeline() {
        None => "GPT-2's (the ByteLevel pre-tokenizer alone)".to_string(),
        Some(p) => {
            let (before, after) = bpe.special_tokens_around();
            format!(
                "normalizers {:?}; pre-tokenizers {:?} before ByteLevel; special tokens around a text: {:?} before, {:?} after",
                p.normalizers,
                p.stages,
                before.iter().map(name).collect::<Vec<_>>(),
                after.iter().map(name).collect::<Vec<_>>()
            )
        }
    };
    format!(
        "{} BPE: {} tokens, {} merges\nadded tokens: {}\noptions: add_prefix_space {}, use_regex {}, ignore_merges {}\npipeline: {pipeline}\nsample: {sample:?}\ntokens: {tokens:?}\nids: {ids:?}\n",
        if bpe.alphabet() == Alphabet::Bytes { "byte-level" } else { "SentencePiece-style" },
        bpe.vocab_size(),
        bpe.merges().len(),
        if specials.is_empty() { "none".to_string() } else { specials.join(", ") },
        o.add_prefix_space,
        o.use_regex,
        o.ignore_merges,
    )
}

fn run_train(args: &TrainArgs) -> Result<()> {
    if !args.force && args.out.exists() {
        return Err(anyhow!("--out {} exists; pass --force to replace it", args.out.display()));
    }
    crate::fsutil::check_replaceable(&args.out).map_err(|e| anyhow!("--out {}: {e}", args.out.display()))?;
    let pool = thread_pool(args.threads)?;
    let specials: Vec<&str> = args.specials.iter().map(String::as_str).collect();
    check_request(args.vocab_size, &specials)?;
    let started = Instant::now();
    let mut words = WordCounts::new();
    let counting = bar(args.data.len() as u64, "counting {pos}/{len} files {wide_bar} {elapsed}");
    for path in &args.data {
        let text = read_text(path, "data file")?;
        words.add(&pool, &text, &specials)?;
        counting.inc(1);
    }
    counting.finish_and_clear();
    let merging = bar(0, "merging {pos}/{len} {wide_bar} {elapsed} (eta {eta})");
    let bpe = train(&words, args.vocab_size, &specials, &mut |done, of| {
        merging.set_length(of as u64);
        merging.set_position(done as u64);
    })?;
    merging.finish_and_clear();
    write_atomic(&args.out, hf::to_tokenizer_json(&bpe).as_bytes()).map_err(|e| anyhow!("cannot write {}: {e}", args.out.display()))?;
    eprintln!(
        "{} tokens ({} merges) from {} distinct pieces in {:.2} s; written to {}",
        bpe.vocab_size(),
        bpe.merges().len(),
        words.len(),
        started.elapsed().as_secs_f64(),
        args.out.display()
    );
    Ok(())
}
