//! A run's checkpoints ([`Checkpointer`]): written atomically, in the run's thread or, with
//! `--async-checkpoint`, by a thread of their own from a snapshot of the arenas; every step
//! confirmed applied first and a model that is not finite never saved; the last `--keep`
//! kept beside the newest.

use crate::checkpoint::{self, SaveError, TrainState};
use crate::interrupt::Interrupt;
use alpha_core::engine::{Engine, StepError};
use alpha_core::settings::RunSettings;
use alpha_core::tokenizer::Tokenizer;
use alpha_core::{GptConfig, Plan};
use alpha_gpu::block_on;
use anyhow::{anyhow, Error, Result};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

/// A copy of the parameters and both AdamW moments (`--async-checkpoint`).
type Snapshot = [Vec<f32>; 3];

/// Where and how a run's checkpoints are written (owned, so that a background thread can).
struct SaveTarget {
    path: PathBuf,
    config: GptConfig,
    keep: usize,
    /// What the run keeps if this save is refused (for the message).
    kept: String,
    /// Told what is kept once the checkpoint is written.
    interrupt: Interrupt,
}

impl SaveTarget {
    /// Writes a checkpoint of `state` and the arenas; a model that is not finite is refused.
    fn write(&self, tokenizer: &Tokenizer, params: &[f32], m: &[f32], v: &[f32], state: &TrainState) -> Result<()> {
        let step = state.step;
        checkpoint::save(&self.path, self.config, tokenizer, params, Some((m, v, state))).map_err(|e| match e {
            SaveError::NonFinite { .. } => anyhow!("not saving step {step}: {e}; {}. Try a lower --lr or a smaller --grad-clip", self.kept),
            other => anyhow!(other),
        })?;
        self.interrupt.set_kept(format!("the last good checkpoint ({}, step {step}) is kept", self.path.display()));
        keep_last(&self.path, step, self.keep)
    }
}

