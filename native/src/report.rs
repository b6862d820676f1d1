//! Runs' metrics and traces as the report and the live dashboard show them: [`RunRecords`]
//! (a bounded set of a run's records), [`summarize_trace`] (the top ops and kernels) and
//! [`html`] (the page: `www/charts.js` and `www/report.js` compiled in). Lines of a metrics
//! file that are not whole JSON records (a run killed while writing one) are skipped and counted.

use anyhow::{anyhow, Result};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// Ops and kernels the trace table lists, the largest total time first.
const TOP_OPS: usize = 20;

const SERIES_KEPT: usize = 2048;
/// The latest samples kept.
const SAMPLES_KEPT: usize = 16;
/// The longest metrics line read (longer ones are skipped and counted).
const MAX_LINE: usize = 1 << 20;

/// One series of records (`train` or `eval`), thinned evenly to at most [`SERIES_KEPT`]: every
/// `stride`-th record is kept, the stride doubling (every other kept one dropped) each time
/// the series fills; the latest record is always shown. A dropped `train` record's
/// `skipped_steps` (steps an f16 overflow skipped, counted per logged window) are added to the
/// next record kept, so that their total stays exact.
#[derive(Default)]
struct Series {
    kept: Vec<Value>,
    /// Records seen; with `stride`, which are kept.
    seen: u64,
    stride: u64,
    /// The newest record where it was not kept.
    latest: Option<Value>,
    /// `skipped_steps` of dropped records, not yet added to a kept one.
    carried: u64,
}

impl Series {
    fn push(&mut self, mut record: Value) {
        let skipped = |r: &Value| r.get("skipped_steps").and_then(Value::as_u64);
        // The latest record is superseded: its skipped steps go to this one.
        if let Some(old) = self.latest.take() {
            self.carried += skipped(&old).unwrap_or(0);
        }
        if let Some(n) = skipped(&record) {
            record["skipped_steps"] = (n + std::mem::take(&mut self.carried)).into();
        }
        let stride = self.stride.max(1);
        if self.seen.is_multiple_of(stride) {
            self.kept.push(record);
        } else {
            self.latest = Some(record);
        }
        self.seen += 1;
        if self.kept.len() > SERIES_KEPT {
            // Every other record kept (the even ones, the last among them), each odd one's
            // skipped steps going to the record after it.
            let mut kept = Vec::with_capacity(SERIES_KEPT / 2 + 1);
            let mut carry = 0;
            for (i, mut r) in std::mem::take(&mut self.kept).into_iter().enumerate() {
                if i % 2 == 1 {
                    carry += skipped(&r).unwrap_or(0);
                    continue;
                }
                if let Some(n) = skipped(&r) {
                    r["skipped_steps"] = (n + std::mem::take(&mut carry)).into();
                }
                kept.push(r);
            }
            self.carried += carry;
            self.kept = kept;
            self.stride = stride * 2;
        }
    }

    fn records(&self) -> impl Iterator<Item = &Value> {
        self.kept.iter().chain(&self.latest)
    }
}

/// A run's metrics records in bounded memory, whatever the run's length: what the report and
/// the live dashboard draw (www/report.js). The first `start` record (it describes the run; a
/// resumed run appends others), the `train` and `eval` series (each thinned evenly past 2048
/// records, the latest always kept, the f16 skipped-step counts carried exactly) and the latest
/// 16 samples; other records (saves) are not drawn and not kept. Lines that are not JSON objects with a `type`
/// (a run killed while writing one, or anything else) are skipped and counted.
#[derive(Default)]
pub struct RunRecords {
    start: Option<Value>,
    train: Series,
    eval: Series,
    samples: std::collections::VecDeque<Value>,
    skipped: u64,
    /// Changes with every record pushed (the dashboard answers "nothing new" by it).
    version: u64,
}

impl RunRecords {
    /// Adds one line of a metrics file (or a record the run just wrote).
    pub fn push_line(&mut self, line: &str) {
        if line.trim().is_empty() {
            return;
        }
        self.version += 1;
        let record = match serde_json::from_str::<Map<String, Value>>(line) {
            Ok(r) if r.get("type").is_some_and(Value::is_string) => r,
            _ => {
                self.skipped += 1;
                return;
            }
        };
        let kind = record["type"].as_str().unwrap_or_default().to_string();
        let record = Value::Object(record);
        match kind.as_str() {
            "start" if self.start.is_none() => self.start = Some(record),
            "train" => self.train.push(record),
            "eval" => self.eval.push(record),
            "sample" => {
                if self.samples.len() == SAMPLES_KEPT {
                    self.samples.pop_front();
                }
                self.samples.push_back(record);
            }
            _ => {}
        }
    }

