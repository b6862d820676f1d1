//! Run files: `alpha-native train --config FILE|PRESET` reads a TOML file whose keys are
//! train's flags (`_` for `-`), as nanoGPT's `config/*.py` files set its globals; flags given
//! on the command line override the file's. The presets (`alpha_core::run::PRESETS`, the
//! repository's `config/`) are run files built into the binary. Each run writes its resolved
//! configuration, a run file that repeats it, beside its checkpoint.

use crate::corpus;
use crate::run::args::{fields_in_order, TrainArgs};
use alpha_core::run::{preset, PRESETS};
use alpha_core::settings::RunSettings;
use anyhow::{anyhow, Result};
use serde_json::Value;
use std::ffi::OsString;
use std::path::Path;

/// Name of the resolved run file beside the checkpoint.
pub const RUN_FILE: &str = "run.toml";

/// `args` (a whole command line) with the keys of the run file that train's `--config` names
/// inserted as flags right after the subcommand, so that the command line's own flags, which
/// come later, override them. Other command lines come back as they are.
pub fn expand(args: Vec<OsString>, train: &clap::Command) -> Result<Vec<OsString>> {
    // The subcommand comes first: the program takes no options of its own before it.
    let sub = 1;
    if args.get(sub).is_none_or(|a| a != "train") {
        return Ok(args);
    }
    let mut config = None;
    for (i, a) in args.iter().enumerate().skip(sub + 1) {
        match a.to_str() {
            Some("--config") => config = Some(args.get(i + 1).ok_or_else(|| anyhow!("--config needs a file or a preset name"))?.clone()),
            Some(s) if s.starts_with("--config=") => config = Some(OsString::from(&s["--config=".len()..])),
            Some("--") => break,
            _ => {}
        }
    }
    let Some(config) = config else { return Ok(args) };
    let (name, text) = read(Path::new(&config))?;
    let flags = flags_of(&name, &text, train)?;
    let mut out = args[..=sub].to_vec();
    out.extend(flags);
    out.extend_from_slice(&args[sub + 1..]);
    Ok(out)
}

/// The run file `config` names: a file, else a preset; its name for messages and its text.
fn read(config: &Path) -> Result<(String, String)> {
    if config.exists() {
        let text = crate::fsutil::read_regular_string(config).map_err(|e| anyhow!("cannot read run file {}: {e}", config.display()))?;
        return Ok((config.display().to_string(), text));
    }
    let name = config.to_string_lossy();
    match preset(&name) {
        Some(p) => Ok((format!("preset {name}"), p.toml.to_string())),
        None => {
            let names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
            Err(anyhow!("--config {name}: no such file, nor a preset ({})", names.join(", ")))
        }
    }
}

/// The flags the run file `text` sets, checked against `train`'s arguments.
fn flags_of(name: &str, text: &str, train: &clap::Command) -> Result<Vec<OsString>> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| anyhow!("{name}: {}", e.message()))?;
    let mut flags = Vec::new();
    for (key, value) in table {
        let long = key.replace('_', "-");
        let arg = train.get_arguments().find(|a| a.get_long() == Some(long.as_str()) && long != "config");
        let Some(arg) = arg else { return Err(anyhow!("{name}: `{key}` is not a flag of alpha-native train (see train --help)")) };
        let switch = matches!(arg.get_action(), clap::ArgAction::SetTrue);
        let text = match value {
            toml::Value::Boolean(true) if switch => None,
            toml::Value::Boolean(false) if switch => continue,
            toml::Value::String(s) if !switch => Some(s),
            toml::Value::Integer(i) if !switch => Some(i.to_string()),
            toml::Value::Float(f) if !switch => Some(f.to_string()),
            other => {
                let want = if switch { "true or false" } else { "a number or a string" };
                return Err(anyhow!("{name}: `{key}` must be {want}, not {}", other.type_str()));
            }
        };
        flags.push(OsString::from(match text {
            Some(v) => format!("--{long}={v}"),
            None => format!("--{long}"),
        }));
    }
    Ok(flags)
}

/// A run file setting `entries` (keys and their values, already in TOML) after `header`
/// (comment lines).
pub fn write(header: &str, entries: &[(impl AsRef<str>, String)]) -> String {
    let mut out = header.to_string();
    for (key, value) in entries {
        out.push_str(&format!("{} = {value}\n", key.as_ref()));
    }
    out
}

