//! A training run's presets and loop, written once for every frontend: the CLI
//! (`alpha-native train`, blocking) and the page (alpha-web, async) read their presets from
//! [`PRESETS`] (their defaults: `settings::DEFAULT`) and drive the same [`RunLoop`], which
//! says what comes next (evaluate, sample, train a step, save, finish); each frontend only
//! carries the actions out on its engine and reports them as records.
//!
//! ```
//! use alpha_core::run::{Action, Cadence, RunLoop};
//!
//! let cadence = Cadence { iters: 4, eval_interval: 2, sample_interval: 0, checkpoint_interval: 3, log_interval: 1 };
//! let mut run = RunLoop::new(cadence, 0);
//! let mut seen = Vec::new();
//! loop {
//!     let action = run.next_action();
//!     seen.push((run.step(), action));
//!     if action == Action::Finish {
//!         break;
//!     }
//! }
//! use Action::*;
//! let train = Train { log: true };
//! assert_eq!(seen, [(0, Evaluate), (0, train), (1, train), (2, Evaluate), (2, train), (3, Save), (3, train), (4, Evaluate), (4, Finish)]);
//! ```

use crate::model::SamplingConfig;

/// How a run's samples are drawn: 200 tokens from a newline (see [`Tokenizer::sample_start`](crate::tokenizer::Tokenizer::sample_start)) at
/// temperature 0.8 and top-k 200 (nanoGPT's `sample.py` defaults).
pub const SAMPLES: SamplingConfig = SamplingConfig::new(200);

/// A preset: a run file in the repository's `config/` directory (as nanoGPT's `config/*.py`),
/// built into the library so that every frontend offers the same ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preset {
    /// Its name (`alpha-native train --config NAME`, the page's model menu).
    pub name: &'static str,
    /// The run file: `key = value` lines, the keys the CLI's flags (`_` for `-`).
    pub toml: &'static str,
}

impl Preset {
    /// What the run file's opening comment says the preset is, its first sentence (`# NAME:
    /// ...`, over as many comment lines as it takes): the page's menu shows it.
    #[cfg(feature = "alloc")]
    pub fn description(&self) -> alloc::string::String {
        let comment: alloc::vec::Vec<&str> = self.toml.lines().map_while(|l| l.strip_prefix("# ")).collect();
        let text = comment.join(" ");
        let text = text.strip_prefix(self.name).and_then(|t| t.strip_prefix(": ")).unwrap_or("");
        let end = text.find(". ").map_or(text.len(), |i| i + 1);
        text[..end].into()
    }
}

/// The presets, smallest first.
pub const PRESETS: [Preset; 5] = [
    Preset { name: "tiny", toml: include_str!("../config/tiny.toml") },
    Preset { name: "small", toml: include_str!("../config/small.toml") },
    Preset { name: "llama", toml: include_str!("../config/llama.toml") },
    Preset { name: "shakespeare_char", toml: include_str!("../config/shakespeare_char.toml") },
    Preset { name: "baby", toml: include_str!("../config/baby.toml") },
];

/// The preset named `name`.
pub fn preset(name: &str) -> Option<Preset> {
    PRESETS.into_iter().find(|p| p.name == name)
}

/// When a run evaluates, samples, logs and saves (intervals in optimizer steps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cadence {
    /// The step the run ends at.
    pub iters: u64,
    /// Evaluate at every multiple of this and at the end (0: never).
    pub eval_interval: u64,
    /// Sample at every positive multiple of this and at the end (0: never).
    pub sample_interval: u64,
    /// Save after every multiple of this steps before the end (0: only at the end).
    pub checkpoint_interval: u64,
    /// Log the steps that start at a multiple of this, and the last step (at least 1).
    pub log_interval: u64,
}

/// What a run does next (see [`RunLoop::next_action`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Evaluate the model at [`RunLoop::step`] on both splits.
    Evaluate,
    /// Sample from the model at [`RunLoop::step`].
    Sample,
    /// Train step [`RunLoop::step`] (one optimizer step); `log`: report its loss.
    Train {
        /// Whether the step is one the run logs.
        log: bool,
    },
    /// Save a checkpoint of the [`RunLoop::step`] steps taken (a mid-run save).
    Save,
    /// The run is at its end: save (where the last save was not at this step) and stop.
    Finish,
}

/// Where the loop stands between two [`RunLoop::next_action`] calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Evaluate,
    Sample,
    Train,
    Save,
}

/// The training loop as a sequence of [`Action`]s: nanoGPT's order at each step (evaluate,
/// sample, stop at the end, train, save), for a frontend to carry out. It assumes each
/// `Train` it hands out is carried out before the next call; a frontend that stops early
/// (an error, an interrupt) simply stops asking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunLoop {
    cadence: Cadence,
    step: u64,
    stage: Stage,
}

