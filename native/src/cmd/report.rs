//! `alpha-native report`: one self-contained HTML file (inline script and style, no network
//! references) that shows one or more runs' metrics (`train --metrics`) and optionally a
//! trace (`--trace`): losses against step and wall time, learning rate, gradient norm,
//! tokens/s, MFU and HFU, where a step's time goes, the top ops and kernels, the runs' config,
//! machine and memory plan, and their samples.
//!
//! ```text
//! alpha-native train --metrics run.jsonl --trace run.trace.json
//! alpha-native report --metrics run.jsonl --trace run.trace.json --out report.html
//! ```
//!
//! The charts are `www/charts.js`, the page's own, and the layout `www/report.js`; both are
//! compiled in. Lines of a metrics file that are not whole JSON records (a run killed while
//! writing one) are skipped and counted.

use crate::fsutil::{check_outputs_distinct, check_replaceable, write_atomic};
use crate::report::{html, summarize_trace, RunRecords};
use anyhow::{anyhow, Result};
use clap::Args;
use serde_json::json;
use std::path::{Path, PathBuf};

/// Flags of `alpha-native report`.
#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// A run's metrics (`train --metrics`); give several to overlay their runs.
    #[arg(long, value_name = "FILE", required = true)]
    pub metrics: Vec<PathBuf>,
    /// A trace of the run (`train --trace` or `bench --trace`): its top ops and kernels.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// The HTML file to write.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Replace an existing --out file.
    #[arg(long)]
    pub overwrite: bool,
}

/// Runs `report`.
pub fn run(args: &ReportArgs) -> Result<()> {
    let mut inputs: Vec<(&str, &Path)> = args.metrics.iter().map(|m| ("--metrics", m.as_path())).collect();
    inputs.extend(args.trace.as_deref().map(|t| ("--trace", t)));
    check_outputs_distinct(inputs, &[("--out", Some(&args.out))])?;
    check_replaceable(&args.out).map_err(|e| anyhow!("--out {}: {e}", args.out.display()))?;
    if args.out.exists() && !args.overwrite {
        return Err(anyhow!("--out {} already exists; choose another file, or pass --overwrite to replace it", args.out.display()));
    }
    let mut runs = Vec::new();
    for path in &args.metrics {
        let file = crate::fsutil::open_regular(path).map_err(|e| anyhow!("cannot read --metrics {}: {e}", path.display()))?;
        let records = RunRecords::read(std::io::BufReader::new(file)).map_err(|e| anyhow!("cannot read --metrics {}: {e}", path.display()))?;
        runs.push(records.to_json(&run_name(path, &args.metrics)));
    }
    let trace = match &args.trace {
        Some(path) => {
            let text = crate::fsutil::read_regular_string(path).map_err(|e| anyhow!("cannot read --trace {}: {e}", path.display()))?;
            Some(summarize_trace(&text).map_err(|e| anyhow!("--trace {}: {e}", path.display()))?)
        }
        None => None,
    };
    let data = json!({ "runs": runs, "trace": trace });
    write_atomic(&args.out, html(Some(&data)).as_bytes()).map_err(|e| anyhow!("cannot write {}: {e}", args.out.display()))?;
    let skipped: u64 = runs.iter().map(|r| r["skipped"].as_u64().unwrap_or(0)).sum();
    let note = if skipped > 0 { format!(" ({skipped} malformed metrics lines skipped)") } else { String::new() };
    println!("wrote {}{note}", args.out.display());
    Ok(())
}

/// A run's name in the report: its metrics file's name without the extension, or the whole
/// path where two files share a name.
fn run_name(path: &Path, all: &[PathBuf]) -> String {
    let stem = |p: &Path| p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let name = stem(path);
    match all.iter().filter(|p| stem(p) == name).count() {
        1 => name,
        _ => path.display().to_string(),
    }
}
