//! `alpha-native bench`: steady-state training throughput (no evaluation, samples or
//! checkpoints), its phase breakdown, achieved GFLOP/s and MFU.
//!
//! FLOPs per token = 6 × parameters (forward and backward of every weight) + 12 × n_layer ×
//! T × C (attention scores and weighted sums). MFU = achieved FLOP/s ÷ the peak of this
//! machine, measured by a calibrated GEMM run (see [`crate::peak`]) or given.

use crate::args::ModelArgs;
use crate::device::{Backend, DeviceArgs};
use crate::engine::Placement;
use crate::fsutil::check_outputs_distinct;
use crate::step::{bench_train_config, fresh_start, timed_step, train_split, Phases};
use crate::trace::Trace;
use alpha_core::engine::{Engine, StepError};
use alpha_core::parallel::Parallel;
use alpha_core::GptConfig;
use anyhow::{anyhow, Result};
use clap::Args;
use serde_json::json;
use std::path::PathBuf;

/// Flags of `alpha-native bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Model shape and data.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Micro-batches per optimizer step.
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,
    /// Where to run.
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Timed steps (1 to 1000000).
    #[arg(long, default_value_t = 50)]
    pub iters: usize,
    /// Untimed steps first (0 to 1000000).
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// The device's peak GFLOP/s for MFU (positive). Default: measured once and cached (the
    /// CPU's GEMM peak; a GPU's f32 FMA limit).
    #[arg(long)]
    pub peak_gflops: Option<f64>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write a Chrome trace (open in Perfetto) of the first --trace-steps steps to FILE.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Steps recorded by --trace (1 to 1000).
    #[arg(long, default_value_t = 5)]
    pub trace_steps: u64,
    /// Replace an existing --trace file.
    #[arg(long)]
    pub overwrite: bool,
    /// Time whole steps only, without the per-phase clocks (to measure what they cost).
    #[arg(long, conflicts_with = "trace")]
    pub no_phases: bool,
}

/// The most steps `--iters` and `--warmup` may ask for.
const MAX_BENCH_STEPS: usize = 1_000_000;

/// Runs `bench`.
pub fn run(args: &BenchArgs) -> Result<()> {
    for (flag, value, min) in [("--iters", args.iters, 1), ("--warmup", args.warmup, 0)] {
        if !(min..=MAX_BENCH_STEPS).contains(&value) {
            return Err(anyhow!("{flag} must be between {min} and {MAX_BENCH_STEPS}, got {value}"));
        }
    }
    let m = &args.model;
    check_outputs_distinct(m.data.iter().map(|d| ("--data", d.as_path())).collect(), &[("--trace", args.trace.as_deref())])?;
    let mut trace = args.trace.as_deref().map(|p| Trace::new(p, args.trace_steps, args.overwrite)).transpose()?;
    let (tok, ids) = m.sample_tokens(&alpha_core::Serial)?;
    let config: GptConfig = m.config(tok.vocab_size());
    let plan = m.plan(config, tok.vocab_size(), m.batch)?;
    args.device.check()?;
    crate::memory::check(&plan, args.device.backend)?;
    if args.device.backend == Backend::Gpu && args.no_phases {
        return Err(anyhow!("--no-phases measures the CPU's phase clocks; a GPU step has none inside it"));
    }
    let train = train_split(&plan, &ids)?;
    let start = fresh_start(&plan)?;
    let cfg = bench_train_config(args.grad_accum);
    let pool = args.device.pool()?;
    let opened = crate::engine::open(&args.device, &pool, plan, cfg, start, Placement::alone())?;
    let peak = crate::engine::peak(&opened, &pool, args.peak_gflops)?;
    let mut engine = opened.engine;
    let (steps_ms, phases) = timed_steps(args, &mut *engine, train, trace.as_mut())?;
    let description = engine.describe();
    let device = crate::engine::device_json(&description);
    let mut ms = steps_ms.clone();
    ms.sort_by(f64::total_cmp);
    let median = if ms.len() % 2 == 1 { ms[ms.len() / 2] } else { (ms[ms.len() / 2 - 1] + ms[ms.len() / 2]) / 2.0 };
    let tokens_per_step = plan.tokens() * args.grad_accum;
    let tokens_per_sec = tokens_per_step as f64 / median * 1e3;
    let mean = ms.iter().sum::<f64>() / ms.len() as f64;
    let fpt = plan.flops_per_token();
    let achieved = fpt * tokens_per_sec / 1e9;
    let report = json!({
        "backend": description.backend,
        "precision": description.precision,
        "device": device,
        "threads": pool.threads(),
        "config": config,
        "batch": m.batch,
        "grad_accum": args.grad_accum,
        "recompute": plan.recompute(),
        "activations_mib": crate::memory::arena_bytes(&plan).1 as f64 / (1024.0 * 1024.0),
        "tokens_per_step": tokens_per_step,
        "params": plan.num_params(),
        "flops_per_token": fpt,
        "iters": args.iters,
        "warmup": args.warmup,
        "ms_per_iter": {"median": median, "mean": mean, "min": ms[0], "max": ms[ms.len() - 1]},
        "step_ms": steps_ms,
        "tokens_per_sec": tokens_per_sec,
        "phases_ms": (!args.no_phases).then(|| phases.json_ms(args.iters as f64)),
        "achieved_gflops": achieved,
        "peak_gflops": peak.gflops,
        "peak_source": peak.source,
        "mfu": achieved / peak.gflops,
        "trace": args.trace.as_deref().map(trace_summary).transpose()?,
    });
    if args.json {
        println!("{report}");
    } else {
        print_table(&report);
    }
    Ok(())
}