    /// Reads a metrics file line by line: memory stays bounded whatever its size (a line
    /// longer than 1 MiB is skipped and counted).
    pub fn read(mut reader: impl std::io::BufRead) -> std::io::Result<RunRecords> {
        let mut records = RunRecords::default();
        let mut line = Vec::new();
        loop {
            line.clear();
            let (mut too_long, mut ended) = (false, false);
            // One line, at most MAX_LINE bytes of it kept.
            loop {
                let buf = reader.fill_buf()?;
                if buf.is_empty() {
                    ended = true;
                    break;
                }
                let (take, newline) = match buf.iter().position(|&b| b == b'\n') {
                    Some(i) => (i, true),
                    None => (buf.len(), false),
                };
                if line.len() + take > MAX_LINE {
                    too_long = true;
                } else {
                    line.extend_from_slice(&buf[..take]);
                }
                reader.consume(take + usize::from(newline));
                if newline {
                    break;
                }
            }
            if too_long {
                records.skipped += 1;
            } else {
                match std::str::from_utf8(&line) {
                    Ok(text) => records.push_line(text),
                    Err(_) => records.skipped += 1,
                }
            }
            if ended {
                return Ok(records);
            }
        }
    }

    /// The version of what is kept: it changes with every line pushed.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The records kept, each a JSON object, in the order the page reads them.
    pub fn records(&self) -> impl Iterator<Item = &Value> {
        self.start.iter().chain(self.train.records()).chain(self.eval.records()).chain(&self.samples)
    }

    /// `{name, skipped, records}`: a run of the report's data (see www/report.js).
    pub fn to_json(&self, name: &str) -> Value {
        json!({ "name": name, "skipped": self.skipped, "records": self.records().collect::<Vec<_>>() })
    }
}

/// One op's or kernel's spans in a trace, summed.
#[derive(Default)]
struct OpTotals {
    count: u64,
    ms: f64,
    /// The work the trace gives them (its ops' estimate, `Op::work`).
    flops: f64,
    bytes: f64,
}

/// The figures a trace gives the report: traced steps and their mean time, the ops (CPU
/// track, with their pass) and kernels (GPU track) by total time with their share of the
/// steps' time, dispatches per step, and the GPU's busy time against the steps' wall time.
pub fn summarize_trace(text: &str) -> Result<Value> {
    let doc: Value = serde_json::from_str(text).map_err(|e| anyhow!("not a JSON trace: {e}"))?;
    let events = doc["traceEvents"].as_array().ok_or_else(|| anyhow!("no traceEvents array: not a trace Alpha wrote"))?;
    let spans = events.iter().filter(|e| e["ph"] == "X");
    let dur_ms = |e: &Value| e["dur"].as_f64().unwrap_or(0.0) / 1e3;
    let (mut steps, mut wall_ms, mut busy_ms, mut dispatches) = (0u64, 0.0, 0.0, 0u64);
    // By (name, track, pass).
    let mut ops: BTreeMap<(String, &str, String), OpTotals> = BTreeMap::new();
    for e in spans {
        let gpu = e["tid"] == 2;
        // GPU spans by kernel and the op it serves ("matmul (matmul+gelu)"; "attention_forward"
        // says its op), CPU spans by op.
        let op = e["name"].as_str().unwrap_or("?");
        let name = match e["args"]["kernel"].as_str() {
            Some(kernel) if gpu && kernel.starts_with(op) => kernel.to_string(),
            Some(kernel) if gpu => format!("{kernel} ({op})"),
            _ => op.to_string(),
        };
        if name == "step" && !gpu {
            steps += 1;
            wall_ms += dur_ms(e);
            continue;
        }
        // Ops carry their tape index, kernels their pass; phases (forward, backward...) neither.
        let pass = e["args"]["pass"].as_str().unwrap_or("").to_string();
        if !gpu && e["args"]["tape_index"].is_null() {
            continue;
        }
        if gpu {
            busy_ms += dur_ms(e);
        }
        dispatches += 1;
        let entry = ops.entry((name, if gpu { "GPU" } else { "CPU" }, pass)).or_default();
        entry.count += 1;
        entry.ms += dur_ms(e);
        entry.flops += e["args"]["flops"].as_f64().unwrap_or(0.0);
        entry.bytes += e["args"]["bytes"].as_f64().unwrap_or(0.0);
    }
    if steps == 0 {
        return Err(anyhow!("it holds no step spans: not a trace of training steps"));
    }
    let mut top: Vec<Value> = ops
        .into_iter()
        .map(|((name, track, pass), t)| {
            // Achieved rates where the trace knows the work (FLOPs of products, bytes bound).
            let rate = |work: f64| (work > 0.0 && t.ms > 0.0).then(|| work / (t.ms * 1e6));
            json!({"name": name, "track": track, "pass": pass, "count": t.count, "total_ms": t.ms, "share": t.ms / wall_ms,
                   "gflops": rate(t.flops), "gbs": rate(t.bytes)})
        })
        .collect();
    top.sort_by(|a, b| b["total_ms"].as_f64().unwrap_or(0.0).total_cmp(&a["total_ms"].as_f64().unwrap_or(0.0)));
    top.truncate(TOP_OPS);
    Ok(json!({
        "steps": steps, "step_ms": wall_ms / steps as f64, "ops": top,
        "kernels_per_step": dispatches as f64 / steps as f64, "device_busy_ms": busy_ms, "wall_ms": wall_ms,
    }))
}

