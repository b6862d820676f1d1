//! Stopping a command from outside: Ctrl-C (SIGINT), and SIGTERM and SIGHUP, with which
//! schedulers (Slurm, Kubernetes, systemd) and closed terminals stop jobs. The first signal
//! asks the command to stop where nothing is lost (a run at the end of its step, after saving);
//! a second stops the process at once (status 130), removing the temporary files the command
//! named and saying what is kept.

use anyhow::{anyhow, Result};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// What the handler knows (shared with it).
#[derive(Default)]
struct Shared {
    /// Removed on a second signal: the temporary files a write in progress may have left.
    temps: Vec<PathBuf>,
    /// Said on a second signal: what stays on disk.
    kept: String,
}

/// The process's signal handler (see the module docs); clones share it.
#[derive(Clone)]
pub struct Interrupt {
    requested: Arc<AtomicBool>,
    shared: Arc<Mutex<Shared>>,
}

impl Interrupt {
    /// Installs the handler (once per process). `first` is printed on the first signal (to
    /// stderr; `None`: nothing, as on the ranks other than 0).
    pub fn install(first: Option<String>) -> Result<Interrupt> {
        let interrupt = Interrupt { requested: Arc::new(AtomicBool::new(false)), shared: Arc::default() };
        let handler = interrupt.clone();
        ctrlc::set_handler(move || {
            if !handler.requested.swap(true, Ordering::SeqCst) {
                if let Some(msg) = &first {
                    eprintln!("{msg}");
                }
                return;
            }
            let shared = handler.shared.lock().unwrap_or_else(PoisonError::into_inner);
            for temp in &shared.temps {
                let _ = std::fs::remove_file(temp);
            }
            eprintln!("interrupted again: stopped at once; {}", shared.kept);
            std::process::exit(130);
        })
        .map_err(|e| anyhow!("cannot handle Ctrl-C and SIGTERM: {e}"))?;
        Ok(interrupt)
    }

    /// Whether a signal asked the command to stop.
    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// Names a temporary file to remove if a second signal stops the process at once.
    pub fn remove_on_stop(&self, temp: PathBuf) {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner).temps.push(temp);
    }

    /// Says what stays on disk if a second signal stops the process at once.
    pub fn set_kept(&self, kept: String) {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner).kept = kept;
    }
}