/// With `keep` above 1, keeps the checkpoint just saved at `path` (step `step`) as
/// `ckpt-STEP.safetensors` beside it too (a hard link where the file system has them) and
/// removes such files beyond the newest `keep`.
fn keep_last(path: &Path, step: u64, keep: usize) -> Result<()> {
    if keep <= 1 {
        return Ok(());
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let stamped = dir.join(format!("ckpt-{step:08}.safetensors"));
    let _ = std::fs::remove_file(&stamped);
    std::fs::hard_link(path, &stamped).or_else(|_| std::fs::copy(path, &stamped).map(|_| ())).map_err(|e| anyhow!("cannot keep {}: {e}", stamped.display()))?;
    let mut kept: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| anyhow!("cannot read {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("ckpt-") && n.ends_with(".safetensors") && n[5..n.len() - 12].bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    kept.sort();
    for old in &kept[..kept.len().saturating_sub(keep)] {
        std::fs::remove_file(old).map_err(|e| anyhow!("cannot remove {}: {e}", old.display()))?;
    }
    Ok(())
}

/// Writes a run's checkpoints to one path: rank 0 writes, every rank takes part in collecting
/// the state (ZeRO-1's moments come together on rank 0).
pub struct Checkpointer<'t> {
    path: PathBuf,
    config: GptConfig,
    settings: RunSettings,
    tokenizer: &'t Tokenizer,
    /// Whether this process writes (rank 0).
    root: bool,
    /// Told what is on disk, for a stop by a second signal.
    interrupt: Interrupt,
    /// The step of the checkpoint resumed, which is on disk until the run saves.
    resumed_at: Option<u64>,
    /// The step of the last checkpoint this run saved.
    pub last_saved: Option<u64>,
    /// With `--async-checkpoint`: the snapshot of the arenas, allocated and written once at the
    /// start (its page faults cost the start, not a save's pause) and handed to the writer.
    snapshot: Option<Snapshot>,
    /// The background write under way, which hands the snapshot back.
    pending: Option<JoinHandle<Result<Snapshot>>>,
}

impl<'t> Checkpointer<'t> {
    /// A checkpointer to `path` for a run of `plan` with `settings`, which resumed a
    /// checkpoint at step `resumed_at`, if it did.
    pub fn new(
        path: PathBuf,
        plan: &Plan,
        settings: &RunSettings,
        tokenizer: &'t Tokenizer,
        root: bool,
        interrupt: Interrupt,
        resumed_at: Option<u64>,
    ) -> Result<Self> {
        let buffer = || alpha_core::plan::try_vec("the checkpoint snapshot", plan.params_len(), f32::NAN).map_err(|e| anyhow!("--async-checkpoint: {e}"));
        let snapshot = if settings.async_checkpoint && root { Some([buffer()?, buffer()?, buffer()?]) } else { None };
        let me = Checkpointer {
            path,
            config: plan.config,
            settings: settings.clone(),
            tokenizer,
            root,
            interrupt,
            resumed_at,
            last_saved: None,
            snapshot,
            pending: None,
        };
        me.interrupt.set_kept(me.kept());
        Ok(me)
    }

    /// What is on disk if the run stops now: the last checkpoint it saved, or the one it
    /// resumed from.
    pub fn kept(&self) -> String {
        match self.last_saved.or(self.resumed_at) {
            Some(at) if self.path.exists() => format!("the last good checkpoint ({}, step {at}) is kept", self.path.display()),
            _ => "no checkpoint was written".into(),
        }
    }

    /// A failed step's message: a divergence says what is kept and what to try.
    pub fn failed(&self, e: StepError) -> Error {
        match e {
            StepError::Diverged(msg) => anyhow!("training diverged at {msg}; {}. Try a lower --lr or a smaller --grad-clip", self.kept()),
            StepError::Device(msg) => anyhow!(msg),
        }
    }

    /// Confirms every step was applied, then saves `engine`'s state at `step` (with
    /// `--async-checkpoint`, copies it and saves in the background); `best_val_loss` is
    /// a `--save best` run's.
    pub fn save(&mut self, engine: &mut dyn Engine, step: u64, best_val_loss: Option<f64>) -> Result<()> {
        block_on(engine.check()).map_err(|e| self.failed(e))?;
        let (params, m, v) = block_on(engine.state()).map_err(Error::msg)?;
        if self.root {
            let loss_scale = block_on(engine.loss_scale()).map_err(Error::msg)?;
            let rng_state = engine.rng().state().to_string();
            let state = TrainState { step: engine.step_count(), rng_state, settings: self.settings.clone(), best_val_loss, loss_scale };
            self.write([&params, &m, &v], state)?;
        }
        self.last_saved = Some(step);
        Ok(())
    }

    /// Writes `state` with the arenas (parameters and both moments) after the write under
    /// way, if any: here, or from the snapshot by a thread of its own.
    fn write(&mut self, [params, m, v]: [&[f32]; 3], state: TrainState) -> Result<()> {
        self.finish()?;
        let target =
            SaveTarget { path: self.path.clone(), config: self.config, keep: self.settings.keep, kept: self.kept(), interrupt: self.interrupt.clone() };
        let Some(mut copy) = self.snapshot.take() else {
            return target.write(self.tokenizer, params, m, v, &state);
        };
        for (dst, src) in copy.iter_mut().zip([params, m, v]) {
            dst.copy_from_slice(src);
        }
        let tokenizer = self.tokenizer.clone();
        self.pending = Some(std::thread::spawn(move || {
            target.write(&tokenizer, &copy[0], &copy[1], &copy[2], &state)?;
            Ok(copy)
        }));
        Ok(())
    }

    /// Waits for a checkpoint being written in the background; its error, if any.
    pub fn finish(&mut self) -> Result<()> {
        if let Some(writer) = self.pending.take() {
            self.snapshot = Some(writer.join().unwrap_or_else(|_| Err(anyhow!("the checkpoint writer panicked")))?);
        }
        Ok(())
    }

    /// Where the checkpoint is written.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