/// The report page with its scripts inline, and `data` (see www/report.js) inline too, or
/// without, the live page of `train --serve`, which polls `/records` for them.
pub fn html(data: Option<&Value>) -> String {
    // Inside a script element `</` could end it: JSON may spell `<` as \u003c.
    let (main, data) = match data {
        Some(d) => {
            ("<main id=\"report\"></main>", format!("<script type=\"application/json\" id=\"report-data\">{}</script>", d.to_string().replace('<', "\\u003c")))
        }
        None => ("<main id=\"report\" data-live=\"/records\"><p>waiting for the run's first records</p></main>", String::new()),
    };
    let charts = include_str!("../assets/charts.js");
    let report: String = include_str!("../assets/report.js").lines().filter(|l| !l.starts_with("import ")).collect::<Vec<_>>().join("\n");
    format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Alpha run report</title>
<link rel="icon" href="data:,">
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; padding: 12px; max-width: 760px; color: #223; }}
h1 {{ font-size: 20px; }} h2 {{ font-size: 16px; margin-top: 24px; }}
table {{ border-collapse: collapse; width: 100%; font-size: 13px; display: block; overflow-x: auto; }}
td, th {{ border-bottom: 1px solid #dde; padding: 3px 6px; text-align: left; vertical-align: top; }}
figure {{ margin: 12px 0; }} figcaption {{ font-size: 12px; color: #556; }}
canvas {{ width: 100%; height: auto; border: 1px solid #eef; }}
pre {{ white-space: pre-wrap; background: #f6f6fa; padding: 8px; }}
</style>
</head>
<body>
{main}
{data}
<script type="module">
{charts}
{report}
</script>
</body>
</html>
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_and_truncated_lines_are_skipped_and_counted() {
        let text = concat!(
            r#"{"type":"start","step":0,"params":10}"#,
            "\n",
            r#"{"type":"train","step":0,"loss":4.2}"#,
            "\nnot json\n",
            r#"{"type":"eval","step":0,"train_loss":4.1,"val_loss":4.3}"#,
            "\n",
            r#"{"type":"save","step":0}"#,
            "\n",
            r#"{"type":"train","step":1,"lo"#,
        );
        let run = RunRecords::read(text.as_bytes()).unwrap().to_json("r");
        assert_eq!(run["skipped"], 2);
        let types: Vec<&str> = run["records"].as_array().unwrap().iter().map(|r| r["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["start", "train", "eval"]);
        let long = format!("{{\"type\":\"sample\",\"text\":\"{}\"}}\n{{\"type\":\"train\",\"step\":3}}", "x".repeat(MAX_LINE));
        let run = RunRecords::read(long.as_bytes()).unwrap().to_json("r");
        assert_eq!((run["skipped"].as_u64(), run["records"][0]["step"].as_u64()), (Some(1), Some(3)));
    }

    /// A million train records keep at most [`SERIES_KEPT`] (and the latest), evenly spread,
    /// with every skipped step still counted.
    #[test]
    fn long_runs_are_thinned_evenly_and_keep_their_totals() {
        let mut records = RunRecords::default();
        for step in 0..1_000_000u64 {
            records.push_line(&format!(r#"{{"type":"train","step":{step},"loss":1.0,"skipped_steps":{}}}"#, step % 3));
            if step % 1000 == 0 {
                records.push_line(&format!(r#"{{"type":"sample","step":{step},"text":"s"}}"#));
            }
        }
        let kept: Vec<&Value> = records.records().collect();
        let train: Vec<u64> = kept.iter().filter(|r| r["type"] == "train").map(|r| r["step"].as_u64().unwrap()).collect();
        assert!(train.len() <= SERIES_KEPT + 1 && train.len() > SERIES_KEPT / 2, "{}", train.len());
        assert_eq!((train[0], *train.last().unwrap()), (0, 999_999));
        let gaps: Vec<u64> = train.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps[..gaps.len() - 1].iter().all(|&g| g == gaps[0]), "uneven thinning");
        let skipped: u64 = kept.iter().filter_map(|r| r["skipped_steps"].as_u64()).sum();
        assert_eq!(skipped, (0..1_000_000u64).map(|s| s % 3).sum::<u64>());
        assert_eq!(kept.iter().filter(|r| r["type"] == "sample").count(), SAMPLES_KEPT);
    }

    #[test]
    fn the_data_cannot_end_its_script_element() {
        let page = html(Some(&json!({"runs": [{"records": [{"type": "sample", "text": "</script><script>alert(1)"}]}]})));
        assert_eq!(page.matches("</script>").count(), 2, "only the page's own two script elements end");
    }

    #[test]
    fn a_trace_gives_its_top_ops_and_the_device_share() {
        let trace = json!({"traceEvents": [
            {"name": "step", "ph": "X", "tid": 1, "ts": 0.0, "dur": 1000.0},
            {"name": "forward", "ph": "X", "tid": 1, "ts": 0.0, "dur": 400.0},
            {"name": "matmul", "ph": "X", "tid": 1, "ts": 0.0, "dur": 300.0, "args": {"pass": "forward", "tape_index": 3, "flops": 3e6, "bytes": 1e6}},
            {"name": "matmul", "ph": "X", "tid": 1, "ts": 300.0, "dur": 100.0, "args": {"pass": "forward", "tape_index": 5, "flops": 1e6, "bytes": 1e6}},
            {"name": "attention", "ph": "X", "tid": 2, "ts": 0.0, "dur": 250.0, "args": {"pass": "backward", "kernel": "attention_delta", "bytes": 5e5}},
            {"name": "attention", "ph": "X", "tid": 2, "ts": 250.0, "dur": 200.0, "args": {"pass": "backward", "kernel": "attention_backward_q", "flops": 4e6}},
        ]});
        let t = summarize_trace(&trace.to_string()).unwrap();
        assert_eq!((t["steps"].as_u64(), t["step_ms"].as_f64()), (Some(1), Some(1.0)));
        assert_eq!(t["ops"][0]["name"], "matmul");
        assert_eq!((t["ops"][0]["count"].as_u64(), t["ops"][0]["total_ms"].as_f64(), t["ops"][0]["share"].as_f64()), (Some(2), Some(0.4), Some(0.4)));
        assert_eq!((t["kernels_per_step"].as_f64(), t["device_busy_ms"].as_f64()), (Some(4.0), Some(0.45)));
        // 4 MFLOP and 2 MB in 0.4 ms: 10 GFLOP/s and 5 GB/s.
        assert_eq!((t["ops"][0]["gflops"].as_f64(), t["ops"][0]["gbs"].as_f64()), (Some(10.0), Some(5.0)));
        // GPU spans by kernel, each with the work it knows: 0.5 MB in 0.25 ms, 4 MFLOP in 0.2 ms.
        assert_eq!((t["ops"][1]["name"].as_str(), t["ops"][1]["gbs"].as_f64()), (Some("attention_delta"), Some(2.0)));
        assert!(t["ops"][1]["gflops"].is_null());
        assert_eq!((t["ops"][2]["name"].as_str(), t["ops"][2]["gflops"].as_f64()), (Some("attention_backward_q"), Some(20.0)));
        assert!(summarize_trace("{}").is_err() && summarize_trace("nope").is_err());
    }
}
