//! A run's metrics: JSON Lines records to the `--metrics` file and the live dashboard.

use anyhow::{anyhow, Result};
use serde_json::json;
use std::fs::File;
use std::io::Write;
use std::time::Instant;

/// The run's metrics: the `--metrics` file and the `--serve` dashboard's records (neither on
/// ranks other than 0, or without the flags).
pub struct Metrics {
    file: Option<File>,
    live: Option<crate::serve::Records>,
    /// When this process started the run: records carry their time since (`time_s`).
    started: Instant,
}

impl Metrics {
    /// Records to `file` and `live`, either or both (none: records go nowhere).
    pub fn new(file: Option<File>, live: Option<crate::serve::Records>) -> Metrics {
        Metrics { file, live, started: Instant::now() }
    }

    /// These metrics, their records also served live.
    pub fn serving(self, live: crate::serve::Records) -> Metrics {
        Metrics { live: Some(live), ..self }
    }

    /// Appends `record` (an object) with its `time_s`, as one line.
    pub fn write(&mut self, mut record: serde_json::Value) -> Result<()> {
        if self.file.is_none() && self.live.is_none() {
            return Ok(());
        }
        record["time_s"] = json!(self.started.elapsed().as_secs_f64());
        let mut line = record.to_string();
        if let Some(live) = &self.live {
            live.push(&line);
        }
        if let Some(f) = &mut self.file {
            line.push('\n');
            // One write per record, so a reader never sees half a line from a live run.
            f.write_all(line.as_bytes()).map_err(|e| anyhow!("cannot write metrics: {e}"))?;
        }
        Ok(())
    }
}
