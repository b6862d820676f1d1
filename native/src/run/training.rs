//! A run's loop: core's [`Driver`] steps, evaluates, samples and saves; [`Training`] prints
//! and records each event, times the steps (a trace of the first ones where asked), saves
//! checkpoints as the settings say, and says at the end what is on disk.

use crate::peak::Peak;
use crate::ranks::Group;
use crate::run::checkpointer::Checkpointer;
use crate::run::console::Console;
use crate::run::metrics::Metrics;
use crate::step::{Phases, StepClock};
use crate::trace::Trace;
use alpha_core::engine::{Driver, Engine, Event, Splits, StepReport};
use alpha_core::settings::SavePolicy;
use alpha_core::tokenizer::Tokenizer;
use alpha_core::Plan;
use alpha_gpu::block_on;
use anyhow::Result;
use serde_json::{json, Value};
use std::time::Instant;

/// What a step's work is measured against: tokens, FLOPs and the devices' peak.
pub struct Throughput {
    /// Tokens of one optimizer step over all ranks.
    pub tokens_per_step: f64,
    /// The model's FLOPs per token (MFU).
    pub model_flops: f64,
    /// FLOPs per token with the recomputed forwards (HFU).
    pub hardware_flops: f64,
    /// One device's peak (rank 0 only).
    pub peak: Option<Peak>,
    /// Ranks training together, each on a device of that peak.
    pub ranks: usize,
}

impl Throughput {
    /// The work of a step of `plan` times `grad_accum` (over all `ranks`), against `peak`.
    pub fn new(plan: &Plan, grad_accum: usize, peak: Option<Peak>, ranks: usize) -> Throughput {
        let model_flops = plan.flops_per_token();
        let tokens_per_step = (plan.tokens() * grad_accum) as f64;
        Throughput { tokens_per_step, model_flops, hardware_flops: model_flops + plan.recomputed_flops_per_token(), peak, ranks }
    }

    /// The share of the devices' peak that `tok_s` tokens/s of `flops` per token use.
    fn utilisation(&self, tok_s: f64, flops: f64) -> Option<f64> {
        self.peak.as_ref().map(|p| flops * tok_s / 1e9 / (p.gflops * self.ranks as f64))
    }
}

/// The steps since the last logged record: their phases and wall time.
struct Window {
    phases: Phases,
    steps: u64,
    start: Instant,
}

impl Window {
    fn new() -> Window {
        Window { phases: Phases::default(), steps: 0, start: Instant::now() }
    }
}

/// A run's loop on one rank (rank 0 prints, records and writes).
pub struct Training<'r> {
    /// What trains.
    pub engine: &'r mut dyn Engine,
    /// Decodes samples.
    pub tokenizer: &'r Tokenizer,
    /// Where lines and progress go.
    pub console: &'r Console,
    /// Where records go.
    pub metrics: &'r mut Metrics,
    /// Writes the checkpoints.
    pub checkpointer: Checkpointer<'r>,
    /// What MFU is measured against.
    pub throughput: Throughput,
    /// The run's device as records name it.
    pub device: Value,
    /// Which checkpoints the run writes.
    pub save: SavePolicy,
    /// The run's length.
    pub iters: u64,
    /// The lowest val loss so far of a `--save best` run (a resumed one's from its checkpoint).
    pub best_val_loss: Option<f64>,
    /// Whether this is rank 0 (which prints, samples and writes).
    pub root: bool,
}

