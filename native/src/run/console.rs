//! Where a run's progress goes: a bar, or plain lines.

use indicatif::{HumanDuration, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// Where the run's progress goes: a bar on stderr when stdout and stderr are both terminals,
/// with other lines printed above it; plain lines on stdout otherwise (CI, `| tee`).
pub struct Console {
    bar: ProgressBar,
    /// Whether it prints at all (only rank 0 of a data-parallel run does).
    shown: bool,
}

impl Console {
    /// A console for a run of `iters` steps at `position`, printing where `shown`.
    pub fn new(iters: u64, position: u64, shown: bool) -> Console {
        let on_terminal = shown && std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
        let target = if on_terminal { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
        let bar = ProgressBar::with_draw_target(Some(iters), target);
        // Only the message is as wide as the terminal leaves room for, cut to fit, so the line
        // never wraps: the step, ETA, loss and speed go into it.
        bar.set_style(ProgressStyle::with_template("{bar:20.cyan/blue} {wide_msg}").expect("static template").progress_chars("##-"));
        bar.set_position(position);
        Console { bar, shown }
    }

    /// Prints `msg` as a line (above the bar).
    pub fn line(&self, msg: &str) {
        if self.plain() {
            println!("{msg}");
        } else if self.shown {
            self.bar.println(msg);
        }
    }

    /// Whether it prints plain lines (no bar).
    pub fn plain(&self) -> bool {
        self.shown && self.bar.is_hidden()
    }

    /// Moves the bar to step `done` of `iters` with the latest loss and speed.
    pub fn progress(&self, done: u64, iters: u64, stats: Option<(f64, f64)>) {
        self.bar.set_position(done);
        if let Some((loss, tok_s)) = stats {
            self.bar.set_message(format!("{done}/{iters} loss {loss:.4} | {:.1}k tok/s | eta {}", tok_s / 1e3, HumanDuration(self.bar.eta())));
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
