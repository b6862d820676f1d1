//! What a run writes (checkpoint, run file, metrics, trace, the dashboard): [`Files`] checks
//! it all before anything is written, then rank 0 opens it, the output directory locked while
//! the run lasts.

use crate::corpus;
use crate::fsutil::{check_outputs_distinct, check_replaceable, remove_stale_temps, same_file, RunLock};
use crate::run::args::TrainArgs;
use crate::run::metrics::Metrics;
use crate::runfile::{RUN_FILE, RUN_FILE_HEADER};
use crate::trace::Trace;
use alpha_core::settings::RunSettings;
use anyhow::{anyhow, Result};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// Name of the checkpoint inside `--out`.
pub const CHECKPOINT_FILE: &str = "ckpt.safetensors";

/// What rank 0 writes to while the run lasts (the other ranks have none of it).
pub struct Outputs {
    /// `--trace`'s recorder.
    pub trace: Option<Trace>,
    /// The output directory's lock, held until the run ends.
    _lock: Option<RunLock>,
    /// `--metrics` and `--serve`.
    pub metrics: Metrics,
}

/// The run's files: what it reads and what it writes.
pub struct Files<'a> {
    data: Option<&'a Path>,
    resume: Option<&'a Path>,
    /// The run file given to --config (not a preset).
    config: Option<&'a Path>,
    out: PathBuf,
    /// The checkpoint, `--out`/ckpt.safetensors.
    pub checkpoint: PathBuf,
    /// The resolved configuration beside the checkpoint.
    pub run_file: PathBuf,
}

impl<'a> Files<'a> {
    /// The files of a run of `args` with settings `s`: a resumed run writes back where its
    /// checkpoint lives unless `--out` is given (`explicit`).
    pub fn new(args: &'a TrainArgs, explicit: &dyn Fn(&str) -> bool, s: &'a RunSettings) -> Files<'a> {
        let out = match &args.resume {
            Some(r) if !explicit("out") => r.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf(),
            _ => args.out.clone(),
        };
        let data = (s.data != corpus::EMBEDDED && !s.dataset).then(|| Path::new(&s.data));
        let config = args.config.as_deref().filter(|c| c.exists());
        let (checkpoint, run_file) = (out.join(CHECKPOINT_FILE), out.join(RUN_FILE));
        Files { data, resume: args.resume.as_deref(), config, checkpoint, run_file, out }
    }

    /// Rank 0 (`Files::prepare`, then the dashboard of `--serve`); the other ranks neither
    /// check nor touch the outputs.
    pub fn open(&self, args: &TrainArgs, root: bool) -> Result<Outputs> {
        if !root {
            return Ok(Outputs { trace: None, _lock: None, metrics: Metrics::new(None, None) });
        }
        let outputs = self.prepare(args)?;
        let Some(addr) = &args.serve else { return Ok(outputs) };
        let records = crate::serve::Records::default();
        let at = crate::serve::start(addr, records.clone())?;
        println!("dashboard: http://{at}/");
        Ok(Outputs { metrics: outputs.metrics.serving(records), ..outputs })
    }

    /// Refuses outputs that would replace what the run reads or another of its outputs, an
    /// existing trace without --overwrite, and outputs that are not regular files where they
    /// would be replaced. Nothing is written yet.
    fn check(&self, args: &TrainArgs) -> Result<()> {
        if self.out.exists() && !self.out.is_dir() {
            return Err(anyhow!("--out {} exists and is not a directory", self.out.display()));
        }
        for output in [&self.checkpoint, &self.run_file] {
            check_replaceable(output).map_err(|e| anyhow!("{}: {e}", output.display()))?;
        }
        if let Some(data) = self.data.filter(|d| same_file(d, &self.checkpoint)) {
            return Err(anyhow!("the checkpoint {} would replace --data {}; choose another --out", self.checkpoint.display(), data.display()));
        }
        // The checkpoint may replace the one resumed (resuming in place), nothing else.
        let mut taken: Vec<(&str, &Path)> = vec![("the checkpoint", &self.checkpoint)];
        taken.extend(self.data.map(|p| ("--data", p)));
        taken.extend(self.resume.map(|p| ("--resume", p)));
        taken.extend(self.config.map(|p| ("--config", p)));
        if let Some((what, _)) = taken.iter().find(|(_, p)| same_file(p, &self.run_file)) {
            return Err(anyhow!("the run's resolved configuration {} would replace {what}; choose another --out", self.run_file.display()));
        }
        taken.push(("the run file", &self.run_file));
        check_outputs_distinct(taken, &[("--metrics", args.metrics.as_deref()), ("--trace", args.trace.as_deref())])
    }

    /// Checks the outputs ([`Files::check`]), opens the trace, creates the output directory
    /// and locks it, clears stale temporary files, refuses to replace a checkpoint or a run
    /// file that is not this run's, and opens the metrics: rank 0's set-up of the outputs.
    fn prepare(&self, args: &TrainArgs) -> Result<Outputs> {
        self.check(args)?;
        let trace = args.trace.as_deref().map(|p| Trace::new(p, args.trace_steps, args.overwrite)).transpose()?;
        std::fs::create_dir_all(&self.out).map_err(|e| anyhow!("cannot create {}: {e}", self.out.display()))?;
        // Held until the run ends; a second run into this directory stops here.
        let lock = RunLock::acquire(&self.out)?;
        for output in [&self.checkpoint, &self.run_file] {
            remove_stale_temps(output).map_err(|e| anyhow!("cannot clean up {}: {e}", self.out.display()))?;
        }
        let resuming_in_place = args.resume.as_ref().is_some_and(|r| same_file(r, &self.checkpoint));
        if self.checkpoint.exists() && !resuming_in_place && !args.overwrite {
            let ckpt = self.checkpoint.display();
            return Err(anyhow!("{ckpt} already exists; resume it with --resume {ckpt}, choose another --out, or pass --overwrite"));
        }
        // The run file beside the checkpoint is replaced when it is one this program wrote.
        let ours = std::fs::read_to_string(&self.run_file).is_ok_and(|t| t.starts_with(RUN_FILE_HEADER));
        if self.run_file.exists() && !ours && !args.overwrite {
            return Err(anyhow!("{} exists and is not a run file alpha-native wrote; choose another --out, or pass --overwrite", self.run_file.display()));
        }
        let metrics = args.metrics.as_deref().map(|p| self.open_metrics(p, args.resume.is_some(), args.overwrite)).transpose()?;
        Ok(Outputs { trace, _lock: Some(lock), metrics: Metrics::new(metrics, None) })
    }

    /// The metrics file: a fresh run starts it (an existing one only with --overwrite), a
    /// resumed run appends to it.
    fn open_metrics(&self, path: &Path, resumed: bool, overwrite: bool) -> Result<File> {
        let meta = std::fs::metadata(path).ok();
        if meta.as_ref().is_some_and(|m| m.is_dir()) {
            return Err(anyhow!("--metrics {} is a directory", path.display()));
        }
        let existing_file = meta.as_ref().is_some_and(|m| m.is_file());
        if existing_file && !resumed && !overwrite {
            return Err(anyhow!(
                "--metrics {} already exists; a new run does not append to another run's metrics: choose another file, or pass --overwrite to start it anew",
                path.display()
            ));
        }
        let mut options = OpenOptions::new();
        if existing_file && !resumed {
            options.write(true).truncate(true);
        } else {
            options.create(true).append(true);
        }
        options.open(path).map_err(|e| anyhow!("cannot open metrics file {}: {e}", path.display()))
    }
}
