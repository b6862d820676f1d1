//! `alpha-native`: train, sample, evaluate and benchmark GPT language models on the CPU.

use alpha_native::{bench, dataset, eval, export, info, report, runfile, sample, tokenizer, train};
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Huge pages for the arenas (see the module).
#[global_allocator]
static ALLOCATOR: alpha_native::hugepages::HugePageAlloc = alpha_native::hugepages::HugePageAlloc;

/// Alpha: train small GPT language models fast.
#[derive(Parser, Debug)]
#[command(name = "alpha-native", version, about, long_about = None, args_override_self = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Train a GPT (default: nanoGPT's Shakespeare-char CPU run on the embedded corpus).
    Train(Box<train::TrainArgs>),
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
    Prepare(dataset::PrepareArgs),
    /// Train, apply and inspect byte-level BPE tokenizers (Hugging Face tokenizer.json).
    #[command(subcommand)]
    Tokenizer(tokenizer::TokenizerCommand),
}

/// Exits with a command-line error as one line (`error: ...`, status 2), or prints what was
/// asked for (help, version) and exits 0.
fn exit_with(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand) {
        e.exit();
    }
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("error: invalid arguments");
    eprintln!("{first} (see --help)");
    std::process::exit(2);
}

fn main() {
    let command = Cli::command();
    let train = command.find_subcommand("train").expect("the train subcommand exists");
    let args = runfile::expand(std::env::args_os().collect(), train).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2);
    });
    let matches = Cli::command().try_get_matches_from(args).unwrap_or_else(|e| exit_with(e));
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| exit_with(e));
    let result = match &cli.command {
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
        Command::Prepare(args) => dataset::prepare(args),
        Command::Export(args) => export::run(args),
    };
    if let Err(msg) = result {
        eprintln!("error: {msg}");
        std::process::exit(1);
    }
}
