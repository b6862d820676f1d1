//! `alpha-native export`: a checkpoint (or any model `--checkpoint` reads) in another
//! framework's layout; today Hugging Face `transformers`' (see [`crate::hf_model::save`]).

use crate::checkpoint;
use anyhow::{anyhow, Result};
use clap::{Args, ValueEnum};
use std::path::PathBuf;

/// Layouts `export` writes.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A Hugging Face GPT-2 directory: config.json, model.safetensors, tokenizer.json, ...
    Hf,
}

/// Flags of `alpha-native export`.
#[derive(Args, Debug, Clone)]
pub struct ExportArgs {
    /// The model: an Alpha checkpoint, a Hugging Face GPT-2 directory, or a cached model name.
    #[arg(long, value_name = "FILE|DIR|NAME")]
    pub checkpoint: PathBuf,
    /// The layout to write.
    #[arg(long, value_enum, default_value_t = Format::Hf)]
    pub format: Format,
    /// The directory to write.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Write into an --out directory that already has files (those of the export are replaced).
    #[arg(long)]
    pub force: bool,
}

/// Runs `export`.
pub fn run(args: &ExportArgs) -> Result<()> {
    if args.out.exists() && !args.out.is_dir() {
        return Err(anyhow!("--out {} exists and is not a directory", args.out.display()));
    }
    if !args.force && std::fs::read_dir(&args.out).is_ok_and(|mut d| d.next().is_some()) {
        return Err(anyhow!("--out {} is not empty; pass --force to write into it", args.out.display()));
    }
    let ck = checkpoint::load_weights(&args.checkpoint)?;
    match args.format {
        Format::Hf => crate::hf_model::save(&ck, &args.out)?,
    }
    eprintln!("{} ({} parameters, {} tokenizer) written to {}", args.checkpoint.display(), ck.params.len(), ck.tokenizer.kind(), args.out.display());
    Ok(())
}