impl Training<'_> {
    /// Runs `driver` over `splits` until the run ends or a signal stops every rank of `group`
    /// (`requested`), then saves its last step: whether it was stopped. The trace is written
    /// whatever ended the run.
    pub fn run(&mut self, mut driver: Driver, splits: Splits<'_>, mut trace: Option<Trace>, group: &Group, requested: &dyn Fn() -> bool) -> Result<bool> {
        let mut window = Window::new();
        let result = loop {
            let t = Instant::now();
            let mut clock = StepClock::start(trace.as_mut());
            let mut stop = || group.any(requested());
            let event = match block_on(driver.next(&mut *self.engine, splits, self.tokenizer.sample_start(), &mut clock, &mut stop)) {
                Ok(event) => event,
                Err(e) => break Err(self.checkpointer.failed(e)),
            };
            let handled = match event {
                Event::Finished { stopped, .. } => break Ok(stopped),
                Event::Trained { step, log, report } => self.trained(step, log, &report, clock.finish(step, &report), &mut window),
                Event::Evaluated { step, train_loss, val_loss } => {
                    window.phases.eval += t.elapsed().as_secs_f64();
                    self.evaluated(step, train_loss, val_loss, &mut window)
                }
                Event::Sampled { .. } if !self.root => Ok(()),
                Event::Sampled { step, ids } => {
                    window.phases.sample += t.elapsed().as_secs_f64();
                    let text = self.tokenizer.decode_lossy(&ids);
                    self.console.line(&format!("--- sample at step {step} ---\n{text}\n---"));
                    self.metrics.write(json!({"type": "sample", "step": step, "text": text}))
                }
                // In --save best, only evaluations save.
                Event::Save { .. } if self.save == SavePolicy::Best => Ok(()),
                Event::Save { step } => self.saved(step, None, &mut window),
            };
            if let Err(e) = handled {
                break Err(e);
            }
        };
        let traced = trace.as_mut().map_or(Ok(()), Trace::finish);
        self.console.finish();
        // A checkpoint still being written is finished whatever ended the run.
        let written = self.checkpointer.finish();
        let stopped = result?;
        written?;
        // The last step is saved where the last save was not of it (not in --save best).
        let steps = self.engine.step_count();
        if self.checkpointer.last_saved != Some(steps) && self.save != SavePolicy::Best {
            self.checkpointer.save(&mut *self.engine, steps, None)?;
            self.checkpointer.finish()?;
            self.metrics.write(json!({"type": "save", "step": steps}))?;
        }
        traced?;
        Ok(stopped)
    }

    /// Saves at `step` (a `--save best` run's `best_val_loss`) and records it.
    fn saved(&mut self, step: u64, best_val_loss: Option<f64>, window: &mut Window) -> Result<()> {
        let t = Instant::now();
        self.checkpointer.save(&mut *self.engine, step, best_val_loss)?;
        window.phases.checkpoint += t.elapsed().as_secs_f64();
        self.metrics.write(json!({"type": "save", "step": step}))
    }

    /// Prints and records an evaluation; in `--save best`, saves a new best.
    fn evaluated(&mut self, step: u64, train_loss: f64, val_loss: f64, window: &mut Window) -> Result<()> {
        self.console.line(&format!("step {step}: train loss {train_loss:.4}, val loss {val_loss:.4}"));
        self.metrics.write(json!({"type": "eval", "step": step, "train_loss": train_loss, "val_loss": val_loss}))?;
        if self.save == SavePolicy::Best && self.best_val_loss.is_none_or(|b| val_loss < b) {
            self.best_val_loss = Some(val_loss);
            self.saved(step, self.best_val_loss, window)?;
        }
        Ok(())
    }

    /// Moves the progress bar; at a logged step, prints (without a bar) and records the
    /// window's full-workflow accounting: its wall time, evaluations, samples and checkpoints
    /// included; idle is what no phase accounts for.
    fn trained(&mut self, step: u64, log: bool, report: &StepReport, phases: Phases, window: &mut Window) -> Result<()> {
        let tokens_per_step = self.throughput.tokens_per_step;
        window.phases.add(&phases);
        window.steps += 1;
        self.console.progress(step + 1, self.iters, report.stats.map(|st| (st.loss, tokens_per_step / phases.total)));
        let (true, Some(st)) = (log, report.stats) else { return Ok(()) };
        let n = window.steps as f64;
        window.phases.close(window.start.elapsed().as_secs_f64());
        let ms_per_step = window.phases.total * 1e3 / n;
        let tok_s = tokens_per_step * n / window.phases.total;
        let scaling = report.loss_scaling;
        if self.console.plain() {
            let scale = scaling.map(|l| match l.skipped {
                0 => format!(", loss scale {}", l.scale),
                n => format!(", loss scale {} ({n} steps skipped: f16 overflow)", l.scale),
            });
            println!(
                "step {step}: loss {:.4}, lr {:.3e}, grad norm {:.3}, {ms_per_step:.1} ms/step, {tok_s:.0} tok/s{}",
                st.loss,
                st.lr,
                st.grad_norm,
                scale.unwrap_or_default()
            );
        }
        let t = &self.throughput;
        self.metrics.write(json!({"type": "train", "step": step, "loss": st.loss, "lr": st.lr, "grad_norm": st.grad_norm,
            "tokens_per_sec": tok_s, "ms_per_step": ms_per_step, "ms": window.phases.json_ms(n), "device": self.device,
            "mfu": t.utilisation(tok_s, t.model_flops), "hfu": t.utilisation(tok_s, t.hardware_flops),
            "loss_scale": scaling.map(|l| l.scale), "skipped_steps": scaling.map(|l| l.skipped)}))?;
        *window = Window::new();
        Ok(())
    }

    /// Says (rank 0) what is on disk at the end of a run `stopped` by a signal or done.
    pub fn end(self, stopped: bool) {
        let (steps, best_mode) = (self.engine.step_count(), self.save == SavePolicy::Best);
        if !self.root {
            return;
        }
        let path = self.checkpointer.path().display();
        if best_mode {
            let ended = if stopped { format!("interrupted at step {steps}") } else { format!("done: {steps} steps") };
            match (self.checkpointer.last_saved, self.best_val_loss) {
                (Some(at), Some(loss)) => println!("{ended}; the best checkpoint (step {at}, val loss {loss:.4}) is {path}"),
                _ => println!("{ended}; no evaluation improved on the resumed checkpoint's val loss, which stays as it was"),
            }
        } else if stopped {
            println!("interrupted: checkpoint at step {steps} saved to {path}; continue with --resume {path}");
        } else {
            println!("done: {steps} step{}; checkpoint saved to {path}", if steps == 1 { "" } else { "s" });
        }
    }
}