/// The timed steps (after the warm-up): each step's milliseconds and the summed phases. On
/// the GPU each step ends with the read of its loss (what training does every log interval),
/// so its time is submit to result.
fn timed_steps(args: &BenchArgs, engine: &mut dyn Engine, train: &[u32], mut trace: Option<&mut Trace>) -> Result<(Vec<f64>, Phases)> {
    let mut ms = Vec::with_capacity(args.iters);
    let mut phases = Phases::default();
    for i in 0..args.warmup + args.iters {
        let traced = trace.as_deref_mut().filter(|_| i >= args.warmup);
        let step = match timed_step(engine, train.into(), true, traced, !args.no_phases) {
            Ok((_, phases)) => phases,
            Err(StepError::Diverged(e)) => return Err(anyhow!("bench diverged at {e}")),
            Err(StepError::Device(e)) => return Err(anyhow!(e)),
        };
        if i >= args.warmup {
            ms.push(step.total * 1e3);
            phases.add(&step);
        }
    }
    if let Some(t) = trace {
        t.finish()?;
    }
    Ok((ms, phases))
}

fn print_table(r: &serde_json::Value) {
    let c = &r["config"];
    let d = &r["device"];
    let on = match d["adapter"].as_str() {
        Some(a) => format!(
            "gpu: {a} ({}), {} kernels and 1 submit per step, {}",
            d["backend"].as_str().unwrap_or("?"),
            d["kernels_per_step"],
            r["precision"].as_str().unwrap_or("f32")
        ),
        None => format!("cpu, threads: {}", r["threads"]),
    };
    println!(
        "bench: {} layers, {} heads, {} embd, block {}, batch {}x{} ({} tokens/step), {:.2}M params, {on}",
        c["n_layer"],
        c["n_head"],
        c["n_embd"],
        c["block_size"],
        r["batch"],
        r["grad_accum"],
        r["tokens_per_step"],
        r["params"].as_f64().unwrap_or(0.0) / 1e6
    );
    let m = &r["ms_per_iter"];
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    println!(
        "  ms/iter       median {:.2}  mean {:.2}  min {:.2}  max {:.2}  ({} steps after {} warm-up)",
        f(&m["median"]),
        f(&m["mean"]),
        f(&m["min"]),
        f(&m["max"]),
        r["iters"],
        r["warmup"]
    );
    println!("  tokens/s      {:.0}", f(&r["tokens_per_sec"]));
    let phases: Vec<String> = r["phases_ms"].as_object().into_iter().flatten().filter(|(_, v)| f(v) > 0.0).map(|(k, v)| format!("{k} {:.2}", f(v))).collect();
    if !phases.is_empty() {
        println!("  phases (ms)   {}", phases.join("  "));
    }
    println!(
        "  FLOPs/token   {:.2}M; achieved {:.1} GFLOP/s; peak {:.1} GFLOP/s ({}); MFU {:.1}%",
        f(&r["flops_per_token"]) / 1e6,
        f(&r["achieved_gflops"]),
        f(&r["peak_gflops"]),
        r["peak_source"].as_str().unwrap_or("?"),
        100.0 * f(&r["mfu"])
    );
    if r["trace"].is_object() {
        print_top(&r["trace"]);
    }
}

/// The trace's summary ([`crate::report::summarize_trace`]) of the file bench just wrote.
fn trace_summary(path: &std::path::Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow!("cannot read back --trace {}: {e}", path.display()))?;
    crate::report::summarize_trace(&text)
}

/// Ops and kernels `bench --trace` prints, the largest total time first.
const TOP_PRINTED: usize = 10;

/// The traced steps' top ops (CPU) or kernels (GPU) as a Markdown table: time per step,
/// share, dispatches per step and achieved rates.
fn print_top(t: &serde_json::Value) {
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    let steps = f(&t["steps"]);
    let busy = match f(&t["device_busy_ms"]) {
        b if b > 0.0 => format!("; device busy {:.1}% of the wall time", 100.0 * b / f(&t["wall_ms"])),
        _ => String::new(),
    };
    println!("\ntrace: {steps} steps of {:.2} ms, {:.0} ops or kernels per step{busy}", f(&t["step_ms"]), f(&t["kernels_per_step"]));
    println!("| op or kernel | pass | ms/step | share | per step | GFLOP/s | GB/s |");
    println!("|---|---|---|---|---|---|---|");
    let rate = |v: &serde_json::Value| v.as_f64().map_or("".into(), |x| format!("{x:.1}"));
    for o in t["ops"].as_array().into_iter().flatten().take(TOP_PRINTED) {
        println!(
            "| {} | {} | {:.3} | {:.1}% | {:.0} | {} | {} |",
            o["name"].as_str().unwrap_or("?"),
            o["pass"].as_str().unwrap_or(""),
            f(&o["total_ms"]) / steps,
            100.0 * f(&o["share"]),
            f(&o["count"]) / steps,
            rate(&o["gflops"]),
            rate(&o["gbs"])
        );
    }
}