impl RunLoop {
    /// A loop over `cadence` starting at `step` (a resumed run's).
    pub fn new(cadence: Cadence, step: u64) -> RunLoop {
        RunLoop { cadence, step, stage: Stage::Evaluate }
    }

    /// Optimizer steps taken (the model's step when the last action was handed out).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Optimizer steps the model has taken if it carried out every `Train` handed out: one
    /// more than [`RunLoop::step`] right after a `Train` (for a frontend that also steps the
    /// model outside the loop, to tell whether the loop is still in step with it).
    pub fn taken(&self) -> u64 {
        self.step + u64::from(self.stage == Stage::Save)
    }

    /// The cadence the loop follows.
    pub fn cadence(&self) -> Cadence {
        self.cadence
    }

    /// Sets the step the run ends at (a finished run continued for longer).
    pub fn set_iters(&mut self, iters: u64) {
        self.cadence.iters = iters;
    }

    /// The next action; after [`Action::Finish`], `Finish` again.
    pub fn next_action(&mut self) -> Action {
        let c = self.cadence;
        let at = |interval: u64, step: u64| interval > 0 && step.is_multiple_of(interval);
        loop {
            let s = self.step;
            match self.stage {
                Stage::Evaluate => {
                    self.stage = Stage::Sample;
                    if c.eval_interval > 0 && (at(c.eval_interval, s) || s == c.iters) {
                        return Action::Evaluate;
                    }
                }
                Stage::Sample => {
                    self.stage = Stage::Train;
                    if c.sample_interval > 0 && s > 0 && (at(c.sample_interval, s) || s == c.iters) {
                        return Action::Sample;
                    }
                }
                Stage::Train => {
                    if s >= c.iters {
                        return Action::Finish;
                    }
                    self.stage = Stage::Save;
                    return Action::Train { log: s.is_multiple_of(c.log_interval.max(1)) || s + 1 == c.iters };
                }
                Stage::Save => {
                    self.step += 1;
                    self.stage = Stage::Evaluate;
                    if at(c.checkpoint_interval, self.step) && self.step < c.iters {
                        return Action::Save;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actions(cadence: Cadence, from: u64) -> Vec<(u64, Action)> {
        let mut run = RunLoop::new(cadence, from);
        let mut out = Vec::new();
        loop {
            let a = run.next_action();
            out.push((run.step(), a));
            if a == Action::Finish {
                return out;
            }
        }
    }

    /// nanoGPT's order, the CLI's until now: evaluation before the step (and at the end),
    /// samples after the first step, the last step logged, no mid-run save at the end.
    #[test]
    fn the_loop_follows_the_cadence() {
        let c = Cadence { iters: 6, eval_interval: 4, sample_interval: 3, checkpoint_interval: 3, log_interval: 4 };
        let (t, f) = (Action::Train { log: true }, Action::Train { log: false });
        use Action::*;
        let want =
            [(0, Evaluate), (0, t), (1, f), (2, f), (3, Save), (3, Sample), (3, f), (4, Evaluate), (4, t), (5, t), (6, Evaluate), (6, Sample), (6, Finish)];
        assert_eq!(actions(c, 0), want);
        // Resumed at step 3: the same from there on.
        assert_eq!(actions(c, 3), want[5..]);
        // Nothing but steps and the end.
        let bare = Cadence { iters: 2, eval_interval: 0, sample_interval: 0, checkpoint_interval: 0, log_interval: 1 };
        assert_eq!(actions(bare, 0), [(0, t), (1, t), (2, Finish)]);
        let mut run = RunLoop::new(c, 0);
        assert_eq!((run.next_action(), run.taken()), (Evaluate, 0));
        assert_eq!((run.next_action(), run.step(), run.taken()), (t, 0, 1));
        // A finished run only finishes; continued, it trains again.
        let mut run = RunLoop::new(bare, 2);
        assert_eq!((run.next_action(), run.next_action()), (Finish, Finish));
        run.set_iters(3);
        assert_eq!(run.next_action(), t);
    }

    /// Every preset names itself and is a file of the repository's `config/`.
    #[test]
    #[cfg(not(target_arch = "wasm32"))]
    fn presets_are_the_config_files() {
        for p in PRESETS {
            assert_eq!(preset(p.name), Some(p));
            let file = std::fs::read_to_string(format!("{}/config/{}.toml", env!("CARGO_MANIFEST_DIR"), p.name)).unwrap();
            assert_eq!(file, p.toml);
        }
        assert_eq!(preset("none"), None);
        for p in PRESETS {
            let d = p.description();
            assert!(d.len() > 20 && d.ends_with('.') && !d.contains("Keys are") && !d.contains("# "), "{}: {d:?}", p.name);
        }
        assert_eq!(preset("small").unwrap().description(), "a minute or two on a laptop's CPU.");
    }
}
