//! The command line: `alpha-native`'s subcommands, parsed by clap, and its errors as one line.

use crate::cmd::{bench, eval, export, info, prepare, report, sample, tokenizer, train};
use crate::run::args::TrainArgs;
use crate::runfile;
use anyhow::Result;
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::ffi::OsString;

/// Alpha: train small GPT language models fast.
#[derive(Parser, Debug)]
#[command(name = "alpha-native", version, about, long_about = None, args_override_self = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Train a GPT (default: nanoGPT's Shakespeare-char CPU run on the embedded corpus).
    Train(Box<TrainArgs>),
    /// Generate text from a checkpoint.
    Sample(sample::SampleArgs),
    /// Print the mean cross-entropy of a checkpoint on a text file as one JSON line.
    Eval(eval::EvalArgs),
    /// Measure steady-state training throughput, its phases, GFLOP/s and MFU.
    Bench(bench::BenchArgs),
    /// Show the machine (CPU, SIMD, peak) and what a configuration needs (memory, time).
    Info(info::InfoArgs),
    /// Write a run's metrics (and trace) as one self-contained HTML report with charts.
    Report(report::ReportArgs),
    /// Write a model as a Hugging Face GPT-2 directory (transformers' from_pretrained loads it).
    Export(export::ExportArgs),
    /// Tokenize text or JSONL into a dataset for `train --dataset` (nanoGPT's train.bin/val.bin).
    Prepare(prepare::PrepareArgs),
    /// Train, apply and inspect byte-level BPE tokenizers (Hugging Face tokenizer.json).
    #[command(subcommand)]
    Tokenizer(tokenizer::TokenizerCommand),
}

impl Command {
    /// The flags choosing where the command runs, where it has them.
    fn device_mut(&mut self) -> Option<&mut crate::device::DeviceArgs> {
        match self {
            Command::Train(a) => Some(&mut a.device),
            Command::Sample(a) => Some(&mut a.device),
            Command::Eval(a) => Some(&mut a.device),
            Command::Bench(a) => Some(&mut a.device),
            Command::Info(a) => Some(&mut a.device),
            Command::Report(_) | Command::Export(_) | Command::Prepare(_) | Command::Tokenizer(_) => None,
        }
    }
}

/// The whole command line's definition: every subcommand, each of whose values may be a
/// negative number (`--temperature -1` is the value -1, which the command then judges).
pub fn command() -> clap::Command {
    fn negatives_are_values(command: clap::Command) -> clap::Command {
        command.mut_args(|a| if a.get_action().takes_values() { a.allow_negative_numbers(true) } else { a }).mut_subcommands(negatives_are_values)
    }
    negatives_are_values(Cli::command())
}

/// A command-line error as one line (`error: ...`), naming the arguments it is about.
fn one_line(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() == ErrorKind::MissingRequiredArgument {
        if let Some(ContextValue::Strings(names)) = e.get(ContextKind::InvalidArg) {
            return format!("error: the following required arguments were not provided: {} (see --help)", names.join(", "));
        }
    }
    let text = e.to_string();
    format!("{} (see --help)", text.lines().next().unwrap_or("error: invalid arguments"))
}

/// Checks `ALPHA_CPU_MASK` (alpha_core::simd::masked): every name one of the features it can
/// mask, so that a misspelt one is an error rather than a kernel silently not masked.
fn check_cpu_mask() -> Result<()> {
    let maskable = alpha_core::simd::MASKABLE;
    match alpha_core::simd::masked_names().find(|f| !maskable.contains(f)) {
        Some(unknown) => Err(anyhow::anyhow!("ALPHA_CPU_MASK names {unknown:?}, not a CPU feature it can mask ({})", maskable.join(", "))),
        None => Ok(()),
    }
}

/// Parses `args` (a whole command line, the program's name first) and runs the command:
/// `Err` holds a command's error (for `error: ...` and exit status 1). A command-line error
/// exits at once with one line and status 2; help and the version are printed, status 0.
pub fn run(args: Vec<OsString>) -> Result<()> {
    use clap::error::ErrorKind;
    let exit_with = |e: clap::Error| -> ! {
        if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand) {
            e.exit();
        }
        eprintln!("{}", one_line(&e));
        std::process::exit(2);
    };
    let definition = command();
    let train = definition.find_subcommand("train").expect("the train subcommand exists");
    let args = runfile::expand(args, train).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2);
    });
    let matches = command().try_get_matches_from(args).unwrap_or_else(|e| exit_with(e));
    check_cpu_mask()?;
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| exit_with(e));
    if let Some(device) = cli.command.device_mut() {
        device.resolve();
    }
    match &cli.command {
        Command::Train(args) => {
            let sub = matches.subcommand_matches("train").expect("the train subcommand matched");
            let explicit = |id: &str| sub.value_source(id) == Some(ValueSource::CommandLine);
            train::run(args, &explicit)
        }
        Command::Sample(args) => sample::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Info(args) => info::run(args),
        Command::Report(args) => report::run(args),
        Command::Tokenizer(command) => tokenizer::run(command),
        Command::Prepare(args) => prepare::run(args),
        Command::Export(args) => export::run(args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_arguments_are_named_on_one_line() {
        let e = command().try_get_matches_from(["alpha-native", "eval", "--checkpoint", "x"]).unwrap_err();
        let line = one_line(&e);
        assert!(line.contains("--text <FILE>") && !line.contains('\n'), "{line}");
    }

    #[test]
    fn negative_numbers_are_values() {
        let m = command().try_get_matches_from(["alpha-native", "sample", "--checkpoint", "x", "--temperature", "-1"]).unwrap();
        let sample = m.subcommand_matches("sample").unwrap();
        assert_eq!(sample.get_one::<f64>("temperature"), Some(&-1.0));
    }
}