/// `s` as a TOML basic string (JSON's escapes are TOML's).
pub fn string(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// The first line of every run file a run writes (the mark that it may replace it).
pub const RUN_FILE_HEADER: &str = "# The resolved configuration of the run in this directory: `alpha-native train --config\n# THIS_FILE --out NEW_DIR` repeats it; keys are train's flags with `_` for `-`.\n";

/// The run file that repeats this run (`train --config DIR/run.toml`): its model, settings,
/// cadence and backend as resolved from the defaults, --config, the checkpoint resumed and the
/// flags; on a GPU (`gpu`), the precision and tensor-core use it resolved to, so that a repeat
/// on another device runs the same arithmetic or says why it cannot; likewise on a CUDA
/// device (`cuda`).
pub fn resolved(args: &TrainArgs, s: &RunSettings, gpu: Option<&alpha_gpu::Gpu>, cuda: Option<&crate::engine::CudaOpened>) -> String {
    let mut entries: Vec<(String, String)> = Vec::new();
    if s.data != corpus::EMBEDDED {
        entries.push((if s.dataset { "dataset" } else { "data" }.into(), string(&s.data)));
    }
    entries.extend(args.model.tokenizer.as_ref().map(|t| ("tokenizer".into(), string(&t.to_string_lossy()))));
    entries.extend(args.init_from.as_ref().map(|p| ("init_from".into(), string(&p.to_string_lossy()))));
    // Every setting but the data (above) under its flag's name, in the settings' order.
    for (key, value) in fields_in_order(s).into_iter().filter(|(k, _)| k != "data" && k != "dataset") {
        let value = match value {
            Value::String(s) => string(&s),
            Value::Number(n) if !n.is_f64() => n.to_string(),
            Value::Number(n) => format!("{:?}", n.as_f64().unwrap_or(f64::NAN)),
            other => other.to_string(),
        };
        entries.push((key, value));
    }
    entries.extend([
        ("zero".into(), u64::from(args.zero).to_string()),
        ("vocab_pad".into(), args.model.vocab_pad.to_string()),
        ("backend".into(), string(args.device.backend.name())),
    ]);
    entries.extend(args.device.adapter.as_deref().map(|a| ("adapter".into(), string(a))));
    entries.extend(args.device.device.map(|d| ("device".into(), d.to_string())));
    if let Some(c) = cuda {
        entries.push(("precision".into(), string(c.precision)));
        entries.extend(c.tf32.then(|| ("tf32".into(), "true".to_string())));
    }
    for (key, value) in gpu.map(crate::device::arithmetic_flags).into_iter().flatten() {
        entries.push((key.into(), string(&value)));
    }
    write(RUN_FILE_HEADER, &entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction, Command};

    /// A command with train's valued flags that the tests and the tiny preset use.
    fn train() -> Command {
        let valued = ["lr", "data", "config", "layers", "heads", "embd", "block", "batch", "warmup", "iters", "eval-iters", "eval-interval", "sample-interval"];
        Command::new("train").args(valued.map(|f| Arg::new(f).long(f))).arg(Arg::new("recompute").long("recompute").action(ArgAction::SetTrue))
    }

    #[test]
    fn keys_become_flags_before_the_command_line() {
        let text = "lr = 3e-3\ndata = \"a b.txt\"\nrecompute = true\n";
        let flags = flags_of("f", text, &train()).unwrap();
        assert_eq!(flags, ["--data=a b.txt", "--lr=0.003", "--recompute"].map(OsString::from));
        assert!(flags_of("f", "recompute = false", &train()).unwrap().is_empty());
        for (bad, needle) in [
            ("lrr = 1", "`lrr` is not a flag"),
            ("config = \"x\"", "`config` is not a flag"),
            ("lr = [1]", "`lr` must be a number or a string, not array"),
            ("recompute = 1", "`recompute` must be true or false"),
            ("lr = ", "f: "),
        ] {
            let err = flags_of("f", bad, &train()).unwrap_err().to_string();
            assert!(err.contains(needle), "{bad}: {err}");
        }
        let args = ["alpha-native", "train", "--config", "tiny", "--lr", "1"].map(OsString::from).to_vec();
        let cmd = Command::new("alpha-native").subcommand(train());
        let expanded = expand(args, cmd.find_subcommand("train").unwrap()).unwrap();
        // The preset's flags first, then the command line's (whose --lr wins).
        assert_eq!(expanded[..2], ["alpha-native", "train"].map(OsString::from));
        assert_eq!(expanded[expanded.len() - 4..], ["--config", "tiny", "--lr", "1"].map(OsString::from));
        assert!(expanded.len() > 6);
        // Another subcommand's argument that reads "train" is not the subcommand.
        let other = ["alpha-native", "sample", "--prompt", "train", "--config", "x"].map(OsString::from).to_vec();
        assert_eq!(expand(other.clone(), &train()).unwrap(), other);
        let err = expand(["alpha-native", "train", "--config=nope"].map(OsString::from).to_vec(), &train()).unwrap_err().to_string();
        assert!(err.contains("no such file, nor a preset (tiny, small, llama, shakespeare_char, baby)"), "{err}");
    }

    #[test]
    fn written_files_read_back() {
        let text = write("# a run\n# of tests\n", &[("data", string("x \"y\"\n.txt")), ("lr", 0.003.to_string()), ("recompute", "true".into())]);
        assert!(text.starts_with("# a run\n# of tests\n"));
        let table: toml::Table = text.parse().unwrap();
        assert_eq!(table["data"].as_str(), Some("x \"y\"\n.txt"));
        assert_eq!(table["lr"].as_float(), Some(0.003));
    }
}
